"""What a closed-division DeepCAM run must match: the MLCommons reference's model, data and hyperparameters.

`closed_differences(cfg)` lists every setting of a (resolved) config that differs from the reference
(mlcommons/hpc `deepcam/src/deepCam`: DeepLabv3+ with the aligned-Xception encoder at full width on
768 x 1152 x 16 snapshots, min-max normalisation, the class-weighted loss, 121,266 training and 15,158
validation samples). Hyperparameters count as the reference's when they are those of `configs/deepcam.yaml`
(its submission settings, the RCP of global batch 2048) or come from an RCP (`optimizer.rcp`).
"""
from __future__ import annotations

from common.runtime.config import differences, section_differences
from deepcam.config import (DeepCamConfig, DeepCamLossConfig, DeepCamModelConfig, DeepCamOptimizerConfig,
                            DeepCamScheduleConfig)

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
    found = section_differences("model", cfg.model, MODEL) + section_differences("loss", cfg.loss, LOSS)
    found += differences([("data.train_samples", cfg.data.train_samples, TRAIN_SAMPLES),
                         ("data.val_samples", cfg.data.val_samples, VAL_SAMPLES),
                         ("data.normalization", cfg.data.normalization, "minmax"),
                         ("train.target", cfg.train.target, TARGET)])
    if not cfg.optimizer.rcp:
        found += section_differences("optimizer", cfg.optimizer, OPTIMIZER, skip=("rcp",))
        found += section_differences("schedule", cfg.schedule, SCHEDULE)
    return found

