"""Train CosmoFlow to its quality target: `python cosmoflow/train.py CONFIG [key=value ...]`.

Runs alone or under `horovodrun -np N`. Writes into run.output_dir: config.yaml (resolved),
mlperf.log (MLPerf HPC events, rank 0) and summary.json. Exit codes: 0 target reached,
1 target not reached within train.max_epochs, 2 bad input or config, 3 non-finite loss,
75 stopped by SIGTERM or SIGUSR1 (after a checkpoint; resume with checkpoint.resume=true).
With parallel.spatial=[pd,ph] (pd * ph > 1) groups of pd * ph ranks split every sample's cube
between them through Mesh-TensorFlow and the groups train data-parallel (cosmoflow/mesh/, docs/mesh.md).
"""
from __future__ import annotations

import dataclasses
import sys

from common.app import Application, Built, run_application
from common.errors import BenchError
from common.dist import DistEnv
from common.loop import Datasets
from cosmoflow.data import build_datasets, files_read, read_error
from common.mllog import sgd_keys
from common.schedule import LRSchedule
from cosmoflow.config import CosmoConfig
from cosmoflow.mesh.groups import GroupLayout, check_hybrid, data_view, group_layout


def check(cfg: CosmoConfig, dist: DistEnv) -> None:
    """Before any work: the hybrid path's partitioning must fit the cube and the ranks."""
    if cfg.parallel.hybrid and cfg.dist.elastic.enabled:
        raise BenchError(f"dist.elastic.enabled=true with parallel.spatial={list(cfg.parallel.spatial)}: the hybrid "
                         f"Mesh-TF path cannot change its rank count; elastic runs need parallel.spatial=[1, 1]")
    if cfg.parallel.hybrid:
        check_hybrid(cfg, dist.size)


def build_everything(cfg: CosmoConfig, dist: DistEnv) -> Built:
    """Model, optimizer and learning-rate schedule for this rank (in init: no data is read)."""
    if not cfg.parallel.hybrid:
        return build_keras(cfg, seed=cfg.run.seed + dist.rank, replicas=dist.size)
    from cosmoflow.mesh.hybrid import hybrid_built
    layout = _layout(cfg, dist)
    return hybrid_built(cfg, dist, layout, build_keras(cfg, seed=cfg.run.seed + layout.group, replicas=layout.groups))


def build_keras(cfg: CosmoConfig, seed: int, replicas: int) -> Built:
    """The Keras model, SGD and the schedule for a global batch of `replicas` local batches."""
    import keras
    from cosmoflow.model import build_model
    keras.utils.set_random_seed(seed)
    model = build_model(**dataclasses.asdict(cfg.model))
    schedule = LRSchedule.from_config(cfg.optimizer, cfg.schedule,
                                      global_batch=cfg.train.local_batch_size * replicas)
    optimizer = keras.optimizers.SGD(learning_rate=schedule(0.0), momentum=cfg.optimizer.momentum,
                                     weight_decay=cfg.optimizer.weight_decay or None)
    return Built(model, optimizer, schedule=lambda _data: schedule, extra={"schedule": schedule})


def build_data(data_cfg, cfg: CosmoConfig, dist: DistEnv) -> Datasets:
    """This rank's input; on the hybrid path one reader per group, the group's shard (the others get counts)."""
    reader_dist, reads = data_layout(cfg, dist)
    return build_datasets(data_cfg, cfg.model.input_shape, cfg.train.local_batch_size, reader_dist, cfg.run.seed,
                          read=reads)


def data_layout(cfg: CosmoConfig, dist: DistEnv) -> tuple[DistEnv, bool]:
    """The rank layout the input is sharded by, and whether this rank reads."""
    if not cfg.parallel.hybrid:
        return dist, True
    layout = _layout(cfg, dist)
    return data_view(dist, layout), layout.is_leader


def rank_files(cfg: CosmoConfig, manifest, rank: int, ranks: int) -> list[str]:
    drop = cfg.data.uneven_files == "drop"
    if not cfg.parallel.hybrid:
        return files_read(manifest, rank, ranks, cfg.train.local_batch_size, drop)
    layout = group_layout(rank, ranks, cfg.parallel.spatial)
    return files_read(manifest, layout.group, layout.groups, cfg.train.local_batch_size, drop) if layout.is_leader \
        else []


def mlperf_keys(cfg: CosmoConfig, dist: DistEnv, built: Built) -> dict:
    # The seed too: MLPerf's seed checker wants every run of a submission to log its own.
    keys = {"seed": cfg.run.seed} | sgd_keys(cfg.optimizer, cfg.schedule, built.extra["schedule"].warmup_factor) \
        | {"dropout": cfg.model.dropout}
    if not cfg.parallel.hybrid:
        return keys
    from cosmoflow.mesh.hybrid import mlperf_keys as partitioning_keys
    return keys | partitioning_keys(built.extra["layout"])


def loss_and_metric(cfg: CosmoConfig, built: Built):
    from cosmoflow.metrics import MeanAbsoluteError, mse_loss
    return mse_loss, MeanAbsoluteError()


def read_failure(cfg: CosmoConfig, data_cfg, dist: DistEnv, err: Exception) -> Exception:
    return read_error(data_cfg, cfg.train.local_batch_size, data_layout(cfg, dist)[0], err)


def _layout(cfg: CosmoConfig, dist: DistEnv) -> GroupLayout:
    return group_layout(dist.rank, dist.size, cfg.parallel.spatial)


APP = Application(benchmark="cosmoflow", schema=CosmoConfig, metric_name="mae", build=build_everything,
                  build_data=build_data, rank_files=rank_files, mlperf_keys=mlperf_keys, loss_and_metric=loss_and_metric,
                  read_error=read_failure, description=__doc__, check=check)


def main(argv=None) -> int:
    return run_application(APP, argv)


if __name__ == "__main__":
    sys.exit(main())
