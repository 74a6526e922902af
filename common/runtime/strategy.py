"""How the ranks of a run share the work: one strategy object per run, chosen from the config.

A strategy says how ranks form data-parallel replicas (the global batch is the local batch times `replicas`), which
rank layout the input is sharded by, how a step and an evaluation run (`make_steps`), and what it adds to the MLPerf
log and to summary.json. It never holds the run: the runner (common/runtime/run.py) asks it and passes what it gives
to the loop. Three exist:
- `DataParallel` (here): every rank is a replica that reads its own shard and trains the Keras model;
- `HybridStrategy` (cosmoflow/mesh/hybrid.py): groups of ranks split every sample through Mesh-TF;
- `ElasticStrategy` (common/runtime/elastic.py): data parallel under hvd.elastic.run, ranks may die or join.

The data-parallel step's numerics are here too: `train.precision` is a Keras mixed-precision policy, set before the
model is built (`set_precision`): `float32`, or `mixed_bfloat16` / `mixed_float16` (float32 variables, layers
computing in 16 bits; each model ends in a float32 layer, so loss and metric are float32). `mixed_float16` wraps the
optimizer in Keras' `LossScaleOptimizer` (`for_precision`: dynamic loss scaling, a step whose gradients overflow is
skipped); bfloat16 has float32's range and needs none. `train.jit_compile=true` XLA-compiles each step's forward and
backward pass (the allreduce and the update stay outside, where Horovod's ops run). Both are logged.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from common.runtime import gpu
from common.runtime.dist import DistEnv, StopRequests
from common.runtime.loop import STEP_PHASES, Steps, Trainee

# (trainee, dist, stop flag or None) -> Steps: built after the initial state is broadcast.
StepsFactory = Callable[[Trainee, DistEnv, "StopRequests | None"], Steps]


class DataParallel:
    """Every rank is one replica: it reads its own shard, and its gradients are averaged over all ranks."""

    name = "data_parallel"
    elastic = False  # whether the run trains under hvd.elastic.run (ElasticStrategy)

    def __init__(self, dist: DistEnv):
        self.dist = dist

    @property
    def replicas(self) -> int:
        """The data-parallel replicas: the global batch is the local batch times this."""
        return self.dist.size

    @property
    def input_dist(self) -> DistEnv:
        """The rank layout the input is sharded by."""
        return self.dist

    @property
    def saves_input_position(self) -> bool:
        """Whether every rank reads its own stream, so that checkpoints can save each rank's input position."""
        return True

    def model_seed(self, seed: int) -> int:
        """The seed this rank builds its model with (rank 0's initial weights are broadcast anyway)."""
        return seed + self.dist.rank

    def build(self, app: Any, cfg: Any) -> Trainee:
        """In init: what this rank trains, the application's (run.App's `build`)."""
        return app.build(cfg, self)

    def prepare(self, cfg: Any) -> None:
        """In init, once the model is built: start what the steps need (nothing here)."""

    @property
    def make_steps(self) -> StepsFactory:
        return data_parallel_steps

    def callbacks(self) -> list:
        """Loop callbacks this strategy adds to the run's (after them)."""
        return []

    def mlperf_keys(self) -> dict:
        """Events this strategy adds to init (beside the hyperparameters)."""
        return {}

    def summary(self, trainee: Trainee) -> dict:
        """After training, on every rank (collectives allowed): the fields rank 0 adds to summary.json."""
        return {}


def data_parallel_steps(trainee: Trainee, dist: DistEnv, stop: StopRequests | None = None) -> Steps:
    """The Keras model in `tf.function` steps, gradients (and the stop flag) averaged over all ranks in one
    grouped allreduce."""
    clock = PhaseClock(STEP_PHASES, gpu.sync_devices if dist.gpu else None)
    return Steps(train=make_train_step(trainee.model, trainee.optimizer, trainee.loss, dist, stop,
                                       jit_compile=trainee.jit_compile, clock=clock),
                 evaluate=_make_eval_step(trainee.model, trainee.loss, trainee.metric), stop=stop, clock=clock)


def make_train_step(model, optimizer, loss_fn, dist: DistEnv, stop: StopRequests | None = None,
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

    exchanged = dist.several

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


def _make_eval_step(model, loss_fn, metric: Any):
    import tensorflow as tf

    @tf.function
    def eval_step(x, y):
        return batch_sums(loss_fn, metric, y, model(x, training=False))

    return eval_step


def batch_sums(loss_fn: Callable, metric: Any, y_true: Any, y_pred: Any) -> Any:
    """[count, loss sum, metric sums ...] of one batch, float32; an empty batch (0, ...) gives zeros."""
    import tensorflow as tf
    batch = tf.cast(tf.shape(y_true)[0], tf.float32)
    # multiply_no_nan: the mean loss of an empty batch is NaN, its sum is 0.
    loss_sum = tf.reshape(tf.math.multiply_no_nan(tf.cast(loss_fn(y_true, y_pred), tf.float32), batch), [1])
    return tf.concat([tf.reshape(batch, [1]), loss_sum, tf.cast(metric.batch_sums(y_true, y_pred), tf.float32)],
                     axis=0)


# ---------------------------------------------------------------------------- the phase clock
# Where a rank's training steps spend their time, by phase, on the host's clock: `start()` at the start of a
# step, then `lap(name)` at the end of each phase adds its seconds to `name`.
# On a GPU the host runs ahead of the device, so a lap means nothing unless the device is drained first: with
# `sync` on (the system window turns it on for the steps it records, common/runtime/monitor.py) every reading
# waits for the device. Off, a reading costs one clock read, so the training steps keep their clock always.


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


# ---------------------------------------------------------------------------- precision
def set_precision(precision: str) -> None:
    """The global Keras policy models are built under (call before building)."""
    import keras
    keras.mixed_precision.set_global_policy(precision)


def for_precision(optimizer: Any, precision: str) -> Any:
    """`optimizer`, in a dynamic loss-scaling wrapper for mixed_float16."""
    if precision != "mixed_float16":
        return optimizer
    import keras
    return keras.optimizers.LossScaleOptimizer(optimizer)


def precision_keys(precision: str, jit_compile: bool) -> dict:
    """What the MLPerf log records of them."""
    return {"precision": precision, "jit_compile": jit_compile}
