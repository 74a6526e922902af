"""DeepCAM's optimizers (LAMB, AdamW, Adam) and step-based learning-rate schedules.

The schedule follows the reference's warm-up schedulers, counted in optimizer steps: a linear
warm-up over `warmup_steps` (from 0 to `lr` when `warmup_factor` is 1, otherwise from `lr` to
`lr * warmup_factor`), then either multistep decay (times `decay_rate` at each milestone,
milestones counted from the end of warm-up) or cosine annealing from the peak to `eta_min`
over `t_max` steps.
"""
from __future__ import annotations

import bisect
import dataclasses
import math

from deepcam.config import DeepCamOptimizerConfig, DeepCamScheduleConfig


@dataclasses.dataclass(frozen=True)
class StepSchedule:
    """Learning rate as a function of the optimizer step (0-based, fractional allowed)."""

    lr: float
    warmup_steps: int
    warmup_factor: float
    kind: str  # "multistep" or "cosine_annealing"
    milestones: tuple[int, ...] = ()
    decay_rate: float = 0.1
    t_max: int = 1
    eta_min: float = 0.0

    @classmethod
    def from_config(cls, opt: DeepCamOptimizerConfig, sched: DeepCamScheduleConfig) -> "StepSchedule":
        return cls(opt.lr, sched.warmup_steps, sched.warmup_factor, sched.type, tuple(sched.milestones),
                   sched.decay_rate, sched.t_max, sched.eta_min)

    @property
    def peak_lr(self) -> float:
        return self.lr * self.warmup_factor

    def at_step(self, step: float) -> float:
        if step < self.warmup_steps:
            frac = step / self.warmup_steps
            if self.warmup_factor == 1.0:
                return self.lr * frac
            return self.lr * (1.0 + (self.warmup_factor - 1.0) * frac)
        after = step - self.warmup_steps
        if self.kind == "multistep":
            return self.peak_lr * self.decay_rate ** bisect.bisect_right(self.milestones, after)
        after = min(after, self.t_max)
        return self.eta_min + (self.peak_lr - self.eta_min) * (1 + math.cos(math.pi * after / self.t_max)) / 2

    def per_epoch(self, steps_per_epoch: int):
        """The schedule as the training loop calls it: a function of the fractional 0-based epoch."""
        return lambda epoch: self.at_step(epoch * steps_per_epoch)


def build_optimizer(cfg: DeepCamOptimizerConfig, initial_lr: float):
    """The Keras 3 optimizer the config names, with the reference's epsilon and decoupled weight decay."""
    import keras
    beta_1, beta_2 = cfg.betas
    common = dict(learning_rate=initial_lr, beta_1=beta_1, beta_2=beta_2, epsilon=cfg.eps)
    if cfg.name == "LAMB":
        # apex FusedLAMB (the reference) clips the global gradient norm at max_grad_norm.
        return keras.optimizers.Lamb(**common, weight_decay=cfg.weight_decay or None,
                                     global_clipnorm=cfg.max_grad_norm)
    if cfg.name == "AdamW":
        return keras.optimizers.AdamW(**common, weight_decay=cfg.weight_decay)
    return keras.optimizers.Adam(**common, weight_decay=cfg.weight_decay or None)


def mlperf_optimizer_keys(opt: DeepCamOptimizerConfig, sched: DeepCamScheduleConfig) -> dict:
    """The opt_* and scheduler_* keys of the hpc 3.0.0 DeepCAM rules, with this run's values."""
    keys = {"opt_name": opt.name, "opt_lr": opt.lr, "opt_betas": list(opt.betas), "opt_eps": opt.eps,
            "opt_weight_decay": opt.weight_decay}
    if opt.name == "LAMB":
        keys |= {"opt_bias_correction": True, "opt_grad_averaging": True, "opt_max_grad_norm": opt.max_grad_norm}
    keys |= {"scheduler_type": sched.type, "scheduler_lr_warmup_steps": sched.warmup_steps,
             "scheduler_lr_warmup_factor": sched.warmup_factor}
    if sched.type == "multistep":
        keys |= {"scheduler_milestones": list(sched.milestones), "scheduler_decay_rate": sched.decay_rate}
    else:
        keys |= {"scheduler_t_max": sched.t_max, "scheduler_eta_min": sched.eta_min}
    return keys
