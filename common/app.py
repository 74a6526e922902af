"""What every application's `train.py` does, once: config, runtime, MLPerf-timed run, summary.

An application describes itself with an `Application` (its benchmark name, config schema,
metric and the functions that build its parts); `run_application(app, argv)` then reads the
config and the dotted overrides, starts the distributed runtime, saves the resolved config,
writes the MLPerf log around the timed part, writes summary.json and io_report.json and returns
the exit code: 0 target reached, 1 target not reached, 2 bad input or config, 3 non-finite loss,
75 stopped by a signal (a checkpoint of where it stopped written).
An application with more than one way to spread the work over ranks (CosmoFlow's hybrid data x
spatial path) checks its layout in `Application.check` before any work, and says through `Built`
how many data-parallel replicas the ranks form, which steps they run and what the summary adds.

The timed part follows the MLPerf HPC rules: init builds the model and optimizer without touching
the dataset; the run starts, stages the data when data.stage_dir is set (staging_start ..
staging_stop; with data.stage_timing=before_run staging precedes init instead), builds the input
pipelines, and trains to the target.

Faults (docs/faults.md): SIGTERM / SIGUSR1 stop every rank after the same step, with a checkpoint
(checkpoint.on_signal), run_stop status aborted and exit code 75; checkpoint.every_epochs / every_minutes
write periodic checkpoints; checkpoint.resume=true continues from the newest valid one, moving the earlier
attempt's mlperf.log and summaries to attempts/<n>/ and logging `resumed_from_checkpoint` after run_start.
With dist.elastic.enabled=true the training runs under hvd.elastic.run (common/elastic.py): workers may die or
join, every (re)start rebuilds the model, schedule, input and steps for the rank layout of the moment, and
summary.json gets an `elastic` field.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import time
from pathlib import Path
from typing import Any, Callable

from common.checkpoint import Checkpointer, Resume, find_resume
from common.cli import guarded
from common.config import load_config, save_config
from common.dist import DistEnv, describe, init_distributed
from common.elastic import Attempt, Driver, check_elastic
from common.iostats import IOCounters, io_report, write_io_report
from common.errors import BenchError
from common.loop import Control, Datasets, FitOptions, FitResult, Metric, StepsFactory, data_parallel_steps, fit
from common.manifest import Manifest
from common.mllog import MLPerfLog, dataset_keys, scale_keys
from common.staging import StageResult, check_unstaged_source, stage_for_run
from common.stopping import StopRequests
from common.summary import exit_code, run_summary, write_summary

# What an earlier attempt leaves in the output directory, moved to attempts/<n>/ when a run resumes.
ATTEMPT_FILES = ("summary.json", "io_report.json")


@dataclasses.dataclass(frozen=True)
class Built:
    """What a rank trains with, built in init (before the dataset is touched)."""

    model: Any
    optimizer: Any
    schedule: Callable[[Datasets], Callable[[float], float]]  # the data -> learning rate by fractional epoch
    extra: dict = dataclasses.field(default_factory=dict)  # app-specific (loss, schedule object, ...)
    steps: StepsFactory = data_parallel_steps  # how a rank trains and evaluates a batch (common/loop.py)
    data_parallel_size: int = 0  # replicas that each read their own batches; 0: every rank is one
    # After training, on every rank (collectives allowed): fields rank 0 adds to summary.json.
    summary: Callable[[], dict] | None = None

    def replicas(self, dist: DistEnv) -> int:
        """The data-parallel replicas: the global batch is the local batch times this."""
        return self.data_parallel_size or dist.size


@dataclasses.dataclass(frozen=True)
class Application:
    benchmark: str  # the MLPerf submission_benchmark name
    schema: type  # the root config dataclass
    metric_name: str
    build: Callable[[Any, DistEnv], Built]
    # (cfg.data with dir set to the directory to read, cfg, dist) -> the input pipelines
    build_data: Callable[[Any, Any, DistEnv], Datasets]
    # (cfg, manifest, rank, ranks) -> the dataset paths that rank reads (what data.stage_mode=rank stages)
    rank_files: Callable[[Any, Manifest, int, int], list[str]]
    mlperf_keys: Callable[[Any, DistEnv, Built], dict]  # hyperparameter events, logged before init_stop
    loss_and_metric: Callable[[Any, Built], tuple[Callable, Metric]]
    # (cfg, cfg.data as read, dist, TF read failure) -> an error naming the bad file and record
    read_error: Callable[[Any, Any, DistEnv, Exception], Exception]
    description: str = ""
    # (cfg, dist) -> None, before anything is built or written: raises BenchError for a layout of the
    # ranks that the config cannot run on.
    check: Callable[[Any, DistEnv], None] | None = None


@dataclasses.dataclass
class TimedRun:
    """What the timed part leaves for the summary and the I/O report."""

    result: FitResult
    time_to_train: float
    data: Datasets
    staging: StageResult | None
    io: IOCounters
    built: Built
    resume: Resume | None = None
    dist: DistEnv | None = None  # the rank layout at the end (elastic runs change it)
    elastic: dict | None = None  # an elastic run's resets (summary.json's `elastic`)


def parse_args(app: Application, argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=app.description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help=f"YAML config, e.g. {app.benchmark}/configs/*.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides such as train.max_epochs=4")
    return parser.parse_args(argv)


def run_application(app: Application, argv=None) -> int:
    """The whole of `python <app>/train.py CONFIG [key=value ...]`; returns the exit code."""
    args = parse_args(app, argv)
    return guarded(lambda: _train(app, args.config, args.overrides))


def _train(app: Application, config_path: str, overrides: list[str]) -> int:
    cfg = load_config(config_path, overrides, app.schema)
    dist = init_distributed(cfg.dist)
    if app.check:
        app.check(cfg, dist)
    check_elastic(cfg, dist)
    out = Path(cfg.run.output_dir)
    log = root_log(dist)
    # (An elastic run resumes no checkpoint, and a worker joining it must not wait in a collective here.)
    resume = None if cfg.dist.elastic.enabled else find_resume(cfg.checkpoint, cfg.run.output_dir, dist,
                                                                app.benchmark, log)
    if dist.is_root:
        if resume:
            _archive_attempt(out, cfg.mlperf.log_file, resume.progress.attempt)
        save_config(cfg, out)
    mlperf = MLPerfLog(out / cfg.mlperf.log_file, enabled=dist.is_root)
    stop = StopRequests().install()
    try:
        run = _timed_run(app, cfg, dist, mlperf, log, resume, stop)
    finally:
        stop.uninstall()
        mlperf.close()
    dist = run.dist or dist
    log = root_log(dist)
    report = io_report(run.io, run.staging, run.result.history, dist)  # collective: every rank takes part
    extra = run.built.summary() if run.built.summary else {}  # collective too
    if dist.is_root:
        summary = run_summary(app.benchmark, cfg, dist, run.data, run.result, run.time_to_train,
                              metric_name=app.metric_name, replicas=run.built.replicas(dist)) | extra | {"io": report}
        summary |= _attempt_summary(run) | ({"elastic": run.elastic} if run.elastic is not None else {})
        write_io_report(report, out)
        write_summary(summary, out)
        log(f"{run.result.status}: {run.result.reason}; time to train {run.time_to_train:.1f} s; summary in "
            f"{out}/summary.json")
    # A rank that exits non-zero (target not reached) makes mpirun kill the others: wait for rank 0's summary.
    dist.barrier()
    return exit_code(run.result)


def _archive_attempt(out: Path, log_file: str, attempt: int) -> None:
    """Move what attempt `attempt` left in `out` (its MLPerf log and summaries) to out/attempts/<attempt>/."""
    names = [n for n in (log_file, *ATTEMPT_FILES) if (out / n).is_file()]
    if not names:
        return
    dest = out / "attempts" / str(attempt)
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        os.replace(out / name, dest / name)


def _attempt_summary(run: TimedRun) -> dict:
    """The summary fields of a resumed run (or of one that stopped on a signal)."""
    fields = {}
    if run.resume:
        progress = run.resume.progress
        fields |= {"attempt": progress.attempt + 1, "resumed_from": {
            "checkpoint": str(run.resume.path), "epoch": progress.epoch, "step": progress.step},
            "time_to_train_all_attempts_seconds": progress.earlier_seconds + run.time_to_train}
    if run.result.stopped:
        fields |= {"stopped": True, "checkpoint": run.result.checkpoint}
    return fields


def _timed_run(app: Application, cfg, dist: DistEnv, mlperf: MLPerfLog, log, resume: Resume | None = None,
               stop: StopRequests | None = None) -> TimedRun:
    """The MLPerf-timed part: [staging,] init (model, optimizer), then run_start .. run_stop."""
    staging = None
    if not cfg.data.stage_dir:
        check_unstaged_source(cfg.data)
    elif cfg.data.stage_timing == "before_run":
        staging = _stage(app, cfg, dist, mlperf, log)
    mlperf.start("init_start")
    mlperf.submission(app.benchmark, cfg.mlperf, cache_cleared=False)
    log(f"{app.benchmark}: {describe(dist)}; writing to {cfg.run.output_dir}")
    built = app.build(cfg, dist)
    mlperf.events(scale_events(cfg, dist, built.replicas(dist)) | app.mlperf_keys(cfg, dist, built))
    mlperf.end("init_stop")
    run_start = time.time()
    mlperf.start("run_start")
    if resume:
        progress = resume.progress
        mlperf.event("resumed_from_checkpoint", {"checkpoint": resume.path.name, "epoch": progress.epoch,
                                                 "step": progress.step, "attempt": progress.attempt + 1,
                                                 "earlier_seconds": round(progress.earlier_seconds, 3)})
        log(f"resuming from {resume.path}: epoch {progress.epoch}, {progress.step} steps done in it")
    if cfg.data.stage_dir and cfg.data.stage_timing == "in_run":
        staging = _stage(app, cfg, dist, mlperf, log)
    data_cfg = staged_data_config(cfg.data, staging)
    io = IOCounters.start()
    if cfg.dist.elastic.enabled:
        return _elastic_run(app, cfg, data_cfg, dist, built, mlperf, stop, run_start, staging, io)
    data = app.build_data(data_cfg, _data_seeded(cfg, resume, dist), dist)
    mlperf.events(dataset_keys(train_samples=data.train_samples, eval_samples=data.val_samples))
    control = _control(app, cfg, dist, built, data, resume, stop, run_start, log)
    result = _fit(app, cfg, data_cfg, dist, built, data, mlperf, log, control)
    mlperf.end("run_stop", status=result.status)
    return TimedRun(result, time.time() - run_start, data, staging, io.stop(data, result.history), built, resume)


def staged_data_config(data_cfg, staging: StageResult | None):
    """The data section the input pipelines read: the staged copy when there is one, whose files staging
    has just verified, so that data.verify_checksums unset (auto) does not check them a second time."""
    if staging is None:
        return data_cfg
    verify = False if data_cfg.verify_checksums is None else data_cfg.verify_checksums
    return dataclasses.replace(data_cfg, dir=staging.dir, verify_checksums=verify)


def _elastic_run(app: Application, cfg, data_cfg, dist: DistEnv, built: Built, mlperf: MLPerfLog,
                 stop: StopRequests | None, run_start: float, staging, io: IOCounters) -> TimedRun:
    """fit() under hvd.elastic.run (common/elastic.py): each (re)start builds, for the rank layout Horovod has
    then, the model, optimizer and schedule (the first reuses init's), the input (reseeded after a reset) and
    the steps; rank 0, whichever process it is, writes the MLPerf log."""
    first = [built]

    def attempt(now: DistEnv, seed_offset: int) -> Attempt:
        log = root_log(now)
        ours = first.pop() if first and built.replicas(dist) == now.size else app.build(cfg, now)
        first.clear()
        if ours.steps is not data_parallel_steps:
            raise BenchError(f"dist.elastic.enabled=true: {app.benchmark} trains with steps of its own here, "
                             f"elastic runs need the Keras data-parallel steps")
        # A new input order after each reset (the offset is the committed step, the same on every rank).
        seeded = _reseeded(cfg, seed_offset)
        data = app.build_data(data_cfg, seeded, now)
        if not seed_offset:
            mlperf.events(dataset_keys(train_samples=data.train_samples, eval_samples=data.val_samples))
        control = _control(app, cfg, now, ours, data, None, stop, run_start, log)
        return Attempt(now, data, lambda hooks: _fit(app, cfg, data_cfg, now, ours, data, mlperf, log,
                                                     dataclasses.replace(control, elastic=hooks)), ours)

    driver = Driver(dist, cfg.dist.elastic.commit_every_steps, attempt, mlperf,
                    functools.partial(print, flush=True))
    result = driver.run()
    mlperf.end("run_stop", status=result.status)
    last = driver.last
    return TimedRun(result, time.time() - run_start, last.data, staging, io.stop(last.data, result.history),
                    last.built, None, dist=last.dist, elastic=driver.summary())


def _data_seeded(cfg, resume: Resume | None, dist: DistEnv):
    """The config the input pipelines are built from: when a resumed run cannot restore the input position
    (no iterator state saved, or another rank count), a new seed per attempt, so that it does not replay the
    first epochs' order."""
    if resume is None or (resume.input_state and resume.ranks == dist.size):
        return cfg
    return _reseeded(cfg, resume.progress.attempt)


def _reseeded(cfg, n: int):
    """`cfg` with the input seed of the n-th restart (0: unchanged): a new data order after a resume or reset."""
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, seed=cfg.run.seed + 7919 * n))


def root_log(dist: DistEnv) -> Callable[..., None]:
    """print (flushed) on rank 0, nothing elsewhere."""
    return functools.partial(print, flush=True) if dist.is_root else (lambda *_: None)


def _control(app: Application, cfg, dist: DistEnv, built: Built, data: Datasets, resume: Resume | None,
             stop: StopRequests | None, run_start: float, log) -> Control:
    """Checkpoints, resuming and stop signals for fit().

    Every path keeps the whole training state in each rank's Keras model and optimizer (the hybrid Mesh-TF
    path copies them into its mesh before a step), so every path checkpoints them. The input position is
    saved only when every rank reads its own tf.data stream: on the hybrid path the groups' other ranks read
    nothing, so a resume there reseeds the input.
    """
    checkpoints = cfg.checkpoint.every_epochs or cfg.checkpoint.every_minutes or cfg.checkpoint.on_signal
    checkpointer = Checkpointer(cfg.checkpoint, cfg.run.output_dir, dist, app.benchmark, log) if checkpoints else None
    every_rank_reads = built.replicas(dist) == dist.size
    return Control(checkpointer=checkpointer, resume=resume, stop=stop, run_start=run_start,
                   input_state=cfg.checkpoint.input_state and data.loader == "tfdata" and every_rank_reads)


def _stage(app: Application, cfg, dist: DistEnv, mlperf: MLPerfLog, log) -> StageResult:
    """Stage the dataset to data.stage_dir between staging_start and staging_stop."""
    log(f"staging {cfg.data.dir} to {cfg.data.stage_dir} (data.stage_mode={cfg.data.stage_mode})")
    mlperf.start("staging_start")
    staging = stage_for_run(cfg.data, dist, lambda manifest, rank, ranks: app.rank_files(cfg, manifest, rank, ranks),
                            progress=dist.is_root)
    mlperf.end("staging_stop", staging_seconds=staging.seconds, staged_bytes=staging.bytes_written)
    log(f"staged into {staging.dir}: {staging.files} files, {staging.bytes_written / 1e9:.3f} GB in "
        f"{staging.seconds:.2f} s on rank 0" + ("" if staging.copied else " (waiting for its node's stager)"))
    return staging


def _fit(app: Application, cfg, data_cfg, dist: DistEnv, built: Built, data: Datasets, mlperf: MLPerfLog,
         log, control: Control) -> FitResult:
    """fit() with the app's loss and metric; a failure to read the data becomes an error naming the file."""
    import tensorflow as tf
    loss, metric = app.loss_and_metric(cfg, built)
    options = FitOptions(max_epochs=cfg.train.max_epochs, target=cfg.train.target,
                         eval_every=cfg.train.eval_every, eval_every_steps=cfg.train.eval_every_steps)
    try:
        return fit(built.model, built.optimizer, loss, metric, built.schedule(data), data, dist, options,
                   mlperf, log, make_steps=built.steps, control=control)
    # UnicodeDecodeError: TensorFlow quoting the raw bytes of a record that is no tf.train.Example.
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.InternalError, UnicodeDecodeError) as err:
        if dist.elastic and "Horovod" in str(err):
            raise  # a failed collective: hvd.elastic.run resets
        mlperf.end("run_stop", status="aborted")
        raise app.read_error(cfg, data_cfg, dist, err) from None


def scale_events(cfg, dist: DistEnv, replicas: int) -> dict:
    """The scale keys every benchmark logs in init (the dataset sizes follow once the data is read)."""
    return scale_keys(nodes=dist.num_nodes, accelerators_per_node=dist.local_size if dist.gpu else 0,
                      global_batch_size=cfg.train.local_batch_size * replicas)
