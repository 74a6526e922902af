"""DeepCAM's configuration: its own `data`, `model`, `optimizer`, `schedule`, `loss` and `train`
sections plus the shared `run`, `dist` and `mlperf` ones. The optimizer and schedule sections
carry the names the MLPerf HPC DeepCAM rules log (deepcam/optim.py)."""
from __future__ import annotations

import dataclasses
from typing import Literal

from common.runtime.config import (CheckpointConfig, DistConfig, MlperfConfig, RunConfig, StagedDataConfig,
                                   SystemConfig, TensorBoardConfig, TrainConfig, check, differences, section_differences)


LOADERS = ("auto", "tfdata", "dali")
NORMALIZATIONS = ("minmax", "meanstd")


@dataclasses.dataclass(frozen=True)
class DeepCamDataConfig(StagedDataConfig):
    """Where the converted TFRecords are and how they are read and normalised."""

    dir: str = "data/deepcam_mini/tfrecords"
    # auto: DALI when it is installed and can read the data (the faster loader, docs/performance.md), else tf.data
    loader: Literal["auto", "tfdata", "dali"] = "auto"
    shuffle: bool = True
    # Samples held for shuffling, per rank: 8 x 57.5 MB at the full 768x1152 size.
    shuffle_buffer: int = 8
    read_threads: int = 2  # record files read in parallel / DALI worker threads
    prefetch: int = 2  # batches prepared ahead
    # Per channel, from the dataset's stats.h5: "minmax" (the reference's) (x - min) / (max - min);
    # "meanstd" (x - mean) / sqrt(sqmean - mean^2).
    normalization: Literal["minmax", "meanstd"] = "minmax"
    train_samples: int = 0  # expected training samples in the manifest; 0 accepts any count
    val_samples: int = 0  # expected validation samples; 0 accepts any count

    def __post_init__(self):
        super().__post_init__()
        check(self.loader in LOADERS, "data.loader", self.loader, f"one of {list(LOADERS)}")
        check(self.normalization in NORMALIZATIONS, "data.normalization", self.normalization,
               f"one of {list(NORMALIZATIONS)}")
        check(self.shuffle_buffer >= 1, "data.shuffle_buffer", self.shuffle_buffer, ">= 1")
        check(self.read_threads >= 1, "data.read_threads", self.read_threads, ">= 1")
        check(self.prefetch >= 1, "data.prefetch", self.prefetch, ">= 1")
        check(self.train_samples >= 0, "data.train_samples", self.train_samples, ">= 0 (0 accepts any count)")
        check(self.val_samples >= 0, "data.val_samples", self.val_samples, ">= 0 (0 accepts any count)")


@dataclasses.dataclass(frozen=True)
class DeepCamModelConfig:
    """Keyword arguments of deepcam.model.build_model (DeepLabv3+ with an aligned-Xception encoder)."""

    input_shape: tuple[int, ...] = (768, 1152, 16)
    num_classes: int = 3
    width: float = 1.0  # channel multiplier; 1.0 is the reference network
    middle_blocks: int = 16  # Xception middle-flow blocks; 16 is the reference (fewer: quick smoke tests)
    # How the decoder's 256-channel transposed convolutions compute: "transposed" (Keras' Conv2DTranspose) or
    # "phased" (four stride-1 convolutions, one per output parity; deepcam/model.py PhasedConvTranspose: 0.94x
    # the float32 step at 768 x 1152 on an AMD EPYC CPU, 0.98x in bfloat16, docs/deepcam_step.md). The same layer
    # either way (kernel, parameters, outputs), so the closed division allows both.
    deconv: Literal["transposed", "phased"] = "transposed"

    def __post_init__(self):
        check(len(self.input_shape) == 3 and self.input_shape[2] >= 1, "model.input_shape", list(self.input_shape),
              "[H, W, C], C >= 1")
        check(all(s % 16 == 0 and s > 0 for s in self.input_shape[:2]), "model.input_shape",
               list(self.input_shape), "H and W positive multiples of 16 (output stride 16)")
        check(self.num_classes >= 2, "model.num_classes", self.num_classes, ">= 2")
        check(0 < self.width <= 4, "model.width", self.width, "in (0, 4]")
        check(self.middle_blocks >= 1, "model.middle_blocks", self.middle_blocks, ">= 1 (the reference has 16)")


@dataclasses.dataclass(frozen=True)
class DeepCamOptimizerConfig:
    """The reference's optimizers (deepcam/lamb.py): apex FusedLAMB, torch AdamW (decoupled decay) or torch
    Adam (decay as L2 on the gradient), eps 1e-6; `lr` is the start rate the schedule scales."""

    name: Literal["LAMB", "AdamW", "Adam"] = "LAMB"
    lr: float = 0.0055
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0  # LAMB only: apex's global gradient-norm clipping (the closed rules fix 1.0)
    # A reference convergence point of mlperf-logging (e.g. deepcam_ref_512): its hyperparameters replace
    # this section's and the schedule's (deepcam/config.py); the run's global batch must be the RCP's.
    rcp: str = ""

    def __post_init__(self):
        check(self.name in ("LAMB", "AdamW", "Adam"), "optimizer.name", self.name, "LAMB, AdamW or Adam")
        check(self.lr > 0, "optimizer.lr", self.lr, "> 0")
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optimizer.betas",
               list(self.betas), "two values in [0, 1)")
        check(self.eps > 0, "optimizer.eps", self.eps, "> 0")
        check(self.weight_decay >= 0, "optimizer.weight_decay", self.weight_decay, ">= 0")
        check(self.max_grad_norm > 0, "optimizer.max_grad_norm", self.max_grad_norm, "> 0")


@dataclasses.dataclass(frozen=True)
class DeepCamScheduleConfig:
    """The reference's warm-up then multistep or cosine decay, counted in optimizer steps; the rate of each
    step is stated in deepcam/optim.py (StepSchedule)."""

    type: Literal["multistep", "cosine_annealing"] = "multistep"
    warmup_steps: int = 0
    warmup_factor: float = 1.0  # 1: linear ramp up from 0 towards lr; > 1: from lr towards lr * factor
    # multistep: optimizer step warmup_steps + m (0-based; m - 1 without warm-up) is the first multiplied ...
    milestones: tuple[int, ...] = ()
    decay_rate: float = 0.1  # ... by this
    t_max: int = 1  # cosine_annealing: steps from the end of warm-up to eta_min (a period is 2 * t_max)
    eta_min: float = 0.0

    def __post_init__(self):
        check(self.type in ("multistep", "cosine_annealing"), "schedule.type", self.type,
               "multistep or cosine_annealing")
        check(self.warmup_steps >= 0, "schedule.warmup_steps", self.warmup_steps, ">= 0")
        check(self.warmup_factor >= 1, "schedule.warmup_factor", self.warmup_factor, ">= 1")
        check(list(self.milestones) == sorted(set(self.milestones)) and all(m > 0 for m in self.milestones),
               "schedule.milestones", list(self.milestones), "strictly increasing positive steps")
        check(0 < self.decay_rate <= 1, "schedule.decay_rate", self.decay_rate, "in (0, 1]")
        check(self.t_max >= 1, "schedule.t_max", self.t_max, ">= 1")
        check(self.eta_min >= 0, "schedule.eta_min", self.eta_min, ">= 0")


@dataclasses.dataclass(frozen=True)
class DeepCamLossConfig:
    """Class-weighted cross-entropy; weights are frequency ** weight_power (reference: -0.125)."""

    class_frequencies: tuple[float, ...] = (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)
    weight_power: float = -0.125

    def __post_init__(self):
        check(all(f > 0 for f in self.class_frequencies), "loss.class_frequencies",
               list(self.class_frequencies), "all > 0")


@dataclasses.dataclass(frozen=True)
class DeepCamTrainConfig(TrainConfig):
    """The shared train section with DeepCAM's defaults, an IoU target, and the reference's two extra keys."""

    max_epochs: int = 200
    local_batch_size: int = 2
    target: float = 0.82
    batchnorm_group_size: int = 1  # ranks whose batch-norm statistics are combined (1: per rank)
    gradient_accumulation_frequency: int = 1

    def __post_init__(self):
        super().__post_init__()
        check(0 < self.target <= 1, "train.target", self.target, "in (0, 1]")
        check(self.batchnorm_group_size == 1, "train.batchnorm_group_size", self.batchnorm_group_size,
              "1 (batch-norm statistics across ranks are not implemented)")
        check(self.gradient_accumulation_frequency == 1, "train.gradient_accumulation_frequency",
              self.gradient_accumulation_frequency, "1 (gradient accumulation is not implemented)")


@dataclasses.dataclass(frozen=True)
class DeepCamConfig:
    run: RunConfig = RunConfig(name="deepcam", seed=1)
    dist: DistConfig = DistConfig()
    data: DeepCamDataConfig = DeepCamDataConfig()
    model: DeepCamModelConfig = DeepCamModelConfig()
    optimizer: DeepCamOptimizerConfig = DeepCamOptimizerConfig()
    schedule: DeepCamScheduleConfig = DeepCamScheduleConfig()
    loss: DeepCamLossConfig = DeepCamLossConfig()
    train: DeepCamTrainConfig = DeepCamTrainConfig()
    mlperf: MlperfConfig = MlperfConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    system: SystemConfig = SystemConfig()
    tensorboard: TensorBoardConfig = TensorBoardConfig()

    def __post_init__(self):
        check(len(self.loss.class_frequencies) == self.model.num_classes, "loss.class_frequencies",
               list(self.loss.class_frequencies), f"one frequency per class ({self.model.num_classes})")


# ---------------------------------------------------------------------------- the reference
# What a closed-division DeepCAM run must match: the MLCommons reference's model, data and hyperparameters.
#
# `closed_differences(cfg)` lists every setting of a (resolved) config that differs from the reference
# (mlcommons/hpc `deepcam/src/deepCam`: DeepLabv3+ with the aligned-Xception encoder at full width on
# 768 x 1152 x 16 snapshots, min-max normalisation, the class-weighted loss, 121,266 training and 15,158
# validation samples). Hyperparameters count as the reference's when they are those of `configs/deepcam.yaml`
# (its submission settings, the RCP of global batch 2048) or come from an RCP (`optimizer.rcp`, mapped by
# deepcam/rcp.py).


TRAIN_SAMPLES, VAL_SAMPLES = 121266, 15158
TARGET = 0.82
MODEL = DeepCamModelConfig()
LOSS = DeepCamLossConfig()
OPTIMIZER = DeepCamOptimizerConfig(name="LAMB", lr=0.0055, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01,
                                   max_grad_norm=1.0)
SCHEDULE = DeepCamScheduleConfig(type="multistep", warmup_steps=400, warmup_factor=1.0, milestones=(800,),
                                 decay_rate=0.1)


def closed_differences(cfg: DeepCamConfig) -> list[str]:
    """Each way `cfg` is not the reference's run, as "key value (reference value)"; [] for a closed run."""
    found = section_differences("model", cfg.model, MODEL, skip=("deconv",)) + section_differences("loss", cfg.loss, LOSS)
    found += differences([("data.train_samples", cfg.data.train_samples, TRAIN_SAMPLES),
                         ("data.val_samples", cfg.data.val_samples, VAL_SAMPLES),
                         ("data.normalization", cfg.data.normalization, "minmax"),
                         ("train.target", cfg.train.target, TARGET)])
    if not cfg.optimizer.rcp:
        found += section_differences("optimizer", cfg.optimizer, OPTIMIZER, skip=("rcp",))
        found += section_differences("schedule", cfg.schedule, SCHEDULE)
    return found
