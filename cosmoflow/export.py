"""CosmoFlow's export hooks for `python -m common.export` (docs/export.md)."""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from common.base.errors import BenchError
from common.export import App, direct_reads, first_batch
from common.runtime.dist import DistEnv
from cosmoflow.config import CosmoConfig
from cosmoflow.model import build_model


def _model(cfg: CosmoConfig) -> Any:
    if cfg.parallel.hybrid:
        raise BenchError(f"parallel.spatial={list(cfg.parallel.spatial)}: the hybrid Mesh-TF path keeps its weights "
                         f"in its own layout; only data-parallel CosmoFlow runs (parallel.spatial=[1, 1]) are exported")
    return build_model(**dataclasses.asdict(cfg.model), l2=cfg.optimizer.weight_decay)


def _inputs(cfg: CosmoConfig, samples: int) -> np.ndarray:
    from cosmoflow.data import build_datasets
    data = build_datasets(direct_reads(cfg.data), cfg.model.input_shape, samples, DistEnv(), cfg.run.seed)
    return first_batch(data.val)


APP = App(lambda: CosmoConfig, _model, _inputs)
