"""Learning-rate schedule: linear scaling, warm-up and step decay at chosen epochs."""
import pytest

from cosmoflow.config import OptimizerConfig, ScheduleConfig
from cosmoflow.schedule import LRSchedule


@pytest.fixture
def sched():
    opt = OptimizerConfig(base_lr=0.001, base_batch_size=64)
    return LRSchedule.from_config(opt, ScheduleConfig(warmup_epochs=4, decay_epochs=(32, 64),
                                                      decay_factors=(0.25, 0.125)), global_batch=512)


def test_linear_scaling(sched):
    assert sched.peak_lr == pytest.approx(0.008) and sched.warmup_factor == pytest.approx(8.0)


@pytest.mark.parametrize("epoch, lr", [(0, 0.001), (2, 0.0045), (4, 0.008), (31.9, 0.008),
                                       (32, 0.002), (63, 0.002), (64, 0.001), (100, 0.001)])
def test_values_at_chosen_epochs(sched, epoch, lr):
    assert sched(epoch) == pytest.approx(lr)


def test_no_warmup_no_decay():
    s = LRSchedule.from_config(OptimizerConfig(base_lr=0.01, base_batch_size=8), ScheduleConfig(), global_batch=8)
    assert [s(e) for e in (0, 5, 50)] == [0.01, 0.01, 0.01]
