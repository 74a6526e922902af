"""The stop request rides in the training step's gradient allreduce (the 2-rank case: tests/integration/test_faults.py)."""
import signal

import numpy as np

from common.runtime.dist import DistEnv
from common.runtime.loop import Control, Steps, make_train_step
from common.runtime.stopping import StopRequests


def _step(stop):
    import keras
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    return make_train_step(model, keras.optimizers.SGD(0.1), lambda y, p: keras.ops.mean((y - p) ** 2), DistEnv(),
                           stop)


def test_a_signal_is_seen_after_the_next_step_without_a_collective_of_its_own():
    requests = StopRequests()
    flag = requests.flag()
    step, x, y = _step(flag), np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
    control, steps = Control(stop=requests), Steps(train=step, evaluate=None, stop=flag)
    requests.arm()
    step(x, y)
    assert not control.stop_requested(DistEnv(), steps)
    requests._handler(signal.SIGUSR1, None)  # what the installed handler does on SIGUSR1
    requests.arm()
    step(x, y)
    assert control.stop_requested(DistEnv(), steps) and requests.describe() == "SIGUSR1"


def test_steps_without_the_flag_fall_back_to_asking():
    requests = StopRequests()
    control, steps = Control(stop=requests), Steps(train=_step(None), evaluate=None)
    assert not control.stop_requested(DistEnv(), steps)
    requests._handler(signal.SIGTERM, None)
    assert control.stop_requested(DistEnv(), steps)
    assert not Control().stop_requested(DistEnv(), steps)
