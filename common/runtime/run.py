"""One MLPerf run, written once for both applications: `run_benchmark(app, config, overrides, stop)`, whose body
reads as the run's steps in order (config, DistEnv and strategy; output directory, resume point and MLPerf log;
staging; init; run_start; the input; the epochs under `fit` with the run's callbacks; run_stop; the summaries).

Each application gives one `App` record of what is its own (config class, builders, hyperparameter keys,
reference check, rank files); its train.py's `train()` hands it here. The `Run` carries what the steps share:
the config, the DistEnv, the MLPerf log, the resume point, the stop signals, staging and the I/O counters;
nothing below it calls back into it, and only this module sets what it trains (an elastic run's attempts too).
Whatever ends a run after run_start, its MLPerf log ends with one run_stop and rank 0 writes summary.json:
an exception leaving the `with` block is logged as run_stop aborted and written as the summary's reason
before it goes on (`Run.__exit__`, failures.py `write_failure`). A stop signal before run_start ends the run at
init_start or start. Exit codes: common/base/exits.py. Faults and resuming: docs/faults.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from common.io.input import Datasets, InputPlan
from common.runtime.monitor import RunMonitor, io_report, io_start, io_stop, write_io_report
from common.io.manifest import Manifest, check_unstaged_source
from common.runtime.callbacks import Checkpoints, EvalEverySteps, StopSignal, keep_trained
from common.runtime.config import load_config, resolve, save_config
from common.runtime.dist import DistEnv, StopRequests, StoppedBeforeStart, describe, init_distributed
from common.runtime.elastic import ElasticStrategy, elastic_attempt
from common.runtime.loop import Callback, Loop, Trainee, fit
from common.runtime.precision import choose as choose_precision
from common.runtime.summary import (FitResult, MLPerfLog, RUN_ABORTED, dataset_keys, exit_code,
                                    run_summary, scale_keys, throughput, write_summary)
from common.runtime.strategy import DataParallel

if TYPE_CHECKING:  # imported where used: by a run that stages, or that writes or reads a checkpoint
    from common.io.staging import StageResult
    from common.runtime.checkpoint import Checkpointer, Meta

RankFiles = Callable[[Manifest, int, int], list]  # (manifest, rank, ranks) -> the paths that rank reads


@dataclasses.dataclass(frozen=True)
class App:
    """What an application brings to the run; every callable takes the resolved config first."""

    name: str  # "cosmoflow", "deepcam": the MLPerf benchmark name
    config: type  # the config dataclass
    build: Callable[[Any, DataParallel], Trainee]  # model, optimizer, schedule, loss, metric for the strategy
    input: Callable[[Any, Any, DataParallel, int], Datasets]  # (cfg, data section, strategy, seed) -> this rank's
    hyperparameters: Callable[[Any, DataParallel], dict]  # the keys the rules ask for in init
    rank_files: Callable[[Any, Manifest, int, int], list]  # (cfg, manifest, rank, ranks) -> the paths it reads
    read_error: Callable[[Any, int, DistEnv, Exception], Exception]  # (data section, batch, layout, err)
    with_rcp: Callable[[Any, int], Any]  # optimizer.rcp's hyperparameters for a global batch
    closed_differences: Callable[[Any], list]  # how the config differs from the reference's closed run
    learning_rates: Callable[[Any, DataParallel], list]  # the dry run's learning rate at each epoch's start
    strategy: Callable[[Any, DistEnv], DataParallel] | None = None  # None: data parallel or elastic
    example_batch: Callable[[Any], tuple] | None = None  # cfg -> one synthetic (x, y) batch: the precision probe's
    # cfg -> (loss, metric, y -> the untrained model's prediction): what an emulated run's evaluation scores
    scoring: Callable[[Any], tuple] | None = None


def run_benchmark(app: App, config: str, overrides: list[str], stop: StopRequests) -> int:
    """One MLPerf run of `app`; returns the exit code. `stop`: the stop signals, handled since main() began."""
    cfg = load_config(config, overrides, app.config)
    dist = init_distributed(cfg.dist)
    strategy = (app.strategy or choose_strategy)(cfg, dist)
    # optimizer.rcp's hyperparameters; the division the log may claim (closed only for the reference's run)
    cfg = resolve(cfg, strategy.replicas, app.with_rcp, app.closed_differences, announce=root_log(dist))
    cfg, precision = choose_precision(app, cfg, dist, config, overrides)  # train.precision=auto: probed, cached
    rank_files = functools.partial(app.rank_files, cfg)
    # (shared_failures inside Run: a failure that another rank's became is what Run.__exit__ records)
    with Run.open(app.name, cfg, dist, stop) as run, shared_failures(Path(cfg.run.output_dir), dist):
        run.precision = precision
        run.stage(rank_files, "before_init")  # data.stage_timing=before_init: untimed, unlogged, open division
        run.init_start()
        run.stage(rank_files, "in_init")  # the default: staging_start, staging_stop inside init
        run.trainee = strategy.build(app, cfg)  # no data read in init
        strategy.prepare(cfg)  # hybrid: each group's Mesh-TF cluster and graphs
        run.init_stop(strategy, app.hyperparameters(cfg, strategy))
        run.start()  # run_start: the timed part
        data_cfg, plan = run.plan_input(strategy, run.stage(rank_files, "in_run"))
        run.data = app.input(cfg, data_cfg, strategy, plan.seed)
        run.input_ready()
        read_error = functools.partial(app.read_error, data_cfg, cfg.train.local_batch_size, strategy.input_dist)
        loop = None if strategy.elastic else run.loop(strategy, run.callbacks(strategy, plan))
        with reading_as(read_error, run):
            if strategy.elastic:
                result = strategy.run(functools.partial(elastic_attempt, app, run, strategy, data_cfg), run.mlperf)
            else:
                result = fit(loop)
        run.stopped(result, strategy)
        run.keep_trained(loop)  # after run_stop: the weights that met the target
        return run.finish(strategy, result)  # io_report.json, summary.json


@contextlib.contextmanager
def shared_failures(out: Path, dist: DistEnv):
    """Inside: an exception on one of several ranks is noted for the others, or, when it is Horovod's shutdown
    after another rank's failure, becomes that rank's (common/runtime/failures.py)."""
    try:
        yield
    except StoppedBeforeStart:
        raise
    except Exception as err:
        if dist.size == 1:
            raise
        from common.runtime.failures import run_failure
        failure = run_failure(out, dist, err)
        if failure is None:
            raise
        raise failure from err


@contextlib.contextmanager
def reading_as(read_error: Callable[[Exception], Exception], run: "Run"):
    """Inside: a failure to read the data raises `read_error(err)` instead (UnicodeDecodeError: TensorFlow
    quoting the raw bytes of a record that is no tf.train.Example); in an elastic run a failed Horovod
    collective goes on as it is, for hvd.elastic.run to reset."""
    import tensorflow as tf
    try:
        yield
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.InternalError,
            UnicodeDecodeError) as err:
        if run.dist.elastic and "Horovod" in str(err):
            raise
        raise read_error(err) from None  # run_stop aborted and summary.json: Run.__exit__


def choose_strategy(cfg: Any, dist: DistEnv) -> DataParallel:
    """Data parallel, elastic data parallel with dist.elastic.enabled, or emulated accelerators with
    train.emulate (checked before any work)."""
    if cfg.train.emulated:
        from common.storage.emulate import EmulatedStrategy
        return EmulatedStrategy(cfg, dist)
    return ElasticStrategy(cfg, dist) if cfg.dist.elastic.enabled else DataParallel(dist)


def root_log(dist: DistEnv) -> Callable[..., None]:
    """print (flushed) on rank 0, nothing elsewhere."""
    return functools.partial(print, flush=True) if dist.is_root else (lambda *_: None)


class Run:
    """One run on this rank, from its output directory to its summary."""

    def __init__(self, benchmark: str, cfg: Any, dist: DistEnv, resume: Meta | None, mlperf: MLPerfLog,
                 stop: StopRequests):
        self.benchmark, self.cfg, self.dist, self.resume, self.mlperf = benchmark, cfg, dist, resume, mlperf
        self.stop = stop  # installed by the entry point (guarded_run), before anything else
        self.started = self.run_stopped = False  # run_start, run_stop logged
        self.staging: StageResult | None = None
        self.io: dict | None = None  # io_start's counters, then io_stop's figures
        self.run_start = 0.0
        self.time_to_train = 0.0
        self.trainee: Trainee | None = None
        self.data: Datasets | None = None
        self.monitor = RunMonitor(cfg, dist)
        self.attempts = 0  # an elastic run's (re)starts so far
        self.trained = ""  # the checkpoint of the weights that met the target (keep_trained)
        self.precision: dict = {}  # how train.precision was chosen (common/runtime/precision.py)

    @classmethod
    def open(cls, benchmark: str, cfg: Any, dist: DistEnv, stop: StopRequests) -> "Run":
        """Find the checkpoint to resume (archiving the attempt it ends), save config.yaml, open the MLPerf log;
        `stop`: the process's stop signals, already handled."""
        out = Path(cfg.run.output_dir)
        # (An elastic run resumes no checkpoint, and a worker joining it must not wait in a collective here.)
        resume = None
        if cfg.checkpoint.resume and not cfg.dist.elastic.enabled:
            from common.runtime.checkpoint import archive_attempt, find_resume
            resume = find_resume(cfg.checkpoint, cfg.run.output_dir, dist, benchmark, root_log(dist))
            if resume and dist.is_root:
                archive_attempt(out, cfg.mlperf.log_file, resume.progress.attempt)
        if dist.is_root:
            save_config(cfg, out)
        return cls(benchmark, cfg, dist, resume, MLPerfLog(out / cfg.mlperf.log_file, enabled=dist.is_root), stop)

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, _type, error: BaseException | None, _traceback) -> None:
        """Close the MLPerf log; an exception after run_start first ends the run: run_stop aborted and, on rank 0,
        summary.json with the error as its reason (failures.py `write_failure`); then it goes on."""
        try:
            if error is not None and self.started:  # no collective: the other ranks may be anywhere
                self._run_stop(RUN_ABORTED)
                self.monitor.close(None)
                if self.dist.is_root:
                    from common.runtime.failures import write_failure
                    write_failure(self, error)
        finally:
            self.mlperf.close()

    @property
    def log(self) -> Callable[..., None]:
        return root_log(self.dist)

    # ------------------------------------------------------------------------ the steps, in order
    def stage(self, rank_files: RankFiles, timing: str) -> Any:
        """Stage data.dir into data.stage_dir when data.stage_timing is `timing`; returns the data section the
        input pipelines read. The in-run call also starts the I/O counters of the training phase."""
        data = self.cfg.data
        if not data.stage_dir and timing == "before_init":
            check_unstaged_source(data)
        elif data.stage_dir and data.stage_timing == timing:
            self.staging = self._stage(rank_files)
        if timing == "in_run":
            self.io = io_start()
        return staged_data_config(data, self.staging)

    def init_start(self) -> None:
        self._stop_if_asked("init_start")
        self.mlperf.start("init_start")
        self.mlperf.submission(self.benchmark, self.cfg.mlperf, cache_cleared=False)
        self.log(f"{self.benchmark}: {describe(self.dist)}; writing to {self.cfg.run.output_dir}")

    def init_stop(self, strategy: DataParallel, hyperparameters: dict) -> None:
        """The scale keys, the hyperparameters and the strategy's keys, then init_stop."""
        scale = scale_keys(nodes=self.dist.num_nodes, accelerators_per_node=self.dist.local_size if self.dist.gpu
                           else 0, global_batch_size=self.cfg.train.local_batch_size * strategy.replicas)
        self.mlperf.events(scale | hyperparameters | strategy.mlperf_keys())
        self.mlperf.end("init_stop")

    def start(self) -> None:
        """The node's peak probed if need be (untimed), then run_start: the timed part begins (unless a stop
        signal came first)."""
        self.monitor.prepare()
        self._stop_if_asked("run_start")
        self.run_start = time.time()
        self.mlperf.start("run_start")
        self.started = True
        self.monitor.started()
        if self.resume:
            from common.runtime.checkpoint import log_resumed
            log_resumed(self.resume, self.mlperf, self.log)

    def plan_input(self, strategy: DataParallel, data_cfg: Any) -> tuple[Any, InputPlan]:
        """The data section the input is read with, and how the input starts: from the run's seed, or in a resumed
        run from the checkpoint's position where it can (checkpoint.py `resume_loader`, `plan_input`)."""
        if self.resume is None:
            return data_cfg, InputPlan(self.cfg.run.seed)
        from common.io.position import input_layout, reseeded
        from common.runtime.checkpoint import plan_input, resume_loader
        data_cfg = dataclasses.replace(data_cfg, loader=resume_loader(data_cfg.loader, self.resume))
        seeds = (self.cfg.run.seed, reseeded(self.cfg.run.seed, self.resume.progress.attempt))
        return data_cfg, plan_input(self.resume, seeds, data_cfg.loader, input_layout(self.cfg, self.dist, strategy))

    def input_ready(self) -> None:
        self.mlperf.events(dataset_keys(train_samples=self.data.train_samples, eval_samples=self.data.val_samples))

    def loop(self, strategy: DataParallel, callbacks: list[Callback]) -> Loop:
        """The training loop of this run's trainee and input on the strategy's steps."""
        steps = strategy.make_steps(self.trainee, self.dist, self.stop.flag())
        return Loop(self.trainee, self.data, steps, self.dist, self.mlperf, self.cfg.train, callbacks,
                    log=self.log)

    def callbacks(self, strategy: DataParallel, plan: InputPlan) -> list[Callback]:
        """The loop's callbacks of this run, in the order they run: checkpoints (resuming first), the monitors,
        in-epoch evaluation, stop signals."""
        cfg, ckpt, data = self.cfg, self.cfg.checkpoint, self.data
        resume = self.resume if not strategy.elastic else None
        checkpoints = None
        if resume or ckpt.every_epochs or ckpt.every_minutes or ckpt.on_signal or ckpt.keep_trained:
            input_state = ckpt.input_state and data.loader == "tfdata" and strategy.saves_input_position
            checkpoints = Checkpoints(ckpt, functools.partial(self.checkpointer, strategy, plan), input_state,
                                      self.run_start, resume, plan)
        callbacks: list[Callback] = [checkpoints] if checkpoints else []
        callbacks.append(self.monitor)
        if cfg.train.eval_every_steps:
            callbacks.append(EvalEverySteps(cfg.train.eval_every_steps))
        callbacks.append(StopSignal(self.stop, checkpoints if ckpt.on_signal else None))
        return callbacks + strategy.callbacks()

    def checkpointer(self, strategy: DataParallel, plan: InputPlan) -> Checkpointer:
        """The writer of this run's checkpoints, with what its training input's position depends on (a position is
        kept, saved or replayable, only when every rank reads its own stream)."""
        from common.io.position import InputPosition, input_layout
        from common.runtime.checkpoint import Checkpointer
        loader = self.data.loader if strategy.saves_input_position else ""
        position = InputPosition(loader, plan.seed, plan.start_step, input_layout(self.cfg, self.dist, strategy))
        return Checkpointer(self.cfg.checkpoint, self.cfg.run.output_dir, self.dist, self.benchmark, self.log,
                            position)

    def stopped(self, result: FitResult, strategy: DataParallel) -> None:
        """run_stop after training, and the training phase's I/O counters."""
        self._run_stop(result.status)
        self.io = io_stop(self.io, self.data, result.history)

    def keep_trained(self, loop: Loop | None) -> None:
        """After run_stop, untimed: a run that met its target saves the weights that met it as its newest
        checkpoint (checkpoint.keep_trained; collective). An elastic run (`loop` None) keeps only its commits."""
        if loop is not None:
            self.trained = keep_trained(loop)

    def finish(self, strategy: DataParallel, result: FitResult) -> int:
        """io_report.json and summary.json (rank 0; collectives on every rank); returns the exit code."""
        report = io_report(self.io, self.staging, result.history, self.dist)  # collective
        extra = strategy.summary(self.trainee)  # collective too
        figures = self.monitor.system_figures(self.dist, result.history, self.trainee.model,
                                              throughput(result.history)["samples_per_second_steady"])  # collective
        self.monitor.close(figures)
        out = Path(self.cfg.run.output_dir)
        if self.dist.is_root:
            summary = run_summary(self, result, self.trainee.metric.name, strategy.replicas) | extra | {
                "io": report, "system": figures, "precision": self.precision}
            write_io_report(report, out)
            write_summary(summary | self.attempt_summary(result.stopped, result.checkpoint or self.trained), out)
            self.log(f"{result.status}: {result.reason}; time to train {self.time_to_train:.1f} s; summary in "
                     f"{out}/summary.json")
        # A rank that exits non-zero (target not reached) makes mpirun kill the others: wait for rank 0's summary.
        self.dist.barrier()
        return exit_code(result)

    def _stop_if_asked(self, before: str) -> None:
        """Before the event `before`: end the run (StoppedBeforeStart) when a stop signal arrived in start-up on
        any rank (collective; in elastic runs, whose late workers meet no one here, this rank's signal only)."""
        asked = self.stop.signum if self.cfg.dist.elastic.enabled else self.stop.agreed_now(self.dist)
        if asked:
            raise StoppedBeforeStart(f"{self.stop.describe()} during start-up, before {before}: no run_start "
                                     f"logged, nothing trained, no checkpoint written")

    def _run_stop(self, status: str) -> None:
        """run_stop (once: a run that failed after it is not stopped again), the time to train, energy read."""
        if self.run_stopped:
            return
        self.mlperf.end("run_stop", status=status)
        self.run_stopped = True
        self.time_to_train = time.time() - self.run_start
        self.monitor.stopped()

    def _stage(self, rank_files: RankFiles) -> StageResult:
        from common.io.staging import stage_logged  # only a staged run loads the staging code
        return stage_logged(self.cfg.data, self.dist, rank_files, self.mlperf, self.log)

    def attempt_summary(self, stopped: bool = False, checkpoint: str = "") -> dict:
        """The summary fields of a resumed run, of one that stopped on a signal, and the checkpoint it left (where
        a stopped run resumes, or the weights that met the target)."""
        fields = {}
        if self.resume:
            progress = self.resume.progress
            fields |= {"attempt": progress.attempt + 1, "resumed_from": {
                "checkpoint": str(self.resume.path), "epoch": progress.epoch, "step": progress.step},
                "time_to_train_all_attempts_seconds": progress.earlier_seconds + self.time_to_train}
        if stopped:
            fields["stopped"] = True
        if stopped or checkpoint:
            fields["checkpoint"] = checkpoint
        return fields


def staged_data_config(data_cfg, staging: StageResult | None):
    """The data section the input pipelines read: the staged copy when there is one, whose files staging
    has just verified, so that data.verify_checksums unset (auto) does not check them a second time."""
    if staging is None:
        return data_cfg
    verify = False if data_cfg.verify_checksums is None else data_cfg.verify_checksums
    return dataclasses.replace(data_cfg, dir=staging.dir, verify_checksums=verify)
