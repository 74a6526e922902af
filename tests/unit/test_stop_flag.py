"""The stop request rides in the training step's gradient allreduce (the 2-rank case: tests/integration/test_faults.py)."""
import signal

import numpy as np

from common.io.input import Datasets
from common.runtime.callbacks import StopSignal
from common.runtime.dist import DistEnv
from common.runtime.loop import Loop, Steps
from common.runtime.dist import StopRequests
from common.runtime.strategy import make_train_step


def _step(stop):
    import keras
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    return make_train_step(model, keras.optimizers.SGD(0.1), lambda y, p: keras.ops.mean((y - p) ** 2), DistEnv(),
                           stop)


def _loop(steps: Steps) -> Loop:
    """A loop after its first step of ten (StopSignal reads only the steps, the layout and the position)."""
    data = Datasets(train=None, val=None, train_steps=10, val_steps=1, train_samples=40, val_samples=4,
                    local_batch_size=4)
    return Loop(trainee=None, data=data, steps=steps, dist=DistEnv(), mlperf=None, options=None, epoch=1, step=1)


def test_a_signal_is_seen_after_the_next_step_without_a_collective_of_its_own():
    requests = StopRequests()
    flag = requests.flag()
    step, x, y = _step(flag), np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
    callback, loop = StopSignal(requests, None), _loop(Steps(train=step, evaluate=None, stop=flag))
    callback.start(loop)  # arms the flag before the first step
    step(x, y)
    callback.after_step(loop)
    assert loop.result is None
    requests._handler(signal.SIGUSR1, None)  # what the installed handler does, here during step 2
    step(x, y)  # armed before the signal: step 2's allreduce does not carry it
    callback.after_step(loop)
    assert loop.result is None
    step(x, y)  # armed by the callback after step 2
    callback.after_step(loop)
    assert loop.result.stopped and "SIGUSR1" in loop.result.reason and requests.describe() == "SIGUSR1"


def test_steps_without_the_flag_fall_back_to_asking():
    requests = StopRequests()
    callback, loop = StopSignal(requests, None), _loop(Steps(train=_step(None), evaluate=None))
    callback.after_step(loop)
    assert loop.result is None
    requests._handler(signal.SIGTERM, None)
    callback.after_step(loop)
    assert loop.result.stopped and "no checkpoint written" in loop.result.reason
