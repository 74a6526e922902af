"""The CosmoFlow record format, "cosmoflow-tfrecord": one record is one sub-cube of a universe, a tf.train.Example
with

  x   bytes: the int16 little-endian C-order bytes of an (n, n, n, 4) cube of particle counts (channels-last,
      one channel per redshift), every count >= 0
  y   floats: the universe's 4 target parameters (unitPar), each in [-1, 1]

The manifest says sample_shape [n, n, n, 4], sample_dtype "int16", target_size 4 and no target_shape.
Written by data_prep/cosmo_convert.py, read by cosmoflow/data.py (tf.data and DALI), checked by
data_prep/validate.py. TensorFlow and DALI are imported only by the functions that build their feature specs.

The official release (cosmoUniverse_2019_05_4parE_tf_v2, made by the reference's prepare.py) holds the same
records in another layout, described by the RELEASED_* names below: one record per file, GZIP-compressed,
files named after their universe and sub-cube, in train/ and validation/ (or val/) directories.
`python -m data_prep index` describes such a directory with a manifest of this format; docs/datasets.md.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from common.io.formats import TRAIN, VALIDATION

if TYPE_CHECKING:
    from common.io.manifest import Manifest

FORMAT = "cosmoflow-tfrecord"
VERSION = 1
SAMPLE_KEY, TARGET_KEY = "x", "y"
SAMPLE_DTYPE = "int16"  # the manifest's name; stored little-endian
STORED_SAMPLE_DTYPE = np.dtype("<i2")
STORED_TARGET_DTYPE = np.dtype("<f4")  # a FloatList holds float32
CHANNELS = 4
TARGET_SIZE = 4
TARGET_RANGE = (-1.0, 1.0)  # unitPar: cosmo-synth maps each parameter's prior range linearly onto it

# The official release's layout (the reference's prepare.py and data/cosmo.py, mlcommons/hpc cosmoflow/).
RELEASED_SOURCE_KIND = "cosmoflow-released"  # the manifest's source.kind for an indexed release
RELEASED_SUFFIX = ".tfrecord"
RELEASED_COMPRESSION = "gzip"  # the v2 release (prepare.py --gzip); the v0.7 one was uncompressed
RELEASED_RECORDS_PER_FILE = 1
# Directory names each split has had in the releases and their readers, first the reference loader's.
RELEASED_SPLIT_DIRS = {TRAIN: ("train",), VALIDATION: ("validation", "val")}
RELEASED_IGNORED_DIRS = ("test",)  # listed in the v2 release's description; no benchmark reads it
LOG1P = "log1p"  # the transform input_stats describe


# Per-block records for the spatial path (data_prep/cosmo_blocks.py): block (i, j) of a dataset's samples for
# parallel.spatial [pd, ph] is a dataset of its own in <dataset>/blocks_<pd>x<ph>/<i>_<j>/, its manifest's
# source.kind BLOCKS_KIND.
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


def released_file_name(parent: str, universe: str, sub_cube: int) -> str:
    """The name prepare.py gives sub-cube `sub_cube` (C order over the grid of cubes) of universe file
    `parent/universe.hdf5`: `<parent>_<universe>_<sub_cube:03d>.tfrecord`."""
    return f"{parent}_{universe}_{sub_cube:03d}{RELEASED_SUFFIX}"


def sample_bytes(n: int) -> int:
    """Bytes of the `x` feature of a cube of edge n."""
    return n ** 3 * CHANNELS * STORED_SAMPLE_DTYPE.itemsize


def edge_of(sample_nbytes: int) -> int | None:
    """The edge n of the cube whose `x` feature has `sample_nbytes` bytes, or None when no cube has that size."""
    cells = sample_nbytes // (CHANNELS * STORED_SAMPLE_DTYPE.itemsize)
    n = round(cells ** (1 / 3)) if cells > 0 else 0
    return n if n > 0 and sample_bytes(n) == sample_nbytes else None


def sample_shape(n: int) -> tuple[int, int, int, int]:
    """(n, n, n, 4): the shape of a sub-cube of edge n."""
    return n, n, n, CHANNELS


def record_features(cube: np.ndarray, target: Sequence[float]) -> dict[str, bytes | np.ndarray]:
    """The features of one record, for `serialize_example`: the cube's bytes and the float32 target."""
    # ascontiguousarray first: tobytes() of a strided view is an order of magnitude slower.
    return {SAMPLE_KEY: np.ascontiguousarray(cube, dtype=STORED_SAMPLE_DTYPE).tobytes(),
            TARGET_KEY: np.asarray(target, dtype=np.float32)}


def layout_problem(manifest: Manifest) -> tuple[str, str] | None:
    """(found, expected) when the manifest describes samples this format does not have, else None."""
    if manifest.sample_dtype == SAMPLE_DTYPE and len(manifest.sample_shape) == 4 and not manifest.target_shape:
        return None
    return (f"sample_dtype {manifest.sample_dtype!r}, sample_shape {list(manifest.sample_shape)}, target_shape "
            f"{manifest.target_shape}", f"{SAMPLE_DTYPE!r} counts of shape [n, n, n, {CHANNELS}] and a vector "
            f"target (no target_shape)")


# ---------------------------------------------------------------------------- input statistics
def log1p_moments(counts: np.ndarray) -> np.ndarray:
    """(3, C) float64: cell count, sum and sum of squares of log(1 + counts) per channel (channels last).

    Counts must be integers >= 0 (callers check, naming the file). Computed from the histogram of each channel's
    counts and a table of log1p: several times faster than log1p of every cell for int16 counts.
    """
    flat = counts.reshape(-1, counts.shape[-1])  # (cells, C)
    hists = [np.bincount(flat[:, c]) for c in range(flat.shape[1])]  # bincount takes the strided column as it is
    top = max(1, *(len(h) for h in hists))
    hist = np.zeros((top, flat.shape[1]))
    for c, h in enumerate(hists):
        hist[:len(h), c] = h
    table = _log1p_table(1 << (top - 1).bit_length())[:top]  # a power of two: few tables, cached
    return np.stack([hist.sum(axis=0), table @ hist, np.square(table) @ hist])


@functools.lru_cache(maxsize=64)
def _log1p_table(size: int) -> np.ndarray:
    """log1p(0 .. size - 1) in float64 (read-only: shared between the threads that index files)."""
    table = np.log1p(np.arange(size, dtype=np.float64))
    table.flags.writeable = False
    return table


def input_stats(moments: np.ndarray, split: str, extent: dict) -> dict:
    """The manifest's input_stats from summed `log1p_moments`: per-channel mean and std of log(1 + counts) over
    `split`, with `extent` (what they were computed over, e.g. {"universes": 3}) recorded after the split."""
    count, total, squares = moments  # each (C,)
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean ** 2, 0.0))
    return {"transform": LOG1P, "split": split, **extent, "cells_per_channel": int(count[0]),
            "mean": [round(float(m), 6) for m in mean], "std": [round(float(v), 6) for v in std]}


def describe(target_size: int = TARGET_SIZE) -> str:
    """What a record holds, for error messages."""
    return f"a CosmoFlow example with {SAMPLE_KEY} (bytes) and {TARGET_KEY} ({target_size} floats)"


def example_class():
    """TensorFlow's tf.train.Example message class (TensorFlow is imported, quietly, on the first call)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tensorflow.core.example import example_pb2
    return example_pb2.Example


def parse_record(payload: bytes) -> tuple[bytes, np.ndarray]:
    """(x bytes, y as float32) of a serialized record, through TensorFlow's Example class (imported here).

    Raises ValueError saying what the payload lacks: no Example, no bytes `x`, no float `y`.
    """
    from google.protobuf.message import DecodeError
    try:
        features = example_class().FromString(payload).features.feature
    except DecodeError as err:
        raise ValueError(f"{len(payload)} bytes that are not a tf.train.Example ({err})") from None
    x, y = features.get(SAMPLE_KEY), features.get(TARGET_KEY)
    if x is None or x.WhichOneof("kind") != "bytes_list" or len(x.bytes_list.value) != 1:
        raise ValueError(f"features {sorted(features)} with no single bytes value {SAMPLE_KEY!r}")
    if y is None or y.WhichOneof("kind") != "float_list":
        raise ValueError(f"features {sorted(features)} with no float list {TARGET_KEY!r}")
    return x.bytes_list.value[0], np.asarray(y.float_list.value, dtype=STORED_TARGET_DTYPE)


# ---------------------------------------------------------------------------- readers' feature specs
def tf_features(target_size: int = TARGET_SIZE) -> dict:
    """The tf.io feature spec of a record."""
    import tensorflow as tf
    return {SAMPLE_KEY: tf.io.FixedLenFeature([], tf.string),
            TARGET_KEY: tf.io.FixedLenFeature([target_size], tf.float32)}


def tf_decode(example: dict, shape: Sequence[int]):
    """(x, y) of a parsed record: (n, n, n, 4) int16 counts and the (target_size,) float32 target.

    The reshape fails on a record of the wrong size.
    """
    import tensorflow as tf
    x = tf.io.decode_raw(example[SAMPLE_KEY], tf.int16, little_endian=True)
    return tf.reshape(x, [int(s) for s in shape]), example[TARGET_KEY]


def dali_features(target_size: int = TARGET_SIZE) -> dict:
    """The DALI `fn.readers.tfrecord` feature spec of a record."""
    import nvidia.dali.tfrecord as tfrec
    return {SAMPLE_KEY: tfrec.FixedLenFeature((), tfrec.string, ""),
            TARGET_KEY: tfrec.FixedLenFeature([target_size], tfrec.float32, 0.0)}


def dali_decode(record: dict, shape: Sequence[int]):
    """(x, y) of a DALI reader's record: (n, n, n, 4) int16 counts and the float32 target."""
    import nvidia.dali.fn as fn
    from nvidia.dali import types
    return fn.reinterpret(record[SAMPLE_KEY], dtype=types.INT16, shape=list(shape)), record[TARGET_KEY]


# ---------------------------------------------------------------------------- one block of each sample
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
