"""DeepCAM's export hooks for `python -m common.export` (docs/export.md)."""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from common.export import App, direct_reads, first_batch
from common.runtime.dist import DistEnv
from deepcam.config import DeepCamConfig
from deepcam.model import build_model


def _model(cfg: DeepCamConfig) -> Any:
    return build_model(**dataclasses.asdict(cfg.model))


def _inputs(cfg: DeepCamConfig, samples: int) -> np.ndarray:
    from deepcam.data import build_datasets
    data = build_datasets(direct_reads(cfg.data), cfg.model.input_shape, samples, DistEnv(), cfg.run.seed)
    return first_batch(data.val)


APP = App(lambda: DeepCamConfig, _model, _inputs)
