"""CosmoFlow in Mesh-TensorFlow, with the cube's depth and/or height split into blocks over a device mesh.

The architecture and sizes are those of `cosmoflow.model.build_model` (taken from a `CosmoModelConfig`),
so the Keras model's weights load unchanged and give the same outputs, loss and gradients.

Mesh axes: "b" (data parallel: the batch is split), "pd" (depth blocks) and "ph" (height blocks);
`len(devices) = b * pd * ph`, devices in row-major order of (b, pd, ph). The activations are
(batch, [d_blocks], [h_blocks], d, h, w, c); the blocks dimensions exist while a spatial size is split
and map to "pd"/"ph". Each split conv layer convolves every block as it is and adds its neighbours'
boundary planes' share (`haloconv.halo_conv3d`, kernel 3), or, for another kernel, convolves the block grown
by its neighbours' halo planes (`_conv_with_halos`). Pooling windows never straddle blocks when a block's size is a multiple of the
pool size; when it is not, that split is merged first (an allconcat over the mesh axis; the merged
dimension then stays whole), so pooling equals Keras' 'valid' pooling exactly. Before Flatten every
split is merged, so the flatten order is Keras' (d, h, w, c) row-major order, and the dense layers run
on activations replicated over "pd"/"ph" (split only over "b"). All weights are replicated.

Graph mode only (tf.compat.v1): the model is built into its own `tf.Graph`, lowered onto a
`PlacementMeshImpl`, and run in a `tf.compat.v1.Session` (local virtual devices or a cluster target).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from common.base.errors import BenchError
from cosmoflow.config import CosmoModelConfig
from cosmoflow.mesh import haloconv
from cosmoflow.mesh.groups import whole_groups
from cosmoflow.mesh.shim import import_mtf

mtf = import_mtf()

LAYOUT = "batch:b;d_blocks:pd;h_blocks:ph"
# Every weight's value comes from the Keras model (`MeshCosmoFlow.initialize`), the one place that
# defines CosmoFlow's initialisation; the masters start at zero until then.
_UNSET = tf.compat.v1.zeros_initializer()


# ---------------------------------------------------------------------------- planning (pure Python)
@dataclasses.dataclass(frozen=True)
class MeshLayout:
    """How a batch is spread: `batch_splits` x `spatial` = (pd, ph) blocks, one per device."""

    spatial: tuple[int, int]
    batch_splits: int
    devices: tuple[str, ...]

    @property
    def mesh_shape(self) -> str:
        pd, ph = self.spatial
        return f"b:{self.batch_splits};pd:{pd};ph:{ph}"


def plan_layout(input_shape: Sequence[int], spatial: Sequence[int], devices: Sequence[str],
                batch_size: int) -> MeshLayout:
    """Check that `spatial` = (pd, ph) partitions fit the cube, the devices and the batch; raise BenchError if not.

    The devices left over by the spatial split (len(devices) / (pd * ph)) split the batch.
    """
    if len(spatial) != 2 or any(int(p) < 1 for p in spatial):
        raise BenchError(f"spatial partitions {list(spatial)}: expected two integers >= 1 (depth, height)")
    pd, ph = (int(p) for p in spatial)
    depth, height = input_shape[0], input_shape[1]
    for name, size, parts in (("depth", depth, pd), ("height", height, ph)):
        if size % parts:
            raise BenchError(f"spatial partitions {[pd, ph]}: the cube's {name} {size} (input_shape "
                             f"{list(input_shape)}) is not divisible by {parts} partitions")
    parts, count = pd * ph, len(devices)
    batch_splits = whole_groups((pd, ph), count, "devices", f"spatial partitions {[pd, ph]}")
    if batch_size % batch_splits:
        raise BenchError(f"batch size {batch_size} is not divisible by {batch_splits} data-parallel splits "
                         f"({count} devices / {parts} spatial partitions)")
    return MeshLayout((pd, ph), batch_splits, tuple(devices))


def check_partitioning(model: CosmoModelConfig, spatial: Sequence[int]) -> MeshLayout:
    """The checks `build_mesh_model` makes of the model and `spatial`, for one group of pd * ph devices.

    Arithmetic only (no graph, no device): run it before any work to refuse a partitioning that does not
    fit the cube.
    """
    # One stand-in device per partition (bad `spatial` values are plan_layout's to report).
    parts = int(np.prod([max(1, int(p)) for p in spatial]))
    layout = plan_layout(model.input_shape, spatial, [f"partition {i}" for i in range(parts)], batch_size=1)
    check_kernel(model)
    return layout


def check_kernel(model: CosmoModelConfig) -> None:
    if model.kernel_size % 2 == 0:
        raise BenchError(f"model.kernel_size {model.kernel_size}: the mesh model needs an odd kernel size "
                         f"(a block's halo grows it by kernel // 2 planes on both sides, which matches Keras "
                         f"'same' only for odd kernels)")
    if model.leaky_slope < 0:
        raise BenchError(f"model.leaky_slope {model.leaky_slope}: the mesh model needs a slope >= 0 (its "
                         f"LeakyReLU gradient reads the sign of the input from the output, `_bias_leaky_relu`)")


def pooling_splits(input_shape: Sequence[int], spatial: Sequence[int], blocks: int,
                   pool_size: int) -> list[tuple[bool, bool]]:
    """For each conv block, whether depth and height are still split when it pools.

    A split survives a pooling only while every block's size is a multiple of the pool size;
    otherwise it is merged before that pooling and stays merged.
    """
    sizes, splits, plan = list(input_shape[:2]), [p > 1 for p in spatial], []
    for _ in range(blocks):
        splits = [split and (size // parts) % pool_size == 0
                  for split, size, parts in zip(splits, sizes, spatial)]
        plan.append((splits[0], splits[1]))
        sizes = [size // pool_size for size in sizes]
    return plan


# ---------------------------------------------------------------------------- the built model
@dataclasses.dataclass
class StepResult:
    """One forward/backward pass: outputs (B, targets), the MSE loss and gradients in Keras weight order."""

    outputs: np.ndarray
    loss: float
    gradients: list[np.ndarray]


@dataclasses.dataclass
class MeshCosmoFlow:
    """A lowered mesh model: its graph, feeds, fetches and the ops that load weights."""

    graph: Any  # tf.Graph
    layout: MeshLayout
    images: Any  # placeholder (B, D, H, W, C); None when each device takes its block from its queue
    targets: Any  # placeholder (B, target_size)
    outputs: Any  # (B, target_size)
    loss: Any  # scalar
    gradients: list  # replicated weights' gradients, Keras order, each the full tensor
    weight_names: list[str]
    weight_shapes: list[tuple[int, ...]]
    weight_feeds: list  # placeholders of the master values
    load_ops: list  # assign each master from its feed
    init_op: Any  # initialise the master variables
    copy_to_slices: Any  # masters -> per-device slices

    def initialize(self, session: Any, weights: Any) -> None:
        """Set every weight from a Keras CosmoFlow model (or its `get_weights()` list) and copy it to the devices
        (the in-process checks; a training group writes each device's copy instead: cosmoflow/mesh/slices.py)."""
        values = self._checked(weights)
        session.run(self.init_op)
        session.run(self.load_ops, feed_dict=dict(zip(self.weight_feeds, values)))
        session.run(self.copy_to_slices)

    def step(self, session: Any, images: np.ndarray | None, targets: np.ndarray) -> StepResult:
        """Forward, MSE loss and gradients for one batch (no update); images None: the blocks are queued."""
        feed = self._images(images) | {self.targets: targets}
        outputs, loss, *grads = session.run([self.outputs, self.loss, *self.gradients], feed_dict=feed)
        return StepResult(outputs, float(loss), grads)

    def predict(self, session: Any, images: np.ndarray | None) -> np.ndarray:
        """The outputs (B, target_size) for one batch: the forward pass only; images None: the blocks are queued."""
        return session.run(self.outputs, feed_dict=self._images(images))

    def _images(self, images: np.ndarray | None) -> dict:
        if (images is None) != (self.images is None):
            raise BenchError("this mesh takes " + ("its blocks from the ranks' queues: pass images=None"
                                                   if self.images is None else "whole images: pass them"))
        return {} if images is None else {self.images: images}

    def _checked(self, weights: Any) -> list[np.ndarray]:
        values = keras_weights(weights)
        self._check_weights(values)
        return values

    def _check_weights(self, values: list[np.ndarray]) -> None:
        if len(values) != len(self.weight_shapes):
            raise BenchError(f"{len(values)} weight arrays given, the mesh model has {len(self.weight_shapes)}: "
                             f"{self.weight_names}")
        for name, shape, value in zip(self.weight_names, self.weight_shapes, values):
            if tuple(value.shape) != shape:
                raise BenchError(f"weight {name}: shape {tuple(value.shape)} given, expected {shape}")


def keras_weights(weights: Any) -> list[np.ndarray]:
    """float32 arrays from a keras.Model (its trainable weights, in layer order) or a list of arrays."""
    if hasattr(weights, "trainable_weights"):
        from tensorflow.python.eager import context
        # Keras' variables are eager; read them eagerly even inside a session's graph context
        # (tf.init_scope would stay in that graph).
        with context.eager_mode():
            weights = [w.numpy() for w in weights.trainable_weights]
    return [np.asarray(w, dtype=np.float32) for w in weights]


def build_mesh_model(model: CosmoModelConfig, devices: Sequence[str], spatial: Sequence[int] = (1, 1),
                     batch_size: int = 1, training: bool = False, seed: int | None = None,
                     layout_rules: str = LAYOUT, input_queue: str | None = None) -> MeshCosmoFlow:
    """Build and lower CosmoFlow over `devices` with the cube split into `spatial` = (pd, ph) blocks.

    Args:
        model: the sizes (the config's `model:` section, as for `cosmoflow.model.build_model`).
        devices: TensorFlow device strings, e.g. "/job:worker/task:1/cpu:0"; the devices beyond
            pd * ph split the batch.
        batch_size: the global batch of one step (static in Mesh-TF).
        training: apply dropout (random masks); False makes dropout the identity, as Keras'
            inference mode does, which is what equivalence checks need.
        seed: the graph-level random seed (dropout); None leaves it unset.
        layout_rules: which mesh axis splits which tensor dimension; only the tests that prove the split
            change it (to one that splits nothing, which they must catch).
        input_queue: None: the images are fed whole (`images`, a placeholder) and split here. A graph name
            ("train", "eval"): each device takes its block from its queue (cosmoflow/mesh/blocks.py), which the
            rank hosting it fills; `images` is then None and steps feed only the targets. Needs one sample's
            blocks per device (no batch split).
    """
    layout = plan_layout(model.input_shape, spatial, devices, batch_size)
    check_kernel(model)
    if input_queue is not None and (layout.batch_splits != 1 or layout_rules != LAYOUT):
        raise BenchError(f"queued blocks need one device per block and the model's layout: {len(devices)} devices "
                         f"for {list(spatial)} partitions, layout {layout_rules!r}")
    graph = tf.Graph()
    with graph.as_default():
        if seed is not None:
            tf.compat.v1.set_random_seed(seed)  # the graph's seed: dropout masks
        mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(layout.mesh_shape, layout_rules, list(layout.devices))
        source = (_Queued(input_queue, mesh_impl) if input_queue is not None else
                  tf.compat.v1.placeholder(tf.float32, [batch_size, *model.input_shape], name="images"))
        targets = tf.compat.v1.placeholder(tf.float32, [batch_size, model.target_size], name="targets")
        mesh_graph = mtf.Graph()
        mesh = mtf.Mesh(mesh_graph, "cosmoflow")
        # Halo planes without their outputs (cosmoflow/mesh/haloconv.py) need one block per device: the model's layout.
        outputs, loss = _forward(mesh, model, layout, source, targets, training, planes=layout_rules == LAYOUT)
        variables = list(mesh_graph.trainable_variables)  # creation order = Keras weight order
        grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
        lowering = mtf.Lowering(mesh_graph, {mesh: mesh_impl})
        feeds = [tf.compat.v1.placeholder(tf.float32, v.shape.to_integer_list) for v in variables]
        return MeshCosmoFlow(
            graph=graph, layout=layout, images=None if input_queue is not None else source, targets=targets,
            outputs=lowering.export_to_tf_tensor(outputs), loss=lowering.export_to_tf_tensor(loss),
            gradients=[lowering.export_to_tf_tensor(g) for g in grads],
            weight_names=[v.name for v in variables],
            weight_shapes=[tuple(v.shape.to_integer_list) for v in variables],
            weight_feeds=feeds,
            load_ops=[v.get_master().assign(f) for v, f in zip(variables, feeds)],
            init_op=tf.compat.v1.global_variables_initializer(),
            copy_to_slices=lowering.copy_masters_to_slices())


# ---------------------------------------------------------------------------- what runs where
def lowered_convolutions(graph: Any) -> list[dict]:
    """Every forward Conv3D of a lowered mesh graph: its layer ("conv1" ...), device and input shape.

    This is what TensorFlow will run, read from the graph itself: with the cube split, each device's
    convolution gets its own block (bare with a kernel of 3, grown by its halos otherwise), not the whole cube.
    """
    return [{"layer": _layer(op.name), "device": op.device, "input_shape": op.inputs[0].shape.as_list()}
            for op in graph.get_operations() if op.type == "Conv3D"]


def lowered_faces(graph: Any) -> list[dict]:
    """Every forward Conv2D of a lowered mesh graph: a neighbour's boundary plane meeting one face of a conv
    layer's kernel on a device (`haloconv`), with its layer, device and input shape."""
    return [{"layer": _layer(op.name), "device": op.device, "input_shape": op.inputs[0].shape.as_list()}
            for op in graph.get_operations() if op.type == "Conv2D"]


def _layer(op_name: str) -> str:
    """"conv1" from "conv1/Conv3D" or "conv1_2/Conv2D" (TensorFlow numbers a name scope used before)."""
    return re.sub(r"_\d+$", "", op_name.split("/")[0])


def planned_conv_inputs(model: CosmoModelConfig, spatial: Sequence[int], batch_splits: int,
                        batch_size: int) -> list[list[int]]:
    """Per conv layer, the input shape each device's Conv3D must get under `spatial` = (pd, ph):
    (batch / batch_splits, depth block, height block, width, channels). With a kernel of 3 the block is bare
    (its neighbours' planes enter through 2-D convolutions, `haloconv`); with another kernel a split dimension
    is grown by the kernel's halo on both sides (exchanged with the neighbouring blocks, or zeros at the
    cube's faces). The convolution pads the others inside the op ('SAME'), so they keep their bare sizes."""
    sizes, split = list(model.input_shape[:3]), [p > 1 for p in spatial]
    channels = [model.input_shape[3], *model.conv_filters[:-1]]
    shapes = []
    for (keep_d, keep_h), c in zip(pooling_splits(model.input_shape, spatial, len(model.conv_filters),
                                                  model.pool_size), channels):
        depth = sizes[0] // spatial[0] if split[0] else sizes[0]
        height = sizes[1] // spatial[1] if split[1] else sizes[1]
        halo = 0 if model.kernel_size == haloconv.KERNEL else 2 * (model.kernel_size // 2)
        shapes.append([batch_size // batch_splits, depth + halo * split[0], height + halo * split[1], sizes[2], c])
        split, sizes = [keep_d, keep_h], [size // model.pool_size for size in sizes]
    return shapes


# ---------------------------------------------------------------------------- the network
@dataclasses.dataclass
class _Blocks:
    """The activation and its blocks dimensions (None once merged or never split)."""

    x: Any
    d_blocks: Any = None
    h_blocks: Any = None


@dataclasses.dataclass(frozen=True)
class _Queued:
    """The images as every device's block from its queue (`build_mesh_model(input_queue=...)`)."""

    name: str
    mesh_impl: Any


def _forward(mesh, model: CosmoModelConfig, layout: MeshLayout, source, targets, training: bool, planes: bool):
    """Mesh-TF ops from the images (a placeholder, or `_Queued` blocks) to (outputs, loss); `planes`: convolve
    split blocks with `halo_conv3d` (else with whole halo planes, `_conv_with_halos`)."""
    act = _import_blocks(mesh, source, layout, model.input_shape, targets.shape.as_list()[0])
    plan = pooling_splits(model.input_shape, layout.spatial, len(model.conv_filters), model.pool_size)
    for i, (filters, (keep_d, keep_h)) in enumerate(zip(model.conv_filters, plan)):
        act = _conv_block(act, model, i, filters, (keep_d, keep_h), planes)
    x = _flatten(_merge_all(act))
    for i, units in enumerate(model.dense_units):
        x = _leaky_relu(_dense(x, units, f"dense{i + 1}"), model.leaky_slope)
        if training and model.dropout > 0:
            x = mtf.dropout(x, is_training=True, rate=model.dropout)
    outputs = mtf.tanh(_dense(x, model.target_size, "output")) * model.output_scale
    y = mtf.import_tf_tensor(mesh, targets, outputs.shape)
    loss = mtf.reduce_mean(mtf.square(outputs - y))  # as cosmoflow.model.mse_loss
    return outputs, loss


def _import_blocks(mesh, source, layout: MeshLayout, input_shape: Sequence[int], batch: int) -> _Blocks:
    """(B, D, H, W, C) -> mtf (batch, [d_blocks], [h_blocks], d, h, w, c), blocks dims only where split."""
    depth, height, width, channels = input_shape
    pd, ph = layout.spatial
    # Unsplit blocks dims (size 1) are left out: the convolution ('SAME') pads that dimension itself.
    d_blocks = mtf.Dimension("d_blocks", pd) if pd > 1 else None
    h_blocks = mtf.Dimension("h_blocks", ph) if ph > 1 else None
    dims = [mtf.Dimension("batch", batch), d_blocks, h_blocks, mtf.Dimension("d", depth // pd),
            mtf.Dimension("h", height // ph), mtf.Dimension("w", width), mtf.Dimension("c0", channels)]
    dims = [d for d in dims if d is not None]
    if isinstance(source, _Queued):
        return _Blocks(_import_queued(mesh, source, layout, mtf.Shape(dims)), d_blocks, h_blocks)
    x = tf.reshape(source, [batch, pd, depth // pd, ph, height // ph, width, channels])
    x = tf.transpose(x, [0, 1, 3, 2, 4, 5, 6])  # (B, pd, ph, D/pd, H/ph, W, C)
    x = tf.reshape(x, [d.size for d in dims])
    return _Blocks(mtf.import_tf_tensor(mesh, x, mtf.Shape(dims)), d_blocks, h_blocks)


def _import_queued(mesh, source: _Queued, layout: MeshLayout, shape) -> Any:
    """The input laid out as Mesh-TF would lay it, from each device's own queue: device pnum's slice is its
    block (batch, d, h, W, C), reshaped to the slice shape (size-1 blocks dims where split)."""
    from cosmoflow.mesh.blocks import block_queue
    slice_shape = source.mesh_impl.slice_shape(shape)
    block = [slice_shape[0], *slice_shape[-4:]]
    slices = []
    for pnum, device in enumerate(layout.devices):
        with tf.device(device):
            slices.append(tf.reshape(block_queue(source.name, pnum, device, block).dequeue(), slice_shape))
    return mtf.import_laid_out_tensor(mesh, source.mesh_impl.LaidOutTensor(slices), shape)


def _conv_block(act: _Blocks, model: CosmoModelConfig, index: int, filters: int,
                keep: tuple[bool, bool], planes: bool) -> _Blocks:
    """Conv3D 'same' + bias -> LeakyReLU -> pool, merging the splits that the pooling cannot keep."""
    name = f"conv{index + 1}"
    out_dim = mtf.Dimension(f"c{index + 1}", filters)
    k = model.kernel_size
    split = act.d_blocks is not None or act.h_blocks is not None
    if planes and split and k == haloconv.KERNEL:
        x = _conv_planes(act, out_dim, name)
    else:
        x = _conv_with_halos(act, out_dim, k, name)
    keep_d, keep_h = keep
    with tf.compat.v1.variable_scope(name):
        bias = mtf.get_variable(x.mesh, "bias", [out_dim], initializer=_UNSET)
    act = _Blocks(_bias_leaky_relu(x, bias, model.leaky_slope), act.d_blocks, act.h_blocks)
    if act.d_blocks is not None and not keep_d:
        act = _Blocks(_merge(act.x, act.d_blocks, "d"), None, act.h_blocks)
    if act.h_blocks is not None and not keep_h:
        act = _Blocks(_merge(act.x, act.h_blocks, "h"), act.d_blocks, None)
    return _Blocks(_pool(act.x, model), act.d_blocks, act.h_blocks)


def _conv_planes(act: _Blocks, out_dim, name: str):
    """Conv3D 'same' on blocks, each block as is plus its neighbours' boundary planes' share
    (`haloconv.halo_conv3d`); the kernel variable is "<name>/kernel", as `mtf.layers.conv3d` names it."""
    taps = [mtf.Dimension(n, haloconv.KERNEL) for n in ("fd", "fh", "fw")]
    with tf.compat.v1.variable_scope(name):
        kernel = mtf.get_variable(act.x.mesh, "kernel", taps + [act.x.shape.dims[-1], out_dim], initializer=_UNSET)
    return haloconv.halo_conv3d(act.x, kernel, act.d_blocks, act.h_blocks, name)


def _conv_with_halos(act: _Blocks, out_dim, k: int, name: str):
    """Conv3D 'same' on blocks for kernels other than 3 (and layouts that do not put one block on each device):
    each split dimension's block gets its neighbours' halo planes, the convolution
    runs with padding "SAME" on the grown block, and the halo planes' outputs are sliced off. Mesh-TF's
    conv3d_with_blocks instead zero-pads every dimension and convolves "VALID", whose filter gradient oneDNN
    computes at half the rate (benchmarks/conv_padding.py). The kernel variable is "<name>/kernel" either way."""
    halo = k // 2
    d_dim, h_dim = act.x.shape.dims[-4:-2]
    split = [(blocks, dim) for blocks, dim in ((act.d_blocks, d_dim), (act.h_blocks, h_dim)) if blocks is not None and halo]
    x = act.x
    for blocks, dim in split:
        x = mtf.halo_exchange(x, blocks, dim, halo)
    x = mtf.layers.conv3d(x, out_dim, filter_size=(k, k, k), padding="SAME", filter_initializer=_UNSET, name=name)
    for _, dim in split:
        x = mtf.slice(x, halo, dim.size, dim.name)
    return x


def _pool(x, model: CosmoModelConfig):
    """Non-overlapping pooling over (d, h, w); unsplit sizes that are not multiples are cropped, as 'valid' does."""
    p = model.pool_size
    for dim in x.shape.dims[-4:-1]:
        if dim.size % p:  # only whole (merged) dims get here: a split dim kept for pooling is divisible
            x = mtf.slice(x, 0, dim.size - dim.size % p, dim.name)
    return _block_pool(x, p, model.pooling)


# TensorFlow's own ops on each block, forward and backward: the fused LeakyReluGrad, MaxPool3DGrad and
# AvgPool3DGrad, one tensor each, which is what the Keras model runs. Mesh-TF's own leaky_relu and pooling
# build their gradients from element-wise ops, each as large as the activation (7 for leaky_relu, 5 for
# max pooling), which held the split layers' memory far above 1/P; and its max pooling's gradient differs
# from TensorFlow's at near-ties. The gradients are slicewise ops too, so each runs on its block's device
# (Mesh-TF's default gradient of a slicewise op leaves the device unset).
def _leaky_relu(x, alpha: float):
    def grad(op, dy):
        return [mtf.cwise(lambda g, f: tf.raw_ops.LeakyReluGrad(gradients=g, features=f, alpha=alpha),
                          [dy, op.inputs[0]], name="leaky_relu_grad")]
    return mtf.cwise(lambda t: tf.nn.leaky_relu(t, alpha=alpha), [x], grad_function=grad, name="leaky_relu")


def _bias_leaky_relu(x, bias, alpha: float):
    """leaky_relu(x + bias) on every block as one op (`tf.nn.bias_add`), so that only its output is kept for
    the backward pass: the gradient reads the input's sign from the output (alpha >= 0, `check_kernel`) and
    sums the bias gradient with BiasAddGrad (Mesh-TF's `x + bias` keeps x + bias and sums with a Sum over
    four axes, ~8x slower than BiasAddGrad at 128^3). Each block's bias sums, kept per batch entry and
    block, are then added over the mesh (`mtf.reduce_sum`)."""
    dims = x.shape.dims
    outer = dims[:-4]  # batch and the blocks dims: what a slice may be split by

    def per_slice_bias_grad(g):
        lead = g.shape.as_list()[:-4]
        rows = tf.reshape(g, [int(np.prod(lead)), -1, g.shape[-1]])
        sums = [tf.raw_ops.BiasAddGrad(out_backprop=rows[i]) for i in range(rows.shape[0])]
        return tf.reshape(tf.stack(sums), lead + [g.shape[-1]])

    def grad(op, dy):
        dz = mtf.cwise(lambda g, y: tf.raw_ops.LeakyReluGrad(gradients=g, features=y, alpha=alpha),
                       [dy, op.outputs[0]], name="leaky_relu_grad")
        partial = mtf.slicewise(per_slice_bias_grad, [dz], output_shape=mtf.Shape(outer + [dims[-1]]),
                                splittable_dims=outer, grad_function=0, name="bias_add_grad")
        return [dz, mtf.reduce_sum(partial, output_shape=bias.shape)]

    return mtf.slicewise(lambda t, b: tf.nn.leaky_relu(tf.nn.bias_add(t, b), alpha=alpha), [x, bias],
                         output_shape=x.shape, splittable_dims=outer, grad_function=grad, name="bias_leaky_relu")


def _block_pool(x, p: int, kind: str):
    """(.., d, h, w, c) -> (.., d/p, h/p, w/p, c) on every block; windows never straddle blocks (see `_pool`)."""
    dims = x.shape.dims
    outer, spatial, channels = dims[:-4], dims[-4:-1], dims[-1]
    pooled = mtf.Shape(outer + [mtf.Dimension(d.name, d.size // p) for d in spatial] + [channels])
    window = dict(ksize=[1, p, p, p, 1], strides=[1, p, p, p, 1], padding="VALID")

    def five_d(fn):
        """fn on (N, d, h, w, c) tensors, the leading (batch and blocks) dims folded into N and restored."""
        def on_block(*ts):
            lead = ts[0].shape.as_list()[:-4]
            out = fn(*(tf.reshape(t, [-1, *t.shape.as_list()[-4:]]) for t in ts))
            return tf.reshape(out, lead + out.shape.as_list()[1:])
        return on_block

    if kind == "max":
        forward = five_d(lambda t: tf.nn.max_pool3d(t, **window))
        # The pooled maximum is recomputed here (a fraction of the gradient's cost) so that MaxPool3DGrad takes
        # it straight from a MaxPool3D: oneDNN then runs both (its rewrite needs that pair; TensorFlow's own
        # CPU MaxPool3DGrad took a third of a 128^3 step).
        backward = five_d(lambda t, g: tf.raw_ops.MaxPool3DGrad(orig_input=t, orig_output=tf.nn.max_pool3d(t, **window),
                                                                grad=g, **window))
    else:
        forward = five_d(lambda t: tf.nn.avg_pool3d(t, **window))
        backward = five_d(lambda t, g: tf.raw_ops.AvgPool3DGrad(orig_input_shape=tf.shape(t), grad=g, **window))

    def grad(op, dy):
        return [mtf.slicewise(backward, [op.inputs[0], dy], output_shape=op.inputs[0].shape, splittable_dims=outer,
                              grad_function=0, name=f"{kind}_pool3d_grad")]

    return mtf.slicewise(forward, [x], output_shape=pooled, splittable_dims=outer, grad_function=grad,
                         name=f"{kind}_pool3d")


def _merge(x, blocks_dim, size_name: str):
    """Join the blocks of one spatial dimension: (.., blocks, .., size, ..) -> (.., blocks * size, ..)."""
    dims = [d for d in x.shape.dims if d != blocks_dim]
    i = [d.name for d in dims].index(size_name)
    x = mtf.transpose(x, dims[:i] + [blocks_dim] + dims[i:])  # blocks just before the block size: row-major join
    merged = mtf.Dimension(size_name, blocks_dim.size * dims[i].size)
    return mtf.reshape(x, dims[:i] + [merged] + dims[i + 1:])


def _merge_all(act: _Blocks):
    x = act.x
    if act.d_blocks is not None:
        x = _merge(x, act.d_blocks, "d")
    if act.h_blocks is not None:
        x = _merge(x, act.h_blocks, "h")
    return x


def _flatten(x):
    """(batch, d, h, w, c) -> (batch, flat) in row-major order, i.e. Keras' Flatten of channels-last."""
    batch, *rest = x.shape.dims
    return mtf.reshape(x, [batch, mtf.Dimension("flat", int(np.prod([d.size for d in rest])))])


def _dense(x, units: int, name: str):
    """x @ kernel + bias over the last dimension; kernel (in, units) and bias (units) as in Keras."""
    batch, in_dim = x.shape.dims
    out_dim = mtf.Dimension(name, units)
    with tf.compat.v1.variable_scope(name):
        kernel = mtf.get_variable(x.mesh, "kernel", [in_dim, out_dim], initializer=_UNSET)
        bias = mtf.get_variable(x.mesh, "bias", [out_dim], initializer=_UNSET)
    return mtf.einsum([x, kernel], output_shape=[batch, out_dim]) + bias
