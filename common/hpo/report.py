"""A search's results: the trials table, the best settings per global batch size as configs one can train
with, and figures (docs/hpo.md).

    OUT/trials.csv            one row per trial: state, settings, status, epochs and seconds to the target,
                              global batch size, objective
    OUT/best/<bench>_b<G>.yaml the whole config of the best trial at global batch G (a run of
                              `<bench>/train.py OUT/best/<bench>_b<G>.yaml` trains with those settings)
    OUT/report.md             the tables, with OUT/figures/{history,importance,epochs_vs_batch}.png

The trials' run directories are ordinary runs: `python -m common.campaign.analysis report OUT` puts them in
the analysis report (epochs to converge against global batch size, time breakdowns), and
`python -m common.campaign rcp` makes convergence points of repeated runs.
"""
from __future__ import annotations

import io
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from common.base.files import write_text_atomic  # noqa: E402
import yaml  # noqa: E402

from common.hpo.space import Space, override, plan  # noqa: E402
from common.hpo.trial import load_result  # noqa: E402


def trials_table(study, space: Space, out: Path) -> pd.DataFrame:
    """One row per trial of the study, with what its run directory recorded."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        result = load_result(out, t.number)
        params = result.params if result else {p.name: t.params.get(p.name) for p in space.params}
        rows.append({"trial": t.number, "state": t.state.name.lower(), **params,
                     "status": result.status if result else None, "epochs": result.epochs if result else None,
                     "seconds": result.seconds if result else None,
                     "global_batch_size": result.global_batch_size if result else None,
                     "objective": t.value if t.state.name == "COMPLETE" else None})
    return pd.DataFrame(rows)


def best_per_batch(table: pd.DataFrame) -> pd.DataFrame:
    """The lowest-objective trial that reached the target, per global batch size."""
    hits = table[(table["state"] == "complete") & (table["status"] == "success")]
    if hits.empty:
        return hits
    return hits.sort_values(["objective", "trial"]).groupby("global_batch_size", as_index=False).first()


def write_best_configs(best: pd.DataFrame, space: Space, out: Path, ranks: int,
                       overrides: tuple[str, ...] = ()) -> list[Path]:
    """The config of each best trial: the space's config with its overrides, the workers' (`overrides`: a
    job's data and Horovod settings) and the trial's settings written in, planned by the application (a
    dry run) to be sure it trains."""
    written = []
    for _, row in best.iterrows():
        params = load_result(out, int(row["trial"])).params  # as drawn (the table's columns are pandas' types)
        raw = yaml.safe_load(space.config_path.read_text())
        for item in [*space.overrides, *overrides, *(override(k, v) for k, v in params.items()),
                     f"run.seed={space.seed}"]:
            set_dotted(raw, item)
        path = out / "best" / f"{space.benchmark}_b{int(row['global_batch_size'])}.yaml"
        path.parent.mkdir(exist_ok=True)
        write_text_atomic(f"# The best settings of the search {out} at global batch {int(row['global_batch_size'])} "
                          f"(trial {int(row['trial'])})\n" + yaml.safe_dump(raw, sort_keys=False), path)
        plan(space.benchmark, path, [], ranks)
        written.append(path)
    return written


def set_dotted(raw: dict, item: str) -> None:
    """Apply one `a.b=value` override (the value in YAML) to a config's mapping."""
    dotted, text = item.split("=", 1)
    *sections, key = dotted.split(".")
    node = raw
    for name in sections:
        node = node.setdefault(name, {})
    node[key] = yaml.safe_load(text)


def write_report(study, space: Space, out: Path, ranks: int, overrides: tuple[str, ...] = ()) -> Path:
    """trials.csv, best/*.yaml, figures/*.png and report.md (`overrides`: the workers', as the trials got them)."""
    table = trials_table(study, space, out)
    table.to_csv(out / "trials.csv", index=False)
    best = best_per_batch(table)
    configs = write_best_configs(best, space, out, ranks, overrides)
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    importance = param_importances(study)
    for name, png in (("history.png", history_figure(table)), ("importance.png", importance_figure(importance)),
                      ("epochs_vs_batch.png", batch_figure(table, best))):
        if png:
            (figures / name).write_bytes(png)
    text = markdown(table, best, importance, configs, space, out)
    return write_text_atomic(text, out / "report.md")


def analysis_section(out: Path) -> tuple[str, str, pd.DataFrame, dict[str, bytes]]:
    """The search in `out` as a section of the analysis report (python -m common.campaign.analysis report):
    (title, prose, its best settings per global batch size, its figures), read from the study as it stands
    without writing to it."""
    from common.hpo.study import read_study, saved_settings
    space, settings = saved_settings(out)
    study = read_study(out, settings)
    table = trials_table(study, space, out)
    best = best_per_batch(table)
    importance = param_importances(study)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(table["state"].value_counts().to_dict().items()))
    ranked = ", ".join(f"{k} {v:.2f}" for k, v in importance.items()) or "too few complete trials"
    prose = (f"`{out}`: {space.benchmark}, {len(table)} trials ({counts}); objective {space.objective} to the "
             f"target, a miss scoring {space.failure_penalty:g} x "
             f"{'max_epochs' if space.objective == 'epochs' else 'its time'}. Best settings per global batch size "
             f"below (its report.md lists every trial); parameter importances (fANOVA): {ranked}.")
    figs = {f"hpo_{out.name}_{name}": png for name, png in
            (("history.png", history_figure(table)), ("importance.png", importance_figure(importance)),
             ("epochs_vs_batch.png", batch_figure(table, best))) if png}
    shown = best.drop(columns=["state"]) if not best.empty else None
    return f"Hyperparameter search {out.name}", prose, shown, figs


def param_importances(study) -> dict:
    """Optuna's fANOVA importances of the parameters for the objective ({} with too few complete trials)."""
    import optuna
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError):
        return {}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def history_figure(table: pd.DataFrame) -> bytes:
    done = table[table["objective"].notna()]
    if done.empty:
        return b""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.scatter(done["trial"], done["objective"], label="trial", color="tab:blue")
    ax.step(done["trial"], done["objective"].cummin(), where="post", label="best so far", color="tab:red")
    pruned = table[table["state"] == "pruned"]
    ax.scatter(pruned["trial"], [done["objective"].max()] * len(pruned), marker="x", color="grey", label="pruned")
    ax.set(xlabel="trial", ylabel="objective (lower is better)", title="Optimisation history")
    ax.legend()
    return _png(fig)


def importance_figure(importance: dict) -> bytes:
    if not importance:
        return b""
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.4 * len(importance)))
    names = list(importance)[::-1]
    ax.barh(names, [importance[n] for n in names], color="tab:green")
    ax.set(xlabel="importance (fANOVA, share of the objective's variance)", title="Parameter importances")
    return _png(fig)


def batch_figure(table: pd.DataFrame, best: pd.DataFrame) -> bytes:
    hits = table[(table["status"] == "success") & table["epochs"].notna()]
    if hits.empty:
        return b""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.scatter(hits["global_batch_size"], hits["epochs"], label="trials reaching the target", color="tab:blue")
    ax.plot(best["global_batch_size"], best["epochs"], "o-", color="tab:red", label="best per batch size")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="global batch size", ylabel="epochs to the target", title="Epochs to the target against batch size")
    ax.legend()
    return _png(fig)


def markdown(table: pd.DataFrame, best: pd.DataFrame, importance: dict, configs: list[Path], space: Space,
             out: Path) -> str:
    counts = table["state"].value_counts().to_dict()
    lines = [f"# Hyperparameter search: {space.benchmark}, {len(table)} trials", "",
             f"Objective: {space.objective} to the target (a miss scores {space.failure_penalty:g} x "
             f"{'max_epochs' if space.objective == 'epochs' else 'its time'}), lower is better; "
             f"sampler {space.sampler}, pruner {space.pruner}. Trials: "
             + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ".", "",
             "## Best settings per global batch size", ""]
    lines += [_table(best.drop(columns=["state"])) if not best.empty else "No trial reached the target.", ""]
    lines += [f"- `{c.relative_to(out)}`" for c in configs] + [""]
    if importance:
        lines += ["## Parameter importances", "", _table(pd.DataFrame(
            {"parameter": list(importance), "importance": list(importance.values())})), ""]
    lines += ["## Trials", "", _table(table), "",
              "![history](figures/history.png)", "![importance](figures/importance.png)",
              "![epochs against batch](figures/epochs_vs_batch.png)", ""]
    return "\n".join(lines)


def _table(frame: pd.DataFrame) -> str:
    def cell(v) -> str:
        return "-" if v is None or (isinstance(v, float) and v != v) else (f"{v:.4g}" if isinstance(v, float) else str(v))
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    return "\n".join([header, rule] + ["| " + " | ".join(cell(v) for v in row) + " |"
                                       for row in frame.itertuples(index=False)])
