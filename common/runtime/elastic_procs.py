"""The processes beside an elastic run's workers (common/runtime/elastic.py, docs/faults.md):

    python -m common.runtime.elastic_procs hosts FILE      # a --host-discovery-script: FILE's host:slots lines
    python -m common.runtime.elastic_procs watchdog FD TIMEOUT PID HOST   # started by each worker (start_watchdog)

Horovod's elastic driver runs the discovery script about once a second for the whole run, and each worker starts
a watchdog at each (re)start; this module imports only the standard library so that each start costs Python's
own start-up, not NumPy's and the runtime's (elastic.py imports both).
"""
from __future__ import annotations

import argparse
import datetime
import os
import select
import signal
import sys
import time
from pathlib import Path

from common.base.cli import guarded
from common.base.errors import BenchError


def watch(fd: int, timeout_s: float, pid: int, host: str) -> int:
    """The watchdog process: read heartbeats from `fd`; SIGKILL the worker `pid` (on `host`) after `timeout_s`
    without one, saying so on stderr (returns 1); return 0 when the worker closes the pipe or exits."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)  # the worker's stop signals, sent to a whole job: it watches on
    last, rank, pending = time.monotonic(), "?", b""
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, last + timeout_s - time.monotonic()))
        if os.getppid() != pid:  # the worker exited (a forked child of it may still hold the pipe open); this
            return 0  # check also keeps the kill below from hitting another process that reuses the pid
        if ready:
            data = os.read(fd, 4096)
            if not data:
                return 0
            *beats, pending = (pending + data).split(b"\n")
            rank = beats[-1].decode() if beats else rank
            last = time.monotonic()
        elif time.monotonic() - last >= timeout_s:
            silent = time.monotonic() - last
            os.kill(pid, signal.SIGKILL)
            at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
            print(f"elastic watchdog: the worker on host {host} (pid {pid}, rank {rank}) sent no heartbeat for "
                  f"{silent:.1f} s (dist.elastic.hang_timeout_s={timeout_s:g}): it is stopped or hung; killed it "
                  f"with SIGKILL at {at}, so that Horovod's elastic driver drops its host and the others go on",
                  file=sys.stderr, flush=True)
            return 1


def read_hosts(path: Path) -> list[str]:
    """The `host:slots` lines of a hosts file (blank lines and # comments skipped); raises BenchError."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise BenchError(f"{path}: not a readable hosts file ({err})") from None
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, slots = line.partition(":")
        if not name or not slots.isdigit() or int(slots) < 1:
            raise BenchError(f"{path}: line {number} is {line!r}, expected host:slots such as localhost:1")
        hosts.append(line)
    return hosts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="The processes beside elastic Horovod workers (docs/faults.md).")
    sub = parser.add_subparsers(dest="command", required=True)
    hosts = sub.add_parser("hosts", help="print the host:slots lines of FILE (a --host-discovery-script)")
    hosts.add_argument("file", type=Path)
    dog = sub.add_parser("watchdog", help="(started by each elastic worker) kill worker PID when the pipe FD has "
                                          "had no heartbeat for TIMEOUT s")
    for name, kind in (("fd", int), ("timeout", float), ("pid", int), ("host", str)):
        dog.add_argument(name, type=kind)
    args = parser.parse_args(argv)
    if args.command == "watchdog":
        return watch(args.fd, args.timeout, args.pid, args.host)
    return guarded(lambda: print("\n".join(read_hosts(args.file))) or 0)


if __name__ == "__main__":
    sys.exit(main())
