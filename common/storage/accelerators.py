"""The accelerators a run can emulate (train.emulate), and where each rate comes from.

An emulated training step waits the accelerator's time for the batch it was given instead of computing:
local batch / samples_per_second. Everything else in the run is real. The rates, per accelerator (one GPU):
- `h100`, `a100`: MLPerf Storage's CosmoFlow workloads, 0.00350 and 0.00551 s of computation per sample (its
  DLIO configurations), so that a result compares with MLPerf Storage's and DLIO's. MLPerf Storage has no
  DeepCAM workload.
- `h100-hpc`, `a100-hpc`: the per-GPU training rates of NVIDIA's published MLPerf HPC closed results: v3.0 on
  H100 (CosmoFlow 206.7 samples/s; DeepCAM 30 at local batch 1, 82 at local batch 8) and v2.0 on A100
  (CosmoFlow 115.1; DeepCAM 20.8 at 1, 40.8 at 8). DeepCAM's rate depends on the local batch, so only the two
  local batches that were published have one.
- `custom`: train.emulate.samples_per_second.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from common.base.errors import BenchError

Accelerator = Literal["none", "h100", "a100", "h100-hpc", "a100-hpc", "custom"]
# An evaluation step is a forward pass only: a third of a training step's work (forward 1, backward 2).
EVAL_FRACTION = 1 / 3
AU_THRESHOLD = {"cosmoflow": 0.70}  # MLPerf Storage's pass mark for the workload's AU (it has no DeepCAM one)
MLPERF_STORAGE = "MLPerf Storage CosmoFlow workload ({} s of computation per sample)"
HPC_V30 = "NVIDIA's MLPerf HPC v3.0 H100 closed results, per GPU"
HPC_V20 = "NVIDIA's MLPerf HPC v2.0 A100 closed results, per GPU"

# accelerator -> application -> {local batch (0: any): samples/s}, and the source
RATES: dict[str, tuple[dict[str, dict[int, float]], str]] = {
    "h100": ({"cosmoflow": {0: 1 / 0.00350}}, MLPERF_STORAGE.format(0.00350)),
    "a100": ({"cosmoflow": {0: 1 / 0.00551}}, MLPERF_STORAGE.format(0.00551)),
    "h100-hpc": ({"cosmoflow": {0: 206.7}, "deepcam": {1: 30.0, 8: 82.0}}, HPC_V30),
    "a100-hpc": ({"cosmoflow": {0: 115.1}, "deepcam": {1: 20.8, 8: 40.8}}, HPC_V20),
}


@dataclasses.dataclass(frozen=True)
class EmulateConfig:
    """train.emulate: replace the training and evaluation steps by an accelerator's time (docs/storage.md)."""

    accelerator: Accelerator = "none"  # none: train for real
    samples_per_second: float = 0.0  # per accelerator, for accelerator=custom (and only then)
    # evict: drop the dataset's files from the page cache before every epoch, so that each epoch reads the
    # storage, not RAM (posix_fadvise DONTNEED, checked with mincore); keep: leave the cache alone (`cached`)
    page_cache: Literal["evict", "keep"] = "evict"


def rate(emulate: EmulateConfig, app: str, local_batch: int) -> tuple[float, str]:
    """Samples per second of one emulated accelerator training `app` at `local_batch`, and its source."""
    if emulate.accelerator == "custom":
        return emulate.samples_per_second, "train.emulate.samples_per_second"
    by_app, source = RATES[emulate.accelerator]
    if app not in by_app:
        raise BenchError(f"train.emulate.accelerator={emulate.accelerator} has no rate for {app} (its source, "
                         f"{source}, has no {app} workload); use "
                         f"{' or '.join(a for a, (r, _) in RATES.items() if app in r)} or custom")
    batches = by_app[app]
    if 0 in batches:
        return batches[0], source
    if local_batch not in batches:
        raise BenchError(f"train.emulate.accelerator={emulate.accelerator} has {app} rates for "
                         f"train.local_batch_size {' and '.join(map(str, sorted(batches)))} only ({source}), not "
                         f"{local_batch}: set one of those, or accelerator=custom with samples_per_second")
    return batches[local_batch], source
