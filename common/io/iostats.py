"""The I/O report of a run: what each rank read while training, and what staging did.

Two kinds of figures, kept apart:
- measured: the kernel's per-process counters (/proc/self/io) over the training phase, from the
  input pipelines' construction to run_stop: `rchar` (bytes returned by read calls, page cache
  included), `read_bytes` (bytes fetched from storage; 0 when the data was cached) and `syscr`
  (read calls). They count everything the process read, and miss data read through mmap.
- planned: from the read plan, records read (optimizer steps and evaluations times the batch)
  times the dataset's mean record size, the record files opened (each pass over a rank's
  files opens each once), and the share of each record the rank decodes (`decoded_fraction`: 1, or
  1 / (pd * ph) for a rank of a spatial group, which decodes only its block).

Plus the staging figures (common/io/staging.py) and the MLPerf HPC paper's ratio of staging time
to mean epoch time. `io_report` gathers every rank's figures to all ranks; rank 0 writes them to
io_report.json and into summary.json. docs/staging.md explains how to read them.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from common.base.files import write_json_atomic
from common.io.input import Datasets

if TYPE_CHECKING:
    from common.io.staging import StageResult

PROC_IO = Path("/proc/self/io")
PROC_KEYS = ("rchar", "read_bytes", "syscr")
REPORT_NAME = "io_report.json"


def read_proc_io() -> dict[str, int]:
    """This process's read counters, or {} where the kernel does not provide them."""
    try:
        fields = dict(line.split(": ") for line in PROC_IO.read_text().splitlines())
    except (OSError, ValueError):
        return {}
    return {k: int(fields[k]) for k in PROC_KEYS if k in fields}


@dataclasses.dataclass
class IOCounters:
    """This rank's reads during training; `start()` at the input pipelines' construction, then `stop()`."""

    started: float
    proc_start: dict
    seconds: float = 0.0
    proc: dict = dataclasses.field(default_factory=dict)  # counter deltas
    planned: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def start(cls) -> "IOCounters":
        return cls(started=time.perf_counter(), proc_start=read_proc_io())

    def stop(self, data: Datasets, history: list[dict], reads: bool = True) -> "IOCounters":
        """The counters at the end of training; `reads` False: a rank that read no input (a Mesh-TF helper)."""
        end = read_proc_io()
        self.seconds = time.perf_counter() - self.started
        self.proc = {k: end[k] - self.proc_start[k] for k in end if k in self.proc_start}
        self.planned = planned_reads(data, history, reads)
        return self


def planned_reads(data: Datasets, history: list[dict], reads: bool = True) -> dict:
    """Records, bytes and file opens of this rank's training and evaluations, from the read plan (all 0 for a
    rank that reads nothing)."""
    steps = sum(h.get("steps", 0) for h in history)
    evaluations = sum(1 for h in history if "val_samples_seen" in h)
    batch = data.local_batch_size if reads else 0
    train_records = steps * batch
    val_records = evaluations * (data.val_rank_samples or data.val_steps * data.local_batch_size) if reads else 0
    passes = steps / data.train_steps if data.train_steps else 0.0
    read = int((train_records + val_records) * data.record_bytes)
    return {"train_records": train_records, "eval_records": val_records, "bytes": read,
            "files_opened": round(passes * data.train_files) + evaluations * data.val_files,
            "decoded_fraction": data.decoded_fraction if reads else 0.0,
            "block_records": data.block_records if reads else False}


def io_report(counters: IOCounters, staging: StageResult | None, history: list[dict], dist) -> dict:
    """Every rank's figures, the totals and the staging summary (collective: every rank must call it; `dist`
    is the run's DistEnv: its rank, node and gather_object)."""
    mine = {"rank": dist.rank, "node": dist.node, "seconds": counters.seconds, "measured": counters.proc,
            "planned": counters.planned, "staging": staging.figures() if staging else None}
    ranks = dist.gather_object(mine)
    for r in ranks:
        seconds = max(r["seconds"], 1e-9)
        r["planned_read_mb_per_second"] = r["planned"]["bytes"] / seconds / 1e6
        r["measured_read_mb_per_second"] = r["measured"].get("rchar", 0) / seconds / 1e6 if r["measured"] else None
    epochs = [h["train_seconds"] for h in history if "train_seconds" in h]
    report = {"ranks": ranks, "totals": _totals(ranks),
              "mean_epoch_seconds": statistics.mean(epochs) if epochs else None,
              "staging": _staging_summary([r["staging"] for r in ranks if r["staging"]])}
    if report["staging"] and report["mean_epoch_seconds"]:
        report["staging_seconds_over_mean_epoch_seconds"] = report["staging"]["seconds"] / report["mean_epoch_seconds"]
    return report


def _totals(ranks: list[dict]) -> dict:
    measured = [r["measured"] for r in ranks if r["measured"]]
    return {"planned_bytes": sum(r["planned"]["bytes"] for r in ranks),
            "planned_files_opened": sum(r["planned"]["files_opened"] for r in ranks),
            "planned_read_mb_per_second": sum(r["planned_read_mb_per_second"] for r in ranks),
            "measured_rchar_bytes": sum(m.get("rchar", 0) for m in measured) if measured else None,
            "measured_storage_read_bytes": sum(m.get("read_bytes", 0) for m in measured) if measured else None,
            "measured_read_mb_per_second": (sum(r["measured_read_mb_per_second"] for r in ranks)
                                            if measured else None)}


def _staging_summary(per_rank: list[dict]) -> dict | None:
    """The staging phase as a whole: its wall time (the slowest rank, waiting included) and the copies."""
    if not per_rank:
        return None
    copies = [s for s in per_rank if s["copied"]]
    seconds = max(s["seconds"] for s in per_rank)
    written, read = sum(s["bytes_written"] for s in copies), sum(s["bytes_read"] for s in copies)
    return {"mode": per_rank[0]["mode"], "source_kind": per_rank[0]["source_kind"],
            "compression": per_rank[0]["compression"], "seconds": seconds, "staging_ranks": len(copies),
            **{key: sum(s.get(key, 0) for s in copies)
               for key in ("files", "files_reused", "files_rechecked", "files_recopied")},
            "bytes_written": written, "bytes_read": read,
            "write_gb_per_second": written / max(seconds, 1e-9) / 1e9,
            "read_gb_per_second": read / max(seconds, 1e-9) / 1e9,
            "compression_ratio": written / read if read else None}


def write_io_report(report: dict, output_dir: str | Path) -> Path:
    return write_json_atomic(report, Path(output_dir) / REPORT_NAME)
