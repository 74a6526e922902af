"""The analysis report of a set of runs: an HTML page with the figures embedded, a Markdown summary with
the same tables and the figures as PNG files beside it, and the tidy tables as CSV.

Written into OUT (through a temporary directory renamed when complete):
    report.html, summary.md, figures/*.png, runs.csv, epochs.csv, and submissions.csv where published trees or
    campaigns were scored (common/campaign/analysis/standing.py)
"""
from __future__ import annotations

import base64
import dataclasses
import html
import math
import time
from pathlib import Path

import pandas as pd

from common.base.files import atomic_path
from common.campaign.analysis import analyses, figures
from common.campaign.analysis.predict import Prediction, predict

ROUND = 3


@dataclasses.dataclass
class Report:
    sections: list[tuple[str, str, pd.DataFrame | None, dict[str, bytes]]]  # title, prose, table, figures
    predictions: list[Prediction]


def build(runs: pd.DataFrame, targets: list[tuple[str, int, int]]) -> Report:
    """Every analysis of `runs`; `targets`: (benchmark, units, global batch size) to predict."""
    benches = sorted(runs["benchmark"].dropna().unique())
    conv, scal, join = analyses.convergence(runs), analyses.scaling(runs), analyses.compute_time(runs)
    brk = analyses.breakdown(runs)
    sections = [
        ("Runs", f"{len(runs)} runs of {', '.join(benches)}; {int(runs['converged'].sum())} reached their target.",
         runs[["benchmark", "campaign", "seed", "units", "global_batch_size", "status", "time_to_train", "epochs",
               "final_metric", "samples_per_second"]], {}),
        ("Time to solution: staging, training, evaluation", "Mean seconds per configuration (Fig. 1 of the paper); "
         "other = time to train outside staging, epochs and evaluations (input pipeline set-up, gaps).",
         brk, {"breakdown.png": figures.time_breakdown(brk)}),
        ("Epochs to converge against batch size", "Converged runs only; failed runs are counted in `failed`. "
         "Dotted: constant-steps level lines (epochs proportional to batch size).",
         conv, {f"convergence_{b}.png": figures.convergence(runs, conv, b) for b in benches}),
        ("Throughput against compute units", "Training samples/s inside the epochs (evaluation excluded). "
         "Dotted: constant per-unit throughput (linear scaling).",
         scal, {f"throughput_{b}.png": figures.throughput(scal, b) for b in benches}),
        ("Compute time as the join", "Epochs to converge at B times training samples over throughput at U, plus "
         "evaluation, for each measured B run on U units at the campaigns' local batch size.",
         join, {f"compute_time_{b}.png": figures.compute_time(join, b) for b in benches} if len(join) else {}),
        *_system_sections(runs, benches, scal),
        ("Compute budget", "Unit-hours: compute units x time to train.", analyses.budget(runs), {}),
        ("Staging ratio", "Staging seconds over the mean epoch seconds (the paper's Table 5): how many epochs' "
         "worth of time the staging costs.", analyses.staging_ratios(runs), {}),
        ("Run-to-run variability", "Time to train of converged runs; cv = std / mean; the olympic mean as the scoring "
         "takes it (failed runs dropped as the slowest) with its 95% interval, a stratified bootstrap over the "
         "converged runs (rough with few runs: docs/campaigns.md).", analyses.variability(runs),
         {"variability.png": figures.variability(runs)}),
    ]
    return Report(sections=sections, predictions=[predict(runs, *t) for t in targets])


def _system_sections(runs: pd.DataFrame, benches: list[str], scal: pd.DataFrame) -> list:
    """Where a step's time goes (from the runs' summary.json `system` figures) and scaling efficiency."""
    strong, system = analyses.strong_scaling(runs), analyses.system(runs)
    sections = [("Scaling efficiency", "Weak: throughput per unit against the smallest unit count's at the same "
                 "local batch (the throughput table's `efficiency`). Strong: one global batch on more units, "
                 "speed-up over the smallest count divided by the units' ratio.", strong,
                 {f"efficiency_{b}.png": figures.efficiency(scal, strong, b) for b in benches})]
    if len(system):
        sections.append(("Where a training step goes", "Mean per configuration of the runs' `system` figures "
                         "(docs/metrics.md): sustained FLOP/s and its fraction of the nodes' probed peak; a "
                         "timed window of steps split into compute, allreduce (waiting for every rank, Horovod's "
                         "coordination and the exchange), input wait and the loop around the steps; peak memory of the largest rank; "
                         "energy per sample where counters exist.", system,
                         {"step_breakdown.png": figures.step_breakdown(system)}
                         if system[analyses.STEP].notna().all(axis=1).any() else {}))
    return sections


def write(report: Report, runs: pd.DataFrame, epochs: pd.DataFrame, out: Path, sources: list[str],
          submissions: pd.DataFrame | None = None) -> Path:
    """The report's files in `out` (replaced whole, through a temporary directory); submissions.csv where
    submissions were scored."""
    with atomic_path(out) as tmp:
        (tmp / "figures").mkdir(parents=True)
        for _, _, _, figs in report.sections:
            for name, png in figs.items():
                (tmp / "figures" / name).write_bytes(png)
        runs.to_csv(tmp / "runs.csv", index=False)
        epochs.to_csv(tmp / "epochs.csv", index=False)
        if submissions is not None and len(submissions):
            submissions.to_csv(tmp / "submissions.csv", index=False)
        stamp = time.strftime("%Y-%m-%d %H:%M")
        (tmp / "summary.md").write_text(markdown(report, sources, stamp))
        (tmp / "report.html").write_text(html_page(report, sources, stamp))
    return out


def _fmt(value) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.{ROUND}g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def markdown_table(table: pd.DataFrame) -> str:
    if table is None or table.empty:
        return "(nothing to show)\n"
    head = "| " + " | ".join(table.columns) + " |\n|" + "---|" * len(table.columns) + "\n"
    return head + "".join("| " + " | ".join(_fmt(v) for v in row) + " |\n" for row in table.itertuples(index=False))


def prediction_table(predictions: list[Prediction]) -> pd.DataFrame:
    return pd.DataFrame([{"benchmark": p.benchmark, "units": p.units, "global_batch_size": p.global_batch_size,
                          "epochs": p.epochs, "samples_per_second": p.samples_per_second,
                          "predicted_seconds": p.time_to_solution, "measured_seconds": p.measured,
                          "relative_error": p.relative_error, "measured_runs": p.measured_runs,
                          "throughput_model": p.throughput_model,
                          "epochs_model": p.epochs_model} for p in predictions])


def markdown(report: Report, sources: list[str], stamp: str) -> str:
    parts = [f"# Analysis report\n\nRuns from {', '.join(f'`{s}`' for s in sources)}; written {stamp} by "
             f"`python -m common.campaign.analysis report`.\n"]
    for title, prose, table, figs in report.sections:
        parts.append(f"\n## {title}\n\n{prose}\n\n{markdown_table(table)}")
        parts.extend(f"\n![{name}](figures/{name})\n" for name in figs)
    if report.predictions:
        parts.append("\n## Predicted time to solution\n\n" + markdown_table(prediction_table(report.predictions)))
    return "".join(parts)


def html_page(report: Report, sources: list[str], stamp: str) -> str:
    body = [f"<h1>Analysis report</h1><p>Runs from {html.escape(', '.join(sources))}; written {stamp}.</p>"]
    for title, prose, table, figs in report.sections:
        body.append(f"<h2>{html.escape(title)}</h2><p>{html.escape(prose)}</p>")
        if table is not None and not table.empty:
            readable = table.rename(columns=lambda c: str(c).replace("_", " "))  # headers that can wrap
            body.append('<div class="wide">' + readable.to_html(index=False, float_format=lambda v: _fmt(float(v)),
                                                                 na_rep="") + "</div>")
        body.extend(f'<img alt="{name}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
                    for name, png in figs.items())
    if report.predictions:
        body.append("<h2>Predicted time to solution</h2>" + prediction_table(report.predictions).to_html(
            index=False, float_format=lambda v: _fmt(float(v)), na_rep=""))
    style = "body{font-family:sans-serif;max-width:70em;margin:auto}table{border-collapse:collapse;font-size:85%}" \
            "td,th{border:1px solid #ccc;padding:2px 6px}.wide{overflow-x:auto}img{max-width:100%;display:block;margin:1em 0}"
    return f"<!doctype html><html><head><meta charset='utf-8'><title>Analysis report</title><style>{style}</style>" \
           f"</head><body>{''.join(body)}</body></html>\n"
