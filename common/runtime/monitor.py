"""What a run measures besides its MLPerf events: summary.json's `system` object, TensorBoard and the I/O report. What
each figure means and how it is measured: docs/metrics.md; the I/O report: docs/staging.md.

    monitor = RunMonitor(cfg, dist)
    monitor.prepare()        # before run_start: the node's peak (probed once per host, cached)
    monitor.started()        # at run_start: energy counters
    ... a callback of the loop: the phase clock at its start, the window and TensorBoard after every step
    and every evaluation
    monitor.stopped()        # at run_stop: energy counters
    figures = monitor.system_figures(result, model, samples_per_second)   # collective
    monitor.close(figures)

Its sections: the monitor (RunMonitor, the callback that drives the rest); the system window and figures; FLOPs;
energy (RAPL, NVML); TensorBoard; the I/O report.
"""
from __future__ import annotations

import math
import resource
import statistics
import time
from pathlib import Path
from typing import Any, TYPE_CHECKING

from common.base.files import write_json_atomic
from common.base.host import PEAK_KEYS, cache_path, cached
from common.runtime import gpu as gpu_module
from common.runtime.dist import DistEnv
from common.runtime.loop import Callback, Loop
from common.runtime.strategy import PhaseClock
from common.io.input import Datasets


# === The monitor ======================================================================================================

class RunMonitor(Callback):
    """This rank's measurements of one run."""

    def __init__(self, cfg: Any, dist: DistEnv):
        out = Path(cfg.run.output_dir)
        self.cfg, self.dist = cfg.system, dist
        self.precision = cfg.train.precision  # resolved (not auto) by now: the peak fraction_of_peak is against
        steps = cfg.system.window_steps if cfg.system.enabled and not cfg.dist.elastic.enabled else 0
        self.window = StepWindow(cfg.system.warmup_steps, steps)
        self.elastic = cfg.dist.elastic.enabled
        self.emulated = cfg.train.emulated
        self.energy: tuple = (None, None, "energy counters not read")  # energy_start's answer
        self.readings: tuple | None = None
        self.board = board_writer(out) if cfg.tensorboard.enabled and dist.is_root else None  # TensorBoard
        self.board_every = cfg.tensorboard.every_steps
        self.peak: dict | None = None
        self.peak_reason = ""
        self.last_step = self.last_done = 0
        self.last_totals: dict = {}

    def prepare(self) -> None:
        """Rank 0 reads (or, with system.probe, measures once) its node's peak; nodes are taken as alike."""
        if not (self.cfg.enabled and self.dist.is_root):
            return
        if self.emulated:
            self.peak_reason = "an emulated accelerator's run computes nothing"
            return
        record = cached()
        if record is None and not self.cfg.probe:
            self.peak_reason = (f"no probe of this host in {cache_path()} and system.probe=false: run "
                                f"python -m common.runtime.probe")
            return
        if record is None:
            from common.runtime.probe import probe  # the kernels: only a host without a cached probe
            record = probe()
        self.peak = record

    def started(self) -> None:
        if self.cfg.enabled:
            self.energy = energy_start(self.dist)

    def stopped(self) -> None:
        if self.cfg.enabled:
            self.readings = energy_stop(*self.energy)

    def start(self, loop: Loop) -> None:
        """The phase clock of the steps the loop is about to train (None: steps that keep none)."""
        self.window.attach(loop.steps.clock)

    def after_step(self, loop: Loop) -> None:
        """`boundary`: an epoch's end or an evaluation follows, which the window does not time."""
        every, step = loop.options.eval_every_steps, loop.global_step
        boundary = loop.step == loop.data.train_steps or bool(every and step % every == 0)
        self.window.tick(loop.done, boundary, loop.totals)
        self.last_step, self.last_done, self.last_totals = step, loop.done, loop.totals  # the loop's, kept current
        if self.board and step % self.board_every == 0:
            running = loop.running
            self.scalars(step, {"train/loss": running.get("loss"), "train/learning_rate": running.get("lr"),
                                "train/samples_per_second": running.get("samples_per_second")})

    def evaluated(self, loop: Loop, record: dict) -> None:
        """TensorBoard: the metric (and its parts) and the validation loss."""
        if self.board:
            self.scalars(record["step"], {f"eval/{k}": v for k, v in record.items() if k not in TRAINING_KEYS})

    def system_figures(self, dist: DistEnv, history: list[dict], model: Any,
                       samples_per_second: float | None) -> dict | None:
        """summary.json's `system` (on rank 0; a collective on every rank of `dist`, the run's layout now);
        None when system.enabled is off."""
        if not self.cfg.enabled:
            return None
        self.dist = dist  # an elastic run's layout now
        self.window.finish(self.last_done, self.last_totals)  # a run that ended inside the window
        rss = self.dist.gather_object(peak_rss_mb())
        gpu = self.dist.gather_object(gpu_module.peak_memory_mb() if self.dist.gpu else None)
        readings = self.dist.gather_object(self.readings or (None, None, "energy counters not read"))
        collectives = self._collectives(model)
        if not self.dist.is_root:
            return None
        return self._figures(history, model, samples_per_second, rss, gpu, readings, collectives)

    def _figures(self, history, model, samples_per_second, rss, gpu, readings, collectives: dict) -> dict:
        joules, source, reason = job_energy(readings)
        trained = samples_trained(history)
        figures = {"peak": describe_peak(self.peak),
                   **flops_figures(training_gflop_per_sample(model), samples_per_second, self.peak,
                                   self.dist.num_nodes, self.precision),
                   "input_wait_share": input_wait_share(history),
                   "peak_rss_mb": rss, "gpu_peak_memory_mb": gpu if self.dist.gpu else None,
                   "energy_joules": joules, "energy_source": source or None,
                   "energy_j_per_sample": joules / trained if joules is not None and trained else None,
                   **collectives}
        figures["reasons"] = _reasons(figures, self.peak_reason, reason, self._window_reason())
        return figures

    def _collectives(self, model: Any) -> dict:
        """The window's figures on rank 0 (a collective: every rank's window is gathered, and with more than one
        rank the gradients' allreduce is timed on its own)."""
        w = self.window if self.window.closed else None
        timed = w is not None and w.steps > 0
        exchanged = self.dist.several
        none = None if exchanged else 0.0  # one rank: nothing to wait for or exchange
        figures = {"allreduce_share": none, "allreduce_wait_share": none, "allreduce_gb_per_s": None,
                   "allreduce_bytes_per_step": none}
        if not timed:  # the same on every rank (their windows close at the same steps): no collective to match
            return figures | {"step_breakdown": None, "window": None}
        blocked = w.phases.get("allreduce", 0.0)
        breakdown = step_breakdown(w.totals, w.seconds, blocked)
        ranks = self.dist.gather_object(((blocked, w.seconds), breakdown))
        exchange = None
        if exchanged:
            from common.runtime.exchange import collective_figures, exchange_timing
            exchange = exchange_timing(self.dist, model.trainable_variables)
        if not self.dist.is_root:
            return {}
        if exchange:
            figures = collective_figures([r[0] for r in ranks], w.steps, exchange)
        return figures | {"step_breakdown": mean_shares([r[1] for r in ranks]),
                          "window": {"first_step": w.first_step, "steps": w.steps, "seconds": w.seconds,
                                     "exchange": exchange}}

    def _window_reason(self) -> str:
        if not self.dist.several:
            return "one rank: no allreduce"
        if self.window.closed and self.window.steps:
            return ("the gradients' allreduce on its own took no longer than a one-element one: too small to "
                    "time beside Horovod's coordination")
        if self.elastic:
            return "elastic runs record no window of steps (their ranks may change inside it)"
        if self.cfg.window_steps == 0:
            return "system.window_steps is 0"
        return f"the run trained fewer than system.warmup_steps + 1 = {self.cfg.warmup_steps + 1} steps"

    def close(self, figures: dict | None) -> None:
        """TensorBoard: the run's `system` figures, then the event file closed."""
        if not self.board:
            return
        if figures:
            flat = {f"system/{k}": v for k, v in figures.items()}
            flat |= {f"system/step_{k}": v for k, v in (figures.get("step_breakdown") or {}).items()}
            if figures.get("peak_rss_mb"):
                flat["system/peak_rss_mb_max"] = max(figures["peak_rss_mb"])
            self.scalars(self.last_step, flat)
        self.board.flush()
        self.board.close()

    def scalars(self, step: int, values: dict) -> None:
        """Write every finite number in `values` at `step` into TensorBoard."""
        import tensorflow as tf
        with self.board.as_default(step=step):
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
                    tf.summary.scalar(name, float(value))


def _reasons(figures: dict, peak_reason: str, energy_reason: str, window_reason: str) -> dict:
    """Why each null figure is null."""
    why = {"fraction_of_peak": peak_reason or "no peak probe", "energy_j_per_sample": energy_reason,
           "allreduce_share": window_reason, "allreduce_gb_per_s": window_reason, "step_breakdown": window_reason,
           "gpu_peak_memory_mb": "no GPU", "sustained_gflops": "no steady samples/s"}
    return {k: v for k, v in why.items() if figures.get(k) is None and v}


# === The system window and figures ====================================================================================
# Input wait and step time come from the loop's history; the allreduce's share from the steps' phase clock
# (common/runtime/strategy.py) read over a window of system.window_steps steps after system.warmup_steps, then the
# same allreduce timed on its own after the run (common/runtime/exchange.py). Why and how: docs/metrics.md.


class StepWindow:
    """Times a window of `length` training steps after `warmup` (closed early at a boundary): the loop's totals
    and the phases of the steps' clock inside it (on a GPU the clock waits for the device inside the window only).
    Once closed: `first_step`, `steps` and `seconds` are what it timed, `totals` and `phases` the loop's totals and
    the steps' phase seconds inside it."""

    def __init__(self, warmup: int, length: int):
        self.warmup, self.length = warmup, length
        self.clock: PhaseClock | None = None
        self.opened = self.closed = False
        self.first_step, self.steps, self.start, self.seconds = 0, 0, 0.0, 0.0
        self.totals_at_start: dict = {}
        self.totals: dict = {}
        self.phases_at_start: dict = {}
        self.phases: dict = {}

    @property
    def enabled(self) -> bool:
        return self.length > 0

    def attach(self, clock: PhaseClock | None) -> None:
        """The clock of the steps about to be trained (None: steps that keep none)."""
        self.clock = clock

    def tick(self, done: int, boundary: bool, totals: dict) -> None:
        """After a training step: `done` steps so far in this attempt; `boundary`: an epoch's end or an
        evaluation follows, which the window must not span; `totals`: the loop's running totals."""
        if not self.enabled or self.closed:
            return
        if not self.opened:
            if done >= self.warmup and not boundary:
                self._open(done, totals)
            return
        if done - self.first_step >= self.length or boundary:
            self._close(done, totals)

    def finish(self, done: int, totals: dict) -> None:
        """Close the window if the run ended inside it."""
        if self.opened and not self.closed:
            self._close(done, totals)

    def _open(self, done: int, totals: dict) -> None:
        if self.clock is not None:
            self.clock.sync = True
            self.phases_at_start = self.clock.snapshot()
        self.opened, self.first_step, self.start = True, done, time.perf_counter()
        self.totals_at_start = dict(totals)

    def _close(self, done: int, totals: dict) -> None:
        self.steps, self.seconds = done - self.first_step, time.perf_counter() - self.start
        self.totals = {k: totals[k] - self.totals_at_start.get(k, 0.0) for k in totals}
        if self.clock is not None:
            self.clock.sync = False
            self.phases = {k: v - self.phases_at_start.get(k, 0.0) for k, v in self.clock.snapshot().items()}
        self.closed = True


def peak_rss_mb() -> float:
    """This process's peak resident set (Linux reports kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
                  nodes: int, precision: str = "float32") -> dict:
    """Sustained GFLOP/s of the whole job and its fraction of its nodes' probed peak in the precision it trains in
    (`peak_precision`: float32's peak_gflops, or peak_bf16_gflops for mixed_bfloat16)."""
    numerics = "bfloat16" if precision == "mixed_bfloat16" else "float32"
    if not gflop_per_sample or not samples_per_second:
        return {"gflop_per_sample": gflop_per_sample, "sustained_gflops": None, "fraction_of_peak": None,
                "peak_precision": numerics}
    sustained = gflop_per_sample * samples_per_second
    fraction = sustained / (peak[PEAK_KEYS[numerics]] * nodes) if peak else None
    return {"gflop_per_sample": gflop_per_sample, "sustained_gflops": sustained, "fraction_of_peak": fraction,
            "peak_precision": numerics}


def describe_peak(peak: dict | None) -> dict | None:
    keep = ("host", "cpu", "cores", "tensorflow", "gemm_gflops", "conv3d_gflops", "peak_gflops", "bf16_gemm_gflops",
            "bf16_conv3d_gflops", "peak_bf16_gflops", "measured_at", "cache")
    return {k: peak[k] for k in keep if k in peak} if peak else None


# === FLOPs ============================================================================================================
# Training work per sample, counted from a Keras model's layer shapes.
#
# Two flops per multiply-add of the convolution and dense layers, times 3 for the forward pass, the input
# gradient and the weight gradient (times 2 for the first such layer, whose input gradient is not computed).
# Batch norm, activations, pooling, the loss and the optimizer update are not counted: they are a few per cent
# of the work and no peak rate would cover them. Dilation does not change a convolution's count; a transposed
# convolution counts every input pixel's k x k scatter (the cropped row and column included).

def forward_multiply_adds(layer) -> int:
    """Multiply-adds of one sample's forward pass through `layer` (nested models included); 0 for layers
    without a kernel."""
    from keras import layers
    if hasattr(layer, "layers"):  # a nested model
        return sum(forward_multiply_adds(inner) for inner in layer.layers)
    kernel = math.prod(getattr(layer, "kernel_size", ()) or (1,))
    if isinstance(layer, layers.SeparableConv2D):  # depthwise k x k, then pointwise 1 x 1
        out, cin = layer.output.shape, layer.input.shape[-1]
        return _pixels(out) * cin * (kernel * layer.depth_multiplier + out[-1])
    if isinstance(layer, layers.DepthwiseConv2D):
        return _pixels(layer.output.shape) * layer.input.shape[-1] * layer.depth_multiplier * kernel
    if isinstance(layer, (layers.Conv2DTranspose, layers.Conv3DTranspose)):
        return _pixels(layer.input.shape) * layer.input.shape[-1] * layer.filters * kernel
    if isinstance(layer, (layers.Conv1D, layers.Conv2D, layers.Conv3D)):
        out = layer.output.shape
        return _pixels(out) * layer.input.shape[-1] * out[-1] * kernel
    if isinstance(layer, layers.Dense):
        return math.prod(layer.input.shape[1:]) // layer.input.shape[-1] * layer.input.shape[-1] * layer.units
    return 0


def _pixels(shape) -> int:
    """Spatial positions of a channels-last (batch, ..., channels) shape."""
    return math.prod(shape[1:-1])


def training_gflop_per_sample(model) -> float:
    """GFLOP of one sample's training step (forward and backward) through `model`'s conv and dense layers."""
    macs = [forward_multiply_adds(layer) for layer in model.layers]  # model.layers: topological order
    first = next((m for m in macs if m), 0)
    return 2.0 * (3 * sum(macs) - first) / 1e9


# === Energy ===========================================================================================================
# From the platform's counters, or the reason there is none (never an estimate): RAPL package domains (also on AMD's
# Linux driver) read by each node's local rank 0, their wrap-around included; NVML on every GPU rank.

POWERCAP = Path("/sys/class/powercap")


def rapl_packages(root: Path = POWERCAP) -> list[Path]:
    """The RAPL package domains (intel-rapl:0, intel-rapl:1, ...; not their sub-domains)."""
    return sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)


def read_rapl(root: Path = POWERCAP) -> tuple[dict | None, str]:
    """{domain: (energy µJ, wrap µJ)}, or None and why not."""
    domains = rapl_packages(root)
    if not domains:
        return None, f"no RAPL package domains under {root}"
    try:
        return {d.name: (int((d / "energy_uj").read_text()), int((d / "max_energy_range_uj").read_text()))
                for d in domains}, ""
    except (OSError, ValueError) as err:
        return None, f"RAPL counters under {root} unreadable ({err.__class__.__name__}: {err})"


def rapl_joules(before: dict, after: dict) -> float:
    """Joules between two readings of the same domains, each counter's wrap-around included."""
    total = 0
    for name, (start, wrap) in before.items():
        end = after[name][0]
        total += end - start if end >= start else end + wrap - start
    return total / 1e6


def energy_start(dist: DistEnv) -> tuple[str | None, Any, str]:
    """At run_start: (source, this rank's counter reading, reason when none). A node's local rank 0 reads its
    package counters (RAPL) for the node; every GPU rank reads its GPU's (NVML)."""
    if dist.gpu:
        start, reason = gpu_module.nvml_millijoules()
        return ("NVML" if start is not None else None), start, reason
    if dist.local_rank == 0:
        start, reason = read_rapl()
        return ("RAPL" if start is not None else None), start, reason
    return "none needed", None, ""


def energy_stop(source: str | None, start: Any, reason: str) -> tuple[float | None, str | None, str]:
    """At run_stop, given energy_start's answer: (joules this rank accounts for, source, reason when None)."""
    if source == "none needed":
        return 0.0, None, ""
    if source == "NVML":
        end, reason = gpu_module.nvml_millijoules()
        return (None, None, reason) if end is None else ((end - start) / 1e3, "NVML", "")
    if source == "RAPL":
        end, reason = read_rapl()
        return (None, None, reason) if end is None else (rapl_joules(start, end), "RAPL", "")
    return None, None, reason


def job_energy(readings: list[tuple[float | None, str | None, str]]) -> tuple[float | None, str, str]:
    """(joules of the job, source, reason when None) from every rank's stop()."""
    missing = [reason for joules, _, reason in readings if joules is None]
    if missing:
        return None, "", missing[0]
    sources = sorted({source for _, source, _ in readings if source})
    return sum(j for j, _, _ in readings), "+".join(sources), ""


# === TensorBoard ======================================================================================================
# Rank 0's event files in RUN_DIR/tensorboard; the scalars written: docs/metrics.md.

SUBDIR = "tensorboard"
# A history record's keys that are not the evaluation's.
TRAINING_KEYS = {"epoch", "step", "loss", "lr", "steps", "train_seconds", "samples_per_second", "input_wait_seconds",
                 "step_seconds", "val_samples_seen"}


def board_writer(out_dir: Path):
    """A tf.summary file writer for rank 0's scalars in RUN_DIR/tensorboard."""
    import tensorflow as tf
    return tf.summary.create_file_writer(str(out_dir / SUBDIR))


# ---------------------------------------------------------------------------- the I/O report
# What each rank read while training, kept in two kinds: `measured` (the kernel's /proc/self/io counters over the
# training phase: everything the process read, but not what it read through mmap) and `planned` (from the read plan);
# and what staging did. Every rank's figures are gathered; rank 0 writes io_report.json and puts them in summary.json.
# How to read them: docs/staging.md.
if TYPE_CHECKING:
    from common.io.staging import StageResult

PROC_IO = Path("/proc/self/io")
PROC_KEYS = ("rchar", "read_bytes", "syscr")
REPORT_NAME = "io_report.json"


def read_proc_io() -> dict[str, int]:
    """This process's read counters, or {} where the kernel does not provide them."""
    try:
        fields = dict(line.split(": ") for line in PROC_IO.read_text().splitlines())
    except (OSError, ValueError):
        return {}
    return {k: int(fields[k]) for k in PROC_KEYS if k in fields}


def io_start() -> dict:
    """This rank's read counters when the input pipelines are built (`io_stop` takes them)."""
    return {"started": time.perf_counter(), "proc": read_proc_io()}


def io_stop(start: dict, data: Datasets, history: list[dict]) -> dict:
    """This rank's reads during training, from `io_start`'s counters: `seconds`, the kernel's counter deltas
    (`measured`) and the read plan's figures (`planned`)."""
    end = read_proc_io()
    return {"seconds": time.perf_counter() - start["started"],
            "measured": {k: end[k] - start["proc"][k] for k in end if k in start["proc"]},
            "planned": planned_reads(data, history)}


def planned_reads(data: Datasets, history: list[dict]) -> dict:
    """Records, bytes and file opens of this rank's training and evaluations, from the read plan."""
    steps = sum(h.get("steps", 0) for h in history)
    evaluations = sum(1 for h in history if "val_samples_seen" in h)
    train_records = steps * data.local_batch_size
    val_records = evaluations * (data.val_rank_samples or data.val_steps * data.local_batch_size)
    passes = steps / data.train_steps if data.train_steps else 0.0
    read = int((train_records + val_records) * data.record_bytes)
    return {"train_records": train_records, "eval_records": val_records, "bytes": read,
            "files_opened": round(passes * data.train_files) + evaluations * data.val_files,
            "decoded_fraction": data.decoded_fraction, "block_records": data.block_records}


def io_report(counters: dict, staging: StageResult | None, history: list[dict], dist) -> dict:
    """Every rank's figures, the totals and the staging summary (collective: every rank must call it; `dist`
    is the run's DistEnv: its rank, node and gather_object)."""
    mine = {"rank": dist.rank, "node": dist.node, **counters, "staging": staging.figures() if staging else None}
    ranks = dist.gather_object(mine)
    for r in ranks:
        seconds = max(r["seconds"], 1e-9)
        r["planned_read_mb_per_second"] = r["planned"]["bytes"] / seconds / 1e6
        r["measured_read_mb_per_second"] = r["measured"].get("rchar", 0) / seconds / 1e6 if r["measured"] else None
    epochs = [h["train_seconds"] for h in history if "train_seconds" in h]
    report = {"ranks": ranks, "totals": _totals(ranks),
              "mean_epoch_seconds": statistics.mean(epochs) if epochs else None, "staging": None}
    staged = [r["staging"] for r in ranks if r["staging"]]
    if staged:
        from common.io.staging import staging_summary
        report["staging"] = staging_summary(staged)
        if report["mean_epoch_seconds"]:
            ratio = report["staging"]["seconds"] / report["mean_epoch_seconds"]
            report["staging_seconds_over_mean_epoch_seconds"] = ratio
    return report


def _totals(ranks: list[dict]) -> dict:
    measured = [r["measured"] for r in ranks if r["measured"]]
    return {"planned_bytes": sum(r["planned"]["bytes"] for r in ranks),
            "planned_files_opened": sum(r["planned"]["files_opened"] for r in ranks),
            "planned_read_mb_per_second": sum(r["planned_read_mb_per_second"] for r in ranks),
            "measured_rchar_bytes": sum(m.get("rchar", 0) for m in measured) if measured else None,
            "measured_storage_read_bytes": sum(m.get("read_bytes", 0) for m in measured) if measured else None,
            "measured_read_mb_per_second": (sum(r["measured_read_mb_per_second"] for r in ranks)
                                            if measured else None)}


def write_io_report(report: dict, output_dir: str | Path) -> Path:
    return write_json_atomic(report, Path(output_dir) / REPORT_NAME)
