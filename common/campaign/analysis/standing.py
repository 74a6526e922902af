"""Where this machine stands: published MLPerf HPC submissions and the suite's own campaigns on the paper's axes.

From `scores.score_roots` (published trees and campaigns scored by the same rules), the report's sections:
- where this machine stands: per benchmark, every strong-scaling submission by score (the suite's campaigns
  marked), with round, division, units and per-unit throughput; weak scaling by models per minute;
- the time split of each submission (staging, training, evaluation, other: the paper's Fig. 1);
- epochs to converge against global batch size (Fig. 2b), throughput against compute units (Fig. 2c) and time
  to train against compute units with constant compute-budget lines, the join of the two (Fig. 2d);
- the staging ratio (staging minutes over the mean epoch's: Table 5) and the per-benchmark table of batch size,
  epochs, units, samples/s per unit, time to solution and compute budget (Table 6).
A submission is labelled `submitter system`; a campaign of the suite's own `this machine: <campaign>, <n> training
samples` (a mini's dataset is a small fraction of the official one, so its place says little until it is not).
"""
from __future__ import annotations

import dataclasses

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from common.campaign.analysis import labels  # noqa: E402
from common.campaign.analysis.figures import COLOURS, _png  # noqa: E402
from common.campaign.analysis.scores import Scored  # noqa: E402

OWN, PUBLISHED = "#d95f02", "#4a6fa5"  # the suite's campaigns, published submissions
PARTS = ("staging", "training", "evaluation", "other")


def submissions(scored: Scored) -> pd.DataFrame:
    """One row per submission: its score row, its time split, `own`, its `label` and `samples_per_second`."""
    rows = []
    for row, split, own in zip(scored.rows, scored.splits, scored.own):
        record = dataclasses.asdict(row) | split | {"own": own}
        record["label"] = f"this machine: {row.submitter}, {split['train_samples']:,.0f} training samples" if own \
            else f"{row.submitter} {row.system}"  # a campaign's dataset may be a mini's: its size in its label
        rate = row.train_samples_per_second_per_unit
        record["samples_per_second"] = rate * row.units if rate is not None and row.units else np.nan
        record["mean_minutes"] = sum(split[f"{p}_minutes"] for p in PARTS)  # NaN where no run finished
        rows.append(record)
    table = pd.DataFrame(rows)
    return table.astype({"score_minutes": float, "epochs_mean": float, "units": float}) if len(table) else table


def sections(table: pd.DataFrame) -> list:
    """The report's sections (title, prose, table, figures) for the submissions `table`."""
    if table.empty:
        return []
    strong = table[table["scaling"] == "strong"]
    benches = sorted(strong["benchmark"].unique())
    return [
        ("Where this machine stands", "Every strong-scaling submission of a benchmark by score (time to train, "
         "minutes: the olympic mean; unscored where the rules' run count or convergence is not met, with the reason), "
         "the suite's campaigns marked ▶; mean_minutes: the mean time to train of the runs that finished, for a "
         "campaign with fewer runs than the rules ask. Per-unit throughput is training samples/s per compute unit: "
         "compare it only for a campaign on the official dataset (the minis' samples are smaller: "
         "docs/datasets.md). Weak scaling below it by models per minute (its score_minutes: the time to train all "
         "instances).", standing(table), {}),
        ("Time to solution split (Fig. 1)", "Mean minutes of the time to train per submission: staging logged inside "
         "the run, training (the epochs, evaluations inside them excluded), evaluation and the rest.",
         _split_table(strong), {f"split_{b}.png": split_figure(strong, b) for b in benches}),
        ("Epochs to converge against global batch size (Fig. 2b)", "Mean ± std over the converged runs of each "
         "submission.", None, {f"epochs_{b}.png": epochs_figure(strong, b) for b in benches}),
        ("Throughput against compute units (Fig. 2c)", "Training samples/s of the whole system (per unit x units). "
         "Dotted: constant per-unit throughput.", None,
         {f"throughput_units_{b}.png": throughput_figure(strong, b) for b in benches}),
        ("Time to train against compute units (Fig. 2d)", "The join of the two: epochs(B) x samples over "
         "throughput(units). Dotted: constant compute budget (unit-hours).", None,
         {f"time_units_{b}.png": time_figure(strong, b) for b in benches}),
        ("Staging ratio (Table 5)", "Staging minutes over the mean epoch's training minutes, where staging is logged.",
         staging_table(table), {}),
        ("Per benchmark (Table 6)", "Global batch size, epochs to converge (mean ± std), compute units, training "
         "and evaluation samples/s per unit, time to solution and compute budget.", table6(table), {}),
    ]


def standing(table: pd.DataFrame) -> pd.DataFrame:
    """Strong submissions ranked by score within each benchmark, then weak ones by models per minute."""
    cols = ["benchmark", "rank", "label", "round", "division", "units", "score_minutes", "score_minutes_rcp",
            "mean_minutes", "models_per_minute", "train_samples_per_second_per_unit", "compute_budget_unit_hours",
            "unscored_reason"]
    strong = table[table["scaling"] == "strong"].sort_values(["benchmark", "score_minutes"], na_position="last")
    strong = strong.assign(rank=strong.groupby("benchmark").cumcount() + 1)
    weak = table[table["scaling"] == "weak"]
    if len(weak):
        weak = weak.sort_values(["benchmark", "models_per_minute"], ascending=[True, False])
        weak = weak.assign(rank=weak.groupby("benchmark").cumcount() + 1, benchmark=weak["benchmark"] + " (weak)")
    out = pd.concat([strong, weak])[cols].rename(columns={"label": "submission"})
    return out.assign(submission=[f"▶ {s}" if o else s for s, o in zip(out["submission"], pd.concat(
        [strong, weak])["own"])])


def _split_table(strong: pd.DataFrame) -> pd.DataFrame:
    cols = ["benchmark", "label", "units", "score_minutes"] + [f"{p}_minutes" for p in PARTS]
    return strong.sort_values(["benchmark", "score_minutes"])[cols].rename(columns={"label": "submission"})


def staging_table(table: pd.DataFrame) -> pd.DataFrame:
    logged = table[table["staging_minutes_mean"].notna()]
    ratio = logged["staging_minutes_mean"] / logged["epoch_minutes"]
    cols = ["benchmark", "label", "scaling", "units", "staging_minutes_mean", "epoch_minutes", "staging_ratio"]
    return logged.assign(staging_ratio=ratio)[cols].rename(columns={"label": "submission"})


def table6(table: pd.DataFrame) -> pd.DataFrame:
    epochs = [f"{m:.1f} ± {s:.1f}" if m == m and s == s else "" for m, s in zip(table["epochs_mean"],
                                                                                   table["epochs_std"].astype(float))]
    out = table.assign(epochs=epochs).sort_values(["benchmark", "scaling", "units"])
    return out[["benchmark", "scaling", "label", "global_batch_size", "epochs", "units",
                "train_samples_per_second_per_unit", "eval_samples_per_second_per_unit", "score_minutes",
                "compute_budget_unit_hours"]].rename(columns={"label": "submission"})


def _colours(rows: pd.DataFrame) -> list[str]:
    return [OWN if own else PUBLISHED for own in rows["own"]]


def _log_axes(ax, xs, ys) -> None:
    """Base-2 x with power-of-two ticks over the data, base-10 y with plain tick labels."""
    ax.set_xscale("log", base=2)
    low, high = np.floor(np.log2(np.nanmin(xs))), np.ceil(np.log2(np.nanmax(xs)))
    ticks = 2 ** np.arange(low, high + 1)
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_xlim(2 ** (low - 0.3), 2 ** (high + 0.3))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    wide = np.log10(np.nanmax(ys) / np.nanmin(ys)) > 1.5  # minor labels only where few decades leave room
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter() if wide else plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_ylim(np.nanmin(ys) / 1.6, np.nanmax(ys) * 1.6)


def _scatter(rows: pd.DataFrame, x: str, y: str, title: str, xlabel: str, ylabel: str, level=None) -> bytes:
    """A labelled log-log scatter of `rows` (published and own), with optional level lines c * x**slope."""
    rows = rows.dropna(subset=[x, y])
    fig, ax = plt.subplots(figsize=(8, 5.5))
    if rows.empty:
        ax.text(0.5, 0.5, "no submission logs this", ha="center", transform=ax.transAxes)
        return _png(fig)
    xs, ys = rows[x].to_numpy(float), rows[y].to_numpy(float)
    yerr = rows["epochs_std"].to_numpy(float) if y == "epochs_mean" else None
    ax.errorbar(xs, ys, yerr=yerr, fmt="none", ecolor="#999999", lw=0.8, zorder=2)
    ax.scatter(xs, ys, c=_colours(rows), s=22, zorder=3)
    _log_axes(ax, xs, ys)
    if level is not None:
        level(ax, xs, ys)
    ax.scatter([], [], c=PUBLISHED, s=22, label="published")
    ax.scatter([], [], c=OWN, s=22, label="this machine")
    ax.legend(fontsize=8, loc="best")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    labels.place(ax, xs, ys, [_short(r, y) for r in rows.itertuples()])
    return _png(fig)


def _short(row, y: str) -> str:
    unscored = ", unscored: mean of its runs" if y == "time_minutes" and row.score_minutes != row.score_minutes else ""
    return f"{row.label} (r{row.round}{unscored})"


def _level_lines(slope: float):
    """Level lines y = c * x**slope through the geometric mean of the points, and at x 1/4 and x 4 of it."""
    def draw(ax, xs, ys) -> None:
        centre = float(np.exp(np.mean(np.log(ys) - slope * np.log(xs))))
        grid = np.geomspace(xs.min() / 1.5, xs.max() * 1.5, 50)
        for factor in (0.25, 1.0, 4.0):
            ax.plot(grid, centre * factor * grid ** slope, ":", color="grey", lw=0.8, zorder=1)
    return draw


def epochs_figure(strong: pd.DataFrame, bench: str) -> bytes:
    return _scatter(strong[strong["benchmark"] == bench], "global_batch_size", "epochs_mean",
                    f"{bench}: epochs to converge against global batch size", "global batch size (samples)",
                    "epochs to converge")


def throughput_figure(strong: pd.DataFrame, bench: str) -> bytes:
    return _scatter(strong[strong["benchmark"] == bench], "units", "samples_per_second",
                    f"{bench}: training throughput against compute units", "compute units (accelerators, or "
                    "processors/ranks without them)", "training samples/s", _level_lines(1.0))


def time_figure(strong: pd.DataFrame, bench: str) -> bytes:
    """Fig. 2d; a submission without a score (a campaign with fewer runs than the rules ask) at the mean time to
    train of its finished runs, said in its label."""
    rows = strong[strong["benchmark"] == bench]
    rows = rows.assign(time_minutes=rows["score_minutes"].fillna(rows["mean_minutes"]))
    return _scatter(rows, "units", "time_minutes",
                    f"{bench}: time to train against compute units", "compute units (accelerators, or "
                    "processors/ranks without them)", "time to train (minutes)", _level_lines(-1.0))


def split_figure(strong: pd.DataFrame, bench: str) -> bytes:
    """Fig. 1: each submission's mean time to train as shares of its parts (bars), fastest first; the minutes
    are in the labels, so submissions minutes and days apart read on one axis."""
    rows = strong[strong["benchmark"] == bench]
    rows = rows.iloc[np.argsort(rows[[f"{p}_minutes" for p in PARTS]].fillna(0).sum(axis=1).to_numpy(), kind="stable")]
    minutes = rows[[f"{p}_minutes" for p in PARTS]].fillna(0).to_numpy(float)
    totals = minutes.sum(axis=1)
    names = [f"{'▶ ' if r.own else ''}{r.label}, {r.units:g} units: {t:.3g} min"
             for r, t in zip(rows.itertuples(), totals)]
    fig, ax = plt.subplots(figsize=(8, 1.0 + 0.3 * max(len(rows), 1)))
    left = np.zeros(len(rows))
    for i, part in enumerate(PARTS):
        share = np.divide(minutes[:, i], totals, out=np.zeros(len(rows)), where=totals > 0)
        ax.barh(names, share, left=left, color=COLOURS[part], label=part)
        left += share
    ax.set_xlim(0, 1)
    ax.tick_params(axis="y", labelsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("share of the mean time to train")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.9 / max(len(rows), 1) - 0.05), fontsize=7, ncol=4,
              frameon=False)
    ax.set_title(f"{bench}: where the time to train goes")
    return _png(fig)
