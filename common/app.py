"""What every application's `train.py` does, once: config, runtime, MLPerf-timed run, summary.

An application describes itself with an `Application` (its benchmark name, config schema,
metric and three functions); `run_application(app, argv)` then reads the config and the
dotted overrides, starts the distributed runtime, saves the resolved config, writes the MLPerf
log around the timed part (init, then run_start .. run_stop), writes summary.json and returns
the exit code: 0 target reached, 1 target not reached, 2 bad input or config, 3 non-finite loss.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from pathlib import Path
from typing import Any, Callable

from common.cli import guarded
from common.config import load_config, save_config
from common.dist import DistEnv, describe, init_distributed
from common.loop import Datasets, FitOptions, FitResult, Metric, fit
from common.mllog import MLPerfLog, scale_keys
from common.summary import exit_code, run_summary, write_summary


@dataclasses.dataclass(frozen=True)
class Built:
    """Everything a rank trains with."""

    data: Datasets
    model: Any
    optimizer: Any
    schedule: Callable[[float], float]  # learning rate by fractional 0-based epoch
    extra: dict = dataclasses.field(default_factory=dict)  # app-specific (loss, schedule object, ...)


@dataclasses.dataclass(frozen=True)
class Application:
    benchmark: str  # the MLPerf submission_benchmark name
    schema: type  # the root config dataclass
    metric_name: str
    build: Callable[[Any, DistEnv], Built]
    mlperf_keys: Callable[[Any, DistEnv, Built], dict]  # hyperparameter events, logged before init_stop
    loss_and_metric: Callable[[Any, Built], tuple[Callable, Metric]]
    # (cfg.data, local batch, dist, TF read failure) -> an error naming the bad file and record
    read_error: Callable[[Any, int, DistEnv, Exception], Exception]
    description: str = ""


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
    out = Path(cfg.run.output_dir)
    if dist.is_root:
        save_config(cfg, out)
    log = functools.partial(print, flush=True) if dist.is_root else (lambda *_: None)
    mlperf = MLPerfLog(out / cfg.mlperf.log_file, enabled=dist.is_root)
    try:
        result, time_to_train, built = _timed_run(app, cfg, dist, mlperf, log)
    finally:
        mlperf.close()
    if dist.is_root:
        summary = run_summary(app.benchmark, cfg, dist, built.data, result, time_to_train,
                              metric_name=app.metric_name)
        write_summary(summary, out)
        log(f"{result.status}: {result.reason}; time to train {time_to_train:.1f} s; summary in {out}/summary.json")
    # A rank that exits non-zero (target not reached) makes mpirun kill the others: wait for rank 0's summary.
    dist.barrier()
    return exit_code(result)


def _timed_run(app: Application, cfg, dist: DistEnv, mlperf: MLPerfLog, log):
    """The MLPerf-timed part: init (build everything), then run_start .. run_stop."""
    mlperf.start("init_start")
    mlperf.submission(app.benchmark, cfg.mlperf, cache_cleared=False)
    log(f"{app.benchmark}: {describe(dist)}; writing to {cfg.run.output_dir}")
    built = app.build(cfg, dist)
    for key, value in app.mlperf_keys(cfg, dist, built).items():
        mlperf.event(key, value)
    mlperf.end("init_stop")
    run_start = time.time()
    mlperf.start("run_start")
    result = _fit(app, cfg, dist, built, mlperf, log)
    mlperf.end("run_stop", status=result.status)
    return result, time.time() - run_start, built


def _fit(app: Application, cfg, dist: DistEnv, built: Built, mlperf: MLPerfLog, log) -> FitResult:
    """fit() with the app's loss and metric; a failure to read the data becomes an error naming the file."""
    import tensorflow as tf
    loss, metric = app.loss_and_metric(cfg, built)
    options = FitOptions(max_epochs=cfg.train.max_epochs, target=cfg.train.target,
                         eval_every=cfg.train.eval_every, eval_every_steps=cfg.train.eval_every_steps)
    try:
        return fit(built.model, built.optimizer, loss, metric, built.schedule, built.data, dist, options,
                   mlperf, log)
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.InternalError) as err:
        mlperf.end("run_stop", status="aborted")
        raise app.read_error(cfg.data, cfg.train.local_batch_size, dist, err) from None


def scale_events(cfg, dist: DistEnv, data: Datasets) -> dict:
    """The scale and dataset-size keys every benchmark logs, for this run."""
    return scale_keys(nodes=dist.num_nodes, accelerators_per_node=dist.local_size if dist.gpu else 0,
                      global_batch_size=cfg.train.local_batch_size * dist.size,
                      train_samples=data.train_samples, eval_samples=data.val_samples)
