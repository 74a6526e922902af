"""An emulated accelerator's run (train.emulate): real input, no model.

`EmulatedStrategy` is data parallel over the same input, staging, sharding, per-epoch shuffle and MLPerf log as a
training run, but its rank builds no model: each training step waits the accelerator's time for the batch it
was given (local batch / samples_per_second, common/storage/accelerators.py) while it takes part in one small
allreduce (the step's loss, 0, and the stop request) beside that wait, so that the ranks stay in step as they
would with gradients to exchange, and the exchange overlaps the compute as on GPUs. An evaluation step waits a third of that and scores the application's untrained
prediction (zeros for CosmoFlow, background everywhere for DeepCAM) with its own loss and metric, so an
emulated run never reaches its target and its log is open division.

`EmulatedRank` is that rank's accelerator: the steps, and a loop callback that empties the page cache of the
dataset before every epoch (train.emulate.page_cache, common/storage/page_cache.py) and measures, over every
step but each epoch's first (whose input the pipeline had not prefetched, as MLPerf Storage leaves it out),
the accelerator utilisation AU = emulated compute time / wall time, the input wait per step and the samples it
was fed. summary.json's `emulation` gathers every rank's figures (docs/storage.md).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from common.base.errors import BenchError
from common.runtime.dist import DistEnv, StopRequests
from common.runtime.loop import Callback, Loop, Steps, Trainee
from common.runtime.monitor import read_proc_io
from common.runtime.strategy import DataParallel, batch_sums
from common.storage import page_cache
from common.storage.accelerators import AU_THRESHOLD, EVAL_FRACTION, rate


class EmulatedStrategy(DataParallel):
    """Data parallel with an emulated accelerator per rank instead of a model."""

    name = "emulated"

    def __init__(self, cfg: Any, dist: DistEnv):
        super().__init__(dist)
        if cfg.dist.elastic.enabled:
            raise BenchError("train.emulate with dist.elastic.enabled=true: an emulated run is not elastic")
        if getattr(getattr(cfg, "parallel", None), "hybrid", False):
            raise BenchError(f"train.emulate with parallel.spatial={list(cfg.parallel.spatial)}: an emulated run "
                             f"is data parallel; set parallel.spatial=[1, 1]")
        self.emulate = cfg.train.emulate
        self.local_batch = cfg.train.local_batch_size
        self.data_dir = cfg.data.stage_dir or cfg.data.dir  # what the epochs read
        self.benchmark = ""
        self.samples_per_second, self.source = 0.0, ""
        self.rank: EmulatedRank | None = None

    def build(self, app: Any, cfg: Any) -> Trainee:
        """No model: the application's loss, metric and untrained prediction, for the evaluation."""
        import keras
        if app.scoring is None:
            raise BenchError(f"train.emulate: {app.name} gives no scoring for an emulated evaluation")
        self.benchmark = app.name
        self.samples_per_second, self.source = rate(self.emulate, app.name, self.local_batch)
        loss, metric, untrained = app.scoring(cfg)
        self.rank = EmulatedRank(self.dist, 1.0 / self.samples_per_second, loss, metric, untrained,
                                 self.data_dir if self.emulate.page_cache == "evict" else "")
        return Trainee(keras.Sequential(), keras.optimizers.SGD(0.0), loss, metric,
                       schedule_for=lambda _data: lambda _epoch: 0.0)

    def make_steps(self, trainee: Trainee, dist: DistEnv, stop: StopRequests | None = None) -> Steps:
        self.rank.stop = stop
        return Steps(train=self.rank.train, evaluate=self.rank.evaluate, stop=stop)

    def callbacks(self) -> list[Callback]:
        return [self.rank]

    def mlperf_keys(self) -> dict:
        return {"emulated_accelerator": self.emulate.accelerator,
                "emulated_samples_per_second": self.samples_per_second}

    def summary(self, trainee: Trainee) -> dict:
        """`emulation`: the accelerator, its rate and source, and AU, input and page-cache figures per rank and
        overall (collective)."""
        ranks = self.dist.gather_object(self.rank.figures())
        if not self.dist.is_root:
            return {}
        return {"emulation": emulation_summary(self.emulate.accelerator, self.samples_per_second, self.source,
                                               self.benchmark, self.local_batch, ranks)}


class EmulatedRank(Callback):
    """One rank's emulated accelerator: its training and evaluation steps, and the loop callback that evicts the
    dataset before each epoch and measures the steps."""

    def __init__(self, dist: DistEnv, seconds_per_sample: float, loss: Any, metric: Any, untrained: Any,
                 evict_dir: str):
        self.dist, self.seconds_per_sample = dist, seconds_per_sample
        self.loss, self.metric, self.untrained = loss, metric, untrained
        self.evict_dir = evict_dir
        self.stop: StopRequests | None = None
        self.compute = self.wall = self.input_wait = 0.0  # over the measured steps
        self.steps = self.samples = 0
        self.all_compute = 0.0  # every training step's emulated seconds
        self.last: float | None = None  # the previous step's end, within an epoch
        self.pending = (0.0, 0)  # the last step's emulated seconds and samples
        self.waited = 0.0  # the loop's input wait total at the previous step
        self.evictions: list[dict] = []
        self.io_start: tuple[float, dict] = (time.perf_counter(), {})
        self.exchange = ThreadPoolExecutor(1, thread_name_prefix="emulated-allreduce")
        self.allreduces, self.allreduce_seconds = 0, 0.0  # the steps' allreduces and their time
        self.trained = 0  # training steps taken
        self.allreduce_exposed = 0.0  # the part of it the steps waited for after their emulated compute

    def train(self, x: Any, y: Any) -> Any:
        """Wait the accelerator's time for the batch while the step's allreduce (the loss, 0, and the stop
        request) runs beside it, as a gradient allreduce overlaps the backward pass on GPUs."""
        import tensorflow as tf
        batch = int(y.shape[0])
        seconds = batch * self.seconds_per_sample
        flags = [self.stop.local.read_value()] if self.stop is not None else []
        values = [tf.zeros(())] + flags
        exchange = None
        if self.dist.several:
            exchange = self.exchange.submit(self._allreduce, values)
        time.sleep(seconds)
        if exchange is not None:
            waited = time.perf_counter()
            values = exchange.result()
            self.allreduce_exposed += time.perf_counter() - waited
        self.pending, self.all_compute = (seconds, batch), self.all_compute + seconds
        self.trained += 1
        if flags:
            self.stop.agreed.assign(values[1])
        return values[0]

    def _allreduce(self, values: list) -> list:
        began = time.perf_counter()
        reduced = self.dist.allreduce_gradients(values)
        self.allreduce_seconds += time.perf_counter() - began
        self.allreduces += 1
        return reduced

    def evaluate(self, x: Any, y: Any) -> Any:
        time.sleep(int(y.shape[0]) * self.seconds_per_sample * EVAL_FRACTION)
        return batch_sums(self.loss, self.metric, y, self.untrained(y))

    def start(self, loop: Loop) -> None:
        self.io_start = (time.perf_counter(), read_proc_io())
        self._evict()

    def after_step(self, loop: Loop) -> None:
        now, waited = time.perf_counter(), loop.totals["input_wait_seconds"]
        if self.last is not None:  # not the epoch's first step
            self.compute += self.pending[0]
            self.samples += self.pending[1]
            self.wall += now - self.last
            self.input_wait += waited - self.waited
            self.steps += 1
        self.last, self.waited = now, waited

    def evaluated(self, loop: Loop, record: dict) -> None:
        self.last = None  # the next step's interval holds the evaluation

    def after_epoch(self, loop: Loop) -> None:
        self.last = None
        if loop.epoch < loop.options.max_epochs:  # another epoch follows
            self._evict()

    def _evict(self) -> None:
        """Local rank 0 of each node drops the dataset from the page cache; every rank waits for it."""
        if self.evict_dir and self.dist.local_rank == 0:
            self.evictions.append(page_cache.evict(self.evict_dir))
        self.dist.barrier()

    def figures(self) -> dict:
        """This rank's figures; its reads since the first epoch began: `read_bytes` from storage (the kernel's
        counter, page-cache hits not counted) and `read_chars` in all, each in MB/s over that time too."""
        au = self.compute / self.wall if self.wall > 0 else None
        began, counters = self.io_start
        seconds, now = time.perf_counter() - began, read_proc_io()
        reads = {k: now[k] - counters[k] for k in ("read_bytes", "rchar") if k in now and k in counters}
        io = {"read_bytes": reads.get("read_bytes"), "read_chars": reads.get("rchar"), "io_seconds": seconds,
              "storage_mb_per_second": reads["read_bytes"] / seconds / 1e6 if "read_bytes" in reads else None,
              "read_mb_per_second": reads["rchar"] / seconds / 1e6 if "rchar" in reads else None}
        return io | {"rank": self.dist.rank, "au": au, "training_steps": self.trained, "measured_steps": self.steps,
                "compute_seconds": self.compute, "wall_seconds": self.wall,
                "samples_per_second": self.samples / self.wall if self.wall > 0 else None,
                "input_wait_per_step_seconds": self.input_wait / self.steps if self.steps else None,
                "emulated_seconds_all_steps": self.all_compute, "evictions": self.evictions,
                "allreduce_ms_per_step": 1e3 * self.allreduce_seconds / self.allreduces if self.allreduces else None,
                "allreduce_exposed_ms_per_step": 1e3 * self.allreduce_exposed / self.allreduces
                if self.allreduces else None}


def emulation_summary(accelerator: str, samples_per_second: float, source: str, benchmark: str, local_batch: int,
                      ranks: list[dict]) -> dict:
    """summary.json's `emulation` from every rank's figures."""
    compute, wall = sum(r["compute_seconds"] for r in ranks), sum(r["wall_seconds"] for r in ranks)
    measured = [r for r in ranks if r["wall_seconds"] > 0]
    au = compute / wall if wall > 0 else None
    threshold = AU_THRESHOLD.get(benchmark)
    evictions = [e for r in ranks for e in r["evictions"]]
    if not evictions:
        cache = "cached: train.emulate.page_cache=keep"
    elif any(e["cached"] for e in evictions):
        worst = max(e["resident_share"] for e in evictions)
        cache = f"cached: up to {worst:.0%} of the dataset's pages stayed resident after eviction"
    else:
        cache = f"evicted before every epoch ({page_cache.METHOD})"
    return {"accelerator": accelerator, "samples_per_second_per_accelerator": samples_per_second,
            "source": source, "local_batch_size": local_batch, "accelerators": len(ranks),
            "au": au, "au_min": min((r["au"] for r in measured), default=None),
            "samples_per_second": sum(r["samples_per_second"] or 0.0 for r in measured),
            "storage_mb_per_second": _total([r["storage_mb_per_second"] for r in ranks]),
            "input_wait_per_step_seconds": _mean([r["input_wait_per_step_seconds"] for r in measured]),
            "au_threshold": threshold, "passes": None if threshold is None or au is None else au >= threshold,
            "page_cache": cache, "per_rank": ranks}


def _total(values: list) -> float | None:
    return None if any(v is None for v in values) else sum(values)


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None
