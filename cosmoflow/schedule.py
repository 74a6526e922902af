"""Learning-rate schedule of the MLPerf HPC references: linear scaling, warm-up, step decay.

The peak rate is `base_lr * global_batch / base_batch_size`. During `warmup_epochs` the rate
rises linearly from `base_lr` to the peak; afterwards it is the peak times the factor of the
last decay boundary passed (factors are relative to the peak, as in the reference's
`{32: 0.25, 64: 0.125}`).
"""
from __future__ import annotations

import bisect
import dataclasses

from cosmoflow.config import OptimizerConfig, ScheduleConfig


@dataclasses.dataclass(frozen=True)
class LRSchedule:
    """Learning rate as a function of the (fractional) epoch, 0-based."""

    base_lr: float
    peak_lr: float
    warmup_epochs: int
    decay_epochs: tuple[int, ...]
    decay_factors: tuple[float, ...]

    @classmethod
    def from_config(cls, opt: OptimizerConfig, sched: ScheduleConfig, global_batch: int) -> "LRSchedule":
        peak = opt.base_lr * global_batch / opt.base_batch_size
        return cls(opt.base_lr, peak, sched.warmup_epochs, tuple(sched.decay_epochs), tuple(sched.decay_factors))

    @property
    def warmup_factor(self) -> float:
        """Peak over base rate (the MLPerf key opt_learning_rate_warmup_factor)."""
        return self.peak_lr / self.base_lr

    def __call__(self, epoch: float) -> float:
        if epoch < self.warmup_epochs:
            return self.base_lr + (self.peak_lr - self.base_lr) * epoch / self.warmup_epochs
        passed = bisect.bisect_right(self.decay_epochs, epoch)
        return self.peak_lr * (self.decay_factors[passed - 1] if passed else 1.0)


def sgd_keys(optimizer: OptimizerConfig, schedule: ScheduleConfig, warmup_factor: float) -> dict:
    """CosmoFlow's optimizer keys: SGD with epoch-based warm-up and step decay."""
    return {"gradient_accumulation_steps": 1,
            "opt_name": optimizer.name,
            "opt_base_learning_rate": optimizer.base_lr,
            "opt_learning_rate_warmup_epochs": schedule.warmup_epochs,
            "opt_learning_rate_warmup_factor": warmup_factor,
            "opt_learning_rate_decay_boundary_epochs": list(schedule.decay_epochs),
            "opt_learning_rate_decay_factor": list(schedule.decay_factors),
            "opt_weight_decay": optimizer.weight_decay}
