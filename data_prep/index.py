"""Index a CosmoFlow dataset in the official release's layout where it lies: a manifest, without a copy.

    python -m data_prep index --input DIR --out OUT [--workers K] [--verify full|quick] [--stats-files N|all]

DIR is CosmoFlow as published (cosmoUniverse_2019_05_4parE_tf_v2, made by the reference's prepare.py;
docs/datasets.md): train/ and validation/ (or val/) directories of *.tfrecord files, each a GZIP-compressed
TFRecord of one tf.train.Example (x: int16 bytes of a cube, y: 4 floats). Other subdirectories (test/) are
not indexed. Nothing is written into DIR. OUT gets:

  OUT/train -> DIR/train          links (absolute) to the split directories, so that the manifest's paths,
  OUT/validation -> DIR/val       relative to OUT as in every dataset, reach the files where they are
  OUT/manifest.json               written last: format cosmoflow-tfrecord, the compression, per file its
                                  records, bytes, sha256, xxh3-128 and uncompressed size, and input_stats
  OUT/.index-journal.jsonl        what each finished file gave, for resuming

Training reads OUT as any dataset (data.dir=OUT): tf.data reads the GZIP files in place; DALI cannot, so
stage them with data.stage_decompress=true (docs/staging.md). Per file, --verify full (the default) reads
every byte: the GZIP stream and its CRC, every record's framing and CRCs, every record an Example with x
and y of the first file's sizes and in range (the checks of `validate`); --verify quick hashes the file,
reads the first record's header and takes the record count from the GZIP trailer (the stream's size),
reading a file whole only when the trailer does not match one record. Both hash every byte (sha256 and
xxh3-128, one pass) and compare every single-record file's size with the first file's. input_stats (for
data.normalize) are the per-channel mean and std of log(1 + x) over the training files, or over N of them
evenly spaced in name order with --stats-files N (0: none), as the manifest says.

Files are indexed by --workers processes, a batch of files per task, with a progress bar. Each finished
file is appended to the journal; a rerun with the same DIR skips the files the journal holds with the same
size and modification time. A bad file stops nothing: all are listed at the end (exit 2) and the good ones
stay in the journal. docs/datasets.md has the rates.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import multiprocessing
import os
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from common.base.errors import BenchError
from common.base.files import atomic_path, write_text_atomic
from common.io.crc import masked_crc32c
from common.io.decompress import WHOLE_MAX_BYTES, DigestingReader, record_stream
from common.io.formats import SPLITS, TRAIN
from common.io.formats import cosmoflow as record_format, cosmoflow_prep
from common.io.manifest import MANIFEST_NAME, FileEntry, Manifest, SplitEntry
from common.io.manifest_write import write_manifest
from common.io.tfrecord import FRAMING_BYTES, HEADER_BYTES, LENGTH_BYTES, FramingError, data_crc_error, iter_frames
from data_prep import tfrecords, validate

JOURNAL_NAME = ".index-journal.jsonl"
JOURNAL_VERSION = 1
VERIFY = ("full", "quick")
GZIP_MAGIC = b"\x1f\x8b"
# Deflate expands at most 1032:1, so the GZIP trailer's size (mod 2^32) is the whole stream's for a smaller file.
DEFLATE_MAX_RATIO = 1032
FLUSH_LINES, FLUSH_SECONDS = 256, 2.0  # the journal is synced to disk this often
SHOWN_PROBLEMS = 10
BATCH_FILES = 16  # files per task of a worker process, at most
COMPACT_ABOVE = 10_000  # files: a larger manifest is written as compact JSON


@dataclasses.dataclass(frozen=True)
class Listed:
    """A record file as listed in its split directory."""

    name: str
    bytes: int
    mtime_ns: int


@dataclasses.dataclass(frozen=True)
class Layout:
    """The release found in the input directory."""

    input: Path  # absolute
    split_dirs: dict[str, str]  # split -> its directory's name in the input
    files: dict[str, tuple[Listed, ...]]  # split -> its *.tfrecord files, sorted by name
    ignored_dirs: tuple[str, ...]  # subdirectories not indexed
    other_files: int  # entries of the split directories that are not *.tfrecord files


@dataclasses.dataclass(frozen=True)
class Sample:
    """What the first record says every record holds."""

    compression: str  # "gzip" or "none"
    shape: tuple[int, ...]
    record_bytes: int  # the first record's framed size: every single-record file's uncompressed size


@dataclasses.dataclass(frozen=True)
class FileJob:
    split: str
    path: Path
    listed: Listed
    verify: str
    stats: bool  # add the log1p moments of its samples (read whole then)
    spec: validate.RecordSpec


@dataclasses.dataclass
class FileFacts:
    """What indexing one file found; a journal line without its problems."""

    split: str
    name: str
    bytes: int
    mtime_ns: int
    compression: str = "none"
    records: int = 0
    uncompressed_bytes: int = 0
    sha256: str = ""
    xxh3_128: str = ""
    verified: str = "full"
    moments: list | None = None  # (3, C) log1p moments of its samples, when they were computed
    problems: list[str] = dataclasses.field(default_factory=list)

    def journal_line(self) -> str:
        return json.dumps({k: v for k, v in dataclasses.asdict(self).items() if k != "problems"},
                          separators=(",", ":"))


# ---------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, type=Path, metavar="DIR",
                        help="the release: train/ and validation/ (or val/) of *.tfrecord files; never written to")
    parser.add_argument("--out", required=True, type=Path, metavar="OUT",
                        help="directory for the manifest, the split links and the journal (not inside DIR)")
    parser.add_argument("--workers", type=tfrecords.positive_int, default=tfrecords.available_cpus(), metavar="K",
                        help="processes indexing files in parallel (default: CPUs available, %(default)s)")
    parser.add_argument("--verify", choices=VERIFY, default="full",
                        help="full: read every byte of every record (default); quick: hash files, count records "
                             "from the GZIP trailer")
    parser.add_argument("--stats-files", type=_stats_files, default=None, metavar="N",
                        help="training files input_stats are computed over: N evenly spaced in name order, 0 for "
                             "none, or 'all' (default)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    layout = find_layout(args.input)
    prepare_out(layout, args.out)
    sample = probe(layout)
    spec = record_spec(sample)
    stats_names = stats_sample([f.name for f in layout.files[TRAIN]], args.stats_files)
    journal, earlier = Journal.open(args.out / JOURNAL_NAME, journal_header(layout))
    (args.out / MANIFEST_NAME).unlink(missing_ok=True)  # a manifest never describes an index in flux
    jobs, reused = plan_jobs(layout, earlier, args.verify, stats_names, spec)
    t0 = time.perf_counter()
    with journal, _pool(min(args.workers, max(1, len(jobs))), parses=args.verify == "full" or bool(stats_names)) as pool:
        t1 = time.perf_counter()
        fresh = run_jobs(jobs, pool, journal)
        seconds = time.perf_counter() - t1
    facts = reused + fresh
    check_problems(facts, sample, layout)
    link_splits(layout, args.out)
    manifest = build_manifest(layout, args.out, facts, sample, input_stats(facts, stats_names, layout))
    write_manifest(manifest, args.out, indent=2 if len(facts) <= COMPACT_ABOVE else None)
    figures = rate_figures(fresh, reused, seconds, t1 - t0, time.perf_counter() - started, args)
    print(json.dumps(figures, indent=2) if args.json else summary_line(manifest, figures, args.out), flush=True)
    return 0


def _stats_files(text: str) -> int | None:
    if text == "all":
        return None
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


# ---------------------------------------------------------------------------- the input
def find_layout(input_dir: Path) -> Layout:
    """The split directories and record files of a release; BenchError when the layout is not there."""
    if not input_dir.is_dir():
        raise BenchError(f"{input_dir}: input directory not found (expected the CosmoFlow release: train/ and "
                         f"validation/ or val/ of *.tfrecord files)")
    root = input_dir.resolve()
    subdirs = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    split_dirs = {split: _split_dir(root, split, subdirs) for split in SPLITS}
    files, other = {}, 0
    for split, name in split_dirs.items():
        files[split], others = _list_files(root / name)
        other += others
        if not files[split]:
            raise BenchError(f"{root / name}: no *{cosmoflow_prep.RELEASED_SUFFIX} files among its {others} entries; "
                             f"expected the {split} split's record files")
    ignored = tuple(d for d in subdirs if d not in split_dirs.values())
    return Layout(input=root, split_dirs=split_dirs, files=files, ignored_dirs=ignored, other_files=other)


def _split_dir(root: Path, split: str, subdirs: list[str]) -> str:
    """The one directory of `split` among the names the releases used for it."""
    names = cosmoflow_prep.RELEASED_SPLIT_DIRS[split]
    found = [name for name in names if name in subdirs]
    if len(found) != 1:
        what = f"both {' and '.join(n + '/' for n in found)}" if found else f"no {' or '.join(n + '/' for n in names)}"
        raise BenchError(f"{root}: {what} (subdirectories: {subdirs}); expected exactly one {split} directory "
                         f"of the CosmoFlow release layout")
    return found[0]


def _list_files(directory: Path) -> tuple[tuple[Listed, ...], int]:
    """The directory's record files sorted by name, and how many other entries it has."""
    listed, other = [], 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith(cosmoflow_prep.RELEASED_SUFFIX) and entry.is_file() and entry.name[0] != ".":
                st = entry.stat()
                listed.append(Listed(entry.name, st.st_size, st.st_mtime_ns))
            else:
                other += 1
    return tuple(sorted(listed, key=lambda f: f.name)), other


def prepare_out(layout: Layout, out: Path) -> None:
    """OUT must be new, empty or an earlier index (with its journal), and outside the input."""
    where = out.resolve()
    if where == layout.input or layout.input in where.parents:
        raise BenchError(f"{out}: inside the input {layout.input}, which index never writes to; choose an --out "
                         f"outside it")
    if out.exists() and not out.is_dir():
        raise BenchError(f"{out}: exists and is not a directory; choose another --out")
    if out.is_dir() and not (out / JOURNAL_NAME).is_file():
        entries = sorted(p.name for p in out.iterdir())
        if entries:
            raise BenchError(f"{out}: holds {entries[:5]} but no {JOURNAL_NAME}, so it is not an index made by "
                             f"data_prep index; choose an empty or new --out")
    out.mkdir(parents=True, exist_ok=True)


def probe(layout: Layout) -> Sample:
    """The compression and sample shape of the release, from the first record of the first training file."""
    path = layout.input / layout.split_dirs[TRAIN] / layout.files[TRAIN][0].name
    with open(path, "rb") as raw:
        compression = "gzip" if raw.read(2) == GZIP_MAGIC else "none"
        raw.seek(0)
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if compression == "gzip" else raw
        try:
            frame = next(iter_frames(stream, path), None)
            if frame is None:
                raise ValueError("no record")
            x, y = cosmoflow_prep.parse_record(frame.payload)
        except (FramingError, ValueError, OSError, EOFError, zlib.error) as err:
            raise BenchError(f"{path}: the first record cannot be read ({err}); expected "
                             f"{record_format.describe()}") from None
    n = cosmoflow_prep.edge_of(len(x))
    if n is None or len(y) != record_format.TARGET_SIZE:
        raise BenchError(f"{path}: the first record's x has {len(x)} bytes and y {len(y)} floats; expected the "
                         f"int16 bytes of an (n, n, n, {record_format.CHANNELS}) cube and "
                         f"{record_format.TARGET_SIZE} floats")
    return Sample(compression=compression, shape=record_format.sample_shape(n), record_bytes=frame.size)


def record_spec(sample: Sample) -> validate.RecordSpec:
    """What `validate` checks every record against, for samples of the probed shape."""
    manifest = Manifest(root=Path("."), format=record_format.FORMAT, version=record_format.VERSION,
                        sample_shape=sample.shape, sample_dtype=record_format.SAMPLE_DTYPE,
                        target_size=record_format.TARGET_SIZE, compression=sample.compression, splits={},
                        source={})
    spec, findings = validate.record_spec(manifest)
    if spec is None:  # cannot happen: the probed shape is the format's by construction
        raise RuntimeError(f"no record spec for shape {list(sample.shape)}: {findings}")
    return spec


def stats_sample(names: list[str], count: int | None) -> set[str]:
    """The training files input_stats are computed over: all (count None), none (0), or `count` evenly spaced."""
    if count is None or count >= len(names):
        return set(names)
    return {names[i * len(names) // count] for i in range(count)}


# ---------------------------------------------------------------------------- the journal
def journal_header(layout: Layout) -> dict:
    return {"journal": "data_prep index", "version": JOURNAL_VERSION, "input": str(layout.input),
            "split_dirs": layout.split_dirs}


class Journal:
    """OUT/.index-journal.jsonl: a header line, then one line per file indexed; synced every few seconds."""

    def __init__(self, path: Path):
        self.path, self.unsynced, self.synced_at = path, 0, time.monotonic()
        self.file = open(path, "a")

    @classmethod
    def open(cls, path: Path, header: dict) -> tuple["Journal", dict[tuple[str, str], FileFacts]]:
        """The journal, rewritten with the earlier run's whole lines (a killed run may leave half of one),
        and those lines by (split, name). Raises BenchError when the earlier run indexed another input."""
        earlier = _read_journal(path, header) if path.is_file() else {}
        lines = [json.dumps(header)] + [f.journal_line() for f in earlier.values()]
        write_text_atomic("\n".join(lines) + "\n", path)
        return cls(path), earlier

    def append(self, facts: FileFacts) -> None:
        self.file.write(facts.journal_line() + "\n")
        self.unsynced += 1
        if self.unsynced >= FLUSH_LINES or time.monotonic() - self.synced_at >= FLUSH_SECONDS:
            self.sync()

    def sync(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.unsynced, self.synced_at = 0, time.monotonic()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc) -> None:
        self.sync()
        self.file.close()


def _read_journal(path: Path, header: dict) -> dict[tuple[str, str], FileFacts]:
    lines = path.read_text().splitlines()
    try:
        earlier = json.loads(lines[0]) if lines else {}
    except json.JSONDecodeError:
        earlier = {}
    differs = [k for k in header if earlier.get(k) != header[k]]
    if differs:
        raise BenchError(f"{path}: an index of another input ({differs[0]} {earlier.get(differs[0])!r}, this run "
                         f"{header[differs[0]]!r}); use another --out, or delete {path.parent} to index afresh")
    facts = {}
    for line in lines[1:]:
        try:
            entry = FileFacts(**json.loads(line))
        except (json.JSONDecodeError, TypeError):  # the half-written last line of a killed run
            continue
        facts[(entry.split, entry.name)] = entry
    return facts


def plan_jobs(layout: Layout, earlier: dict, verify: str, stats_names: set[str],
              spec: validate.RecordSpec) -> tuple[list[FileJob], list[FileFacts]]:
    """The files to index now, and the journal's facts of the others (same size and time, checked at least as
    thoroughly, with moments when they are wanted)."""
    jobs, reused = [], []
    for split in SPLITS:
        directory = layout.input / layout.split_dirs[split]
        for listed in layout.files[split]:
            stats = split == TRAIN and listed.name in stats_names
            done = earlier.get((split, listed.name))
            if (done is not None and (done.bytes, done.mtime_ns) == (listed.bytes, listed.mtime_ns)
                    and (verify == "quick" or done.verified == "full") and (done.moments or not stats)):
                reused.append(done)
            else:
                jobs.append(FileJob(split, directory / listed.name, listed, verify, stats, spec))
    return jobs, reused


# ---------------------------------------------------------------------------- one file
def index_file(job: FileJob) -> FileFacts:
    """Hash one file, count its records and check them as --verify says; problems are returned, not raised."""
    facts = FileFacts(job.split, job.listed.name, job.listed.bytes, job.listed.mtime_ns, verified=job.verify)
    try:
        if job.verify == "quick" and not job.stats and job.listed.bytes <= WHOLE_MAX_BYTES:
            _read_quick(job, facts)
        else:
            _read_full(job, facts)
    except OSError as err:  # the file vanished or the disk failed
        facts.problems.append(f"{job.path}: cannot be read ({err})")
    if facts.bytes != job.listed.bytes:
        facts.problems.append(f"{job.path}: {facts.bytes} bytes read, {job.listed.bytes} listed; the file changed "
                              f"while it was indexed")
    return facts


def _digesting(raw) -> DigestingReader:
    """The file, read through sha256 and xxh3-128 (the manifest's digests)."""
    import xxhash
    return DigestingReader(raw, hashlib.sha256(), xxhash.xxh3_128())


def _finish(reader: DigestingReader, facts: FileFacts) -> None:
    """Read the rest of the file; record its size and digests."""
    reader.drain()
    facts.bytes = reader.count
    facts.sha256, facts.xxh3_128 = (d.hexdigest() for d in reader.digests)


def _read_full(job: FileJob, facts: FileFacts) -> None:
    """Every byte: the GZIP stream, the framing and CRCs, every record checked (and its moments when wanted)."""
    facts.verified = "full"
    with open(job.path, "rb") as raw:
        facts.compression = "gzip" if raw.read(2) == GZIP_MAGIC else "none"
        raw.seek(0)
        reader = _digesting(raw)
        stream = record_stream(reader, facts.compression, job.listed.bytes)
        moments = np.zeros((3, record_format.CHANNELS))
        try:
            for frame in iter_frames(stream, job.path):
                facts.records += 1
                facts.uncompressed_bytes += frame.size
                _check_frame(frame, job, facts, moments)
        except FramingError as err:
            facts.problems.append(str(err))
        except (EOFError, zlib.error, gzip.BadGzipFile) as err:
            facts.problems.append(f"{job.path}: the GZIP stream breaks after {facts.records} whole record(s) ({err}); "
                                  f"expected a complete GZIP file")
        _finish(reader, facts)
    if job.stats:
        facts.moments = moments.tolist()


def _check_frame(frame, job: FileJob, facts: FileFacts, moments: np.ndarray) -> None:
    bad_crc = data_crc_error(frame, job.path)
    if bad_crc is not None:
        facts.problems.append(str(bad_crc))
        return
    problems, _ = validate.check_example(frame.payload, job.spec)
    facts.problems += [f"{job.path}: record {frame.number}: {found}; expected {expected}"
                       for _, found, expected in problems]
    if job.stats and not problems:
        x, _ = cosmoflow_prep.parse_record(frame.payload)
        counts = np.frombuffer(x, dtype=record_format.STORED_SAMPLE_DTYPE)  # >= 0: check_example checked
        moments += cosmoflow_prep.log1p_moments(counts.reshape(-1, record_format.CHANNELS))


def _read_quick(job: FileJob, facts: FileFacts) -> None:
    """Hash the whole file; count its records from the GZIP trailer when it says one record, else read it."""
    facts.verified = "quick"
    with open(job.path, "rb") as raw:
        reader = _digesting(raw)
        data = reader.read()
        _finish(reader, facts)
    facts.compression = "gzip" if data[:2] == GZIP_MAGIC else "none"
    if facts.compression == "gzip":
        records = _one_record_from_trailer(data, job.path, facts)
        if records is None:
            _read_full(job, facts)  # not one record, or a stream the trailer cannot describe: read it
            facts.verified = "quick"
        return
    try:
        for frame in iter_frames(io.BytesIO(data), job.path):
            facts.records += 1
            facts.uncompressed_bytes += frame.size
    except FramingError as err:
        facts.problems.append(str(err))


def _one_record_from_trailer(data: bytes, path: Path, facts: FileFacts) -> int | None:
    """1, with the stream's size set, when the first record's length header and the GZIP trailer's size say the
    file holds exactly one record; None when they do not (or the file is too large for the trailer to tell)."""
    try:
        head = zlib.decompressobj(wbits=31).decompress(data, HEADER_BYTES)  # 31: a GZIP wrapper
    except zlib.error as err:
        facts.problems.append(f"{path}: not a readable GZIP stream ({err}); expected a GZIP-compressed TFRecord")
        return 0
    if len(head) < HEADER_BYTES or masked_crc32c(head[:LENGTH_BYTES]) != int.from_bytes(head[LENGTH_BYTES:], "little"):
        return None  # read whole, where the framing error gets its full description
    stream_bytes = int.from_bytes(head[:LENGTH_BYTES], "little") + FRAMING_BYTES
    if len(data) * DEFLATE_MAX_RATIO >= 2 ** 32 or int.from_bytes(data[-4:], "little") != stream_bytes % 2 ** 32:
        return None
    facts.records, facts.uncompressed_bytes = 1, stream_bytes
    return 1


# ---------------------------------------------------------------------------- all files
def run_jobs(jobs: list[FileJob], pool: "_Pool", journal: Journal) -> list[FileFacts]:
    """index_file(job) for every job on the pool's workers, a batch of files per task, with a progress bar;
    clean files go to the journal as their batch finishes."""
    from tqdm import tqdm
    results = []
    size = max(1, min(BATCH_FILES, len(jobs) // (8 * pool.workers)))
    batches = [jobs[i:i + size] for i in range(0, len(jobs), size)]
    with tqdm(total=sum(job.listed.bytes for job in jobs), unit="B", unit_scale=True, unit_divisor=1024,
              desc="index", file=sys.stderr, mininterval=2.0, disable=not jobs) as bar:
        for batch in _bounded_map(pool.executor, index_files, batches, 2 * pool.workers):
            for facts in batch:
                results.append(facts)
                if not facts.problems:
                    journal.append(facts)
                bar.update(facts.bytes)
    return results


def index_files(jobs: list[FileJob]) -> list[FileFacts]:
    """index_file of each job (one task of a worker process)."""
    return [index_file(job) for job in jobs]


@dataclasses.dataclass(frozen=True)
class _Pool:
    executor: concurrent.futures.Executor
    workers: int


@contextlib.contextmanager
def _pool(workers: int, parses: bool):
    """One thread of this process for one worker, else `workers` spawned processes (processes, not threads: a
    fifth to a quarter of indexing a file holds the interpreter lock, which would cap threads at about 4x),
    started before it is returned, with TensorFlow's Example class imported when records are `parses`d. On an
    error or interrupt the running tasks finish and the queued ones are cancelled."""
    if workers == 1:
        executor = concurrent.futures.ThreadPoolExecutor(1)
    else:
        executor = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        # One start-up task per worker, all submitted at once: each starts a process (which imports TensorFlow
        # for 5-7 s when it parses records) before the first file, so the files' rate is that of ready workers.
        for future in [executor.submit(_start_worker, parses, workers) for _ in range(workers)]:
            future.result()
        yield _Pool(executor, workers)
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def _start_worker(parses: bool, workers: int) -> None:
    if parses:
        cosmoflow_prep.example_class()
    if workers > 1:
        time.sleep(0.2)  # hold this process a moment, so that each start-up task goes to a process of its own


def _bounded_map(pool: concurrent.futures.Executor, function, items: list, window: int):
    """function(item) for each item, in order, with at most `window` submitted at a time (hundreds of
    thousands of files would otherwise all be queued at once)."""
    pending = collections.deque()
    for item in items:
        pending.append(pool.submit(function, item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def check_problems(facts: list[FileFacts], sample: Sample, layout: Layout) -> None:
    """Raise BenchError listing the bad files: unreadable ones, and those whose compression or (single-record
    files) size differs from the first file's."""
    first = layout.input / layout.split_dirs[TRAIN] / layout.files[TRAIN][0].name
    problems = []
    for f in facts:
        path = layout.input / layout.split_dirs[f.split] / f.name
        problems += f.problems
        if not f.problems and f.compression != sample.compression:
            problems.append(f"{path}: {f.compression}-compressed, but {first.name} is {sample.compression}")
        elif not f.problems and f.records == 1 and f.uncompressed_bytes != sample.record_bytes:
            problems.append(f"{path}: its record has {f.uncompressed_bytes} bytes framed, but {first.name}'s has "
                            f"{sample.record_bytes}; expected samples of shape {list(sample.shape)} throughout")
    if problems:
        shown = "; ".join(problems[:SHOWN_PROBLEMS])
        more = f" (and {len(problems) - SHOWN_PROBLEMS} more)" if len(problems) > SHOWN_PROBLEMS else ""
        raise BenchError(f"{len(problems)} problems in {layout.input}: {shown}{more}. No manifest was written; the "
                         f"good files are in the journal, so after replacing the bad ones a rerun reads only those")


# ---------------------------------------------------------------------------- the output
def link_splits(layout: Layout, out: Path) -> None:
    """OUT/<split> -> the input's split directory (absolute), replacing an earlier link."""
    for split, name in layout.split_dirs.items():
        link = out / split
        if link.exists() and not link.is_symlink():
            raise BenchError(f"{link}: exists and is not a link; delete it (index links it to {layout.input / name})")
        with atomic_path(link) as tmp:
            os.symlink(layout.input / name, tmp, target_is_directory=True)


def build_manifest(layout: Layout, out: Path, facts: list[FileFacts], sample: Sample, stats: dict) -> Manifest:
    by_name = {(f.split, f.name): f for f in facts}
    splits = {}
    for split in SPLITS:
        entries = tuple(_entry(by_name[(split, listed.name)]) for listed in layout.files[split])
        splits[split] = SplitEntry(samples=sum(e.records for e in entries), files=entries)
    verified = collections.Counter(f.verified for f in facts)
    source = {"kind": cosmoflow_prep.RELEASED_SOURCE_KIND, "dir": str(layout.input), "split_dirs": layout.split_dirs,
              "links": "each split directory of this dataset links to the input's",
              "ignored_dirs": list(layout.ignored_dirs), "verified": {v: verified[v] for v in VERIFY}}
    return Manifest(root=out, format=record_format.FORMAT, version=record_format.VERSION, sample_shape=sample.shape,
                    sample_dtype=record_format.SAMPLE_DTYPE, target_size=record_format.TARGET_SIZE,
                    compression=sample.compression, splits=splits, source=source, input_stats=stats)


def _entry(f: FileFacts) -> FileEntry:
    return FileEntry(path=f"{f.split}/{f.name}", records=f.records, bytes=f.bytes, sha256=f.sha256, index=None,
                     index_sha256=None, xxh3_128=f.xxh3_128,
                     uncompressed_bytes=f.uncompressed_bytes if f.compression != "none" else None)


def input_stats(facts: list[FileFacts], stats_names: set[str], layout: Layout) -> dict:
    """input_stats over the sampled training files ({} when none were asked for)."""
    if not stats_names:
        return {}
    moments = [np.asarray(f.moments) for f in facts if f.split == TRAIN and f.name in stats_names]
    total = len(layout.files[TRAIN])
    sampling = "all" if len(stats_names) == total else "evenly spaced in name order"
    return cosmoflow_prep.input_stats(np.sum(moments, axis=0), TRAIN, {"files": len(moments), "files_in_split": total,
                                                                       "sampling": sampling})


def rate_figures(fresh: list[FileFacts], reused: list[FileFacts], seconds: float, start_seconds: float,
                 total_seconds: float, args: argparse.Namespace) -> dict:
    """Files/s and GB/s of the files indexed in this run: the per-file phase, without the start of the workers
    (`start_seconds`) or the rest of the command (in `total_seconds`)."""
    nbytes = sum(f.bytes for f in fresh)
    return {"files": len(fresh), "files_reused": len(reused), "bytes": nbytes,
            "uncompressed_bytes": sum(f.uncompressed_bytes for f in fresh), "seconds": seconds,
            "workers_start_seconds": start_seconds, "total_seconds": total_seconds,
            "files_per_second": len(fresh) / max(seconds, 1e-9), "gb_per_second": nbytes / max(seconds, 1e-9) / 1e9,
            "workers": args.workers, "verify": args.verify}


def summary_line(manifest: Manifest, figures: dict, out: Path) -> str:
    splits = ", ".join(f"{name} {len(s.files)} files / {s.samples} samples" for name, s in manifest.splits.items())
    return (f"index: {splits} of shape {list(manifest.sample_shape)} ({manifest.compression}); indexed "
            f"{figures['files']} files ({figures['bytes'] / 1e9:.3f} GB, {figures['files_reused']} from the journal) "
            f"in {figures['seconds']:.1f} s: {figures['files_per_second']:.1f} files/s, "
            f"{figures['gb_per_second']:.3f} GB/s, {figures['workers']} workers, --verify {figures['verify']} "
            f"-> {out / MANIFEST_NAME}")
