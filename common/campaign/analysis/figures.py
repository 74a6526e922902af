"""The report's figures (matplotlib, Agg), each a function of the analysis tables returning PNG bytes.

Every axis is labelled with its unit; times start at zero on linear scales; batch sizes and unit counts
are on base-2 logarithmic scales with the measured values as ticks, and epochs and throughput against them
on logarithmic scales too, where the level lines (constant steps, constant per-unit throughput) are
straight.
"""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from common.campaign.analysis.analyses import PARTS, STEP  # noqa: E402

COLOURS = {"staging": "#8c6d31", "training": "#3182bd", "evaluation": "#e6550d", "other": "#bdbdbd"}
STEP_COLOURS = {"step_compute": "#3182bd", "step_allreduce": "#e6550d", "step_input_wait": "#8c6d31",
                "step_other": "#bdbdbd"}
DPI = 110


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _log2_x(ax, values) -> None:
    """Base-2 log scale on x with the measured values as the ticks."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(v) for v in values if v == v))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def _log_y(ax) -> None:
    """Log scale on y, ticks written as plain numbers (major and minor)."""
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)


def time_breakdown(table: pd.DataFrame) -> bytes:
    """Fig. 1: stacked bars of the mean time to solution per configuration, in minutes."""
    labels = [f"{r.benchmark}, {r.units} units, B={r.global_batch_size}\n{r.converged} of {r.runs} converged"
              for r in table.itertuples()]
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.55 * len(table)))
    left = np.zeros(len(table))
    for part in PARTS:
        minutes = table[part].to_numpy() / 60
        ax.barh(labels, minutes, left=left, color=COLOURS[part], label=part)
        left += minutes
    ax.set_xlabel("mean time to solution (minutes)")
    ax.set_xlim(0, max(left.max() * 1.05, 1e-9))
    ax.invert_yaxis()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.3 / len(table)), ncol=len(PARTS), fontsize=8,
              frameon=False)
    ax.set_title("Where the time to solution goes")
    return _png(fig)


def step_breakdown(table: pd.DataFrame) -> bytes:
    """Stacked bars of a training step's shares per configuration (the timed window of steps), with the
    fraction of the node's peak each configuration sustained."""
    rows = table.dropna(subset=STEP)
    labels = [f"{r.benchmark}, {r.units} units, B={r.global_batch_size}\n{r.fraction_of_peak:.0%} of peak"
              for r in rows.itertuples()]
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.55 * max(len(rows), 1)))
    left = np.zeros(len(rows))
    for part in STEP:
        share = rows[part].to_numpy()
        ax.barh(labels, share, left=left, color=STEP_COLOURS[part], label=part.removeprefix("step_"))
        left += share
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of a training step's wall time")
    ax.invert_yaxis()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.3 / max(len(rows), 1)), ncol=len(STEP), fontsize=8,
              frameon=False)
    ax.set_title("Where a training step goes")
    return _png(fig)


def efficiency(weak: pd.DataFrame, strong: pd.DataFrame, benchmark: str) -> bytes:
    """Scaling efficiency against compute units: weak (per local batch) and strong (per global batch)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for local, group in weak[weak["benchmark"] == benchmark].groupby("local_batch_size"):
        ax.plot(group["units"], group["efficiency"], "o-", label=f"weak, local batch {local:g}")
    for batch, group in strong[strong["benchmark"] == benchmark].groupby("global_batch_size"):
        ax.plot(group["units"], group["efficiency"], "s--", label=f"strong, global batch {batch:g}")
    units = [*weak.loc[weak["benchmark"] == benchmark, "units"], *strong.loc[strong["benchmark"] == benchmark, "units"]]
    if units:
        _log2_x(ax, units)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_ylim(0, 1.2)
    ax.set_xlabel("compute units (accelerators, or ranks on CPU)")
    ax.set_ylabel("scaling efficiency (1 = linear)")
    ax.set_title(f"{benchmark}: scaling efficiency")
    ax.legend(fontsize=8)
    return _png(fig)


def convergence(runs: pd.DataFrame, table: pd.DataFrame, benchmark: str) -> bytes:
    """Fig. 2b: epochs to converge against global batch size, every converged run and the means, with
    constant-steps level lines (epochs proportional to batch size: the same number of optimizer steps)."""
    mine, conv = runs[(runs["benchmark"] == benchmark) & runs["converged"]], table[table["benchmark"] == benchmark]
    failed = runs[(runs["benchmark"] == benchmark) & ~runs["converged"].astype(bool)]
    conv = conv[conv["converged"] > 0]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(mine["global_batch_size"], mine["epochs_to_converge"], color="#9ecae1", label="run", zorder=4,
               s=14)
    if len(failed):
        ax.scatter(failed["global_batch_size"], failed["epochs"], marker="^", facecolors="none", edgecolors="#cb181d",
                   label="not converged (epochs run)", zorder=4)
    ax.errorbar(conv["global_batch_size"], conv["epochs_mean"], yerr=conv["epochs_std"].fillna(0), fmt="o-",
                color="#08519c", capsize=3, label="mean ± std", zorder=3)
    batches = np.array(sorted(set(conv["global_batch_size"]) | set(failed["global_batch_size"])), float)
    if len(batches):
        grid = np.geomspace(batches.min() / 1.5, batches.max() * 1.5, 50)
        for steps_per_sample in _level_constants(conv["epochs_mean"] / conv["global_batch_size"]):  # epochs / B
            ax.plot(grid, steps_per_sample * grid, ":", color="grey", lw=0.8, zorder=1)
        ax.plot([], [], ":", color="grey", lw=0.8, label="constant steps")
        _log2_x(ax, batches)
    if len(conv) or len(failed):
        values = pd.concat([conv["epochs_min"], conv["epochs_max"], failed["epochs"].astype(float)])
        low, high = values.min(), values.max()
        _log_y(ax)
        ax.set_ylim(low / 1.6, high * 1.6)
    ax.set_xlabel("global batch size (samples)")
    ax.set_ylabel("epochs to converge")
    ax.set_title(f"{benchmark}: epochs to the target")
    ax.legend(fontsize=8)
    return _png(fig)


def throughput(table: pd.DataFrame, benchmark: str) -> bytes:
    """Fig. 2c: training samples/s against compute units (log-log), with constant per-unit-throughput
    level lines (perfect linear scaling)."""
    mine = table[table["benchmark"] == benchmark]
    fig, ax = plt.subplots(figsize=(6, 4))
    for (local, group), colour in zip(mine.groupby("local_batch_size"), ("#a63603", "#31a354", "#756bb1", "#636363")):
        ax.errorbar(group["units"], group["samples_per_second"], yerr=group["samples_per_second_std"].fillna(0),
                    fmt="o-", color=colour, capsize=3, label=f"local batch {local:g} (mean ± std)", zorder=3)
    if len(mine):
        units = np.array(sorted(mine["units"].unique()), float)
        grid = np.geomspace(units.min() / 1.5, units.max() * 1.5, 50)
        for per_unit in _level_constants(mine["per_unit"]):
            ax.plot(grid, per_unit * grid, ":", color="grey", lw=0.8, zorder=1)
        ax.plot([], [], ":", color="grey", lw=0.8, label="constant per-unit throughput")
        _log2_x(ax, units)
        _log_y(ax)
    ax.set_xlabel("compute units (accelerators, or ranks on CPU)")
    ax.set_ylabel("training throughput (samples/s)")
    ax.set_title(f"{benchmark}: throughput scaling")
    ax.legend(fontsize=8)
    return _png(fig)


def compute_time(table: pd.DataFrame, benchmark: str) -> bytes:
    """Fig. 2d: compute time (training + evaluation) predicted from epochs(B) and throughput(U), against
    units, with the measured values where the configuration was run."""
    mine = table[table["benchmark"] == benchmark].sort_values("units")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(mine["units"], mine["compute_seconds"] / 60, "o-", color="#54278f", label="epochs(B) × samples / throughput(U)")
    measured = mine.dropna(subset=["measured_training_and_eval_seconds"])
    ax.scatter(measured["units"], measured["measured_training_and_eval_seconds"] / 60, marker="x", color="black",
               zorder=3, label="measured")
    if len(mine):
        _log2_x(ax, mine["units"])
        for r in mine.itertuples():
            ax.annotate(f"B={r.global_batch_size}", (r.units, r.compute_seconds / 60), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    tops = pd.concat([mine["compute_seconds"], measured["measured_training_and_eval_seconds"]]) / 60
    ax.set_ylim(0, max(tops.max() * 1.25, 1e-9) if len(tops) else 1)
    ax.set_xlabel("compute units (accelerators, or ranks on CPU)")
    ax.set_ylabel("compute time (minutes)")
    ax.set_title(f"{benchmark}: compute time as the join of the two")
    ax.legend(fontsize=8, loc="lower right")
    return _png(fig)


def variability(runs: pd.DataFrame) -> bytes:
    """Time to train of every converged run per configuration (points), with the mean (bar)."""
    converged = runs[runs["converged"]]
    groups = list(converged.groupby(["benchmark", "units", "global_batch_size"]))
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.55 * max(len(groups), 1)))
    for i, ((bench, units, batch), group) in enumerate(groups):
        minutes = group["time_to_train"].to_numpy() / 60
        ax.scatter(minutes, np.full(len(minutes), i), color="#3182bd", zorder=3)
        ax.plot([minutes.mean()] * 2, [i - 0.3, i + 0.3], color="black", lw=2)
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels([f"{b}\n{u} units, B={g}" for (b, u, g), _ in groups])
    ax.set_xlim(0, max(converged["time_to_train"].max() / 60 * 1.1, 1e-9) if len(converged) else 1)
    ax.invert_yaxis()
    ax.set_xlabel("time to train (minutes); bar: mean")
    ax.set_title("Run-to-run variability")
    return _png(fig)


def _level_constants(ratios: pd.Series) -> list[float]:
    """A few level-line constants spanning the measured ratios (x 1/2, x 1, x 2 of their geometric mean)."""
    ratios = ratios[ratios > 0].dropna()
    if ratios.empty:
        return []
    centre = float(np.exp(np.log(ratios).mean()))
    return [centre / 2, centre, centre * 2]
