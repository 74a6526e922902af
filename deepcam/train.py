"""Train DeepCAM to its quality target: `python deepcam/train.py CONFIG [key=value ...]`.

Runs alone or under `horovodrun -np N`. Writes into run.output_dir: config.yaml (resolved),
mlperf.log (MLPerf HPC events, rank 0) and summary.json. Exit codes: 0 IoU target reached,
1 target not reached within train.max_epochs, 2 bad input or config, 3 non-finite loss,
75 stopped by SIGTERM or SIGUSR1 (after a checkpoint; resume with checkpoint.resume=true).
"""
from __future__ import annotations

import dataclasses
import sys

from common.app import Application, Built, run_application
from common.dist import DistEnv
from common.loop import Datasets
from deepcam.data import build_datasets, files_read, read_error
from deepcam.config import DeepCamConfig


def build_everything(cfg: DeepCamConfig, dist: DistEnv) -> Built:
    """Model, optimizer, step-based schedule and loss for this rank (in init: no data is read)."""
    import keras
    from deepcam.metrics import WeightedCrossEntropy, class_weights
    from deepcam.model import build_model
    from deepcam.optim import StepSchedule, build_optimizer
    keras.utils.set_random_seed(cfg.run.seed + dist.rank)
    model = build_model(**dataclasses.asdict(cfg.model))
    steps = StepSchedule.from_config(cfg.optimizer, cfg.schedule)
    optimizer = build_optimizer(cfg.optimizer, steps.at_step(0))
    loss = WeightedCrossEntropy(class_weights(cfg.loss.class_frequencies, cfg.loss.weight_power))
    return Built(model, optimizer, schedule=lambda data: steps.per_epoch(data.train_steps), extra={"loss": loss})


def build_data(data_cfg, cfg: DeepCamConfig, dist: DistEnv) -> Datasets:
    return build_datasets(data_cfg, cfg.model.input_shape, cfg.train.local_batch_size, dist, cfg.run.seed)


def rank_files(cfg: DeepCamConfig, manifest, rank: int, ranks: int) -> list[str]:
    return files_read(manifest, rank, ranks, cfg.train.local_batch_size)


def mlperf_keys(cfg: DeepCamConfig, dist: DistEnv, built: Built) -> dict:
    """Every key the hpc 3.0.0 DeepCAM rules ask for in init (closed division checks their values); the
    scale keys and, after run_start, the dataset sizes are logged by common.app."""
    from deepcam.optim import mlperf_optimizer_keys
    return ({"seed": cfg.run.seed}
            | {"batchnorm_group_size": cfg.train.batchnorm_group_size,
               "gradient_accumulation_frequency": cfg.train.gradient_accumulation_frequency}
            | mlperf_optimizer_keys(cfg.optimizer, cfg.schedule))


def read_failure(cfg: DeepCamConfig, data_cfg, dist: DistEnv, err: Exception) -> Exception:
    return read_error(data_cfg, cfg.train.local_batch_size, dist, err)


def loss_and_metric(cfg: DeepCamConfig, built: Built):
    from deepcam.metrics import MeanIoU
    return built.extra["loss"], MeanIoU(cfg.model.num_classes)


APP = Application(benchmark="deepcam", schema=DeepCamConfig, metric_name="iou", build=build_everything,
                  build_data=build_data, rank_files=rank_files, mlperf_keys=mlperf_keys, loss_and_metric=loss_and_metric,
                  read_error=read_failure, description=__doc__)


def main(argv=None) -> int:
    return run_application(APP, argv)


if __name__ == "__main__":
    sys.exit(main())
