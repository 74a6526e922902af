"""CosmoFlow's learning-rate schedule against a plain statement of the reference's rule.

The reference (mlcommons/hpc cosmoflow/utils/optimizers.py) sets the rate once per 0-based epoch e:
warm-up base + e * (peak - base) / warmup for e < warmup, then peak times the factor of the largest
decay boundary b with b < e (strictly), 1 before the first.
"""
import pytest

from cosmoflow.config import OptimizerConfig, ScheduleConfig
from cosmoflow.train import LRSchedule, sgd_keys


def reference_rule(e: int, base: float, peak: float, warmup: int, decays: dict) -> float:
    if e < warmup:
        return e * (peak - base) / warmup + base
    factor, latest = 1.0, 0
    for boundary, f in decays.items():
        if boundary >= latest and boundary < e:
            latest, factor = boundary, f
    return peak * factor


CASES = [  # (base_lr, base_batch, global_batch, warmup, decays): the reference's defaults and RCP-like settings
    (0.001, 64, 512, 4, {32: 0.25, 64: 0.125}),
    (0.001, 32, 128, 4, {16: 0.25, 32: 0.0625}),
    (0.0015, 128, 512, 6, {19: 0.5, 21: 0.25, 22: 0.125, 23: 0.0625}),
    (0.012, 1024, 1024, 0, {32: 0.25, 64: 0.0625}),
    (0.008, 8, 8, 1, {5: 0.25, 7: 0.0625}),
]


def _schedule(base, base_batch, global_batch, warmup, decays, granularity="epoch"):
    opt = OptimizerConfig(base_lr=base, base_batch_size=base_batch)
    sched = ScheduleConfig(warmup_epochs=warmup, decay_epochs=tuple(decays), decay_factors=tuple(decays.values()),
                           granularity=granularity)
    return LRSchedule.from_config(opt, sched, global_batch=global_batch)


@pytest.mark.parametrize("base, base_batch, global_batch, warmup, decays", CASES)
def test_every_epoch_and_step_follows_the_reference_rule(base, base_batch, global_batch, warmup, decays):
    schedule = _schedule(base, base_batch, global_batch, warmup, decays)
    peak = base * global_batch / base_batch
    for e in range(100):
        expected = reference_rule(e, base, peak, warmup, decays)
        # Constant within the epoch: the loop asks at every step with the fractional epoch.
        for frac in (0.0, 0.25, 0.999):
            assert schedule(e + frac) == pytest.approx(expected, rel=1e-12), (e, frac)
    assert schedule.by_epoch(5) == [pytest.approx(reference_rule(e, base, peak, warmup, decays)) for e in range(5)]


def test_a_decay_boundary_takes_effect_the_epoch_after_it():
    schedule = _schedule(0.001, 64, 512, 4, {32: 0.25, 64: 0.125})
    assert schedule(32.5) == pytest.approx(0.008) and schedule(33.0) == pytest.approx(0.002)
    assert schedule(64.0) == pytest.approx(0.002) and schedule(65.0) == pytest.approx(0.001)


def test_warm_up_reaches_the_peak_at_the_warm_up_epoch():
    schedule = _schedule(0.001, 64, 512, 4, {})
    assert [schedule(float(e)) for e in range(6)] == pytest.approx([0.001, 0.00275, 0.0045, 0.00625, 0.008, 0.008])


def test_the_per_step_variant_ramps_within_epochs_and_decays_at_the_boundary():
    schedule = _schedule(0.001, 64, 512, 4, {32: 0.25, 64: 0.125}, granularity="step")
    assert schedule(2.0) == pytest.approx(0.0045) and schedule(2.5) == pytest.approx(0.005375)
    assert schedule(31.9) == pytest.approx(0.008) and schedule(32.0) == pytest.approx(0.002)
    assert schedule(64.0) == pytest.approx(0.001)


def test_the_mini_config_decays_where_the_per_step_rule_did_before():
    """cosmo_mini.yaml's boundaries [5, 7] under the reference rule give the rates [6, 8] gave per step."""
    reference = _schedule(0.008, 8, 8, 1, {5: 0.25, 7: 0.0625})
    per_step = _schedule(0.008, 8, 8, 1, {6: 0.25, 8: 0.0625}, granularity="step")
    for step in range(12 * 8):
        assert reference(step / 8) == pytest.approx(per_step(step / 8)), step / 8


def test_the_log_carries_the_reference_meanings():
    opt, sched = OptimizerConfig(base_lr=0.001, base_batch_size=32), ScheduleConfig(warmup_epochs=4)
    keys = sgd_keys(opt, sched, LRSchedule.from_config(opt, sched, global_batch=128))
    assert keys["opt_name"] == "SGD" and keys["opt_base_learning_rate"] == pytest.approx(0.004)
    assert keys["opt_learning_rate_warmup_factor"] == pytest.approx(4.0)
    assert "opt_learning_rate_schedule_granularity" not in keys
    stepped = ScheduleConfig(warmup_epochs=4, granularity="step")
    keys = sgd_keys(opt, stepped, LRSchedule.from_config(opt, stepped, global_batch=128))
    assert keys["opt_learning_rate_schedule_granularity"] == "step"
