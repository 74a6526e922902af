"""The DeepCAM segmentation network of the MLPerf HPC reference, in pure Keras 3 (any backend).

DeepLabv3+ with an aligned-Xception encoder, layer for layer as the reference PyTorch model
(mlcommons/hpc deepcam/src/deepCam/architecture/deeplab_xception.py), channels-last:

  stem      conv 3x3 /2 -> BN -> ReLU -> conv 3x3 -> BN -> ReLU
  entry     3 Xception blocks (/2 each; the third is stride 1 at output stride 8); the first one's
            output after ReLU is the low-level feature map (B, H/4, W/4, 128)
  middle    `middle_blocks` residual blocks of 3 separable convs (identity skip)
  exit      1 block to 1024 channels, then 3 separable convs -> BN -> ReLU up to 2048 channels
  ASPP      1x1 branch, 3x3 branches dilated by `aspp_rates`, global-average-pool branch
            (conv 1x1 -> per-channel affine -> ReLU, tiled back), concat -> 1x1 -> BN -> ReLU
  decoder   transposed convs up to H/4, concat with 48 low-level channels, convs, transposed
            convs up to H: (B, H, W, num_classes) logits

Separable convs are depthwise 3x3 then pointwise 1x1, no bias, no BN between (as the reference).
Strided convs pad symmetrically like PyTorch (Keras "same" would shift the sampling grid by one
pixel), and transposed convs crop like PyTorch's padding=1, output_padding=1 (with model.deconv: phased the
decoder's 256-channel ones are computed as four stride-1 convolutions: PhasedConvTranspose).
Every size comes from the arguments, which are the config's `model:` section.

The loss (class-weighted cross-entropy) and the validation metric (IoU as the reference defines it)
are here too, with `keras.ops` only.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import keras
import numpy as np
from keras import layers

# Output stride -> (stride of the third entry block, dilation of the middle flow, dilations of the
# exit block and of the exit separable convs), as the reference's Xception(os=...).
OUTPUT_STRIDES = {16: (2, 1, (1, 2)), 8: (1, 2, (2, 4))}


def build_model(input_shape: Sequence[int] = (768, 1152, 16),
                num_classes: int = 3,
                width: float = 1.0,
                output_stride: int = 16,
                stem_channels: Sequence[int] = (32, 64),
                entry_channels: Sequence[int] = (128, 256, 728),
                middle_blocks: int = 16,
                exit_channels: Sequence[int] = (1024, 1536, 2048),
                aspp_rates: Sequence[int] = (6, 12, 18),
                aspp_channels: int = 256,
                low_level_channels: int = 48,
                decoder_channels: int = 256,
                batchnorm_momentum: float = 0.9,
                batchnorm_epsilon: float = 1e-5,
                deconv: str = "transposed",
                name: str = "deepcam") -> keras.Model:
    """Build the DeepCAM DeepLabv3+ network; the defaults are the reference's.

    Args:
        input_shape: (H, W, C) of one sample; H and W must be positive multiples of `output_stride`.
        width: multiplies every channel count except the inputs and the classes; each result is
            rounded to the nearest multiple of 8, at least 8.
        output_stride: 16 (the reference) or 8, the encoder's total downsampling. At 8 the
            decoder upsamples once, not twice, before joining the low-level features (the
            reference's decoder is written for 16 only).
        stem_channels, entry_channels, exit_channels: encoder widths at width 1; the middle flow
            keeps entry_channels[-1].
        aspp_rates: dilations of the 3x3 ASPP branches (a 1x1 and a pooling branch are added).
        batchnorm_momentum: Keras convention (moving = momentum * moving + (1 - momentum) * batch);
            0.9 is PyTorch's default momentum 0.1. The epsilon default is PyTorch's too.
        deconv: "transposed" computes the decoder's upsampling transposed convolutions as Keras'
            Conv2DTranspose, "phased" (not the logits') as PhasedConvTranspose: the same layer either way.
    Returns:
        A `keras.Model` mapping (B, H, W, C) to (B, H, W, num_classes) logits.
    """
    _check_arguments(input_shape, output_stride, width, len(stem_channels), len(entry_channels),
                     len(exit_channels))
    if deconv not in ("phased", "transposed"):
        raise ValueError(f"deconv {deconv!r}: expected 'phased' or 'transposed'")
    ch = functools.partial(scaled_channels, width=width)
    bn = functools.partial(layers.BatchNormalization, momentum=batchnorm_momentum, epsilon=batchnorm_epsilon)
    inputs = keras.Input(shape=tuple(input_shape), name="climate")
    x, low_level = _encoder(inputs, [ch(c) for c in stem_channels], [ch(c) for c in entry_channels],
                            middle_blocks, [ch(c) for c in exit_channels], output_stride, bn)
    x = _aspp(x, ch(aspp_channels), aspp_rates, bn)                       # (B, H/os, W/os, 256)
    low_level = _conv_bn_relu(low_level, ch(low_level_channels), 1, bn, "low_level")  # (B, H/4, W/4, 48)
    outputs = _decoder(x, low_level, ch(decoder_channels), num_classes, output_stride, bn, deconv == "phased")
    # float32 logits under a mixed-precision policy, so that the loss and the metric are float32
    outputs = layers.Activation("linear", dtype="float32", name="logits_float32")(outputs)
    return keras.Model(inputs, outputs, name=name)


def scaled_channels(channels: int, width: float) -> int:
    """`channels * width` rounded to the nearest multiple of 8 (halves up), at least 8."""
    return max(8, 8 * math.floor(channels * width / 8 + 0.5))


def count_parameters(model: keras.Model) -> int:
    """Number of trainable scalars (BatchNorm moving statistics excluded)."""
    return sum(math.prod(v.shape) for v in model.trainable_weights)


# ----------------------------------------------------------------------------- encoder

def _encoder(x, stem: Sequence[int], entry: Sequence[int], middle_blocks: int, exit_: Sequence[int],
             output_stride: int, bn: Callable):
    """Aligned Xception; returns (features (B, H/os, W/os, exit_[-1]), low level (B, H/4, W/4, entry[0]))."""
    entry3_stride, middle_rate, (exit_rate, exit_conv_rate) = OUTPUT_STRIDES[output_stride]
    init = _kaiming_normal()
    x = _conv_bn_relu(x, stem[0], 3, bn, "stem1", strides=2, kernel_initializer=init)  # (B, H/2, W/2, 32)
    x = _conv_bn_relu(x, stem[1], 3, bn, "stem2", kernel_initializer=init)             # (B, H/2, W/2, 64)
    # The reference's ReLU after entry block 1 is in place, so its low-level features are rectified.
    x = _xception_block(x, entry[0], 2, bn, "entry1", strides=2, end_with_relu=True)
    low_level = x                                                        # (B, H/4, W/4, 128)
    x = _xception_block(x, entry[1], 2, bn, "entry2", strides=2)         # (B, H/8, W/8, 256)
    x = _xception_block(x, entry[2], 2, bn, "entry3", strides=entry3_stride, is_last=True)
    for i in range(middle_blocks):                                       # (B, H/16, W/16, 728)
        x = _xception_block(x, entry[2], 3, bn, f"middle{i + 1}", dilation=middle_rate)
    x = _xception_block(x, exit_[0], 2, bn, "exit_block", dilation=exit_rate, end_with_relu=False,
                        grow_first=False, is_last=True)                  # (B, H/16, W/16, 1024)
    for i, filters in enumerate((exit_[1], exit_[1], exit_[2])):         # 1536, 1536, 2048
        x = _separable_conv(x, filters, f"exit_sep{i + 1}", dilation=exit_conv_rate)
        x = layers.ReLU(name=f"exit_sep{i + 1}_relu")(bn(name=f"exit_sep{i + 1}_bn")(x))
    return x, low_level


def _xception_block(inputs, filters: int, reps: int, bn: Callable, name: str, strides: int = 1,
                    dilation: int = 1, end_with_relu: bool = True, grow_first: bool = True,
                    is_last: bool = False):
    """The reference's `Block`: `reps` separable convs with BN (ReLU between, not after the last),
    an extra undilated separable conv (strided, or when `is_last`), plus a skip, then ReLU."""
    in_filters = inputs.shape[-1]
    widths = [filters] * reps if grow_first else [in_filters] * (reps - 1) + [filters]
    x = inputs
    for i, out in enumerate(widths):
        if i:
            x = layers.ReLU(name=f"{name}_sep{i}_relu")(x)
        x = _separable_conv(x, out, f"{name}_sep{i + 1}", dilation=dilation)
        x = bn(name=f"{name}_sep{i + 1}_bn")(x)
    if strides != 1 or is_last:                                          # no BN after this one
        x = _separable_conv(x, filters, f"{name}_sep{reps + 1}", strides=strides)
    skip = inputs
    if filters != in_filters or strides != 1:
        skip = _strided_pointwise_conv(inputs, filters, strides, f"{name}_skip")
        skip = bn(name=f"{name}_skip_bn")(skip)
    x = layers.Add(name=f"{name}_add")([x, skip])
    return layers.ReLU(name=f"{name}_relu")(x) if end_with_relu else x


def _strided_pointwise_conv(x, filters: int, strides: int, name: str):
    """A bias-free 1x1 conv with stride, written as subsampling then a stride-1 1x1 conv (the same sum).

    oneDNN's weight gradient of a strided 1x1 conv on channels-last input with fewer input channels
    than its SIMD block (16 floats on AVX-512) writes out of bounds and crashes the process
    (TensorFlow 2.18.1 here; oneDNN issue 6035). Width 0.125 gives such a skip conv (8 channels in).
    """
    if strides != 1:
        x = layers.AveragePooling2D(pool_size=1, strides=strides, name=f"{name}_subsample")(x)
    return layers.Conv2D(filters, 1, use_bias=False, kernel_initializer=_kaiming_normal(), name=name)(x)


def _separable_conv(x, filters: int, name: str, strides: int = 1, dilation: int = 1):
    """Depthwise 3x3 then pointwise 1x1, no bias: the reference's `SeparableConv2d_same`."""
    return _padded_conv(x, layers.SeparableConv2D, filters, 3, name, strides=strides, dilation=dilation,
                        depthwise_initializer=_kaiming_normal(depthwise=True),
                        pointwise_initializer=_kaiming_normal())


# ----------------------------------------------------------------------------- ASPP and decoder

def _aspp(x, filters: int, rates: Sequence[int], bn: Callable):
    """Atrous spatial pyramid pooling (the reference's `Bottleneck`), (B, h, w, C) -> (B, h, w, filters)."""
    branches = [_conv_bn_relu(x, filters, 1, bn, "aspp1", kernel_initializer=_kaiming_normal())]
    for i, rate in enumerate(rates):
        branches.append(_conv_bn_relu(x, filters, 3, bn, f"aspp{i + 2}", dilation=rate,
                                      kernel_initializer=_kaiming_normal()))
    pooled = layers.GlobalAveragePooling2D(keepdims=True, name="aspp_pool")(x)      # (B, 1, 1, C)
    pooled = layers.Conv2D(filters, 1, use_bias=False, kernel_initializer=_torch_default(),
                           name="aspp_pool_conv")(pooled)
    # The reference's TrainableAffine (scale and shift per channel, no statistics): a 1x1 depthwise
    # conv with bias is exactly that.
    pooled = layers.DepthwiseConv2D(1, depthwise_initializer="ones", name="aspp_pool_affine")(pooled)
    pooled = layers.ReLU(name="aspp_pool_relu")(pooled)
    # Tiled to the feature map size (the reference tiles to its fixed 48 x 72).
    branches.append(layers.UpSampling2D(size=tuple(x.shape[1:3]), name="aspp_pool_tile")(pooled))
    x = layers.Concatenate(name="aspp_concat")(branches)                            # (B, h, w, 5 * filters)
    return _conv_bn_relu(x, filters, 1, bn, "aspp_project")


def _decoder(x, low_level, filters: int, num_classes: int, output_stride: int, bn: Callable, phased: bool):
    """The reference's `DeconvUpsampler`: (B, H/os, W/os, F) and (B, H/4, W/4, L) -> (B, H, W, classes)."""
    for i in range(int(math.log2(output_stride // 4))):                 # up to (B, H/4, W/4, 256)
        x = _deconv_bn_relu(x, filters, bn, f"decoder_up{i + 1}", phased)
    x = layers.Concatenate(name="decoder_concat")([x, low_level])       # (B, H/4, W/4, 304)
    x = _conv_bn_relu(x, filters, 3, bn, "decoder_conv1")
    x = _conv_bn_relu(x, filters, 3, bn, "decoder_conv2")
    bound = 1.0 / math.sqrt(filters)                                     # PyTorch's default bias init
    x = layers.Conv2D(filters, 1, kernel_initializer=_torch_default(), name="decoder_conv3",
                      bias_initializer=keras.initializers.RandomUniform(-bound, bound))(x)
    x = _deconv_bn_relu(x, filters, bn, "decoder_up_final", phased)     # (B, H/2, W/2, 256)
    return _deconv(x, num_classes, "logits")                             # no BN, no bias: logits


# ----------------------------------------------------------------------------- conv helpers

def _conv_bn_relu(x, filters: int, kernel_size: int, bn: Callable, name: str, strides: int = 1,
                  dilation: int = 1, kernel_initializer=None):
    x = _padded_conv(x, layers.Conv2D, filters, kernel_size, name, strides=strides, dilation=dilation,
                     kernel_initializer=kernel_initializer or _torch_default())
    return layers.ReLU(name=f"{name}_relu")(bn(name=f"{name}_bn")(x))


def _padded_conv(x, conv, filters: int, kernel_size: int, name: str, strides: int = 1, dilation: int = 1,
                 **kwargs):
    """A bias-free conv padded as PyTorch's padding=(k_eff - 1) // 2 on every side.

    At stride 1 that is Keras "same". At stride 2 "same" pads only after (sampling pixels 1, 3, ...
    at the centres); PyTorch pads before too (centres 0, 2, ...), so the padding is explicit there.
    """
    pad = (kernel_size - 1) * dilation // 2
    if strides != 1 and pad:
        x = layers.ZeroPadding2D(pad, name=f"{name}_pad")(x)
    padding = "same" if strides == 1 else "valid"
    return conv(filters, kernel_size, strides=strides, dilation_rate=dilation, padding=padding,
                use_bias=False, name=name, **kwargs)(x)


def _deconv(x, filters: int, name: str, phased: bool = False):
    """PyTorch's ConvTranspose2d(k=3, stride=2, padding=1, output_padding=1, bias=False): (h, w) -> (2h, 2w).

    The full transposed output has 2h + 1 rows; PyTorch drops the first one, Keras "same" the last. `phased`:
    the same layer and kernel computed as PhasedConvTranspose does.
    """
    if phased:
        return PhasedConvTranspose(filters, kernel_initializer=_torch_default(), name=name)(x)
    x = layers.Conv2DTranspose(filters, 3, strides=2, padding="valid", use_bias=False,
                               kernel_initializer=_torch_default(), name=name)(x)
    return layers.Cropping2D(((1, 0), (1, 0)), name=f"{name}_crop")(x)


@keras.saving.register_keras_serializable(package="deepcam")
class PhasedConvTranspose(layers.Conv2DTranspose):
    """`_deconv`'s transposed convolution (3x3, stride 2, cropped as PyTorch's), its kernel and output the same,
    computed as four stride-1 convolutions of the input, one per parity of the output's row and column, then
    interleaved: output pixel (2i + a, 2j + b) sums x[i + di, j + dj] * kernel[1 + a - 2 di, 1 + b - 2 dj] over
    the taps in range, so parity 0 takes tap 1 at offset 0 and parity 1 taps 2 at 0 and 0 at +1. The decoder's
    256-channel layers may use it: TensorFlow 2.18.1's weight gradient of the strided transposed convolution took
    4.3x its forward on an AMD EPYC (AVX-512), the four convolutions' a quarter of it
    (benchmarks/conv_grads.py, docs/deepcam_step.md). `model.deconv: phased` chooses it."""

    TAPS = {0: (1,), 1: (2, 0)}  # kernel taps of each output parity, at input offsets 0 and +1

    def __init__(self, filters: int, **kwargs):
        for fixed in ("kernel_size", "strides", "padding", "use_bias"):
            kwargs.pop(fixed, None)  # from get_config: always this layer's
        super().__init__(filters, 3, strides=2, padding="valid", use_bias=False, **kwargs)

    def call(self, inputs):
        kernel = keras.ops.transpose(self.kernel, (0, 1, 3, 2))  # (3, 3, in, out): a convolution's
        h, w = inputs.shape[1], inputs.shape[2]
        padded = keras.ops.pad(inputs, ((0, 0), (0, 1), (0, 1), (0, 0)))
        rows = []
        for a in (0, 1):
            phases = []
            for b in (0, 1):
                taps = keras.ops.stack([keras.ops.stack([kernel[ky, kx] for kx in self.TAPS[b]])
                                        for ky in self.TAPS[a]])
                window = padded[:, :h + len(self.TAPS[a]) - 1, :w + len(self.TAPS[b]) - 1, :]
                phases.append(keras.ops.conv(window, taps, strides=1, padding="valid"))
            rows.append(keras.ops.reshape(keras.ops.stack(phases, axis=3), (-1, h, 2 * w, self.filters)))
        return keras.ops.reshape(keras.ops.stack(rows, axis=2), (-1, 2 * h, 2 * w, self.filters))

    def compute_output_shape(self, input_shape):
        n, h, w, _ = input_shape
        return n, None if h is None else 2 * h, None if w is None else 2 * w, self.filters


def _deconv_bn_relu(x, filters: int, bn: Callable, name: str, phased: bool = False):
    x = _deconv(x, filters, name, phased)
    return layers.ReLU(name=f"{name}_relu")(bn(name=f"{name}_bn")(x))


# The reference initialises the encoder's and ASPP's convs with kaiming_normal_ (untruncated,
# std sqrt(2 / fan_in)) and leaves the rest at PyTorch's default (uniform, bound 1 / sqrt(fan_in)).
# PyTorch's fan_in of a depthwise kernel is k * k; Keras computes k * k * C for a (k, k, C, 1)
# kernel, whose fan_out is k * k. For transposed convs both libraries compute k * k * out_channels.

def _kaiming_normal(depthwise: bool = False):
    return keras.initializers.VarianceScaling(2.0, "fan_out" if depthwise else "fan_in", "untruncated_normal")


def _torch_default():
    return keras.initializers.VarianceScaling(1.0 / 3.0, "fan_in", "uniform")


def _check_arguments(input_shape: Sequence[int], output_stride: int, width: float, stem: int, entry: int,
                     exit_: int) -> None:
    if output_stride not in OUTPUT_STRIDES:
        raise ValueError(f"output_stride {output_stride}: expected one of {sorted(OUTPUT_STRIDES)}")
    if len(input_shape) != 3 or any(s <= 0 for s in input_shape[2:]):
        raise ValueError(f"input_shape {list(input_shape)}: expected (H, W, C)")
    if any(s <= 0 or s % output_stride for s in input_shape[:2]):
        raise ValueError(f"input_shape {list(input_shape)}: height and width must be positive multiples "
                         f"of the output stride {output_stride}")
    if width <= 0:
        raise ValueError(f"width {width}: expected a positive multiplier")
    if (stem, entry, exit_) != (2, 3, 3):
        raise ValueError(f"stem_channels, entry_channels, exit_channels have {stem}, {entry}, {exit_} "
                         f"entries: expected 2, 3, 3")


# ---------------------------------------------------------------------------- loss and metric
# DeepCAM's loss (class-weighted cross-entropy) and validation metric (IoU as the reference defines it).
#
# Both are written with `keras.ops` only. Labels are integer maps (B, H, W) with 0 background,
# 1 tropical cyclone, 2 atmospheric river; predictions are logits (B, H, W, classes).


CLASSES = ("background", "cyclone", "river")
# Pixel frequencies of the classes in the real DeepCAM training set, as the reference uses them.
REFERENCE_FREQUENCIES = (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)
WEIGHT_POWER = -0.125


def class_weights(frequencies=REFERENCE_FREQUENCIES, power: float = WEIGHT_POWER) -> tuple[float, ...]:
    """Cross-entropy class weights frequency**power (rarer classes weigh more)."""
    if any(f <= 0 for f in frequencies):
        raise ValueError(f"class frequencies {list(frequencies)}: expected all > 0")
    return tuple(float(f) ** power for f in frequencies)


class WeightedCrossEntropy:
    """Per-pixel cross-entropy times the weight of the pixel's true class, averaged over all pixels.

    This is the reference's `CrossEntropyLoss(weight, reduction='none')` followed by a plain mean
    (not a weight-normalised mean).
    """

    def __init__(self, weights):
        self.weights = tuple(float(w) for w in weights)

    def __call__(self, y_true, logits):
        labels = keras.ops.cast(y_true, "int32")  # (B, H, W)
        log_probs = keras.ops.log_softmax(logits, axis=-1)  # (B, H, W, C)
        one_hot = keras.ops.one_hot(labels, len(self.weights), dtype=log_probs.dtype)
        weights = keras.ops.convert_to_tensor(self.weights, dtype=log_probs.dtype)
        per_pixel = -keras.ops.sum(one_hot * log_probs * weights, axis=-1)  # (B, H, W)
        return keras.ops.mean(per_pixel)


def per_sample_iou(y_true, logits, num_classes: int):
    """(B, C) IoU of each class in each sample; a class absent from both prediction and label counts as 1."""
    pred = keras.ops.argmax(logits, axis=-1)
    labels = keras.ops.cast(y_true, pred.dtype)
    pred_1h = keras.ops.one_hot(keras.ops.reshape(pred, (keras.ops.shape(pred)[0], -1)), num_classes)
    true_1h = keras.ops.one_hot(keras.ops.reshape(labels, (keras.ops.shape(labels)[0], -1)), num_classes)
    tp = keras.ops.sum(pred_1h * true_1h, axis=1)  # (B, C)
    union = keras.ops.sum(keras.ops.maximum(pred_1h, true_1h), axis=1)  # tp + fp + fn
    return keras.ops.where(union > 0, tp / keras.ops.maximum(union, 1.0), keras.ops.ones_like(tp))


class MeanIoU:
    """The reference's score: per sample, the mean over classes of tp / (tp + fp + fn), averaged
    over samples. Sums are [samples, sum of per-sample IoU, sum of each class's IoU ...], so
    they add across batches and ranks."""

    name = "iou"
    mlperf_key = "eval_accuracy"
    higher_is_better = True

    def __init__(self, num_classes: int = len(CLASSES)):
        self.num_classes = num_classes

    def batch_sums(self, y_true, logits):
        iou = per_sample_iou(y_true, logits, self.num_classes)  # (B, C)
        count = keras.ops.cast(keras.ops.shape(iou)[0], "float32")
        per_class = keras.ops.cast(keras.ops.sum(iou, axis=0), "float32")
        total = keras.ops.sum(per_class) / self.num_classes
        return keras.ops.concatenate([keras.ops.reshape(count, (1,)), keras.ops.reshape(total, (1,)), per_class])

    def result(self, sums) -> float:
        sums = np.asarray(sums, dtype=np.float64)
        return float(sums[1] / sums[0])

    def details(self, sums) -> dict:
        """IoU of each class (absent-from-both counted as 1, as in the total)."""
        sums = np.asarray(sums, dtype=np.float64)
        names = CLASSES if len(sums) - 2 == len(CLASSES) else range(len(sums) - 2)
        return {f"iou_{n}": float(v / sums[0]) for n, v in zip(names, sums[2:])}
