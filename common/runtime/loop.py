"""The training loop: `fit(trainee, data, steps, env, callbacks)`, read top to bottom.

    for epoch:                       # epoch_start .. epoch_stop
        for step:                    # the learning rate, one step (gradients averaged over ranks), then
            callbacks.after_step     #   the callbacks: in-epoch evaluation, monitors, elastic commits, stop signal
        evaluate when due            # eval_start .. eval_stop, the metric over all ranks; target reached?
        callbacks.after_epoch        # periodic checkpoints, elastic commits
    callbacks.end                    # the checkpoint of the weights that met the target

What is trained comes in as a `Trainee` (model, optimizer, loss, metric, schedule); how a rank trains and evaluates
one batch as `Steps` from the run's strategy (common/runtime/strategy.py; the CosmoFlow hybrid path brings steps that
run a Mesh-TF graph). Everything else a run adds is a `Callback` (common/runtime/callbacks.py: resuming, checkpoints,
stop signals, in-epoch evaluation; common/runtime/monitor.py: the system window and TensorBoard;
common/runtime/elastic.py: elastic commits). Callbacks read and steer the `Loop`: where training starts (`start_at`),
`evaluate()`, `end_epoch`, and `result` (a common/runtime/summary.py `FitResult`), which ends the run when set.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Sequence

from common.io.input import Datasets
from common.runtime.summary import FitResult, MLPerfLog, Progress, RUN_ABORTED, RUN_SUCCESS
from common.runtime.dist import DistEnv, StopRequests

STEP_PHASES = ("compute", "allreduce", "update")  # the data-parallel step's phases (make_train_step)
PROGRESS_SECONDS = 30.0  # rank 0 prints a line this often inside long epochs


@dataclasses.dataclass(frozen=True)
class Trainee:
    """What a rank trains, built in init before the dataset is touched."""

    model: Any
    optimizer: Any
    loss: Callable  # (y_true, y_pred) -> the batch's mean loss
    # The validation metric, from per-batch sums that add across ranks: `name` ("mae"), `mlperf_key`
    # ("eval_error"), `higher_is_better`, `batch_sums(y_true, y_pred)` (a float32 vector, inside tf.function),
    # `result(sums)` (a float from the whole set's sums) and `details(sums)` (its named parts, may be empty).
    metric: Any
    # The input pipelines -> the learning rate by fractional 0-based epoch (DeepCAM's schedule counts steps).
    schedule_for: Callable[[Datasets], Callable[[float], float]]
    jit_compile: bool = False  # XLA-compile the step's forward and backward pass (train.jit_compile)


@dataclasses.dataclass(frozen=True)
class Steps:
    """How one rank trains on and evaluates one batch. Every rank calls `train` the same number of times and
    `evaluate` for every validation batch, so collectives inside them line up."""

    train: Callable[[Any, Any], Any]  # (x, y) -> the step's loss, averaged over the data-parallel replicas
    evaluate: Callable[[Any, Any], Any]  # (x, y) -> this rank's float32 sums [count, loss sum, metric sums ...]
    close: Callable[[], None] = lambda: None  # after the last step (e.g. closes sessions)
    stop: StopRequests | None = None  # the stop request train() allreduces with its gradients (None: it does not)
    clock: Any = None  # a strategy.PhaseClock: seconds the training steps spent in each phase (None: not kept)


class Callback:
    """What a run adds to the loop; every hook is optional. Hooks run on every rank in the same order, so
    collectives inside them line up."""

    def start(self, loop: "Loop") -> None:
        """After rank 0's state is broadcast, before the first step: restore, set `loop.start_at`."""

    def after_step(self, loop: "Loop") -> None:
        """After each step (`loop.step` steps of `loop.epoch` done): may evaluate, end the epoch or the run."""

    def evaluated(self, loop: "Loop", record: dict) -> None:
        """After each evaluation, with its history record."""

    def after_epoch(self, loop: "Loop") -> None:
        """After an epoch and its evaluation, when the run goes on."""

    def end(self, loop: "Loop") -> None:
        """Once, when `loop.result` is set."""


@dataclasses.dataclass
class Loop:
    """The state of one fit(), which callbacks read and steer."""

    trainee: Trainee
    data: Datasets
    steps: Steps
    dist: DistEnv
    mlperf: MLPerfLog
    options: Any  # the train section: max_epochs, target, eval_every, eval_every_steps
    callbacks: Sequence[Callback] = ()
    log: Callable[[str], None] = print  # rank 0's progress lines (a no-op elsewhere)
    start: Progress = dataclasses.field(default_factory=Progress)
    epoch: int = 0
    step: int = 0  # steps of `epoch` done
    done: int = 0  # steps done in this attempt
    running: dict = dataclasses.field(default_factory=dict)  # the epoch's loss, lr, samples_per_second so far
    totals: dict = dataclasses.field(default_factory=lambda: {"input_wait_seconds": 0.0, "step_seconds": 0.0})
    history: list[dict] = dataclasses.field(default_factory=list)
    loss_sum: float = 0.0  # the epoch's
    train_seconds: float = 0.0  # the epoch's, evaluations and callbacks not counted
    reached: bool = False
    end_epoch: bool = False
    result: FitResult | None = None
    train_iter: Any = None  # iter(data.train), made after the callbacks' start (which may set it)
    val_iter: Any = None
    began: float = dataclasses.field(default_factory=time.perf_counter)
    reported: float = dataclasses.field(default_factory=time.perf_counter)  # the last progress line

    @property
    def global_step(self) -> int:
        return (self.epoch - 1) * self.data.train_steps + self.step

    def start_at(self, progress: Progress) -> None:
        """Begin at `progress` (a checkpoint's or an elastic commit's) instead of the beginning."""
        self.start, self.history = progress, [dict(h) for h in progress.history]

    def partial(self) -> dict:
        """The running sums a checkpoint of the epoch in progress keeps."""
        return {"loss_sum": self.loss_sum, "seconds": self.train_seconds}

    def record(self, figures: dict) -> dict:
        """The history record of the current epoch, created or updated with `figures`."""
        if not self.history or self.history[-1]["epoch"] != self.epoch:
            self.history.append({"epoch": self.epoch})
        self.history[-1].update(figures)
        return self.history[-1]

    def evaluate(self, figures: dict | None = None) -> bool:
        """Evaluate now on every rank (the record gets `figures` too); logs the MLPerf events and a progress
        line; True when the target is met."""
        # Each rank's batch-norm statistics saw only its own data: average them first, as the reference does.
        model, metric = self.trainee.model, self.trainee.metric
        self.dist.average_variables([v for v in model.non_trainable_variables if "float" in str(v.dtype)])
        self.mlperf.start("eval_start", epoch_num=self.epoch)
        measured = evaluate_all(self.steps.evaluate, self.val_iter, metric, self.data, self.dist)
        self.mlperf.end("eval_stop", epoch_num=self.epoch)
        self.mlperf.event(metric.mlperf_key, measured[metric.name], epoch_num=self.epoch)
        record = self.record((figures or {}) | measured | {"step": self.global_step})
        self.log(_progress_line(record, metric, self.options, self.began, self.data.train_steps))
        for callback in self.callbacks:
            callback.evaluated(self, record)
        value = measured[metric.name]
        self.reached = value >= self.options.target if metric.higher_is_better else value < self.options.target
        return self.reached

    def finish(self, status: str, reason: str, metric: float | None, **fields) -> FitResult:
        """End the run with this result (the loop returns it after the callbacks' `end`)."""
        self.result = FitResult(status, reason, len(self.history), metric, self.history,
                                time.perf_counter() - self.began, **fields)
        return self.result

    def last_metric(self) -> float | None:
        name = self.trainee.metric.name
        return next((h[name] for h in reversed(self.history) if name in h), None)


def fit(loop: Loop) -> FitResult:
    """Train until the target, a non-finite loss, train.max_epochs, or a callback's result."""
    model, optimizer, data, options = loop.trainee.model, loop.trainee.optimizer, loop.data, loop.options
    optimizer.build(model.trainable_variables)
    loop.dist.broadcast_variables(shared_variables(model) + optimizer.variables)
    for callback in loop.callbacks:
        callback.start(loop)  # resume a checkpoint or an elastic commit, arm the stop flag, attach monitors
    loop.train_iter, loop.val_iter = loop.train_iter or iter(data.train), iter(data.val)
    schedule = loop.trainee.schedule_for(data)
    try:
        for loop.epoch in range(loop.start.epoch, options.max_epochs + 1):
            first = loop.start.step if loop.epoch == loop.start.epoch else 0
            partial, at_start = loop.start.partial if first else {}, dict(loop.totals)
            loop.step, loop.loss_sum, loop.train_seconds = first, partial.get("loss_sum", 0.0), partial.get("seconds",
                                                                                                            0.0)
            loop.mlperf.start("epoch_start", epoch_num=loop.epoch)
            for step in range(first, data.train_steps):
                t0 = time.perf_counter()
                lr = schedule(loop.epoch - 1 + step / data.train_steps)
                optimizer.learning_rate.assign(lr)
                x, y = next(loop.train_iter)
                t1 = time.perf_counter()
                loss = float(loop.steps.train(x, y))
                _count_step(loop, loss, lr, t1 - t0, time.perf_counter() - t1, time.perf_counter() - t0)
                if not math.isfinite(loss):
                    break
                for callback in loop.callbacks:
                    callback.after_step(loop)
                if loop.result is not None or loop.end_epoch:
                    break
            loop.mlperf.end("epoch_stop", epoch_num=loop.epoch)
            if loop.result is None:
                _end_of_epoch(loop, {k: v - at_start[k] for k, v in loop.totals.items()})
            if loop.result is not None:
                break
        if loop.result is None:
            last = loop.last_metric()
            loop.finish(RUN_ABORTED, f"target {loop.trainee.metric.name} {options.target} not reached in "
                        f"{options.max_epochs} epochs (last {last})", last)
        for callback in loop.callbacks:
            callback.end(loop)
    finally:
        loop.steps.close()
    return loop.result


def _count_step(loop: Loop, loss: float, lr: float, waited: float, stepped: float, seconds: float) -> None:
    """Add one step to the epoch's figures; a progress line every PROGRESS_SECONDS."""
    data = loop.data
    loop.step, loop.done, loop.loss_sum = loop.step + 1, loop.done + 1, loop.loss_sum + loss
    loop.totals["input_wait_seconds"] += waited
    loop.totals["step_seconds"] += stepped
    loop.train_seconds += seconds
    rate = _rate(loop)
    loop.running = {"loss": loop.loss_sum / loop.step, "samples_per_second": rate, "lr": lr,
                    "train_seconds": loop.train_seconds}
    now = time.perf_counter()
    if now - loop.reported > PROGRESS_SECONDS and loop.step < data.train_steps:
        loop.log(f"  epoch {loop.epoch} step {loop.step}/{data.train_steps}  loss {loop.running['loss']:.4f}  "
                 f"{rate:.2f} samples/s")
        loop.reported = now


def _rate(loop: Loop) -> float:
    """The epoch's training samples per second on all ranks so far (evaluations and callbacks not counted)."""
    return loop.step * loop.data.train_samples / loop.data.train_steps / max(loop.train_seconds, 1e-9)


def _end_of_epoch(loop: Loop, totals: dict) -> None:
    """The epoch's record (`totals`: its input wait and step seconds); a non-finite loss ends the run; evaluate
    when due; the target reached ends it too; else the callbacks' after_epoch."""
    options, epoch, steps = loop.options, loop.epoch, max(1, loop.step)
    loss = loop.loss_sum / steps if math.isfinite(loop.loss_sum) else loop.loss_sum
    loop.record({"loss": loss, "lr": loop.running.get("lr", 0.0), "steps": loop.step,
                 "train_seconds": loop.train_seconds, "samples_per_second": _rate(loop)} | totals)
    if not math.isfinite(loss):
        loop.finish(RUN_ABORTED, f"non-finite training loss {loss} in epoch {epoch}", None, non_finite=True)
        return
    due = epoch == options.max_epochs or (not options.eval_every_steps and epoch % options.eval_every == 0)
    if loop.reached or (due and loop.evaluate()):
        name = loop.trainee.metric.name
        record = next(h for h in reversed(loop.history) if name in h)
        loop.finish(RUN_SUCCESS, f"{name} {record[name]:.4f} reached target {options.target} in epoch "
                    f"{record['epoch']} (step {record['step']})", record[name])
        return
    loop.end_epoch = False
    for callback in loop.callbacks:
        callback.after_epoch(loop)


def shared_variables(model) -> list:
    """The model's variables every rank must hold alike: all but the dropout seed-generator states.

    Dropout draws an independent stream on every rank, as in the reference (whose TF 2 Keras dropout is
    unseeded, so each rank draws its own masks); here each stream is seeded from run.seed + rank (the
    strategy's model_seed), so runs are reproducible. Broadcasting Keras 3's seed-generator state with the
    weights would give every rank rank 0's masks."""
    return [v for v in model.variables if "seed_generator" not in getattr(v, "path", "")]


def evaluate_all(eval_step, val_iter, metric: Any, data: Datasets, dist: DistEnv) -> dict:
    """Metric and loss over the whole validation set, summed over all ranks."""
    import tensorflow as tf
    t0 = time.perf_counter()
    sums = None
    for _ in range(data.val_steps):
        x, y = next(val_iter)
        batch = eval_step(x, y)
        sums = batch if sums is None else sums + batch
    sums = dist.sum(tf.convert_to_tensor(sums)).numpy()
    count = sums[0]
    return {"val_loss": float(sums[1] / count), metric.name: metric.result(sums[2:]),
            **metric.details(sums[2:]), "val_samples_seen": int(count), "eval_seconds": time.perf_counter() - t0}


def _progress_line(record: dict, metric: Any, options: Any, start: float, steps_per_epoch: int) -> str:
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
