"""Scores of submission trees as MLPerf HPC's rules give them (common/campaign/rules.py), one row per
(submitter, system, benchmark, scaling):

    python -m common.campaign.analysis scores ROOT [ROOT ...] [--round R] [--json] [--check]

Columns (None / null where the logs do not say):
- runs: result files; converged: runs with run_start, run_stop and an evaluation at the target (status ignored).
- score_minutes: strong scaling, the olympic mean of the time to train (run_stop - run_start); weak scaling, the
  time to train all (the last counted instance's run_stop - the first one's run_start). score_minutes_rcp: the
  strong score times mlperf-logging's RCP normalisation factor (closed division, rounds with RCPs, the RCP test
  passed), as its result summariser scales it. unscored_reason: why there is no score ("" when there is).
- units: compute units as the result summariser counts an instance, number_of_nodes x max(accelerators_per_node,
  1) from the log (weak scaling: instances x instance_scale); accelerators and processors: the system JSON's
  number_of_nodes x accelerators_per_node and x host_processors_per_node.
- epochs_mean, epochs_std: epochs to converge (the epoch_num of the first evaluation at the target) over the
  converged runs; the standard deviation is the population one (numpy's, as mlperf-logging's RCP checker).
- train_samples_per_second_per_unit: train_samples x the epochs a run logs (epoch_start .. epoch_stop pairs)
  over the time inside them, evaluations inside an epoch excluded, divided by the run's units; runs without
  epoch pairs: train_samples x the last evaluation's epoch_num over run_stop - run_start less evaluation and
  staging time. eval_samples_per_second_per_unit: eval_samples x evaluations over the time of the
  eval_start .. eval_stop pairs, per unit. Both the mean over the runs that log them.
- staging_minutes_mean, staging_minutes_std: staging_stop - staging_start over the runs that log it.
- compute_budget_unit_hours: strong, units x score; weak, units (every instance's) x the time to train all.
- weak scaling only: models (instances counted), instance_scale (units per instance), models_per_minute.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from common.base.errors import BenchError
from common.campaign import rules
from common.campaign.analysis.logs import overlap
from common.campaign.analysis.published import RunLog, Submission, find_submissions, read_run

WEAK_KEYS = ("models", "instance_scale", "models_per_minute")


@dataclasses.dataclass
class RunResult:
    """One result file judged by the rules."""

    log: RunLog
    minutes: float | None  # time to train; None for a failed run
    failure: str  # why it failed ("" when it converged)
    epochs: float | None  # epochs to converge
    units: int | None  # number_of_nodes x max(accelerators_per_node, 1)
    pruned: str = ""  # why the rules do not count it (a duplicate seed)


def judge(log: RunLog, goal: rules.Target | None, unscored: str) -> RunResult:
    """Did the run converge (an evaluation at the target, and run_stop), how long and in how many epochs."""
    nodes, accelerators = log.count("number_of_nodes"), log.count("accelerators_per_node")
    units = nodes * max(accelerators, 1) if nodes is not None and accelerators is not None else None
    evals = log.evals.get(goal.metric, []) if goal else []
    first = rules.first_at_target([v for _, v in evals], goal) if goal else None
    if goal is None:
        failure = unscored
    elif log.run_start is None:
        failure = "no run_start"
    elif log.run_stop is None:
        failure = "no run_stop (cut short)"
    elif first is None:
        failure = f"no evaluation meets {goal.text()} ({len(evals)} evaluations)"
    else:
        failure = ""
    minutes = (log.run_stop - log.run_start) / 60_000 if not failure else None
    return RunResult(log, minutes, failure, evals[first][0] if first is not None else None, units)


def train_rate(run: RunResult) -> float | None:
    """Training samples per second per unit (see the module's docstring)."""
    log, samples = run.log, run.log.count("train_samples")
    if not samples or not run.units:
        return None
    eval_ms = sum(b - a for _, a, b in log.eval_spans)
    if log.epochs:
        train_ms, epochs = sum((b - a) - overlap(a, b, log.eval_spans) for _, a, b in log.epochs), len(log.epochs)
    elif log.run_start is not None and log.run_stop is not None and log.evals:
        epochs = max((e for values in log.evals.values() for e, _ in values if e is not None), default=0)
        train_ms = log.run_stop - log.run_start - eval_ms - (log.staging_ms or 0.0)
    else:
        return None
    return samples * epochs / (train_ms / 1000) / run.units if train_ms > 0 and epochs else None


def eval_rate(run: RunResult) -> float | None:
    """Evaluation samples per second per unit over the logged evaluations."""
    samples, spans = run.log.count("eval_samples"), run.log.eval_spans
    eval_ms = sum(b - a for _, a, b in spans)
    if not samples or not run.units or eval_ms <= 0:
        return None
    return samples * len(spans) / (eval_ms / 1000) / run.units


@dataclasses.dataclass
class ScoreRow:
    """One submission's scores; `as_json` gives the documented keys (weak scaling adds WEAK_KEYS)."""

    submitter: str
    system: str
    benchmark: str
    scaling: str
    division: str | None
    round: str
    runs: int
    converged: int
    score_minutes: float | None
    score_minutes_rcp: float | None
    unscored_reason: str
    units: int | None
    accelerators: int | None
    processors: int | None
    global_batch_size: int | None
    epochs_mean: float | None
    epochs_std: float | None
    train_samples_per_second_per_unit: float | None
    eval_samples_per_second_per_unit: float | None
    staging_minutes_mean: float | None
    staging_minutes_std: float | None
    compute_budget_unit_hours: float | None
    models: int | None = None
    instance_scale: int | None = None
    models_per_minute: float | None = None

    def as_json(self) -> dict:
        row = dataclasses.asdict(self)
        return row if self.scaling == "weak" else {k: v for k, v in row.items() if k not in WEAK_KEYS}


def _mean_std(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    found = [float(v) for v in values if v is not None]
    return (statistics.fmean(found), statistics.pstdev(found)) if found else (None, None)


def _first(values: Iterable[Any]) -> Any:
    return next((v for v in values if v is not None), None)


def prune(sub: Submission, runs: list[RunResult]) -> list[RunResult]:
    """The runs the rules count: from round 2.0, a run repeating an earlier run's seed is left out."""
    if not rules.prunes_duplicate_seeds(sub.round):
        return runs
    seeds = [r.log.values.get("seed") for r in runs]
    for i in rules.duplicate_seeds([s if isinstance(s, (int, str)) else None for s in seeds]):
        first = next(r for r in runs if r.log.values.get("seed") == seeds[i])
        runs[i].pruned = f"{runs[i].log.path.name} repeats the seed {seeds[i]} of {first.log.path.name}"
    return [r for r in runs if not r.pruned]


def strong_score(sub: Submission, runs: list[RunResult]) -> tuple[float | None, str]:
    """The olympic mean of the counted runs, or None and why."""
    counted, required = prune(sub, runs), rules.required_runs(sub.benchmark)
    result = rules.olympic([r.minutes for r in counted])
    pruned = "; ".join(r.pruned for r in runs if r.pruned)
    if result.reason:
        return None, "; ".join(filter(None, [result.reason, pruned]))
    if len(counted) < required:
        return None, "; ".join(filter(None, [f"{len(counted)} runs count; the rules ask for {required}", pruned]))
    return result.minutes, ""


def weak_score(sub: Submission, runs: list[RunResult]) -> tuple[float | None, str, int, int | None]:
    """(time to train all, why not, models counted, instance scale) of a weak-scaling submission."""
    counted = [r for r in prune(sub, runs) if r.minutes is not None]
    scales = {r.units for r in counted if r.units is not None}
    minutes, reason = rules.time_to_train_all([(r.log.run_start, r.log.run_stop) for r in counted],
                                              rules.required_runs(sub.benchmark))
    if len(scales) > 1:
        reason = reason or f"the instances have different scales {sorted(scales)}"
    return (None if reason else minutes), reason, len(counted), _first(r.units for r in counted)


def rcp_score(sub: Submission, division: str | None, minutes: float | None,
              runs: list[RunResult]) -> tuple[float | None, str]:
    """The score times the RCP normalisation factor of mlperf-logging's RCP checker, and a note when the RCP test
    fails. Closed division, strong scaling, rounds with RCPs; the epochs are ours (a failed run's infinite)."""
    if minutes is None or sub.scaling != "strong" or division != "closed" or sub.round not in rules.RCP_ROUNDS:
        return None, ""
    batches = {r.log.count("global_batch_size") for r in runs if not r.pruned}
    if len(batches) != 1 or None in batches:
        return None, f"{sub.folder}: no RCP normalisation: global_batch_size {sorted(map(str, batches))}"
    epochs = [r.epochs if r.minutes is not None and r.epochs is not None else FAILED_EPOCHS
              for r in runs if not r.pruned]
    passed, message, factor = rcp_factor(sub.benchmark, rules.ruleset(sub.round), batches.pop(), epochs)
    if not passed:
        return None, f"{sub.folder}: RCP test failed ({message}); no normalised score"
    return minutes * factor, ""


FAILED_EPOCHS = 1e9  # what mlperf-logging's RCP checker gives a run that did not converge


@functools.lru_cache(maxsize=None)
def _rcp_checker(benchmark: str, ruleset: str):
    from mlperf_logging.rcp_checker import rcp_checker
    with _quiet_logging():
        return rcp_checker.RCP_Checker("hpc", ruleset, benchmark, False)


def rcp_factor(benchmark: str, ruleset: str, batch: int, epochs: list[float]) -> tuple[bool, str, float]:
    """mlperf-logging's RCP test of a submission's epochs to converge at global batch `batch`, as its
    check_directory decides it (RCP found, interpolated, or the smallest one's when the batch is below them all),
    without its own log reading and without the scaling.json it may write: (passed, message, factor)."""
    checker = _rcp_checker(benchmark, ruleset)
    with _quiet_logging():
        record = checker._find_rcp(batch, "pruned_rcps")
        low, high = checker._find_top_min_rcp(batch, "pruned_rcps"), checker._find_bottom_max_rcp(batch, "pruned_rcps")
        if record is not None:
            message = "RCP found"
        elif low is not None and high is not None:
            record, message = checker._create_interp_rcp(batch, low, high)[1], "RCP Interpolation"
        elif low is None and high is not None:
            record, message = checker._find_min_rcp("pruned_rcps"), "RCP not found but smaller batch sizes converge slower"
        else:
            return False, f"Missing RCP, please submit RCP with BS = {batch}", 1.0
        passed, factor = checker._eval_submission_record(record, list(epochs), "")
    return passed, message, float(factor)


@contextlib.contextmanager
def _quiet_logging():
    """mlperf-logging's tools log every step at INFO; silence them for the call."""
    root, level = logging.getLogger(), logging.getLogger().level
    root.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        root.setLevel(level)


def _division(sub: Submission, runs: list[RunResult]) -> str | None:
    """The system JSON's division, else the logs' submission_division."""
    return sub.system.division or _first(r.log.values.get("submission_division") for r in runs)


def score_submission(sub: Submission, logs: list[RunLog], warnings: list[str]) -> ScoreRow:
    """The row of one submission from its result files' readings."""
    goal, unscored = rules.target(sub.benchmark, sub.round)
    runs = [judge(log, goal, unscored) for log in logs]
    if goal is not None:
        warnings.extend(f"{r.log.path}: a failed run: {r.failure}" for r in runs if r.failure)
    division = _division(sub, runs)
    weak = sub.scaling == "weak"
    if goal is None:
        minutes, reason, models, scale = None, unscored, None, None
    elif weak:
        minutes, reason, models, scale = weak_score(sub, runs)
    else:
        (minutes, reason), models, scale = strong_score(sub, runs), None, None
    rcp, note = rcp_score(sub, division, minutes, runs)
    warnings.extend(filter(None, [note]))
    units = (scale * len(runs) if scale is not None else None) if weak else _first(r.units for r in runs)
    units = units if units is not None else _system_units(sub)
    converged = [r for r in runs if r.minutes is not None]
    epochs, staging = _mean_std(r.epochs for r in converged), _mean_std(
        r.log.staging_ms / 60_000 if r.log.staging_ms is not None else None for r in runs)
    return ScoreRow(
        submitter=sub.submitter, system=sub.system.name, benchmark=sub.benchmark, scaling=sub.scaling,
        division=division, round=sub.round, runs=len(runs), converged=len(converged), score_minutes=minutes,
        score_minutes_rcp=rcp, unscored_reason=reason if minutes is None else "", units=units,
        accelerators=sub.system.accelerators, processors=sub.system.processors,
        global_batch_size=_first(r.log.count("global_batch_size") for r in runs), epochs_mean=epochs[0],
        epochs_std=epochs[1], train_samples_per_second_per_unit=_mean_std(map(train_rate, runs))[0],
        eval_samples_per_second_per_unit=_mean_std(map(eval_rate, runs))[0], staging_minutes_mean=staging[0],
        staging_minutes_std=staging[1],
        compute_budget_unit_hours=units * minutes / 60 if units is not None and minutes is not None else None,
        models=models if weak else None, instance_scale=scale,
        models_per_minute=models / minutes if weak and minutes else None)


def _system_units(sub: Submission) -> int | None:
    """Units from the system JSON where no log says: number_of_nodes x max(accelerators_per_node, 1)."""
    nodes, accelerators = sub.system.nodes, sub.system.accelerators_per_node
    return nodes * max(accelerators or 0, 1) if nodes is not None else None


# ---------------------------------------------------------------------------- a whole tree
@dataclasses.dataclass
class Scored:
    """The rows of the ROOTs, the warnings met, and what the reading (and the checker) took."""

    rows: list[ScoreRow]
    warnings: list[str]
    megabytes: float
    read_seconds: float
    check_seconds: float | None = None
    notes: list[str] = dataclasses.field(default_factory=list)  # what the rules applied where a round has none
    splits: list[dict] = dataclasses.field(default_factory=list)  # per row: time_split of its runs
    own: list[bool] = dataclasses.field(default_factory=list)  # per row: a campaign of the suite's own


def read_all(subs: list[Submission], warnings: list[str]) -> list[list[RunLog]]:
    """Every submission's result files, read with a progress bar (bytes) on stderr."""
    from tqdm import tqdm
    total = sum(_size(p) for sub in subs for p in sub.results)
    out = []
    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="reading result files",
              file=sys.stderr, mininterval=0.5, leave=False) as bar:
        for sub in subs:
            logs = [read_run(p) for p in sub.results]
            for log in logs:
                warnings.extend(log.warnings)
                bar.update(log.size)
            out.append(logs)
    return out


def time_split(logs: list[RunLog]) -> dict:
    """Mean minutes of the time to train of the runs that have run_start and run_stop, split into staging (logged
    inside the run), training (the epochs, evaluations inside them excluded), evaluation and other (the rest), and
    the mean training minutes of an epoch (the paper's Fig. 1 and Table 5), and the training samples of an epoch;
    NaN where no run says."""
    parts: dict[str, list[float]] = {k: [] for k in ("staging", "training", "evaluation", "other", "epoch")}
    for log in logs:
        if log.run_start is None or log.run_stop is None:
            continue
        timed = log.staging_ms if log.staging_start is not None and log.staging_start >= log.run_start else 0.0
        evaluation = sum(b - a for _, a, b in log.eval_spans)
        epochs = [(b - a) - overlap(a, b, log.eval_spans) for _, a, b in log.epochs]
        other = log.run_stop - log.run_start - timed - sum(epochs) - evaluation
        for key, ms in (("staging", timed), ("training", sum(epochs)), ("evaluation", evaluation),
                        ("other", max(other, 0.0))):
            parts[key].append(ms / 60_000)
        if epochs:
            parts["epoch"].append(sum(epochs) / len(epochs) / 60_000)
    samples = next((log.count("train_samples") for log in logs if log.count("train_samples")), None)
    return {f"{k}_minutes": statistics.fmean(v) if v else math.nan for k, v in parts.items()} | {
        "train_samples": samples if samples is not None else math.nan}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def score_roots(roots: list[Path], round_: str | None, check: bool = False) -> Scored:
    """The scores of every submission under the ROOTs (a BenchError for a ROOT that holds none)."""
    warnings: list[str] = []
    subs = [s for root in roots for s in find_submissions(root, round_, warnings)]
    if not subs:
        raise BenchError(f"{', '.join(map(str, roots))}: no submission with result files found")
    start = time.perf_counter()
    logs = read_all(subs, warnings)
    rows = [score_submission(sub, sub_logs, warnings) for sub, sub_logs in zip(subs, logs)]
    seconds = time.perf_counter() - start
    megabytes = sum(log.size for sub_logs in logs for log in sub_logs) / 1e6
    scored = Scored(rows, warnings, megabytes, seconds, notes=[rules.V07_NOTE] if any(s.round == "0.7" for s in subs)
                    else [], splits=[time_split(sub_logs) for sub_logs in logs],
                    own=[(sub.folder / "campaign.json").is_file() for sub in subs])
    if check:
        start = time.perf_counter()
        warnings.extend(compliance_findings(subs))
        scored.check_seconds = time.perf_counter() - start
    return scored


def compliance_findings(subs: list[Submission]) -> list[str]:
    """mlperf-logging's compliance checker, in this process, on every result file: one line per failing file
    (the checker writes nothing; its log lines are silenced)."""
    from mlperf_logging.compliance_checker import mlp_compliance
    findings = []
    with _quiet_logging():
        for sub in subs:
            ruleset = rules.ruleset(sub.round)
            for path in sub.results:
                findings.extend(_check_one(mlp_compliance, path, ruleset))
    return findings


def _check_one(mlp_compliance, path: Path, ruleset: str) -> list[str]:
    if not path.is_file():
        return [f"{path}: compliance checker: no such file"]
    checker = mlp_compliance.make_checker(usage="hpc", ruleset=ruleset, quiet=True, werror=False)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            valid, *_ = mlp_compliance.main(str(path), f"hpc_{ruleset}/common.yaml", checker)
    except Exception as err:  # noqa: BLE001 - the checker's own parser on a document the suite did not write
        return [f"{path}: the compliance checker (hpc {ruleset}) stopped: {type(err).__name__}: {err}"]
    return [] if valid else [f"{path}: fails mlperf-logging's compliance checker (hpc {ruleset})"]


# ---------------------------------------------------------------------------- output
COLUMNS = (  # (key, title, format)
    ("submitter", "submitter", "{}"), ("system", "system", "{}"), ("benchmark", "benchmark", "{}"),
    ("scaling", "scaling", "{}"), ("division", "div", "{}"), ("round", "round", "{}"), ("runs", "runs", "{}"),
    ("converged", "conv", "{}"), ("score_minutes", "minutes", "{:.3f}"), ("score_minutes_rcp", "rcp_min", "{:.3f}"),
    ("units", "units", "{}"), ("accelerators", "accel", "{}"), ("processors", "cpus", "{}"),
    ("global_batch_size", "batch", "{}"), ("epochs_mean", "epochs", "{:.2f}"), ("epochs_std", "sd", "{:.2f}"),
    ("train_samples_per_second_per_unit", "train/s/u", "{:.2f}"), ("eval_samples_per_second_per_unit", "eval/s/u",
                                                                   "{:.2f}"),
    ("staging_minutes_mean", "staging", "{:.2f}"), ("staging_minutes_std", "sd", "{:.2f}"),
    ("compute_budget_unit_hours", "unit_h", "{:.1f}"), ("models", "models", "{}"), ("instance_scale", "scale", "{}"),
    ("models_per_minute", "models/min", "{:.3f}"), ("unscored_reason", "unscored", "{}"),
)


def table(rows: list[ScoreRow]) -> str:
    """The rows as an aligned text table ('-' where a log does not say; weak-only columns blank for strong)."""
    cells = [[title for _, title, _ in COLUMNS]]
    for row in rows:
        values = dataclasses.asdict(row)
        cells.append(["-" if values[key] is None else fmt.format(values[key]) for key, _, fmt in COLUMNS])
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells)
