"""CosmoFlow model: reference architecture, output shape and parameter counts from config sizes."""
import numpy as np
import pytest

from cosmoflow.model import build_model


def _conv(cin, cout, k=3):
    return cin * cout * k ** 3 + cout


def _expected_params(size, filters, dense, channels=4, targets=4):
    total, cin = 0, channels
    for f in filters:
        total, cin = total + _conv(cin, f), f
    flat = (size // 2 ** len(filters)) ** 3 * cin
    for units in dense:
        total, flat = total + flat * units + units, units
    return total + flat * targets + targets


def test_reference_parameter_count():
    model = build_model()
    assert model.count_params() == 8_907_556 == _expected_params(128, (32, 64, 128, 256, 512), (128, 64))
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds.count("Conv3D") == 5 and kinds.count("MaxPooling3D") == 5 and kinds.count("Dropout") == 2
    assert [layer.filters for layer in model.layers if type(layer).__name__ == "Conv3D"] == [32, 64, 128, 256, 512]


@pytest.mark.parametrize("size, filters, dense", [(16, (4, 8), (8,)), (32, (8, 16, 16), (16, 8)),
                                                  (32, (32, 64, 128, 256, 512), (128, 64))])
def test_sizes_from_config(size, filters, dense):
    model = build_model(input_shape=(size, size, size, 4), conv_filters=filters, dense_units=dense)
    assert model.count_params() == _expected_params(size, filters, dense)
    out = model(np.random.default_rng(0).random((3, size, size, size, 4), dtype=np.float32))
    assert tuple(out.shape) == (3, 4)


def test_output_is_the_tanh_scaled_by_output_scale():
    """Two models with the same weights and output_scale 1.2 and 0.3: outputs in the ratio 1.2 : 0.3, each
    inside its own bound (an ignored output_scale gives equal outputs, or ones above 0.3)."""
    x = 1e4 * np.ones((2, 16, 16, 16, 4), np.float32)
    models = {s: build_model(input_shape=(16, 16, 16, 4), conv_filters=(4, 4), dense_units=(8,), output_scale=s)
              for s in (1.2, 0.3)}
    models[0.3].set_weights(models[1.2].get_weights())
    out = {s: np.asarray(m(x)) for s, m in models.items()}
    assert np.abs(out[1.2]).max() > 1e-3  # not all zero: the ratio below says something
    np.testing.assert_allclose(out[0.3] / 0.3, out[1.2] / 1.2, rtol=1e-5, atol=1e-7)
    assert all(np.all(np.abs(o) <= s + 1e-6) for s, o in out.items())


def test_too_many_poolings_rejected():
    with pytest.raises(ValueError, match="at least 32"):
        build_model(input_shape=(16, 16, 16, 4))


def test_pooling_choice():
    kinds = {p: [type(layer).__name__ for layer in build_model(input_shape=(16, 16, 16, 4), conv_filters=(4, 4),
                                                               pooling=p).layers] for p in ("max", "avg")}
    assert kinds["max"].count("MaxPooling3D") == 2 and kinds["avg"].count("AveragePooling3D") == 2
    with pytest.raises(ValueError, match="pooling"):
        build_model(input_shape=(16, 16, 16, 4), conv_filters=(4, 4), pooling="min")


@pytest.fixture
def bfloat16_policy():
    import keras
    keras.config.set_dtype_policy("mixed_bfloat16")
    yield
    keras.config.set_dtype_policy("float32")


def _gradients(model, x, y):
    import tensorflow as tf
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def test_bfloat16_gradients_follow_float32_where_a_block_is_narrower_than_its_kernel(bfloat16_policy):
    """A block at 2^3 with a 3^3 kernel (the mini's fifth) trains in float32 under a bfloat16 policy: TensorFlow's
    oneDNN bfloat16 Conv3D weight gradient there is wrong, and the run diverged in its first epoch."""
    import keras
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 8, 8, 4)).astype(np.float32)
    y = rng.uniform(-1, 1, (4, 4)).astype(np.float32)
    mixed = build_model((8, 8, 8, 4), (16, 16, 32), dense_units=(8,), dropout=0.0)
    assert [layer.dtype_policy.name for layer in mixed.layers if layer.name.startswith("conv") and
            "act" not in layer.name] == ["mixed_bfloat16", "mixed_bfloat16", "float32"]  # 8^3, 4^3, 2^3
    keras.config.set_dtype_policy("float32")
    exact = build_model((8, 8, 8, 4), (16, 16, 32), dense_units=(8,), dropout=0.0)
    exact.set_weights(mixed.get_weights())
    for name, got, want in zip([v.path for v in mixed.trainable_variables], _gradients(mixed, x, y),
                               _gradients(exact, x, y)):
        # bfloat16's rounding through three blocks moves a gradient by up to ~15% of its largest value; the
        # broken kernel gave values of 1e36 or NaN
        assert np.isfinite(got).all() and np.abs(got - want).max() <= 0.3 * np.abs(want).max(), name


def test_the_reference_model_keeps_every_convolution_in_bfloat16(bfloat16_policy):
    model = build_model()  # 128^3: its fifth block sees 8^3
    assert {layer.dtype_policy.name for layer in model.layers if type(layer).__name__ == "Conv3D"} == {"mixed_bfloat16"}
