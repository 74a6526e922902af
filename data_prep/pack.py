"""Pack a converted dataset into compressed tar archives (zstd, gzip or none) for staging.

The archives hold the dataset's files whole (each record file with its DALI index, and the
auxiliary files such as DeepCAM's stats.h5), so unpacking restores the directory the converter
wrote. Record files of a split are dealt to its archives in turn (`--layout interleaved`: file i
goes to archive i mod A) or in runs (`--layout contiguous`). When the rank count divides A (which
`--align-ranks R` arranges), a rank of `data.stage_mode=rank` unpacks only its own archives: with
interleaved archives for CosmoFlow's file-by-file shards, with contiguous ones for DeepCAM's blocks. Every file is checked against its sha256 in the dataset's manifest while it
is packed (a corrupt dataset is refused), and the output is:

  OUT/train-00000-of-00008.tar.zst ...      one archive per shard of each split
  OUT/aux.tar.zst                           the auxiliary files, when the dataset has any
  OUT/pack.json                             written last: the dataset's manifest, and every archive
                                            with its size, sha256 and members (size, sha256)

Archives are written under temporary names and renamed when complete; rerunning the same command
after an interruption keeps the finished archives. Staging (`data.stage_dir` in a training config,
or `python -m data_prep stage`) unpacks them, streaming, verifying every member. See docs/staging.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import tarfile
import time
from pathlib import Path
from typing import BinaryIO

from common.base.errors import BenchError
from common.base.files import atomic_path, write_json_atomic
from common.io.manifest import MANIFEST_NAME, load_manifest
from common.io.manifest_write import sha256_file
from common.io.packing import PACK_NAME, SUFFIXES, Archive, Member, Pack, dataset_files
from data_prep import tfrecords

STATE_NAME = ".pack-state.json"
CHUNK = 4 << 20
DEFAULT_LEVELS = {"zstd": 3, "gzip": 6, "none": 0}


@dataclasses.dataclass(frozen=True)
class Job:
    """One archive to write: its final path and the dataset files it holds, in order."""

    input_dir: Path
    path: Path
    members: tuple[Member, ...]
    compression: str
    level: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, type=Path, metavar="DIR",
                        help="a converted dataset directory (with manifest.json)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory to write the archives to")
    parser.add_argument("--compression", choices=list(SUFFIXES), default="zstd",
                        help="archive compression (default: %(default)s)")
    parser.add_argument("--level", type=int, default=None, metavar="L",
                        help="compression level: zstd 1-19 (default 3), gzip 1-9 (default 6)")
    parser.add_argument("--archive-mb", type=float, default=256.0, metavar="MB",
                        help="target uncompressed size of one archive, which sets the archives per split "
                             "(default: %(default)s)")
    parser.add_argument("--archives", type=tfrecords.positive_int, default=None, metavar="A",
                        help="archives per split instead of --archive-mb (use a multiple of the rank count)")
    parser.add_argument("--align-ranks", type=tfrecords.positive_int, default=1, metavar="R",
                        help="round each split's archive count up to a multiple of R (capped at one archive per "
                             "record file), so that each of R ranks in data.stage_mode=rank unpacks only archives "
                             "of its own files (default: %(default)s)")
    parser.add_argument("--layout", choices=("interleaved", "contiguous"), default="interleaved",
                        help="how record files are dealt to a split's archives (default: %(default)s)")
    parser.add_argument("--workers", type=tfrecords.positive_int, default=tfrecords.available_cpus(), metavar="K",
                        help="archives written in parallel (default: CPUs available, %(default)s)")


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    level = _level(args.compression, args.level)
    manifest = load_manifest(args.input)
    files = dataset_files(manifest)
    counts = ArchiveCounts(args.archives, args.archive_mb, args.align_ranks)
    jobs = plan_archives(args.input, args.out, manifest, files, args.compression, level, counts, args.layout)
    settings = {"input": str(args.input.resolve()), "manifest": manifest.to_dict(), "compression": args.compression,
                "level": level, "archives": [[j.path.name, [m.path for m in j.members]] for j in jobs]}
    tfrecords.begin_conversion(args.out, STATE_NAME, settings, [j.path for j in jobs], [], "data_prep pack")
    (args.out / PACK_NAME).unlink(missing_ok=True)
    print(f"packing {args.input} ({len(files)} files, {sum(m.bytes for m in files.values()) / 1e9:.2f} GB) into "
          f"{len(jobs)} {args.compression} archives in {args.out}", flush=True)
    archives = tfrecords.run_in_pool(write_or_reuse, jobs, args.workers, "pack", "archive")
    pack = Pack(root=args.out, compression=args.compression, dataset_manifest=manifest.to_dict(),
                archives=tuple(archives), source={"input": str(args.input), "level": level, "layout": args.layout,
                                                    "align_ranks": args.align_ranks})
    write_json_atomic(pack.to_dict(), args.out / PACK_NAME)
    raw, packed = sum(m.bytes for m in files.values()), sum(a.bytes for a in archives)
    print(f"wrote {args.out / PACK_NAME}: {len(archives)} archives, {packed / 1e9:.3f} GB from {raw / 1e9:.3f} GB "
          f"(ratio {raw / max(packed, 1):.2f}) in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


def _level(compression: str, level: int | None) -> int:
    if level is None:
        return DEFAULT_LEVELS[compression]
    valid = {"zstd": range(1, 20), "gzip": range(1, 10), "none": range(0, 1)}[compression]
    if level not in valid:
        raise BenchError(f"--level {level}: expected {valid.start}..{valid.stop - 1} for --compression {compression}")
    return level


@dataclasses.dataclass(frozen=True)
class ArchiveCounts:
    """How many archives a split gets: `archives` each, or one per `archive_mb` MiB; a multiple of `align`."""

    archives: int | None
    archive_mb: float
    align: int = 1

    def __post_init__(self):
        if self.archives and self.archives % self.align:
            raise BenchError(f"--archives {self.archives} is not a multiple of --align-ranks {self.align}: "
                             f"use --archives {math.ceil(self.archives / self.align) * self.align}")

    def for_split(self, size: int, files: int) -> int:
        """The archive count of a split of `size` bytes in `files` record files (never more than `files`)."""
        count = self.archives or max(1, math.ceil(size / (self.archive_mb * 2**20)))
        return min(math.ceil(count / self.align) * self.align, files)


def plan_archives(input_dir: Path, out: Path, manifest, files: dict[str, Member], compression: str, level: int,
                  counts: ArchiveCounts, layout: str) -> list[Job]:
    """The archives of every split (record files with their indexes), then one of the auxiliary files."""
    if MANIFEST_NAME in files:
        raise BenchError(f"{input_dir}: the manifest lists {MANIFEST_NAME} as a data file")
    suffix = SUFFIXES[compression]
    jobs = []
    for split, entry in manifest.splits.items():
        units = [tuple(files[p] for p in [e.path, e.index] if p) for e in entry.files]
        size = sum(m.bytes for unit in units for m in unit)
        count = counts.for_split(size, len(units))
        for k, group in enumerate(_deal(units, count, layout)):
            name = f"{split}-{k:05d}-of-{count:05d}{suffix}"
            jobs.append(Job(input_dir, out / name, tuple(m for unit in group for m in unit), compression, level))
    aux = tuple(files[a.path] for a in manifest.aux_files.values())
    if aux:
        jobs.append(Job(input_dir, out / f"aux{suffix}", aux, compression, level))
    return jobs


def _deal(units: list, count: int, layout: str) -> list[list]:
    if layout == "interleaved":
        return [units[k::count] for k in range(count)]
    bounds = [round(k * len(units) / count) for k in range(count + 1)]
    return [units[bounds[k]:bounds[k + 1]] for k in range(count)]


# ---------------------------------------------------------------------------- writing one archive
def write_or_reuse(job: Job) -> Archive:
    """The archive at job.path: kept when an earlier run finished it (its members' digests are
    recomputed from the checked input files), else written."""
    if job.path.is_file():  # renamed into place only when complete
        members = []
        for member in job.members:
            with _open_checked(job.input_dir, member) as f:
                reader = _HashingReader(f)
                while reader.read(CHUNK):
                    pass
            members.append(_verified(reader, job.input_dir / member.path, member))
        return Archive(job.path.name, job.path.stat().st_size, sha256_file(job.path), tuple(members))
    return write_archive(job)


def write_archive(job: Job) -> Archive:
    """Write one archive under a temporary name, renamed when complete."""
    with atomic_path(job.path) as tmp:
        with open(tmp, "wb") as raw:
            hashed = _HashingWriter(raw)
            compressor = _compressor(hashed, job.compression, job.level)
            with tarfile.open(fileobj=compressor, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK) as tar:
                members = tuple(_add(tar, job.input_dir, member) for member in job.members)
            if compressor is not hashed:
                compressor.close()
        archive = Archive(job.path.name, tmp.stat().st_size, hashed.digest.hexdigest(), members)
    return archive


def _add(tar: tarfile.TarFile, input_dir: Path, member: Member) -> Member:
    """Add one dataset file, checking its size and sha256 against the manifest as it is read."""
    info = tarfile.TarInfo(member.path)
    info.size, info.mode, info.mtime = member.bytes, 0o644, 0
    with _open_checked(input_dir, member) as f:
        reader = _HashingReader(f)
        tar.addfile(info, reader)
    return _verified(reader, input_dir / member.path, member)


def _open_checked(input_dir: Path, member: Member) -> BinaryIO:
    path = input_dir / member.path
    if not path.is_file():
        raise BenchError(f"{path}: listed in the manifest but missing; the dataset is incomplete, reconvert it")
    size = path.stat().st_size
    if size != member.bytes:
        raise BenchError(f"{path}: {size} bytes, the manifest says {member.bytes}; reconvert the dataset")
    return open(path, "rb")


def _verified(reader: "_HashingReader", path: Path, member: Member) -> Member:
    """The member with the xxh3-128 digest staging verifies, once its sha256 matched the manifest."""
    if reader.digest.hexdigest() != member.sha256:
        raise BenchError(f"{path}: sha256 {reader.digest.hexdigest()}, the manifest says {member.sha256}; the "
                         f"dataset is corrupt, reconvert it before packing")
    return dataclasses.replace(member, xxh3_128=reader.fast.hexdigest())


def _compressor(out: BinaryIO, compression: str, level: int):
    if compression == "zstd":
        import zstandard
        return zstandard.ZstdCompressor(level=level, write_checksum=True).stream_writer(out, closefd=False)
    if compression == "gzip":
        import gzip
        return gzip.GzipFile(fileobj=out, mode="wb", compresslevel=level, mtime=0)
    return out


class _HashingWriter:
    def __init__(self, f: BinaryIO):
        self.f, self.digest = f, hashlib.sha256()

    def write(self, data) -> int:
        self.digest.update(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


class _HashingReader:
    """Reads a file, computing its sha256 (checked against the manifest) and xxh3-128 (for staging)."""

    def __init__(self, f: BinaryIO):
        import xxhash
        self.f, self.digest, self.fast = f, hashlib.sha256(), xxhash.xxh3_128()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.digest.update(data)
        self.fast.update(data)
        return data
