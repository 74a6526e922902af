"""Facts about the machine this process runs on, and the cache of what was measured on it (its peak)."""
from __future__ import annotations

import json
import os
import platform
import socket
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or what the platform module says elsewhere."""
    return _cpuinfo("model name") or platform.processor() or platform.machine() or "unknown"


def _cpuinfo(field: str) -> str | None:
    """The first core's `field` in /proc/cpuinfo; None where there is none (or no /proc)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    """The first core's flags in /proc/cpuinfo (empty where there are none)."""
    return set((_cpuinfo("flags") or "").split())


# ---------------------------------------------------------------------------- the peak cache
# This host's probed peak in `$HPC_BENCH_CACHE/probe-<host>.json`, keyed by host, CPU model, cores and TensorFlow
# version, read by every run (common/runtime/monitor.py) and filled once (common/runtime/probe.py, which says how it
# is measured, under a lock).

def cache_root() -> Path:
    """Where this host's probes are cached: $HPC_BENCH_CACHE, else ~/.cache/hpc-sciml-bench."""
    return Path(os.environ.get("HPC_BENCH_CACHE") or Path.home() / ".cache/hpc-sciml-bench")


def cache_path() -> Path:
    return cache_root() / f"probe-{socket.gethostname()}.json"


def host_key() -> dict:
    """What a cached probe must match: host, CPU model, cores, TensorFlow version."""
    return {"host": socket.gethostname(), "cpu": cpu_model(), "cores": os.cpu_count() or 1,
            "tensorflow": tf_version()}


def tf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "none"


PEAK_KEYS = {"float32": "peak_gflops", "bfloat16": "peak_bf16_gflops"}


def cached() -> dict | None:
    """This host's cached figures if they were taken with its CPU and TensorFlow and hold both precisions' peaks,
    else None."""
    record = _read(cache_path())
    key = host_key()
    fits = record and all(record.get(k) == v for k, v in key.items())
    return record if fits and all(isinstance(record.get(k), (int, float)) for k in PEAK_KEYS.values()) else None


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # absent or unreadable: probe again
