"""One trial of a search: a real training through the campaigns' launcher, watched for pruning, scored as
MLPerf scores (docs/hpo.md).

A trial trains in OUT/runs/run_<number>/ (config.yaml, mlperf.log, summary.json, train.log and the
trial's record trial.json), so the analysis report and the RCP tools read it like a campaign's run. Each
evaluation in its MLPerf log is reported to the pruner as the distance to the target (CosmoFlow's MAE,
DeepCAM's 1 - IoU) at step round(100 x epoch); a pruned training is told to stop (SIGUSR1: it writes a
checkpoint and exits 75). The objective: epochs to the target (the epoch of the last evaluation, as
mlperf-logging's RCP checker counts them) or seconds to it; a trial that misses the target scores
failure_penalty x max_epochs (or x its own wall time).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Literal

import yaml

from common.base import mlperf_log
from common.base import documents
from common.base import exits
from common.base.errors import BenchError
from common.base.files import write_json_atomic
from common.base.version import REPO
from common.campaign.run import progress_line, stop_processes, training_pids
from common.hpo.space import Param, Space, override
from common.campaign.summary import SUMMARY_NAME, read_summary

TRIAL_RECORD = "trial.json"
PROGRESS_SECONDS = 60
DISTANCE = {"eval_error": lambda v: v, "eval_accuracy": lambda v: 1.0 - v}  # CosmoFlow MAE, DeepCAM IoU


@dataclasses.dataclass
class TrialResult:
    """A trial's record (OUT/runs/run_<number>/trial.json)."""

    number: int
    params: dict[str, Any]
    state: Literal["complete", "pruned", "failed"]  # failed: crashed, no objective
    value: float | None  # the objective (lower is better); None unless complete
    status: str  # the training's summary status, or crashed / pruned
    epochs: int | float | None  # epochs to the target (None: not reached)
    seconds: float | None  # time to train (None: the target was not reached)
    global_batch_size: int | None
    exit_code: int
    wall_seconds: float
    pruned_at_epoch: float | None = None


@dataclasses.dataclass(frozen=True)
class Launch:
    """How this worker starts trials: the campaigns' launcher template ({np}, {run}, {python}), the
    interpreter, the overrides of where it runs (a job's data, Horovod and platform settings; every trial
    gets them after the space's own), and a node-local directory each trial stages below ("": none)."""

    ranks: int
    launcher: str
    python: str = ""
    overrides: tuple[str, ...] = ()
    stage_dir: str = ""


def trial_dir(out: Path, number: int) -> Path:
    return out / "runs" / f"run_{number:03d}"


def encode(param: Param, value):
    """Optuna's categorical choices must be scalars: each choice is its JSON text."""
    return json.dumps(value) if param.kind == "categorical" else value


def suggest(trial, space: Space) -> dict:
    """The trial's settings (decoded), drawn by the sampler (or fixed by an enqueued trial)."""
    values = {}
    for p in space.params:
        if p.kind == "categorical":
            values[p.name] = json.loads(trial.suggest_categorical(p.name, [json.dumps(c) for c in p.choices]))
        elif p.kind == "int":
            values[p.name] = trial.suggest_int(p.name, int(p.low), int(p.high), log=p.log)
        else:
            values[p.name] = trial.suggest_float(p.name, p.low, p.high, log=p.log)
    return values


def stage_dir(launch: Launch, number: int) -> Path | None:
    """Where trial `number` stages its data: its own directory below the worker's, since trial numbers are
    unique in a study and workers may share a node."""
    return Path(launch.stage_dir) / f"run_{number:03d}" if launch.stage_dir else None


def trial_command(space: Space, out: Path, number: int, values: dict, launch: Launch) -> list[str]:
    launcher = launch.launcher.format(np=launch.ranks, run=number, python=Path(sys.executable).parent)
    stage = stage_dir(launch, number)
    settings = [*([f"data.stage_dir={stage}"] if stage else []), *(override(k, v) for k, v in values.items())]
    return [*shlex.split(launcher), launch.python or sys.executable, str(REPO / space.benchmark / "train.py"),
            str(space.config_path), *space.overrides, *launch.overrides, *settings, f"run.seed={space.seed}",
            f"run.output_dir={trial_dir(out, number)}"]


class EvalReader:
    """The evaluations a training's MLPerf log gains, read as they are written (whole lines only)."""

    def __init__(self, log: Path):
        self.log, self.offset = log, 0

    def new(self) -> list[tuple[float, float]]:
        """(epoch, distance to the target) of each evaluation logged since the last call."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        found = []
        for event in mlperf_log.parse_lines(chunk[:end].decode(errors="replace").splitlines()):
            if event.get("key") in DISTANCE and isinstance(event.get("value"), (int, float)):
                epoch = mlperf_log.metadata(event).get("epoch_num")
                if isinstance(epoch, (int, float)):
                    found.append((float(epoch), DISTANCE[event["key"]](float(event["value"]))))
        return found


def run_trial(space: Space, out: Path, trial, values: dict, launch: Launch,
              should_prune: Callable[[], bool] | None = None) -> TrialResult:
    """Train with `values`; report each evaluation to `trial` (optuna) and stop the training when pruned."""
    directory = trial_dir(out, trial.number)
    directory.mkdir(parents=True)
    command = trial_command(space, out, trial.number, values, launch)
    (directory / "command.txt").write_text(shlex.join(command) + "\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"), "PYTHONUNBUFFERED": "1"}
    started = time.time()
    with open(directory / "train.log", "wb") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        pruned_at = _watch(proc, directory, trial, space, should_prune or trial.should_prune)
    except BaseException:
        stop_processes([proc])
        raise
    finally:  # this node's staged copy (a job's clean-up removes the other nodes')
        if launch.stage_dir:
            shutil.rmtree(stage_dir(launch, trial.number), ignore_errors=True)
    result = _result(space, directory, trial.number, values, proc.returncode, time.time() - started, pruned_at)
    write_json_atomic(dataclasses.asdict(result), directory / TRIAL_RECORD)
    return result


def _watch(proc: subprocess.Popen, directory: Path, trial, space: Space, should_prune: Callable[[], bool]):
    """Wait for the training, reporting evaluations; returns the epoch it was pruned at, or None."""
    reader, pruned_at, shown, last = EvalReader(directory / "mlperf.log"), None, "", time.time()
    while proc.poll() is None:
        for epoch, distance in reader.new():
            trial.report(distance, step=round(epoch * 100))
            if pruned_at is None and space.pruner != "none" and should_prune():
                pruned_at = epoch
                print(f"  trial {trial.number}: pruned at epoch {epoch:g} (distance to the target {distance:.4f}); "
                      f"stopping its training", flush=True)
                for pid in training_pids(proc.pid):
                    _signal(pid, signal.SIGUSR1)
        if time.time() - last >= PROGRESS_SECONDS:
            last, line = time.time(), progress_line(directory / "train.log")
            if line and line != shown:
                shown = line
                print(f"  trial {trial.number}: {line}", flush=True)
        try:
            proc.wait(timeout=1.0)  # a look at the log each second; the training's end ends the wait at once
        except subprocess.TimeoutExpired:
            pass
    return pruned_at


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _result(space: Space, directory: Path, number: int, values: dict, code: int, wall: float,
            pruned_at: float | None) -> TrialResult:
    summary_path = directory / SUMMARY_NAME
    summary = read_summary(summary_path) if summary_path.is_file() else None
    if code == exits.BAD_INPUT and pruned_at is None:
        raise BenchError(f"trial {number} was refused its input or config (exit 2): see {directory / 'train.log'}; "
                         f"every trial would fail the same way")
    status = "pruned" if pruned_at is not None else summary.status if summary else "crashed"
    log = _log_facts(directory / "mlperf.log")
    result = TrialResult(number=number, params=values, state="failed", value=None, status=status,
                         epochs=log["epochs"] if status == "success" else None,
                         seconds=summary.time_to_train_seconds if status == "success" else None,
                         global_batch_size=log["global_batch_size"],
                         exit_code=code, wall_seconds=wall, pruned_at_epoch=pruned_at)
    if pruned_at is not None:
        result.state = "pruned"
    elif summary:
        result.state, result.value = "complete", objective(space, result, _max_epochs(directory))
    return result


def objective(space: Space, result: TrialResult, max_epochs: int) -> float:
    """What the search minimises: epochs (or seconds) to the target; a miss scores the penalty."""
    if result.status == "success" and result.epochs is not None:
        return float(result.epochs) if space.objective == "epochs" else float(result.seconds)
    if space.objective == "epochs":
        return space.failure_penalty * max_epochs
    return space.failure_penalty * result.wall_seconds


def _log_facts(log: Path) -> dict:
    """The global batch size and the epoch of the last evaluation in a training's MLPerf log."""
    facts = {"global_batch_size": None, "epochs": None}
    try:
        events = mlperf_log.read_events(log)
    except BenchError:  # no log (yet): the facts stay unknown
        return facts
    for event in events:
        if event.get("key") == "global_batch_size":
            facts["global_batch_size"] = event.get("value")
        elif event.get("key") in DISTANCE:
            facts["epochs"] = mlperf_log.metadata(event).get("epoch_num")
    return facts


def _max_epochs(directory: Path) -> int:
    config = directory / "config.yaml"
    try:
        return int(yaml.safe_load(config.read_text())["train"]["max_epochs"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        raise BenchError(f"{config}: the trial's saved config has no train.max_epochs") from None


def load_result(out: Path, number: int) -> TrialResult | None:
    record = trial_dir(out, number) / TRIAL_RECORD
    if not record.is_file():
        return None
    return documents.read(record, TrialResult)
