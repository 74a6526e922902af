"""DeepCAM's optimizers and learning-rate schedules against plain statements of the MLPerf reference's rules
(apex FusedLAMB, torch Adam/AdamW, the reference's warm-up schedulers as torch steps them), and the MLPerf
optimizer keys."""
import math
from collections import Counter

import numpy as np
import pytest

from deepcam.config import DeepCamOptimizerConfig, DeepCamScheduleConfig
from deepcam.optim import StepSchedule, build_optimizer, mlperf_optimizer_keys

# ---------------------------------------------------------------------------- the reference, in numpy


def numpy_lamb(params, grads_per_step, rates, betas, eps, wd, max_grad_norm):
    """apex FusedLAMB (bias correction, grad averaging, adam_w_mode, use_nvlamb off), float64.
    Returns the parameters after each step."""
    b1, b2 = betas
    p = [x.astype(np.float64) for x in params]
    m, v = [np.zeros_like(x) for x in p], [np.zeros_like(x) for x in p]
    history = []
    for t, (grads, lr) in enumerate(zip(grads_per_step, rates), start=1):
        global_norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
        clip = global_norm / max_grad_norm if global_norm > max_grad_norm else 1.0
        for i, g in enumerate(grads):
            g = g / clip
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            update = (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps) + wd * p[i]
            p_norm, u_norm = np.linalg.norm(p[i]), np.linalg.norm(update)
            ratio = p_norm / u_norm if wd != 0 and p_norm != 0 and u_norm != 0 else 1.0
            p[i] = p[i] - lr * ratio * update
        history.append([x.copy() for x in p])
    return history


def numpy_torch_adam(params, grads_per_step, rates, betas, eps, wd, decoupled):
    """torch.optim.Adam (decoupled=False: L2 added to the gradient) or AdamW, float64, as torch writes it:
    step size lr / (1 - b1^t), denominator sqrt(v) / sqrt(1 - b2^t) + eps."""
    b1, b2 = betas
    p = [x.astype(np.float64) for x in params]
    m, v = [np.zeros_like(x) for x in p], [np.zeros_like(x) for x in p]
    history = []
    for t, (grads, lr) in enumerate(zip(grads_per_step, rates), start=1):
        for i, g in enumerate(grads):
            if decoupled:
                p[i] = p[i] * (1 - lr * wd)
            else:
                g = g + wd * p[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            p[i] = p[i] - lr / (1 - b1 ** t) * m[i] / (np.sqrt(v[i]) / math.sqrt(1 - b2 ** t) + eps)
        history.append([x.copy() for x in p])
    return history


def reference_rates(lr, kind, warmup_steps, warmup_factor=1.0, milestones=(), gamma=0.1, t_max=1, eta_min=0.0,
                    steps=40):
    """The rates of optimizer steps 0 .. steps-1 in a fresh reference run, simulated as torch runs its
    scheduler: the group's rate starts at lr; the scheduler is built with last_epoch=0 (train.py's start
    step; CosineAnnealingLR without warm-up keeps the default -1) and its constructor steps once; every
    optimizer step uses the group's rate and is followed by one scheduler step, which advances last_epoch
    and computes the new rate from it and the group's current rate."""
    w, f = warmup_steps, warmup_factor

    def warm(t):
        return lr * t / w if f == 1.0 else lr * ((f - 1.0) * t / w + 1.0)

    def multistep(t, rate, at):  # chainable: multiply when last_epoch hits a milestone
        return rate * gamma ** at[t]

    def cosine(e, rate):  # torch's recursive cosine annealing, e epochs into it
        if e == 0:
            return rate
        if (e - 1 - t_max) % (2 * t_max) == 0:
            return rate + (lr - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
        return (1 + math.cos(math.pi * e / t_max)) / (1 + math.cos(math.pi * (e - 1) / t_max)) * (rate - eta_min) \
            + eta_min

    def scheduler(t, rate):
        if w == 0:
            return multistep(t, rate, Counter(milestones)) if kind == "multistep" else cosine(t, rate)
        if t < w:
            return warm(t)
        if kind == "multistep":
            return multistep(t, rate, Counter(m + w + 1 for m in milestones))
        return cosine(t - w, rate)

    last_epoch = -1 if (kind == "cosine_annealing" and w == 0) else 0
    rate, rates = lr, []
    for _ in range(steps):
        last_epoch += 1
        rate = scheduler(last_epoch, rate)
        rates.append(rate)
    return rates


# ---------------------------------------------------------------------------- optimizers

def _problem(seed=0):
    """Three variables (one all zero: its norm is 0) and six steps of gradients whose global norm is above
    1 on some steps (clipped) and below on others; rates change every step."""
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32),
              np.zeros(2, np.float32)]
    scales = [1.0, 0.01, 0.5, 0.05, 2.0, 0.1]
    grads = [[(s * rng.normal(size=p.shape)).astype(np.float32) for p in params] for s in scales]
    rates = [0.01, 0.02, 0.005, 0.03, 0.01, 0.002]
    return params, grads, rates


def _run_keras(optimizer, params, grads_per_step, rates, compiled):
    import keras
    import tensorflow as tf
    variables = [keras.Variable(p) for p in params]
    optimizer.build(variables)
    apply = tf.function(lambda grads: optimizer.apply(grads, variables)) if compiled else \
        (lambda grads: optimizer.apply(grads, variables))
    history = []
    for grads, lr in zip(grads_per_step, rates):
        optimizer.learning_rate.assign(lr)
        apply([tf.constant(g) for g in grads])
        history.append([np.asarray(v.numpy()) for v in variables])
    return history


def _assert_same(got, want):
    for step, (g_step, w_step) in enumerate(zip(got, want)):
        for i, (g, w) in enumerate(zip(g_step, w_step)):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-7, err_msg=f"step {step + 1}, variable {i}")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("wd", [0.01, 0.0])
def test_lamb_follows_apex_fused_lambs_update_rule_as_numpy_lamb_states_it_step_by_step(compiled, wd):
    from deepcam.lamb import ApexLamb
    params, grads, rates = _problem()
    opt = ApexLamb(learning_rate=rates[0], beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay=wd,
                   max_grad_norm=1.0)
    got = _run_keras(opt, params, grads, rates, compiled)
    _assert_same(got, numpy_lamb(params, grads, rates, (0.9, 0.999), 1e-6, wd, 1.0))


def test_lamb_decay_inside_the_trust_ratio_differs_from_keras_lamb():
    """Why our own: Keras' Lamb decays outside the trust ratio (and applies the ratio to every variable)."""
    import keras
    params, grads, rates = _problem(1)
    want = numpy_lamb(params, grads, rates, (0.9, 0.999), 1e-6, 0.1, 1.0)
    keras_lamb = keras.optimizers.Lamb(learning_rate=rates[0], epsilon=1e-6, weight_decay=0.1, global_clipnorm=1.0)
    got = _run_keras(keras_lamb, params, grads, rates, compiled=False)
    assert not np.allclose(got[-1][0], want[-1][0], rtol=1e-4)


@pytest.mark.parametrize("decoupled", [False, True], ids=["Adam", "AdamW"])
def test_adam_and_adamw_follow_torchs_update_rules_as_numpy_torch_adam_states_them_step_by_step(decoupled):
    from deepcam.lamb import TorchAdam
    params, grads, rates = _problem(2)
    opt = TorchAdam(learning_rate=rates[0], beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay=0.05,
                    decoupled=decoupled)
    got = _run_keras(opt, params, grads, rates, compiled=True)
    _assert_same(got, numpy_torch_adam(params, grads, rates, (0.9, 0.999), 1e-6, 0.05, decoupled))


@pytest.mark.parametrize("name,cls,decoupled", [("LAMB", "ApexLamb", True), ("AdamW", "TorchAdam", True),
                                                ("Adam", "TorchAdam", False)])
def test_build_optimizer_gives_the_reference_optimizer(name, cls, decoupled):
    cfg = DeepCamOptimizerConfig(name=name, weight_decay=0.02)
    opt = build_optimizer(cfg, 0.001)
    assert type(opt).__name__ == cls and opt.decoupled == decoupled
    assert opt.epsilon == pytest.approx(1e-6) and opt.param_decay == pytest.approx(0.02)
    assert opt.weight_decay is None  # Keras' own decoupled decay stays off
    if name == "LAMB":
        assert opt.max_grad_norm == 1.0


def test_optimizer_arguments_are_checked_with_the_value_in_the_message():
    from deepcam.lamb import ApexLamb, TorchAdam
    with pytest.raises(ValueError, match="max_grad_norm=0.*expected > 0"):
        ApexLamb(max_grad_norm=0.0)
    with pytest.raises(ValueError, match="clipnorm"):
        ApexLamb(clipnorm=1.0)
    with pytest.raises(ValueError, match="beta_2=1.0, expected"):
        TorchAdam(beta_2=1.0)
    with pytest.raises(ValueError, match="weight_decay=-0.1, expected >= 0"):
        TorchAdam(weight_decay=-0.1)


def test_lamb_config_round_trip():
    from deepcam.lamb import ApexLamb
    opt = ApexLamb(learning_rate=0.004, weight_decay=0.01, max_grad_norm=1.0)
    again = ApexLamb.from_config(opt.get_config())
    assert (again.param_decay, again.max_grad_norm, again.epsilon) == (0.01, 1.0, 1e-6)


# ---------------------------------------------------------------------------- schedules

SCHEDULES = {
    "multistep, warm-up": dict(kind="multistep", warmup_steps=5, milestones=(3, 9)),
    "multistep, one warm-up step": dict(kind="multistep", warmup_steps=1, milestones=(2,)),
    "multistep, warm-up factor": dict(kind="multistep", warmup_steps=4, warmup_factor=3.0, milestones=(6,)),
    "multistep, no warm-up": dict(kind="multistep", warmup_steps=0, warmup_factor=2.0, milestones=(1, 4, 10)),
    "cosine, warm-up, past t_max": dict(kind="cosine_annealing", warmup_steps=4, t_max=7, eta_min=1e-4),
    "cosine, warm-up factor": dict(kind="cosine_annealing", warmup_steps=3, warmup_factor=2.0, t_max=5),
    "cosine, no warm-up": dict(kind="cosine_annealing", warmup_steps=0, t_max=6, eta_min=2e-4),
}


def _schedule(lr, kind, warmup_steps, warmup_factor=1.0, milestones=(), t_max=1, eta_min=0.0):
    return StepSchedule(lr=lr, warmup_steps=warmup_steps, warmup_factor=warmup_factor, kind=kind,
                        milestones=milestones, decay_rate=0.1, t_max=t_max, eta_min=eta_min)


@pytest.mark.parametrize("case", SCHEDULES)
def test_schedule_matches_the_reference_scheduler_step_by_step(case):
    args = SCHEDULES[case]
    schedule = _schedule(0.01, **args)
    want = reference_rates(0.01, **args, steps=40)
    got = [schedule.at_step(k) for k in range(40)]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_reference_config_schedule_at_its_turning_points():
    """deepcam.yaml (the reference's run_training.sh): lr 0.0055, 400 warm-up steps, milestone 800."""
    s = _schedule(0.0055, "multistep", 400, milestones=(800,))
    assert s.at_step(0) == pytest.approx(0.0055 / 400)  # step 0 already at the scheduler's epoch 1
    assert s.at_step(397) == pytest.approx(0.0055 * 398 / 400)
    assert s.at_step(398) == s.at_step(399) == s.at_step(1199) == pytest.approx(0.0055 * 399 / 400)
    assert s.at_step(1200) == pytest.approx(0.0055 * 399 / 400 * 0.1)  # 400 + 800: the first decayed step
    assert s.peak_lr == pytest.approx(0.0055 * 399 / 400)


def test_cosine_rises_again_after_t_max():
    s = _schedule(0.004, "cosine_annealing", 64, t_max=1536)
    end = 64 - 1 + 1536  # the step where e = t_max
    assert s.at_step(end) == pytest.approx(0.0, abs=1e-15)
    assert s.at_step(end + 100) > s.at_step(end + 1) > 0.0
    assert s.at_step(end + 1536) == pytest.approx(0.004)  # back to lr, not to the plateau


def test_per_epoch_is_the_step_schedule_at_the_loops_fractional_epochs():
    s = _schedule(0.01, "multistep", 5, milestones=(3, 9))
    per_epoch = s.per_epoch(steps_per_epoch=7)
    for epoch in range(1, 4):
        for step in range(7):  # as common/runtime/loop.py calls it before each step
            assert per_epoch(epoch - 1 + step / 7) == s.at_step((epoch - 1) * 7 + step)


@pytest.mark.parametrize("step", [-1, 2.5, "3"])
def test_schedule_refuses_a_step_that_is_not_a_whole_number(step):
    with pytest.raises(ValueError, match="expected a whole number >= 0"):
        _schedule(0.01, "multistep", 5).at_step(step)


def test_rates_the_optimizer_used_in_training_follow_the_reference(tmp_path):
    """Train through the shared loop (tf.function steps) and read the rate each optimizer step received."""
    import keras
    from keras import ops

    from common.runtime.dist import DistEnv
    from common.runtime.config import TrainConfig
    from common.runtime.loop import Loop, Trainee, fit
    from common.runtime.strategy import data_parallel_steps
    from common.runtime.summary import MLPerfLog
    from deepcam.lamb import ApexLamb
    from deepcam.model import MeanIoU, WeightedCrossEntropy, class_weights

    steps_per_epoch, epochs = 5, 3

    class RecordingLamb(ApexLamb):
        """Writes the rate each update step receives into `seen[iteration]`."""

        def build(self, var_list):
            if self.built:
                return
            super().build(var_list)
            self.seen = self.add_variable((steps_per_epoch * epochs,), name="seen_rates")

        def update_step(self, gradient, variable, learning_rate):
            index = ops.reshape(ops.cast(self.iterations, "int32"), (1, 1))
            rate = ops.reshape(ops.cast(learning_rate, "float32"), (1,))
            self.assign(self.seen, ops.scatter_update(self.seen, index, rate))
            super().update_step(gradient, variable, learning_rate)

    schedule = _schedule(0.01, "multistep", 4, milestones=(3, 6))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4, 6, 2)), keras.layers.Conv2D(3, 1)])
    optimizer = RecordingLamb(learning_rate=schedule.at_step(0))
    trainee = Trainee(model, optimizer, WeightedCrossEntropy(class_weights()), MeanIoU(3),
                      schedule_for=lambda data: schedule.per_epoch(data.train_steps))
    mlperf = MLPerfLog(tmp_path / "mlperf.log")
    data = _segmentation_data(steps_per_epoch)
    fit(Loop(trainee, data, data_parallel_steps(trainee, DistEnv()), DistEnv(), mlperf,
             TrainConfig(max_epochs=epochs, target=1.1), log=lambda _line: None))
    mlperf.close()
    want = reference_rates(0.01, "multistep", 4, milestones=(3, 6), steps=steps_per_epoch * epochs)
    np.testing.assert_allclose(optimizer.seen.numpy(), want, rtol=1e-6)


def _segmentation_data(steps, batch=2):
    import tensorflow as tf

    from common.io.input import Datasets
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * batch, 4, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, size=(steps * batch, 4, 6)).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()
    return Datasets(ds, ds, steps, steps, steps * batch, steps * batch, batch)


# ---------------------------------------------------------------------------- MLPerf keys

def test_mlperf_keys_cover_the_closed_deepcam_rules():
    lamb = mlperf_optimizer_keys(DeepCamOptimizerConfig(name="LAMB"),
                                 DeepCamScheduleConfig(type="multistep", warmup_steps=400, milestones=(800,)))
    assert {"opt_name", "opt_lr", "opt_betas", "opt_eps", "opt_bias_correction", "opt_grad_averaging",
            "opt_max_grad_norm", "scheduler_type", "scheduler_lr_warmup_steps", "scheduler_lr_warmup_factor",
            "scheduler_milestones", "scheduler_decay_rate"} <= set(lamb)
    assert lamb["opt_eps"] == 1e-6 and lamb["opt_max_grad_norm"] == 1.0 and lamb["scheduler_milestones"] == [800]
    assert lamb["opt_bias_correction"] is True and lamb["opt_grad_averaging"] is True
    cosine = mlperf_optimizer_keys(DeepCamOptimizerConfig(name="AdamW"),
                                   DeepCamScheduleConfig(type="cosine_annealing", t_max=500))
    assert {"scheduler_t_max", "scheduler_eta_min"} <= set(cosine) and "opt_max_grad_norm" not in cosine
    assert cosine["opt_amsgrad"] is False
