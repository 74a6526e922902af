"""Where a run's time and machine go: summary.json's `system` object, measured during the run.

- Input wait and step time: the training loop times every `next()` on the input and every training step
  (the history's `input_wait_seconds` and `step_seconds` per epoch).
- Collectives: a window of `system.window_steps` training steps, opened after `system.warmup_steps` steps
  (tracing and the first allocations done) and closed early at an epoch's end or an evaluation, is recorded
  with Horovod's timeline (HOROVOD_TIMELINE=DYNAMIC, hvd.start_timeline/stop_timeline) into
  `horovod_timeline.json` in the run directory. Rank 0's timeline shows, per tensor, the wait for every rank
  to be ready (NEGOTIATE_*: slower ranks and the cycle time) and the exchange (ALLREDUCE with its memory
  copies): the step is blocked from the first to the last, since the gradients go in one grouped allreduce
  after the backward pass. Their union over the window, against the window's wall time, is `allreduce_share`;
  the bytes of the exchanged tensors over the exchange time are `allreduce_gb_per_s` (algorithm bandwidth).
  A one-rank run times the same window without a timeline (no collectives: allreduce 0).
- FLOP/s: the model's training GFLOP per sample (common/runtime/flops.py) x the steady samples/s, against the
  node's probed peak (common/runtime/probe.py) times the nodes.
- Memory: each rank's peak resident set (getrusage), and the GPU's peak allocation where there is one.
- Energy: RAPL package counters (/sys/class/powercap/intel-rapl:N, one reader per node) or NVML on GPUs, from
  run_start to run_stop, over the samples trained; null with the reason when neither can be read.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import resource
import time
from pathlib import Path

from common.runtime.dist import DistEnv

TIMELINE_FILE = "horovod_timeline.json"
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "uint8": 1,
               "int8": 1, "bool": 1}
COLLECTIVES = ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER")


@dataclasses.dataclass
class Window:
    """The steps recorded in Horovod's timeline: where they start, and the loop's totals at both ends."""

    first_step: int = 0
    steps: int = 0
    start: float = 0.0
    seconds: float = 0.0
    totals_at_start: dict = dataclasses.field(default_factory=dict)
    totals: dict = dataclasses.field(default_factory=dict)  # what the loop timed inside the window


class CollectiveWindow:
    """Times a window of `steps` training steps after `warmup` (closed early at a boundary); with more than one
    rank, Horovod's timeline records it too. One rank has no collectives: its window is timed only."""

    def __init__(self, dist: DistEnv, path: Path, warmup: int, steps: int):
        self.dist, self.path, self.warmup, self.steps = dist, path, warmup, steps
        self.window: Window | None = None
        self.closed = False
        self.timeline = dist.horovod and dist.size > 1
        # A HOROVOD_TIMELINE file the user set records the whole run instead; only DYNAMIC allows a window.
        self.enabled = steps > 0 and (not self.timeline or os.environ.get("HOROVOD_TIMELINE") == "DYNAMIC")

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
        if self.timeline:
            import horovod.tensorflow as hvd
            self.path.parent.mkdir(parents=True, exist_ok=True)
            hvd.start_timeline(str(self.path), mark_cycles=False)
        self.window = Window(first_step=done, start=time.perf_counter(), totals_at_start=dict(totals))

    def _close(self, done: int, totals: dict) -> None:
        w = self.window
        w.steps, w.seconds = done - w.first_step, time.perf_counter() - w.start
        if self.timeline:
            import horovod.tensorflow as hvd
            hvd.stop_timeline()
        w.totals = {k: totals[k] - w.totals_at_start.get(k, 0.0) for k in totals}
        self.closed = True


def timeline_spans(path: Path) -> list[tuple[str, float, float, dict]]:
    """(activity, start s, end s, end args) of every top-level activity in a Horovod timeline file."""
    # Horovod leaves the array open while it records, and a comma may precede its closing bracket.
    events = json.loads(path.read_text().rstrip().rstrip("]").rstrip().rstrip(",") + "]")
    open_by_tensor: dict[int, list] = {}
    spans = []
    for e in events:
        if e.get("ph") == "B":
            open_by_tensor.setdefault(e["pid"], []).append((e["name"], e["ts"]))
        elif e.get("ph") == "E" and open_by_tensor.get(e["pid"]):
            name, start = open_by_tensor[e["pid"]].pop()
            if not open_by_tensor[e["pid"]]:  # top level: NEGOTIATE_* or the collective itself
                spans.append((name, start / 1e6, e["ts"] / 1e6, e.get("args") or {}))
    return spans


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end] intervals."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def tensor_bytes(args: dict) -> int:
    """Bytes of the tensor an activity's end event describes ({"dtype": "float32", "shape": "[3, 3]"})."""
    shape = [int(d) for d in str(args.get("shape", "[]")).strip("[]").split(",") if d.strip()]
    return math.prod(shape) * DTYPE_BYTES.get(str(args.get("dtype")), 4)


def collective_figures(path: Path, window: Window) -> dict:
    """allreduce_share (waiting and exchanging), its waiting part, and the exchange's bandwidth in the window."""
    spans = timeline_spans(path)
    exchange = [(s, e) for name, s, e, _ in spans if name in COLLECTIVES]
    waiting = [(s, e) for name, s, e, _ in spans if name.startswith("NEGOTIATE_")]
    nbytes = sum(tensor_bytes(args) for name, _, _, args in spans if name in COLLECTIVES)
    exchange_s = union_seconds(exchange)
    blocked = union_seconds(exchange + waiting)
    return {"allreduce_share": min(1.0, blocked / window.seconds),
            "allreduce_wait_share": min(1.0, union_seconds(waiting) / window.seconds),
            "allreduce_gb_per_s": nbytes / exchange_s / 1e9 if exchange_s > 0 else None,
            "allreduce_bytes_per_step": nbytes / max(1, window.steps),
            "allreduce_seconds": blocked}


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
