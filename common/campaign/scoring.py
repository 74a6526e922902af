"""Score a finished campaign as MLPerf HPC does, and write its submission layout.

Every run's log is checked by the official compliance checker (common/campaign/compliance.py). The layout is the
one mlperf-logging's package checker reads for HPC:

    OUT/submission/results/<system>/strong/<benchmark>/result_<i>.txt   (time-to-train runs; weak/ for
                                                                         throughput instances)
    OUT/submission/systems/<system>.json                                (system description)
    OUT/submission/benchmarks/<benchmark>/implementations/hpc-sciml-bench/code_version.json

Time to train (strong scaling): the olympic mean of the runs' run_stop - run_start in minutes: the fastest
and the slowest run are dropped and the rest averaged; one failed run (no compliant log, e.g. the target
not reached) is dropped as the slowest, more than one leaves no score. Throughput (weak scaling):
time_to_train_all = max run_stop - min run_start over the compliant instances, with their number and
instance scale (nodes x accelerators per node), valid when at least the rules' count of instances
converged. Both are computed here, transparently, and by mlperf-logging's own result summariser on the
written layout; the two must agree. The package checker's verdict on the layout is recorded as well.
The result goes to OUT/score.json and OUT/score.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import io
import json
import logging
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from common.base.version import code_version
from common.campaign import rules, uncertainty
from common.campaign.spec import CampaignSpec, load_record, load_spec, required_runs, run_dir
from common.base.files import atomic_path, write_json_atomic
from common.campaign.compliance import check_log
from common.base.errors import BenchError
from common.base.host import cpu_model
from common.base.mlperf_log import read_events

USAGE, RULESET = "hpc", "3.0.0"
IMPLEMENTATION = "hpc-sciml-bench"
TOLERANCE_MINUTES = 1e-9


@dataclasses.dataclass
class RunScore:
    """One run as the scoring sees it."""

    index: int
    seed: int
    status: str  # the run's summary status, or crashed
    compliant: bool
    problems: list[str]  # the checker's findings when not compliant
    run_start_ms: float | None
    run_stop_ms: float | None
    division: str | None
    nodes: int | None
    scale: int | None  # nodes x max(accelerators per node, 1), as the summariser counts an instance
    counted: bool = False  # in the olympic mean (time to train) or the instances (throughput)
    epochs: int | None = None  # the epoch of the last evaluation (of a compliant run: epochs to converge)
    only_target_failed: bool = False  # not compliant, but the checker without the quality target's rule passes it

    @property
    def minutes(self) -> float | None:
        if self.run_start_ms is None or self.run_stop_ms is None:
            return None
        return (self.run_stop_ms - self.run_start_ms) / 60_000


@dataclasses.dataclass
class CampaignScore:
    benchmark: str
    mode: str
    system: str
    division: str
    required_runs: int
    runs: list[RunScore]
    score_minutes: float | None  # time to train (olympic) or time_to_train_all (throughput)
    summariser_minutes: float | None
    valid: bool  # an MLPerf-valid score: enough runs, few enough failures
    reason: str
    package_checker: dict
    summariser_output: str
    code: dict
    rcp_checker: dict | None = None  # closed time-to-train campaigns: mlperf-logging's RCP checker verdict
    score_interval: dict | None = None  # time to train: the score's bootstrap interval (common/campaign/uncertainty.py)
    epochs_mean: float | None = None  # time to train: olympic mean of the compliant runs' epochs to converge
    epochs_interval: dict | None = None  # and its interval


# ---------------------------------------------------------------------------- the rules (rules.py)
def olympic_minutes(runs: list[RunScore]) -> tuple[float | None, str]:
    """The olympic mean of the compliant runs' minutes (marks the counted runs), and why when there is none."""
    result = rules.olympic([r.minutes if r.compliant else None for r in runs])
    for i in result.counted:
        runs[i].counted = True
    return result.minutes, result.reason


def throughput_minutes(runs: list[RunScore], required: int) -> tuple[float | None, str]:
    """time_to_train_all over the compliant instances (marks them), or why there is no score."""
    for r in runs:
        r.counted = r.compliant
    return rules.time_to_train_all([(r.run_start_ms, r.run_stop_ms) if r.compliant else None for r in runs],
                                   required)


# ---------------------------------------------------------------------------- mlperf-logging's summariser
def summariser_score(folder: Path, spec: CampaignSpec) -> tuple[float | None, str]:
    """The score mlperf-logging's result summariser computes on `folder` (holding result_*.txt), and its
    printed output."""
    from mlperf_logging.result_summarizer import result_summarizer as summariser
    text = io.StringIO()
    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.CRITICAL)  # the checker it runs logs every line it reads
    try:
        with contextlib.redirect_stdout(text):
            if spec.mode == "throughput":
                scores, _ = summariser._compute_weak_score_standalone(spec.benchmark, spec.system, False,
                                                                      str(folder), USAGE, RULESET)
                minutes = scores.get(f"{spec.benchmark}:time_to_train_all")
            else:
                minutes, _, _ = summariser._compute_strong_score_standalone(spec.benchmark, spec.system, False,
                                                                            str(folder), USAGE, RULESET)
    finally:
        logging.getLogger().setLevel(quiet)
    return minutes, text.getvalue()


def package_check(submission: Path) -> dict:
    """mlperf-logging's package checker on the submission layout: its verdict and log."""
    log = submission.parent / "package_checker.log"
    log.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "mlperf_logging.package_checker", str(submission), USAGE, RULESET,
                           "--log_output", str(log)], capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    errors = [line for line in output.splitlines() if line.startswith(("ERROR", "CRITICAL"))]
    return {"passed": proc.returncode == 0 and "FOUND NO ERRORS" in output, "errors": errors, "log": str(log)}


def rcp_check(folder: Path, log: Path, rcps: Path | None = None) -> dict:
    """mlperf-logging's RCP checker on `folder` (result_*.txt): do the runs converge in as few epochs as the
    reference convergence point of their global batch allows? Its verdict, message and log. `rcps`: an RCP
    file of one's own (common/campaign/rcps.py) instead of the ones mlperf-logging ships."""
    log.unlink(missing_ok=True)
    custom = ["--custom_rcps", str(rcps)] if rcps else []
    proc = subprocess.run([sys.executable, "-m", "mlperf_logging.rcp_checker", str(folder), "--rcp_usage", USAGE,
                           "--rcp_version", RULESET, "--log_output", str(log), *custom], capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    verdicts = [line.split(" - ", 1)[-1] for line in output.splitlines() if "RCP test" in line]
    message = verdicts[-1] if verdicts else (output.strip().splitlines() or ["no output"])[-1]
    return {"passed": proc.returncode == 0 and "RCP test PASSED" in output, "message": message.strip(),
            "log": str(log)}


# ---------------------------------------------------------------------------- runs and layout
def score_run(out: Path, index: int, spec: CampaignSpec) -> RunScore:
    record = load_record(out, index)
    if record is None:
        raise BenchError(f"{run_dir(out, index)}: this run has not finished; resume the campaign with `run` first")
    log = run_dir(out, index) / "mlperf.log"
    score = RunScore(index=index, seed=record.seed, status=record.status, compliant=False, problems=[],
                     run_start_ms=None, run_stop_ms=None, division=None, nodes=None, scale=None)
    if not log.is_file() or log.stat().st_size == 0:
        score.problems = [f"no MLPerf log ({log})"]
        return score
    checked = check_log(log, usage=USAGE, ruleset=RULESET)
    score.compliant, score.problems = checked.passed, list(checked.messages if not checked.passed else ())
    score.only_target_failed = checked.only_target_failed
    keys = log_values(log)
    score.run_start_ms, score.run_stop_ms = keys.get("run_start"), keys.get("run_stop")
    score.epochs = keys.get("last_eval_epoch")
    score.division = keys.get("submission_division")
    if "number_of_nodes" in keys and "accelerators_per_node" in keys:
        score.nodes = int(keys["number_of_nodes"])
        score.scale = score.nodes * max(int(keys["accelerators_per_node"]), 1)
    if score.compliant and (score.run_start_ms is None or score.run_stop_ms is None):
        raise BenchError(f"{log}: passes the checker but has no run_start or run_stop")
    return score


def log_values(log: Path) -> dict:
    """run_start / run_stop times (ms) and the values of the other keys of an MLPerf log, first one wins;
    `last_eval_epoch`: the epoch_num of the last evaluation."""
    values: dict = {}
    for event in read_events(log):  # a line that is no JSON: the checker reports it
        key = event.get("key")
        if key in ("run_start", "run_stop"):
            values.setdefault(key, float(event["time_ms"]))
        elif key in ("eval_error", "eval_accuracy") and isinstance(event.get("metadata"), dict):
            values["last_eval_epoch"] = event["metadata"].get("epoch_num")  # the last one wins
        elif key is not None:
            values.setdefault(key, event.get("value"))
    return values


def write_submission(out: Path, spec: CampaignSpec, runs: list[RunScore], division: str,
                     system_file: str | None) -> Path:
    """The submission layout under OUT/submission (rewritten whole, through a temporary directory)."""
    final, scaling = out / "submission", "weak" if spec.mode == "throughput" else "strong"
    with atomic_path(final) as tmp:
        folder = tmp / "results" / spec.system / scaling / spec.benchmark
        folder.mkdir(parents=True)
        for r in runs:
            log = run_dir(out, r.index) / "mlperf.log"
            # A run without a log still has its result file: empty, so it counts as failed and the count holds.
            (folder / f"result_{r.index}.txt").write_bytes(log.read_bytes() if log.is_file() else b"")
        systems = tmp / "systems"
        systems.mkdir()
        write_json_atomic(system_description(spec, runs, division, system_file), systems / f"{spec.system}.json")
        code = tmp / "benchmarks" / spec.benchmark / "implementations" / IMPLEMENTATION
        write_json_atomic({**code_version(), "campaign": json.loads((out / "campaign.json").read_text())},
                          code / "code_version.json")
    return final / "results" / spec.system / scaling / spec.benchmark


def system_description(spec: CampaignSpec, runs: list[RunScore], division: str, system_file: str | None) -> dict:
    """The fields mlperf-logging's system description checker requires, detected on this machine where
    possible; a --system-file's fields replace them (a site describes its own interconnect, storage...)."""
    nodes = max((r.nodes or 1 for r in runs), default=1)
    cpu = cpu_model()
    detected = {
        "submitter": "hpc-sciml-bench", "division": division, "status": "onprem", "system_name": spec.system,
        "number_of_nodes": str(nodes), "host_processors_per_node": "1",
        "host_processor_model_name": cpu, "host_processor_core_count": str(os.cpu_count()),
        "host_processor_vcpu_count": str(os.cpu_count()), "host_processor_frequency": "not recorded",
        "host_processor_caches": "not recorded", "host_processor_interconnect": "not recorded",
        "host_memory_capacity": f"{_memory_gib():.0f} GiB", "host_storage_type": "not recorded",
        "host_storage_capacity": "not recorded", "host_networking": "not recorded",
        "host_networking_topology": "not recorded", "host_memory_configuration": "not recorded",
        "accelerators_per_node": "0", "accelerator_model_name": "none (CPU only)",
        "accelerator_host_interconnect": "N/A", "accelerator_frequency": "N/A", "accelerator_on-chip_memories": "N/A",
        "accelerator_memory_configuration": "N/A", "accelerator_memory_capacity": "N/A",
        "accelerator_interconnect": "N/A", "accelerator_interconnect_topology": "N/A", "cooling": "not recorded",
        "hw_notes": "detected by common/campaign/scoring.py; replace with --system-file",
        "framework": f"TensorFlow {_version('tensorflow')}, Horovod {_version('horovod')}",
        "other_software_stack": f"Python {platform.python_version()}, Keras {_version('keras')}, DALI "
                                f"{_version('nvidia-dali-cpu') or _version('nvidia-dali-cuda120')}, mlperf-logging "
                                f"{_version('mlperf-logging')}",
        "operating_system": _os_name(), "sw_notes": "",
    }
    if not system_file:
        return detected
    try:
        given = json.loads(Path(system_file).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise BenchError(f"--system-file {system_file}: not a readable JSON object ({err})") from None
    if not isinstance(given, dict):
        raise BenchError(f"--system-file {system_file}: a JSON {type(given).__name__}, expected an object")
    return {**detected, **given, "system_name": spec.system, "division": division}


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.platform()


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


# ---------------------------------------------------------------------------- the whole
def score_campaign(out: str | os.PathLike, system_file: str | None = None) -> CampaignScore:
    """Check, lay out and score the campaign in `out`; writes score.json and score.md and prints the table."""
    out = Path(out)
    spec = load_spec(out)
    runs = [score_run(out, i, spec) for i in range(spec.count)]
    division = _division(out, runs)
    folder = write_submission(out, spec, runs, division, system_file)
    required = required_runs(spec.benchmark)
    if spec.mode == "throughput":
        minutes, reason = throughput_minutes(runs, required)
    else:
        minutes, reason = olympic_minutes(runs)
        if not reason and len(runs) < required:
            reason = f"{len(runs)} runs; the rules ask for {required}"
    theirs, output = summariser_score(folder, spec)
    _agree(minutes, theirs, spec, reason)
    result = CampaignScore(benchmark=spec.benchmark, mode=spec.mode, system=spec.system, division=division,
                           required_runs=required, runs=runs, score_minutes=minutes, summariser_minutes=theirs,
                           valid=minutes is not None and not reason, reason=reason,
                           package_checker=package_check(out / "submission"), summariser_output=output,
                           code=json.loads((out / "campaign.json").read_text()).get("code", {}),
                           rcp_checker=rcp_check(folder, out / "rcp_checker.log")
                           if division == "closed" and spec.mode != "throughput" else None)
    if spec.mode != "throughput":
        _add_intervals(result)
    write_json_atomic(_as_json(result), out / "score.json")
    (out / "score.md").write_text(score_markdown(result))
    print(score_markdown(result), flush=True)
    return result


def _add_intervals(result: CampaignScore) -> None:
    """The bootstrap intervals of the time to train and of the epochs to converge (olympic means)."""
    passing = [r for r in result.runs if r.compliant]
    failed = len(result.runs) - len(passing)
    result.score_interval = dataclasses.asdict(uncertainty.olympic_interval([r.minutes for r in passing], failed))
    epochs = [float(r.epochs) for r in passing if r.epochs is not None]
    if len(epochs) == len(passing) and epochs:
        means = uncertainty.olympic_means(np.asarray([epochs]), failed)
        result.epochs_mean = None if means is None else float(means[0])
        result.epochs_interval = dataclasses.asdict(uncertainty.olympic_interval(epochs, failed))


def _interval_lines(result: CampaignScore) -> list[str]:
    if result.score_interval is None:
        return []
    interval = uncertainty.Interval(**result.score_interval)
    lines = [f"- {interval.confidence:.0%} interval of the time to train: {interval.text()} ({interval.method}, "
             f"{interval.resamples} resamples; rough with few runs: docs/campaigns.md)"]
    if result.epochs_interval is not None and result.epochs_mean is not None:
        epochs = uncertainty.Interval(**result.epochs_interval)
        lines.append(f"- epochs to converge (olympic mean of the compliant runs): {result.epochs_mean:.2f}, "
                     f"{epochs.confidence:.0%} interval {epochs.text(unit='', digits=2)}")
    return lines


def _division(out: Path, runs: list[RunScore]) -> str:
    divisions = {r.division for r in runs if r.division}
    if len(divisions) > 1:
        raise BenchError(f"{out}: the runs log different divisions {sorted(divisions)}; a submission has one")
    return divisions.pop() if divisions else "open"


def _agree(ours: float | None, theirs: float | None, spec: CampaignSpec, reason: str) -> None:
    """Our score and the summariser's must be the same number (the summariser gives none for a throughput
    campaign short of the rules' instance count, where ours is still reported, marked not valid)."""
    if spec.mode == "throughput" and theirs is None and reason:
        return
    if (ours is None) != (theirs is None) or (ours is not None and abs(ours - theirs) > TOLERANCE_MINUTES):
        raise BenchError(f"the campaign's score {ours} minutes differs from mlperf-logging's result summariser "
                         f"({theirs} minutes); this is a bug in common/campaign/scoring.py")


def _rcp_line(verdict: dict | None) -> str:
    if verdict is None:
        return "- RCP checker: not run (it applies to closed-division time-to-train campaigns)"
    return f"- RCP checker: {'passed' if verdict['passed'] else 'failed'}: {verdict['message']} ({verdict['log']})"


def _as_json(result: CampaignScore) -> dict:
    d = dataclasses.asdict(result)
    for run, obj in zip(result.runs, d["runs"]):
        obj["minutes"] = run.minutes
    return d


def score_markdown(result: CampaignScore) -> str:
    """The score and a row per run, as Markdown."""
    kind = "time_to_train_all (throughput)" if result.mode == "throughput" else "time to train (olympic mean)"
    score = f"{result.score_minutes:.3f} min" if result.score_minutes is not None else "none"
    lines = [f"# {result.benchmark} on {result.system}: {kind} {score}", "",
             f"- MLPerf HPC {RULESET}, {result.division} division; {len(result.runs)} runs, the rules ask for "
             f"{result.required_runs}" + ("" if result.mode != "throughput" else " converged instances"),
             f"- valid: {'yes' if result.valid else 'no: ' + result.reason}",
             *_interval_lines(result),
             f"- mlperf-logging's result summariser: " + (f"{result.summariser_minutes:.3f} min"
                                                          if result.summariser_minutes is not None else "no score"),
             f"- package checker: {'passed' if result.package_checker['passed'] else 'found errors'} "
             f"({result.package_checker['log']})",
             _rcp_line(result.rcp_checker),
             f"- code: {result.code.get('commit', 'unknown')}" + (" (modified)" if result.code.get("modified") else ""),
             "", "| run | seed | status | compliant | minutes | epochs | counted |", "|---|---|---|---|---|---|---|"]
    for r in result.runs:
        minutes = f"{r.minutes:.3f}" if r.minutes is not None else "-"
        lines.append(f"| {r.index} | {r.seed} | {r.status} | {'yes' if r.compliant else 'no'} | {minutes} | "
                     f"{r.epochs if r.epochs is not None else '-'} | {'yes' if r.counted else 'no'} |")
    return "\n".join(lines) + "\n"
