"""Numerical precision and compilation of the training step: `train.precision` and `train.jit_compile`.

`train.precision` is a Keras mixed-precision policy, set before the model is built: `float32`, or
`mixed_bfloat16` / `mixed_float16` (float32 variables, layers computing in 16 bits). Each model ends in a
float32 layer, so the loss and the metric are float32. `mixed_float16` wraps the optimizer in Keras'
`LossScaleOptimizer` (dynamic loss scaling: the training step scales the loss before the gradients and the
optimizer unscales them, skipping a step whose gradients overflow). bfloat16 has float32's range and needs
no scaling. `train.jit_compile=true` XLA-compiles each step's forward and backward pass (the allreduce
and the update stay outside, where Horovod's ops run). Both are logged (`precision`, `jit_compile`).
"""
from __future__ import annotations

from typing import Any


def set_precision(precision: str) -> None:
    """The global Keras policy models are built under (call before building)."""
    import keras
    keras.mixed_precision.set_global_policy(precision)


def for_precision(optimizer: Any, precision: str) -> Any:
    """`optimizer`, in a dynamic loss-scaling wrapper for mixed_float16."""
    if precision != "mixed_float16":
        return optimizer
    import keras
    return keras.optimizers.LossScaleOptimizer(optimizer)


def precision_keys(precision: str, jit_compile: bool) -> dict:
    """What the MLPerf log records of them."""
    return {"precision": precision, "jit_compile": jit_compile}
