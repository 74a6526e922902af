"""The training-loop skeleton shared by the applications: `fit(trainee, data, ctx, make_steps)`.

`fit()` runs epochs of `tf.function` steps whose gradients are averaged over ranks in one
grouped allreduce, after rank 0's initial model and optimizer state are broadcast. After
each evaluation the metric, averaged over all ranks, is compared to the quality target;
the run stops when it is reached, when the loss stops being finite, or when the epoch
budget is spent. Rank 0 prints a progress line per epoch (and every `progress_seconds`
inside long epochs). What is trained comes in as a `Trainee` (model, optimizer, loss, metric,
schedule); what the run contributes (DistEnv, MLPerf log, options, fault handling, log) as one
`LoopContext`; how a rank trains and evaluates a batch as `Steps` from the run's strategy
(common/runtime/strategy.py; the CosmoFlow hybrid path brings steps that run a Mesh-TF graph, and its
ranks that read no data take part in every step's collectives with (None, None) batches).
`Control` adds fault handling: periodic checkpoints, resuming from one (the weights, optimizer, each rank's
own variables, the input position and the history), and stopping after the step in which a stop signal
arrived on any rank (common/runtime/checkpoint.py, common/runtime/stopping.py, docs/faults.md). A strategy
may add `LoopHooks` (the elastic one restores its in-memory state and commits it, common/runtime/elastic.py).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Protocol

from common.io.datasets import Datasets
from common.runtime.checkpoint import Checkpointer, InputPlan, Progress, Resume, restore_rank, restore_shared
from common.runtime.dist import DistEnv
from common.runtime.mllog import RUN_ABORTED, RUN_SUCCESS, MLPerfLog
from common.runtime.phases import PhaseClock, device_sync_for
from common.runtime.stopping import StopFlag, StopRequests


# The data-parallel step's phases (make_train_step).
STEP_PHASES = ("compute", "allreduce", "update")


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
    stop: StopFlag | None = None  # the stop request train() allreduces with its gradients (None: it does not)
    # Seconds this rank's training steps spent in each of their phases so far (None: not kept). The system
    # window reads its "allreduce" phase: the step blocked in the gradients' collective.
    clock: PhaseClock | None = None


# (trainee, dist, stop flag or None) -> Steps: built after the initial state is broadcast.
StepsFactory = Callable[["Trainee", DistEnv, "StopFlag | None"], Steps]


def data_parallel_steps(trainee: "Trainee", dist: DistEnv, stop: StopFlag | None = None) -> Steps:
    """The Keras model in `tf.function` steps, gradients (and the stop flag) averaged over all ranks in one
    grouped allreduce."""
    clock = PhaseClock(STEP_PHASES, device_sync_for(dist.gpu))
    return Steps(train=make_train_step(trainee.model, trainee.optimizer, trainee.loss, dist, stop,
                                       jit_compile=trainee.jit_compile, clock=clock),
                 evaluate=_make_eval_step(trainee.model, trainee.loss, trainee.metric), stop=stop, clock=clock)


@dataclasses.dataclass(frozen=True)
class FitOptions:
    max_epochs: int
    target: float
    eval_every: int = 1  # evaluate after every this many epochs (and after the last)
    eval_every_steps: int = 0  # > 0: evaluate every this many optimizer steps instead, also inside epochs
    progress_seconds: float = 30.0


class LoopHooks(Protocol):
    """What a strategy may add to fit() (the elastic one, common/runtime/elastic.py: its in-memory state and
    its commits): where training starts, the state to restore, and calls after steps and epochs."""

    def start(self) -> Progress:
        """Where this (re)start begins, in steps of the current rank layout."""

    def restore(self, model: Any, optimizer: Any) -> None:
        """Assign a saved model and optimizer state (elastic: every rank holds rank 0's after the sync)."""

    def after_step(self, epoch: int, step: int, running: dict, history: list[dict]) -> None:
        """After optimizer step `step` (1-based) of `epoch` (elastic: commit when due)."""

    def epoch_done(self, progress: Progress) -> None:
        """After an epoch and its evaluation, with `progress` at the next epoch, step 0 (elastic: commit it)."""


@dataclasses.dataclass(frozen=True)
class Control:
    """Fault handling in fit(); every part is optional."""

    checkpointer: Checkpointer | None = None  # periodic checkpoints, and the one written on a stop signal
    resume: Resume | None = None  # the checkpoint this run continues from
    stop: StopRequests | None = None  # the stop signals, checked (collectively) after every step
    input_state: bool = False  # the training iterator can be saved (tf.data) and is, in every checkpoint
    input_plan: InputPlan | None = None  # how a resumed run's input reaches the checkpoint's position
    run_start: float = dataclasses.field(default_factory=time.time)  # time.time() at this attempt's run_start

    def progress(self) -> Progress:
        """Where this attempt starts: the checkpoint's progress (as attempt + 1), or the beginning."""
        if not self.resume:
            return Progress()
        saved = self.resume.progress
        return dataclasses.replace(saved, attempt=saved.attempt + 1)

    def stop_requested(self, dist: DistEnv, steps: Steps) -> bool:
        """After a step: whether every rank stops here; read from the step's allreduce when it carried the
        flag, else agreed in a collective of its own."""
        if self.stop is None:
            return False
        return steps.stop.stop_agreed() if steps.stop is not None else self.stop.agreed(dist) > 0


@dataclasses.dataclass(frozen=True)
class Trainee:
    """What a rank trains: built in init, before the dataset is touched."""

    model: Any
    optimizer: Any
    loss: Callable  # (y_true, y_pred) -> the batch's mean loss
    metric: Metric
    # The input pipelines -> the learning rate by fractional 0-based epoch (DeepCAM's schedule counts steps).
    schedule_for: Callable[[Datasets], Callable[[float], float]]
    jit_compile: bool = False  # XLA-compile the step's forward and backward pass (train.jit_compile)


@dataclasses.dataclass(frozen=True)
class LoopContext:
    """What fit() takes from the run: the ranks, the MLPerf log, the options, fault handling and the log."""

    dist: DistEnv
    mlperf: MLPerfLog
    options: FitOptions
    control: Control = Control()
    log: Callable[[str], None] = print  # rank 0's progress lines (a no-op elsewhere)
    hooks: LoopHooks | None = None  # what the strategy adds (elastic: the in-memory state and its commits)
    monitor: "StepMonitor | None" = None  # the run's measurements (common/runtime/system.py, TensorBoard)


class StepMonitor(Protocol):
    """Told after every training step what the loop has timed so far (system figures, TensorBoard)."""

    def attach(self, clock: PhaseClock | None) -> None:
        """Before the first step: the phase clock of the steps being trained (None: they keep none)."""

    def tick(self, done: int, step: int, boundary: bool, totals: dict, running: dict) -> None:
        """`done` steps in this attempt, `step` the global step; `boundary`: an epoch's end or an evaluation
        follows; `totals`: the loop's running sums (input_wait_seconds, step_seconds); `running`: the epoch's
        figures so far (loss, lr, samples_per_second)."""

    def evaluated(self, step: int, record: dict) -> None:
        """After an evaluation at global step `step`: its history record."""


def fit(trainee: Trainee, data: Datasets, ctx: LoopContext, make_steps: StepsFactory = None) -> FitResult:
    """Train until the target, a non-finite loss, `ctx.options.max_epochs` or a stop signal."""
    model, optimizer, dist, control = trainee.model, trainee.optimizer, ctx.dist, ctx.control
    optimizer.build(model.trainable_variables)
    if control.resume:
        restore_shared(control.resume, model, optimizer, dist)
    if ctx.hooks:
        ctx.hooks.restore(model, optimizer)
    dist.broadcast_variables(shared_variables(model) + optimizer.variables)
    train_iter = iter(replayed(data.train, control.input_plan))
    if control.resume:
        restore_rank(control.resume, model, train_iter, dist, ctx.log, control.input_plan)
    steps = (make_steps or data_parallel_steps)(trainee, dist, control.stop.flag() if control.stop else None)
    try:
        return _Training(trainee, data, ctx, steps, train_iter).run()
    finally:
        steps.close()


def replayed(train: Any, plan: InputPlan | None) -> Any:
    """The training dataset from the checkpoint's position when `plan` replays it: a DALI stream rebuilt with the
    checkpoint's seed gives the same batches, and the consumed ones are read and dropped inside tf.data."""
    if plan is None or plan.restore != "replay" or not plan.skip:
        return train
    return train.skip(plan.skip)


def shared_variables(model) -> list:
    """The model's variables every rank must hold alike: all but the dropout seed-generator states.

    Dropout draws an independent stream on every rank, as in the reference (whose TF 2 Keras dropout is
    unseeded, so each rank draws its own masks); here each stream is seeded from run.seed + rank (the
    strategy's model_seed), so runs are reproducible. Broadcasting Keras 3's seed-generator state with the
    weights would give every rank rank 0's masks."""
    return [v for v in model.variables if not _is_seed_state(v)]


def _is_seed_state(variable) -> bool:
    return "seed_generator" in getattr(variable, "path", "")


@dataclasses.dataclass
class EpochStats:
    """One epoch's (or its trained part's) figures."""

    loss: float
    lr: float
    steps: int  # optimizer steps done in the epoch, resumed ones included
    train_seconds: float
    samples_per_second: float
    loss_sum: float
    stopped: bool = False  # by a stop signal
    input_wait_seconds: float = 0.0  # in next() on the input
    step_seconds: float = 0.0  # in the training steps (their collectives included)

    def record(self) -> dict:
        """The figures the epoch's history record gets."""
        return {"loss": self.loss, "lr": self.lr, "steps": self.steps, "train_seconds": self.train_seconds,
                "samples_per_second": self.samples_per_second, "input_wait_seconds": self.input_wait_seconds,
                "step_seconds": self.step_seconds}

    def partial(self) -> dict:
        """The running sums a checkpoint of the epoch in progress keeps."""
        return {"loss_sum": self.loss_sum, "seconds": self.train_seconds}


class _Training:
    """The epochs of one fit(): training, evaluations on their schedule, checkpoints and commits."""

    def __init__(self, trainee: Trainee, data: Datasets, ctx: LoopContext, steps: Steps, train_iter):
        self.trainee, self.data, self.ctx, self.steps, self.train_iter = trainee, data, ctx, steps, train_iter
        self.schedule = trainee.schedule_for(data)
        self.evaluator = _Evaluator(steps.evaluate, iter(data.val), trainee, data, ctx)
        self.start = ctx.hooks.start() if ctx.hooks else ctx.control.progress()
        self.evaluator.history = list(self.start.history)
        self.saver = _Saver(ctx.control, self.start, trainee, train_iter, data, ctx.log)
        self.done = 0  # training steps in this attempt
        self.totals = {"input_wait_seconds": 0.0, "step_seconds": 0.0}
        if ctx.monitor:
            ctx.monitor.attach(steps.clock)

    def run(self) -> FitResult:
        options, metric = self.ctx.options, self.trainee.metric
        for epoch in range(self.start.epoch, options.max_epochs + 1):
            result = self.epoch(epoch)
            if result is not None:
                return result
        last = next((h[metric.name] for h in reversed(self.evaluator.history) if metric.name in h), None)
        return self.evaluator.finish(RUN_ABORTED, f"target {metric.name} {options.target} not reached in "
                               f"{options.max_epochs} epochs (last {last})", last)

    def epoch(self, epoch: int) -> FitResult | None:
        """Train epoch `epoch` and evaluate when due; a FitResult when the run ends with it."""
        run, ctx, control, options = self.evaluator, self.ctx, self.ctx.control, self.ctx.options
        first = self.start.step if epoch == self.start.epoch else 0
        ctx.mlperf.start("epoch_start", epoch_num=epoch)
        stats = self.train_epoch(epoch, first, self.start.partial if first else {})
        ctx.mlperf.end("epoch_stop", epoch_num=epoch)
        if stats.stopped:
            progress = Progress(epoch, stats.steps, run.history, stats.partial())
            return run.stopped(control, self.saver.save(progress, on_signal=True))
        run.record(epoch, stats.record())
        if not math.isfinite(stats.loss):
            return run.finish(RUN_ABORTED, f"non-finite training loss {stats.loss} in epoch {epoch}", None)
        if run.reached:
            return self.succeeded(epoch, stats)
        if epoch == options.max_epochs or (not options.eval_every_steps and epoch % options.eval_every == 0):
            run.evaluate(epoch, self.data.train_steps)
            if run.reached:
                return self.succeeded(epoch, stats)
        if control.checkpointer and control.checkpointer.due(epoch):
            self.saver.save(Progress(epoch + 1, 0, run.history))
        if ctx.hooks:
            ctx.hooks.epoch_done(Progress(epoch + 1, 0, list(run.history)))
        return None

    def succeeded(self, epoch: int, stats: EpochStats) -> FitResult:
        """The run reached its target in `epoch`. A run that checkpoints on a schedule (every_epochs or
        every_minutes) first saves the weights that reached it: at the epoch's end, the checkpoint of that end
        it would otherwise have written when due; inside the epoch (train.eval_every_steps), a checkpoint of
        the step reached, as a stop signal writes one. `python -m common.export` then exports the model that
        met the target (docs/export.md). Inside the timed region, as every checkpoint of the run."""
        checkpointer = self.ctx.control.checkpointer
        scheduled = checkpointer is not None and bool(checkpointer.cfg.every_epochs or checkpointer.cfg.every_minutes)
        if scheduled and stats.steps == self.data.train_steps:
            self.saver.save(Progress(epoch + 1, 0, self.evaluator.history))
        elif scheduled:
            self.saver.save(Progress(epoch, stats.steps, self.evaluator.history, stats.partial()))
        return self.evaluator.success()

    def after_step(self, epoch: int, step: int, running: dict) -> bool:
        """After each step: the monitor, evaluation when due (True ends the epoch), then the strategy's hook."""
        self.done += 1
        if self.ctx.monitor:
            every, global_step = self.ctx.options.eval_every_steps, (epoch - 1) * self.data.train_steps + step
            boundary = step == self.data.train_steps or bool(every and global_step % every == 0)
            self.ctx.monitor.tick(self.done, global_step, boundary, self.totals, running)
        stop = self.evaluator.on_step(epoch, step, running)
        if self.ctx.hooks and not stop:
            self.ctx.hooks.after_step(epoch, step, running, self.evaluator.history)
        return stop

    def train_epoch(self, epoch: int, first_step: int, partial: dict) -> EpochStats:
        """Run the steps of one epoch from `first_step` (a resumed epoch's sums so far in `partial`).

        After each step `after_step` runs with the epoch's figures so far; its time (evaluations) is not
        counted as training time, and True ends the epoch early. When a stop signal is agreed (asked after
        every step) the epoch ends with `stopped` set."""
        data, optimizer, options, log = self.data, self.trainee.optimizer, self.ctx.options, self.evaluator.log
        t0 = last_report = time.perf_counter()
        loss_sum, steps_done, paused = partial.get("loss_sum", 0.0), first_step, -partial.get("seconds", 0.0)
        lr, stopped = self.schedule(epoch - 1 + first_step / data.train_steps), False
        at_start = dict(self.totals)
        for step in range(first_step, data.train_steps):
            lr = self.schedule(epoch - 1 + step / data.train_steps)
            optimizer.learning_rate.assign(lr)
            if self.ctx.control.stop is not None:
                self.ctx.control.stop.arm()  # a signal that arrived is allreduced with this step's gradients
            waited = time.perf_counter()
            x, y = next(self.train_iter)
            stepped = time.perf_counter()
            loss = float(self.steps.train(x, y))
            self.totals["input_wait_seconds"] += stepped - waited
            self.totals["step_seconds"] += time.perf_counter() - stepped
            loss_sum, steps_done = loss_sum + loss, steps_done + 1
            if not math.isfinite(loss):
                break
            now = time.perf_counter()
            rate = steps_done * data.train_samples / data.train_steps / (now - t0 - paused)
            if now - last_report > options.progress_seconds and step + 1 < data.train_steps:
                log(f"  epoch {epoch} step {step + 1}/{data.train_steps}  loss {loss_sum / steps_done:.4f}  "
                    f"{rate:.2f} samples/s")
                last_report = now
            stop = self.after_step(epoch, step + 1, {"loss": loss_sum / steps_done, "samples_per_second": rate,
                                                     "lr": lr, "train_seconds": now - t0 - paused})
            paused += time.perf_counter() - now
            if stop:
                break
            if self.ctx.control.stop_requested(self.ctx.dist, self.steps):
                stopped = True
                break
        seconds = time.perf_counter() - t0 - paused
        samples = steps_done * data.train_samples / data.train_steps
        return EpochStats(loss=loss_sum / max(1, steps_done) if math.isfinite(loss_sum) else loss_sum, lr=lr,
                          steps=steps_done, train_seconds=seconds, samples_per_second=samples / max(seconds, 1e-9),
                          loss_sum=loss_sum, stopped=stopped,
                          **{k: v - at_start[k] for k, v in self.totals.items()})


class _Evaluator:
    """Evaluation on the training loop's schedule, the history of records, and the stop decision."""

    def __init__(self, eval_step, val_iter, trainee: Trainee, data: Datasets, ctx: LoopContext):
        self.eval_step, self.val_iter, self.model, self.metric = eval_step, val_iter, trainee.model, trainee.metric
        self.data, self.dist, self.options, self.mlperf = data, ctx.dist, ctx.options, ctx.mlperf
        self.monitor = ctx.monitor
        self.log = ctx.log if ctx.dist.is_root else (lambda _msg: None)
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
        if self.monitor:
            self.monitor.evaluated(current["step"], current)
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

    def __init__(self, control: Control, start: Progress, trainee: Trainee, train_iter, data: Datasets, log):
        self.control, self.start, self.model, self.optimizer = control, start, trainee.model, trainee.optimizer
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
                                             control.input_state))


def _reached(value: float, metric: Metric, target: float) -> bool:
    return value >= target if metric.higher_is_better else value < target


def make_train_step(model, optimizer, loss_fn, dist: DistEnv, stop: StopFlag | None = None,
                    jit_compile: bool = False, clock: PhaseClock | None = None):
    """One data-parallel training step: (x, y) -> the loss averaged over the ranks; with `stop`, the ranks'
    stop requests ride in the same allreduce into `stop.agreed`. Three `tf.function`s, each timed on `clock`:
    the forward and backward pass ("compute", XLA-compiled with `jit_compile`), one grouped allreduce of the
    gradients, the loss and the stop request ("allreduce"; none on one rank), the optimizer's update ("update").
    The allreduce takes every gradient at once, so splitting the step there costs it no overlap."""
    import tensorflow as tf
    clock = clock or PhaseClock(STEP_PHASES)
    flags = [stop.local] if stop is not None else []
    variables = model.trainable_variables

    def gradients(x, y):
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            loss = loss_fn(y, pred)
            if model.losses:  # regularization penalties (CosmoFlow's L2 weight decay), as Keras' fit adds them
                loss = loss + tf.add_n(model.losses)
            scaled = optimizer.scale_loss(loss)  # mixed_float16: times the loss scale; else the loss
        return loss, tape.gradient(scaled, variables)

    compute = tf.function(gradients, jit_compile=jit_compile)
    reduce = tf.function(lambda tensors: dist.allreduce_gradients(list(tensors) + [f.read_value() for f in flags]))

    @tf.function
    def update(grads, agreed):
        optimizer.apply_gradients(zip(grads, variables))  # a loss-scale wrapper unscales them
        if flags:
            stop.agreed.assign(agreed)

    exchanged = dist.horovod and dist.size > 1

    def train_step(x, y):
        clock.start()
        loss, grads = compute(x, y)
        clock.lap("compute")
        if exchanged:
            reduced = reduce(list(grads) + [loss])
            grads, loss = reduced[:len(grads)], reduced[len(grads)]
            agreed = reduced[-1] if flags else None
            clock.lap("allreduce")
        else:
            agreed = flags[0].read_value() if flags else None  # one rank: its own request
        update(list(grads), agreed)
        clock.lap("update")
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
