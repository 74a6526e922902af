"""Horovod under `DistEnv` (common/runtime/dist.py): starting it, and the collectives of a run of several ranks.
With the elastic mode's own (common/runtime/elastic.py, `horovod.tensorflow.elastic`), the one module that imports
Horovod; dist.py imports it only when a launcher started the process. horovod.tensorflow is imported by each function
(as hvd.init() must follow `start`'s environment).
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from common.runtime import hvd_settings
from common.runtime.config import DistConfig


def start(cfg: DistConfig) -> dict:
    """hvd.init() with the config's Horovod settings where the environment sets none; the layout and settings
    as DistEnv fields."""
    settings = hvd_settings.resolve(cfg)
    os.environ.update(settings.values)
    import horovod.tensorflow as hvd
    hvd.init()
    return layout(settings) | dict(horovod=True, settings=settings)


def layout(settings: hvd_settings.HorovodSettings) -> dict:
    """The rank layout Horovod has now (also after an elastic reset re-initialised it) and what it uses of
    `settings` in that layout and build, as DistEnv fields."""
    import horovod.tensorflow as hvd
    used = settings.effective(hvd.size(), hvd.local_size(), bool(hvd.nccl_built() or hvd.ddl_built()))
    return dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                node=hvd.cross_rank(), horovod_used=used)


def allreduce(tensors: Sequence[Any], op: str, elastic: bool) -> list:
    """One grouped (fused) allreduce of `op` ("Average" or "Sum"), or in elastic mode one allreduce per tensor:
    hvd.elastic.run recognises only the failures of per-tensor allreduce, allgather and broadcast."""
    import horovod.tensorflow as hvd
    if elastic:
        return [hvd.allreduce(t, op=getattr(hvd, op)) for t in tensors]
    return hvd.grouped_allreduce(list(tensors), op=getattr(hvd, op))


def allreduce_one(value: Any, op: str, name: str | None) -> Any:
    import horovod.tensorflow as hvd
    return hvd.allreduce(value, op=getattr(hvd, op), name=name)


def broadcast_variables(variables: Sequence[Any], root_rank: int) -> None:
    """Keras 3 variables or tf.Variables; Horovod needs the tf.Variable behind a Keras 3 one."""
    import horovod.tensorflow as hvd
    inner = [getattr(v, "value", v) for v in variables]
    hvd.broadcast_variables([i if hasattr(i, "assign") else v for i, v in zip(inner, variables)], root_rank=root_rank)


def gather_object(obj: Any) -> list:
    import horovod.tensorflow as hvd
    return hvd.allgather_object(obj)


def broadcast_object(obj: Any, root_rank: int) -> Any:
    import horovod.tensorflow as hvd
    return hvd.broadcast_object(obj, root_rank=root_rank)


def barrier() -> None:
    """An allreduce of one scalar (horovod.tensorflow has no barrier)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    hvd.allreduce(tf.zeros(()), op=hvd.Sum, name="barrier")
