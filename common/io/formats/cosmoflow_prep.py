"""What the tools that write, index and check CosmoFlow records need beside the record format
(common/io/formats/cosmoflow.py), which training reads: the official release's layout, a record read without a
TensorFlow graph, and the input statistics a manifest records.

The official release (cosmoUniverse_2019_05_4parE_tf_v2, made by the reference's prepare.py) holds the same
records in another layout, described by the RELEASED_* names below: one record per file, GZIP-compressed,
files named after their universe and sub-cube, in train/ and validation/ (or val/) directories.
`python -m data_prep index` describes such a directory with a manifest of the format; docs/datasets.md.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from common.io.formats import TRAIN, VALIDATION
from common.io.formats.cosmoflow import (CHANNELS, LOG1P, SAMPLE_KEY, STORED_SAMPLE_DTYPE, STORED_TARGET_DTYPE,
                                         TARGET_KEY)

# The official release's layout (the reference's prepare.py and data/cosmo.py, mlcommons/hpc cosmoflow/).
RELEASED_SOURCE_KIND = "cosmoflow-released"  # the manifest's source.kind for an indexed release
RELEASED_SUFFIX = ".tfrecord"
RELEASED_COMPRESSION = "gzip"  # the v2 release (prepare.py --gzip); the v0.7 one was uncompressed
RELEASED_RECORDS_PER_FILE = 1
# Directory names each split has had in the releases and their readers, first the reference loader's.
RELEASED_SPLIT_DIRS = {TRAIN: ("train",), VALIDATION: ("validation", "val")}
RELEASED_IGNORED_DIRS = ("test",)  # listed in the v2 release's description; no benchmark reads it


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
