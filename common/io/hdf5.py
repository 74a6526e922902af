"""Reading HDF5 files so that a damaged file gives a BenchError naming it.

A truncated or corrupted HDF5 file makes h5py raise whatever the HDF5 library's error maps to: OSError,
RuntimeError ("bad symbol table node signature"), KeyError ("bad object header version number"), ValueError
or TypeError (a corrupted datatype), at the open, at a lookup or at a read. Readers wrap their whole use of a
file in `reading(path)`, which turns exactly those raised inside h5py into a BenchError; the same exception
types raised by the reader's own code pass through unchanged.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from common.base.errors import BenchError

_H5PY_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)


@contextmanager
def reading(path: str | os.PathLike, what: str = "HDF5 file") -> Iterator[None]:
    """Turn an h5py error inside the block into `BenchError("<path>: not a readable <what> (...)")`."""
    try:
        yield
    except _H5PY_ERRORS as err:
        if not raised_by_h5py(err):
            raise
        detail = str(err).strip("'\"") or type(err).__name__
        raise BenchError(f"{path}: not a readable {what} ({detail}); it is truncated, corrupt or not HDF5") from None


def open_file(path: str | os.PathLike, what: str = "HDF5 file"):
    """h5py.File(path, "r"), with a BenchError naming the file when it cannot be opened."""
    import h5py
    with reading(path, what):
        return h5py.File(path, "r")


def raised_by_h5py(err: BaseException) -> bool:
    """Whether the innermost frame of `err`'s traceback is h5py code (its Python or Cython modules)."""
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return "h5py" in Path(tb.tb_frame.f_code.co_filename).parts
