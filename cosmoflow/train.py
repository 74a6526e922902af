"""Train CosmoFlow to its quality target: `python cosmoflow/train.py CONFIG [key=value ...]`.

Runs alone or under `horovodrun -np N`. Writes into run.output_dir: config.yaml (resolved),
mlperf.log (MLPerf HPC events, rank 0) and summary.json. Exit codes: 0 target reached,
1 target not reached within train.max_epochs, 2 bad input or config, 3 non-finite loss.
"""
from __future__ import annotations

import dataclasses
import sys

from common.app import Application, Built, run_application
from common.dist import DistEnv
from common.loop import Datasets
from cosmoflow.data import build_datasets, files_read, read_error
from common.mllog import sgd_keys
from common.schedule import LRSchedule
from cosmoflow.config import CosmoConfig


def build_everything(cfg: CosmoConfig, dist: DistEnv) -> Built:
    """Model, optimizer and learning-rate schedule for this rank (in init: no data is read)."""
    import keras
    from cosmoflow.model import build_model
    keras.utils.set_random_seed(cfg.run.seed + dist.rank)
    model = build_model(**dataclasses.asdict(cfg.model))
    schedule = LRSchedule.from_config(cfg.optimizer, cfg.schedule,
                                      global_batch=cfg.train.local_batch_size * dist.size)
    optimizer = keras.optimizers.SGD(learning_rate=schedule(0.0), momentum=cfg.optimizer.momentum,
                                     weight_decay=cfg.optimizer.weight_decay or None)
    return Built(model, optimizer, schedule=lambda _data: schedule, extra={"schedule": schedule})


def build_data(data_cfg, cfg: CosmoConfig, dist: DistEnv) -> Datasets:
    return build_datasets(data_cfg, cfg.model.input_shape, cfg.train.local_batch_size, dist, cfg.run.seed)


def rank_files(cfg: CosmoConfig, manifest, rank: int, ranks: int) -> list[str]:
    return files_read(manifest, rank, ranks, cfg.train.local_batch_size)


def mlperf_keys(cfg: CosmoConfig, dist: DistEnv, built: Built) -> dict:
    return (sgd_keys(cfg.optimizer, cfg.schedule, built.extra["schedule"].warmup_factor)
            | {"dropout": cfg.model.dropout})


def loss_and_metric(cfg: CosmoConfig, built: Built):
    from cosmoflow.metrics import MeanAbsoluteError, mse_loss
    return mse_loss, MeanAbsoluteError()


APP = Application(benchmark="cosmoflow", schema=CosmoConfig, metric_name="mae", build=build_everything,
                  build_data=build_data, rank_files=rank_files, mlperf_keys=mlperf_keys, loss_and_metric=loss_and_metric,
                  read_error=read_error, description=__doc__)


def main(argv=None) -> int:
    return run_application(APP, argv)


if __name__ == "__main__":
    sys.exit(main())
