"""Training work per sample, counted from a Keras model's layer shapes.

Two flops per multiply-add of the convolution and dense layers, times 3 for the forward pass, the input
gradient and the weight gradient (times 2 for the first such layer, whose input gradient is not computed).
Batch norm, activations, pooling, the loss and the optimizer update are not counted: they are a few per cent
of the work and no peak rate would cover them. Dilation does not change a convolution's count; a transposed
convolution counts every input pixel's k x k scatter (the cropped row and column included).
"""
from __future__ import annotations

import math


def forward_multiply_adds(layer) -> int:
    """Multiply-adds of one sample's forward pass through `layer` (nested models included); 0 for layers
    without a kernel."""
    from keras import layers
    if hasattr(layer, "layers"):  # a nested model
        return sum(forward_multiply_adds(inner) for inner in layer.layers)
    kernel = math.prod(getattr(layer, "kernel_size", ()) or (1,))
    if isinstance(layer, layers.SeparableConv2D):  # depthwise k x k, then pointwise 1 x 1
        out, cin = layer.output.shape, layer.input.shape[-1]
        return _pixels(out) * cin * (kernel * layer.depth_multiplier + out[-1])
    if isinstance(layer, layers.DepthwiseConv2D):
        return _pixels(layer.output.shape) * layer.input.shape[-1] * layer.depth_multiplier * kernel
    if isinstance(layer, (layers.Conv2DTranspose, layers.Conv3DTranspose)):
        return _pixels(layer.input.shape) * layer.input.shape[-1] * layer.filters * kernel
    if isinstance(layer, (layers.Conv1D, layers.Conv2D, layers.Conv3D)):
        out = layer.output.shape
        return _pixels(out) * layer.input.shape[-1] * out[-1] * kernel
    if isinstance(layer, layers.Dense):
        return math.prod(layer.input.shape[1:]) // layer.input.shape[-1] * layer.input.shape[-1] * layer.units
    return 0


def _pixels(shape) -> int:
    """Spatial positions of a channels-last (batch, ..., channels) shape."""
    return math.prod(shape[1:-1])


def training_gflop_per_sample(model) -> float:
    """GFLOP of one sample's training step (forward and backward) through `model`'s conv and dense layers."""
    macs = [forward_multiply_adds(layer) for layer in model.layers]  # model.layers: topological order
    first = next((m for m in macs if m), 0)
    return 2.0 * (3 * sum(macs) - first) / 1e9
