"""Data staging: copy a dataset from the shared file system to node-local storage before training.

The source is a plain dataset directory (`manifest.json` and its files) or a packed one (`pack.json`
and compressed tar archives made by `python -m data_prep pack`). Three modes say what is staged:

- `rank`: every rank stages the files it reads itself (its shard of each split) into its own
  directory; nothing is shared between the ranks of a node.
- `node`: local rank 0 of every node stages the whole dataset once; the node's other ranks wait.
- `node_share`: local rank 0 of node n stages the node's share (files n, n+N, ... of each split, see
  common/io/input.py); the node's ranks divide it between them afresh every epoch.

Files are copied (or unpacked, streaming, one archive per thread) under temporary names beside
their final ones by the copier (common/io/pycopy.py: plain files, and the byte ranges of the members of
uncompressed archives; compressed archives are read through Python's decompressors and the standard
library's `tarfile`). Their checksum is checked while they are written (xxh3-128 from pack.json or
manifest.json; sha256 for files of a manifest written before converters recorded xxh3-128), and only
then are they renamed. With decompression (data.stage_decompress), record files that have no DALI index
(GZIP-compressed ones) are written uncompressed with one instead (common/io/decompress.py), and the staged
manifest describes them so.
A stamp (`.stage-verified.json`: every file's size, checksum, modification and change times and inode as they
stood once verified), the dataset's manifest.json and a `.staged.json` record are written last, in that
order, so a killed staging never leaves a directory a later run takes for complete. A rerun starts afresh
(every byte counted in the staging time) or, with `reuse`, keeps the files an earlier staging left only once
they are proven equal to the source (see `_reuse`) and stages the rest. Free space is checked before the first
byte is copied; a write that fails all the same (a full disk) is an error naming the file, the errno and the
free space, never "corrupt archive".
"""
from __future__ import annotations

import concurrent.futures
import concurrent.futures.thread  # noqa: F401  (loaded lazily otherwise: inside the timed staging)
import dataclasses
import errno
import functools
import hashlib
import json
import os
import shutil
import stat
import sys
import tarfile
import threading
import time
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable, Iterable, Literal

from common.io import pycopy
from common.base import documents
from common.base.documents import NOT_STORED
from common.base.files import write_json_atomic, write_text_atomic
from common.base.errors import BenchError
from common.io.decompress import decompress_file, needs_decompression, staged_manifest, staged_size
from common.io.manifest import MANIFEST_NAME, FileEntry, Manifest, load_manifest
from common.io.tfrecord import index_path
from common.io.packing import PACK_NAME, Member, Pack, dataset_files, load_pack
from common.io.node_share import node_share_files

MODES = ("rank", "node", "node_share")
STAGED_NAME = ".staged.json"
STAMP_NAME, STAMP_VERSION = ".stage-verified.json", 1  # what staging verified in its directory (see `_reuse`)
TEMP_MARK = ".stage-tmp-"
CHUNK = 4 << 20  # bytes per read of a decompressed archive stream
# Files per call of the copier, and their most bytes: few calls (little interpreter work and lock traffic
# between the threads) yet small enough to share out evenly and update the progress bar. A batch is also
# at most 1/BATCH_SHARE of a thread's share of the bytes, so that when the last batch is handed out the
# other threads have little left: with 64 MiB batches, DeepCAM's 1 GB on two threads left one thread idle
# for up to a batch (~30 ms of a 0.3 s staging).
BATCH_FILES, BATCH_BYTES, BATCH_SHARE = 32, 64 << 20, 16
SPACE_MARGIN = 64 << 20  # free bytes left over at the destination after staging
INDEX_LINE_BYTES = 24  # room for one DALI index line ("offset size\n") of a decompressed file


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where this rank sits: rank, ranks, local rank, ranks per node, node index and node count."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node: int = 0
    nodes: int = 1


@dataclasses.dataclass(frozen=True)
class Source:
    """What staging reads: a plain dataset directory or a packed one, and the dataset's manifest."""

    root: Path
    manifest: Manifest
    pack: Pack | None

    @property
    def kind(self) -> str:
        return "packed" if self.pack else "plain"

    @property
    def compression(self) -> str:
        return self.pack.compression if self.pack else "none"

    @functools.cached_property
    def files(self) -> dict[str, Member]:
        """Every stageable file by its dataset path, with the size and checksums it must have."""
        if self.pack:
            return {path: member for path, (_, member) in self.pack.members().items()}
        return dataset_files(self.manifest)

    @functools.cached_property
    def manifest_text(self) -> str:
        """The manifest's JSON text, compact with sorted keys (made once: CosmoFlow's lists thousands of
        files): what names the staged directory and what staging writes there."""
        return json.dumps(self.manifest.to_dict(), sort_keys=True)


def open_source(path: str | os.PathLike) -> Source:
    """The dataset at `path`: a directory with manifest.json (plain) or pack.json (packed)."""
    root = Path(path)
    if (root / PACK_NAME).is_file():
        pack = load_pack(root)
        return Source(root=root, manifest=pack.manifest(), pack=pack)
    if not root.is_dir():
        raise BenchError(f"{root}: dataset directory not found (expected {MANIFEST_NAME} or {PACK_NAME} in it)")
    if not (root / MANIFEST_NAME).is_file():
        raise BenchError(f"{root}: neither {MANIFEST_NAME} (a converted dataset) nor {PACK_NAME} (a packed one); "
                         f"its conversion or packing did not finish, or this is not a dataset")
    return Source(root=root, manifest=load_manifest(root), pack=None)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one rank's staging does."""

    mode: str
    scope: str  # the staged directory's name below the dataset's: node, node-0000-of-0002, rank-00001-of-00004
    files: tuple[str, ...]  # dataset paths staged into it
    copies: bool  # False: another rank of this node stages it (this rank waits)
    node_bytes: int  # bytes all of this node's staging writes (for the free-space check)
    # data.stage_decompress: record files without a DALI index are written uncompressed with one (decompress.py)
    decompress: bool = False


RankFiles = Callable[[Manifest, int, int], Iterable[str]]  # (manifest, rank, ranks) -> dataset paths it reads


def plan(source: Source, mode: str, layout: Layout, rank_files: RankFiles, decompress: bool = False) -> Plan:
    """The plan of this rank; `rank_files` says which files a rank reads (the application's sharding);
    `decompress`: data.stage_decompress."""
    if mode not in MODES:
        raise BenchError(f"data.stage_mode {mode!r}: expected one of {list(MODES)}")
    if decompress and source.pack:
        raise BenchError(f"{source.root}: a packed dataset; data.stage_decompress stages the record files of a "
                         f"plain dataset directory (as data_prep index or cosmo-convert --compression gzip make)")
    manifest, files = source.manifest, staged_sizes(source, decompress)
    aux = [a.path for a in manifest.aux_files.values()]
    if mode == "node":
        chosen, scope = list(files), "node"
        node_bytes = _bytes(files, chosen)
    elif mode == "node_share":
        chosen = aux + [p for split in manifest.splits for e in
                        node_share_files(manifest, split, layout.node, layout.nodes) for p in _with_index(e)]
        scope = f"node-{layout.node:04d}-of-{layout.nodes:04d}"
        node_bytes = _bytes(files, chosen)
    else:
        def of_rank(rank: int) -> list[str]:
            return aux + list(rank_files(manifest, rank, layout.size))
        chosen, scope = of_rank(layout.rank), f"rank-{layout.rank:05d}-of-{layout.size:05d}"
        first = layout.node * layout.local_size  # ranks are numbered node by node
        node_bytes = sum(_bytes(files, of_rank(r)) for r in range(first, min(first + layout.local_size, layout.size)))
    unknown = sorted(set(chosen) - set(files))
    if unknown:
        raise BenchError(f"{source.root}: the files to stage include {unknown[0]}, which the source does not hold")
    return Plan(mode=mode, scope=scope, files=tuple(sorted(set(chosen))), node_bytes=node_bytes,
                copies=mode == "rank" or layout.local_rank == 0, decompress=decompress)


def _with_index(entry) -> list[str]:
    return [entry.path] + ([entry.index] if entry.index else [])


def _bytes(sizes: dict[str, int], chosen: Iterable[str]) -> int:
    return sum(sizes[p] for p in set(chosen) if p in sizes)


def to_decompress(source: Source, decompress: bool) -> dict[str, FileEntry]:
    """The record files staging rewrites uncompressed with a DALI index (with `decompress`), by dataset path."""
    if not decompress:
        return {}
    return {e.path: e for split in source.manifest.splits.values() for e in split.files if needs_decompression(e)}


def staged_sizes(source: Source, decompress: bool) -> dict[str, int]:
    """The bytes each file of the source takes once staged (decompressed files with room for their index)."""
    sizes = {path: member.bytes for path, member in source.files.items()}
    for path, entry in to_decompress(source, decompress).items():
        sizes[path] = staged_size(entry) + INDEX_LINE_BYTES * entry.records
    return sizes


def staged_dir(stage_root: str | os.PathLike, source: Source, scope: str, decompress: bool = False) -> Path:
    """`stage_root/<format>-<first 12 hex digits of the manifest's sha256>[-uncompressed]/<scope>` (the suffix
    with data.stage_decompress, whose copy differs)."""
    digest = hashlib.sha256(source.manifest_text.encode()).hexdigest()[:12]
    suffix = "-uncompressed" if decompress else ""
    return Path(stage_root) / f"{source.manifest.format}-{digest}{suffix}" / scope


# ---------------------------------------------------------------------------- in a training run
def stage_logged(data, dist, rank_files: RankFiles, mlperf, log: Callable[[str], None]) -> "StageResult":
    """A training run's staging (common/runtime/run.py): stage_for_run between the MLPerf log's `mlperf`
    staging_start and staging_stop (with its bytes and rate) unless data.stage_timing is before_init, after rank 0
    has printed (`log`) the estimate of its time."""
    logged = data.stage_timing != "before_init"
    log(f"staging {data.dir} to {data.stage_dir} (data.stage_mode={data.stage_mode}, "
        f"data.stage_timing={data.stage_timing})")
    if logged:
        mlperf.start("staging_start")
    estimate = functools.partial(_log_estimate, data, log) if dist.is_root else lambda _source, _plan: None
    staging = stage_for_run(data, dist, rank_files, progress=dist.is_root, planned=estimate)
    if logged:
        rate = staging.figures()["write_gb_per_second"] or 0.0  # rank 0 stages (local rank 0 of its node)
        mlperf.end("staging_stop", staging_seconds=round(staging.seconds, 3), staged_bytes=staging.bytes_written,
                   staging_gb_per_second=round(rate, 3))
    log(f"staged into {staging.dir}: {staging.files} files, {staging.bytes_written / 1e9:.3f} GB in "
        f"{staging.seconds:.2f} s on rank 0" + ("" if staging.copied else " (waiting for its node's stager)"))
    return staging


def _log_estimate(data, log: Callable[[str], None], source: Source, plan: Plan) -> None:
    """How long staging `plan` should take, with a warning when init may pass 25 minutes."""
    from common.io import stage_rate
    kind = source.compression if source.pack else "plain"
    line, late = stage_rate.estimate(plan.node_bytes, stage_rate.rate(data.stage_rate_gb_s, kind, plan.mode),
                                     data.stage_timing)
    log(("warning: " if late else "") + line)


def stage_for_run(data_cfg, dist, rank_files: RankFiles, progress: bool = False,
                  planned: Callable[[Source, Plan], None] = lambda _source, _plan: None) -> "StageResult":
    """Stage data_cfg.dir into data_cfg.stage_dir on the ranks the mode picks; the others wait. `planned` is
    called with the source and this rank's plan before anything is copied.

    Collective: every rank calls it. When any staging rank fails, every rank raises its error
    (rather than waiting forever or reading a partial copy).
    """
    source = open_source(data_cfg.dir)
    layout = Layout(rank=dist.rank, size=dist.size, local_rank=dist.local_rank, local_size=dist.local_size,
                    node=dist.node, nodes=dist.num_nodes)
    t0 = time.perf_counter()
    the_plan, result, error = None, None, None
    try:
        the_plan = plan(source, data_cfg.stage_mode, layout, rank_files, data_cfg.stage_decompress)
        planned(source, the_plan)
        if the_plan.copies:
            result = stage(source, the_plan, data_cfg.stage_dir, threads=data_cfg.stage_threads,
                           reuse=data_cfg.stage_reuse, progress=progress)
    except BenchError as err:
        error = f"rank {dist.rank}: {err}"
    failures = [e for e in dist.gather_object(error) if e]  # also the barrier the waiting ranks need
    if failures:
        raise BenchError(failures[0] + (f" (and {len(failures) - 1} more ranks failed)" if len(failures) > 1 else ""))
    return result or wait_result(source, the_plan, data_cfg.stage_dir, time.perf_counter() - t0)


# ---------------------------------------------------------------------------- result
@dataclasses.dataclass
class StageResult:
    """What one rank's staging did, for the MLPerf log, the I/O report and the run summary."""

    dir: str
    mode: str
    scope: str
    source: str
    source_kind: str  # plain or packed
    compression: str
    copied: bool  # False: this rank waited for its node's stager
    files: int = 0  # staged by this rank (reused ones excluded)
    files_reused: int = 0  # kept from an earlier staging, proven equal to the source (by the stamp or by hashing)
    files_rechecked: int = 0  # of the reused, those hashed again because the stamp could not vouch for them
    files_recopied: int = 0  # found in place but changed (or unproven) and staged again; part of `files`
    bytes_written: int = 0  # uncompressed bytes written
    bytes_read: int = 0  # bytes read from the source (compressed archives: their size)
    archives: int = 0
    seconds: float = 0.0
    threads: int = 0
    # The checksums that prove the staged files equal to the source, as pack.json or the manifest gives them:
    # xxh3_128, sha256 for manifests written before converters recorded xxh3-128, or both joined by "+".
    checksum: str = ""
    source_fs: str = ""  # file system type of the source directory ("" when unknown)
    dest_fs: str = ""  # file system type of the staged directory ("" when unknown)
    reads: str = ""  # how the source was read: the copier's method (read, mmap, kernel) or stream (compressed)
    copier: str = "python"  # who copied and hashed (common/io/pycopy.py)

    def figures(self) -> dict:
        d = dataclasses.asdict(self)
        seconds = max(self.seconds, 1e-9)
        d["write_gb_per_second"] = self.bytes_written / seconds / 1e9 if self.copied else None
        d["read_gb_per_second"] = self.bytes_read / seconds / 1e9 if self.copied else None
        d["compression_ratio"] = self.bytes_written / self.bytes_read if self.bytes_read else None
        return d


def staging_summary(per_rank: list[dict]) -> dict:
    """The staging phase as a whole, from every rank's `StageResult.figures()` (the I/O report's `staging`): its
    wall time (the slowest rank, waiting included) and the copies."""
    copies = [s for s in per_rank if s["copied"]]
    seconds = max(s["seconds"] for s in per_rank)
    written, read = sum(s["bytes_written"] for s in copies), sum(s["bytes_read"] for s in copies)
    return {"mode": per_rank[0]["mode"], "source_kind": per_rank[0]["source_kind"],
            "compression": per_rank[0]["compression"], "seconds": seconds, "staging_ranks": len(copies),
            **{key: sum(s.get(key, 0) for s in copies)
               for key in ("files", "files_reused", "files_rechecked", "files_recopied")},
            "bytes_written": written, "bytes_read": read,
            "write_gb_per_second": written / max(seconds, 1e-9) / 1e9,
            "read_gb_per_second": read / max(seconds, 1e-9) / 1e9,
            "compression_ratio": written / read if read else None}


# ---------------------------------------------------------------------------- staging
def stage(source: Source, the_plan: Plan, stage_root: str | os.PathLike, threads: int = 0, reuse: bool = False,
          progress: bool = False, copier: pycopy.Copier | None = None) -> StageResult:
    """Copy or unpack the plan's files into their staged directory; returns what was done.

    Only the ranks whose plan says `copies` call this; the others wait and call `wait_result`.
    `copier` copies plain files and the members of uncompressed archives (default: common/io/pycopy.py's
    `read` method, the fastest of its methods on every file system measured: benchmarks/copier_compare.py).
    With `reuse`, files an earlier staging left in the directory are kept when proven equal to the source
    (`_reuse`); the others are staged again.
    Raises BenchError for too little free space, a missing or truncated archive, a corrupt archive
    member, a checksum mismatch and a failed read or write (a full disk), naming the file and the figures.
    """
    dest = staged_dir(stage_root, source, the_plan.scope, the_plan.decompress)
    threads = threads or _cores()
    result = StageResult(dir=str(dest), mode=the_plan.mode, scope=the_plan.scope, source=str(source.root),
                         source_kind=source.kind, compression=source.compression, copied=True, threads=threads,
                         checksum=_checksum_kinds(source, the_plan))
    t0 = time.perf_counter()
    files, rewrite = source.files, to_decompress(source, the_plan.decompress)
    _prepare(dest, reuse)
    kept = _reuse(dest, source, the_plan, rewrite, threads) if reuse else _Kept()
    staged = dict(kept.decompressed)
    todo = [p for p in the_plan.files if p not in kept.files and p not in staged]
    _check_space(dest, the_plan, staged_sizes(source, the_plan.decompress), todo)
    bar = _progress_bar(sum(files[p].bytes for p in todo), progress, the_plan.scope)
    try:
        result.source_fs, result.dest_fs = filesystem_type(source.root), filesystem_type(dest)
        copier = copier or pycopy.Copier()
        result.copier, result.reads = copier.name, read_method(copier, source)
        if source.pack:
            result.archives, result.bytes_read = _unpack(source, todo, dest, threads, bar, copier)
        else:
            result.bytes_read = _copy_plain(source, [p for p in todo if p not in rewrite], dest, threads, bar, copier)
            staged.update(_decompress_all(source, {p: rewrite[p] for p in todo if p in rewrite}, dest, threads, bar))
    finally:
        bar.close()
    _finish_decompressed(result, source, rewrite, todo)
    result.files, result.files_reused = len(todo), len(the_plan.files) - len(todo)
    result.files_rechecked, result.files_recopied = kept.rechecked, kept.recopied
    result.bytes_written = sum(files[p].bytes if p not in rewrite else _written(dest, staged[p]) for p in todo)
    _write_stamp(dest, source, the_plan, rewrite, staged)
    # The dataset's manifest, now describing `dest` (loaded and validated from the source already; compact:
    # CosmoFlow's lists thousands of files, and indenting it is done in Python, tens of milliseconds).
    with pycopy.writing(dest / MANIFEST_NAME):
        write_text_atomic(_staged_manifest_text(source, the_plan, staged) + "\n", dest / MANIFEST_NAME)
    result.seconds = time.perf_counter() - t0
    with pycopy.writing(dest / STAGED_NAME):
        write_json_atomic({"plan": dataclasses.asdict(the_plan), "result": result.figures()}, dest / STAGED_NAME)
    return result


def _checksum_kinds(source: Source, the_plan: Plan) -> str:
    files = source.files
    return "+".join(sorted({checksum_of(files[p])[0] for p in the_plan.files}))


def wait_result(source: Source, the_plan: Plan, stage_root: str | os.PathLike, seconds: float) -> StageResult:
    """The result on a rank that waited `seconds` for its node's stager (which must have finished)."""
    dest = staged_dir(stage_root, source, the_plan.scope, the_plan.decompress)
    if not (dest / STAGED_NAME).is_file():
        raise BenchError(f"{dest}: the node's staging rank finished but {STAGED_NAME} is missing; is "
                         f"data.stage_dir node-local storage that all ranks of the node see?")
    return StageResult(dir=str(dest), mode=the_plan.mode, scope=the_plan.scope, source=str(source.root),
                       source_kind=source.kind, compression=source.compression, copied=False, seconds=seconds)


def _prepare(dest: Path, reuse: bool) -> None:
    """Make `dest` ready: empty, or with `reuse` rid of the marks of a complete staging and of temporaries
    (its stamp stays: it vouches only for files that are still as they were when verified)."""
    if not reuse and dest.exists():
        shutil.rmtree(dest)
    with pycopy.writing(dest):
        dest.mkdir(parents=True, exist_ok=reuse)
    if not reuse:
        return
    (dest / STAGED_NAME).unlink(missing_ok=True)
    (dest / MANIFEST_NAME).unlink(missing_ok=True)
    for tmp in [p for p in dest.rglob(f"*{TEMP_MARK}*") if p.is_file()]:
        tmp.unlink()


# ---------------------------------------------------------------------------- reuse
@dataclasses.dataclass(frozen=True)
class _Claim:
    """A file of the staged directory (dataset path) and what it must be: its size and checksum (kind, hex)."""

    path: str
    bytes: int
    kind: str
    digest: str


@dataclasses.dataclass(frozen=True)
class _Decompressed:
    """A file an earlier staging decompressed: its staged manifest entry and the size of its index."""

    entry: FileEntry
    index_bytes: int

    def claims(self) -> list[_Claim]:
        """The file and its index, with the xxh3-128 digests staging computed as it wrote them."""
        e = self.entry
        return [_Claim(e.path, e.bytes, "xxh3_128", e.xxh3_128),
                _Claim(e.index, self.index_bytes, "xxh3_128", e.index_xxh3_128)]


@dataclasses.dataclass(frozen=True)
class _Verified:
    """A verified file as the stamp records it. Any write changes the change time (ctime), which, unlike the
    modification time, no system call sets back; a replaced file has another inode."""

    bytes: int
    kind: str
    digest: str
    mtime_ns: int
    ctime_ns: int
    ino: int


@dataclasses.dataclass(frozen=True)
class _Stamp:
    """What a staging verified in its directory (STAMP_NAME): by path, each file's `_Verified` record; the
    decompressed files' staged entries; and when the stamp was written (its modification time, not stored)."""

    version: Literal[1]
    files: dict[str, _Verified]
    decompressed: dict[str, _Decompressed]
    written_ns: int = dataclasses.field(default=0, metadata=NOT_STORED)

    def vouches(self, claim: _Claim, st: os.stat_result) -> bool:
        """Whether the file of `claim`, now `st`, is as it was when a staging verified it. Not when its change
        time is not before the stamp's: the clock behind these times ticks coarsely (milliseconds), so the
        file may have changed within the tick in which it was recorded (git's "racily clean" files)."""
        recorded = self.files.get(claim.path)
        return recorded == _record(claim, st) and recorded.ctime_ns < self.written_ns


def _record(claim: _Claim, st: os.stat_result) -> _Verified:
    return _Verified(claim.bytes, claim.kind, claim.digest, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@dataclasses.dataclass
class _Kept:
    """What a staging with reuse keeps of an earlier one's files."""

    files: set[str] = dataclasses.field(default_factory=set)  # copies proven equal to the source
    decompressed: dict[str, FileEntry] = dataclasses.field(default_factory=dict)  # their staged entries
    rechecked: int = 0  # of these, the ones hashed again (the stamp could not vouch for them)
    recopied: int = 0  # planned files found in place that could not be proven: staged again


def _reuse(dest: Path, source: Source, the_plan: Plan, rewrite: dict[str, FileEntry], threads: int) -> _Kept:
    """The planned files an earlier staging left in `dest` that are proven equal to the source.

    A file is proven when it has the size the manifest (or pack.json) lists and either the stamp vouches for
    it (`_Stamp.vouches`: unchanged since a staging verified it, at the cost of a stat) or its checksum,
    computed again, matches (the cost of reading it: files an interrupted staging left, which no stamp lists,
    and files changed since). A decompressed file is proven only against the stamp's record of what staging
    wrote, as the manifest has no checksum of the uncompressed records; without one it is decompressed again.
    """
    stamp = _load_stamp(dest)
    plain = [_claim(source.files[p]) for p in the_plan.files if p not in rewrite]
    stamped = {p: d for p in the_plan.files if p in rewrite and (d := _stamped_decompressed(stamp, rewrite[p]))}
    proven, hashed = _prove(dest, plain + [c for d in stamped.values() for c in d.claims()], stamp, threads)
    kept = _Kept(files={c.path for c in plain if c.path in proven},
                 decompressed={p: d.entry for p, d in stamped.items() if {p, d.entry.index} <= proven})
    kept.rechecked = len(kept.files & hashed) + sum(1 for p, e in kept.decompressed.items() if {p, e.index} & hashed)
    found = {p for p in the_plan.files if _stat(dest / p) is not None}
    kept.recopied = len(found - kept.files - set(kept.decompressed))
    return kept


def _claim(member: Member) -> _Claim:
    return _Claim(member.path, member.bytes, *checksum_of(member))


def _load_stamp(dest: Path) -> _Stamp:
    """The stamp in `dest`; an empty one when there is none or it is unreadable (every file is then hashed: the
    stamp only saves work, so a damaged one costs time, never correctness)."""
    path = dest / STAMP_NAME
    try:
        written_ns = path.stat().st_mtime_ns
        return documents.read(path, _Stamp, kind="json", written_ns=written_ns)
    except (OSError, BenchError):
        return _Stamp(STAMP_VERSION, {}, {})


def _stamped_decompressed(stamp: _Stamp, entry: FileEntry) -> _Decompressed | None:
    """The stamp's record of the dataset file `entry` as a staging decompressed it; None when there is none
    that fits it."""
    record = stamp.decompressed.get(entry.path)
    if record is None:
        return None
    staged, index = record.entry, index_path(entry.path).as_posix()
    fits = (staged.path, staged.records, staged.index) == (entry.path, entry.records, index)
    return record if fits and staged.index_xxh3_128 else None


def _prove(dest: Path, claims: list[_Claim], stamp: _Stamp, threads: int) -> tuple[set[str], set[str]]:
    """The paths of the `claims` proven in `dest` (by the stamp or by hashing, on `threads` threads), and those
    of them proven by hashing."""
    vouched, suspects = set(), []
    for claim in claims:
        st = _stat(dest / claim.path)
        if st is None or st.st_size != claim.bytes:
            continue
        if stamp.vouches(claim, st):
            vouched.add(claim.path)
        else:
            suspects.append(claim)
    matches = _run_threads(functools.partial(_hash_matches, dest), suspects, threads)
    hashed = {claim.path for claim, match in zip(suspects, matches) if match}
    return vouched | hashed, hashed


def _stat(path: Path) -> os.stat_result | None:
    """The status of a regular file, None for anything else or nothing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _hash_matches(dest: Path, claim: _Claim) -> bool:
    try:
        digest, size = pycopy.digest_file(dest / claim.path, claim.kind, _buffer(pycopy.BUFFER_BYTES))
    except OSError:  # unreadable: staged again (and a failing write of it then says why)
        return False
    return (digest, size) == (claim.digest, claim.bytes)


def _write_stamp(dest: Path, source: Source, the_plan: Plan, rewrite: dict, staged: dict[str, FileEntry]) -> None:
    """Record what this staging verified in `dest` (STAMP_NAME): every planned file as it stands now, all of
    them checked by this staging or an earlier one, and the staged entries of the decompressed ones."""
    files, decompressed = {}, {}
    for p in the_plan.files:
        if p in rewrite:
            decompressed[p] = _Decompressed(staged[p], os.stat(dest / staged[p].index).st_size)
            claims = decompressed[p].claims()
        else:
            claims = [_claim(source.files[p])]
        files.update((c.path, _record(c, os.stat(dest / c.path))) for c in claims)
    with pycopy.writing(dest / STAMP_NAME):
        documents.write(dest / STAMP_NAME, _Stamp(STAMP_VERSION, files, decompressed), kind="json", indent=None)


def _check_space(dest: Path, the_plan: Plan, sizes: dict[str, int], todo: list[str]) -> None:
    need = sum(sizes[p] for p in todo)
    if the_plan.mode == "rank":  # the node's other ranks stage at the same time
        need = max(need, the_plan.node_bytes - _bytes(sizes, set(the_plan.files) - set(todo)))
    free = shutil.disk_usage(dest).free
    if free < need + SPACE_MARGIN:
        raise BenchError(f"{dest}: {free / 1e9:.2f} GB free, but staging needs {need / 1e9:.2f} GB "
                         f"({len(todo)} files, data.stage_mode={the_plan.mode}) plus {SPACE_MARGIN >> 20} MiB to "
                         f"spare; free space there or choose another data.stage_dir")


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# ---------------------------------------------------------------------------- plain copies
def read_method(copier: pycopy.Copier, source: Source) -> str:
    """How the source's bytes are read: by the copier's method, or "stream" through a decompressor."""
    return "stream" if source.compression != "none" else copier.method


def _copy_plain(source: Source, todo: list[str], dest: Path, threads: int, bar, copier: pycopy.Copier) -> int:
    """Copy the plain files `todo` in batches, one batch per call of the copier, on `threads` threads."""
    files, root = source.files, str(source.root)
    _make_dirs(dest, todo)

    def copy_batch(paths: list[str]) -> int:
        _copy_jobs(copier, dest, [(f"{root}/{p}", 0, -1, files[p], f"{root}/{p}") for p in paths], bar)
        return sum(files[p].bytes for p in paths)

    return sum(_run_threads(copy_batch, _batches(todo, files, threads), threads))


def _batches(paths: list[str], files: dict[str, Member], threads: int = 1) -> list[list[str]]:
    """`paths` in runs of at most BATCH_FILES files and `batch_bytes` bytes (at least one file each)."""
    limit = batch_bytes(sum(files[p].bytes for p in paths), threads)
    out, run, size = [], [], 0
    for p in paths:
        if run and (len(run) == BATCH_FILES or size + files[p].bytes > limit):
            out.append(run)
            run, size = [], 0
        run.append(p)
        size += files[p].bytes
    return out + [run] if run else out


def batch_bytes(total: int, threads: int) -> int:
    """The most bytes of one batch of the copier when `threads` threads share `total` bytes (see BATCH_SHARE)."""
    return max(1, min(BATCH_BYTES, total // (max(threads, 1) * BATCH_SHARE)))


def _make_dirs(dest: Path, paths: Iterable[str]) -> None:
    """Every directory the staged `paths` go into, made once before the copies (not once per file)."""
    for d in sorted({os.path.dirname(p) for p in paths}):  # strings: pathlib costs ~10 ms per 1,000 files
        with pycopy.writing(os.path.join(dest, d)):
            os.makedirs(os.path.join(dest, d), exist_ok=True)


CopyJob = tuple[str, int, int, Member, str]  # source path, offset, length (-1: to its end), member, where


def _copy_jobs(copier: pycopy.Copier, dest: Path, jobs: list[CopyJob], bar) -> None:
    """Copy, hash, check and rename `jobs` in one call of the copier; their directories must exist.
    Raises BenchError for the first that failed, as `_check_copy` words a wrong size or checksum."""
    tag, batch = f"{TEMP_MARK}{os.getpid()}-{threading.get_ident()}", []
    for src, offset, length, member, _ in jobs:
        head, name = os.path.split(f"{dest}/{member.path}")
        kind, digest = checksum_of(member)
        batch.append(pycopy.Job(src, offset, length, f"{head}/.{name}{tag}", f"{head}/{name}", member.bytes, digest,
                                kind))
    failure = copier.copy_batch(batch, _buffer(copier.buffer_bytes))
    bar.update(sum(m.bytes for _, _, _, m, _ in jobs[:len(jobs) if failure is None else failure.index]))
    if failure is None:
        return
    src, _, _, member, where = jobs[failure.index]
    if failure.code in (pycopy.SIZE_MISMATCH, pycopy.DIGEST_MISMATCH):
        _check_copy(failure.size, failure.digest, member, where)
    if failure.path:  # writing the copy failed: a full disk, not a bad source
        raise BenchError(pycopy.write_error(failure.path, failure.code, f"{where}: copying {member.path}"))
    if failure.code == errno.ENOENT and not os.path.exists(src):
        raise BenchError(f"{src}: listed in the manifest but missing; the dataset is incomplete")
    raise BenchError(f"{where}: copying {member.path} to {dest}: {failure.message} (errno {failure.code})")


# ---------------------------------------------------------------------------- decompression
def _decompress_all(source: Source, entries: dict[str, FileEntry], dest: Path, threads: int,
                    bar) -> dict[str, FileEntry]:
    """Write `entries` uncompressed with DALI indexes (common/io/decompress.py), a file per job on `threads`
    threads; their staged entries by path."""
    _make_dirs(dest, entries)
    files, compression = source.files, source.manifest.compression

    def one(path: str) -> tuple[str, FileEntry]:
        kind, digest = checksum_of(files[path])
        staged = decompress_file(source.root / path, entries[path], compression, dest, (kind, digest),
                                 pycopy.hasher(kind), f"{TEMP_MARK}{os.getpid()}-{threading.get_ident()}")
        bar.update(files[path].bytes)
        return path, staged

    return dict(_run_threads(one, list(entries), threads))


def _finish_decompressed(result: "StageResult", source: Source, rewrite: dict, todo: list[str]) -> None:
    """What a staging that decompressed reports: the source's compression, its bytes read, read as a stream."""
    if rewrite:
        result.compression, result.reads = source.manifest.compression, "stream"
        result.bytes_read += sum(source.files[p].bytes for p in todo if p in rewrite)


def _written(dest: Path, entry: FileEntry) -> int:
    """Bytes a decompressed file and its index take in `dest`."""
    return entry.bytes + (dest / index_path(entry.path)).stat().st_size


def _staged_manifest_text(source: Source, the_plan: Plan, staged: dict[str, FileEntry]) -> str:
    """The staged directory's manifest: the source's, or with decompression one that describes the files as
    they were staged (and says compression none)."""
    if not the_plan.decompress:
        return source.manifest_text
    return json.dumps(staged_manifest(source.manifest, staged, str(source.root)).to_dict(), sort_keys=True)


def filesystem_type(path: str | os.PathLike) -> str:
    """The type of the file system holding `path` (the longest mount point above it), "" when unknown."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    target, best, kind = os.path.realpath(path), "", ""
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, fields[2]
    return kind


def _read_chunks(stream):
    """The stream's bytes, read into this thread's buffer piece by piece (each view valid until the next)."""
    buffer = _buffer()
    while got := stream.readinto(buffer):
        yield buffer[:got]


def _run_threads(function, jobs: list, threads: int) -> list:
    """function(job) for every job on `threads` threads; the first error is raised after the rest stop."""
    if threads <= 1 or len(jobs) <= 1:
        return [function(job) for job in jobs]
    with concurrent.futures.ThreadPoolExecutor(min(threads, len(jobs))) as pool:
        futures = [pool.submit(function, job) for job in jobs]
        try:
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()


def _write_verified(chunks, dest: Path, member: Member, where: str, bar) -> None:
    """Write `chunks` (views of the file's bytes) to dest/member.path through a temporary name, checking
    size and checksum before the rename. A failed write raises BenchError naming the file written, the errno
    and the free space (`pycopy.write_error`); the caller words a failed read."""
    final, tmp = dest / member.path, _temp_path(dest, member)
    kind, _ = checksum_of(member)
    digest, size, context = pycopy.hasher(kind), 0, f"{where}: unpacking {member.path}"
    try:
        with pycopy.writing(tmp, context):
            out = open(tmp, "wb", buffering=0)
        try:
            for chunk in chunks:
                digest.update(chunk)
                with pycopy.writing(tmp, context):
                    _write_all(out, chunk)
                size += len(chunk)
                bar.update(len(chunk))
        finally:
            with pycopy.writing(tmp, context):
                out.close()
        _check_copy(size, digest.hexdigest(), member, where)
        with pycopy.writing(final, context):
            os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def _write_all(out, chunk: memoryview) -> None:
    """Write all of `chunk` to the unbuffered file `out`: a short write (a disk filling up) is followed by
    another, which raises ENOSPC, so a file is never shorter than its digest says."""
    while chunk:
        chunk = chunk[out.write(chunk):]


def _temp_path(dest: Path, member: Member) -> Path:
    """The temporary name a member is written under (per process and thread), its directory made."""
    final = dest / member.path
    with pycopy.writing(final.parent):
        final.parent.mkdir(parents=True, exist_ok=True)
    return final.with_name(f".{final.name}{TEMP_MARK}{os.getpid()}-{threading.get_ident()}")


def _check_copy(size: int, digest: str, member: Member, where: str) -> None:
    kind, expected = checksum_of(member)
    if size != member.bytes:
        raise BenchError(f"{where}: {member.path} has {size} bytes, the manifest says {member.bytes}; the "
                         f"source is truncated or was changed")
    if digest != expected:
        raise BenchError(f"{where}: {member.path} has {kind} {digest}, the source lists {expected}; "
                         f"the source is corrupt (checksum mismatch), nothing was renamed")


def checksum_of(member: Member) -> tuple[str, str]:
    """(kind, expected hex digest): xxh3-128 when the pack or manifest recorded it, else sha256."""
    return ("xxh3_128", member.xxh3_128) if member.xxh3_128 else ("sha256", member.sha256)


_local = threading.local()


def _buffer(size: int = CHUNK) -> memoryview:
    """This thread's reusable read buffer of `size` bytes."""
    buffers = _local.__dict__.setdefault("buffers", {})
    if size not in buffers:
        buffers[size] = memoryview(bytearray(size))
    return buffers[size]


# ---------------------------------------------------------------------------- archives
def _unpack(source: Source, todo: list[str], dest: Path, threads: int, bar,
            copier: pycopy.Copier) -> tuple[int, int]:
    """Unpack the archives holding `todo`, one per thread; returns (archives read, their bytes).

    The standard library's `tarfile` reads the headers. The members of uncompressed archives are copied by
    `copier` from their byte ranges of the archive; those of compressed ones are read from the decompressed
    stream, once, front to back."""
    wanted = set(todo)
    archives = [a for a in source.pack.archives if any(m.path in wanted for m in a.members)]
    _make_dirs(dest, todo)

    def unpack(archive) -> int:
        path = source.root / archive.path
        if not path.is_file():
            raise BenchError(f"{path}: archive listed in {source.root / PACK_NAME} is missing")
        size = path.stat().st_size
        if size != archive.bytes:
            raise BenchError(f"{path}: {size} bytes, {PACK_NAME} says {archive.bytes}; the archive is truncated "
                             f"or was changed, repack the dataset")
        _unpack_archive(path, archive, source.compression, wanted, dest, bar, copier)
        return size

    return len(archives), sum(_run_threads(unpack, archives, threads))


@dataclasses.dataclass
class _Unpacking:
    """One archive being unpacked: where, what pack.json lists in it, what is wanted, what was found."""

    path: Path
    members: dict[str, Member]
    wanted: set[str]
    found: set[str] = dataclasses.field(default_factory=set)
    current: str | None = None  # the member being read
    last: str | None = None  # the last member read to its end


def _unpack_archive(path: Path, archive, compression: str, wanted: set[str], dest: Path, bar,
                    copier: pycopy.Copier) -> None:
    """Unpack the `wanted` members of one archive, streaming, and check that it holds exactly the members
    pack.json lists for it. Raises BenchError naming the archive, the member and what was expected."""
    state = _Unpacking(path, {m.path: m for m in archive.members}, wanted)
    try:
        with open(path, "rb") as raw, _decompressed(raw, compression) as stream:
            if compression == "none":
                with _open_tar(raw) as tar:
                    _copy_members(tar, state, dest, bar, copier)
            else:
                forward = _ForwardStream(stream)
                with _open_tar(forward) as tar:
                    _stream_members(tar, forward, state, dest, bar)
    except BenchError:
        raise
    except _DamagedHeader as err:
        where = f"byte {err.offset} of the {'decompressed ' if compression != 'none' else ''}archive, " + \
            (f"after member {state.last}" if state.last else "before any member")
        raise BenchError(f"{path}: damaged tar header at {where} ({err.reason}); expected a ustar or pax header "
                         f"with a valid checksum, or the end-of-archive block; repack the dataset") from None
    except Exception as err:  # OSError, EOFError, tarfile.ReadError, zlib.error, zstandard.ZstdError, ...
        raise _archive_error(path, state, err) from None
    missing = sorted(set(state.members) - state.found)
    if missing:
        raise BenchError(f"{path}: member {missing[0]} listed in {PACK_NAME} is missing from the archive "
                         f"({len(missing)} missing); repack the dataset")


def _archive_error(path: Path, state: _Unpacking, err: Exception) -> BenchError:
    """The error of an archive that could not be read to its end: the system failing to read it (an OSError
    with an errno: EIO, ...), or a format error (a corrupt or truncated archive), which repacking mends.
    Failed writes are BenchErrors already (`_write_verified`)."""
    what = f"while reading member {state.current}" if state.current else "between members"
    # ESPIPE: _ForwardStream refusing to seek back, which only a malformed tar stream asks for
    if isinstance(err, OSError) and err.errno is not None and err.errno != errno.ESPIPE:
        name = errno.errorcode.get(err.errno, f"errno {err.errno}")
        return BenchError(f"{path}: cannot read the archive {what}: {err.strerror} [{name}]")
    return BenchError(f"{path}: corrupt or truncated archive {what} ({type(err).__name__}: {err}); "
                      f"repack the dataset")


def _copy_members(tar: tarfile.TarFile, state: _Unpacking, dest: Path, bar, copier: pycopy.Copier) -> None:
    """The wanted members of an uncompressed archive, copied by `copier` from their byte ranges of it, a
    batch per call; tarfile reads the headers and seeks over the data."""
    jobs, where = [], str(state.path)
    for info in _listed_members(tar, state):
        if info.name in state.wanted:
            jobs.append((where, info.offset_data, info.size, state.members[info.name], where))
            if len(jobs) == BATCH_FILES or sum(job[2] for job in jobs) >= BATCH_BYTES:
                _copy_jobs(copier, dest, jobs, bar)
                jobs = []
    if jobs:
        _copy_jobs(copier, dest, jobs, bar)


def _stream_members(tar: tarfile.TarFile, stream: "_ForwardStream", state: _Unpacking, dest: Path, bar) -> None:
    """The wanted members of a compressed archive, read straight from the decompressed `stream` that `tar`
    reads the headers from (tarfile skips the rest: padding and unwanted members). Reading the data here
    rather than through `tar.extractfile` saves a copy of every byte (5-10% of the CPU time of unpacking a
    zstd archive, measured here)."""
    for info in _listed_members(tar, state):
        if info.name in state.wanted:
            _write_verified(_read_chunks(_Bounded(stream, info.size)), dest, state.members[info.name],
                            str(state.path), bar)


def _listed_members(tar: tarfile.TarFile, state: _Unpacking):
    """Each member of `tar` (named by its normalised path), which must be a regular file that pack.json
    lists for this archive; `state` records it as found once the caller is done with it."""
    for info in tar:
        name = PurePosixPath(info.name).as_posix()
        state.current = name
        if not info.isreg():
            raise BenchError(f"{state.path}: member {name!r} is not a regular file (tar type {info.type!r}); "
                             f"expected only the files {PACK_NAME} lists")
        if name not in state.members:
            raise BenchError(f"{state.path}: holds {name!r}, which {PACK_NAME} does not list for this archive")
        info.name = name
        yield info
        state.found.add(name)
        state.current, state.last = None, name


def _open_tar(fileobj) -> tarfile.TarFile:
    """tarfile reading the headers of an archive (the file, or its decompressed `_ForwardStream`) in order.

    Not tarfile's stream mode ("r|"): that copies every byte through its own buffer twice more, 10-25%
    more CPU time than reading the member data straight from the stream, measured here."""
    return tarfile.open(fileobj=fileobj, mode="r:", tarinfo=_StrictTarInfo)


class _ForwardStream:
    """A decompressed archive as tarfile reads it: `read`, `tell`, and `seek` forward only (by reading and
    discarding), so that it is read once, front to back. Seeking back is an error, never a silent re-read."""

    def __init__(self, stream: BinaryIO):
        self.stream, self.position = stream, 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.position += len(data)
        return data

    def readinto(self, buffer) -> int:
        got = self.stream.readinto(buffer)
        self.position += got
        return got

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        target = offset + (self.position if whence == os.SEEK_CUR else 0)
        if whence not in (os.SEEK_SET, os.SEEK_CUR) or target < self.position:
            raise OSError(errno.ESPIPE, f"a compressed archive is read front to back: cannot seek from byte "
                                        f"{self.position} to {target} (whence {whence})")
        buffer = _buffer()
        while self.position < target and self.readinto(buffer[:min(len(buffer), target - self.position)]):
            pass
        return self.position


class _DamagedHeader(Exception):
    """A tar header that tarfile rejects, at byte `offset` of the tar stream."""

    def __init__(self, offset: int, reason: str):
        super().__init__(f"byte {offset}: {reason}")
        self.offset, self.reason = offset, reason


MAX_PAX_HEADER = 64 << 10  # bytes


class _StrictTarInfo(tarfile.TarInfo):
    """tarfile's TarInfo, except that a damaged header is an error: `TarFile.next` takes one after the first
    member (a failed checksum, a broken pax header, the archive ending without its end-of-archive block)
    for the end of the archive and stops silently."""

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile):
        offset = tar.fileobj.tell()
        try:
            info = super().fromtarfile(tar)
        except tarfile.EOFHeaderError:  # the end-of-archive block: the archive is complete
            raise
        except tarfile.HeaderError as err:
            raise _DamagedHeader(offset, str(err) or type(err).__name__) from None
        # A negative size sends Python 3.11's tarfile back to an earlier header, for ever (CVE-2025-8194).
        if info.size < 0 or tar.offset <= offset:
            raise _DamagedHeader(offset, f"member size {info.size}: the next header would not follow this one")
        return info

    def _proc_pax(self, tar: tarfile.TarFile):
        # Python 3.11's tarfile takes time quadratic in a pax header's size (CVE-2024-6232); the packer's are a
        # few hundred bytes.
        if self.size > MAX_PAX_HEADER:
            raise tarfile.InvalidHeaderError(f"pax header of {self.size} bytes, expected at most {MAX_PAX_HEADER}")
        return super()._proc_pax(tar)


class _Bounded:
    """The next `size` bytes of a stream, read with `readinto`; a short stream is an error."""

    def __init__(self, stream, size: int):
        self.stream, self.left = stream, size

    def readinto(self, buffer) -> int:
        if self.left == 0:
            return 0
        view = memoryview(buffer)[:min(len(buffer), self.left)]
        got = self.stream.readinto(view)
        if not got:
            raise EOFError(f"the archive ends {self.left} bytes before the end of the member")
        self.left -= got
        return got


class _decompressed:
    """A readable stream of the archive's tar bytes (context manager)."""

    def __init__(self, raw: BinaryIO, compression: str):
        self.raw, self.compression, self.stream = raw, compression, None

    def __enter__(self):
        if self.compression == "zstd":
            import zstandard
            self.stream = zstandard.ZstdDecompressor().stream_reader(self.raw, read_size=CHUNK, closefd=False)
        elif self.compression == "gzip":
            import gzip
            self.stream = gzip.GzipFile(fileobj=self.raw, mode="rb")
        else:
            return self.raw
        return self.stream

    def __exit__(self, *exc):
        if self.stream is not None:
            self.stream.close()
        return False


class _NoProgress:
    """The bar of a staging that shows none (no tqdm import inside the timed staging: 50-70 ms here)."""

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, enabled: bool, scope: str):
    if not enabled:
        return _NoProgress()
    from tqdm import tqdm
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"staging {scope}",
                file=sys.stderr, mininterval=2.0)
