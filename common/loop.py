"""The training-loop skeleton shared by the applications.

`fit()` runs epochs of `tf.function` steps whose gradients are averaged over ranks in one
grouped allreduce, after rank 0's initial model and optimizer state are broadcast. After
each evaluation the metric, averaged over all ranks, is compared to the quality target;
the run stops when it is reached, when the loss stops being finite, or when the epoch
budget is spent. Rank 0 prints a progress line per epoch (and every `progress_seconds`
inside long epochs). Application specifics (loss, metric, schedule) come in as arguments.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Protocol

from common.dist import DistEnv
from common.mllog import RUN_ABORTED, RUN_SUCCESS, MLPerfLog


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


@dataclasses.dataclass
class FitResult:
    status: str  # RUN_SUCCESS or RUN_ABORTED
    reason: str
    epochs: int
    metric: float | None
    history: list[dict]
    train_seconds: float


@dataclasses.dataclass(frozen=True)
class FitOptions:
    max_epochs: int
    target: float
    eval_every: int = 1
    progress_seconds: float = 30.0


def fit(model: Any, optimizer: Any, loss_fn: Callable, metric: Metric, schedule: Callable[[float], float],
        data: Datasets, dist: DistEnv, options: FitOptions, mlperf: MLPerfLog,
        log: Callable[[str], None] = print) -> FitResult:
    """Train until the target, a non-finite loss or `options.max_epochs`."""
    optimizer.build(model.trainable_variables)
    dist.broadcast_variables(model.variables + optimizer.variables)
    train_step = _make_train_step(model, optimizer, loss_fn, dist)
    eval_step = _make_eval_step(model, loss_fn, metric)
    train_iter, val_iter = iter(data.train), iter(data.val)
    log = log if dist.is_root else (lambda _msg: None)
    history, start = [], time.perf_counter()
    for epoch in range(1, options.max_epochs + 1):
        mlperf.start("epoch_start", epoch_num=epoch)
        stats = _train_epoch(train_step, train_iter, optimizer, schedule, data, epoch, log, options)
        mlperf.end("epoch_stop", epoch_num=epoch)
        record = {"epoch": epoch, **stats}
        history.append(record)
        if not math.isfinite(stats["loss"]):
            return _finish(RUN_ABORTED, f"non-finite training loss {stats['loss']} in epoch {epoch}",
                           history, start, None)
        if epoch % options.eval_every and epoch != options.max_epochs:
            continue
        mlperf.start("eval_start", epoch_num=epoch)
        record.update(_evaluate(eval_step, val_iter, metric, data, dist))
        mlperf.end("eval_stop", epoch_num=epoch)
        mlperf.event(metric.mlperf_key, record[metric.name], epoch_num=epoch)
        log(_progress_line(record, metric, options, start))
        if _reached(record[metric.name], metric, options.target):
            return _finish(RUN_SUCCESS, f"{metric.name} {record[metric.name]:.4f} reached target "
                           f"{options.target} in epoch {epoch}", history, start, record[metric.name])
    last = next((h[metric.name] for h in reversed(history) if metric.name in h), None)
    return _finish(RUN_ABORTED, f"target {metric.name} {options.target} not reached in "
                   f"{options.max_epochs} epochs (last {last})", history, start, last)


def _reached(value: float, metric: Metric, target: float) -> bool:
    return value >= target if metric.higher_is_better else value < target


def _finish(status, reason, history, start, metric_value) -> FitResult:
    return FitResult(status, reason, len(history), metric_value, history, time.perf_counter() - start)


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
        pred = model(x, training=False)
        batch = tf.cast(tf.shape(y)[0], tf.float32)
        loss_sum = tf.reshape(loss_fn(y, pred) * batch, [1])
        return tf.concat([tf.reshape(batch, [1]), loss_sum, metric.batch_sums(y, pred)], axis=0)

    return eval_step


def _train_epoch(train_step, train_iter, optimizer, schedule, data: Datasets, epoch: int,
                 log, options: FitOptions) -> dict:
    """Run one epoch of steps; returns mean loss, time, throughput and learning rate."""
    t0 = last_report = time.perf_counter()
    loss_sum, steps_done = 0.0, 0
    for step in range(data.train_steps):
        lr = schedule(epoch - 1 + step / data.train_steps)
        optimizer.learning_rate.assign(lr)
        x, y = next(train_iter)
        loss = float(train_step(x, y))
        loss_sum, steps_done = loss_sum + loss, steps_done + 1
        if not math.isfinite(loss):
            break
        now = time.perf_counter()
        if now - last_report > options.progress_seconds and step + 1 < data.train_steps:
            rate = (step + 1) * data.train_samples / data.train_steps / (now - t0)
            log(f"  epoch {epoch} step {step + 1}/{data.train_steps}  loss {loss_sum / steps_done:.4f}  "
                f"{rate:.2f} samples/s")
            last_report = now
    seconds = time.perf_counter() - t0
    samples = steps_done * data.train_samples / data.train_steps
    return {"loss": loss_sum / max(1, steps_done) if math.isfinite(loss_sum) else loss_sum,
            "lr": lr, "train_seconds": seconds, "samples_per_second": samples / seconds}


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


def _progress_line(record: dict, metric: Metric, options: FitOptions, start: float) -> str:
    elapsed = time.perf_counter() - start
    per_epoch = elapsed / record["epoch"]
    remaining = per_epoch * (options.max_epochs - record["epoch"])
    parts = [f"{v:.3f}" for k, v in record.items() if k.startswith(f"{metric.name}_")]
    detail = f" [{' '.join(parts)}]" if parts else ""
    return (f"epoch {record['epoch']:3d}/{options.max_epochs}  loss {record['loss']:.4f}  "
            f"val_loss {record['val_loss']:.4f}  {metric.name} {record[metric.name]:.4f}{detail} "
            f"(target {'>=' if metric.higher_is_better else '<'} {options.target})  "
            f"{record['samples_per_second']:.1f} samples/s  elapsed {_hms(elapsed)}  "
            f"remaining <= {_hms(remaining)}")


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
