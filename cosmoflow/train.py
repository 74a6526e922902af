"""Train CosmoFlow to its quality target: `python cosmoflow/train.py CONFIG [key=value ...]`.

Runs alone or under `horovodrun -np N`. Writes into run.output_dir: config.yaml (resolved),
mlperf.log (MLPerf HPC events, rank 0) and summary.json. Exit codes: 0 target reached,
1 target not reached within train.max_epochs, 2 bad input or config, 3 non-finite loss.
"""
from __future__ import annotations

import dataclasses
import sys

from common.app import Application, Built, run_application, scale_events
from common.dist import DistEnv
from cosmoflow.data import build_datasets, read_error
from common.mllog import sgd_keys
from common.schedule import LRSchedule
from cosmoflow.config import CosmoConfig


def build_everything(cfg: CosmoConfig, dist: DistEnv) -> Built:
    """Datasets, model, optimizer and learning-rate schedule for this rank."""
    import keras
    from cosmoflow.model import build_model
    keras.utils.set_random_seed(cfg.run.seed + dist.rank)
    batch = cfg.train.local_batch_size
    data = build_datasets(cfg.data, cfg.model.input_shape, batch, dist, cfg.run.seed)
    model = build_model(**dataclasses.asdict(cfg.model))
    schedule = LRSchedule.from_config(cfg.optimizer, cfg.schedule, global_batch=batch * dist.size)
    optimizer = keras.optimizers.SGD(learning_rate=schedule(0.0), momentum=cfg.optimizer.momentum,
                                     weight_decay=cfg.optimizer.weight_decay or None)
    return Built(data, model, optimizer, schedule)


def mlperf_keys(cfg: CosmoConfig, dist: DistEnv, built: Built) -> dict:
    return (scale_events(cfg, dist, built.data)
            | sgd_keys(cfg.optimizer, cfg.schedule, built.schedule.warmup_factor)
            | {"dropout": cfg.model.dropout})


def loss_and_metric(cfg: CosmoConfig, built: Built):
    from cosmoflow.metrics import MeanAbsoluteError, mse_loss
    return mse_loss, MeanAbsoluteError()


APP = Application(benchmark="cosmoflow", schema=CosmoConfig, metric_name="mae", build=build_everything,
                  mlperf_keys=mlperf_keys, loss_and_metric=loss_and_metric,
                  read_error=read_error, description=__doc__)


def main(argv=None) -> int:
    return run_application(APP, argv)


if __name__ == "__main__":
    sys.exit(main())
