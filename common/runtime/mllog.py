"""MLPerf HPC logging through `mlperf_logging.mllog`, written by rank 0 only.

One `MLPerfLog` per run writes `:::MLLOG` lines into the run's output directory. Training
code calls it at the points the MLPerf HPC rules define (init, run, staging, epochs,
evaluation, run_stop); model and data builders never do. On ranks other than 0 every call
is a no-op, so callers need no rank checks.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from common.runtime.config import MlperfConfig

RUN_SUCCESS = "success"
RUN_ABORTED = "aborted"


class MLPerfLog:
    """Writes MLPerf events for one run; inert when `enabled` is False (ranks > 0)."""

    def __init__(self, path: str | os.PathLike, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled
        self._mllogger = None
        self._handler = None
        if enabled:
            self._open()

    def follow_root(self, is_root: bool) -> None:
        """After an elastic reset: the new rank 0 continues the log (appending), a former one stops writing."""
        if is_root and not self.enabled:
            self.enabled = True
            self._open(mode="a")
        elif not is_root and self.enabled:
            self.close()
            self.enabled = False

    def _open(self, mode: str = "w") -> None:
        from mlperf_logging.mllog.mllog import MLLogger
        self.path.parent.mkdir(parents=True, exist_ok=True)
        logger = logging.getLogger(f"mlperf.{self.path.resolve()}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        self._handler = logging.FileHandler(self.path, mode=mode)
        logger.addHandler(self._handler)
        # stack offset 2: report the caller of event()/start()/end(), not this module.
        self._mllogger = MLLogger(logger=logger, default_stack_offset=2)

    def event(self, key: str, value: Any = None, **metadata) -> None:
        if self.enabled:
            self._mllogger.event(key=key, value=value, metadata=metadata or None)

    def start(self, key: str, value: Any = None, **metadata) -> None:
        if self.enabled:
            self._mllogger.start(key=key, value=value, metadata=metadata or None)

    def end(self, key: str, value: Any = None, **metadata) -> None:
        if self.enabled:
            self._mllogger.end(key=key, value=value, metadata=metadata or None)

    def close(self) -> None:
        if self._handler is not None:
            self._handler.close()
            logging.getLogger(f"mlperf.{self.path.resolve()}").removeHandler(self._handler)
            self._handler = None

    # -- groups of events the rules require, in the order they must appear
    def submission(self, benchmark: str, cfg: MlperfConfig, cache_cleared: bool) -> None:
        """The submission_* keys and cache_clear (logged with the truth: were caches dropped?)."""
        self.event("submission_benchmark", benchmark)
        self.event("submission_org", cfg.org)
        self.event("submission_division", cfg.division)
        self.event("submission_status", cfg.status)
        self.event("submission_platform", cfg.platform)
        self.event("cache_clear", cache_cleared)

    def events(self, keys: dict) -> None:
        """One event per key, in the dict's order (hyperparameters before init_stop)."""
        for key, value in keys.items():
            self.event(key, value)


def scale_keys(*, nodes: int, accelerators_per_node: int, global_batch_size: int) -> dict:
    """The scale of a run, as the HPC rules name it (logged in init by every benchmark)."""
    return {"number_of_nodes": nodes, "accelerators_per_node": accelerators_per_node,
            "global_batch_size": global_batch_size}


def dataset_keys(*, train_samples: int, eval_samples: int) -> dict:
    """The dataset sizes, logged once the run has read the manifest (after run_start, and staging)."""
    return {"train_samples": train_samples, "eval_samples": eval_samples}
