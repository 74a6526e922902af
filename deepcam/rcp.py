"""DeepCAM's reference convergence points: `with_rcp(cfg, global_batch)` gives the config the hyperparameters of a
reference convergence point (`optimizer.rcp=deepcam_ref_512`). The RCP keys are the MLPerf log's (opt_*,
scheduler_*), which name this config's optimizer and schedule fields one for one. Some RCPs spell numbers as strings
("0.1", "9000"); they are read as numbers.
"""
from __future__ import annotations

import dataclasses

from common.base.errors import BenchError
from common.base.rcp import Rcp, requested_rcp
from deepcam.config import DeepCamConfig


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
