"""DeepCAM's optimizers (deepcam/lamb.py) and the reference's learning-rate schedules, step by step.

The reference (mlcommons/hpc deepcam/src/deepCam) builds its scheduler in utils/optimizer_helpers.py
(`get_lr_schedule`): with warm-up steps W > 0 its own MultiStepLRWarmup or CosineAnnealingLRWarmup
(utils/schedulers.py), without warm-up torch's MultiStepLR or CosineAnnealingLR. train.py passes
last_epoch = the start step, 0 in a fresh run, to all of them but CosineAnnealingLR, and a torch scheduler's
constructor already steps once; driver/trainer.py then calls scheduler.step() after every optimizer step.
So optimizer step k (0-based) runs at the scheduler's value for epoch k + 1 (k for CosineAnnealingLR).
"""
from __future__ import annotations

import dataclasses
import math
import numbers

from deepcam.config import DeepCamOptimizerConfig, DeepCamScheduleConfig


@dataclasses.dataclass(frozen=True)
class StepSchedule:
    """The rate the reference's scheduler gives each optimizer step of a fresh run.

    With lr the start rate, W the warm-up steps, f the warm-up factor, gamma the decay rate, T = t_max and
    t = k + 1 for optimizer step k = 0, 1, ...:
    - warm-up (W > 0, t < W): lr * t / W when f = 1, else lr * (1 + (f - 1) * t / W);
    - then the rate stays at the plateau P, the warm-up value of t = W - 1 (lr when W = 1): the reference's
      warm-up classes keep the rate they find at t = W, set one step earlier, so P = lr * (W - 1) / W for f = 1;
    - multistep: P * gamma^n, n the milestones m with m + W + 1 <= t, so step W + m is the first decayed;
    - cosine: eta_min + (A - eta_min) * (1 + cos(pi * e / T)) / 2 with e = t - W, A = P while e <= T and
      A = lr after (the recursion of torch's CosineAnnealingLR that the reference copies restarts from lr):
      the rate rises again after T, it does not stay at eta_min;
    - without warm-up (W = 0; f is ignored): MultiStepLR gives lr * gamma^n, n the milestones m <= k + 1;
      CosineAnnealingLR, built with the default last_epoch, gives the cosine above with A = lr and e = k.
    """

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
        """The rate after warm-up, before any decay (the plateau P)."""
        return self._warm(self.warmup_steps - 1) if self.warmup_steps >= 2 else self.lr

    def at_step(self, step: int) -> float:
        """The rate of optimizer step `step` (0-based, a whole number)."""
        k = _whole_step(step)
        if self.warmup_steps == 0:
            if self.kind == "multistep":
                return self.lr * self.decay_rate ** sum(m <= k + 1 for m in self.milestones)
            return self._cosine(self.lr, k)
        t = k + 1
        if t < self.warmup_steps:
            return self._warm(t)
        after = t - self.warmup_steps
        if self.kind == "multistep":
            return self.peak_lr * self.decay_rate ** sum(m + 1 <= after for m in self.milestones)
        return self._cosine(self.peak_lr if after <= self.t_max else self.lr, after)

    def per_epoch(self, steps_per_epoch: int):
        """The schedule as the training loop calls it: a function of the fractional 0-based epoch, which the
        loop evaluates at epoch + step / steps_per_epoch before step `step` (rounded back to that step)."""
        return lambda epoch: self.at_step(round(epoch * steps_per_epoch))

    def _warm(self, t: int) -> float:
        if self.warmup_factor == 1.0:
            return self.lr * t / self.warmup_steps
        return self.lr * (1.0 + (self.warmup_factor - 1.0) * t / self.warmup_steps)

    def _cosine(self, amplitude: float, e: int) -> float:
        return self.eta_min + (amplitude - self.eta_min) * (1.0 + math.cos(math.pi * e / self.t_max)) / 2.0


def _whole_step(step) -> int:
    if not isinstance(step, numbers.Real) or step != int(step) or step < 0:
        raise ValueError(f"optimizer step {step!r}: expected a whole number >= 0")
    return int(step)


def build_optimizer(cfg: DeepCamOptimizerConfig, initial_lr: float):
    """The reference's optimizer for `cfg.name`: apex FusedLAMB, torch AdamW or torch Adam (deepcam/lamb.py)."""
    from deepcam.lamb import ApexLamb, TorchAdam
    beta_1, beta_2 = cfg.betas
    common = dict(learning_rate=initial_lr, beta_1=beta_1, beta_2=beta_2, epsilon=cfg.eps,
                  weight_decay=cfg.weight_decay)
    if cfg.name == "LAMB":
        return ApexLamb(**common, max_grad_norm=cfg.max_grad_norm)
    # Keras' own names (adam, adamw, lamb) keep the variable paths checkpoints record.
    return TorchAdam(**common, decoupled=cfg.name == "AdamW", name=cfg.name.lower())


def mlperf_optimizer_keys(opt: DeepCamOptimizerConfig, sched: DeepCamScheduleConfig) -> dict:
    """The opt_* and scheduler_* keys of the hpc 3.0.0 DeepCAM rules, with this run's values.

    As the reference, every entry of the optimizer's parameter group is logged: for LAMB apex's
    bias_correction and grad_averaging (both on here, as the rules require) and max_grad_norm; for Adam
    and AdamW torch's amsgrad (off)."""
    keys = {"opt_name": opt.name, "opt_lr": opt.lr, "opt_betas": list(opt.betas), "opt_eps": opt.eps,
            "opt_weight_decay": opt.weight_decay}
    if opt.name == "LAMB":
        keys |= {"opt_bias_correction": True, "opt_grad_averaging": True, "opt_max_grad_norm": opt.max_grad_norm}
    else:
        keys |= {"opt_amsgrad": False}
    keys |= {"scheduler_type": sched.type, "scheduler_lr_warmup_steps": sched.warmup_steps,
             "scheduler_lr_warmup_factor": sched.warmup_factor}
    if sched.type == "multistep":
        keys |= {"scheduler_milestones": list(sched.milestones), "scheduler_decay_rate": sched.decay_rate}
    else:
        keys |= {"scheduler_t_max": sched.t_max, "scheduler_eta_min": sched.eta_min}
    return keys
