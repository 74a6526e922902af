"""The DeepCAM record format, "deepcam-tfrecord": one record is one snapshot, a tf.train.Example with

  data    bytes: the float32 little-endian C-order bytes of the (H, W, 16) channels-last fields, all finite
  label   bytes: the uint8 bytes of the (H, W) class map, each 0 (background), 1 (tropical cyclone) or
          2 (atmospheric river)

The manifest says sample_shape [H, W, 16], sample_dtype "float32", target_shape [H, W], target_dtype "uint8",
and lists the auxiliary file stats.h5 (group `climate`: count, mean, sqmean, minval, maxval, each (16,)), the
per-channel statistics the loader normalises with. Written by data_prep/deepcam_convert.py, read by
deepcam/data.py (tf.data and DALI), checked by data_prep/validate.py. TensorFlow, DALI and h5py are imported only
by the functions that use them.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

import numpy as np

from common.base.errors import BenchError
from common.io.hdf5 import open_file, reading

if TYPE_CHECKING:
    from common.io.manifest import Manifest

FORMAT = "deepcam-tfrecord"
VERSION = 1
SAMPLE_KEY, TARGET_KEY = "data", "label"
SAMPLE_DTYPE, TARGET_DTYPE = "float32", "uint8"  # the manifest's names; the fields are stored little-endian
STORED_SAMPLE_DTYPE, STORED_TARGET_DTYPE = np.dtype("<f4"), np.dtype("u1")
CHANNELS = 16
CLASSES = (0, 1, 2)  # background, tropical cyclone, atmospheric river
STATS_NAME = "stats.h5"  # beside the splits; the manifest's aux file "stats"
STATS_AUX = "stats"
STATS_GROUP = "climate"
STATS_KEYS = ("count", "mean", "sqmean", "minval", "maxval")  # each (CHANNELS,)


def sample_shape(height: int, width: int) -> tuple[int, int, int]:
    """(H, W, 16): the shape of one snapshot's fields."""
    return height, width, CHANNELS


def record_features(fields: np.ndarray, labels: np.ndarray) -> dict[str, bytes]:
    """The features of one record, for `serialize_example`: (H, W, 16) fields and (H, W) class ids."""
    return {SAMPLE_KEY: np.ascontiguousarray(fields, dtype=STORED_SAMPLE_DTYPE).tobytes(),
            TARGET_KEY: np.ascontiguousarray(labels, dtype=STORED_TARGET_DTYPE).tobytes()}


def layout_problem(manifest: Manifest) -> tuple[str, str] | None:
    """(found, expected) when the manifest describes samples this format does not have, else None."""
    shape, target_shape = tuple(manifest.sample_shape), tuple(manifest.target_shape or ())
    if (manifest.sample_dtype == SAMPLE_DTYPE and len(shape) == 3 and manifest.target_dtype == TARGET_DTYPE
            and target_shape == shape[:2]):
        return None
    h_w = f"{shape[0]}, {shape[1]}" if len(shape) == 3 else "H, W"
    return (f"sample_dtype {manifest.sample_dtype!r}, sample_shape {list(shape)}, target {manifest.target_dtype} "
            f"{manifest.target_shape}", f"{SAMPLE_DTYPE!r} fields of shape [{h_w}, {CHANNELS}] and a "
            f"{TARGET_DTYPE!r} [{h_w}] label map")


def describe() -> str:
    """What a record holds, for error messages."""
    return f"a DeepCAM example with {SAMPLE_KEY!r} and {TARGET_KEY!r} bytes"


def feature_bytes(shape: Sequence[int]) -> dict[str, int]:
    """Bytes of each feature of a record of samples of `shape` (H, W, 16)."""
    height, width, channels = (int(s) for s in shape)
    return {SAMPLE_KEY: height * width * channels * STORED_SAMPLE_DTYPE.itemsize,
            TARGET_KEY: height * width * STORED_TARGET_DTYPE.itemsize}


# ---------------------------------------------------------------------------- readers' feature specs
def tf_features() -> dict:
    """The tf.io feature spec of a record."""
    import tensorflow as tf
    return {SAMPLE_KEY: tf.io.FixedLenFeature([], tf.string), TARGET_KEY: tf.io.FixedLenFeature([], tf.string)}


def tf_decode(example: dict, shape: Sequence[int]):
    """(x, y) of a parsed record: (H, W, 16) float32 fields and (H, W) uint8 labels.

    The reshapes fail on a record of the wrong size.
    """
    import tensorflow as tf
    height, width, channels = (int(s) for s in shape)
    x = tf.io.decode_raw(example[SAMPLE_KEY], tf.float32, little_endian=True)
    y = tf.io.decode_raw(example[TARGET_KEY], tf.uint8)
    return tf.reshape(x, [height, width, channels]), tf.reshape(y, [height, width])


def dali_features() -> dict:
    """The DALI `fn.readers.tfrecord` feature spec of a record."""
    import nvidia.dali.tfrecord as tfrec
    return {SAMPLE_KEY: tfrec.FixedLenFeature((), tfrec.string, ""),
            TARGET_KEY: tfrec.FixedLenFeature((), tfrec.string, "")}


def dali_decode(record: dict, shape: Sequence[int]):
    """(x, y) of a DALI reader's record: (H, W, 16) float32 fields and (H, W) uint8 labels."""
    import nvidia.dali.fn as fn
    from nvidia.dali import types
    height, width, channels = (int(s) for s in shape)
    x = fn.reinterpret(record[SAMPLE_KEY], dtype=types.FLOAT, shape=[height, width, channels])
    y = fn.reinterpret(record[TARGET_KEY], dtype=types.UINT8, shape=[height, width])
    return x, y


# ---------------------------------------------------------------------------- stats.h5
def read_stats(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The per-channel statistics of a stats.h5 file: name -> (16,) float64, checked finite."""
    import h5py
    expected = ", ".join(f"{STATS_GROUP}/{k}" for k in STATS_KEYS) + f", each of shape ({CHANNELS},)"
    with reading(path), open_file(path) as f:
        group = f.get(STATS_GROUP)
        if not isinstance(group, h5py.Group):
            raise BenchError(f"{path}: no group {STATS_GROUP!r} (found {sorted(f.keys(), key=str)}); expected "
                             f"{expected}")
        return {key: _stats_values(group, key, path, expected) for key in STATS_KEYS}


def _stats_values(group, key: str, path: str | os.PathLike, expected: str) -> np.ndarray:
    import h5py
    values = group.get(key)
    if not isinstance(values, h5py.Dataset):
        raise BenchError(f"{path}: no dataset '{STATS_GROUP}/{key}' (found {sorted(group.keys(), key=str)}); "
                         f"expected {expected}")
    if values.shape != (CHANNELS,) or values.dtype.kind not in "iuf":
        raise BenchError(f"{path}: {STATS_GROUP}/{key} is {values.dtype} with shape {values.shape}, expected "
                         f"({CHANNELS},) numbers, one per channel")
    array = np.asarray(values[()], dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise BenchError(f"{path}: {STATS_GROUP}/{key} is {array.tolist()}, expected finite numbers")
    return array
