"""Reference convergence points (RCPs), as mlperf-logging ships them.

mlperf-logging's `rcp_checker/hpc_<ruleset>/rcps_<benchmark>.json` holds, per RCP name (e.g. `cosmoflow_ref_128`),
the global batch size, the hyperparameters the reference ran with (under their MLPerf log keys) and the epochs its
runs took to converge. `optimizer.rcp` names one (`requested_rcp` loads it); each
application maps the hyperparameters onto its config sections (its rcp.py's `with_rcp`). It is read when a
config is, not by the run's machinery, so it sits in base beside the MLPerf log reader.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from common.base.errors import BenchError

RULESET = "3.0.0"


@dataclasses.dataclass(frozen=True)
class Rcp:
    name: str
    benchmark: str
    global_batch_size: int
    hyperparameters: dict  # MLPerf log key -> value, as the RCP file spells them
    epochs_to_converge: tuple[float, ...]

    def value(self, key: str):
        """One hyperparameter; an error naming the RCP file when it is missing."""
        if key not in self.hyperparameters:
            raise BenchError(f"RCP {self.name} ({rcp_file(self.benchmark)}) has no {key}; it has "
                             f"{sorted(self.hyperparameters)}")
        return self.hyperparameters[key]

    def check_global_batch(self, global_batch: int, how: str) -> None:
        """Refuse a run whose global batch is not the RCP's: its hyperparameters belong to that batch."""
        if global_batch != self.global_batch_size:
            raise BenchError(f"optimizer.rcp={self.name} is for global batch {self.global_batch_size}, this run's "
                             f"is {global_batch} ({how}); choose the ranks and train.local_batch_size to match, "
                             f"or an RCP of this batch: {', '.join(rcp_names(self.benchmark))}")


def rcp_file(benchmark: str, ruleset: str = RULESET) -> Path:
    """The RCP file mlperf-logging ships for `benchmark` under the hpc `ruleset`."""
    import mlperf_logging.rcp_checker as checker
    return Path(checker.__file__).parent / f"hpc_{ruleset}" / f"rcps_{benchmark}.json"


def _records(benchmark: str) -> dict:
    path = rcp_file(benchmark)
    if not path.is_file():
        raise BenchError(f"mlperf-logging has no RCP file {path} for {benchmark} (hpc {RULESET})")
    return json.loads(path.read_text())


def rcp_names(benchmark: str) -> list[str]:
    """The RCP names of `benchmark`, by global batch size."""
    records = _records(benchmark)
    return sorted(records, key=lambda name: records[name]["BS"])


def load_rcp(benchmark: str, name: str) -> Rcp:
    """The RCP called `name`; an error listing the valid names when there is none."""
    records = _records(benchmark)
    if name not in records:
        raise BenchError(f"optimizer.rcp={name!r}: {rcp_file(benchmark)} has no such RCP; expected one of "
                         f"{', '.join(rcp_names(benchmark))}")
    record = records[name]
    return Rcp(name, record["Benchmark"], int(record["BS"]), dict(record["Hyperparams"]),
               tuple(record["Epochs to converge"]))


def requested_rcp(cfg, benchmark: str, global_batch: int) -> Rcp | None:
    """The RCP `cfg.optimizer.rcp` names, refused unless the run's global batch is its; None for no RCP."""
    if not cfg.optimizer.rcp:
        return None
    rcp = load_rcp(benchmark, cfg.optimizer.rcp)
    local = cfg.train.local_batch_size
    rcp.check_global_batch(global_batch, f"train.local_batch_size {local} x {global_batch // local} "
                                         f"data-parallel replicas")
    return rcp
