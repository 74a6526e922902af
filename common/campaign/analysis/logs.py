"""Run directories into tidy tables: one row per run, one row per epoch.

A run directory is any directory holding an `mlperf.log` (a campaign's `runs/run_<i>/`, a `make demo`
run, a single training's output_dir); `find_runs` collects them below the paths given, leaving out
runs a campaign moved to `aborted/` and the copies in its `submission/`. Times come from the MLPerf
log alone; summary.json adds what the log does not say on CPU systems (ranks, the loader, the threads).
A run resumed from a checkpoint (docs/faults.md) is one row: its earlier attempts' logs in
`attempts/<n>/` are added in, times summed over the attempts, epochs counted once.

Run columns (seconds unless named otherwise): benchmark, campaign, run, seed, division, status,
converged, ranks, nodes, units (compute units: accelerators, or ranks without them), global_batch_size,
local_batch_size, train_samples, eval_samples, time_to_train, staging, training, evaluation, other
(time to train not spent in those three: pipeline set-up, the gaps between), epochs,
epochs_to_converge (NaN when the target was not reached), metric_name, final_metric, samples_per_second
(training samples over the time inside the epochs), epoch_seconds_mean, staging_ratio (staging over
the mean epoch time, the paper's Table 5), unit_hours (units x time to train), attempts (1 + the times it was resumed),
precision (the numerics it trained in: float32 or mixed_bfloat16, from summary.json),
and from summary.json's `system` object (docs/metrics.md; NaN when the run has none): sustained_gflops,
fraction_of_peak, input_wait_share, allreduce_share, allreduce_wait_share, allreduce_gb_per_s,
energy_j_per_sample, peak_rss_mb (the largest rank's), step_compute, step_allreduce, step_input_wait, step_other
(the shares of a timed window of steps).
Epoch columns: benchmark, campaign, run, attempt, epoch, start (s since run_start, earlier attempts'
time included), epoch_seconds (training only: evaluations inside the epoch excluded), eval_seconds,
metric (the epoch's last evaluation), samples_per_second (NaN for the pieces of an epoch cut by a stop).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Iterable

import pandas as pd

from common.base import mlperf_log
from common.base.errors import BenchError

LOG_NAME = "mlperf.log"
SKIPPED_DIRS = ("aborted", "submission", ".submission.tmp", "attempts")
RESUME_KEY = "resumed_from_checkpoint"
METRIC_KEYS = {"eval_error": "mae", "eval_accuracy": "iou"}  # CosmoFlow, DeepCAM


def find_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Every run directory at or below `paths`, sorted; a path with none is an error naming it."""
    found = []
    for path in map(Path, paths):
        if not path.exists():
            raise BenchError(f"{path}: no such file or directory (expected a run or campaign directory)")
        runs = [path] if (path / LOG_NAME).is_file() else \
            sorted(p.parent for p in path.rglob(LOG_NAME) if not set(SKIPPED_DIRS) & set(p.relative_to(path).parts))
        if not runs:
            raise BenchError(f"{path}: holds no {LOG_NAME} (not a run directory, nor a campaign with finished runs)")
        found.extend(runs)
    return sorted(dict.fromkeys(found))


def read_events(log: Path) -> list[dict]:
    """The `:::MLLOG` events of a log, in order; a log with none (or an unreadable one) is an error."""
    events = mlperf_log.read_events(log, strict=True)
    if not events:
        raise BenchError(f"{log}: no :::MLLOG events; not an MLPerf log")
    return events


def intervals(events: list[dict], start: str, stop: str) -> list[tuple[int, float, float]]:
    """(epoch_num, start ms, stop ms) of the start/stop pairs that have both, in order (an epoch may hold
    several: DeepCAM evaluates twice per epoch)."""
    opened, out = {}, []
    for e in events:
        epoch = (e.get("metadata") or {}).get("epoch_num")
        if e["key"] == start:
            opened[epoch] = e["time_ms"]
        elif e["key"] == stop and epoch in opened:
            out.append((epoch, opened.pop(epoch), e["time_ms"]))
    return out


def overlap(a: float, b: float, spans: list[tuple[int, float, float]]) -> float:
    """Milliseconds of `spans` inside [a, b]: evaluations run inside DeepCAM's epochs, after CosmoFlow's."""
    return sum(max(0.0, min(b, y) - max(a, x)) for _, x, y in spans)


def _first(events: list[dict], key: str, field: str = "value"):
    for e in events:
        if e["key"] == key:
            return e["time_ms"] if field == "time" else e.get(field)
    return None


def campaign_of(run: Path) -> str:
    """The campaign directory's name for a campaign's run (…/<campaign>/runs/run_<i>), else the run's parent."""
    return run.parent.parent.name if run.parent.name == "runs" else run.parent.name


def attempt_logs(run: Path) -> list[Path]:
    """The MLPerf logs of a run's attempts in order: attempts/1/, attempts/2/, ..., then the run's own."""
    earlier = [p for p in (run / "attempts").glob(f"*/{LOG_NAME}") if p.parent.name.isdigit()]
    return sorted(earlier, key=lambda p: int(p.parent.name)) + [run / LOG_NAME]


@dataclasses.dataclass
class _Attempt:
    """One attempt's log, cut into the pieces the tables add up."""

    events: list[dict]
    start: float  # ms
    end: float
    epochs: list[tuple[int, float, float]]
    evals: list[tuple[int, float, float]]
    whole: list[bool]  # per epoch interval: a whole epoch, not a piece of one cut by a stop and resumed inside

    @classmethod
    def read(cls, log: Path) -> "_Attempt":
        events = read_events(log)
        start, stop = _first(events, "run_start", "time"), _first(events, "run_stop", "time")
        if start is None:
            raise BenchError(f"{log}: no run_start; the run did not get past init")
        epochs = intervals(events, "epoch_start", "epoch_stop")
        end = stop if stop is not None else max(e["time_ms"] for e in events)
        return cls(events, start, end, epochs, intervals(events, "eval_start", "eval_stop"), [True] * len(epochs))

    @property
    def resumed_inside_an_epoch(self) -> bool:
        return ((_first(self.events, RESUME_KEY) or {}).get("step") or 0) > 0


def _status(events: list[dict]) -> str:
    return (next((e for e in events if e["key"] == "run_stop"), {}).get("metadata") or {}).get("status", "unfinished")


def _read_attempts(run: Path) -> list[_Attempt]:
    """A run's attempts; an epoch split between two (stopped, then resumed inside it) is marked not whole."""
    attempts = [_Attempt.read(log) for log in attempt_logs(run)]
    for before, after in zip(attempts, attempts[1:]):
        if after.resumed_inside_an_epoch and before.epochs and after.epochs:
            before.whole[-1] = after.whole[0] = False
    return attempts


def parse_run(run: Path) -> tuple[dict, list[dict]]:
    """(run row, epoch rows) of one run directory, its earlier attempts (if it was resumed) included."""
    attempts = _read_attempts(run)
    events = [e for a in attempts for e in a.events]
    summary = _summary(run)
    metrics = {(e.get("metadata") or {}).get("epoch_num"): e["value"] for e in events if e["key"] in METRIC_KEYS}
    metric_key = next((e["key"] for e in events if e["key"] in METRIC_KEYS), None)
    train_samples = _first(events, "train_samples")
    row = _run_row(run, attempts, summary, metrics, metric_key, train_samples)
    epoch_rows, before = [], 0.0
    for number, attempt in enumerate(attempts, 1):
        for (n, a, b), whole in zip(attempt.epochs, attempt.whole):
            train_ms = (b - a) - overlap(a, b, attempt.evals)
            epoch_rows.append({"benchmark": row["benchmark"], "campaign": row["campaign"], "run": row["run"],
                               "attempt": number, "epoch": n, "start": before + (a - attempt.start) / 1000,
                               "epoch_seconds": train_ms / 1000,
                               "eval_seconds": sum(y - x for m, x, y in attempt.evals if m == n) / 1000,
                               "metric": metrics.get(n, math.nan),
                               "samples_per_second": train_samples / (train_ms / 1000)
                               if train_samples and train_ms > 0 and whole else math.nan})
        before += (attempt.end - attempt.start) / 1000
    return row, epoch_rows


def _run_row(run, attempts: list[_Attempt], summary, metrics, metric_key, train_samples) -> dict:
    events = [e for a in attempts for e in a.events]
    status = _status(attempts[-1].events)
    nodes = _first(events, "number_of_nodes")
    accelerators = _first(events, "accelerators_per_node") or 0
    ranks = summary.get("ranks") or (nodes or 1) * max(accelerators, 1)
    evaluation = sum(b - a for att in attempts for _, a, b in att.evals) / 1000
    # Training time: evaluations inside epochs excluded; throughput only from whole epochs.
    pieces = [((b - a) - overlap(a, b, att.evals), whole) for att in attempts
              for (_, a, b), whole in zip(att.epochs, att.whole)]
    training = sum(ms for ms, _ in pieces) / 1000
    whole_ms, whole_epochs = sum(ms for ms, w in pieces if w), sum(w for _, w in pieces)
    epochs = sorted({n for att in attempts for n, _, _ in att.epochs})
    staging = sum(_staging_seconds(att.events, att.start, timed=True) for att in attempts)  # inside the run
    init_staging = sum(_staging_seconds(att.events, att.start, timed=False) for att in attempts)  # before it
    ttt = sum(att.end - att.start for att in attempts) / 1000
    converged = status == "success"
    epoch_mean = whole_ms / 1000 / whole_epochs if whole_epochs else math.nan
    global_batch = _first(events, "global_batch_size")
    units = (nodes or 1) * accelerators if accelerators else ranks
    return {
        "benchmark": _first(events, "submission_benchmark"), "campaign": campaign_of(run), "run": str(run),
        "seed": _first(events, "seed"), "division": _first(events, "submission_division"), "status": status,
        "converged": converged, "ranks": ranks, "nodes": nodes, "units": units,
        "global_batch_size": global_batch,
        "local_batch_size": global_batch // ranks if global_batch and ranks and global_batch % ranks == 0 else None,
        "train_samples": train_samples, "eval_samples": _first(events, "eval_samples"),
        "time_to_train": ttt, "staging": staging, "init_staging": init_staging, "training": training,
        "evaluation": evaluation,
        "other": max(ttt - staging - training - evaluation, 0.0), "epochs": len(epochs),
        "epochs_to_converge": max(metrics) if converged and metrics else math.nan,
        "metric_name": METRIC_KEYS.get(metric_key, metric_key),
        "final_metric": metrics[max(metrics)] if metrics else math.nan,
        "samples_per_second": train_samples * whole_epochs / (whole_ms / 1000) if train_samples and whole_ms > 0
        else math.nan,
        "epoch_seconds_mean": epoch_mean,
        "staging_ratio": (staging + init_staging) / epoch_mean if epochs and epoch_mean > 0 else math.nan,
        "unit_hours": units * ttt / 3600,
        "attempts": len(attempts),
        "precision": trained_precision(summary),
        **system_columns(summary.get("system")),
    }


def trained_precision(summary: dict) -> str:
    """The numerics the run trained in: its summary's chosen precision, else its config's, else "unknown"."""
    chosen = (summary.get("precision") or {}).get("precision")
    configured = ((summary.get("config") or {}).get("train") or {}).get("precision")
    return str(chosen or configured or "unknown")


SYSTEM_FIELDS = ("sustained_gflops", "fraction_of_peak", "input_wait_share", "allreduce_share", "allreduce_wait_share",
                 "allreduce_gb_per_s", "energy_j_per_sample")
STEP_PARTS = ("compute", "allreduce", "input_wait", "other")


def system_columns(system: dict | None) -> dict:
    """The run row's columns from summary.json's `system` object (NaN for what it lacks)."""
    system = system or {}
    columns = {k: _number(system.get(k)) for k in SYSTEM_FIELDS}
    columns["peak_rss_mb"] = max(system.get("peak_rss_mb") or [math.nan])
    steps = system.get("step_breakdown") or {}
    return columns | {f"step_{part}": _number(steps.get(part)) for part in STEP_PARTS}


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _staging_seconds(events: list[dict], run_start: float, timed: bool) -> float:
    """The logged staging's seconds when it is inside the timed run (`timed`) or before run_start (not), else 0."""
    a, b = _first(events, "staging_start", "time"), _first(events, "staging_stop", "time")
    if a is None or b is None or (a >= run_start) != timed:
        return 0.0
    return (b - a) / 1000


def _summary(run: Path) -> dict:
    path = run / "summary.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise BenchError(f"{path}: not valid JSON ({err})") from None


def load_runs(paths: Iterable[str | Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, epochs) tables of every run directory at or below `paths`."""
    rows, epoch_rows = [], []
    for run in find_runs(paths):
        row, epochs = parse_run(run)
        rows.append(row)
        epoch_rows.extend(epochs)
    return pd.DataFrame(rows), pd.DataFrame(epoch_rows)
