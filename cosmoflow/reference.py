"""What a closed-division CosmoFlow run must match: the MLCommons reference's model, data and hyperparameters.

`closed_differences(cfg)` lists every setting of a (resolved) config that differs from the reference
(mlcommons/hpc `cosmoflow/configs/cosmo.yaml`, `models/cosmoflow.py`, the hpc 3.0.0 dataset of 524,288
training and 65,536 validation samples). Hyperparameters count as the reference's when they are its
defaults or come from an RCP (`optimizer.rcp`); the logged division is closed only when the list is empty
(common/runtime/config.py `resolve_division`).
"""
from __future__ import annotations

from common.runtime.config import differences, section_differences
from cosmoflow.config import CosmoConfig, CosmoModelConfig, OptimizerConfig, ScheduleConfig

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

