"""train.precision and train.jit_compile: a CPU trains CosmoFlow with mixed_bfloat16, float16 scales its loss,
XLA compiles the step; the GPU a rank uses, with the device list faked."""
import numpy as np
import pytest

from common.runtime.dist import DistEnv, pick_gpu
from common.runtime.loop import shared_variables
from common.runtime.strategy import for_precision, make_train_step, set_precision
from cosmoflow.model import build_model, mse_loss

SMALL = dict(input_shape=(16, 16, 16, 2), conv_filters=(4, 8), dense_units=(8, 4), dropout=0.0)


@pytest.fixture(autouse=True)
def float32_after():
    yield
    set_precision("float32")


def _train(precision: str, jit_compile: bool = False, steps: int = 12) -> tuple:
    import keras
    keras.utils.set_random_seed(3)
    set_precision(precision)
    model = build_model(**SMALL)
    optimizer = for_precision(keras.optimizers.SGD(learning_rate=0.05, momentum=0.9), precision)
    step = make_train_step(model, optimizer, mse_loss, DistEnv(), jit_compile=jit_compile)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 16, 16, 16, 2)).astype(np.float32)
    y = rng.uniform(-0.8, 0.8, (4, 4)).astype(np.float32)
    losses = [float(step(x, y)) for _ in range(steps)]
    return model, optimizer, losses


# TensorFlow's CPU kernels lack float16 3D pooling (float16 is a GPU format): XLA's CPU kernels have it.
@pytest.mark.parametrize("precision, jit", [("mixed_bfloat16", False), ("mixed_float16", True)])
def test_mixed_precision_trains_with_float32_weights_outputs_and_loss(precision, jit):
    import keras
    model, optimizer, losses = _train(precision, jit)
    assert all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0], losses
    conv = model.get_layer("conv1")
    assert conv.kernel.dtype == "float32" and conv.compute_dtype == precision.removeprefix("mixed_")
    assert model.output.dtype == "float32"
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer) == (precision == "mixed_float16")


def test_xla_compiled_steps_train_like_the_plain_ones():
    _, _, plain = _train("float32")
    _, _, compiled = _train("float32", jit_compile=True)
    np.testing.assert_allclose(compiled[:6], plain[:6], rtol=1e-3)  # float sums reorder; training amplifies it


@pytest.mark.parametrize("local_rank, visible, index", [(0, 1, 0), (3, 1, 0), (3, 4, 3), (5, 4, 1), (2, 0, None)])
def test_the_gpu_a_rank_uses_from_the_devices_it_sees(local_rank, visible, index):
    """One visible GPU per rank (the shipped job scripts bind so): index 0 on every rank, which is what DALI's
    device_id must be; all of a node's GPUs visible: the local rank's."""
    assert pick_gpu(local_rank, visible) == index


def test_tensorflow_is_pinned_to_the_picked_gpu(monkeypatch):
    import tensorflow as tf
    from common.runtime import dist as dist_module
    fake = [f"/physical_device:GPU:{i}" for i in range(4)]
    chosen = {}
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind: fake if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "set_visible_devices", lambda device, kind: chosen.setdefault("visible", device))
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth", lambda device, on: chosen.setdefault("grow", on))
    assert dist_module._configure_tensorflow(1, 1, local_rank=6) == 2
    assert chosen == {"visible": fake[2], "grow": True}
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind: fake[:1])
    assert dist_module._configure_tensorflow(1, 1, local_rank=6) == 0  # CUDA_VISIBLE_DEVICES gave it one


def test_dropout_seed_states_stay_per_rank():
    import keras
    states = []
    for rank in (0, 1):
        keras.utils.set_random_seed(rank)
        model = build_model(**{**SMALL, "dropout": 0.5})
        kept = {v.path for v in shared_variables(model)}
        seeds = [v for v in model.variables if v.path not in kept]
        assert seeds and all("seed_generator" in v.path for v in seeds)
        assert kept == {v.path for v in model.weights}
        states.append(np.concatenate([np.asarray(v) for v in seeds]))
    assert not np.array_equal(*states)  # seeded per rank, and not broadcast: different dropout masks
