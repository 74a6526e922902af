"""Train CosmoFlow to its quality target: `python cosmoflow/train.py CONFIG [key=value ...]`.

Runs alone or under `horovodrun -np N`. Writes into run.output_dir: config.yaml (resolved),
mlperf.log (MLPerf HPC events, rank 0), summary.json and io_report.json. Exit codes: 0 target reached,
1 target not reached within train.max_epochs, 2 bad input or config, 3 non-finite loss,
75 stopped by SIGTERM or SIGUSR1 (after a checkpoint; resume with checkpoint.resume=true).
With parallel.spatial=[pd,ph] (pd * ph > 1) groups of pd * ph ranks split every sample's cube
between them through Mesh-TensorFlow and the groups train data-parallel (cosmoflow/mesh/, docs/mesh.md);
with dist.elastic.enabled=true ranks may die or join (docs/faults.md).
"""
from __future__ import annotations

import dataclasses
import sys

from common.base.errors import BenchError
from common.runtime import run
from common.runtime.dist import DistEnv, StopRequests
from common.runtime.loop import Trainee
from common.runtime.strategy import DataParallel, for_precision, precision_keys, set_precision
from cosmoflow.config import CosmoConfig, closed_differences, with_rcp
from cosmoflow.data import build_datasets, files_read, read_error
from cosmoflow.schedule import LRSchedule, sgd_keys


def main(argv=None) -> int:
    return run.main(APP, __doc__, train, argv)


def train(config: str, overrides: list[str], stop: StopRequests) -> int:
    """One MLPerf run of CosmoFlow (common/runtime/run.py runs the phases); returns the exit code. `stop`: the
    stop signals, handled since main() began."""
    return run.run_benchmark(APP, config, overrides, stop)


def strategy_for(cfg: CosmoConfig, dist: DistEnv) -> DataParallel:
    """The hybrid Mesh-TF strategy when parallel.spatial splits the cube, else data parallel (or elastic)."""
    if not cfg.parallel.hybrid:
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


APP = run.App(name="cosmoflow", config=CosmoConfig, build=build, input=input_pipeline,
              hyperparameters=hyperparameters, rank_files=rank_files, read_error=read_error, with_rcp=with_rcp,
              closed_differences=closed_differences, learning_rates=learning_rates, strategy=strategy_for)

if __name__ == "__main__":
    sys.exit(main())
