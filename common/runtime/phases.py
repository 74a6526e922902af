"""Where a rank's training steps spend their time, by phase, on the host's clock.

    clock = PhaseClock(("compute", "allreduce", "update"), device_sync=sync_gpu if gpu else None)
    clock.start()            # at the start of a step
    ...                      # the phase's work
    clock.lap("compute")     # its seconds added to "compute"; the next phase starts now

On a GPU the host runs ahead of the device, so a lap means nothing unless the device is drained first: with
`sync` on (the system window turns it on for the steps it records, common/runtime/system.py) every reading
waits for the device. Off, a reading costs one clock read, so the training steps keep their clock always.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence


class PhaseClock:
    """Seconds spent in each named phase so far."""

    def __init__(self, names: Sequence[str], device_sync: Callable[[], None] | None = None):
        self.seconds = dict.fromkeys(names, 0.0)
        self.sync = False  # wait for the device before each reading (needed on GPUs only)
        self._device_sync = device_sync
        self._since = 0.0

    def start(self) -> None:
        self._since = self._now()

    def lap(self, name: str) -> None:
        now = self._now()
        self.seconds[name] += now - self._since
        self._since = now

    def snapshot(self) -> dict:
        return dict(self.seconds)

    def _now(self) -> float:
        if self.sync and self._device_sync is not None:
            self._device_sync()
        return time.perf_counter()


def device_sync_for(gpu: bool) -> Callable[[], None] | None:
    """What drains this rank's device before a reading: TensorFlow's sync on a GPU, nothing on a CPU (where a
    tf.function call returns when its work is done)."""
    if not gpu:
        return None
    import tensorflow as tf
    return tf.test.experimental.sync_devices
