"""CosmoFlow's configuration: its own `data` and `model` sections plus the shared ones."""
from __future__ import annotations

import dataclasses
from typing import Literal

from common.runtime.config import (CheckpointConfig, DistConfig, MlperfConfig, RunConfig, StagedDataConfig,
                                   SystemConfig, TensorBoardConfig, TrainConfig, check, differences, section_differences)



@dataclasses.dataclass(frozen=True)
class CosmoDataConfig(StagedDataConfig):
    """Where the converted TFRecords are and how they are read."""

    dir: str = "data/cosmo_mini/tfrecords"
    # auto: DALI when it is installed and can read the data (the faster loader, docs/performance.md), else tf.data
    loader: Literal["auto", "tfdata", "dali"] = "auto"
    shuffle: bool = True
    shuffle_buffer: int = 64  # samples held for shuffling, per rank
    read_threads: int = 2  # parallel file readers / DALI worker threads
    prefetch: int = 2  # batches prepared ahead
    apply_log: bool = True  # x -> log(1 + x), as the reference does
    # Standardise each channel of log(1 + x) with the training split's mean and std, which cosmo-convert
    # records in the manifest (input_stats); the reference feeds log(1 + x) as it is.
    normalize: bool = False
    train_samples: int = 0  # expected training samples in the manifest; 0 accepts any count
    val_samples: int = 0  # expected validation samples; 0 accepts any count
    # A split whose file count the rank count does not divide: refuse (every file is read every epoch, as
    # MLPerf wants), or drop its last (files mod ranks) files so that every rank reads as many (for odd rank
    # counts, and for elastic runs that shrink to any size; docs/faults.md).
    uneven_files: Literal["refuse", "drop"] = "refuse"
    # On the spatial path (parallel.spatial): where a rank's block of each sample comes from. auto: the
    # dataset's per-block records when `python -m data_prep cosmo-blocks` wrote them for this partitioning
    # (<dir>/blocks_<pd>x<ph>/, each rank then reads 1/(pd*ph) of the bytes), else cut from the whole records;
    # records: the per-block records or an error; whole: always cut from the whole records.
    blocks: Literal["auto", "records", "whole"] = "auto"

    def __post_init__(self):
        super().__post_init__()
        check(self.shuffle_buffer >= 1, "data.shuffle_buffer", self.shuffle_buffer, ">= 1")
        check(self.read_threads >= 1, "data.read_threads", self.read_threads, ">= 1")
        check(self.prefetch >= 1, "data.prefetch", self.prefetch, ">= 1")
        check(self.apply_log or not self.normalize, "data.normalize", self.normalize,
               "false when data.apply_log is false (the statistics are of log(1 + x))")


@dataclasses.dataclass(frozen=True)
class CosmoModelConfig:
    """Keyword arguments of cosmoflow.model.build_model."""

    input_shape: tuple[int, ...] = (128, 128, 128, 4)
    conv_filters: tuple[int, ...] = (32, 64, 128, 256, 512)
    kernel_size: int = 3
    pool_size: int = 2
    pooling: Literal["max", "avg"] = "max"
    leaky_slope: float = 0.3
    dense_units: tuple[int, ...] = (128, 64)
    dropout: float = 0.5
    target_size: int = 4
    output_scale: float = 1.2

    def __post_init__(self):
        check(len(self.input_shape) == 4 and min(self.input_shape) >= 1, "model.input_shape", list(self.input_shape),
              "[D, H, W, C], each >= 1")
        for key in ("kernel_size", "pool_size", "target_size"):
            check(getattr(self, key) >= 1, f"model.{key}", getattr(self, key), "an integer >= 1")
        for key in ("conv_filters", "dense_units"):
            check(all(n >= 1 for n in getattr(self, key)), f"model.{key}", list(getattr(self, key)),
                  "a list of integers >= 1")
        check(len(self.conv_filters) >= 1, "model.conv_filters", list(self.conv_filters), "at least one layer")
        check(self.output_scale > 0, "model.output_scale", self.output_scale, "> 0")
        smallest = self.pool_size ** len(self.conv_filters)
        check(all(s >= smallest for s in self.input_shape[:3]), "model.input_shape", list(self.input_shape),
               f"spatial sizes >= {smallest} for {len(self.conv_filters)} poolings of {self.pool_size}")
        check(0 <= self.dropout < 1, "model.dropout", self.dropout, "in [0, 1)")


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """How each sample is split across ranks (docs/mesh.md).

    spatial = [pd, ph]: every pd * ph consecutive ranks form one group that holds each sample's cube in
    pd depth x ph height blocks (Mesh-TensorFlow, cosmoflow/mesh/); the groups are data-parallel.
    [1, 1] is the ordinary data-parallel path. The checks that need the model's sizes and the rank count
    run in cosmoflow.mesh.hybrid.check_hybrid before any work.
    """

    spatial: tuple[int, ...] = (1, 1)

    def __post_init__(self):
        check(len(self.spatial) == 2 and all(p >= 1 for p in self.spatial), "parallel.spatial",
               list(self.spatial), "[pd, ph]: depth and height partitions, each >= 1")

    @property
    def partitions(self) -> int:
        """Ranks per group: pd * ph."""
        return self.spatial[0] * self.spatial[1]

    @property
    def hybrid(self) -> bool:
        """True when samples are split across ranks (the Mesh-TF path)."""
        return self.partitions > 1


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """SGD with momentum; the peak learning rate scales linearly with the global batch.

    weight_decay is the reference's: an L2 penalty `weight_decay * sum(w ** 2)` on the kernels of the two hidden dense
    layers, added to the loss (not a decoupled decay of every variable). rcp names a reference convergence point of
    mlperf-logging (e.g. cosmoflow_ref_128): its hyperparameters replace the config's (cosmoflow/config.py)."""

    name: str = "sgd"
    base_lr: float = 0.001
    base_batch_size: int = 64  # the batch size base_lr is defined for
    momentum: float = 0.9
    weight_decay: float = 0.0
    rcp: str = ""

    def __post_init__(self):
        check(self.weight_decay >= 0, "optimizer.weight_decay", self.weight_decay, ">= 0")
        check(self.name == "sgd", "optimizer.name", self.name, "'sgd'")
        check(self.base_lr > 0, "optimizer.base_lr", self.base_lr, "> 0")
        check(self.base_batch_size > 0, "optimizer.base_batch_size", self.base_batch_size, "> 0")
        check(0 <= self.momentum < 1, "optimizer.momentum", self.momentum, "in [0, 1)")


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """Linear warm-up from base_lr to the scaled peak, then step decays (factors of the peak).

    granularity: `epoch` is the reference's rule (the rate set at the start of each epoch, a decay at
    boundary b from epoch b + 1 on); `step` is the suite's per-step variant (cosmoflow/train.py `LRSchedule`)."""

    warmup_epochs: int = 0
    decay_epochs: tuple[int, ...] = ()
    decay_factors: tuple[float, ...] = ()
    granularity: Literal["epoch", "step"] = "epoch"

    def __post_init__(self):
        check(self.warmup_epochs >= 0, "schedule.warmup_epochs", self.warmup_epochs, ">= 0")
        check(len(self.decay_epochs) == len(self.decay_factors), "schedule.decay_factors",
               list(self.decay_factors), f"one factor per decay epoch {list(self.decay_epochs)}")
        check(list(self.decay_epochs) == sorted(set(self.decay_epochs)), "schedule.decay_epochs",
               list(self.decay_epochs), "strictly increasing epochs")


@dataclasses.dataclass(frozen=True)
class CosmoConfig:
    run: RunConfig = RunConfig()
    dist: DistConfig = DistConfig()
    data: CosmoDataConfig = CosmoDataConfig()
    model: CosmoModelConfig = CosmoModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    train: TrainConfig = TrainConfig()
    mlperf: MlperfConfig = MlperfConfig()
    parallel: ParallelConfig = ParallelConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    system: SystemConfig = SystemConfig()
    tensorboard: TensorBoardConfig = TensorBoardConfig()

    def __post_init__(self):
        check(self.data.blocks != "records" or self.parallel.hybrid, "data.blocks", self.data.blocks,
              "auto or whole without parallel.spatial (per-block records serve only a spatial split)")


# ---------------------------------------------------------------------------- the reference
# What a closed-division run must match (mlcommons/hpc cosmoflow/configs/cosmo.yaml, models/cosmoflow.py, the hpc
# 3.0.0 dataset): `closed_differences` lists every setting that differs; hyperparameters count as the reference's when
# they are its defaults or an RCP's (cosmoflow/rcp.py). The division is closed only when the list is empty.

TRAIN_SAMPLES, VAL_SAMPLES = 524288, 65536
MODEL = CosmoModelConfig()  # the defaults are the reference's network (dropout is a hyperparameter)
OPTIMIZER = OptimizerConfig(base_lr=0.001, base_batch_size=64, momentum=0.9, weight_decay=0.0)
SCHEDULE = ScheduleConfig(warmup_epochs=4, decay_epochs=(32, 64), decay_factors=(0.25, 0.125))
DROPOUT = 0.5
TARGET = 0.124


def closed_differences(cfg: CosmoConfig) -> list[str]:
    """Each way `cfg` is not the reference's run, as "key value (reference value)"; [] for a closed run."""
    found = section_differences("model", cfg.model, MODEL, skip=("dropout",))
    found += differences([("data.train_samples", cfg.data.train_samples, TRAIN_SAMPLES),
                         ("data.val_samples", cfg.data.val_samples, VAL_SAMPLES),
                         ("data.apply_log", cfg.data.apply_log, True), ("data.normalize", cfg.data.normalize, False),
                         ("train.target", cfg.train.target, TARGET), ("train.eval_every", cfg.train.eval_every, 1),
                         ("train.eval_every_steps", cfg.train.eval_every_steps, 0),
                         ("optimizer.momentum", cfg.optimizer.momentum, OPTIMIZER.momentum),
                         ("schedule.granularity", cfg.schedule.granularity, "epoch")])
    if not cfg.optimizer.rcp:  # an RCP's hyperparameters are the reference's at its batch size
        found += section_differences("optimizer", cfg.optimizer, OPTIMIZER, skip=("name", "momentum", "rcp"))
        found += section_differences("schedule", cfg.schedule, SCHEDULE, skip=("granularity",))
        found += differences([("model.dropout", cfg.model.dropout, DROPOUT)])
    return found
