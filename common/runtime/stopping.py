"""Stopping cleanly on the signals batch schedulers send before the wall-time limit (docs/faults.md).

Slurm (`--signal`, scancel), LSF (`bkill`, `-wa`) and PBS send SIGTERM or SIGUSR1 to every task some time
before they kill it. `StopRequests.install()` turns those signals into a flag instead of death. Every
rank must stop after the same step, even when the signal reached only some of them: the flag rides in the
training step's gradient allreduce (`StopFlag`, one more scalar in the fused allreduce; no collective of its
own), and the loop reads the agreed value after the step. Steps that do not carry it fall back to `agreed`,
a blocking one-scalar allreduce per step. Then every rank writes a checkpoint, logs run_stop with status
aborted and exits with EXIT_STOPPED (75, EX_TEMPFAIL: try again later, from the checkpoint).

The train entry points install the handler before anything else (common/runtime/run.guarded_run), so a
signal during start-up is remembered too: the run then ends before run_start (`StoppedBeforeStart`, also
EXIT_STOPPED), at the first point where its ranks meet (common/runtime/run.Run.init_start and start).
"""
from __future__ import annotations

import signal

from common.runtime.dist import DistEnv

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_STOPPED = 75


class StoppedBeforeStart(Exception):
    """A stop signal arrived before run_start: the run ends untimed, with nothing trained and no checkpoint."""


class StopRequests:
    """The stop signals this process received."""

    def __init__(self):
        self.signum = 0
        self._previous: dict = {}
        self._flag: StopFlag | None = None

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

    def flag(self) -> "StopFlag":
        """The TensorFlow variables a training step allreduces the request in (created on first use)."""
        if self._flag is None:
            self._flag = StopFlag()
        return self._flag

    def arm(self) -> None:
        """Before a step: put this rank's request into the flag the step allreduces (once, when it arrives)."""
        if self.signum and self._flag is not None and not self._flag.raised:
            self._flag.raise_local()

    def describe(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "another rank's stop signal"


class StopFlag:
    """A stop request carried by the training step's gradient allreduce.

    `local` is this rank's request (0 or 1); the step averages it over the ranks with its gradients and stores
    the result in `agreed`, which is > 0 on every rank after the same step when any rank asked."""

    def __init__(self):
        import tensorflow as tf
        self.local = tf.Variable(0.0, trainable=False, name="stop_request_local")
        self.agreed = tf.Variable(0.0, trainable=False, name="stop_request_agreed")
        self.raised = False

    def raise_local(self) -> None:
        self.local.assign(1.0)
        self.raised = True

    def stop_agreed(self) -> bool:
        """After a step: did any rank ask to stop (read from the step's allreduce, no collective)."""
        return float(self.agreed.numpy()) > 0
