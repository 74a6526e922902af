"""Train CosmoFlow to its quality target: `python cosmoflow/train.py CONFIG [key=value ...]`.

Runs alone or under `horovodrun -np N`. Writes into run.output_dir: config.yaml (resolved), mlperf.log (MLPerf HPC
events, rank 0), summary.json and io_report.json. Exit codes: 0 target reached, 1 target not reached within
train.max_epochs, 2 bad input or config, 3 non-finite loss, 4 internal error, 75 stopped by SIGTERM or SIGUSR1 (after
a checkpoint; resume with checkpoint.resume=true). With parallel.spatial=[pd,ph] (pd * ph > 1) groups of pd * ph ranks
split every sample's cube between them through Mesh-TensorFlow and the groups train data-parallel (cosmoflow/mesh/,
docs/mesh.md); with dist.elastic.enabled=true ranks may die or join (docs/faults.md). The reference's learning-rate
schedule (LRSchedule) is the last section.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import math

from common.base.cli import exit_now
from common.base.errors import BenchError
from common.runtime import command, run
from common.runtime.dist import DistEnv, StopRequests
from common.runtime.loop import Trainee
from common.runtime.strategy import DataParallel, for_precision, precision_keys, set_precision
from cosmoflow.config import CosmoConfig, OptimizerConfig, ScheduleConfig, closed_differences
from cosmoflow.data import build_datasets, files_read, split_between_ranks
from cosmoflow.tfdata import read_error
from cosmoflow.rcp import with_rcp


def main(argv=None) -> int:
    return command.main(APP, __doc__, train, argv)


def train(config: str, overrides: list[str], stop: StopRequests) -> int:
    """One MLPerf run of CosmoFlow (common/runtime/run.py runs the phases); returns the exit code. `stop`: the
    stop signals, handled since main() began."""
    return run.run_benchmark(APP, config, overrides, stop)


def strategy_for(cfg: CosmoConfig, dist: DistEnv) -> DataParallel:
    """The hybrid Mesh-TF strategy when parallel.spatial splits the cube, else data parallel (or elastic)."""
    if not cfg.parallel.hybrid or cfg.train.emulated:  # (an emulated run refuses the hybrid path)
        return run.choose_strategy(cfg, dist)
    if cfg.dist.elastic.enabled:
        raise BenchError(f"dist.elastic.enabled=true with parallel.spatial={list(cfg.parallel.spatial)}: the hybrid "
                         f"Mesh-TF path cannot change its rank count; elastic runs need parallel.spatial=[1, 1]")
    from cosmoflow.mesh.hybrid import HybridStrategy
    return HybridStrategy(cfg, dist)


def build(cfg: CosmoConfig, strategy: DataParallel) -> Trainee:
    """The Keras model, SGD and the schedule for a global batch of `strategy.replicas` local batches."""
    import keras
    from cosmoflow.model import MeanAbsoluteError, build_model, mse_loss
    keras.utils.set_random_seed(strategy.model_seed(cfg.run.seed))
    set_precision(cfg.train.precision)  # the Keras policy the model is built under
    model = build_model(**dataclasses.asdict(cfg.model), l2=cfg.optimizer.weight_decay)
    schedule = LRSchedule.from_config(cfg.optimizer, cfg.schedule,
                                      global_batch=cfg.train.local_batch_size * strategy.replicas)
    # Weight decay is the model's L2 penalty on the dense kernels, as the reference's, not the optimizer's.
    optimizer = keras.optimizers.SGD(learning_rate=schedule(0.0), momentum=cfg.optimizer.momentum)
    return Trainee(model, for_precision(optimizer, cfg.train.precision), mse_loss, MeanAbsoluteError(),
                   schedule_for=lambda _data: schedule, jit_compile=cfg.train.jit_compile)


def hyperparameters(cfg: CosmoConfig, strategy: DataParallel) -> dict:
    """The keys the hpc 3.0.0 CosmoFlow rules ask for in init (the scale keys are the run's)."""
    schedule = LRSchedule.from_config(cfg.optimizer, cfg.schedule,
                                      global_batch=cfg.train.local_batch_size * strategy.replicas)
    # The seed too: MLPerf's seed checker wants every run of a submission to log its own.
    return ({"seed": cfg.run.seed} | sgd_keys(cfg.optimizer, cfg.schedule, schedule)
            | {"dropout": cfg.model.dropout} | precision_keys(cfg.train.precision, cfg.train.jit_compile))


def learning_rates(cfg: CosmoConfig, strategy: DataParallel) -> list:
    """The learning rate at the start of each epoch, for the dry run."""
    schedule = LRSchedule.from_config(cfg.optimizer, cfg.schedule, cfg.train.local_batch_size * strategy.replicas)
    return schedule.by_epoch(cfg.train.max_epochs)


def input_pipeline(cfg: CosmoConfig, data_cfg, strategy: DataParallel, seed: int):
    """This rank's input; on the hybrid path a group's ranks read the group's shard, each decoding its block."""
    block = strategy.input_block if cfg.parallel.hybrid else None
    return build_datasets(data_cfg, cfg.model.input_shape, cfg.train.local_batch_size, strategy.input_dist, seed,
                          block=block)


def rank_files(cfg: CosmoConfig, manifest, rank: int, ranks: int) -> list[str]:
    """The dataset paths rank `rank` of `ranks` reads (what data.stage_mode=rank stages)."""
    from cosmoflow.mesh.groups import group_layout
    drop = cfg.data.uneven_files == "drop"
    if not cfg.parallel.hybrid:
        return files_read(manifest, rank, ranks, cfg.train.local_batch_size, drop)
    layout = group_layout(rank, ranks, cfg.parallel.spatial)  # a group's ranks read the group's files
    return files_read(manifest, layout.group, layout.groups, cfg.train.local_batch_size, drop)


def scoring(_cfg: CosmoConfig) -> tuple:
    """The loss, the metric and an untrained model's prediction (zeros): an emulated run's evaluation."""
    from cosmoflow.model import MeanAbsoluteError, mse_loss
    import keras
    return mse_loss, MeanAbsoluteError(), keras.ops.zeros_like


def example_batch(cfg: CosmoConfig) -> tuple:
    """One synthetic local batch of the run's shapes (log1p of Poisson counts, targets in [-1, 1]): what the
    precision probe times a step on."""
    import numpy as np
    import tensorflow as tf
    rng, batch = np.random.default_rng(0), cfg.train.local_batch_size
    x = np.log1p(rng.poisson(20, (batch, *cfg.model.input_shape))).astype(np.float32)
    y = rng.uniform(-1, 1, (batch, cfg.model.target_size)).astype(np.float32)
    return tf.convert_to_tensor(x), tf.convert_to_tensor(y)


APP = run.App(name="cosmoflow", config=CosmoConfig, build=build, input=input_pipeline,
              hyperparameters=hyperparameters, rank_files=rank_files,
              read_error=functools.partial(read_error, split_between_ranks), with_rcp=with_rcp,
              closed_differences=closed_differences, learning_rates=learning_rates, strategy=strategy_for,
              example_batch=example_batch, scoring=scoring)

# ---------------------------------------------------------------------------- the learning-rate schedule
# The MLPerf HPC CosmoFlow reference's (mlcommons/hpc cosmoflow/utils/optimizers.py): peak base_lr x global batch /
# base_batch_size; one rate per 0-based epoch e: warm-up base_lr + e (peak - base_lr) / warmup_epochs, then peak times
# the factor of the largest decay boundary b < e. `schedule.granularity: step` is the suite's per-step variant (ramps
# within epochs, decays from e >= b), logged open. docs/fidelity.md, "learning rate".
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


if __name__ == "__main__":
    exit_now(main())
