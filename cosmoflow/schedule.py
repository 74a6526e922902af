"""Learning-rate schedule of the MLPerf HPC CosmoFlow reference: linear scaling, warm-up, step decay.

The peak rate is `base_lr * global_batch / base_batch_size`. The reference (mlcommons/hpc
`cosmoflow/utils/optimizers.py`, through Keras' `LearningRateScheduler`) sets the rate once, at the start
of each 0-based epoch `e`:

- `e < warmup_epochs`: `base_lr + e * (peak - base_lr) / warmup_epochs`;
- otherwise `peak * f`, where `f` is the factor of the largest decay boundary `b` with `b < e` (strictly),
  1 before the first boundary. Factors are relative to the peak, as the reference's `{32: 0.25, 64: 0.125}`.

That is the default (`schedule.granularity: epoch`). `schedule.granularity: step` is this suite's variant:
the warm-up ramps at every step over the fractional epoch, and a decay applies from `epoch >= b`, one
epoch before the reference's. It is not the reference's rule: a run using it is logged open
(cosmoflow/division.py) and the MLPerf log names it (`opt_learning_rate_schedule_granularity`).
"""
from __future__ import annotations

import bisect
import dataclasses
import math

from cosmoflow.config import OptimizerConfig, ScheduleConfig


@dataclasses.dataclass(frozen=True)
class LRSchedule:
    """Learning rate as a function of the (fractional) epoch, 0-based."""

    base_lr: float
    peak_lr: float
    warmup_epochs: int
    decay_epochs: tuple[int, ...]
    decay_factors: tuple[float, ...]
    per_step: bool = False  # True: schedule.granularity=step, the suite's variant (module docstring)

    @classmethod
    def from_config(cls, opt: OptimizerConfig, sched: ScheduleConfig, global_batch: int) -> "LRSchedule":
        peak = opt.base_lr * global_batch / opt.base_batch_size
        return cls(opt.base_lr, peak, sched.warmup_epochs, tuple(sched.decay_epochs), tuple(sched.decay_factors),
                   per_step=sched.granularity == "step")

    @property
    def warmup_factor(self) -> float:
        """Peak over base rate (the MLPerf key opt_learning_rate_warmup_factor)."""
        return self.peak_lr / self.base_lr

    def __call__(self, epoch: float) -> float:
        return self._per_step(epoch) if self.per_step else self._per_epoch(math.floor(epoch))

    def by_epoch(self, epochs: int) -> list[float]:
        """The rates in force at the start of 0-based epochs 0 .. epochs - 1."""
        return [self(float(e)) for e in range(epochs)]

    def _per_epoch(self, e: int) -> float:
        if e < self.warmup_epochs:
            return self.base_lr + e * (self.peak_lr - self.base_lr) / self.warmup_epochs
        passed = bisect.bisect_left(self.decay_epochs, e)  # boundaries b < e
        return self.peak_lr * (self.decay_factors[passed - 1] if passed else 1.0)

    def _per_step(self, epoch: float) -> float:
        if epoch < self.warmup_epochs:
            return self.base_lr + (self.peak_lr - self.base_lr) * epoch / self.warmup_epochs
        passed = bisect.bisect_right(self.decay_epochs, epoch)  # boundaries b <= epoch
        return self.peak_lr * (self.decay_factors[passed - 1] if passed else 1.0)


def sgd_keys(optimizer: OptimizerConfig, schedule: ScheduleConfig, lr: LRSchedule) -> dict:
    """CosmoFlow's optimizer keys, with the reference's meanings.

    The reference logs the scaled rate, the one warm-up reaches, as `opt_base_learning_rate` (its code
    notes the naming mismatch) and the scaling factor as `opt_learning_rate_warmup_factor`; the RCPs of
    mlperf-logging record those values, so this log does the same."""
    keys = {"gradient_accumulation_steps": 1,
            "opt_name": "SGD",
            "opt_base_learning_rate": lr.peak_lr,
            "opt_learning_rate_warmup_epochs": schedule.warmup_epochs,
            "opt_learning_rate_warmup_factor": lr.warmup_factor,
            "opt_learning_rate_decay_boundary_epochs": list(schedule.decay_epochs),
            "opt_learning_rate_decay_factor": list(schedule.decay_factors),
            "opt_weight_decay": optimizer.weight_decay}
    if schedule.granularity != "epoch":
        keys["opt_learning_rate_schedule_granularity"] = schedule.granularity
    return keys
