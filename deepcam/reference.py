"""What a closed-division DeepCAM run must match: the MLCommons reference's model, data and hyperparameters.

`closed_differences(cfg)` lists every setting of a (resolved) config that differs from the reference
(mlcommons/hpc `deepcam/src/deepCam`: DeepLabv3+ with the aligned-Xception encoder at full width on
768 x 1152 x 16 snapshots, min-max normalisation, the class-weighted loss, 121,266 training and 15,158
validation samples). Hyperparameters count as the reference's when they are those of `configs/deepcam.yaml`
(its submission settings, the RCP of global batch 2048) or come from an RCP (`optimizer.rcp`).

`with_rcp(cfg, global_batch)` gives the config the hyperparameters of a reference convergence point
(`optimizer.rcp=deepcam_ref_512`). The RCP keys are the MLPerf log's (opt_*, scheduler_*), which name this config's
optimizer and schedule fields one for one. Some RCPs spell numbers as strings ("0.1", "9000"); they are read as
numbers.
"""
from __future__ import annotations

import dataclasses

from common.base.errors import BenchError
from common.runtime.config import differences, section_differences
from common.runtime.rcp import Rcp, requested_rcp
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


# ---------------------------------------------------------------------------- reference convergence points
FIXED = {"opt_bias_correction": True, "opt_grad_averaging": True}  # what this LAMB always does (deepcam/lamb.py)


def with_rcp(cfg: DeepCamConfig, global_batch: int) -> DeepCamConfig:
    """`cfg` with every hyperparameter of `optimizer.rcp` (unchanged when it names none); refuses a
    global batch other than the RCP's."""
    rcp = requested_rcp(cfg, "deepcam", global_batch)
    if rcp is None:
        return cfg
    _check_fixed(rcp, cfg)
    get = rcp.value
    optimizer = dataclasses.replace(cfg.optimizer, name=str(get("opt_name")), lr=float(get("opt_lr")),
                                    betas=tuple(float(b) for b in get("opt_betas")), eps=float(get("opt_eps")),
                                    weight_decay=float(get("opt_weight_decay")),
                                    max_grad_norm=float(get("opt_max_grad_norm")))
    kind = str(get("scheduler_type"))
    schedule = dataclasses.replace(cfg.schedule, type=kind, warmup_steps=int(get("scheduler_lr_warmup_steps")),
                                   warmup_factor=float(get("scheduler_lr_warmup_factor")),
                                   **_decay(rcp, kind))
    return dataclasses.replace(cfg, optimizer=optimizer, schedule=schedule)


def _decay(rcp: Rcp, kind: str) -> dict:
    if kind == "multistep":
        return {"milestones": tuple(int(m) for m in rcp.value("scheduler_milestones")),
                "decay_rate": float(rcp.value("scheduler_decay_rate"))}
    return {"t_max": int(float(rcp.value("scheduler_t_max"))), "eta_min": float(rcp.value("scheduler_eta_min"))}


def _check_fixed(rcp: Rcp, cfg: DeepCamConfig) -> None:
    wanted = {**FIXED, "batchnorm_groupsize": cfg.train.batchnorm_group_size,
              "gradient_accumulation_frequency": cfg.train.gradient_accumulation_frequency}
    for key, ours in wanted.items():
        if key in rcp.hyperparameters and rcp.hyperparameters[key] != ours:
            raise BenchError(f"optimizer.rcp={rcp.name}: {key} {rcp.hyperparameters[key]!r}, this implementation "
                             f"runs with {ours!r}")
