"""Shared pieces of the fuzz tests: the settings profile, byte corruptions, hang guards, an isolated worker
process for native readers, and the tally of inputs tried (printed at the end of the session).

Bounded by default (each test's own `max_examples`, derandomized, no example database), so `make test` is
reproducible. FUZZ_EXAMPLES=N runs N inputs per test instead; FUZZ_SEED=S then draws them at random from
seed S (a different S gives other inputs). FUZZ_REPORT=path writes the tally as JSON. See docs/fuzzing.md.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import signal
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st

from common.base.errors import BenchError
from tests.fuzz.readers import UndecodableError

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0") or 0)  # 0: each test's bounded count
SEED = os.environ.get("FUZZ_SEED")

settings.register_profile(
    "fuzz",
    derandomize=SEED is None,  # the same inputs on every run unless a campaign asks for a seed
    database=None,  # nothing written into the checkout; a failure prints the input to reproduce it
    deadline=timedelta(seconds=20),  # generous: the machine may be busy; hangs are caught by the guards below
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)


def fuzz(examples: int, deadline_s: float = 20.0) -> Callable:
    """Decorator: the fuzz profile with `examples` inputs (FUZZ_EXAMPLES overrides) and the test's deadline."""
    configured = settings(settings.get_profile("fuzz"), max_examples=EXAMPLES or examples,
                          deadline=timedelta(seconds=deadline_s))

    def wrap(test):
        test = configured(test)
        return seed(int(SEED))(test) if SEED is not None else test

    return wrap


# ---------------------------------------------------------------------------- the tally
@dataclasses.dataclass
class Tally:
    """Inputs tried per target and what came of them ("valid", "BenchError", ...), and the time spent."""

    counts: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))
    seconds: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(float))

    def record(self, target: str, outcome: str, seconds: float = 0.0) -> None:
        self.counts[target][outcome] += 1
        self.seconds[target] += seconds

    def lines(self) -> list[str]:
        return [f"{target}: {sum(c.values())} inputs in {self.seconds[target]:.1f} s ("
                + ", ".join(f"{k} {v}" for k, v in sorted(c.items())) + ")"
                for target, c in sorted(self.counts.items())]

    def to_dict(self) -> dict:
        return {target: {"inputs": sum(c.values()), "seconds": round(self.seconds[target], 2), "outcomes": dict(c)}
                for target, c in sorted(self.counts.items())}

    def write(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps({"examples": EXAMPLES, "seed": SEED, "targets": self.to_dict()}, indent=2)
                              + "\n")


TALLY = Tally()


# ---------------------------------------------------------------------------- byte corruptions
@dataclasses.dataclass(frozen=True)
class Corruption:
    """A change to a file's bytes, printed in a failing example so that it can be reproduced."""

    kind: str  # flip, truncate, zero, insert, delete, overwrite
    offset: int
    payload: bytes = b""  # flip: XOR masks; insert / overwrite: the new bytes
    length: int = 0  # zero / delete: bytes affected

    def apply(self, data: bytes) -> bytes:
        if self.kind == "truncate":
            return data[:self.offset]
        if self.kind == "flip":
            chunk = bytes(a ^ b for a, b in zip(data[self.offset:self.offset + len(self.payload)], self.payload))
            return data[:self.offset] + chunk + data[self.offset + len(chunk):]
        if self.kind == "zero":
            return data[:self.offset] + bytes(len(data[self.offset:self.offset + self.length])) + \
                data[self.offset + self.length:]
        if self.kind == "insert":
            return data[:self.offset] + self.payload + data[self.offset:]
        if self.kind == "delete":
            return data[:self.offset] + data[self.offset + self.length:]
        if self.kind == "overwrite":
            return data[:self.offset] + self.payload + data[self.offset + len(self.payload):]
        raise ValueError(self.kind)


@st.composite
def corruptions(draw, size: int, kinds=("flip", "truncate", "zero", "insert", "delete", "overwrite"),
                first: int = 0, last: int | None = None) -> Corruption:
    """A corruption of a file of `size` bytes at an offset in [first, last) (default: anywhere)."""
    last = size if last is None else min(last, size)
    kind = draw(st.sampled_from(kinds))
    offset = draw(st.integers(first, max(first, last - 1)))
    if kind == "flip":
        masks = draw(st.lists(st.integers(1, 255), min_size=1, max_size=4))
        return Corruption(kind, offset, bytes(masks[:max(1, size - offset)]))
    if kind in ("zero", "delete"):
        return Corruption(kind, offset, length=draw(st.integers(1, 64)))
    if kind == "truncate":
        return Corruption(kind, offset)
    payload = draw(st.binary(min_size=1, max_size=32))
    return Corruption(kind, offset, payload[:max(1, size - offset)] if kind == "overwrite" else payload)


def corrupt_file(path: Path, corruption: Corruption) -> bytes:
    """Apply `corruption` to the file at `path`; returns the original bytes."""
    original = path.read_bytes()
    path.write_bytes(corruption.apply(original))
    return original


# ---------------------------------------------------------------------------- hang guards
class Hang(Exception):
    """An input took longer than the per-input limit."""


@contextmanager
def time_limit(seconds: float):
    """Raise Hang in this (main) thread after `seconds`: for pure-Python targets."""
    def expire(signum, frame):
        raise Hang(f"no result after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def outcome_of(call: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", value), ("BenchError", message), ("UnicodeDecodeError", the application's diagnosis) or
    ("crash", "Type: message\\ntraceback")."""
    try:
        return "ok", call()
    except BenchError as err:
        return "BenchError", str(err)
    except UndecodableError as err:
        return "UnicodeDecodeError", str(err)
    except Exception as err:  # the finding: anything else escaping a reader
        return "crash", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"


class Isolated:
    """Runs reader calls in one spawned worker process, so that a segfault or a hang in native code (HDF5,
    TensorFlow) is reported as a finding instead of killing or stalling the test session.

    `call(function, *args)` returns `outcome_of` the call in the worker, or ("died", ...) / ("hang", ...);
    the worker is replaced after either.
    """

    def __init__(self, timeout_s: float, initializer: Callable | None = None):
        self.timeout_s = timeout_s
        self.initializer = initializer
        self.pool = None

    def _pool(self):
        if self.pool is None:
            self.pool = concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=self.initializer)
        return self.pool

    def call(self, function: Callable, *args) -> tuple[str, Any]:
        future = self._pool().submit(_run, function, *args)
        try:
            return future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            self.close(kill=True)
            return "hang", f"no result after {self.timeout_s} s"
        except concurrent.futures.process.BrokenProcessPool as err:
            self.close(kill=True)
            return "died", f"the worker process died ({err})"

    def close(self, kill: bool = False) -> None:
        if self.pool is None:
            return
        if kill:
            for process in list(self.pool._processes.values()):  # our own worker, by its pid
                process.kill()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.pool = None


def _run(function: Callable, *args) -> tuple[str, Any]:
    return outcome_of(lambda: function(*args))


@contextmanager
def timed(target: str):
    """Time one input of `target`; the body sets `box[0]` to its outcome for the tally."""
    box = ["failed"]
    started = time.perf_counter()
    try:
        yield box
    finally:
        TALLY.record(target, box[0], time.perf_counter() - started)
