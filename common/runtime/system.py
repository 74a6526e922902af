"""Where a run's time and machine go: summary.json's `system` object, measured during the run.

- Input wait and step time: the training loop times every `next()` on the input and every training step
  (the history's `input_wait_seconds` and `step_seconds` per epoch).
- Collectives: the training steps keep a clock of their phases (common/runtime/phases.py; the data-parallel step
  runs its forward and backward pass, the grouped allreduce of its gradients and the update as three calls).
  A window of `system.window_steps` steps, opened after `system.warmup_steps` steps (tracing and the first
  allocations done) and closed early at an epoch's end or an evaluation, reads it: the seconds the steps were
  blocked in the allreduce, against the window's wall time, are `allreduce_share` (the mean over the ranks;
  each rank's in `allreduce_share_per_rank`). After the run the same grouped allreduce runs on its own with the
  ranks starting together, and a one-element one beside it (Horovod's coordination: its cycle and negotiation).
  Their difference is the transfer: the bytes over it are `allreduce_gb_per_s`, and what the steps were blocked
  beyond it is `allreduce_wait_share` (waiting for the other ranks, for Horovod's cycle and its negotiation). Horovod's own timeline is not used: its writer thread
  spins on rank 0 for the whole run once HOROVOD_TIMELINE is set, which costs a core's share on a full node.
- FLOP/s: the model's training GFLOP per sample (common/runtime/flops.py) x the steady samples/s, against the
  node's probed peak (common/runtime/probe.py) times the nodes.
- Memory: each rank's peak resident set (getrusage), and the GPU's peak allocation where there is one.
- Energy: RAPL package counters (/sys/class/powercap/intel-rapl:N, one reader per node) or NVML on GPUs, from
  run_start to run_stop, over the samples trained; null with the reason when neither can be read.
"""
from __future__ import annotations

import dataclasses
import math
import resource
import statistics
import time

from common.runtime.dist import DistEnv
from common.runtime.phases import PhaseClock, device_sync_for

EXCHANGE_REPEATS = 10  # runs of the gradients' allreduce on its own, and of a one-element one (median of each)


@dataclasses.dataclass
class Window:
    """The steps the system window timed: where they start, and the loop's totals and the step phases' seconds
    inside them."""

    first_step: int = 0
    steps: int = 0
    start: float = 0.0
    seconds: float = 0.0
    totals_at_start: dict = dataclasses.field(default_factory=dict)
    totals: dict = dataclasses.field(default_factory=dict)  # what the loop timed inside the window
    phases_at_start: dict = dataclasses.field(default_factory=dict)
    phases: dict = dataclasses.field(default_factory=dict)  # the steps' phase seconds inside the window


class StepWindow:
    """Times a window of `steps` training steps after `warmup` (closed early at a boundary): the loop's totals
    and the phases of the steps' clock (on a GPU the clock waits for the device inside the window only)."""

    def __init__(self, warmup: int, steps: int):
        self.warmup, self.steps = warmup, steps
        self.clock: PhaseClock | None = None
        self.window: Window | None = None
        self.closed = False

    @property
    def enabled(self) -> bool:
        return self.steps > 0

    def attach(self, clock: PhaseClock | None) -> None:
        """The clock of the steps about to be trained (None: steps that keep none)."""
        self.clock = clock

    def tick(self, done: int, boundary: bool, totals: dict) -> None:
        """After a training step: `done` steps so far in this attempt; `boundary`: an epoch's end or an
        evaluation follows, which the window must not span; `totals`: the loop's running totals."""
        if not self.enabled or self.closed:
            return
        if self.window is None:
            if done >= self.warmup and not boundary:
                self._open(done, totals)
            return
        if done - self.window.first_step >= self.steps or boundary:
            self._close(done, totals)

    def finish(self, done: int, totals: dict) -> None:
        """Close the window if the run ended inside it."""
        if self.window is not None and not self.closed:
            self._close(done, totals)

    def _open(self, done: int, totals: dict) -> None:
        phases = {}
        if self.clock is not None:
            self.clock.sync = True
            phases = self.clock.snapshot()
        self.window = Window(first_step=done, start=time.perf_counter(), totals_at_start=dict(totals),
                             phases_at_start=phases)

    def _close(self, done: int, totals: dict) -> None:
        w = self.window
        w.steps, w.seconds = done - w.first_step, time.perf_counter() - w.start
        w.totals = {k: totals[k] - w.totals_at_start.get(k, 0.0) for k in totals}
        if self.clock is not None:
            self.clock.sync = False
            w.phases = {k: v - w.phases_at_start.get(k, 0.0) for k, v in self.clock.snapshot().items()}
        self.closed = True


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
    sync = device_sync_for(dist.gpu) or (lambda: None)
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


def peak_rss_mb() -> float:
    """This process's peak resident set (Linux reports kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gpu_peak_mb(dist: DistEnv) -> float | None:
    """Peak memory TensorFlow allocated on this rank's GPU; None without one."""
    if not dist.gpu:
        return None
    import tensorflow as tf
    return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20


def step_breakdown(window_totals: dict, seconds: float, collective_seconds: float | None) -> dict:
    """Shares of the window's wall time: compute (the steps minus their collectives), allreduce, input wait,
    other (the loop around the steps: learning-rate updates, hooks, logging)."""
    steps_s, wait_s = window_totals.get("step_seconds", 0.0), window_totals.get("input_wait_seconds", 0.0)
    allreduce = collective_seconds or 0.0
    shares = {"compute": max(0.0, steps_s - allreduce), "allreduce": allreduce, "input_wait": wait_s,
              "other": max(0.0, seconds - steps_s - wait_s)}
    total = sum(shares.values()) or 1.0
    return {k: v / total for k, v in shares.items()}


def mean_shares(breakdowns: list[dict]) -> dict:
    """The ranks' step breakdowns averaged share by share."""
    return {k: statistics.mean(b[k] for b in breakdowns) for k in breakdowns[0]}


def steady(history: list[dict]) -> list[dict]:
    """The epochs after the first (which traces), or the only one."""
    trained = [h for h in history if h.get("train_seconds")]
    return trained[1:] or trained


def input_wait_share(history: list[dict]) -> float | None:
    """Share of the steady epochs' training time the steps waited for their input."""
    epochs = [h for h in steady(history) if "input_wait_seconds" in h]
    seconds = sum(h["train_seconds"] for h in epochs)
    return min(1.0, sum(h["input_wait_seconds"] for h in epochs) / seconds) if seconds > 0 else None


def samples_trained(history: list[dict]) -> float:
    return sum(h.get("samples_per_second", 0.0) * h.get("train_seconds", 0.0) for h in history)


def flops_figures(gflop_per_sample: float | None, samples_per_second: float | None, peak: dict | None,
                  nodes: int) -> dict:
    """Sustained GFLOP/s of the whole job and its fraction of the probed peak of its nodes."""
    if not gflop_per_sample or not samples_per_second:
        return {"gflop_per_sample": gflop_per_sample, "sustained_gflops": None, "fraction_of_peak": None}
    sustained = gflop_per_sample * samples_per_second
    fraction = sustained / (peak["peak_gflops"] * nodes) if peak else None
    return {"gflop_per_sample": gflop_per_sample, "sustained_gflops": sustained, "fraction_of_peak": fraction}


def describe_peak(peak: dict | None) -> dict | None:
    keep = ("host", "cpu", "cores", "tensorflow", "gemm_gflops", "conv3d_gflops", "peak_gflops", "measured_at",
            "cache")
    return {k: peak[k] for k in keep if k in peak} if peak else None
