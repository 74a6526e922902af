"""Where one process's CPU time goes over the timed steps, thread by thread (Linux /proc/self/task).

A training-step worker calls `started_threads` around `init_distributed`: the threads that call starts are
Horovod's background thread and the threads MPI or Gloo start under it (plus a few idle ones TensorFlow's import
starts). `account` then splits the CPU seconds between two snapshots into the process's main thread (Python:
tracing, feeding tensors, calling the step functions), those runtime threads, and every other thread (TensorFlow's
op thread pools: the compute), with the minor page faults of each, per timed step.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable

TASKS = Path("/proc/self/task")
ROLES = ("compute", "runtime", "main")


def thread_ids() -> set[int]:
    """This process's thread ids now (empty where /proc is missing)."""
    try:
        return {int(t.name) for t in TASKS.iterdir()}
    except OSError:
        return set()


def started_threads(call: Callable[[], object]) -> tuple[object, set[int]]:
    """`call()`'s result and the ids of the threads that appeared while it ran."""
    before = thread_ids()
    result = call()
    return result, thread_ids() - before


def snapshot() -> dict[int, tuple[float, float, int]]:
    """Each thread's CPU seconds (user, system) and minor page faults so far."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in thread_ids():
        try:
            stat = (TASKS / str(tid) / "stat").read_text()
        except OSError:  # the thread ended since the listing
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is fields[0]
        out[tid] = (int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7]))
    return out


def account(before: dict, after: dict, runtime: Iterable[int], steps: int) -> dict:
    """CPU seconds (user, system) and minor faults per step of each role between two snapshots; threads that
    ended in between are left out (their last figures are gone with them)."""
    runtime, main = set(runtime), os.getpid()
    roles = {role: {"user_s": 0.0, "system_s": 0.0, "minor_faults": 0} for role in ROLES}
    for tid, (user, system, faults) in after.items():
        user0, system0, faults0 = before.get(tid, (0.0, 0.0, 0))
        role = roles["main" if tid == main else "runtime" if tid in runtime else "compute"]
        role["user_s"] += (user - user0) / steps
        role["system_s"] += (system - system0) / steps
        role["minor_faults"] += (faults - faults0) // steps
    return roles
