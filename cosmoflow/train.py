"""Train CosmoFlow to its quality target: `python cosmoflow/train.py CONFIG [key=value ...]`.

Runs alone or under `horovodrun -np N`. Writes into run.output_dir: config.yaml (resolved),
mlperf.log (MLPerf HPC events, rank 0) and summary.json. Exit codes: 0 target reached,
1 target not reached within train.max_epochs, 2 bad input or config, 3 non-finite loss.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from pathlib import Path

from common.cli import guarded
from common.config import load_config, save_config
from common.dist import DistEnv, describe, init_distributed
from common.loop import FitOptions, fit
from common.mllog import MLPerfLog
from common.schedule import LRSchedule
from common.summary import exit_code, run_summary, write_summary
from cosmoflow.config import CosmoConfig

BENCHMARK = "cosmoflow"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="YAML config, e.g. cosmoflow/configs/cosmo_mini.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides such as optimizer.base_lr=0.002")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    return guarded(lambda: train(args.config, args.overrides))


def train(config_path: str, overrides: list[str]) -> int:
    cfg = load_config(config_path, overrides, CosmoConfig)
    dist = init_distributed(cfg.dist)
    out = Path(cfg.run.output_dir)
    if dist.is_root:
        save_config(cfg, out)
    log = functools.partial(print, flush=True) if dist.is_root else (lambda *_: None)
    mlperf = MLPerfLog(out / cfg.mlperf.log_file, enabled=dist.is_root)
    try:
        result, time_to_train, data = run_benchmark(cfg, dist, mlperf, log)
    finally:
        mlperf.close()
    if dist.is_root:
        summary = run_summary(BENCHMARK, cfg, dist, data, result, time_to_train, metric_name="mae")
        write_summary(summary, out)
        log(f"{result.status}: {result.reason}; time to train {time_to_train:.1f} s; summary in {out}/summary.json")
    return exit_code(result)


def run_benchmark(cfg: CosmoConfig, dist: DistEnv, mlperf: MLPerfLog, log):
    """The MLPerf-timed part: init (build everything), then run_start .. run_stop."""
    mlperf.start("init_start")
    mlperf.submission(BENCHMARK, cfg.mlperf, cache_cleared=False)
    log(f"cosmoflow: {describe(dist)}; writing to {cfg.run.output_dir}")
    data, model, optimizer, schedule = build_everything(cfg, dist)
    log_hyperparameters(mlperf, cfg, dist, data, schedule)
    mlperf.end("init_stop")
    run_start = time.time()
    mlperf.start("run_start")
    result = train_to_target(cfg, dist, data, model, optimizer, schedule, mlperf, log)
    mlperf.end("run_stop", status=result.status)
    return result, time.time() - run_start, data


def build_everything(cfg: CosmoConfig, dist: DistEnv):
    """Datasets, model, optimizer and learning-rate schedule for this rank."""
    import keras
    from cosmoflow.data import build_datasets
    from cosmoflow.model import build_model
    keras.utils.set_random_seed(cfg.run.seed + dist.rank)
    batch = cfg.train.local_batch_size
    data = build_datasets(cfg.data, cfg.model.input_shape, batch, dist, cfg.run.seed)
    model = build_model(**dataclasses.asdict(cfg.model))
    schedule = LRSchedule.from_config(cfg.optimizer, cfg.schedule, global_batch=batch * dist.size)
    optimizer = keras.optimizers.SGD(learning_rate=schedule(0.0), momentum=cfg.optimizer.momentum,
                                     weight_decay=cfg.optimizer.weight_decay or None)
    return data, model, optimizer, schedule


def log_hyperparameters(mlperf: MLPerfLog, cfg: CosmoConfig, dist: DistEnv, data, schedule: LRSchedule) -> None:
    mlperf.hyperparameters(
        nodes=dist.num_nodes, accelerators_per_node=dist.local_size if dist.gpu else 0,
        global_batch_size=cfg.train.local_batch_size * dist.size, train_samples=data.train_samples,
        eval_samples=data.val_samples, optimizer=cfg.optimizer, schedule=cfg.schedule,
        warmup_factor=schedule.warmup_factor, extra={"dropout": cfg.model.dropout})


def train_to_target(cfg: CosmoConfig, dist: DistEnv, data, model, optimizer, schedule, mlperf, log):
    """fit() with CosmoFlow's loss and metric; read failures become errors naming the file."""
    import tensorflow as tf
    from cosmoflow.data import read_error
    from cosmoflow.metrics import MeanAbsoluteError, mse_loss
    options = FitOptions(max_epochs=cfg.train.max_epochs, target=cfg.train.target,
                         eval_every=cfg.train.eval_every)
    try:
        return fit(model, optimizer, mse_loss, MeanAbsoluteError(), schedule, data, dist, options, mlperf, log)
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.InternalError) as err:
        mlperf.end("run_stop", status="aborted")
        raise read_error(cfg.data, cfg.train.local_batch_size, dist, err) from None


if __name__ == "__main__":
    sys.exit(main())
