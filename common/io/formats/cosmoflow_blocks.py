"""Per-block records of the CosmoFlow format for the spatial path (parallel.spatial [pd, ph]): block (i, j) of a
dataset's samples is a dataset of its own in <dataset>/blocks_<pd>x<ph>/<i>_<j>/, its manifest's source.kind
BLOCKS_KIND, written by data_prep/cosmo_blocks.py and read by cosmoflow/data.py and cosmoflow/mesh/. A reader of
the whole records may also cut each sample's block out as it decodes (tf_decode_block, dali_decode_block). The
record itself is common/io/formats/cosmoflow.py's.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from common.io.formats.cosmoflow import SAMPLE_KEY, STORED_SAMPLE_DTYPE, TARGET_KEY

BLOCKS_KIND = "cosmoflow-blocks"


def blocks_dir_name(spatial: Sequence[int]) -> str:
    """The directory below a dataset that holds its blocks for `spatial` = (pd, ph): blocks_<pd>x<ph>."""
    return f"blocks_{spatial[0]}x{spatial[1]}"


def block_dir(root: str | os.PathLike, spatial: Sequence[int], i: int, j: int) -> Path:
    """The dataset of block (i, j) of the samples of the dataset at `root`, split `spatial`."""
    return Path(root) / blocks_dir_name(spatial) / f"{i}_{j}"


def block_rows(shape: Sequence[int], spatial: Sequence[int], i: int, j: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """((depth start, stop), (height start, stop)) of block (i, j) of a sample of `shape` split `spatial`."""
    d, h = shape[0] // spatial[0], shape[1] // spatial[1]
    return (i * d, (i + 1) * d), (j * h, (j + 1) * h)


def slab_bytes(shape: Sequence[int]) -> int:
    """Bytes of one depth row (H x W x C int16 values) of a stored sample of `shape` (D, H, W, C)."""
    return int(np.prod([int(s) for s in shape[1:]])) * STORED_SAMPLE_DTYPE.itemsize


def tf_decode_block(example: dict, shape: Sequence[int], depth: tuple[int, int], height: tuple[int, int]):
    """(x, y) of a parsed record with x only depth rows depth[0]:depth[1] and height rows height[0]:height[1]
    of the counts, int16 (d, h, W, C): the depth slab is cut from the raw bytes, so only it is decoded.

    Fails (InvalidArgumentError) on a record whose payload is not the size `shape` needs.
    """
    import tensorflow as tf
    raw, row = example[SAMPLE_KEY], slab_bytes(shape)
    whole = tf.debugging.assert_equal(tf.strings.length(raw), row * int(shape[0]),
                                      message=f"a sample of shape {list(shape)} holds {row * int(shape[0])} bytes")
    with tf.control_dependencies([whole]):
        slab = tf.strings.substr(raw, depth[0] * row, (depth[1] - depth[0]) * row)
    x = tf.reshape(tf.io.decode_raw(slab, tf.int16, little_endian=True), [depth[1] - depth[0], *shape[1:]])
    return x[:, height[0]:height[1]], example[TARGET_KEY]


def dali_decode_block(record: dict, shape: Sequence[int], depth: tuple[int, int], height: tuple[int, int]):
    """`tf_decode_block` in a DALI pipeline: the depth slab's bytes are cut before they are reinterpreted."""
    import nvidia.dali.fn as fn
    from nvidia.dali import types
    row = slab_bytes(shape)
    slab = record[SAMPLE_KEY][depth[0] * row:depth[1] * row]
    x = fn.reinterpret(slab, dtype=types.INT16, shape=[depth[1] - depth[0], *(int(s) for s in shape[1:])])
    return x[:, height[0]:height[1]], record[TARGET_KEY]
