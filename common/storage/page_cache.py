"""Keep a dataset's files out of the page cache, and say how far that worked.

`evict(root)` asks the kernel to drop the cached pages of every regular file under `root`
(posix_fadvise(POSIX_FADV_DONTNEED), which any user may ask of a file it can read, after fdatasync writes
back pages not yet on disk, which the kernel would keep) and then counts, with
mincore over a read-only mapping, how many of their pages are still resident. Dirty or mapped pages, and file
systems that keep files in memory (tmpfs, some overlay and network file systems), stay resident: the answer
then says `cached`, and an emulated run reports it as reading from RAM, not storage.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

METHOD = "fdatasync and posix_fadvise DONTNEED per file, checked with mincore"
RESIDENT_LIMIT = 0.01  # above this share of pages still resident after eviction, the data counts as cached


def files_under(root: str | os.PathLike) -> list[Path]:
    """The regular files under `root` (following no links), sorted."""
    return sorted(p for p in Path(root).rglob("*") if p.is_file() and not p.is_symlink())


def evict(root: str | os.PathLike) -> dict:
    """Drop the cached pages of the files under `root`; what is still resident afterwards."""
    files = files_under(root)
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # a page not yet written back cannot be dropped (fresh data)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    resident, pages = resident_pages(files)
    share = resident / pages if pages else 0.0
    return {"method": METHOD, "files": len(files), "pages": pages, "resident_pages": resident,
            "resident_share": share, "cached": share > RESIDENT_LIMIT}


def resident_pages(files: list[Path]) -> tuple[int, int]:
    """(pages resident in the page cache, pages in all) over `files`."""
    resident = total = 0
    for path in files:
        r, t = _resident(path)
        resident, total = resident + r, total + t
    return resident, total


def _resident(path: Path) -> tuple[int, int]:
    """(resident pages, pages) of one file: mincore over a read-only shared mapping of it."""
    size = path.stat().st_size
    if size == 0:
        return 0, 0
    pages = -(-size // mmap.PAGESIZE)
    libc = _libc()
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise _os_error(f"mmap of {path}")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vec) != 0:
                raise _os_error(f"mincore on {path}")
            return sum(b & 1 for b in vec), pages
        finally:
            libc.munmap(ctypes.c_void_p(address), ctypes.c_size_t(size))
    finally:
        os.close(fd)


def _os_error(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        _LIBC = libc
    return _LIBC
