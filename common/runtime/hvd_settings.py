"""Horovod's tuning knobs: from config, unless the user's (or the launcher's) environment sets them, and what
Horovod then uses.

hvd.init() reads four environment variables, and the MPI_Init it calls one more of Open MPI's. The config gives
each a value (dist.fusion_threshold_mb, dist.cycle_time_ms, dist.hierarchical_allreduce,
dist.hierarchical_allgather, dist.mpi_yield_when_idle); a variable already set in the environment wins, is
checked, and is named in the run's log and summary.json. Horovod 0.28.1 then ignores
two of them in some layouts (horovod/common/operations.cc): hierarchical allreduce and allgather on a single
node, and hierarchical allreduce in a build without NCCL or DDL GPU allreduce (every CPU build).
`effective()` applies those rules, so the log says what Horovod used, not only what was asked.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Mapping

from common.base.errors import BenchError
from common.runtime.config import DistConfig

FUSION = "HOROVOD_FUSION_THRESHOLD"
CYCLE = "HOROVOD_CYCLE_TIME"
HIER_ALLREDUCE = "HOROVOD_HIERARCHICAL_ALLREDUCE"
HIER_ALLGATHER = "HOROVOD_HIERARCHICAL_ALLGATHER"
MPI_YIELD = "OMPI_MCA_mpi_yield_when_idle"  # Open MPI reads it in MPI_Init, which hvd.init() calls
KNOBS = (FUSION, CYCLE, HIER_ALLREDUCE, HIER_ALLGATHER, MPI_YIELD)
# Open MPI's spellings of a boolean MCA parameter (opal/mca/base/mca_base_var_enum.c), as false and true.
OMPI_FALSE, OMPI_TRUE = ("0", "f", "false", "n", "no", "disabled"), ("1", "t", "true", "y", "yes", "enabled")
# Horovod 0.28.1's cycle time when HOROVOD_CYCLE_TIME is unset (operations.cc, SetCycleTimeMs(1)).
HOROVOD_DEFAULT_CYCLE_MS = 1.0


@dataclasses.dataclass(frozen=True)
class HorovodSettings:
    """The variables hvd.init() reads, as this process sets them, and which of them the environment gave."""

    values: dict = dataclasses.field(default_factory=dict)
    from_environment: tuple = ()

    def effective(self, size: int, local_size: int, gpu_hierarchy_built: bool) -> dict:
        """What Horovod uses with these variables on `size` ranks, `local_size` per node; `gpu_hierarchy_built`:
        Horovod was built with NCCL or DDL allreduce (hvd.nccl_built() or hvd.ddl_built())."""
        multi_node = size != local_size
        cycle = self.values.get(CYCLE)
        return {
            "fusion_threshold_bytes": int(self.values[FUSION]),
            "cycle_time_ms": float(cycle) if cycle is not None else HOROVOD_DEFAULT_CYCLE_MS,
            "hierarchical_allreduce": self.values[HIER_ALLREDUCE] == "1" and multi_node and gpu_hierarchy_built,
            "hierarchical_allgather": self.values[HIER_ALLGATHER] == "1" and multi_node,
            "mpi_yield_when_idle": self.values.get(MPI_YIELD, "0").lower() in OMPI_TRUE,
        }


def from_config(cfg: DistConfig) -> dict[str, str]:
    """The config's values as the environment variables hvd.init() reads.

    Elastic runs leave HOROVOD_CYCLE_TIME at Horovod's default: with it and HOROVOD_FUSION_THRESHOLD both set,
    the hvd.init() of an elastic reset crashed with a segmentation fault here (Horovod 0.28.1, Gloo)."""
    allgather = cfg.hierarchical_allreduce if cfg.hierarchical_allgather is None else cfg.hierarchical_allgather
    settings = {
        FUSION: str(int(cfg.fusion_threshold_mb * 1024 * 1024)),
        CYCLE: f"{cfg.cycle_time_ms:g}",
        HIER_ALLREDUCE: "1" if cfg.hierarchical_allreduce else "0",
        HIER_ALLGATHER: "1" if allgather else "0",
        MPI_YIELD: "1" if cfg.mpi_yield_when_idle else "0",
    }
    if cfg.elastic.enabled:
        del settings[CYCLE]
    return settings


def resolve(cfg: DistConfig, environ: Mapping[str, str] | None = None) -> HorovodSettings:
    """The config's settings with every variable `environ` (os.environ) already sets in its place, checked."""
    environ = os.environ if environ is None else environ
    values = from_config(cfg)
    given = tuple(name for name in KNOBS if name in environ)
    for name in given:
        values[name] = check_value(name, environ[name])
    return HorovodSettings(values=values, from_environment=given)


def check_value(name: str, raw: str) -> str:
    """`raw` as set for `name`, or a BenchError saying what Horovod expects (it would silently read a bad value
    as 0)."""
    text = raw.strip()
    try:
        if name == FUSION:
            ok = int(text) >= 0
        elif name == CYCLE:
            ok = math.isfinite(float(text)) and float(text) > 0
        elif name == MPI_YIELD:
            ok = text.lower() in OMPI_FALSE + OMPI_TRUE
        else:
            ok = text in ("0", "1")
    except ValueError:
        ok = False
    if not ok:
        expected = {FUSION: "an integer number of bytes >= 0", CYCLE: "milliseconds > 0",
                    MPI_YIELD: "one of " + ", ".join(OMPI_FALSE + OMPI_TRUE)}.get(name, "0 or 1")
        raise BenchError(f"environment variable {name}={raw!r}: expected {expected}")
    return text


def describe(settings: HorovodSettings, effective: dict) -> str:
    """The log's words for the settings Horovod uses, naming those the environment set and those it ignores."""
    fusion = effective["fusion_threshold_bytes"] / 2**20
    cycle = f"{effective['cycle_time_ms']:g} ms" + ("" if CYCLE in settings.values else " (Horovod's default)")
    parts = [f"fusion threshold {fusion:g} MiB", f"cycle time {cycle}"]
    for name, key in ((HIER_ALLREDUCE, "hierarchical_allreduce"), (HIER_ALLGATHER, "hierarchical_allgather")):
        asked, used = settings.values[name] == "1", effective[key]
        words = key.replace("_", " ") + (" on" if used else " off")
        parts.append(words + (" (asked for, but Horovod ignores it in this layout or build)" if asked and not used
                              else ""))
    parts.append("Open MPI " + ("yields" if effective["mpi_yield_when_idle"] else "busy-polls") + " when idle")
    text = ", ".join(parts)
    if settings.from_environment:
        text += "; from the environment, over the config: " + ", ".join(
            f"{name}={settings.values[name]}" for name in settings.from_environment)
    return text
