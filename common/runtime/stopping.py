"""Stopping cleanly on the signals batch schedulers send before the wall-time limit (docs/faults.md).

Slurm (`--signal`, scancel), LSF (`bkill`, `-wa`) and PBS send SIGTERM or SIGUSR1 to every task some time
before they kill it. `StopRequests.install()` turns those signals into a flag instead of death; the
training loop asks `agreed(dist)` after every step, a one-scalar allreduce, so every rank stops after the
same step even when the signal reached only some of them, writes a checkpoint, logs run_stop with status
aborted and exits with EXIT_STOPPED (75, EX_TEMPFAIL: try again later, from the checkpoint).
"""
from __future__ import annotations

import signal

from common.runtime.dist import DistEnv

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_STOPPED = 75


class StopRequests:
    """The stop signals this process received."""

    def __init__(self):
        self.signum = 0
        self._previous: dict = {}

    def install(self) -> "StopRequests":
        """Handle the stop signals (main thread only) until `uninstall`."""
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handler(self, signum, _frame) -> None:
        self.signum = signum

    def agreed(self, dist: DistEnv) -> int:
        """Collective: how many ranks have been asked to stop (0: keep going)."""
        if not dist.horovod or dist.size == 1:
            return int(bool(self.signum))
        import tensorflow as tf
        return int(dist.sum(tf.constant(float(bool(self.signum))), name="stop_request"))

    def describe(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "another rank's stop signal"
