"""summary.json as the suite reads it back (common/runtime/summary.py writes it): the strict schema (`Summary`),
a run directory's summary with its compliance verdict, and the table of finished runs.

    python -m common.campaign.summary RUN_DIR [RUN_DIR ...]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from common.base import documents
from common.base.cli import guarded
from common.base.documents import Figure
from common.base.errors import BenchError


@dataclasses.dataclass(frozen=True)
class Summary:
    """A run's summary.json as the suite reads it back (run_summary and failure_summary write it, with the
    strategy's blocks, the I/O report and the system figures, and a resumed or stopped attempt's fields)."""

    benchmark: str
    status: str  # mllog's run_stop status: success or aborted
    reason: str
    time_to_train_seconds: float | None
    epochs: int | None  # null: an exception ended the run
    metric_name: str | None
    final_metric: Figure | None
    target: float
    ranks: int
    nodes: int
    threads_per_rank: int
    gpu: bool
    horovod: dict | None
    train_samples: int | None
    eval_samples: int | None
    loader: str
    history: list[dict[str, Any]]
    config: dict
    error: str | None = None  # the exception's type, for a run it ended
    samples_per_second_first_epoch: float | None = None
    samples_per_second_steady: float | None = None
    global_batch_size: int | None = None
    io: dict | None = None  # io_report.json's figures
    system: dict | None = None  # common/runtime/monitor.py
    precision: dict | None = None  # how train.precision was chosen: precision, reason, step_seconds, epochs_ratio
    parallel: dict | None = None  # the hybrid strategy's partitioning
    elastic: dict | None = None  # the elastic strategy's resets
    emulation: dict | None = None  # an emulated accelerator's figures (common/storage/emulate.py)
    attempt: int | None = None  # a resumed run's attempt
    resumed_from: dict | None = None
    time_to_train_all_attempts_seconds: float | None = None
    stopped: bool = False  # a stop signal ended it (a checkpoint to resume from)
    checkpoint: str = ""


SUMMARY_NAME = "summary.json"


def read_summary(path: str | Path) -> Summary:
    """A summary.json, read strictly (BenchError naming the file, the key, the value and what was expected)."""
    return documents.read(path, Summary, kind="json")


def read_run(run_dir: str | Path) -> dict:
    """summary.json of a run plus its compliance.json when present."""
    run_dir = Path(run_dir)
    path = run_dir / SUMMARY_NAME
    if not path.is_file():
        raise BenchError(f"{path} does not exist: the run in {run_dir} did not finish")
    summary = documents.to_dict(read_summary(path))
    compliance = run_dir / "compliance.json"
    summary["compliance"] = json.loads(compliance.read_text()) if compliance.is_file() else None
    return summary


def format_table(runs: list[dict]) -> str:
    header = ("benchmark", "status", "time to train", "staging", "epochs", "final metric", "samples/s", "ranks",
              "compliance")
    rows = [header] + [_row(r) for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def _row(r: dict) -> tuple[str, ...]:
    comp = r.get("compliance")
    verdict = "not run" if comp is None else ("SUCCESS" if comp["passed"] else "FAILED")
    div = r["config"]["mlperf"]["division"]
    rate = r.get("samples_per_second_steady")
    staging = (r.get("io") or {}).get("staging")
    staged = f"{staging['seconds']:.1f} s, {staging['write_gb_per_second']:.2f} GB/s" if staging else "-"
    epochs = "-" if r["epochs"] is None else str(r["epochs"])  # null: an exception ended the run
    return (r["benchmark"], r["status"], f"{r['time_to_train_seconds']:.1f} s", staged, epochs,
            f"{r['metric_name']} {r['final_metric']:.4f} (target {r['target']})" if r["final_metric"] is not None
            else "-", f"{rate:.1f}" if rate else "-", str(r["ranks"]), f"{verdict} ({div})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Print a table of finished runs.")
    parser.add_argument("run_dirs", nargs="+")
    args = parser.parse_args(argv)
    return guarded(lambda: print(format_table([read_run(d) for d in args.run_dirs])) or 0)


if __name__ == "__main__":
    sys.exit(main())
