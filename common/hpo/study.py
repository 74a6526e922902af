"""A search's state and its loop of trials (docs/hpo.md).

The study lives in OUT: `hpo.json` (the space and the settings it was started with; a worker started with
another space, rank count, overrides or storage is refused), Optuna's journal `journal.log` (an append-only
file several processes and jobs share through file locks; `--storage` takes an Optuna storage URL instead,
such as sqlite:///OUT/study.db or a database server), `runs/run_<n>/` per trial and `workers/` heartbeats.

A worker (one `python -m common.hpo run` process) asks for a trial, trains it, tells the result, and goes
on until the study holds --trials finished trials; workers on several nodes share a study by running the
same command. Each worker touches `workers/<host>-<pid>` every HEARTBEAT_SECONDS; a trial left running by
a worker whose heartbeat is older than --stale-minutes (a killed job) is marked failed and its settings
queued again, so a search survives a killed job and goes on where it stood.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from pathlib import Path

from common.base import documents
from common.base.errors import BenchError
from common.base.files import write_json_atomic
from common.hpo.space import Space
from common.hpo.trial import Launch, TrialResult, encode, run_trial, suggest

HEARTBEAT_SECONDS = 30
SPEC_NAME = "hpo.json"
STUDY_NAME = "hpo"
# What every worker of a study must share (what a trial trains, and where the study lives), and the value of a
# key in an hpo.json written before it was recorded. A worker's launcher, interpreter and stage directory are
# its own: they say how it reaches its nodes (a job's host file), not what its trials train.
SHARED = ("space", "ranks", "overrides", "storage")


@dataclasses.dataclass(frozen=True)
class StudyFile:
    """OUT/hpo.json: the space and the settings a study was started with."""

    space: Space
    ranks: int
    overrides: tuple[str, ...]
    storage: str
    launcher: str
    python: str
    trials: int

    def settings(self) -> StudySettings:
        return StudySettings(trials=self.trials, launch=Launch(self.ranks, self.launcher, self.python, self.overrides),
                             storage=self.storage)


@dataclasses.dataclass(frozen=True)
class StudySettings:
    trials: int
    launch: Launch
    storage: str = ""  # an Optuna storage URL ("": the journal file in OUT)
    stale_minutes: float = 10.0


def storage_for(out: Path, settings: StudySettings):
    if settings.storage:
        return settings.storage
    import optuna
    from optuna.storages.journal import JournalFileBackend
    return optuna.storages.JournalStorage(JournalFileBackend(str(out / "journal.log")))


def read_study(out: Path, settings: StudySettings):
    """The study in `out`, only read (optuna.load_study: opening it with create_study would append to the
    journal), for a reader such as the analysis report."""
    import optuna
    journal = out / "journal.log"
    if not settings.storage and not journal.is_file():  # the journal backend would create it
        raise BenchError(f"{out}: no {journal.name}, the study's journal (a search that has not started yet?)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=STUDY_NAME, storage=storage_for(out, settings))
    except KeyError as err:  # Optuna's "Record does not exist" for a storage without the study
        raise BenchError(f"{out}: its storage {settings.storage or out / 'journal.log'} holds no study "
                         f"{STUDY_NAME!r} (a search that has not started a trial yet?)") from err


def open_study(space: Space, out: Path, settings: StudySettings):
    """Create the study in `out`, or load it when its hpo.json matches (a larger --trials may extend it)."""
    import optuna
    out.mkdir(parents=True, exist_ok=True)
    _check_spec(out, space, settings)
    sampler = sampler_for(space, 0)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=space.startup_trials,
                                         n_warmup_steps=round(space.warmup_epochs * 100)) \
        if space.pruner == "median" else optuna.pruners.NopPruner()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage_for(out, settings), sampler=sampler, pruner=pruner,
                                study_name=STUDY_NAME, direction="minimize", load_if_exists=True)
    if not study.trials and not study.user_attrs.get("enqueued"):
        study.set_user_attr("enqueued", True)
        for values in space.enqueue:
            study.enqueue_trial({p.name: encode(p, values[p.name]) for p in space.params})
    return study


def sampler_for(space: Space, number: int):
    """The sampler that draws trial `number`'s settings, seeded with the space's seed plus the number: a
    trial's draw does not depend on the worker that asks for it, where workers that each seeded one sampler
    alike (jobs started together, a worker started again) would draw the same random settings."""
    import optuna
    seed = space.sampler_seed + number
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=space.sampler_startup) \
        if space.sampler == "tpe" else optuna.samplers.RandomSampler(seed=seed)


def _check_spec(out: Path, space: Space, settings: StudySettings) -> None:
    launch = settings.launch
    spec = {"space": space.as_json(), "ranks": launch.ranks, "overrides": list(launch.overrides),
            "storage": settings.storage, "launcher": launch.launcher, "python": launch.python}
    path = out / SPEC_NAME
    if path.is_file():
        saved = documents.to_dict(documents.read(path, StudyFile))
        differ = sorted(k for k in SHARED if spec[k] != saved[k])
        if differ:
            raise BenchError(f"{out}: a study started with other settings ({', '.join(differ)} differ from {path}); "
                             f"start it again with the same ones, or give another --out")
    write_json_atomic({**spec, "trials": settings.trials}, path)


class Heartbeat:
    """This worker's heartbeat file, touched by a thread while the worker lives."""

    def __init__(self, out: Path):
        self.name = f"{socket.gethostname()}-{os.getpid()}"
        self.path = out / "workers" / self.name
        self._stop = threading.Event()

    def __enter__(self) -> "Heartbeat":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        threading.Thread(target=self._beat, daemon=True).start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            self.path.touch()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.path.unlink(missing_ok=True)


def requeue_stale(study, out: Path, stale_minutes: float, me: str) -> list[int]:
    """Mark failed the running trials whose worker stopped beating, and queue their settings again."""
    from optuna.trial import TrialState
    requeued = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.user_attrs.get("worker")
        if worker == me or worker is None:
            continue
        beat = out / "workers" / worker
        age = time.time() - beat.stat().st_mtime if beat.exists() else float("inf")
        if age > stale_minutes * 60:
            study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
            study.enqueue_trial(dict(trial.params) or trial.system_attrs.get("fixed_params", {}))
            requeued.append(trial.number)
            print(f"trial {trial.number}: its worker {worker} has been silent for "
                  f"{'ever' if age == float('inf') else f'{age / 60:.1f} min'} (more than {stale_minutes:g} min); "
                  f"marked failed and its settings queued again", flush=True)
    return requeued


def finished(study) -> int:
    from optuna.trial import TrialState
    done = (TrialState.COMPLETE, TrialState.PRUNED)
    return sum(t.state in done for t in study.get_trials(deepcopy=False))


def running(study) -> int:
    from optuna.trial import TrialState
    return len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


def run_study(space: Space, out: Path, settings: StudySettings) -> None:
    """Run trials until the study holds settings.trials finished ones (complete or pruned)."""
    study = open_study(space, out, settings)
    t0, ran = time.time(), 0
    with Heartbeat(out) as heartbeat:
        while True:
            requeue_stale(study, out, settings.stale_minutes, heartbeat.name)
            done = finished(study)
            if done + running(study) >= settings.trials:
                break
            trial = study.ask()
            trial.set_user_attr("worker", heartbeat.name)
            result = _one_trial(study, trial, space, out, settings)
            ran += 1
            print(describe(result, study, done + 1, settings.trials, time.time() - t0, ran), flush=True)
    print(f"study {out}: {finished(study)} of {settings.trials} trials finished"
          + (f" ({running(study)} still running in other workers)" if running(study) else ""), flush=True)


def _one_trial(study, trial, space: Space, out: Path, settings: StudySettings) -> TrialResult:
    from optuna.trial import TrialState
    study.sampler = sampler_for(space, trial.number)  # draws at suggest time, the trial's number known
    values = suggest(trial, space)
    print(f"trial {trial.number}: " + ", ".join(f"{k}={v}" for k, v in values.items()), flush=True)
    try:
        result = run_trial(space, out, trial, values, settings.launch)
    except BaseException:  # a killed worker, or bad input: this trial did not run its course
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        if not isinstance(trial, int):
            study.enqueue_trial(dict(trial.params))
        raise
    state = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED}.get(result.state, TrialState.FAIL)
    for key in ("status", "epochs", "seconds", "global_batch_size"):
        trial.set_user_attr(key, getattr(result, key))
    study.tell(trial, result.value if state == TrialState.COMPLETE else None, state=state)
    return result


def describe(result: TrialResult, study, index: int, total: int, elapsed: float, ran: int) -> str:
    if result.state == "pruned":
        what = f"pruned at epoch {result.pruned_at_epoch:g}"
    elif result.state == "complete" and result.status == "success":
        what = f"target reached, epochs {result.epochs:g}, time to train {result.seconds:.1f} s, objective {result.value:g}"
    elif result.state == "complete":
        what = f"{result.status}: target missed, objective {result.value:g} (the penalty)"
    else:
        what = f"crashed (exit {result.exit_code}; see its train.log)"
    try:
        best = f"best so far: trial {study.best_trial.number}, objective {study.best_value:g}"
    except ValueError:
        best = "no complete trial yet"
    left = max(total - index, 0)
    return (f"trial {result.number} ({index}/{total}): {what}, {result.wall_seconds / 60:.1f} min; {best}; "
            f"about {elapsed / ran * left / 60:.0f} min left in this worker")


def saved_settings(out: Path) -> tuple[Space, StudySettings]:
    """The space and settings a study was started with (its hpo.json)."""
    path = out / SPEC_NAME
    if not path.is_file():
        raise BenchError(f"{out}: no {SPEC_NAME}; not a study directory (python -m common.hpo run ... --out {out})")
    saved = documents.read(path, StudyFile)
    return saved.space, saved.settings()
