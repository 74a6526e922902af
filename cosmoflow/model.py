"""The CosmoFlow 3D CNN of the MLPerf HPC reference, in pure Keras 3 (any backend).

Five blocks of [Conv3D k 'same' -> LeakyReLU -> MaxPool3D 2], then Flatten, two [Dense (L2 on the kernel) ->
LeakyReLU -> Dropout] layers and a Dense output with tanh scaled by 1.2 (targets live in [-1, 1]). Every size comes
from the arguments, which are the config's `model:` section. Channels-last: inputs are (B, D, H, W, C).

The loss (`mse_loss`) and the validation metric (`MeanAbsoluteError`) are here too.
"""
from __future__ import annotations

from typing import Sequence

import keras
import numpy as np
from keras import layers

POOLING = {"max": layers.MaxPooling3D, "avg": layers.AveragePooling3D}


def build_model(input_shape: Sequence[int] = (128, 128, 128, 4),
                conv_filters: Sequence[int] = (32, 64, 128, 256, 512),
                kernel_size: int = 3,
                pool_size: int = 2,
                pooling: str = "max",
                leaky_slope: float = 0.3,
                dense_units: Sequence[int] = (128, 64),
                dropout: float = 0.5,
                target_size: int = 4,
                output_scale: float = 1.2,
                l2: float = 0.0,
                name: str = "cosmoflow") -> keras.Model:
    """Build the CosmoFlow regression network.

    Args:
        input_shape: (D, H, W, C) of one sample; each spatial size must stay >= 1 after
            len(conv_filters) poolings.
        conv_filters: filters of each conv block (the reference: 32, 64, 128, 256, 512).
        pooling: "max" (the reference's MaxPool3D) or "avg" (AveragePooling3D, which the
            reference code also offers as its pooling type).
        l2: the reference's weight decay: an L2 penalty `l2 * sum(w ** 2)` on the kernels of the hidden
            dense layers (a regularization loss of the model, in `model.losses`); 0 adds none.
    Returns:
        An unbuilt-weights `keras.Model` mapping (B, D, H, W, C) to (B, target_size).
    """
    _check_pooling(input_shape, len(conv_filters), pool_size)
    if pooling not in POOLING:
        raise ValueError(f"pooling {pooling!r}: expected one of {sorted(POOLING)}")
    inputs = keras.Input(shape=tuple(input_shape), name="universe")
    x = inputs
    for i, filters in enumerate(conv_filters):
        sizes = [n // pool_size ** i for n in input_shape[:3]]
        x = layers.Conv3D(filters, kernel_size, padding="same", name=f"conv{i + 1}",
                          dtype=_conv_dtype(sizes, kernel_size))(x)
        x = layers.LeakyReLU(negative_slope=leaky_slope, name=f"conv{i + 1}_act")(x)
        x = POOLING[pooling](pool_size, name=f"pool{i + 1}")(x)
    x = layers.Flatten(name="flatten")(x)  # (B, D/32 * H/32 * W/32 * 512) for the reference
    penalty = keras.regularizers.L2(l2) if l2 else None
    for i, units in enumerate(dense_units):
        x = layers.Dense(units, kernel_regularizer=penalty, name=f"dense{i + 1}")(x)
        x = layers.LeakyReLU(negative_slope=leaky_slope, name=f"dense{i + 1}_act")(x)
        x = layers.Dropout(dropout, name=f"dropout{i + 1}")(x)
    x = layers.Dense(target_size, activation="tanh", name="output")(x)
    # float32 outputs under a mixed-precision policy, so that the loss and the metric are float32
    outputs = layers.Rescaling(output_scale, name="output_scale", dtype="float32")(x)
    return keras.Model(inputs, outputs, name=name)


def _conv_dtype(sizes: Sequence[int], kernel_size: int) -> str | None:
    """"float32" for a convolution whose input is, in some spatial dimension, wider than 1 but narrower than its
    kernel, under a bfloat16 policy; else None (the global policy). TensorFlow 2.18.1's oneDNN Conv3D weight gradient
    in bfloat16 is wrong there (values up to 1e36 at 2^3 x 128 with a 3^3 kernel: the CosmoFlow mini's fifth block;
    docs/stack.md, "bfloat16"), and such a block costs little in float32. The reference's 128^3 model has none."""
    small = any(1 < n < kernel_size for n in sizes)
    return "float32" if small and keras.config.dtype_policy().compute_dtype == "bfloat16" else None


def _check_pooling(input_shape: Sequence[int], blocks: int, pool_size: int) -> None:
    if len(input_shape) != 4:
        raise ValueError(f"input_shape {list(input_shape)}: expected (D, H, W, C)")
    smallest = pool_size ** blocks
    if any(s < smallest for s in input_shape[:3]):
        raise ValueError(f"input_shape {list(input_shape)}: {blocks} poolings of {pool_size} "
                         f"need spatial sizes of at least {smallest}")


# ---------------------------------------------------------------------------- loss and metric
# CosmoFlow's loss (mean squared error) and validation metric (mean absolute error).


def mse_loss(y_true, y_pred):
    """Mean squared error over the batch and the 4 parameters (a scalar)."""
    return keras.ops.mean(keras.ops.square(y_pred - y_true))


PARAMETERS = ("Omega_m", "sigma_8", "n_s", "H_0")


class MeanAbsoluteError:
    """MAE over all validation samples and parameters, from sums that add across ranks.

    The sums are [count of values, sum of |error| per parameter ...], so the per-parameter MAE is reported too.
    """

    name = "mae"
    mlperf_key = "eval_error"
    higher_is_better = False

    def batch_sums(self, y_true, y_pred):
        per_param = keras.ops.sum(keras.ops.abs(y_pred - y_true), axis=0)  # (P,)
        count = keras.ops.cast(keras.ops.size(y_true), "float32")
        return keras.ops.concatenate([keras.ops.reshape(count, (1,)), per_param])

    def result(self, sums) -> float:
        sums = np.asarray(sums, dtype=np.float64)
        return float(sums[1:].sum() / sums[0])

    def details(self, sums) -> dict:
        """MAE of each parameter."""
        sums = np.asarray(sums, dtype=np.float64)
        per_sample = sums[0] / len(sums[1:])
        names = PARAMETERS if len(sums) - 1 == len(PARAMETERS) else range(len(sums) - 1)
        return {f"mae_{n}": float(v / per_sample) for n, v in zip(names, sums[1:])}
