"""DeepCAM model: reference parameter count, output shapes, widths, size checks, PyTorch alignment, gradients."""
import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from deepcam import model as deepcam_model
from deepcam.model import build_model, count_parameters, scaled_channels

# Trainable parameters of the reference DeepLabv3_plus(n_input=16, n_classes=3, os=16), counted from its
# layer list in mlcommons/hpc deepcam/src/deepCam/architecture/deeplab_xception.py. Every Conv2d there has
# bias=False except the 1x1 at the end of DeconvUpsampler.conv1 (PyTorch's default bias=True); every
# BatchNorm2d has 2 per channel (weight, bias); SeparableConv2d_same is a 3x3 depthwise conv (groups=in)
# plus a 1x1 pointwise conv, no bias: 9 * in + in * out.
#   stem      conv 16->32 3x3 + BN32, conv 32->64 3x3 + BN64                              =     23,232
#   block1    sep 64->128 + BN, sep 128->128 + BN, sep 128->128 /2, skip 1x1 64->128 + BN =     52,800
#   block2    same pattern 128->256                                                      =    203,904
#   block3    same pattern 256->728 (the /2 sep conv; is_last adds nothing at stride 2)   =  1,452,480
#   block4-19 each 3 x (sep 728->728 + BN728), identity skip: 1,613,976 each, x 16        = 25,823,616
#   block20   sep 728->728 + BN, sep 728->1024 + BN, sep 1024->1024 (is_last),
#             skip 1x1 728->1024 + BN                                                     =  3,097,376
#   conv3-5   sep 1024->1536 + BN, sep 1536->1536 + BN, sep 1536->2048 + BN               =  7,124,992
#   ASPP      1x1 2048->256 + BN, 3 x (3x3 2048->256 + BN)                                = 14,682,112
#   pooling   1x1 2048->256 + TrainableAffine (256 weights, 256 biases)                   =    524,800
#   project   1x1 1280->256 + BN                                                          =    328,192
#   low level 1x1 128->48 + BN48                                                          =      6,240
#   decoder   2 x (deconv 3x3 256->256 + BN), 3x3 304->256 + BN, 3x3 256->256 + BN,
#             1x1 256->256 with bias, deconv 256->256 + BN, deconv 256->3                 =  3,134,976
#   total                                                                                  = 56,454,720
REFERENCE_TRAINABLE_PARAMETERS = 56_454_720


def _reference_count(inputs=16, classes=3):
    """The same sum as the table above, term by term from the reference's layer list."""
    def sep(i, o):
        return 9 * i + i * o

    def conv(i, o, k):
        return i * o * k * k

    def bn(c):
        return 2 * c

    def entry_block(i, o):
        return sep(i, o) + bn(o) + sep(o, o) + bn(o) + sep(o, o) + conv(i, o, 1) + bn(o)

    stem = conv(inputs, 32, 3) + bn(32) + conv(32, 64, 3) + bn(64)
    entry = entry_block(64, 128) + entry_block(128, 256) + entry_block(256, 728)
    middle = 16 * 3 * (sep(728, 728) + bn(728))
    exit_ = (sep(728, 728) + bn(728) + sep(728, 1024) + bn(1024) + sep(1024, 1024) + conv(728, 1024, 1)
             + bn(1024) + sep(1024, 1536) + bn(1536) + sep(1536, 1536) + bn(1536) + sep(1536, 2048) + bn(2048))
    aspp = conv(2048, 256, 1) + bn(256) + 3 * (conv(2048, 256, 3) + bn(256))
    pool = conv(2048, 256, 1) + 2 * 256
    project = conv(5 * 256, 256, 1) + bn(256)
    low_level = conv(128, 48, 1) + bn(48)
    decoder = (2 * (conv(256, 256, 3) + bn(256)) + conv(304, 256, 3) + bn(256) + conv(256, 256, 3) + bn(256)
               + conv(256, 256, 1) + 256 + conv(256, 256, 3) + bn(256) + conv(256, classes, 3))
    return stem + entry + middle + exit_ + aspp + pool + project + low_level + decoder


def _kinds(model):
    return [type(layer).__name__ for layer in model.layers]


def test_reference_parameter_count_at_full_size():
    model = build_model()  # 768 x 1152 x 16, width 1: built, never run
    assert count_parameters(model) == REFERENCE_TRAINABLE_PARAMETERS == _reference_count()
    assert model.output_shape == (None, 768, 1152, 3)
    kinds = _kinds(model)
    # 3 per entry block, 3 per middle block, 3 in the exit block, 3 after it.
    assert kinds.count("SeparableConv2D") == 9 + 16 * 3 + 3 + 3
    assert kinds.count("Conv2DTranspose") == 4
    phased = build_model(deconv="phased")
    assert count_parameters(phased) == REFERENCE_TRAINABLE_PARAMETERS
    assert _kinds(phased).count("PhasedConvTranspose") == 3 and _kinds(phased).count("Conv2DTranspose") == 1
    assert [layer.dilation_rate for layer in model.layers if layer.name in ("aspp2", "aspp3", "aspp4")] == [
        (6, 6), (12, 12), (18, 18)]
    assert model.get_layer("decoder_concat").output.shape[-1] == 256 + 48


def test_parameter_count_does_not_depend_on_input_size():
    assert count_parameters(build_model((32, 48, 16))) == REFERENCE_TRAINABLE_PARAMETERS


@pytest.mark.parametrize("size", [(32, 48), (64, 96), (96, 144)])
def test_output_shape(size):
    model = build_model((*size, 16), width=0.125)
    out = model(np.random.default_rng(0).standard_normal((2, *size, 16), dtype=np.float32))
    assert tuple(out.shape) == (2, *size, 3)


def test_output_shape_quarter_width_and_output_stride_8():
    x = np.random.default_rng(1).standard_normal((1, 64, 96, 16), dtype=np.float32)
    assert tuple(build_model((64, 96, 16), width=0.25)(x).shape) == (1, 64, 96, 3)
    model = build_model((64, 96, 16), width=0.125, output_stride=8, aspp_rates=(12, 24, 36), num_classes=5)
    assert tuple(model(x).shape) == (1, 64, 96, 5)


def test_smaller_width_shrinks_parameters():
    counts = [count_parameters(build_model((96, 144, 16), width=w)) for w in (1.0, 0.5, 0.25, 0.125)]
    assert counts[0] == REFERENCE_TRAINABLE_PARAMETERS
    assert counts == sorted(counts, reverse=True) and len(set(counts)) == 4


def test_scaled_channels():
    assert [scaled_channels(c, 1.0) for c in (32, 48, 728, 2048)] == [32, 48, 728, 2048]
    assert [scaled_channels(c, 0.125) for c in (16, 32, 48, 728, 2048)] == [8, 8, 8, 88, 256]
    assert scaled_channels(728, 0.25) == 184 and scaled_channels(100, 1.0) == 104


@pytest.mark.parametrize("shape", [(100, 144, 16), (96, 140, 16), (8, 48, 16), (0, 48, 16)])
def test_invalid_sizes_rejected(shape):
    with pytest.raises(ValueError, match=re.escape(f"input_shape {list(shape)}") + ".*multiples of the output "
                                         "stride 16"):
        build_model(shape, width=0.125)


@pytest.mark.parametrize("kwargs, message", [({"input_shape": (32, 48)}, "expected \\(H, W, C\\)"),
                                             ({"output_stride": 32}, "output_stride 32"),
                                             ({"width": 0.0}, "width 0.0")])
def test_invalid_arguments_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_model(**{"input_shape": (32, 48, 16), **kwargs})


def test_model_file_is_framework_pure():
    source = Path(deepcam_model.__file__).read_text()
    assert not re.search(r"^\s*(import|from)\s+tensorflow", source, re.MULTILINE)
    assert not re.search(r"\btf\.", source)
    assert not re.search(r"^\s*(import|from)\s+(horovod|logging)", source, re.MULTILINE)


def test_forward_backward_gives_finite_gradients():
    # 96 x 144, batch 4, width 0.125: a strided 1x1 skip conv with 8 input channels crashed oneDNN here.
    model = build_model((96, 144, 16), width=0.125)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 96, 144, 16), dtype=np.float32)
    labels = rng.integers(0, 3, (4, 96, 144))
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
    grads = tape.gradient(loss, model.trainable_variables)
    assert np.isfinite(float(loss))
    for var, grad in zip(model.trainable_variables, grads):
        assert grad is not None, var.path
        grad = np.asarray(grad)
        assert np.all(np.isfinite(grad)), var.path
        assert np.any(grad != 0), var.path


# PyTorch's conventions, written out in numpy, against the helpers that mirror them.

def _torch_conv2d(x, w, stride, pad):
    """x (H, W, Cin), w (k, k, Cin, Cout): PyTorch Conv2d(padding=pad, stride=stride), channels-last."""
    k = w.shape[0]
    xp = np.pad(x, ((pad, pad), (pad, pad), (0, 0)))
    rows, cols = (xp.shape[0] - k) // stride + 1, (xp.shape[1] - k) // stride + 1
    out = np.zeros((rows, cols, w.shape[3]))
    for i in range(rows):
        for j in range(cols):
            out[i, j] = np.einsum("abc,abcd->d", xp[stride * i:stride * i + k, stride * j:stride * j + k], w)
    return out


def _torch_conv_transpose2d(x, w, stride=2, pad=1, output_pad=1):
    """x (H, W, Cin), w (k, k, Cout, Cin): PyTorch ConvTranspose2d, channels-last."""
    k, (h, wd) = w.shape[0], x.shape[:2]
    full = np.zeros(((h - 1) * stride + k, (wd - 1) * stride + k, w.shape[2]))
    for i in range(h):
        for j in range(wd):
            full[stride * i:stride * i + k, stride * j:stride * j + k] += np.einsum("c,abdc->abd", x[i, j], w)
    rows, cols = (h - 1) * stride - 2 * pad + k + output_pad, (wd - 1) * stride - 2 * pad + k + output_pad
    return full[pad:pad + rows, pad:pad + cols]


def _apply(build, x):
    inputs = keras.Input(x.shape)
    model = keras.Model(inputs, build(inputs))
    return model, np.asarray(model(x[None]))[0]


def test_strided_conv_pads_like_pytorch():
    x = np.random.default_rng(3).standard_normal((8, 12, 3)).astype(np.float32)
    model, out = _apply(lambda t: deepcam_model._padded_conv(t, keras.layers.Conv2D, 4, 3, "c", strides=2), x)
    expected = _torch_conv2d(x, np.asarray(model.get_layer("c").kernel), stride=2, pad=1)
    assert out.shape == (4, 6, 4)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_strided_skip_conv_equals_pytorch_1x1_stride_2():
    x = np.random.default_rng(5).standard_normal((8, 12, 8)).astype(np.float32)
    model, out = _apply(lambda t: deepcam_model._strided_pointwise_conv(t, 16, 2, "k"), x)
    expected = _torch_conv2d(x, np.asarray(model.get_layer("k").kernel), stride=2, pad=0)
    assert out.shape == (4, 6, 16)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_transposed_conv_crops_like_pytorch():
    x = np.random.default_rng(4).standard_normal((3, 5, 4)).astype(np.float32)
    model, out = _apply(lambda t: deepcam_model._deconv(t, 2, "d"), x)
    expected = _torch_conv_transpose2d(x, np.asarray(model.get_layer("d").kernel))
    assert out.shape == (6, 10, 2)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_the_phased_transposed_conv_is_the_same_layer_in_outputs_gradients_and_config():
    x = np.random.default_rng(5).standard_normal((2, 6, 5, 7)).astype(np.float32)
    inputs = keras.Input((6, 5, 7))
    plain = keras.Model(inputs, deepcam_model._deconv(inputs, 4, "d"))
    phased = keras.Model(inputs, deepcam_model._deconv(inputs, 4, "d", phased=True))
    layer = phased.get_layer("d")
    assert layer.kernel.shape == plain.get_layer("d").kernel.shape == (3, 3, 4, 7)
    layer.kernel.assign(plain.get_layer("d").kernel)
    g = tf.constant(np.random.default_rng(6).standard_normal((2, 12, 10, 4)).astype(np.float32))
    grads = []
    for model in (plain, phased):
        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            loss = tf.reduce_sum(model(xt) * g)
        grads.append(tape.gradient(loss, [xt, model.trainable_variables[0]]))
    np.testing.assert_allclose(phased(x), plain(x), rtol=1e-5, atol=1e-5)
    for ours, theirs in zip(*grads):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    again = deepcam_model.PhasedConvTranspose.from_config(layer.get_config())
    assert again.filters == 4 and again.strides == (2, 2) and again.kernel_size == (3, 3) and not again.use_bias
    with pytest.raises(ValueError, match="deconv 'fast': expected 'phased' or 'transposed'"):
        build_model((32, 32, 4), width=0.125, middle_blocks=1, deconv="fast")
