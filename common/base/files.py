"""Atomic file writes: write to a temporary name beside the target, then rename it into place, so that a
half-written file (or directory) never looks finished.

The temporary of `DIR/NAME` is `DIR/.NAME.tmp-PID`: hidden, in the same directory (so the rename is atomic on one
file system) and named after the writing process, so that a tool can tell a killed run's leftovers from a live
writer's, or delete them all before it starts again.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

TEMP_MARK = ".tmp-"


def temp_path(final: str | os.PathLike) -> Path:
    """The temporary name `final` is written under before it is renamed into place (same directory)."""
    final = Path(final)
    return final.with_name(f".{final.name}{TEMP_MARK}{os.getpid()}")


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `final` for the block to write (a file or a directory); rename it to
    `final` when the block succeeds, remove it when the block raises.

    A directory replaces an existing `final` directory whole (the old one is deleted just before the rename).
    The parent directory is created when missing.
    """
    final = check_target(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(final)
    remove_path(tmp)  # a leftover of an earlier process that had this pid
    try:
        yield tmp
        if tmp.is_dir() and not tmp.is_symlink() and final.is_dir():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        remove_path(tmp)  # still there only when the block or the rename failed


def check_target(final: str | os.PathLike) -> Path:
    """`final` as a Path, refused (BenchError) when the rename would replace something other than a file or a
    directory (a device such as /dev/null, a socket, a pipe) or when it names no entry (/, ., ..)."""
    from common.base.errors import BenchError
    path = Path(final)
    if path.name in ("", ".", ".."):
        raise BenchError(f"{final}: names no file to write (expected a path ending in a file name)")
    if path.exists() and not (path.is_file() or path.is_dir()):
        raise BenchError(f"{final}: exists and is neither a file nor a directory (a device, pipe or socket); "
                         f"expected a path to write a file at")
    return path


def remove_path(path: str | os.PathLike) -> None:
    """Delete a file, link or directory tree if it exists."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def write_json_atomic(obj: dict, path: str | os.PathLike, indent: int | None = 2) -> Path:
    """Write JSON to a temporary name beside `path`, then rename it into place (`indent` None: compact, and
    written by the C encoder, several times faster for large objects)."""
    return write_text_atomic(json.dumps(obj, indent=indent, default=float) + "\n", path)


def write_text_atomic(text: str, path: str | os.PathLike) -> Path:
    """Write `text` to a temporary name beside `path`, then rename it into place."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return path


RAM_FILESYSTEMS = {0x01021994: "tmpfs", 0x858458F6: "ramfs"}  # statfs f_type magic numbers (linux/magic.h)


def ram_filesystem(path: str | os.PathLike) -> str:
    """"tmpfs" or "ramfs" when the resolved `path` lies on a file system held in RAM (statfs's f_type), else ""
    (a path that does not exist, or a system without statfs, counts as not in RAM)."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return ""
    buf = ctypes.create_string_buffer(256)  # struct statfs (120 bytes on 64-bit Linux); f_type comes first
    if libc.statfs(os.fsencode(os.path.realpath(path)), buf) != 0:
        return ""
    return RAM_FILESYSTEMS.get(ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF, "")
