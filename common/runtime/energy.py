"""Energy a run used, from the platform's counters, or the reason there is no figure (never an estimate).

- CPUs: RAPL package domains under /sys/class/powercap (intel-rapl:N, also on AMD's Linux driver), read by
  one rank per node (local rank 0); the counter wraps at max_energy_range_uj.
- GPUs: NVML's total energy of the rank's GPU (pynvml, Volta and later), read by every GPU rank.
Read at run_start and run_stop; summary.json's `system.energy_j_per_sample` is the job's joules over the samples
trained. The files are often readable by root only: the reason then says so.
"""
from __future__ import annotations

import os
from pathlib import Path

from common.runtime.dist import DistEnv

POWERCAP = Path("/sys/class/powercap")


def rapl_packages(root: Path = POWERCAP) -> list[Path]:
    """The RAPL package domains (intel-rapl:0, intel-rapl:1, ...; not their sub-domains)."""
    return sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)


def read_rapl(root: Path = POWERCAP) -> tuple[dict | None, str]:
    """{domain: (energy µJ, wrap µJ)}, or None and why not."""
    domains = rapl_packages(root)
    if not domains:
        return None, f"no RAPL package domains under {root}"
    try:
        return {d.name: (int((d / "energy_uj").read_text()), int((d / "max_energy_range_uj").read_text()))
                for d in domains}, ""
    except (OSError, ValueError) as err:
        return None, f"RAPL counters under {root} unreadable ({err.__class__.__name__}: {err})"


def rapl_joules(before: dict, after: dict) -> float:
    """Joules between two readings of the same domains, each counter's wrap-around included."""
    total = 0
    for name, (start, wrap) in before.items():
        end = after[name][0]
        total += end - start if end >= start else end + wrap - start
    return total / 1e6


class EnergyMeter:
    """This rank's share of the job's energy counters between start() and stop()."""

    def __init__(self, dist: DistEnv):
        self.dist = dist
        self.source, self.reason = None, ""
        self.rapl_start: dict | None = None
        self.nvml_start: float | None = None

    def start(self) -> None:
        if self.dist.gpu:
            self.nvml_start, self.reason = _nvml_millijoules()
            self.source = "NVML" if self.nvml_start is not None else None
        elif self.dist.local_rank == 0:
            self.rapl_start, self.reason = read_rapl()
            self.source = "RAPL" if self.rapl_start is not None else None
        else:
            self.source, self.reason = "none needed", ""  # its node's local rank 0 reads the package counters

    def stop(self) -> tuple[float | None, str | None, str]:
        """(joules this rank accounts for, source, reason when None)."""
        if self.source == "none needed":
            return 0.0, None, ""
        if self.source == "NVML":
            end, reason = _nvml_millijoules()
            return (None, None, reason) if end is None else ((end - self.nvml_start) / 1e3, "NVML", "")
        if self.source == "RAPL":
            end, reason = read_rapl()
            return (None, None, reason) if end is None else (rapl_joules(self.rapl_start, end), "RAPL", "")
        return None, None, self.reason


def _nvml_millijoules() -> tuple[float | None, str]:
    """Total energy (mJ) of the first GPU this process sees, through NVML."""
    try:
        import pynvml
    except ImportError:
        return None, "GPU present but pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        index = int(visible) if visible.isdigit() else 0
        return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(index))), ""
    except pynvml.NVMLError as err:
        return None, f"NVML energy counter unavailable: {err}"


def job_energy(readings: list[tuple[float | None, str | None, str]]) -> tuple[float | None, str, str]:
    """(joules of the job, source, reason when None) from every rank's stop()."""
    missing = [reason for joules, _, reason in readings if joules is None]
    if missing:
        return None, "", missing[0]
    sources = sorted({source for _, source, _ in readings if source})
    return sum(j for j, _, _ in readings), "+".join(sources), ""
