"""The native copier of staging: copy a file, or a byte range of one, and hash it (XXH3-128) outside
the interpreter. Plain staging copies whole files with it; unpacking an uncompressed archive copies each
member's byte range.

`common/native/stagecopy.c` is compiled by `python -m common.nativecopy --build` (scripts/setup.sh does
this; it needs gcc and the xxhash header, Debian's libxxhash-dev) into `common/native/_stagecopy.so`. On
x86-64 it is linked to libxxhash and hashes with the library's run-time dispatch (the widest vector unit
the CPU has); where that does not build, XXH3 is compiled in from the header.
`load()` returns a `NativeCopier`, or None when the library has not been built, in which case staging
copies (and unpacks) in Python (slower: every thread takes turns at the interpreter) and says so in its report.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import functools
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common.errors import BenchError

NATIVE_DIR = Path(__file__).resolve().parent / "native"
SOURCE = NATIVE_DIR / "stagecopy.c"
LIBRARY = NATIVE_DIR / "_stagecopy.so"
COMPILE = ["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror"]
DISPATCH = ["-DSTAGE_XXH_DISPATCH", "-lxxhash"]  # x86-64: XXH3 vector code chosen at run time
ERR_BYTES = 512
# The read buffer staging gives each copying thread: small enough to stay in a core's L2 cache between the
# read, the hash and the write of each piece (4 MiB went out to L3 and back; docs/performance.md).
BUFFER_BYTES = 256 << 10
SIZE_MISMATCH, DIGEST_MISMATCH = -1, -2  # stage_copy_batch's codes for a copy that is not what was expected


Digest = ctypes.c_ubyte * 16


class BatchJob(ctypes.Structure):
    """One file of `copy_batch`: copy `length` bytes of `src` from `offset` (-1: to its end) to `tmp`, expect
    `size` bytes with XXH3-128 `digest` (canonical bytes), rename to `final`. The layout of `struct
    stage_job` in stagecopy.c; `got_size` and `got_digest` are filled in by the copy."""

    _fields_ = [("src", ctypes.c_char_p), ("offset", ctypes.c_ulonglong), ("length", ctypes.c_longlong),
                ("tmp", ctypes.c_char_p), ("final", ctypes.c_char_p), ("size", ctypes.c_ulonglong),
                ("digest", Digest), ("got_size", ctypes.c_ulonglong), ("got_digest", Digest)]


@dataclasses.dataclass
class BatchFailure:
    """Which job of a batch failed and how: `code` is an errno value (with `message`), SIZE_MISMATCH or
    DIGEST_MISMATCH (with what the copy had: `size` bytes, hex `digest`)."""

    index: int
    code: int
    message: str
    size: int
    digest: str


class NativeCopier:
    """`stage_copy` of the built library; calls release the GIL (ctypes.CDLL)."""

    def __init__(self, library: Path):
        try:
            self._lib = ctypes.CDLL(str(library))
        except OSError as err:
            raise BenchError(f"{library} is built but does not load ({err}); rebuild it with "
                             f"`python -m common.nativecopy --build`") from None
        self._lib.stage_hash_code.restype = ctypes.c_char_p
        self.hash_code = self._lib.stage_hash_code().decode()
        self._lib.stage_copy.restype = ctypes.c_int
        self._lib.stage_copy.argtypes = [ctypes.c_char_p, ctypes.c_ulonglong, ctypes.c_longlong, ctypes.c_char_p,
                                         ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p,
                                         ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_char_p, ctypes.c_size_t]
        self._lib.stage_copy_batch.restype = ctypes.c_int
        self._lib.stage_copy_batch.argtypes = [ctypes.POINTER(BatchJob), ctypes.c_size_t, ctypes.c_void_p,
                                               ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p,
                                               ctypes.c_size_t]

    def copy(self, src: Path, dst: Path, buffer: bytearray | memoryview, offset: int = 0, length: int = -1) -> tuple[str, int]:
        """Copy `length` bytes of `src` from `offset` (-1: to its end) to `dst` (created or truncated), reading
        through `buffer` (reused between calls; one per thread);
        returns the copied bytes' XXH3-128 hex digest (as the `xxhash` package prints it) and their count.
        Raises BenchError naming the file and the step, or the sizes when `src` is too short."""
        digest, size = ctypes.create_string_buffer(16), ctypes.c_ulonglong(0)
        err = ctypes.create_string_buffer(ERR_BYTES)
        code = self._lib.stage_copy(bytes(src), offset, length, bytes(dst), _address(buffer), len(buffer), digest,
                                    ctypes.byref(size), err, ERR_BYTES)
        if code:
            raise BenchError(f"copying {src} to {dst}: {err.value.decode(errors='replace')} (errno {code})")
        return digest.raw.hex(), size.value


    def copy_batch(self, jobs: "ctypes.Array[BatchJob]", buffer: bytearray | memoryview) -> BatchFailure | None:
        """Copy every job in order (one call, no interpreter work per file), each checked and renamed to its
        final name; stops at the first failure, leaving no temporary copy of it, and returns what failed,
        or None when every job is done."""
        failed, err = ctypes.c_size_t(0), ctypes.create_string_buffer(ERR_BYTES)
        code = self._lib.stage_copy_batch(jobs, len(jobs), _address(buffer), len(buffer), ctypes.byref(failed), err,
                                          ERR_BYTES)
        if not code:
            return None
        job = jobs[failed.value]
        return BatchFailure(index=failed.value, code=code, message=err.value.decode(errors="replace"),
                            size=job.got_size, digest=bytes(job.got_digest).hex())


def batch(rows: list[tuple[str, int, int, str, str, int, str]]) -> "ctypes.Array[BatchJob]":
    """The jobs of `copy_batch` from (source, offset, length, temporary path, final path, expected bytes,
    expected XXH3-128 hex digest) rows."""
    jobs = (BatchJob * len(rows))()
    for job, (src, offset, length, tmp, final, size, digest) in zip(jobs, rows):
        job.src, job.offset, job.length = os.fsencode(src), offset, length
        job.tmp, job.final, job.size = os.fsencode(tmp), os.fsencode(final), size
        job.digest = Digest.from_buffer_copy(bytes.fromhex(digest))
    return jobs


def _address(buffer: bytearray | memoryview) -> int:
    """The address of a writable buffer's first byte."""
    return ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))


@functools.cache
def load() -> NativeCopier | None:
    """The copier, or None when `common/native/_stagecopy.so` is missing or older than its source."""
    if not LIBRARY.is_file() or LIBRARY.stat().st_mtime < SOURCE.stat().st_mtime:
        return None
    return NativeCopier(LIBRARY)


def build() -> Path:
    """Compile the library (to a temporary name, renamed when complete): with XXH3's run-time dispatch on
    x86-64 when libxxhash and its dispatch header are there, else with XXH3 compiled in."""
    tmp = LIBRARY.with_name(LIBRARY.name + ".tmp")
    for extra in ([DISPATCH] if platform.machine() == "x86_64" else []) + [[]]:
        proc = _compile(tmp, extra)
        if not proc.returncode:
            break
    if proc.returncode:
        tmp.unlink(missing_ok=True)
        hint = " (is Debian's libxxhash-dev installed?)" if "xxhash.h" in proc.stderr else ""
        raise BenchError(f"compiling {SOURCE} failed{hint}:\n{proc.stderr.strip()}")
    tmp.replace(LIBRARY)
    load.cache_clear()
    return LIBRARY


def _compile(output: Path, extra: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([*COMPILE, "-o", str(output), str(SOURCE), *extra], capture_output=True, text=True)


def speed(copier: NativeCopier, mib: int, rounds: int, directory: str) -> dict:
    """Time `copier` reading, hashing and discarding (to /dev/null) a page-cached file of `mib` MiB made
    in `directory`, `rounds` times: what the copy costs besides writing, per GB."""
    buffer = bytearray(BUFFER_BYTES)
    with tempfile.NamedTemporaryFile(dir=directory, prefix="stagecopy-speed-") as f:
        f.write(os.urandom(1 << 20) * mib)
        f.flush()
        copier.copy(Path(f.name), Path(os.devnull), buffer)  # warm the page cache and the buffer
        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(rounds):
            copier.copy(Path(f.name), Path(os.devnull), buffer)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    gb = rounds * mib * (1 << 20) / 1e9
    return {"hash_code": copier.hash_code, "gb": gb, "gb_per_second": gb / wall, "cpu_seconds_per_gb": cpu / gb}


def header_only_build(directory: str | os.PathLike) -> NativeCopier:
    """The copier compiled with XXH3 from the header (no run-time dispatch) into `directory`."""
    library = Path(directory) / "_stagecopy_header.so"
    proc = _compile(library, [])
    if proc.returncode:
        raise BenchError(f"compiling {SOURCE} without the dispatch failed:\n{proc.stderr.strip()}")
    return NativeCopier(library)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="store_true", help="compile common/native/_stagecopy.so")
    parser.add_argument("--speed", type=int, metavar="MIB", default=0,
                        help="also time reading and hashing a page-cached file of MIB MiB (written to /dev/null), "
                             "with this build and with XXH3 compiled in from the header, 10 rounds each")
    parser.add_argument("--speed-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                        help="where the --speed file is made (default /dev/shm)")
    args = parser.parse_args(argv)
    if args.build:
        print(f"built {build()}")
    copier = load()
    print(f"native copier: {f'available, {copier.hash_code}' if copier else 'not built'} ({LIBRARY})")
    if copier and args.speed:
        with tempfile.TemporaryDirectory() as tmp:
            for name, lib in (("this build", copier), ("header-only build", header_only_build(tmp))):
                r = speed(lib, args.speed, 10, args.speed_dir)
                print(f"{name} ({r['hash_code']}): {r['gb_per_second']:.2f} GB/s, {r['cpu_seconds_per_gb']:.3f} CPU s/GB "
                      f"reading and hashing {r['gb']:.1f} GB")
    return 0 if copier else 1


if __name__ == "__main__":
    sys.exit(main())
