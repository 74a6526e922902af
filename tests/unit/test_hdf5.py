"""common.io.hdf5: errors raised inside h5py become a BenchError naming the file; the reader's own pass through."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from common.base.errors import BenchError
from common.io.hdf5 import open_file, raised_by_h5py, reading


def _damaged(path, offset: int = 16, value: int = 0xFF):
    """A small HDF5 file with one byte of its metadata changed (h5py then raises RuntimeError on lookups)."""
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(8)
    data = bytearray(path.read_bytes())
    data[offset] = value
    path.write_bytes(bytes(data))
    return path


def test_h5py_errors_name_the_file(tmp_path):
    path = _damaged(tmp_path / "d.h5")
    with pytest.raises(RuntimeError) as raw:  # what h5py itself raises for this file
        with h5py.File(path, "r") as f:
            "x" in f
    assert raised_by_h5py(raw.value)
    with pytest.raises(BenchError, match=f"{path}: not a readable HDF5 file \\(.*\\); it is truncated, corrupt"):
        with reading(path), h5py.File(path, "r") as f:
            "x" in f
    (tmp_path / "text.h5").write_text("not HDF5")
    with pytest.raises(BenchError, match=f"{tmp_path / 'text.h5'}: not a readable stats file"):
        open_file(tmp_path / "text.h5", "stats file")


def test_the_readers_own_errors_pass_through(tmp_path):
    with pytest.raises(KeyError, match="mine"):
        with reading(tmp_path / "any.h5"):
            raise KeyError("mine")
    with pytest.raises(BenchError, match="^checked$"):
        with reading(tmp_path / "any.h5"):
            raise BenchError("checked")
