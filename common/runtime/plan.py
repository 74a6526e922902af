"""`train.py CONFIG [key=value ...] --dry-run [--json] [--ranks N]`: the run resolved and printed, nothing run.

A dry run resolves what a run would use (the config with its overrides and RCP, the ranks and data-parallel
replicas, the global batch, the division the log would declare and why, the hyperparameter keys of the
MLPerf log, the learning rate at the start of every epoch) and exits 0 without reading data or training.
Under a launcher it plans the launched layout; `--ranks N` plans N ranks from a single process.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

from common.base.errors import BenchError
from common.runtime.config import DistConfig, to_dict
from common.runtime.dist import DistEnv, init_distributed


def planned_dist(cfg: DistConfig, ranks: int | None) -> DistEnv:
    """The launched layout, or rank 0 of `ranks` planned ranks (one per node; no Horovod started)."""
    if ranks is None:
        return init_distributed(cfg)
    if ranks < 1:
        raise BenchError(f"--ranks {ranks}: expected a rank count >= 1")
    return DistEnv(rank=0, size=ranks, local_rank=0, local_size=1)


@dataclasses.dataclass(frozen=True)
class Plan:
    benchmark: str
    cfg: Any  # the resolved config (RCP applied, division settled)
    ranks: int
    replicas: int
    differences: Sequence[str]  # why the run is not the reference's ([] for closed)
    hyperparameters: dict  # the keys init logs
    learning_rate_by_epoch: list[float]  # in force at the start of 0-based epochs 0 .. max_epochs - 1

    def as_json(self) -> dict:
        return {"benchmark": self.benchmark, "ranks": self.ranks, "data_parallel_replicas": self.replicas,
                "local_batch_size": self.cfg.train.local_batch_size,
                "global_batch_size": self.cfg.train.local_batch_size * self.replicas,
                "rcp": self.cfg.optimizer.rcp or None, "division": self.cfg.mlperf.division,
                "not_reference": list(self.differences), "hyperparameters": self.hyperparameters,
                "learning_rate_by_epoch": self.learning_rate_by_epoch, "config": to_dict(self.cfg)}


def print_plan(plan: Plan, as_json: bool, dist: DistEnv) -> int:
    """Print the plan on rank 0 (one JSON object with `as_json`); returns exit code 0."""
    if not dist.is_root:
        return 0
    if as_json:
        print(json.dumps(plan.as_json(), indent=1))
        return 0
    doc = plan.as_json()
    print(f"{plan.benchmark} dry run: {plan.ranks} ranks, {plan.replicas} data-parallel replicas, global batch "
          f"{doc['global_batch_size']} ({doc['local_batch_size']} per replica); RCP {doc['rcp'] or 'none'}")
    print(f"division: {plan.cfg.mlperf.division}" + (f" (not the reference's: {'; '.join(plan.differences)})"
                                                     if plan.differences else ""))
    print("hyperparameters: " + ", ".join(f"{k}={v}" for k, v in plan.hyperparameters.items()))
    print("learning rate at the start of each epoch: "
          + " ".join(f"{e}:{lr:.6g}" for e, lr in enumerate(plan.learning_rate_by_epoch)))
    return 0
