"""What a run records of itself: where it stands (`Progress`, which checkpoints save), how it ended (`FitResult`),
the run summary (summary.json) that campaigns and reports read (through common/campaign/summary.py), its exit code,
and its MLPerf log (`MLPerfLog`, the last section).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import statistics
from pathlib import Path
from typing import Any

from common.base import exits
from common.base.documents import Figure, check
from common.base.files import write_json_atomic
from common.runtime.config import MlperfConfig, to_dict


PARTIAL_KEYS = ("loss_sum", "seconds")  # Progress.partial: the running sums of the epoch in progress


@dataclasses.dataclass
class Progress:
    """Where a run stands: `epoch` is the epoch to run next (or the one in progress when `step` > 0)."""

    epoch: int = 1
    step: int = 0  # optimizer steps of `epoch` already done
    # the epochs' figures, each with its "epoch" (NaN is a figure too: an evaluation can give one)
    history: list[dict[str, int | Figure]] = dataclasses.field(default_factory=list)
    partial: dict[str, float] = dataclasses.field(default_factory=dict)  # the epoch's running sums, PARTIAL_KEYS
    earlier_seconds: float = 0.0  # training time (run_start .. run_stop) of the attempts before this one
    attempt: int = 1  # 1 for a run that starts from scratch; +1 for each resume

    def __post_init__(self):
        for key in ("epoch", "attempt"):
            check(getattr(self, key) >= 1, key, getattr(self, key), "an integer >= 1")
        check(self.step >= 0, "step", self.step, "an integer >= 0")
        check(self.earlier_seconds >= 0, "earlier_seconds", self.earlier_seconds, "a number >= 0")
        check(set(self.partial) <= set(PARTIAL_KEYS), "partial", sorted(self.partial),
              f"keys among {list(PARTIAL_KEYS)}")
        check(self.partial.get("seconds", 0) >= 0, "partial.seconds", self.partial.get("seconds"), "a number >= 0")
        for i, record in enumerate(self.history):
            epoch = record.get("epoch")
            check(type(epoch) is int and epoch >= 1, f"history[{i}].epoch", epoch, "an integer >= 1")

    def global_step(self, steps_per_epoch: int) -> int:
        return (self.epoch - 1) * steps_per_epoch + self.step


@dataclasses.dataclass
class FitResult:
    """How a training ended (the loop's answer); summary.json and the exit code are made from it."""

    status: str  # RUN_SUCCESS or RUN_ABORTED
    reason: str
    epochs: int
    metric: float | None
    history: list[dict]
    train_seconds: float
    stopped: bool = False  # by a stop signal (exit code 75)
    non_finite: bool = False  # by a non-finite training loss (exit code 3)
    checkpoint: str = ""  # the checkpoint written when it stopped


def exit_code(result: FitResult) -> int:
    """The run's exit code, from how it ended (never from the text of its reason)."""
    if result.status == RUN_SUCCESS:
        return exits.SUCCESS
    if result.stopped:
        return exits.STOPPED
    return exits.NON_FINITE_LOSS if result.non_finite else exits.TARGET_NOT_REACHED


def throughput(history: list[dict]) -> dict:
    """Training samples/s: all epochs, and steady state (epochs after the first, which traces)."""
    rates = [h["samples_per_second"] for h in history if math.isfinite(h.get("samples_per_second", math.nan))]
    steady = rates[1:] or rates
    return {"samples_per_second_first_epoch": rates[0] if rates else None,
            "samples_per_second_steady": statistics.mean(steady) if steady else None}


def run_summary(run: Any, result: FitResult, metric_name: str, replicas: int) -> dict:
    """The run's summary.json; `run`: the common/runtime/run.Run (benchmark, cfg, dist, data, time_to_train);
    `replicas`: the data-parallel replicas (the strategy's)."""
    cfg, data = run.cfg, run.data
    return {
        "benchmark": run.benchmark,
        "status": result.status,
        "reason": result.reason,
        "time_to_train_seconds": run.time_to_train,
        "epochs": result.epochs,
        "metric_name": metric_name,
        "final_metric": result.metric,
        "target": cfg.train.target,
        **throughput(result.history),
        **layout(run.dist),
        "global_batch_size": data.local_batch_size * replicas,
        "train_samples": data.train_samples,
        "eval_samples": data.val_samples,
        "loader": data.loader or cfg.data.loader,  # the one data.loader (auto, tfdata, dali) resolved to
        "history": result.history,
        "config": to_dict(cfg),
    }


def layout(dist: Any) -> dict:
    """The summary fields of the rank layout (`dist`: the run's DistEnv)."""
    return {
        "ranks": dist.size,
        "nodes": dist.num_nodes,
        "threads_per_rank": dist.threads,
        "gpu": dist.gpu,
        # The HOROVOD_* variables hvd.init() read, those the environment set over the config, what Horovod used.
        "horovod": {"settings": dist.settings.values, "from_environment": list(dist.settings.from_environment),
                    "used": dist.horovod_used} if dist.horovod else None,
    }


def write_summary(summary: dict, output_dir: str | Path) -> Path:
    return write_json_atomic(summary, Path(output_dir) / "summary.json")


# ---------------------------------------------------------------------------- the MLPerf log
# MLPerf HPC logging through `mlperf_logging.mllog`, written by rank 0 only.
#
# One `MLPerfLog` per run writes `:::MLLOG` lines into the run's output directory. Training
# code calls it at the points the MLPerf HPC rules define (init, run, staging, epochs,
# evaluation, run_stop); model and data builders never do. On ranks other than 0 every call
# is a no-op, so callers need no rank checks.
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
