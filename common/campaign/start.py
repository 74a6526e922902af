"""The shared start of a throughput result's instances submitted as separate jobs (docs/campaigns.md,
"Instances as separate jobs").

Each job runs one instance (`campaign run --instances M --instance I`) and waits, before its training
starts (so before the training's init_start: the wait is neither in the span the throughput score uses
nor in init's 30 minutes), for one of:
- `--start-at WHEN`: a moment, seconds since the epoch or ISO 8601 with a time zone;
- `--barrier`: every instance's job to have arrived. Each writes OUT/barrier/ready_<i>.json; the first to
  see all M creates OUT/barrier/start.json once (a complete file, linked to its name: a second creation
  fails), naming the moment GRACE_SECONDS later at which they all start, and the instances that were there.
An instance that comes after its round opened (resubmitted after a crash) or after --start-at has passed
starts at once and says how late: the span the score uses then includes its lateness. A wait that passes
--wait-limit leaves the barrier (its ready file removed) and ends the job with exit 75, unless the round
opened with it meanwhile.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import time
from pathlib import Path
from typing import Callable

from common.base.errors import BenchError
from common.base.files import write_json_atomic

BARRIER_DIR = "barrier"
START_NAME = "start.json"
GRACE_SECONDS = 5.0  # from the round's opening to its start: longer than every instance's look at the barrier
POLL_SECONDS = 1.0
PROGRESS_SECONDS = 60.0


class StartAbandoned(Exception):
    """The wait for the shared start passed its limit, or a stop request came, before the round opened."""


@dataclasses.dataclass(frozen=True)
class StartPlan:
    """How an instance job waits for the others: at (seconds since the epoch) or barrier; wait_limit in seconds
    (0: until the job's time limit)."""

    at: float | None = None
    barrier: bool = False
    wait_limit: float = 0.0


def parse_when(text: str) -> float:
    """--start-at's value in seconds since the epoch: a number, or ISO 8601 with a time zone (Z or +hh:mm)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise BenchError(f"--start-at {text!r}: expected seconds since the epoch or an ISO 8601 time with a time "
                         f"zone, e.g. 2026-12-04T02:00:00Z") from None
    if moment.tzinfo is None:
        raise BenchError(f"--start-at {text!r}: no time zone; the jobs' nodes must agree on the moment, so give "
                         f"one, e.g. {text}Z or {text}+01:00")
    return moment.timestamp()


def wait_for_start(plan: StartPlan, out: Path, index: int, count: int, stopped: Callable[[], bool]) -> float:
    """Wait for the shared start of instance `index` of `count`, then return the moment it was (seconds since
    the epoch). `stopped()`: a stop request came (the wait is abandoned)."""
    if plan.barrier:
        at = _barrier(plan, out, index, count, stopped)
    elif plan.at is not None:
        at = plan.at
    else:
        raise BenchError("an instance job needs its shared start: --start-at WHEN or --barrier")
    _sleep_until(at, plan.wait_limit, stopped, f"instance {index}: the shared start")
    late = time.time() - at
    if late > GRACE_SECONDS:
        print(f"warning: instance {index} starts {late:.0f} s after the shared start "
              f"({_stamp(at)}); the throughput score's span includes that", flush=True)
    else:
        print(f"instance {index}: shared start at {_stamp(at)}", flush=True)
    return at


def _barrier(plan: StartPlan, out: Path, index: int, count: int, stopped: Callable[[], bool]) -> float:
    """Arrive at the barrier and wait until its round opens (or opened); the round's start moment."""
    folder = out / BARRIER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    mine = folder / f"ready_{index:03d}.json"
    write_json_atomic({"index": index, "host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}, mine)
    began = last_said = time.time()
    try:
        while True:
            opened = read_start(folder)
            if opened is not None:
                return opened["start_at"]
            ready = _ready(folder, count)
            if len(ready) == count:
                return _open(folder, ready, index)["start_at"]
            if stopped() or (plan.wait_limit and time.time() - began > plan.wait_limit):
                break
            if time.time() - last_said >= PROGRESS_SECONDS:
                last_said = time.time()
                missing = sorted(set(range(count)) - set(ready))
                print(f"instance {index}: waiting at the barrier {folder}: {len(ready)} of {count} instances ready, "
                      f"waiting for {', '.join(map(str, missing))}, {(time.time() - began) / 60:.1f} min", flush=True)
            time.sleep(POLL_SECONDS)
    except BaseException:  # a scheduler's TERM (SystemExit) or Ctrl-C while waiting: leave the barrier
        mine.unlink(missing_ok=True)
        raise
    return _leave(folder, mine, index, count, time.time() - began, stopped())


def _leave(folder: Path, mine: Path, index: int, count: int, waited: float, stop: bool) -> float:
    """Leave the barrier (ready file first, then a last look: a round that opened with this instance meanwhile is
    kept); StartAbandoned, else the round's start."""
    mine.unlink(missing_ok=True)
    opened = read_start(folder)
    if opened is not None and index in opened["instances"]:
        return opened["start_at"]
    why = "a stop request" if stop else f"the wait limit ({waited / 60:.1f} min waited)"
    missing = sorted(set(range(count)) - set(_ready(folder, count)) - {index})
    raise StartAbandoned(f"instance {index} left the barrier {folder} at {why} before every instance had arrived "
                         f"(not there: {', '.join(map(str, missing)) or 'none'}); submit the job again")


def _ready(folder: Path, count: int) -> list[int]:
    """The instances (below `count`) whose ready file is at the barrier."""
    found = []
    for path in folder.glob("ready_*.json"):
        stem = path.stem.removeprefix("ready_")
        if stem.isdigit() and int(stem) < count:
            found.append(int(stem))
    return sorted(found)


def _open(folder: Path, ready: list[int], index: int) -> dict:
    """Open the round: start.json created once (a complete temporary file linked to its name); whoever comes
    second reads the first's."""
    now = time.time()
    record = {"start_at": now + GRACE_SECONDS, "opened": now, "opened_by": index, "instances": ready}
    tmp = folder / f".{START_NAME}.tmp-{socket.gethostname()}-{os.getpid()}"  # hosts share the folder
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    try:
        os.link(tmp, folder / START_NAME)
    except FileExistsError:
        record = read_start(folder)
    finally:
        tmp.unlink(missing_ok=True)
    return record


def read_start(folder: Path) -> dict | None:
    """The round's start.json, or None before it opened."""
    path = folder / START_NAME
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        float(record["start_at"])
        list(record["instances"])
    except (ValueError, KeyError, TypeError) as err:
        raise BenchError(f"{path}: not a barrier's start record ({err}); expected start_at and instances, as the "
                         f"suite writes it; remove the barrier directory to start a new round") from None
    return record


def _sleep_until(at: float, limit: float, stopped: Callable[[], bool], what: str) -> None:
    """Sleep until `at`, saying every PROGRESS_SECONDS how long is left; StartAbandoned on a stop request, or
    when `at` is further than `limit` seconds away (0: no limit)."""
    if limit and at - time.time() > limit:
        raise StartAbandoned(f"{what} ({_stamp(at)}) is {(at - time.time()) / 60:.1f} min away, past the wait "
                             f"limit of {limit / 60:.1f} min")
    last_said = 0.0
    while (left := at - time.time()) > 0:
        if stopped():
            raise StartAbandoned(f"{what} ({_stamp(at)}) not reached: a stop request came")
        if time.time() - last_said >= PROGRESS_SECONDS:
            last_said = time.time()
            print(f"{what}: waiting {left / 60:.1f} min more, until {_stamp(at)}", flush=True)
        time.sleep(min(left, POLL_SECONDS))


def _stamp(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
