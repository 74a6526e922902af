"""CosmoFlow's weight decay as the reference applies it: an L2 penalty on the hidden dense kernels, in the loss."""
import numpy as np
import pytest

from common.runtime.dist import DistEnv
from common.runtime.strategy import make_train_step
from cosmoflow.model import build_model, mse_loss

SMALL = dict(input_shape=(16, 16, 16, 2), conv_filters=(4, 8), dense_units=(8, 4), dropout=0.0)


def _model(l2: float):
    import keras
    keras.utils.set_random_seed(7)
    return build_model(**SMALL, l2=l2)


def test_the_penalty_is_l2_times_the_squared_dense_kernels_only():
    model = _model(0.01)
    kernels = [model.get_layer(name).kernel.numpy() for name in ("dense1", "dense2")]
    expected = 0.01 * sum(float(np.sum(k.astype(np.float64) ** 2)) for k in kernels)
    assert len(model.losses) == 2
    assert float(sum(float(x) for x in model.losses)) == pytest.approx(expected, rel=1e-5)
    assert not _model(0.0).losses


def test_one_sgd_step_moves_the_dense_kernels_by_the_penalty_gradient_only():
    """w' = w - lr * (dL/dw + 2 * l2 * w) on the two dense kernels; every other variable as without decay."""
    import keras
    lr, l2 = 0.1, 0.01
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16, 16, 16, 2)).astype(np.float32)
    y = rng.uniform(-1, 1, (2, 4)).astype(np.float32)
    after = {}
    for decay in (0.0, l2):
        model = _model(decay)
        before = {v.path: v.numpy() for v in model.trainable_variables}
        step = make_train_step(model, keras.optimizers.SGD(learning_rate=lr), mse_loss, DistEnv())
        step(x, y)
        after[decay] = {v.path: v.numpy() for v in model.trainable_variables}
    for path, w in before.items():
        shift = after[l2][path] - after[0.0][path]
        if path.endswith(("dense1/kernel", "dense2/kernel")):
            np.testing.assert_allclose(shift, -lr * 2 * l2 * w, rtol=1e-3, atol=1e-7)
        else:
            np.testing.assert_allclose(shift, 0.0, atol=1e-7)
