"""How long staging will take, for the estimate of init's length: the bytes one node stages over the rate its
copier reaches. A run prints it before it stages (common/runtime/run.py) and `jobs render` for a site's job.

The hpc 3.0.0 checker refuses an `init_stop` 30 minutes or more after the first `init_start`, and with
`data.stage_timing: in_init` (the default) staging is inside init: the estimate warns past WARN_SECONDS.

The rate is `data.stage_rate_gb_s` (a site's `stage_rate_gb_s`) when it is set, else the one
benchmarks/staging_throughput.py measured on this machine kind: its slowest case of the same source (plain, or a
packed copy's compression) and mode (node_share stages as node does). That benchmark reads its sources from the
page cache, so from a shared file system staging may well be slower: the estimate is then a lower bound.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

INIT_LIMIT_SECONDS = 30 * 60  # hpc 3.0.0: init_stop within 30 minutes of the first init_start
WARN_SECONDS = 25 * 60
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results/staging_throughput.json"


@dataclasses.dataclass(frozen=True)
class Rate:
    gb_s: float  # 1e9 bytes per second, one node
    source: str  # where the figure comes from, for the message


def measured(kind: str, mode: str, results: Path = RESULTS) -> Rate | None:
    """The staging benchmark's slowest rate for source `kind` (plain, zstd, gzip, none) and staging `mode`;
    None when it holds no such case (or cannot be read)."""
    try:
        found = json.loads(results.read_text())
        cases = [c for c in found["cases"] if c["method"] == "staging" and c["source"] == kind
                 and c["mode"] == ("node" if mode == "node_share" else mode)]
        slowest = min(cases, key=lambda c: c["write_gb_per_second"]) if cases else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if slowest is None:
        return None
    host = found.get("machine") or f"{found.get('cores', '?')} cores"
    here = "" if found.get("cores") == os.cpu_count() else f"; this host has {os.cpu_count()} cores"
    return Rate(float(slowest["write_gb_per_second"]),
                f"benchmarks/staging_throughput.py's slowest {kind} {slowest['mode']} case on "
                f"{found.get('date', '?')}, {host}{here}, sources in the page cache")


def rate(configured: float, kind: str, mode: str, key: str = "data.stage_rate_gb_s") -> Rate | None:
    """The rate `configured` (key `key`) when it is set, else the measured one."""
    if configured > 0:
        return Rate(configured, key)
    return measured(kind, mode)


WHERE = {"in_init": "of init", "in_run": "of the timed run", "before_init": "before init_start"}


def estimate(node_bytes: float, at: Rate | None, timing: str) -> tuple[str, bool]:
    """(the estimate's line, whether to warn): staging `node_bytes` per node at `at`, with data.stage_timing
    `timing`; warns when staging is in init and would take more than WARN_SECONDS."""
    gb = node_bytes / 1e9
    if at is None:
        return (f"staging {gb:.3f} GB per node: no rate to estimate its time (set data.stage_rate_gb_s, or run "
                f"benchmarks/staging_throughput.py on this machine kind)", False)
    seconds = node_bytes / (at.gb_s * 1e9)
    line = f"staging {gb:.3f} GB per node at {at.gb_s:.3g} GB/s ({at.source}): about {_duration(seconds)} " \
           f"{WHERE[timing]}"
    late = timing == "in_init" and seconds > WARN_SECONDS
    if late:
        line += (f"; past {WARN_SECONDS // 60} minutes, and init must end within {INIT_LIMIT_SECONDS // 60} minutes "
                 f"of init_start (hpc 3.0.0): use more nodes with node_share, a faster stage_dir or "
                 f"data.stage_timing=in_run")
    return line, late


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
