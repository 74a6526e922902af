"""The training-loop skeleton shared by the applications.

`fit()` runs epochs of `tf.function` steps whose gradients are averaged over ranks in one
grouped allreduce, after rank 0's initial model and optimizer state are broadcast. After
each evaluation the metric, averaged over all ranks, is compared to the quality target;
the run stops when it is reached, when the loss stops being finite, or when the epoch
budget is spent. Rank 0 prints a progress line per epoch (and every `progress_seconds`
inside long epochs). Application specifics (loss, metric, schedule) come in as arguments, and so
may the steps themselves (`Steps`): the default trains the Keras model data-parallel; the CosmoFlow
hybrid path (cosmoflow/mesh/hybrid.py) brings steps that run a Mesh-TF graph instead, and ranks that
read no data (`Datasets.reads` False) take part in every step's collectives with (None, None) batches.
`Control` adds fault handling: periodic checkpoints, resuming from one (the weights, optimizer, each rank's
own variables, the input position and the history), and stopping after the step in which a stop signal
arrived on any rank (common/checkpoint.py, common/stopping.py, docs/faults.md); in elastic runs it also
carries the hooks that restore the in-memory state and commit it (common/elastic.py).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from typing import Any, Callable, Protocol

from common.checkpoint import Checkpointer, Progress, Resume, restore_rank, restore_shared
from common.dist import DistEnv
from common.mllog import RUN_ABORTED, RUN_SUCCESS, MLPerfLog
from common.stopping import StopRequests


class Metric(Protocol):
    """An evaluation metric computed from per-batch sums that can be added across ranks."""

    name: str  # short name for progress lines, e.g. "mae"
    mlperf_key: str  # e.g. "eval_error" (CosmoFlow) or "eval_accuracy" (DeepCAM)
    higher_is_better: bool

    def batch_sums(self, y_true: Any, y_pred: Any) -> Any:
        """A float32 vector of sums for one batch (inside tf.function)."""

    def result(self, sums: Any) -> float:
        """The metric from the sums over the whole validation set (numpy vector)."""

    def details(self, sums: Any) -> dict:
        """Named parts of the metric for the run's history (may be empty)."""


@dataclasses.dataclass(frozen=True)
class Datasets:
    """Infinite (repeated) batched datasets and how many steps make one epoch on each rank."""

    train: Any
    val: Any
    train_steps: int
    val_steps: int
    train_samples: int  # over all ranks, per epoch
    val_samples: int
    local_batch_size: int
    # For the I/O report: the dataset's mean on-disk bytes per record, and the record files one pass
    # over this rank's training and validation shards opens.
    record_bytes: float = 0.0
    train_files: int = 0
    val_files: int = 0
    loader: str = ""  # the input pipeline that reads them: tfdata or dali
    reads: bool = True  # False: this rank reads nothing, its batches are (None, None) (see without_input)

    @classmethod
    def from_shards(cls, train, val, train_shard, val_shard, local_batch: int, record_bytes: float = 0.0,
                    loader: str = "") -> "Datasets":
        """From the two datasets and the shards they read (`samples` on this rank, `global_samples` in all,
        `files` the record files of one pass)."""
        return cls(train=train, val=val, train_steps=train_shard.samples // local_batch,
                   val_steps=val_shard.samples // local_batch, train_samples=train_shard.global_samples,
                   val_samples=val_shard.global_samples, local_batch_size=local_batch, record_bytes=record_bytes,
                   train_files=len(train_shard.files), val_files=len(val_shard.files), loader=loader)

    def without_input(self) -> "Datasets":
        """The same step counts for a rank that reads no data: endless (None, None) batches, no files."""
        nothing = itertools.repeat((None, None))
        return dataclasses.replace(self, train=nothing, val=nothing, record_bytes=0.0, train_files=0,
                                   val_files=0, loader="", reads=False)


@dataclasses.dataclass
class FitResult:
    status: str  # RUN_SUCCESS or RUN_ABORTED
    reason: str
    epochs: int
    metric: float | None
    history: list[dict]
    train_seconds: float
    stopped: bool = False  # by a stop signal (exit code 75)
    checkpoint: str = ""  # the checkpoint written when it stopped


@dataclasses.dataclass(frozen=True)
class Steps:
    """How one rank trains on and evaluates one batch; `fit()` calls them on its schedule.

    Every rank calls `train` the same number of times and `evaluate` for every validation batch, so
    collectives inside them line up; a rank that reads no data is given (None, None) batches.
    """

    train: Callable[[Any, Any], Any]  # (x, y) -> the step's loss, averaged over the data-parallel replicas
    evaluate: Callable[[Any, Any], Any]  # (x, y) -> this rank's float32 sums [count, loss sum, metric sums ...]
    close: Callable[[], None] = lambda: None  # after the last step (e.g. closes sessions)


# (model, optimizer, loss_fn, metric, dist) -> Steps: built after the initial state is broadcast.
StepsFactory = Callable[[Any, Any, Callable, Metric, DistEnv], Steps]


def data_parallel_steps(model: Any, optimizer: Any, loss_fn: Callable, metric: Metric, dist: DistEnv) -> Steps:
    """The Keras model in `tf.function` steps, gradients averaged over all ranks in one grouped allreduce."""
    return Steps(train=_make_train_step(model, optimizer, loss_fn, dist),
                 evaluate=_make_eval_step(model, loss_fn, metric))


@dataclasses.dataclass(frozen=True)
class FitOptions:
    max_epochs: int
    target: float
    eval_every: int = 1  # evaluate after every this many epochs (and after the last)
    eval_every_steps: int = 0  # > 0: evaluate every this many optimizer steps instead, also inside epochs
    progress_seconds: float = 30.0


class ElasticHooks(Protocol):
    """What an elastic run (common/elastic.py) adds to fit(): its start, its state and its commits."""

    def start(self) -> Progress:
        """Where this (re)start begins, in steps of the current rank layout."""

    def restore(self, model: Any, optimizer: Any) -> None:
        """Assign the state's model and optimizer snapshot (every rank holds rank 0's after the sync)."""

    def after_step(self, epoch: int, step: int, running: dict, history: list[dict]) -> None:
        """After optimizer step `step` (1-based) of `epoch`: commit when due."""

    def epoch_done(self, progress: Progress) -> None:
        """After an epoch and its evaluation: commit `progress` (the next epoch, step 0)."""


@dataclasses.dataclass(frozen=True)
class Control:
    """Fault handling in fit(); every part is optional."""

    checkpointer: Checkpointer | None = None  # periodic checkpoints, and the one written on a stop signal
    resume: Resume | None = None  # the checkpoint this run continues from
    stop: StopRequests | None = None  # the stop signals, checked (collectively) after every step
    input_state: bool = False  # the training iterator can be saved (tf.data) and is, in every checkpoint
    run_start: float = dataclasses.field(default_factory=time.time)  # time.time() at this attempt's run_start
    elastic: ElasticHooks | None = None  # elastic Horovod: the in-memory state and its commits

    def progress(self) -> Progress:
        """Where this attempt starts: the elastic state's progress, the checkpoint's (as attempt + 1), or the
        beginning."""
        if self.elastic:
            return self.elastic.start()
        if not self.resume:
            return Progress()
        saved = self.resume.progress
        return dataclasses.replace(saved, attempt=saved.attempt + 1)

    def stop_requested(self, dist: DistEnv) -> bool:
        return self.stop is not None and self.stop.agreed(dist) > 0


def fit(model: Any, optimizer: Any, loss_fn: Callable, metric: Metric, schedule: Callable[[float], float],
        data: Datasets, dist: DistEnv, options: FitOptions, mlperf: MLPerfLog,
        log: Callable[[str], None] = print, make_steps: StepsFactory = data_parallel_steps,
        control: Control = Control()) -> FitResult:
    """Train until the target, a non-finite loss, `options.max_epochs` or a stop signal."""
    optimizer.build(model.trainable_variables)
    if control.resume:
        restore_shared(control.resume, model, optimizer, dist)
    if control.elastic:
        control.elastic.restore(model, optimizer)
    dist.broadcast_variables(model.variables + optimizer.variables)
    train_iter = iter(data.train)
    if control.resume:
        restore_rank(control.resume, model, train_iter if data.reads else None, dist, log)
    steps = make_steps(model, optimizer, loss_fn, metric, dist)
    try:
        return _fit_epochs(steps, train_iter, model, optimizer, metric, schedule, data, dist, options, mlperf, log,
                           control)
    finally:
        steps.close()


def _fit_epochs(steps: Steps, train_iter, model, optimizer, metric: Metric, schedule, data: Datasets,
                dist: DistEnv, options: FitOptions, mlperf: MLPerfLog, log, control: Control) -> FitResult:
    run = _Evaluator(steps.evaluate, iter(data.val), model, metric, data, dist, options, mlperf,
                     log if dist.is_root else (lambda _msg: None))
    start = control.progress()
    run.history = list(start.history)
    saver = _Saver(control, start, model, optimizer, train_iter, data, run.log)
    for epoch in range(start.epoch, options.max_epochs + 1):
        first = start.step if epoch == start.epoch else 0
        mlperf.start("epoch_start", epoch_num=epoch)
        stats = _train_epoch(steps.train, train_iter, optimizer, schedule, data, epoch, run.log, options,
                             on_step=functools.partial(_after_step, run, control, epoch),
                             first_step=first, partial=start.partial if first else {},
                             should_stop=lambda: control.stop_requested(dist))
        mlperf.end("epoch_stop", epoch_num=epoch)
        if stats.get("stopped"):
            return run.stopped(control, saver.save(Progress(epoch, stats["steps"], run.history, stats["partial"]),
                                                   on_signal=True))
        run.record(epoch, {k: v for k, v in stats.items() if k not in ("stopped", "partial")})
        if not math.isfinite(stats["loss"]):
            return run.finish(RUN_ABORTED, f"non-finite training loss {stats['loss']} in epoch {epoch}", None)
        if run.reached:
            return run.success()
        if epoch == options.max_epochs or (not options.eval_every_steps and epoch % options.eval_every == 0):
            run.evaluate(epoch, data.train_steps)
            if run.reached:
                return run.success()
        if control.checkpointer and control.checkpointer.due(epoch):
            saver.save(Progress(epoch + 1, 0, run.history))
        if control.elastic:
            control.elastic.epoch_done(Progress(epoch + 1, 0, list(run.history)))
    last = next((h[metric.name] for h in reversed(run.history) if metric.name in h), None)
    return run.finish(RUN_ABORTED, f"target {metric.name} {options.target} not reached in "
                      f"{options.max_epochs} epochs (last {last})", last)


def _after_step(run: "_Evaluator", control: Control, epoch: int, step: int, running: dict) -> bool:
    """After each step: evaluate when due (True ends the epoch), then an elastic commit when due."""
    stop = run.on_step(epoch, step, running)
    if control.elastic and not stop:
        control.elastic.after_step(epoch, step, running, run.history)
    return stop


class _Evaluator:
    """Evaluation on the training loop's schedule, the history of records, and the stop decision."""

    def __init__(self, eval_step, val_iter, model, metric: Metric, data: Datasets, dist: DistEnv,
                 options: FitOptions, mlperf: MLPerfLog, log: Callable[[str], None]):
        self.eval_step, self.val_iter, self.model, self.metric = eval_step, val_iter, model, metric
        self.data, self.dist, self.options, self.mlperf, self.log = data, dist, options, mlperf, log
        self.history: list[dict] = []
        self.reached = False
        self.start = time.perf_counter()

    def record(self, epoch: int, figures: dict) -> dict:
        """The history record of `epoch`, created or updated with `figures`."""
        if not self.history or self.history[-1]["epoch"] != epoch:
            self.history.append({"epoch": epoch})
        self.history[-1].update(figures)
        return self.history[-1]

    def on_step(self, epoch: int, step: int, running: dict) -> bool:
        """After optimizer step `step` (1-based) of `epoch`: evaluate when due; True stops the epoch."""
        every = self.options.eval_every_steps
        global_step = (epoch - 1) * self.data.train_steps + step
        if not every or global_step % every or (step == self.data.train_steps and epoch == self.options.max_epochs):
            return False
        self.record(epoch, running)
        return self.evaluate(epoch, step)

    def evaluate(self, epoch: int, step: int) -> bool:
        """Evaluate now; logs the MLPerf events and a progress line; True when the target is reached."""
        # Each rank's batch-norm running statistics saw only its own data: average them first,
        # as the reference does before every evaluation.
        # (Integer state such as dropout seed generators is left alone.)
        self.dist.average_variables([v for v in self.model.non_trainable_variables if "float" in str(v.dtype)])
        self.mlperf.start("eval_start", epoch_num=epoch)
        record = _evaluate(self.eval_step, self.val_iter, self.metric, self.data, self.dist)
        self.mlperf.end("eval_stop", epoch_num=epoch)
        value = record[self.metric.name]
        self.mlperf.event(self.metric.mlperf_key, value, epoch_num=epoch)
        current = self.record(epoch, record | {"step": (epoch - 1) * self.data.train_steps + step})
        self.log(_progress_line(current, self.metric, self.options, self.start, self.data.train_steps))
        self.reached = _reached(value, self.metric, self.options.target)
        return self.reached

    def success(self) -> FitResult:
        record = next(h for h in reversed(self.history) if self.metric.name in h)
        value = record[self.metric.name]
        return self.finish(RUN_SUCCESS, f"{self.metric.name} {value:.4f} reached target {self.options.target} "
                           f"in epoch {record['epoch']} (step {record['step']})", value)

    def finish(self, status: str, reason: str, metric_value) -> FitResult:
        return FitResult(status, reason, len(self.history), metric_value, self.history,
                         time.perf_counter() - self.start)

    def stopped(self, control: Control, checkpoint: str) -> FitResult:
        progress_epoch = self.history[-1]["epoch"] if self.history else 0
        where = f"after epoch {progress_epoch}" if progress_epoch else "in the first epoch"
        saved = f"; checkpoint {checkpoint}" if checkpoint else "; no checkpoint written (checkpoint.on_signal=false)"
        result = self.finish(RUN_ABORTED, f"stopped by {control.stop.describe()} {where}{saved}", None)
        return dataclasses.replace(result, stopped=True, checkpoint=checkpoint)


class _Saver:
    """Writes the checkpoints of fit(): the progress given, plus what every checkpoint of this attempt shares."""

    def __init__(self, control: Control, start: Progress, model, optimizer, train_iter, data: Datasets, log):
        self.control, self.start, self.model, self.optimizer = control, start, model, optimizer
        self.train_iter, self.data, self.log = train_iter, data, log

    def save(self, progress: Progress, on_signal: bool = False) -> str:
        """Checkpoint `progress` (collective); "" when this run writes no checkpoints (or none on a signal)."""
        control = self.control
        if control.checkpointer is None or (on_signal and not control.checkpointer.cfg.on_signal):
            return ""
        progress = dataclasses.replace(progress, earlier_seconds=self.start.earlier_seconds + time.time()
                                       - control.run_start, attempt=self.start.attempt, history=list(progress.history))
        step = progress.global_step(self.data.train_steps)
        return str(control.checkpointer.save(progress, step, self.model, self.optimizer, self.train_iter,
                                             control.input_state and self.data.reads))


def _reached(value: float, metric: Metric, target: float) -> bool:
    return value >= target if metric.higher_is_better else value < target


def _make_train_step(model, optimizer, loss_fn, dist: DistEnv):
    import tensorflow as tf

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            loss = loss_fn(y, pred)
        grads = tape.gradient(loss, model.trainable_variables)
        # One grouped allreduce for the gradients and the loss (the loss for reporting).
        *grads, loss = dist.allreduce_gradients(list(grads) + [loss])
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


def _make_eval_step(model, loss_fn, metric: Metric):
    import tensorflow as tf

    @tf.function
    def eval_step(x, y):
        return batch_sums(loss_fn, metric, y, model(x, training=False))

    return eval_step


def batch_sums(loss_fn: Callable, metric: Metric, y_true: Any, y_pred: Any) -> Any:
    """[count, loss sum, metric sums ...] of one batch, float32; an empty batch (0, ...) gives zeros."""
    import tensorflow as tf
    batch = tf.cast(tf.shape(y_true)[0], tf.float32)
    # multiply_no_nan: the mean loss of an empty batch is NaN, its sum is 0.
    loss_sum = tf.reshape(tf.math.multiply_no_nan(tf.cast(loss_fn(y_true, y_pred), tf.float32), batch), [1])
    return tf.concat([tf.reshape(batch, [1]), loss_sum, tf.cast(metric.batch_sums(y_true, y_pred), tf.float32)],
                     axis=0)


def _train_epoch(train_step, train_iter, optimizer, schedule, data: Datasets, epoch: int,
                 log, options: FitOptions, on_step: Callable[[int, dict], bool] | None = None,
                 first_step: int = 0, partial: dict | None = None,
                 should_stop: Callable[[], bool] = lambda: False) -> dict:
    """Run one epoch of steps; returns mean loss, time, throughput and learning rate.

    `on_step(step, running)` runs after each step (1-based) with the epoch's figures so far; its
    time (evaluations) is not counted as training time, and True ends the epoch early. A resumed epoch
    starts after `first_step` steps whose sums are `partial`. When `should_stop()` (asked after every
    step) says so, the epoch ends with "stopped" set and its running sums in "partial".
    """
    t0 = last_report = time.perf_counter()
    before = partial or {}
    loss_sum, steps_done, paused = before.get("loss_sum", 0.0), first_step, -before.get("seconds", 0.0)
    lr, stopped = schedule(epoch - 1 + first_step / data.train_steps), False
    for step in range(first_step, data.train_steps):
        lr = schedule(epoch - 1 + step / data.train_steps)
        optimizer.learning_rate.assign(lr)
        x, y = next(train_iter)
        loss = float(train_step(x, y))
        loss_sum, steps_done = loss_sum + loss, steps_done + 1
        if not math.isfinite(loss):
            break
        now = time.perf_counter()
        rate = steps_done * data.train_samples / data.train_steps / (now - t0 - paused)
        if now - last_report > options.progress_seconds and step + 1 < data.train_steps:
            log(f"  epoch {epoch} step {step + 1}/{data.train_steps}  loss {loss_sum / steps_done:.4f}  "
                f"{rate:.2f} samples/s")
            last_report = now
        if on_step is not None:
            stop = on_step(step + 1, {"loss": loss_sum / steps_done, "samples_per_second": rate, "lr": lr,
                                      "train_seconds": now - t0 - paused})
            paused += time.perf_counter() - now
            if stop:
                break
        if should_stop():
            stopped = True
            break
    seconds = time.perf_counter() - t0 - paused
    samples = steps_done * data.train_samples / data.train_steps
    return {"loss": loss_sum / max(1, steps_done) if math.isfinite(loss_sum) else loss_sum,
            "lr": lr, "steps": steps_done, "train_seconds": seconds, "samples_per_second": samples / max(seconds, 1e-9),
            "stopped": stopped, "partial": {"loss_sum": loss_sum, "seconds": seconds}}


def _evaluate(eval_step, val_iter, metric: Metric, data: Datasets, dist: DistEnv) -> dict:
    """Metric and loss over the whole validation set, summed over all ranks."""
    import tensorflow as tf
    t0 = time.perf_counter()
    sums = None
    for _ in range(data.val_steps):
        x, y = next(val_iter)
        batch_sums = eval_step(x, y)
        sums = batch_sums if sums is None else sums + batch_sums
    sums = dist.sum(tf.convert_to_tensor(sums)).numpy()
    count = sums[0]
    return {"val_loss": float(sums[1] / count), metric.name: metric.result(sums[2:]),
            **metric.details(sums[2:]), "val_samples_seen": int(count), "eval_seconds": time.perf_counter() - t0}


def _progress_line(record: dict, metric: Metric, options: FitOptions, start: float, steps_per_epoch: int) -> str:
    elapsed = time.perf_counter() - start
    epochs_done = record["step"] / steps_per_epoch
    remaining = elapsed / epochs_done * (options.max_epochs - epochs_done)
    parts = [f"{v:.3f}" for k, v in record.items() if k.startswith(f"{metric.name}_")]
    detail = f" [{' '.join(parts)}]" if parts else ""
    return (f"epoch {record['epoch']:3d}/{options.max_epochs} step {record['step']}  loss {record['loss']:.4f}  "
            f"val_loss {record['val_loss']:.4f}  {metric.name} {record[metric.name]:.4f}{detail} "
            f"(target {'>=' if metric.higher_is_better else '<'} {options.target})  "
            f"{record['samples_per_second']:.1f} samples/s  elapsed {_hms(elapsed)}  "
            f"remaining <= {_hms(remaining)}")


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
