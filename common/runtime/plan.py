"""`train.py CONFIG [key=value ...] --dry-run [--json] [--ranks N]`: the run resolved and printed, nothing run.

A dry run resolves what a run would use (the config with its overrides and RCP, the ranks and data-parallel
replicas, the global batch, the division the log would declare and why, the hyperparameter keys of the
MLPerf log, the learning rate at the start of every epoch) and exits 0 without reading data or training.
Under a launcher it plans the launched layout; `--ranks N` plans N ranks from a single process.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Sequence

from common.base.errors import BenchError
from common.runtime.config import DistConfig, load_config, resolve, to_dict
from common.runtime.dist import DistEnv, init_distributed
from common.runtime import precision


def dry_run(app: Any, strategy_for: Callable[[Any, DistEnv], Any], config: str, overrides: list[str],
            ranks: int | None, as_json: bool) -> int:
    """Print what a run of `config` would use; nothing trained. `app`: the application's common/runtime/run.App;
    `strategy_for`: the strategy a run would choose (cfg, dist) -> DataParallel."""
    cfg = load_config(config, overrides, app.config)
    dist = planned_dist(cfg.dist, ranks)
    strategy = strategy_for(cfg, dist)
    cfg = resolve(cfg, strategy.replicas, app.with_rcp, app.closed_differences)
    choice = planned_precision(app, cfg, dist)
    cfg = precision.with_precision(cfg, choice["precision"]) if choice["precision"] != "auto" else cfg
    doc = plan(app.name, cfg, dist.size, strategy.replicas, app.closed_differences(cfg),
               app.hyperparameters(cfg, strategy), app.learning_rates(cfg, strategy))
    doc |= {"precision": choice["precision"], "precision_reason": choice["reason"]}
    return print_plan(doc, as_json, dist)


def planned_precision(app: Any, cfg: Any, dist: Any) -> dict:
    """What a run would choose, for the dry run: never probes (the cached probe, else auto left unresolved)."""
    if cfg.train.precision != "auto":
        return precision.explicit(cfg.train.precision, dist.gpu)
    if getattr(getattr(cfg, "parallel", None), "hybrid", False):
        return precision.decide_auto(app, cfg, dist, "", [])
    seconds = precision.cached_steps(precision.probe_key(app.name, cfg, dist.threads, dist.gpu))
    if seconds is None:
        return {"precision": "auto", "reason": f"not probed on this host for this shape and batch yet: the run "
                                              f"probes first ({precision.cache_path()})", "step_seconds": {},
                "epochs_ratio": None}
    return precision.decide(seconds, precision.epochs_ratio(app.name))


def planned_dist(cfg: DistConfig, ranks: int | None) -> DistEnv:
    """The launched layout, or rank 0 of `ranks` planned ranks (one per node; no Horovod started)."""
    if ranks is None:
        return init_distributed(cfg)
    if ranks < 1:
        raise BenchError(f"--ranks {ranks}: expected a rank count >= 1")
    return DistEnv(rank=0, size=ranks, local_rank=0, local_size=1)


def plan(benchmark: str, cfg: Any, ranks: int, replicas: int, differences: Sequence[str], hyperparameters: dict,
         learning_rates: list[float]) -> dict:
    """What a run of the resolved `cfg` (RCP applied, division settled) would use: `differences` say why it is not
    the reference's run ([] for closed), `hyperparameters` are the keys init logs, `learning_rates` those in force
    at the start of 0-based epochs 0 .. max_epochs - 1."""
    local = cfg.train.local_batch_size
    return {"benchmark": benchmark, "ranks": ranks, "data_parallel_replicas": replicas, "local_batch_size": local,
            "global_batch_size": local * replicas, "rcp": cfg.optimizer.rcp or None, "division": cfg.mlperf.division,
            "not_reference": list(differences), "hyperparameters": hyperparameters,
            "learning_rate_by_epoch": learning_rates, "config": to_dict(cfg)}


def print_plan(doc: dict, as_json: bool, dist: DistEnv) -> int:
    """Print a plan on rank 0 (one JSON object with `as_json`); returns exit code 0."""
    if not dist.is_root:
        return 0
    if as_json:
        print(json.dumps(doc, indent=1))
        return 0
    differences = doc["not_reference"]
    print(f"{doc['benchmark']} dry run: {doc['ranks']} ranks, {doc['data_parallel_replicas']} data-parallel "
          f"replicas, global batch {doc['global_batch_size']} ({doc['local_batch_size']} per replica); RCP "
          f"{doc['rcp'] or 'none'}")
    print(f"division: {doc['division']}" + (f" (not the reference's: {'; '.join(differences)})" if differences else ""))
    print(f"precision: {doc['precision']} ({doc['precision_reason']})")
    print("hyperparameters: " + ", ".join(f"{k}={v}" for k, v in doc["hyperparameters"].items()))
    print("learning rate at the start of each epoch: "
          + " ".join(f"{e}:{lr:.6g}" for e, lr in enumerate(doc["learning_rate_by_epoch"])))
    return 0
