"""The gradients' allreduce timed on its own, after a run of more than one rank, and the collective figures of
summary.json's `system` from it (common/runtime/monitor.py, "The system window and figures").

The steps' window gives the seconds each rank was blocked in the allreduce phase. Run alone with the ranks
starting together, the same grouped allreduce less a one-element one (Horovod's coordination: the wait for its
cycle and the negotiation) is the transfer; the rest of the blocked time is waiting.
"""
from __future__ import annotations

import math
import statistics
import time

from common.runtime.dist import DistEnv
from common.runtime import gpu

EXCHANGE_REPEATS = 10  # runs of the gradients' allreduce on its own, and of a one-element one (median of each)


def exchange_timing(dist: DistEnv, variables: list, repeats: int = EXCHANGE_REPEATS) -> dict:
    """The gradients' grouped allreduce on its own, the ranks starting together (a barrier before each run):
    the median seconds of `repeats` runs, those of a one-element allreduce (Horovod's coordination: the wait
    for its cycle and the negotiation, no data to speak of), and the bytes. A collective."""
    import tensorflow as tf
    tensors = [tf.zeros(v.shape, v.dtype) for v in variables]
    nbytes = sum(math.prod(t.shape) * t.dtype.size for t in tensors)
    reduce = tf.function(dist.allreduce_gradients)
    seconds = _median_seconds(dist, lambda: reduce(tensors), repeats)
    latency = _median_seconds(dist, lambda: reduce([tf.zeros((1,))]), repeats)
    return {"seconds": seconds, "latency_seconds": latency, "bytes": nbytes, "repeats": repeats}


def _median_seconds(dist: DistEnv, run, repeats: int) -> float:
    sync = gpu.sync_devices if dist.gpu else (lambda: None)
    run()  # traces
    times = []
    for _ in range(repeats):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def collective_figures(windows: list[tuple[float, float]], steps: int, exchange: dict) -> dict:
    """allreduce_share (the steps blocked in the gradients' allreduce), its part spent waiting (for the other
    ranks, Horovod's cycle and its negotiation: all but the transfer), and the transfer's bandwidth. `windows`:
    each rank's (seconds in the allreduce phase, window seconds) over the window's `steps`; `exchange`:
    exchange_timing (the transfer: the gradients' allreduce on its own less a one-element one)."""
    shares = [blocked / seconds for blocked, seconds in windows]
    share = min(1.0, statistics.mean(shares))
    transfer = max(0.0, exchange["seconds"] - exchange["latency_seconds"])
    waits = [max(0.0, blocked - steps * transfer) / seconds for blocked, seconds in windows]
    return {"allreduce_share": share, "allreduce_share_per_rank": shares,
            "allreduce_wait_share": min(share, statistics.mean(waits)),
            "allreduce_gb_per_s": exchange["bytes"] / transfer / 1e9 if transfer > 0 else None,
            "allreduce_bytes_per_step": exchange["bytes"]}
