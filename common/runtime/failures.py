"""One rank's failure as the whole run's, so that every rank exits with the run's code (docs/faults.md), and
the summary of a run that an exception ended. Imported only when a run fails (run.py `shared_failures`, `Run.__exit__`).

A rank that an exception ends writes OUT/failures/rank_<r>.json (its exit code, 2 for a BenchError and 4
for anything else, and its message) before it exits. A rank whose own error is only Horovod's shutdown (a
collective that failed because another rank ended) waits up to PEER_WAIT_SECONDS for such a note and ends
as that rank did: its code, its message as "rank <r>: ...", in summary.json too. The launcher's code is
then the run's whether it reports the first failed task's code (mpirun, horovodrun) or the largest (srun).
Notes older than this process are an earlier attempt's and are passed over. The ranks must share OUT (a
node-local run.output_dir leaves the shutdown an internal error, exit 4, as before).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psutil

from common.base import exits
from common.base.cli import write_traceback
from common.base.errors import BenchError
from common.base.files import write_json_atomic
from common.runtime.config import to_dict
from common.runtime.dist import DistEnv, StoppedBeforeStart
from common.runtime.summary import RUN_ABORTED, layout, write_summary

FAILURES_DIR = "failures"
PEER_WAIT_SECONDS = 10.0
# This process's start (not this module's import, which a run makes only once a rank has failed)
PROCESS_START = psutil.Process().create_time()
# How Horovod says a collective failed because a rank has ended (its TensorFlow ops raise UnknownError with it).
SHUTDOWN_TEXT = "Horovod has been shut down"


class PeerFailed(BenchError):
    """Another rank's failure, which this rank ends with: its message and its exit code (2 for bad input, 4 for an
    internal error; `guarded` exits with `exit_code`)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def run_failure(out: Path, dist: DistEnv, err: Exception) -> PeerFailed | None:
    """What `err`, raised on one of several ranks, makes of the run: this rank's own failure is noted (None:
    raise it as it is); Horovod's shutdown after another rank's failure becomes that rank's, once its note is
    read (None when none comes)."""
    if not peer_shutdown(err):
        write_note(out, dist.rank, err)
        return None
    note = wait_for_note(out, dist.rank)
    return None if note is None else PeerFailed(f"rank {note['rank']}: {note['reason']}", note["code"])


def peer_shutdown(err: BaseException) -> bool:
    return type(err).__name__ == "HorovodInternalError" or SHUTDOWN_TEXT in str(err)


def write_note(out: Path, rank: int, err: BaseException) -> None:
    """OUT/failures/rank_<r>.json: this rank's exit code and message (written whole, then renamed)."""
    code = exits.BAD_INPUT if isinstance(err, BenchError) else exits.INTERNAL_ERROR
    reason = str(err) if isinstance(err, BenchError) else f"{type(err).__name__}: {err}"
    try:
        write_json_atomic({"rank": rank, "code": code, "error": type(err).__name__, "reason": reason},
                          out / FAILURES_DIR / f"rank_{rank:05d}.json")
    except OSError:
        pass  # no note: the other ranks end with the shutdown itself, an internal error


def wait_for_note(out: Path, rank: int) -> dict | None:
    """The first note another rank wrote during this process's life, waited for up to PEER_WAIT_SECONDS."""
    deadline = time.monotonic() + PEER_WAIT_SECONDS
    while True:
        notes = sorted((out / FAILURES_DIR).glob("rank_*.json"))
        for path in notes:
            note = _read(path)
            if note is not None and note["rank"] != rank:
                return note
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


def _read(path: Path) -> dict | None:
    try:
        if path.stat().st_mtime < PROCESS_START:
            return None
        note = json.loads(path.read_text())
        return note if {"rank", "code", "reason"} <= set(note) else None
    except (OSError, ValueError):
        return None


def write_failure(run: Any, error: BaseException) -> None:
    """On rank 0, after run_stop aborted (run.py `Run.__exit__`): summary.json of the run that `error` ended after
    run_start, with the error as its reason, and for an internal error its traceback beside it (exit 4)."""
    out = Path(run.cfg.run.output_dir)
    write_summary(failure_summary(run, error) | run.attempt_summary(), out)
    if not isinstance(error, (BenchError, StoppedBeforeStart)):
        write_traceback(error, out)
    run.log(f"aborted after {run.time_to_train:.1f} s of the timed run; summary in {out}/summary.json")


def failure_summary(run: Any, error: BaseException) -> dict:
    """summary.json of a run that an exception ended after run_start: status aborted, the error as the reason,
    and what the run knew by then (`run` as for run_summary; its data and trainee may still be None). The
    history ended with the training loop: `epochs` is null, the MLPerf log has the epochs that ran."""
    cfg, data, trainee = run.cfg, run.data, run.trainee
    return {
        "benchmark": run.benchmark,
        "status": RUN_ABORTED,
        "reason": failure_reason(error),
        "error": type(error).__name__,
        "time_to_train_seconds": run.time_to_train,
        "epochs": None,
        "metric_name": trainee.metric.name if trainee else None,
        "final_metric": None,
        "target": cfg.train.target,
        **layout(run.dist),
        "train_samples": data.train_samples if data else None,
        "eval_samples": data.val_samples if data else None,
        "loader": (data.loader if data else None) or cfg.data.loader,
        "history": [],
        "config": to_dict(cfg),
    }


def failure_reason(error: BaseException) -> str:
    """A BenchError's message (what the user must fix); for any other exception its type and message."""
    if isinstance(error, BenchError):
        return str(error)
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
