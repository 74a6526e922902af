"""The copier of staging: copy a file, or a byte range of one, and check its digest, in Python.

Plain staging copies whole files with it; unpacking an uncompressed archive copies each member's byte range
of the archive. The digest is xxh3-128 (the `xxhash` package) or sha256 for manifests written before
converters recorded xxh3-128. The work on the bytes (the system calls, xxhash, hashlib on buffers this
large) releases the interpreter lock, so copying threads run in parallel. Three methods:

- `read` (staging's): `os.preadv` into the thread's buffer, hash it, write it; the digest is that of the
  bytes written. For any file system.
- `mmap`: map the source, hash and write from the map (no copy into a buffer).
- `kernel`: map the source and hash it while the kernel copies it (`os.copy_file_range`, or `os.sendfile`
  between file systems): the bytes never pass through a Python buffer.

benchmarks/copier_compare.py measured them, side by side with a C copier (XXH3 from libxxhash, since
removed) and cp -r / tar -x: `read` was the fastest method with the least CPU per GB on tmpfs and ext4
where the machine was quiet, and the C copier beat the best Python method by more than 10% only in cases
where Python already reached the staging goal.

`copy_batch` copies, checks and renames a list of `Job`s, stopping at the first failure, which it returns
as a `Failure` (that job's temporary copy is removed; the jobs before it are in place). A failure to write the
copy (a full disk: ENOSPC) is told apart from a failure to read the source; `write_error` words it with the
errno's name and the free space left. `digest_file` hashes a staged file again (staging's reuse).
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import hashlib
import mmap
import os
import shutil
from pathlib import Path

from common.base.errors import BenchError

# Bytes per read, hash and write: the interpreter's work per piece (a few microseconds) is noise at this size,
# and the piece is still in a core's cache when it is hashed and written.
BUFFER_BYTES = 1 << 20
METHODS = ("read", "mmap", "kernel")
KINDS = ("xxh3_128", "sha256")
SIZE_MISMATCH, DIGEST_MISMATCH = -1, -2  # Failure codes of a copy that is not what was expected
SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # a write that failed for want of space (or of quota)
WRITE_STEP = "write the copy"


@dataclasses.dataclass(frozen=True)
class Job:
    """Copy `length` bytes of `src` from `offset` (-1: to its end) to `tmp`, expect `size` bytes whose
    `kind` digest is `digest` (hex), then rename `tmp` to `final`."""

    src: str
    offset: int
    length: int
    tmp: str
    final: str
    size: int
    digest: str
    kind: str = "xxh3_128"


@dataclasses.dataclass(frozen=True)
class Failure:
    """Which job of a batch failed and how: `code` is an errno value (with `message`), SIZE_MISMATCH or
    DIGEST_MISMATCH (with what the copy had: `size` bytes, hex `digest`). `path`: the file being written when
    an errno failure was one of writing the copy (creating, writing, closing or renaming it); "" otherwise."""

    index: int
    code: int
    message: str
    size: int
    digest: str
    path: str = ""


class CopyError(Exception):
    """A copy that failed at one step: `code` is an errno value, `message` names the step, `writing` says
    whether the step wrote the copy (else it read the source)."""

    def __init__(self, code: int, message: str, writing: bool = False):
        super().__init__(message)
        self.code, self.message, self.writing = code, message, writing


@dataclasses.dataclass(frozen=True)
class Copier:
    """The copier with one method (one of METHODS) and a buffer size, as staging calls it."""

    method: str = "read"
    buffer_bytes: int = BUFFER_BYTES
    name: str = "python"

    def __post_init__(self):
        check_method(self.method)
        if self.buffer_bytes < 1:
            raise BenchError(f"copy buffer of {self.buffer_bytes} bytes: expected at least 1")

    def copy(self, src, dst, buffer, offset: int = 0, length: int = -1, kind: str = "xxh3_128") -> tuple[str, int]:
        """See the module's `copy`."""
        return copy(src, dst, buffer, offset, length, kind, self.method)

    def copy_batch(self, jobs: list[Job], buffer) -> Failure | None:
        """See the module's `copy_batch`."""
        return copy_batch(jobs, buffer, self.method)


def check_method(method: str) -> None:
    """Raise BenchError unless `method` is one of METHODS."""
    if method not in METHODS:
        raise BenchError(f"copy method {method!r}: expected one of {list(METHODS)}")


def hasher(kind: str):
    """A new digest object of `kind` (one of KINDS)."""
    if kind == "xxh3_128":
        import xxhash
        return xxhash.xxh3_128()
    if kind == "sha256":
        return hashlib.sha256()
    raise BenchError(f"checksum kind {kind!r}: expected one of {list(KINDS)}")


def copy(src: str | os.PathLike, dst: str | os.PathLike, buffer, offset: int = 0, length: int = -1,
         kind: str = "xxh3_128", method: str = "read") -> tuple[str, int]:
    """Copy `length` bytes of `src` from `offset` (-1: to its end) to `dst` (created or truncated) by
    `method`, reading through `buffer` (one per thread, reused); returns the hex `kind` digest of the bytes
    and their count.

    Raises BenchError naming both files and the step that failed, or the sizes when `src` is too short.
    """
    check_method(method)
    try:
        return _copy(os.fspath(src), os.fspath(dst), memoryview(buffer), offset, length, hasher(kind), method)
    except CopyError as err:
        raise BenchError(f"copying {src} to {dst}: {err.message} (errno {err.code})") from None


def digest_file(path: str | os.PathLike, kind: str, buffer) -> tuple[str, int]:
    """The hex `kind` digest of a whole file and its size, read through `buffer` (one per thread, reused).
    Raises OSError as reading it does."""
    digest, view, size = hasher(kind), memoryview(buffer), 0
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        while got := os.readv(fd, [view]):
            digest.update(view[:got])
            size += got
    finally:
        os.close(fd)
    return digest.hexdigest(), size


def write_error(path: str | os.PathLike, code: int, context: str = "") -> str:
    """What a failed write of `path` says: the errno's message and name, and the free space of the file system
    it is on; a full disk (or quota) also says what to do. `context` (e.g. which archive and member) leads."""
    name = errno.errorcode.get(code, f"errno {code}")
    text = f"{context}: " if context else ""
    text += f"cannot write {path}: {os.strerror(code)} [{name}]; {free_space(path)}"
    if code in SPACE_ERRNOS:
        text += "; free space there or stage elsewhere (data.stage_dir, or --stage-dir of data_prep stage)"
    return text


@contextlib.contextmanager
def writing(path: str | os.PathLike, context: str = ""):
    """A block that writes `path` (and reads nothing): an OSError it raises becomes a BenchError worded by
    `write_error`."""
    try:
        yield
    except OSError as err:
        raise BenchError(write_error(path, err.errno or errno.EIO, context)) from None


def free_space(path: str | os.PathLike) -> str:
    """'N GB (n bytes) free on the file system of DIR', DIR the nearest existing directory above `path`."""
    where = Path(path).parent
    while not where.is_dir() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError as err:
        return f"the free space of {where} is unknown ({err.strerror})"
    return f"{free / 1e9:.2f} GB ({free} bytes) free on the file system of {where}"


def copy_batch(jobs: list[Job], buffer, method: str = "read") -> Failure | None:
    """Copy every job in order, each checked and renamed to its final name; stop at the first failure,
    leaving no temporary copy of it, and return what failed, or None when every job is done."""
    check_method(method)
    view = memoryview(buffer)
    for index, job in enumerate(jobs):
        failure = _run_job(index, job, view, method)
        if failure is not None:
            try:
                os.unlink(job.tmp)
            except OSError:
                pass
            return failure
    return None


def _run_job(index: int, job: Job, view: memoryview, method: str) -> Failure | None:
    try:
        digest, size = _copy(job.src, job.tmp, view, job.offset, job.length, hasher(job.kind), method)
    except CopyError as err:
        return Failure(index, err.code, err.message, 0, "", job.tmp if err.writing else "")
    if size != job.size:
        return Failure(index, SIZE_MISMATCH, f"{size} bytes, expected {job.size}", size, digest)
    if digest != job.digest:
        return Failure(index, DIGEST_MISMATCH, f"{job.kind} {digest}, expected {job.digest}", size, digest)
    try:
        os.replace(job.tmp, job.final)
    except OSError as err:
        return Failure(index, err.errno or errno.EIO, f"cannot rename the copy to {job.final}: {err.strerror}",
                       size, digest, job.final)
    return None


def _copy(src: str, dst: str, view: memoryview, offset: int, length: int, digest, method: str) -> tuple[str, int]:
    """The copy of `copy`, raising CopyError."""
    fd_in = _open(src, os.O_RDONLY, "open the source")
    try:
        total = _call(os.fstat, "stat the source", fd_in).st_size
        want = max(total - offset, 0) if length < 0 else length
        if offset + want > total:
            raise CopyError(errno.EIO, f"the source has {total} bytes, too few for {want} bytes from offset "
                                       f"{offset}; it is truncated")
        fd_out = _open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "create the copy", writing=True)
        try:
            if method == "read":
                _pump_read(fd_in, fd_out, offset, want, view, digest)
            elif want:
                _pump_mapped(fd_in, fd_out, offset, want, len(view), digest, method == "kernel")
        finally:
            _call(os.close, "close the copy", fd_out, writing=True)
    finally:
        os.close(fd_in)
    return digest.hexdigest(), want


def _open(path: str, flags: int, step: str, writing: bool = False) -> int:
    return _call(os.open, step, path, flags | os.O_CLOEXEC, 0o644, writing=writing)


def _call(function, step: str, *args, writing: bool = False):
    """function(*args), an OSError turned into a CopyError naming `step` (`writing`: a step on the copy)."""
    try:
        return function(*args)
    except OSError as err:
        raise CopyError(err.errno or errno.EIO, f"cannot {step}: {err.strerror}", writing) from None


def _pump_read(fd_in: int, fd_out: int, offset: int, length: int, view: memoryview, digest) -> None:
    """Read [offset, offset + length) of `fd_in` piece by piece into `view`, hash and write each piece."""
    done, chunk, step = 0, len(view), "read the source"
    try:
        while done < length:
            step = "read the source"
            got = os.preadv(fd_in, [view[:min(chunk, length - done)]], offset + done)
            if not got:
                raise CopyError(errno.EIO, f"cannot read the source (it ended early: {done} of {length} bytes "
                                           f"from offset {offset} read)")
            piece = view[:got]
            digest.update(piece)
            step = WRITE_STEP
            _write_all(fd_out, piece)
            done += got
    except OSError as err:
        raise CopyError(err.errno or errno.EIO, f"cannot {step}: {err.strerror}", step == WRITE_STEP) from None


def _write_all(fd: int, piece: memoryview) -> None:
    """Write all of `piece`: a short write (a disk filling up) is followed by another, which raises ENOSPC."""
    while piece:
        piece = piece[os.write(fd, piece):]


def _pump_mapped(fd_in: int, fd_out: int, offset: int, length: int, chunk: int, digest, in_kernel: bool) -> None:
    """Hash [offset, offset + length) of `fd_in` through a read-only map, `chunk` bytes at a time, and write
    each piece from the map, or have the kernel copy it (`in_kernel`)."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY  # a map starts at a multiple of this
    mapped = _call(functools.partial(mmap.mmap, access=mmap.ACCESS_READ, offset=start), "map the source", fd_in,
                   offset - start + length)
    step = "read the source"
    try:
        mapped.madvise(mmap.MADV_SEQUENTIAL)
        with memoryview(mapped) as view:
            for at in range(offset - start, offset - start + length, chunk):
                with view[at:min(at + chunk, offset - start + length)] as piece:
                    step = "read the source"
                    digest.update(piece)
                    step = WRITE_STEP
                    if in_kernel:
                        _kernel_copy(fd_in, fd_out, start + at, len(piece))
                    else:
                        _write_all(fd_out, piece)
    except OSError as err:
        raise CopyError(err.errno or errno.EIO, f"cannot {step}: {err.strerror}", step == WRITE_STEP) from None
    finally:
        mapped.close()


def _kernel_copy(fd_in: int, fd_out: int, offset: int, count: int) -> None:
    """Append `count` bytes of `fd_in` from `offset` to `fd_out` inside the kernel: copy_file_range, or
    sendfile where that is refused (between file systems of different types: EXDEV)."""
    while count:
        try:
            done = os.copy_file_range(fd_in, fd_out, count, offset)
        except OSError as err:
            if err.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            done = os.sendfile(fd_out, fd_in, offset, count)
        if not done:  # a read-side failure, though it shows in the step that writes
            raise CopyError(errno.EIO, "cannot read the source (it ended early)")
        offset, count = offset + done, count - done
