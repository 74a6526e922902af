"""Elastic Horovod training: ranks may die or join, the others roll back to the last commit and go on.

With `dist.elastic.enabled=true`, under `horovodrun --min-np/--max-np --host-discovery-script`, the run's
fit() goes under `hvd.elastic.run`. The in-memory state (`new_state`) holds numpy snapshots of the model
and optimizer variables (the learning rate left out: it is set from the schedule every step), each rank's
non-trainable variables (after a reset every rank takes rank 0's) and the training `Progress`; it is
committed every `dist.elastic.commit_every_steps` steps and at every epoch end. Each (re)start rebuilds
what depends on the rank layout: a new `DistEnv` from Horovod, the model, optimizer and learning-rate schedule
for the new global batch, the input pipelines for the new rank and size (reseeded per reset), and freshly
traced steps whose allreduces are per tensor (the only failures hvd.elastic.run recognises). The interrupted
epoch continues from the fraction of its steps done, in steps of the new layout (`convert_progress`).

A worker that stops without exiting (SIGSTOP, a frozen process) would hang the run: the others' collective
fails after the Gloo timeout, but Horovod's driver resets them only once every worker of the old layout has
reported or exited. So each worker has a watchdog process (`start_watchdog` here, `watch` in elastic_procs.py) that
SIGKILLs it when it has sent no heartbeat for `dist.elastic.hang_timeout_s`; the driver then blacklists its host
as after a crash.

This module imports `horovod.tensorflow.elastic` (for `ObjectState` and `run`) besides common/runtime/dist.py, the
other module that imports Horovod. The processes beside the workers, the host discovery script (`python -m
common.runtime.elastic_procs hosts FILE`, docs/faults.md) and each worker's watchdog, are
common/runtime/elastic_procs.py's.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from common.base.errors import BenchError
from common.runtime.summary import FitResult, Progress
from common.runtime.dist import DistEnv
from common.io.input import InputPlan
from common.io.position import reseeded
from common.runtime.loop import Callback, Loop, Trainee, fit
from common.runtime.strategy import DataParallel

# (the rank layout of this (re)start, its input seed offset, the commits' callback) -> the attempt's FitResult
FitAttempt = Callable[[DistEnv, int, Callback], FitResult]


# ---------------------------------------------------------------------------- refusals
def check_elastic(cfg: Any, dist: DistEnv) -> None:
    """Before any work: the settings elastic training cannot run with; raises BenchError naming them."""
    if not cfg.dist.elastic.enabled:
        return
    if not dist.horovod:
        raise BenchError("dist.elastic.enabled=true needs Horovod's elastic launcher: horovodrun -np N --min-np M "
                         "--host-discovery-script SCRIPT ... (docs/faults.md); this process was not launched by it")
    if cfg.data.stage_dir and cfg.data.stage_mode == "rank":
        raise BenchError(f"dist.elastic.enabled=true with data.stage_mode='rank' (data.stage_dir="
                         f"{cfg.data.stage_dir!r}): after a reset a rank's staged shard is not the one its new rank "
                         f"reads; read data.dir directly (data.stage_dir='')")
    if cfg.data.stage_dir:
        raise BenchError(f"dist.elastic.enabled=true with data.stage_dir={cfg.data.stage_dir!r} (data.stage_mode="
                         f"{cfg.data.stage_mode!r}): staging's collectives at the start would hang a worker that "
                         f"joins later; elastic runs read data.dir directly (data.stage_dir='')")
    ckpt = cfg.checkpoint
    if ckpt.every_epochs or ckpt.every_minutes or ckpt.resume:
        raise BenchError(f"dist.elastic.enabled=true with checkpoint.every_epochs={ckpt.every_epochs}, "
                         f"checkpoint.every_minutes={ckpt.every_minutes}, checkpoint.resume="
                         f"{str(ckpt.resume).lower()}: elastic runs keep their state in memory and cannot write "
                         f"periodic checkpoints or resume from one yet; set them to 0 and false")
    if getattr(cfg.data, "uneven_files", "drop") == "refuse" and dist.is_root:
        print("note: dist.elastic.enabled=true with data.uneven_files=refuse: a reset to a rank count that does "
              "not divide the dataset's files ends the run; data.uneven_files=drop lets it go on", flush=True)


# ---------------------------------------------------------------------------- the state
def state_variables(model: Any, optimizer: Any) -> list:
    """The variables an elastic commit snapshots: the model's and the optimizer's, without the learning rate."""
    return list(model.variables) + [v for v in optimizer.variables if _name(v) != "learning_rate"]


def _name(v: Any) -> str:
    return str(getattr(v, "name", "")).split("/")[-1].split(":")[0]


def snapshot(variables: list) -> list[np.ndarray]:
    """Copies of the variables' values."""
    return [np.array(v.numpy()) for v in variables]


def assign(variables: list, arrays: list[np.ndarray]) -> None:
    """Assign a snapshot to `variables`, which must match it one for one."""
    if len(arrays) != len(variables):
        raise BenchError(f"elastic state: {len(arrays)} arrays in the snapshot, the model and optimizer have "
                         f"{len(variables)} variables")
    for i, (var, value) in enumerate(zip(variables, arrays)):
        if tuple(var.shape) != value.shape:
            raise BenchError(f"elastic state: array {i} has shape {value.shape}, variable {_name(var)} has "
                             f"{tuple(var.shape)}")
        var.assign(value)


def convert_progress(progress: Progress, old_steps: int, new_steps: int) -> Progress:
    """`progress` counted in epochs of `old_steps` steps, in epochs of `new_steps` (another rank count).

    The epoch's fraction done is kept: step s of S becomes round(s * S' / S) of S', the partial loss sum
    scaled with it, its seconds kept (they trained that fraction); a commit at an epoch end (step 0) stays one."""
    if old_steps == new_steps or progress.step == 0:
        return progress
    step = min(new_steps, round(progress.step * new_steps / old_steps))
    partial = dict(progress.partial)
    if "loss_sum" in partial:
        partial["loss_sum"] = partial["loss_sum"] * step / progress.step
    return dataclasses.replace(progress, step=step, partial=partial)


def _horovod_elastic():
    import horovod.tensorflow.elastic as hvd_elastic
    return hvd_elastic


def new_state(bcast_object: Callable | None = None, get_rank: Callable | None = None) -> Any:
    """The state of a fresh run: an `hvd.elastic.ObjectState` (Horovod imported here, on first use) synchronised
    through Horovod's broadcast_object (or the functions given). Its attributes are `weights` (numpy snapshot or
    None), `progress` (a Progress as a dict, or None), `steps_per_epoch` (of the layout that committed it) and
    `resets` (one dict each); save/restore/sync are ObjectState's: copies on commit, rollback on a failure, rank 0's
    by broadcast_object."""
    if bcast_object is None:
        import horovod.tensorflow as hvd
        bcast_object, get_rank = hvd.broadcast_object, hvd.rank
    return _horovod_elastic().ObjectState(bcast_object, get_rank, weights=None, progress=None, steps_per_epoch=0,
                                          resets=[])


def record(state: Any, weights: list[np.ndarray], progress: Progress, steps_per_epoch: int) -> None:
    """Set the attributes a commit saves (then call state.commit())."""
    state.weights = weights
    state.progress = dataclasses.asdict(progress)
    state.steps_per_epoch = steps_per_epoch


def start_of(state: Any, steps_per_epoch: int) -> Progress:
    """Where a (re)start with `steps_per_epoch` steps per epoch begins."""
    if state.progress is None:
        return Progress()
    return convert_progress(Progress(**state.progress), state.steps_per_epoch, steps_per_epoch)


# ---------------------------------------------------------------------------- the driver
class ElasticCommits(Callback):
    """The loop's callback of one elastic (re)start: it starts from the state's last commit (in steps of this
    layout), and commits every `every` steps and at every epoch's end; `on_first_step(start)` runs after the
    first step of a restart."""

    def __init__(self, state, every: int, on_first_step: Callable[[Progress], None] | None):
        self.state, self.every, self.on_first_step = state, every, on_first_step
        self.model = self.optimizer = None
        self.begin = Progress()

    def start(self, loop: Loop) -> None:
        self.model, self.optimizer = loop.trainee.model, loop.trainee.optimizer
        if self.state.weights is not None:  # every rank holds rank 0's after the state's sync
            assign(state_variables(self.model, self.optimizer), self.state.weights)
        self.begin = start_of(self.state, loop.data.train_steps)
        loop.start_at(self.begin)

    def after_step(self, loop: Loop) -> None:
        if self.on_first_step is not None:
            self.on_first_step(self.begin)
            self.on_first_step = None
        if loop.end_epoch or loop.step % self.every or loop.step >= loop.data.train_steps:
            return
        # The epoch's training seconds so far go with the commit, so that its throughput after a reset
        # counts the time of the steps before it too (the reset itself is reported as seconds_lost).
        partial = {"loss_sum": loop.running["loss"] * loop.step, "seconds": loop.running["train_seconds"]}
        self._commit(Progress(loop.epoch, loop.step, [dict(h) for h in loop.history], partial), loop)

    def after_epoch(self, loop: Loop) -> None:
        self._commit(Progress(loop.epoch + 1, 0, [dict(h) for h in loop.history]), loop)

    def _commit(self, progress: Progress, loop: Loop) -> None:
        record(self.state, snapshot(state_variables(self.model, self.optimizer)), progress, loop.data.train_steps)
        self.state.commit()  # also raises HostsUpdatedInterrupt on every rank when hosts were added or removed


class ElasticStrategy(DataParallel):
    """Data parallel under hvd.elastic.run: the runner's `fit_attempt` trains each (re)start, rebuilding what
    depends on the rank layout; with dist.elastic.hang_timeout_s > 0 a watchdog process kills this worker when it
    stops sending heartbeats that long."""

    name = "elastic"
    elastic = True

    def __init__(self, cfg: Any, dist: DistEnv):
        check_elastic(cfg, dist)
        super().__init__(dist)
        self.first = dist  # the layout the run began with (`self.dist`: the last (re)start's)
        self.every = cfg.dist.elastic.commit_every_steps
        self.hang_timeout_s = cfg.dist.elastic.hang_timeout_s
        self.fit_attempt: FitAttempt | None = None
        self.mlperf = None
        self.log: Callable[[str], None] = functools.partial(print, flush=True)
        self.stop_watchdog: Callable[[], None] | None = None
        self.detected: float | None = None
        self.started = False
        self.resets: list[dict] = []  # this process's record (the state's may lose one in a rollback)
        self.state = None

    def run(self, fit_attempt: FitAttempt, mlperf) -> FitResult:
        """Train under hvd.elastic.run (every rank); `mlperf`: the run's MLPerf log (its writer follows rank 0).
        Afterwards `self.dist` is the last (re)start's layout."""
        self.fit_attempt, self.mlperf, self.state = fit_attempt, mlperf, new_state()
        if self.hang_timeout_s:
            # The host name as the launcher knows it (its blacklist, the discovery script's lines).
            host = os.environ.get("HOROVOD_HOSTNAME", os.uname().nodename)
            # the rank its watchdog names: this (re)start's
            _, self.stop_watchdog = start_watchdog(self.hang_timeout_s, host, lambda: self.dist.rank)
        try:
            return _horovod_elastic().run(self._train)(self.state)
        finally:
            if self.stop_watchdog is not None:
                self.stop_watchdog()

    def _train(self, state):
        from common.runtime import horovod_env  # the rank layout Horovod has now (a reset re-initialised it)
        dist = self.dist = dataclasses.replace(self.first, elastic=True, **horovod_env.layout(self.first.settings))
        self.mlperf.follow_root(dist.is_root)
        restart = self.started or state.progress is not None
        self.started = True
        commits = ElasticCommits(state, self.every, self._noted_reset(state, dist) if restart else None)
        try:
            # The input order is reseeded by the committed position, which every rank agrees on after the sync.
            return self.fit_attempt(dist, 0 if state.progress is None else 1 + _global_step(state), commits)
        except Exception:
            self.detected = time.time()  # a failed collective or a host change: the reset begins
            raise

    def _noted_reset(self, state, dist: DistEnv) -> Callable[[Progress], None]:
        """What the first step after a reset does: log it (rank 0) and add it to the state's list."""
        detected = self.detected or time.time()

        def note(start: Progress):
            # one membership change as rank 0 saw it: the new size, the epoch and step (in steps of the new
            # layout) it rolled back to, the seconds from the failure's detection (or the host change's notice)
            reset = {"size": dist.size, "epoch": start.epoch, "step": start.step,
                     "seconds_lost": round(time.time() - detected, 3)}
            state.resets = list(state.resets) + [reset]
            self.resets.append(dict(reset))
            self.mlperf.event("elastic_reset", reset)
            if dist.is_root:
                self.log(f"elastic reset: {dist.size} ranks, rolled back to epoch {start.epoch} step "
                         f"{start.step}; {reset['seconds_lost']:.2f} s from the failure to this step")
        return note

    def summary(self, trainee: Trainee) -> dict:
        """summary.json's `elastic` field: the resets this process saw, or the state's when it saw fewer (a rank 0
        that took over from a dead one)."""
        if self.state is None:
            return {}
        resets = max(self.resets, list(self.state.resets), key=len)
        return {"elastic": {"resets": len(resets), "sizes": [self.first.size] + [r["size"] for r in resets],
                            "seconds_lost": [r["seconds_lost"] for r in resets], "events": resets,
                            "hang_timeout_s": self.hang_timeout_s}}


def _global_step(state) -> int:
    return Progress(**state.progress).global_step(max(1, state.steps_per_epoch))


# ---------------------------------------------------------------------------- the hang watchdog
HEARTBEAT_S = 1.0  # a worker's heartbeat period (dist.elastic.hang_timeout_s is at least 5 of them)


def start_watchdog(timeout_s: float, host: str, rank: Callable[[], int]) -> tuple[subprocess.Popen, Callable[[], None]]:
    """A watchdog process for this worker, and the thread that sends it a heartbeat (the worker's current rank,
    `rank()`) every HEARTBEAT_S s; returns the process and what stops the beats (the watchdog then sees the pipe
    closed and exits). The thread beats whatever the main thread does (tracing, a step, a reset's wait), so
    only a process that does not run at all (stopped, frozen) misses `timeout_s` of beats and is killed."""
    read, write = os.pipe()
    # The repository's root on the path: the watchdog imports the suite wherever the worker was started.
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    process = subprocess.Popen(
        [sys.executable, "-m", "common.runtime.elastic_procs", "watchdog", str(read), f"{timeout_s:g}",
         str(os.getpid()), host], pass_fds=(read,), env=env)
    os.close(read)
    done = threading.Event()

    def beat() -> None:
        while True:
            try:
                os.write(write, f"{rank()}\n".encode())
            except OSError:  # the watchdog has gone, or close() closed the pipe
                return
            if done.wait(HEARTBEAT_S):
                return

    def close() -> None:
        done.set()
        thread.join()
        os.close(write)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()

    thread = threading.Thread(target=beat, name="elastic-heartbeat", daemon=True)
    thread.start()
    return process, close


def elastic_attempt(app: Any, run: Any, strategy: ElasticStrategy, data_cfg: Any, now: DistEnv, seed_offset: int,
                    commits: Callback) -> FitResult:
    """One (re)start of an elastic run on layout `now`: a trainee and input built for it, then fit() with the
    commits' callback. The first start keeps the trainee built in init when the replica count is the same, and
    the input too when the layout and the seed are: a worker that joins a running job must keep its model
    (built a second time there, its variables' broadcast did not match the other ranks' and the join hung,
    tests/integration/test_elastic.py). After a reset the input is reseeded by the committed step."""
    first, before, seed = run.attempts == 0, run.dist, reseeded(run.cfg.run.seed, seed_offset)
    run.attempts += 1
    strategy.dist = run.dist = now
    if not first or now.size != before.size:
        run.trainee = app.build(run.cfg, strategy)
    if not first or _placement(now) != _placement(before) or seed_offset:
        run.data = app.input(run.cfg, data_cfg, strategy, seed)
    return fit(run.loop(strategy, [commits] + run.callbacks(strategy, InputPlan(seed))))


def _placement(dist: DistEnv) -> tuple:
    return dist.rank, dist.size, dist.local_rank, dist.local_size, dist.node
