"""Checkpoints on one process: exact resume (at an epoch end and inside an epoch), stop requests, the files
and their checks, falling back from a corrupt newest checkpoint, pruning."""
import json
import signal
import time

import numpy as np
import pytest

from common.runtime.checkpoint import Checkpointer, InputPlan, Meta, check_checkpoint, list_checkpoints, newest_valid
from common.runtime.config import CheckpointConfig, TrainConfig
from common.runtime.dist import DistEnv, StopRequests
from common.base.errors import BenchError
from common.io.input import Datasets
from common.runtime.callbacks import Checkpoints, EvalEverySteps, StopSignal, keep_trained
from common.runtime.loop import Loop, Trainee, fit
from common.runtime.strategy import data_parallel_steps
from common.runtime.summary import MLPerfLog
from cosmoflow.model import MeanAbsoluteError, mse_loss

STEPS, BATCH = 4, 2


def _data():
    """A shuffled endless stream (its shuffle buffer and RNG are part of the input state) of 16 samples."""
    import tensorflow as tf
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 3)).astype(np.float32)
    y = (x @ np.array([[0.5], [-0.2], [0.1]], np.float32)).repeat(4, axis=1)
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(5, seed=3).repeat().batch(BATCH)
    val = tf.data.Dataset.from_tensor_slices((x[:8], y[:8])).batch(BATCH).repeat()
    return Datasets(train, val, STEPS, STEPS, STEPS * BATCH, 8, BATCH, loader="tfdata")


class StopAt(StopRequests):
    """Asks to stop after the `at`-th step of the run: the signal arrives just before that step, whose
    gradient allreduce carries it."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.calls = at, 0

    def arm(self) -> None:
        self.calls += 1
        if self.calls == self.at:
            self.signum = signal.SIGUSR1
        super().arm()


def _fit(out, max_epochs, resume=False, stop=None, every_epochs=1, keep=10, target=0.0, eval_every_steps=0,
         keep_weights=True):
    """fit() of a small model with the run's checkpoint callbacks, then what run.py does after run_stop
    (`keep_trained`); returns the result and the model's final weights."""
    import keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8), keras.layers.BatchNormalization(),
                              keras.layers.Dropout(0.3), keras.layers.Dense(4)])
    cfg = CheckpointConfig(dir=str(out / "ckpt"), every_epochs=every_epochs, keep=keep, resume=resume,
                           keep_trained=keep_weights)
    found = newest_valid(out / "ckpt", warn=lambda _m: None) if resume else None
    checkpoints = Checkpoints(cfg, lambda: Checkpointer(cfg, str(out), DistEnv(), "cosmoflow", lambda _m: None),
                              input_state=True, run_start=time.time(), resume=found,
                              plan=InputPlan(0, restore="iterator"))
    callbacks = [checkpoints] + ([EvalEverySteps(eval_every_steps)] if eval_every_steps else []) + (
        [StopSignal(stop, checkpoints)] if stop else [])
    mlperf = MLPerfLog(out / "mlperf.log")
    trainee = Trainee(model, keras.optimizers.SGD(0.1, momentum=0.9), mse_loss, MeanAbsoluteError(),
                      lambda _data: lambda epoch: 0.05 * (1 + epoch))
    options = TrainConfig(max_epochs=max_epochs, target=target, eval_every_steps=eval_every_steps)
    loop = Loop(trainee, _data(), data_parallel_steps(trainee, DistEnv(), stop.flag() if stop else None),
                DistEnv(), mlperf, options, callbacks, log=lambda _m: None)
    result = fit(loop)
    keep_trained(loop)
    mlperf.close()
    return result, [v.numpy() for v in model.variables]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def _metrics(history):
    return [(h["epoch"], h["loss"], h["mae"], h["val_loss"]) for h in history]


def test_resume_at_an_epoch_end_gives_the_uninterrupted_run(tmp_path):
    straight, weights = _fit(tmp_path / "a", 4)
    _fit(tmp_path / "b", 2)
    resumed, resumed_weights = _fit(tmp_path / "b", 4, resume=True)
    _same(weights, resumed_weights)
    assert _metrics(resumed.history) == _metrics(straight.history)
    assert [p.name for p in list_checkpoints(tmp_path / "b" / "ckpt")] == [f"ckpt-{s:09d}" for s in (16, 12, 8, 4)]


@pytest.mark.parametrize("at", [3, 6, 8])  # inside epoch 1, inside epoch 2, after the last step of epoch 2
def test_a_stop_request_checkpoints_the_step_and_resuming_finishes_the_same_run(tmp_path, at):
    straight, weights = _fit(tmp_path / "a", 3)
    stopped, _ = _fit(tmp_path / "b", 3, stop=StopAt(at))
    assert stopped.stopped and stopped.status == "aborted" and "stopped by SIGUSR1" in stopped.reason
    meta = json.loads((tmp_path / "b" / "ckpt" / f"ckpt-{at:09d}" / "meta.json").read_text())
    assert (meta["progress"]["epoch"], meta["progress"]["step"]) == ((at - 1) // STEPS + 1, (at - 1) % STEPS + 1)
    assert stopped.checkpoint.endswith(f"ckpt-{at:09d}")
    resumed, resumed_weights = _fit(tmp_path / "b", 3, resume=True)
    _same(weights, resumed_weights)
    assert _metrics(resumed.history) == _metrics(straight.history)


def test_a_stop_without_checkpoints_on_signal_writes_none(tmp_path):
    import keras
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
    cfg = CheckpointConfig(dir=str(tmp_path / "ckpt"), on_signal=False)
    checkpoints = Checkpoints(cfg, lambda: Checkpointer(cfg, str(tmp_path), DistEnv(), "cosmoflow", lambda _m: None),
                              input_state=True, run_start=time.time())
    stop = StopAt(2)
    callbacks = [checkpoints, StopSignal(stop, None)]  # checkpoint.on_signal=false: the run passes no checkpoints
    trainee = Trainee(model, keras.optimizers.SGD(0.1), mse_loss, MeanAbsoluteError(), lambda _data: lambda epoch: 0.05)
    result = fit(Loop(trainee, _data(), data_parallel_steps(trainee, DistEnv(), stop.flag()), DistEnv(),
                      MLPerfLog(tmp_path / "m.log", enabled=False), TrainConfig(max_epochs=3, target=0.0), callbacks,
                      log=lambda _m: None))
    assert result.stopped and result.checkpoint == "" and "no checkpoint written" in result.reason
    assert list_checkpoints(tmp_path / "ckpt") == []


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_with_a_warning(tmp_path):
    _fit(tmp_path, 3)
    newest = tmp_path / "ckpt" / "ckpt-000000012" / "model.npz"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01
    newest.write_bytes(bytes(data))
    warnings = []
    found = newest_valid(tmp_path / "ckpt", warn=warnings.append)
    assert found.path.name == "ckpt-000000008"
    assert len(warnings) == 1 and "ckpt-000000012" in warnings[0] and "xxh3_128" in warnings[0]


def test_checks_name_the_missing_truncated_or_unfinished_file(tmp_path):
    _fit(tmp_path, 2)
    ckpt = tmp_path / "ckpt" / "ckpt-000000008"
    (ckpt / "rank_00000.npz").write_bytes((ckpt / "rank_00000.npz").read_bytes()[:-10])
    with pytest.raises(BenchError, match="rank_00000.npz: .* bytes, meta.json says .*truncated"):
        check_checkpoint(ckpt)
    (ckpt / "model.npz").unlink()
    with pytest.raises(BenchError, match="model.npz: listed in the checkpoint's meta.json but missing"):
        check_checkpoint(ckpt)
    (ckpt / "meta.json").write_text('{"format": "hpc-sciml-checkpoint", "ver')
    with pytest.raises(BenchError, match="meta.json: not readable JSON"):
        check_checkpoint(ckpt)
    (ckpt / "meta.json").unlink()
    with pytest.raises(BenchError, match="meta.json: missing; the checkpoint was not finished"):
        check_checkpoint(ckpt)


def test_an_unfinished_checkpoint_directory_is_never_taken(tmp_path):
    _fit(tmp_path, 1)
    (tmp_path / "ckpt" / ".tmp-ckpt-000000099").mkdir()
    assert [p.name for p in list_checkpoints(tmp_path / "ckpt")] == ["ckpt-000000004"]
    assert newest_valid(tmp_path / "missing") is None


def test_keeps_the_newest_few_and_removes_stale_temporaries(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / ".tmp-ckpt-000000001").mkdir()
    _fit(tmp_path, 4, keep=2)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["ckpt-000000012", "ckpt-000000016"]


def test_a_checkpoint_of_another_model_is_refused_with_the_variable(tmp_path):
    import keras
    from common.runtime.checkpoint import restore_shared
    _fit(tmp_path, 1)
    found = newest_valid(tmp_path / "ckpt")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5), keras.layers.BatchNormalization(),
                              keras.layers.Dropout(0.3), keras.layers.Dense(4)])
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)
    with pytest.raises(BenchError, match=r"variable 0 \(.*kernel\) has shape \[3, 8\] there and \[3, 5\] here"):
        restore_shared(found, model, optimizer, DistEnv())


def test_stop_requests_catch_the_scheduler_signals_and_restore_the_handlers():
    import os
    previous = signal.getsignal(signal.SIGUSR1)
    stop = StopRequests().install()
    try:
        assert stop.agreed_now(DistEnv()) == 0
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.agreed_now(DistEnv()) == 1 and stop.describe() == "SIGUSR1"
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is previous


def test_checkpoint_config_checks():
    with pytest.raises(BenchError, match="checkpoint.keep"):
        CheckpointConfig(keep=0)
    with pytest.raises(BenchError, match="checkpoint.every_minutes"):
        CheckpointConfig(every_minutes=-1)


def test_the_checkpoint_to_resume_is_its_meta_with_its_path(tmp_path):
    _fit(tmp_path, 1)
    found = newest_valid(tmp_path / "ckpt")
    assert isinstance(found, Meta) and found.ranks == 1 and found.input_state
    assert found.path == tmp_path / "ckpt" / "ckpt-000000004"
    assert (found.progress.epoch, found.progress.step, found.progress.attempt) == (2, 0, 1)


@pytest.mark.parametrize("every_epochs,keep,saved", [(3, True, True), (0, True, True), (3, False, False)])
def test_the_epoch_that_reaches_the_target_keeps_its_weights_after_the_run_unless_told_not_to(tmp_path, every_epochs,
                                                                                             keep, saved):
    """Target reached in epoch 1, whose end is not due (every 3 epochs, or no schedule): after the run
    (keep_trained, which run.py calls after run_stop) the final weights are saved all the same, without input
    state, so an export gets the model that met the target; checkpoint.keep_trained=false saves nothing."""
    result, final = _fit(tmp_path, 5, every_epochs=every_epochs, target=10.0, keep_weights=keep)
    assert result.status == "success" and result.epochs == 1
    found = list_checkpoints(tmp_path / "ckpt")
    assert [p.name for p in found] == (["ckpt-000000004"] if saved else [])
    if saved:
        meta = check_checkpoint(found[0])
        assert (meta["progress"]["epoch"], meta["progress"]["step"]) == (2, 0) and meta["input_state"] is False
        with np.load(found[0] / "model.npz") as arrays:
            _same([arrays[f"v{i:05d}"] for i in range(2)], final[:2])  # the first Dense layer's kernel and bias


def test_a_target_reached_inside_an_epoch_saves_the_step_that_reached_it(tmp_path):
    """Evaluations every 2 steps (train.eval_every_steps): the target is met after step 2 of epoch 1's 4; the
    run saves that step's weights (a checkpoint inside the epoch, as a stop signal writes)."""
    result, final = _fit(tmp_path, 5, every_epochs=3, target=10.0, eval_every_steps=2)
    assert result.status == "success" and result.epochs == 1
    found = list_checkpoints(tmp_path / "ckpt")
    assert [p.name for p in found] == ["ckpt-000000002"]
    meta = check_checkpoint(found[0])
    assert (meta["progress"]["epoch"], meta["progress"]["step"]) == (1, 2)
    with np.load(found[0] / "model.npz") as arrays:
        _same([arrays[f"v{i:05d}"] for i in range(2)], final[:2])
