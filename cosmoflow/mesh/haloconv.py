"""Conv3D 'same' over a cube split into depth/height blocks, without convolving halo planes.

Each device convolves its own block as it is (padding "SAME": zeros beyond the block), then adds what its
neighbours' boundary planes contribute to its own boundary planes. With a 3-wide kernel that share is a 2-D
convolution of the neighbour's last (or first) plane with one face of the kernel: K[0] / K[2] for a depth
neighbour, K[:, 0] / K[:, 2] for a height neighbour. A depth neighbour's plane carries its own height halo
rows (from the diagonal blocks), so the corners are counted once, with the depth faces.

The block-plus-halos convolution (`model._conv_with_halos`) computes the halo planes' outputs too and drops
them: 2 / block of every split dimension's output planes, which at 128^3 under [2,2] is 1.25x the cube's
multiply-adds. Here the extra work is a third of one plane per face (one kernel face), and only the
boundary planes travel between devices, in both passes.

The backward pass is one operation with both gradients: the block's Conv3D input and filter gradients, each
face's 2-D input and filter gradients, and each face's input gradient added into the neighbour's boundary
plane (where that plane came from). The filter gradient is summed over the mesh, as Mesh-TF's own conv3d does.
Forward and backward are TensorFlow's ops on each device: Conv3D, Conv2D and their Backprop ops.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from cosmoflow.mesh.shim import import_mtf

mtf = import_mtf()

KERNEL = 3  # the faces are one plane: a kernel of 3 (halo 1)
_D, _H = 1, 2  # axes of a block folded to (N, d, h, w, c)


def halo_conv3d(x, kernel, d_blocks, h_blocks, name: str):
    """x (.., [d_blocks], [h_blocks], d, h, w, c) conv kernel (3, 3, 3, c, o) -> (.., d, h, w, o), 'SAME' over the
    whole cube. The blocks dimensions must each be laid out over a mesh axis (one block per device)."""
    return HaloConv3dOperation(x, kernel, d_blocks, h_blocks, name).outputs[0]


class HaloConv3dOperation(mtf.Operation):
    """The forward convolution; `blocks_in` and `faces` keep, per device, its folded block and the neighbours'
    planes it used (for the gradient)."""

    def __init__(self, x, kernel, d_blocks, h_blocks, name: str):
        super().__init__([x, kernel], name=name)
        self.blocks = (d_blocks, h_blocks)
        out = mtf.Shape(x.shape.dims[:-1] + [kernel.shape.dims[-1]])
        self._outputs = [mtf.Tensor(self, out, x.dtype)]
        self.blocks_in: list = []
        self.faces: list[list[_Face]] = []

    def gradient(self, grad_ys):
        return HaloConv3dGradOperation(self, grad_ys[0]).outputs

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)
        self.blocks_in = xs = _folded(mesh_impl, _slices(lowering, self.inputs[0]))
        ks = _slices(lowering, self.inputs[1])
        grid = _Grid(mesh_impl, self.blocks)
        self.faces = [_faces(grid, xs, p) for p in range(len(xs))]
        ys = []
        for p, (x, k) in enumerate(zip(xs, ks)):
            with tf.device(mesh_impl.devices[p]):
                y = tf.nn.conv3d(x, k, [1] * 5, "SAME")
                for face in self.faces[p]:
                    y = _add_at(y, face.conv(k), face.out_index)
                ys.append(_unfold(y, self.outputs[0], mesh_impl, mesh_impl.devices[p]))
        lowering.set_tensor_lowering(self.outputs[0], mesh_impl.LaidOutTensor(ys))


class HaloConv3dGradOperation(mtf.Operation):
    """dy -> (dx, dkernel) of `HaloConv3dOperation`."""

    def __init__(self, forward: HaloConv3dOperation, dy):
        x, kernel = forward.inputs
        super().__init__([x, kernel, dy], name=forward.name + "_grad")
        self.forward = forward
        self._outputs = [mtf.Tensor(self, x.shape, x.dtype), mtf.Tensor(self, kernel.shape, kernel.dtype)]

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)
        x_t, k_t, dy_t = self.inputs
        xs, dys = self.forward.blocks_in, _folded(mesh_impl, _slices(lowering, dy_t))
        ks = _slices(lowering, k_t)
        dxs, dks, sent = [], [], [[] for _ in xs]
        for p, (x, k, dy) in enumerate(zip(xs, ks, dys)):
            with tf.device(mesh_impl.devices[p]):
                dxs.append(tf.raw_ops.Conv3DBackpropInputV2(input_sizes=tf.shape(x), filter=k, out_backprop=dy,
                                                            strides=[1] * 5, padding="SAME"))
                dk = tf.raw_ops.Conv3DBackpropFilterV2(input=x, filter_sizes=tf.shape(k), out_backprop=dy,
                                                       strides=[1] * 5, padding="SAME")
                for face in self.forward.faces[p]:
                    dk = face.add_filter_grad(dk, dy)
                    for target, index, grad in face.input_grads(k, dy):
                        sent[target].append((index, grad))
                dks.append(dk)
        for p, parts in enumerate(sent):
            with tf.device(mesh_impl.devices[p]):
                for index, grad in parts:
                    dxs[p] = _add_at(dxs[p], grad, index)
        dx = mesh_impl.LaidOutTensor([_unfold(t, x_t, mesh_impl, d) for t, d in zip(dxs, mesh_impl.devices)])
        lowering.set_tensor_lowering(self.outputs[0], dx)
        axes = [a for a in (mesh_impl.tensor_dimension_to_mesh_axis(d) for d in x_t.shape.dims[:-4]) if a is not None]
        dk = mesh_impl.LaidOutTensor(dks)
        lowering.set_tensor_lowering(self.outputs[1], mtf.LazyAllreduceSum(mesh_impl, dk, axes) if axes else dk)


# ---------------------------------------------------------------------------- neighbours and faces
class _Grid:
    """Which device holds the block next to another's, from the mesh coordinates of the blocks' axes."""

    def __init__(self, mesh_impl, blocks):
        self.shape = mesh_impl.shape.to_integer_list
        self.devices = mesh_impl.devices
        self.axes = []
        for dim in blocks:
            axis = None if dim is None else mesh_impl.tensor_dimension_to_mesh_axis(dim)
            if dim is not None and (axis is None or self.shape[axis] != dim.size):
                raise ValueError(f"halo_conv3d needs one block of {dim.name} per device along a mesh axis; "
                                 f"{dim} is laid out over mesh axis {axis} of {self.shape}")
            self.axes.append(axis)

    def neighbour(self, pnum: int, which: int, step: int, other_step: int = 0) -> int | None:
        """The device `step` blocks away along dimension `which` (0 depth, 1 height), and `other_step` along
        the other one; None beyond the cube's faces."""
        coords = mtf.pnum_to_processor_coordinates(self.shape, pnum)
        for axis, move in ((self.axes[which], step), (self.axes[1 - which], other_step)):
            if move:
                coords[axis] += move
                if not 0 <= coords[axis] < self.shape[axis]:
                    return None
        return mtf.processor_coordinates_to_pnum(self.shape, coords)


class _Face:
    """One neighbour's boundary plane in a device's convolution: which kernel face it meets, which of the
    device's output planes it adds to, and where its gradient goes back to."""

    def __init__(self, axis: int, side: int, plane, sources: list[tuple[int | None, Any]], padding):
        self.axis, self.side, self.plane, self.sources, self.padding = axis, side, plane, sources, padding
        self.tap = 0 if side < 0 else KERNEL - 1
        # the output plane it adds to: first (from the block before) or last (from the block after)
        self.out_index = (axis, 0 if side < 0 else -1)

    def kernel_face(self, k):
        return k[self.tap] if self.axis == _D else k[:, self.tap]

    def conv(self, k):
        return tf.nn.conv2d(self.plane, self.kernel_face(k), 1, self.padding)

    def add_filter_grad(self, dk, dy):
        face = self.kernel_face(dk)
        grad = tf.raw_ops.Conv2DBackpropFilter(input=self.plane, filter_sizes=tf.shape(face),
                                               out_backprop=_plane(dy, self.out_index), strides=[1] * 4,
                                               **_conv2d_padding(self.padding))
        if self.axis == _D:
            return tf.tensor_scatter_nd_add(dk, [[self.tap]], grad[None])
        return tf.tensor_scatter_nd_add(dk, [[i, self.tap] for i in range(KERNEL)], grad)

    def input_grads(self, k, dy):
        """(device, index, gradient) for each source of the plane: the neighbour's boundary plane, and for a
        depth face with height halos, the diagonal neighbours' boundary rows."""
        grad = tf.raw_ops.Conv2DBackpropInput(input_sizes=tf.shape(self.plane), filter=self.kernel_face(k),
                                              out_backprop=_plane(dy, self.out_index), strides=[1] * 4,
                                              **_conv2d_padding(self.padding))
        if len(self.sources) == 1:
            return [(s, index, grad) for s, index in self.sources if s is not None]
        (lo, lo_index), (mid, mid_index), (hi, hi_index) = self.sources
        parts = [(lo, lo_index, grad[:, 0]), (mid, mid_index, grad[:, 1:-1]), (hi, hi_index, grad[:, -1])]
        return [part for part in parts if part[0] is not None]


def _faces(grid: _Grid, xs: list, p: int) -> list[_Face]:
    """The faces of device p's block that touch another block (none on the cube's faces)."""
    faces = []
    h_split = grid.axes[1] is not None
    for axis, which in ((_D, 0), (_H, 1)):
        if grid.axes[which] is None:
            continue
        for side in (-1, 1):
            q = grid.neighbour(p, which, side)
            if q is None:
                continue
            index = -1 if side < 0 else 0  # the neighbour's plane next to this block
            plane = _sliced_on(grid, q, lambda: _plane(xs[q], (axis, index)))
            if axis == _D and h_split:
                corners = [grid.neighbour(p, 0, side, other) for other in (-1, 1)]
                rows = [_sliced_on(grid, c, lambda c=c, h=h: xs[c][:, index, h]) for c, h in zip(corners, (-1, 0))]
                with tf.device(grid.devices[p]):
                    rows = [tf.zeros_like(plane[:, 0]) if row is None else row for row in rows]
                    plane = tf.concat([rows[0][:, None], plane, rows[1][:, None]], 1)
                sources = [(corners[0], (_D, index, -1)), (q, (_D, index)), (corners[1], (_D, index, 0))]
                faces.append(_Face(axis, side, plane, sources, [[0, 0], [0, 0], [1, 1], [0, 0]]))
            else:
                faces.append(_Face(axis, side, plane, [(q, (axis, index))], "SAME"))
    return faces


def _sliced_on(grid: _Grid, q: int | None, take):
    """take() on device q (so only the plane or row travels to the device that uses it); None beyond the cube."""
    if q is None:
        return None
    with tf.device(grid.devices[q]):
        return take()


# ---------------------------------------------------------------------------- tensors
def _slices(lowering, tensor) -> list:
    return list(lowering.tensors[tensor].to_laid_out_tensor().tensor_list)


def _folded(mesh_impl, slices: list) -> list:
    """Each slice (.., d, h, w, c) as (N, d, h, w, c), its leading (batch and blocks) dimensions folded into N, on
    the slice's own device (an op without a device would run on the session's default task, and the whole
    block would travel there and back)."""
    folded = []
    for t, device in zip(slices, mesh_impl.devices):
        with tf.device(device):
            folded.append(tf.reshape(t, [-1, *t.shape.as_list()[-4:]]))
    return folded


def _unfold(t, like, mesh_impl, device: str):
    with tf.device(device):
        return tf.reshape(t, mesh_impl.slice_shape(like.shape)[:-1] + [t.shape.as_list()[-1]])


def _plane(t, index: tuple):
    """t (N, d, h, w, c) at (axis, i) -> the plane (N, h, w, c) or (N, d, w, c); at (_D, i, j) -> the row (N, w, c)."""
    if len(index) == 3:
        return t[:, index[1], index[2]]
    return t[:, index[1]] if index[0] == _D else t[:, :, index[1]]


def _add_at(t, update, index: tuple):
    """t + update placed at `index` (as in `_plane`), in t's buffer where TensorFlow can reuse it."""
    n, d, h = t.shape.as_list()[:3]
    if len(index) == 3:
        where = [[i, index[1] % d, index[2] % h] for i in range(n)]
    elif index[0] == _D:
        where = [[i, index[1] % d] for i in range(n)]
    else:
        where = [[i, j, index[1] % h] for i in range(n) for j in range(d)]
        update = tf.reshape(update, [n * d, *update.shape.as_list()[2:]])
    return tf.tensor_scatter_nd_add(t, np.asarray(where, np.int32), update)


def _conv2d_padding(padding) -> dict:
    if isinstance(padding, str):
        return {"padding": padding}
    return {"padding": "EXPLICIT", "explicit_paddings": [p for pair in padding for p in pair]}
