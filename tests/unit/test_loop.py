"""The shared training loop on one process: evaluation cadence, stopping at the target, MLPerf events."""
import json

import numpy as np
import pytest

from common.runtime.dist import DistEnv
from common.io.input import Datasets
from common.runtime.callbacks import EvalEverySteps
from common.runtime.config import TrainConfig
from common.runtime.loop import Loop, Trainee, fit
from common.runtime.summary import RUN_ABORTED, RUN_SUCCESS, MLPerfLog
from common.runtime.strategy import data_parallel_steps
from cosmoflow.model import MeanAbsoluteError, mse_loss


def _data(steps=4, batch=2):
    import tensorflow as tf
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * batch, 3)).astype(np.float32)
    y = (x @ np.array([[0.5], [-0.2], [0.1]], np.float32)).repeat(4, axis=1)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()
    return Datasets(ds, ds, steps, steps, steps * batch, steps * batch, batch)


def _fit(tmp_path, options):
    import keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization(), keras.layers.Dense(4)])
    mlperf = MLPerfLog(tmp_path / "mlperf.log")
    lines = []
    trainee = Trainee(model, keras.optimizers.SGD(0.1), mse_loss, MeanAbsoluteError(), lambda _data: lambda epoch: 0.05)
    callbacks = [EvalEverySteps(options.eval_every_steps)] if options.eval_every_steps else []
    steps = data_parallel_steps(trainee, DistEnv())
    result = fit(Loop(trainee, _data(), steps, DistEnv(), mlperf, options, callbacks, log=lines.append))
    mlperf.close()
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in (tmp_path / "mlperf.log").read_text().splitlines()]
    return result, events, lines


def test_evaluates_every_n_steps_inside_epochs(tmp_path):
    result, events, lines = _fit(tmp_path, TrainConfig(max_epochs=3, target=0.0, eval_every_steps=3))
    assert result.status == RUN_ABORTED  # MAE 0 is never reached
    evals = [e for e in events if e["key"] == "eval_error"]
    # 12 steps: evaluations after steps 3, 6, 9 and at the end (12), each tagged with its epoch.
    assert [e["metadata"]["epoch_num"] for e in evals] == [1, 2, 3, 3]
    assert [h["step"] for h in result.history if "mae" in h] == [3, 6, 12]  # last record of each epoch
    assert len(lines) == 4 and all("step" in line for line in lines)
    starts = [e for e in events if e["key"] == "epoch_start"]
    assert len(starts) == 3


def test_stops_inside_an_epoch_when_the_target_is_reached(tmp_path):
    result, events, _ = _fit(tmp_path, TrainConfig(max_epochs=5, target=10.0, eval_every_steps=2))
    assert result.status == RUN_SUCCESS and result.epochs == 1
    assert result.history[0]["step"] == 2 and result.history[0]["steps"] == 2
    assert [e["key"] for e in events][-1] == "epoch_stop"
    assert "step 2" in result.reason


def test_evaluates_every_epoch_by_default(tmp_path):
    result, events, _ = _fit(tmp_path, TrainConfig(max_epochs=2, target=0.0))
    assert [h["step"] for h in result.history] == [4, 8]
    assert all(h["samples_per_second"] > 0 and h["train_seconds"] > 0 for h in result.history)
    assert sum(e["key"] == "eval_start" for e in events) == 2


@pytest.mark.parametrize("eval_every,expected", [(2, [2, 3]), (1, [1, 2, 3])])
def test_eval_every_epochs_and_always_the_last(tmp_path, eval_every, expected):
    result, events, _ = _fit(tmp_path, TrainConfig(max_epochs=3, target=0.0, eval_every=eval_every))
    assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "eval_error"] == expected


def test_steps_from_outside_replace_the_keras_steps(tmp_path):
    """A steps factory (the hybrid path's Mesh-TF steps) replaces the Keras steps: the loop calls its train and
    evaluate on every batch of the schedule, reports its loss, and closes it once."""
    import keras
    import tensorflow as tf
    from common.runtime.loop import Steps
    from common.runtime.strategy import batch_sums
    metric, calls = MeanAbsoluteError(), {"train": 0, "evaluate": 0, "closed": 0}

    def make_steps(trainee):
        def train(x, y):
            calls["train"] += 1
            return tf.constant(0.5)

        def evaluate(x, y):
            calls["evaluate"] += 1
            return batch_sums(trainee.loss, trainee.metric, y, y)

        def close():
            calls["closed"] += 1
        return Steps(train, evaluate, close)

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
    mlperf = MLPerfLog(tmp_path / "mlperf.log")
    trainee = Trainee(model, keras.optimizers.SGD(0.1), mse_loss, metric, lambda _data: lambda epoch: 0.05)
    result = fit(Loop(trainee, _data(), make_steps(trainee), DistEnv(), mlperf,
                      TrainConfig(max_epochs=2, target=0.0), log=lambda _line: None))
    mlperf.close()
    assert calls == {"train": 2 * 4, "evaluate": 2 * 4, "closed": 1}
    assert [h["loss"] for h in result.history] == [0.5, 0.5]
    assert [h["val_samples_seen"] for h in result.history] == [8, 8] and result.history[-1]["mae"] == 0.0


def test_batch_sums_of_an_empty_batch_are_zeros():
    from common.runtime.strategy import batch_sums
    empty = np.zeros((0, 4), np.float32)
    np.testing.assert_array_equal(batch_sums(mse_loss, MeanAbsoluteError(), empty, empty).numpy(), np.zeros(7))
    y, pred = np.ones((2, 4), np.float32), np.full((2, 4), 1.5, np.float32)
    # [samples, loss x samples, values, |error| per parameter]
    np.testing.assert_allclose(batch_sums(mse_loss, MeanAbsoluteError(), y, pred).numpy(),
                               [2, 0.5, 8, 1, 1, 1, 1])
