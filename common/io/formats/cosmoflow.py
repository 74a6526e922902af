"""The CosmoFlow record format, "cosmoflow-tfrecord": one record is one sub-cube of a universe, a tf.train.Example
with

  x   bytes: the int16 little-endian C-order bytes of an (n, n, n, 4) cube of particle counts (channels-last,
      one channel per redshift), every count >= 0
  y   floats: the universe's 4 target parameters (unitPar), each in [-1, 1]

The manifest says sample_shape [n, n, n, 4], sample_dtype "int16", target_size 4 and no target_shape. Written by
data_prep/cosmo_convert.py, read by cosmoflow/data.py (DALI) and cosmoflow/tfdata.py (tf.data), checked by
data_prep/validate.py. TensorFlow and DALI are imported only by the functions that build their feature specs.

This module is what training reads. Beside it: common/io/formats/cosmoflow_prep.py, what the tools that write,
index and check records need (the official release's layout, a record read without a graph, the input
statistics), and common/io/formats/cosmoflow_blocks.py, the spatial path's per-block records.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

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
LOG1P = "log1p"  # the transform input_stats describe


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


def describe(target_size: int = TARGET_SIZE) -> str:
    """What a record holds, for error messages."""
    return f"a CosmoFlow example with {SAMPLE_KEY} (bytes) and {TARGET_KEY} ({target_size} floats)"


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
