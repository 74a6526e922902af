"""Check a converted dataset against its manifest and report every problem found, with file and record.

`python -m data_prep validate DATA_DIR [--json REPORT] [--workers K]` reads the dataset's manifest.json
(CosmoFlow or DeepCAM TFRecords, GZIP-compressed or not) and checks, without writing anything into
DATA_DIR:
  files       every listed record file, DALI index and auxiliary file is present with its listed size
              and checksum (xxh3-128, or sha256 where the manifest has no xxh3); no file in a split
              directory is missing from the manifest
  framing     every record's length CRC and data CRC (masked CRC32C, as TensorFlow writes them), the
              record count of every file, every DALI index line against the record it points at
  records     every record is a tf.train.Example with the format's features, of the sizes the
              manifest's sample shape and dtype (and target size or shape) give
  values      no NaN or infinity; CosmoFlow targets in [-1, 1] (unitPar) and counts >= 0, DeepCAM
              labels 0, 1 or 2
  splits      no file listed in two splits, no sample (the same sample bytes) in two splits
Records are numbered from 0. A record whose data CRC fails is not examined further. Problems are
printed grouped by kind (at most --max-per-kind of each, the counts complete) and, with --json,
written as a machine-readable report. Exit status: 0 when there is no problem, 1 when there are
problems, 2 when DATA_DIR or its manifest cannot be read. See docs/validation.md.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import hashlib
import math
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from common.base import exits
from common.base.files import write_json_atomic
from common.io.formats import cosmoflow as cosmo_format
from common.io.formats import deepcam as deepcam_format
from common.io.manifest import MANIFEST_NAME, FileEntry, Manifest, load_manifest
from common.io.tfrecord import FramingError, data_crc_error, iter_frames, read_fully
from data_prep import tfrecords

# Problem kinds, in report order, with what each means.
KINDS = {
    "manifest": "the manifest describes samples this format does not have, or lists a file twice",
    "missing": "a file the manifest lists is not there or cannot be read",
    "size": "a file's size differs from the manifest's",
    "checksum": "a file's digest differs from the manifest's (same size: changed bytes)",
    "unlisted": "a file in a split directory that the manifest does not list",
    "framing": "a record's length is corrupt or the file ends inside a record (the rest of the file is unread)",
    "crc": "a record's data does not match its CRC",
    "records": "a file holds another number of records than the manifest says",
    "index": "a DALI index line does not point at its record",
    "parse": "a record is not a tf.train.Example with the format's features",
    "shape": "a feature holds another number of values than the manifest's shapes give",
    "non_finite": "a sample or target holds NaN or infinity",
    "range": "values outside the range the format allows",
    "overlap": "the same file or sample is in two splits",
}
CHUNK = 8 << 20


@dataclasses.dataclass(frozen=True)
class Finding:
    """One problem: where (path relative to the dataset, record number or None), what was found, what was expected."""

    kind: str
    path: str
    record: int | None
    found: str
    expected: str

    @property
    def message(self) -> str:
        where = self.path if self.record is None else f"{self.path} record {self.record}"
        return f"{where}: {self.found}; expected {self.expected}"

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "message": self.message}


# ---------------------------------------------------------------------------- what a record must hold
@dataclasses.dataclass(frozen=True)
class RecordSpec:
    """The features of one record of a format, with the sizes the manifest gives."""

    sample_key: str
    sample_dtype: np.dtype
    sample_shape: tuple[int, ...]
    target_key: str
    target_dtype: np.dtype
    target_shape: tuple[int, ...]
    target_is_floats: bool  # a FloatList feature (CosmoFlow's y), else raw bytes (DeepCAM's label map)
    check_values: Callable[[np.ndarray, np.ndarray], list[tuple[str, str, str]]]  # -> (kind, found, expected)


def record_spec(manifest: Manifest) -> tuple[RecordSpec | None, list[Finding]]:
    """The record layout of the manifest's format, or None and the findings saying why it has none."""
    try:
        sample_dtype = np.dtype(manifest.sample_dtype).newbyteorder("<")
    except TypeError:
        return None, [Finding("manifest", MANIFEST_NAME, None, f"sample_dtype {manifest.sample_dtype!r}",
                              "a numpy dtype")]
    if manifest.format == cosmo_format.FORMAT:
        problem = cosmo_format.layout_problem(manifest)
        spec = RecordSpec(cosmo_format.SAMPLE_KEY, sample_dtype, manifest.sample_shape, cosmo_format.TARGET_KEY,
                          cosmo_format.STORED_TARGET_DTYPE, (manifest.target_size,), True, _cosmo_values)
    else:  # deepcam-tfrecord (load_manifest accepts no other format)
        problem = deepcam_format.layout_problem(manifest)
        spec = RecordSpec(deepcam_format.SAMPLE_KEY, sample_dtype, manifest.sample_shape, deepcam_format.TARGET_KEY,
                          deepcam_format.STORED_TARGET_DTYPE, tuple(manifest.target_shape or ()), False,
                          _deepcam_values)
    if problem:
        return None, [Finding("manifest", MANIFEST_NAME, None, *problem)]
    return spec, []


def _cosmo_values(x: np.ndarray, y: np.ndarray) -> list[tuple[str, str, str]]:
    problems = []
    x_name, y_name = cosmo_format.SAMPLE_KEY, cosmo_format.TARGET_KEY
    if x.dtype.kind == "i" and (negative := np.flatnonzero(x < 0)).size:
        position = tuple(int(i) for i in np.unravel_index(negative[0], x.shape))
        problems.append(("range", f"{x_name} holds {negative.size} negative counts (first {x.flat[negative[0]]} "
                         f"at {position})", "particle counts >= 0"))
    if x.dtype.kind == "f":
        problems += _non_finite(x_name, x)
    problems += _non_finite(y_name, y)
    low, high = cosmo_format.TARGET_RANGE
    outside = np.isfinite(y) & ((y < low) | (y > high))
    if outside.any():
        values = ", ".join(f"{v:.7g}" for v in y.tolist())  # float32's digits, not float64's
        problems.append(("range", f"{y_name} is [{values}]", f"targets in [{low:g}, {high:g}] (unitPar)"))
    return problems


def _deepcam_values(x: np.ndarray, y: np.ndarray) -> list[tuple[str, str, str]]:
    problems = _non_finite(deepcam_format.SAMPLE_KEY, x)
    classes = deepcam_format.CLASSES
    bad = np.flatnonzero(~np.isin(y, classes))
    if bad.size:
        position = tuple(int(i) for i in np.unravel_index(bad[0], y.shape))
        problems.append(("range", f"{deepcam_format.TARGET_KEY} holds {bad.size} values outside {set(classes)} "
                         f"(first {y.flat[bad[0]]} at (h, w) = {position})", f"classes {', '.join(map(str, classes))}"))
    return problems


def _non_finite(name: str, values: np.ndarray) -> list[tuple[str, str, str]]:
    bad = ~np.isfinite(values)
    if not bad.any():
        return []
    first = int(np.argmax(bad.ravel()))
    position = tuple(int(i) for i in np.unravel_index(first, values.shape))
    nan = int(np.isnan(values).sum())
    return [("non_finite", f"{name} holds {nan} NaN and {int(bad.sum()) - nan} infinite values (first "
             f"{values.flat[first]} at {position})", "finite numbers")]


def check_example(payload: bytes, spec: RecordSpec) -> tuple[list[tuple[str, str, str]], bytes | None]:
    """The problems of one record's payload as (kind, found, expected), and the digest of its sample bytes
    (None when the record does not parse)."""
    from google.protobuf.message import DecodeError
    example_pb2 = _example_proto()
    try:
        features = example_pb2.Example.FromString(payload).features.feature
    except DecodeError as err:
        return [("parse", f"{len(payload)} bytes that are not a tf.train.Example ({err})",
                 f"an Example with features {spec.sample_key!r} and {spec.target_key!r}")], None
    sample_bytes, problems = _bytes_feature(features, spec.sample_key)
    if spec.target_is_floats:
        target, target_problems = _float_feature(features, spec.target_key)
    else:
        target_bytes, target_problems = _bytes_feature(features, spec.target_key)
        target = None if target_bytes is None else np.frombuffer(target_bytes, dtype=spec.target_dtype)
    problems += target_problems
    if problems:
        return problems, None
    x = _shaped(sample_bytes, spec.sample_key, spec.sample_dtype, spec.sample_shape, problems)
    y = _shaped(target, spec.target_key, spec.target_dtype, spec.target_shape, problems)
    if x is not None and y is not None:
        problems += spec.check_values(x, y)
    import xxhash
    return problems, xxhash.xxh3_128_digest(sample_bytes)


def _example_proto():
    tfrecords.quiet_tensorflow()  # the generated class comes with TensorFlow
    from tensorflow.core.example import example_pb2
    return example_pb2


def _bytes_feature(features, key: str) -> tuple[bytes | None, list[tuple[str, str, str]]]:
    """The single bytes value of feature `key`, or None and the problem."""
    if key not in features:
        return None, [("parse", f"no feature {key!r} (found {sorted(features)})", f"a bytes feature {key!r}")]
    feature = features[key]
    kind = feature.WhichOneof("kind")
    if kind != "bytes_list" or len(feature.bytes_list.value) != 1:
        count = len(getattr(feature, kind).value) if kind else 0
        return None, [("parse", f"feature {key!r} is a {kind} of {count} values", "one bytes value")]
    return feature.bytes_list.value[0], []


def _float_feature(features, key: str) -> tuple[np.ndarray | None, list[tuple[str, str, str]]]:
    """The values of float feature `key` as float32, or None and the problem."""
    if key not in features:
        return None, [("parse", f"no feature {key!r} (found {sorted(features)})", f"a float feature {key!r}")]
    feature = features[key]
    kind = feature.WhichOneof("kind")
    if kind != "float_list":
        return None, [("parse", f"feature {key!r} is a {kind}", "a float_list")]
    return np.asarray(feature.float_list.value, dtype=np.float32), []


def _shaped(raw: bytes | np.ndarray, key: str, dtype: np.dtype, shape: tuple[int, ...],
            problems: list) -> np.ndarray | None:
    """`raw` as an array of `shape`, or None with a "shape" problem when its size differs."""
    count = math.prod(shape)
    if isinstance(raw, np.ndarray):
        if raw.size != count:
            problems.append(("shape", f"{key} holds {raw.size} values", f"{count} (shape {list(shape)})"))
            return None
        return raw.reshape(shape)
    if len(raw) != count * dtype.itemsize:
        problems.append(("shape", f"{key} holds {len(raw)} bytes",
                         f"{count * dtype.itemsize} bytes for shape {list(shape)} {dtype.name}"))
        return None
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


# ---------------------------------------------------------------------------- reading files
class _Counter:
    """Bytes read so far by every worker thread."""

    def __init__(self):
        self.value = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


class _HashingReader:
    """A binary file whose every byte read is digested and counted."""

    def __init__(self, file, digest, counter: _Counter):
        self._file, self.digest, self._counter = file, digest, counter

    def read(self, n: int = -1) -> bytes:
        data = self._file.read(n)
        self.digest.update(data)
        self._counter.add(len(data))
        return data

    def drain(self) -> None:
        """Read (and digest) the rest of the file."""
        while self.read(CHUNK):
            pass


def _digest(sha256: str, xxh3_128: str | None) -> tuple[str, str, object]:
    """(name, expected hex, fresh hasher): xxh3-128 when the manifest records it, else sha256."""
    if xxh3_128:
        import xxhash
        return "xxh3_128", xxh3_128, xxhash.xxh3_128()
    return "sha256", sha256, hashlib.sha256()


def _present(root: Path, rel: str, expected_bytes: int | None, findings: list[Finding]) -> int | None:
    """The size of listed file `rel`, or None (and a "missing" finding); a "size" finding when it differs."""
    try:
        size = (root / rel).stat().st_size if (root / rel).is_file() else None
    except OSError as err:
        findings.append(Finding("missing", rel, None, f"cannot be read ({err.strerror})", "a readable file"))
        return None
    if size is None:
        what = "a directory" if (root / rel).is_dir() else "no such file"
        findings.append(Finding("missing", rel, None, what,
                                "the file the manifest lists" + (f" ({expected_bytes} bytes)" if expected_bytes
                                                                 is not None else "")))
        return None
    if expected_bytes is not None and size != expected_bytes:
        findings.append(Finding("size", rel, None, f"{size} bytes", f"{expected_bytes} bytes (the manifest's)"))
    return size


def _check_digest(rel: str, kind: str, expected: str, found: str, findings: list[Finding]) -> None:
    if found != expected:
        findings.append(Finding("checksum", rel, None, f"{kind} {found}", f"{expected} (the manifest's)"))


# ---------------------------------------------------------------------------- one record file
@dataclasses.dataclass
class FileResult:
    """What checking one record file found: its problems, its record count and each sample's digest."""

    findings: list[Finding]
    records: int
    samples: list[tuple[int, bytes]]  # (record, xxh3-128 digest of the sample bytes)


@dataclasses.dataclass
class _Scan:
    """The state of one pass over a record file."""

    rel: str
    spec: RecordSpec | None
    findings: list[Finding] = dataclasses.field(default_factory=list)
    frames: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (offset, framed size) per record
    samples: list[tuple[int, bytes]] = dataclasses.field(default_factory=list)
    complete: bool = False  # the framing held to the end of the file

    def add(self, kind: str, record: int | None, found: str, expected: str) -> None:
        self.findings.append(Finding(kind, self.rel, record, found, expected))


def check_record_file(root: Path, entry: FileEntry, spec: RecordSpec | None, compressed: bool,
                      counter: _Counter) -> FileResult:
    """Every check of one listed record file and its index, in one pass over the file."""
    scan = _Scan(entry.path, spec)
    size = _present(root, entry.path, entry.bytes, scan.findings)
    if size is not None:
        kind, expected, digest = _digest(entry.sha256, entry.xxh3_128)
        with open(root / entry.path, "rb") as raw:
            reader = _HashingReader(raw, digest, counter)
            _read_records(reader, compressed, scan)
            reader.drain()
        if size == entry.bytes:  # a size finding already says the file differs
            _check_digest(entry.path, kind, expected, digest.hexdigest(), scan.findings)
        if scan.complete and len(scan.frames) != entry.records:
            scan.add("records", None, f"{len(scan.frames)} records", f"{entry.records} (the manifest's)")
    if entry.index is not None:
        _check_index(root, entry, scan, counter)
    return FileResult(scan.findings, len(scan.frames), scan.samples)


def _read_records(reader: _HashingReader, compressed: bool, scan: _Scan) -> None:
    """Check every record's framing, CRCs and contents; a framing problem ends the file's records."""
    import gzip
    import zlib
    stream = gzip.GzipFile(fileobj=reader, mode="rb") if compressed else reader
    try:
        for frame in iter_frames(stream, scan.rel):
            scan.frames.append((frame.offset, frame.size))
            bad_crc = data_crc_error(frame, scan.rel)
            if bad_crc is not None:
                scan.add("crc", frame.number, bad_crc.found, bad_crc.expected)
            elif scan.spec is not None:
                _check_payload(frame.number, frame.payload, scan)
        scan.complete = True
    except FramingError as err:
        scan.add("framing", err.record, err.found, err.expected)
    except (OSError, EOFError, zlib.error) as err:  # a broken GZIP stream, or the disk failing
        scan.add("framing", None, f"reading stops after {len(scan.frames)} whole records: {err}",
                 "a readable file" + (" holding a complete GZIP stream" if compressed else ""))
    finally:
        if compressed:
            stream.close()


def _check_payload(record: int, payload: bytes, scan: _Scan) -> None:
    problems, sample_digest = check_example(payload, scan.spec)
    for kind, found, expected in problems:
        scan.add(kind, record, found, expected)
    if sample_digest is not None:
        scan.samples.append((record, sample_digest))


def _check_index(root: Path, entry: FileEntry, scan: _Scan, counter: _Counter) -> None:
    """The DALI index: present, its digest, and one "offset size" line per record pointing at its record."""
    if _present(root, entry.index, None, scan.findings) is None:
        return
    kind, expected, digest = _digest(entry.index_sha256, entry.index_xxh3_128)
    with open(root / entry.index, "rb") as raw:
        reader = _HashingReader(raw, digest, counter)
        text = read_fully(reader, (root / entry.index).stat().st_size + 1)
    _check_digest(entry.index, kind, expected, digest.hexdigest(), scan.findings)
    lines = text.decode("utf-8", errors="replace").splitlines()
    bad = []
    for number, line in enumerate(lines):
        fields = line.split()
        found = tuple(int(f) for f in fields) if len(fields) == 2 and all(f.isascii() and f.isdigit()
                                                                           for f in fields) else None
        if number < len(scan.frames) and found != scan.frames[number]:
            bad.append(Finding("index", entry.index, number, f"line {number + 1} is {line!r}",
                               "\"%d %d\", where record %d of %s starts and its framed size" %
                               (*scan.frames[number], number, entry.path)))
    scan.findings += bad
    if scan.complete and len(lines) != len(scan.frames):
        scan.findings.append(Finding("index", entry.index, None, f"{len(lines)} lines",
                                     f"{len(scan.frames)}, one per record of {entry.path}"))


# ---------------------------------------------------------------------------- the whole dataset
@dataclasses.dataclass(frozen=True)
class Report:
    """The result of validating one dataset directory."""

    root: Path
    format: str
    compression: str
    splits: dict[str, tuple[int, int]]  # name -> (files, records) listed
    files: int  # record files checked
    records: int  # records read
    bytes_read: int
    seconds: float
    findings: tuple[Finding, ...]

    @property
    def counts(self) -> dict[str, int]:
        counts = {kind: 0 for kind in KINDS}
        for finding in self.findings:
            counts[finding.kind] += 1
        return {kind: n for kind, n in counts.items() if n}

    def to_dict(self) -> dict:
        return {"dataset": str(self.root), "format": self.format, "compression": self.compression,
                "clean": not self.findings, "problems": len(self.findings), "counts": self.counts,
                "splits": {name: {"files": f, "records": r} for name, (f, r) in self.splits.items()},
                "files_checked": self.files, "records_read": self.records, "bytes_read": self.bytes_read,
                "seconds": round(self.seconds, 3), "findings": [f.to_dict() for f in self.findings]}


def validate(data_dir: str | Path, workers: int = 1, progress_seconds: float | None = 5.0) -> Report:
    """Check a converted dataset against its manifest; every problem found is in the report.

    Raises:
        BenchError: the directory or its manifest is missing or unreadable.
    """
    started = time.perf_counter()
    manifest = load_manifest(data_dir)
    root = manifest.root
    spec, findings = record_spec(manifest)
    if spec is not None:
        _example_proto()  # import TensorFlow's Example class here, not first in several threads at once
    jobs, listing = _jobs(manifest)
    counter = _Counter()
    results = _run(jobs, lambda job: check_record_file(root, job[1], spec, manifest.compression == "gzip", counter),
                   workers, counter, progress_seconds)
    for result in results:
        findings += result.findings
    findings += listing + _check_aux_files(manifest, counter) + _unlisted_files(manifest)
    findings += _shared_samples(jobs, results)
    order = {kind: i for i, kind in enumerate(KINDS)}
    findings.sort(key=lambda f: (order[f.kind], f.path, -1 if f.record is None else f.record))
    splits = {name: (len(split.files), split.samples) for name, split in manifest.splits.items()}
    return Report(root=root.resolve(), format=manifest.format, compression=manifest.compression, splits=splits,
                  files=len(jobs), records=sum(r.records for r in results), bytes_read=counter.value,
                  seconds=time.perf_counter() - started, findings=tuple(findings))


def _jobs(manifest: Manifest) -> tuple[list[tuple[str, FileEntry]], list[Finding]]:
    """(split, entry) of every distinct listed record file, and the findings about the listing itself:
    a path listed twice in a split, or in two splits."""
    jobs, findings, owner = [], [], {}
    for split, entry in ((s, e) for s, split in manifest.splits.items() for e in split.files):
        if entry.path not in owner:
            owner[entry.path] = split
            jobs.append((split, entry))
        elif owner[entry.path] == split:
            findings.append(Finding("manifest", MANIFEST_NAME, None, f"{entry.path} listed twice in the {split} split",
                                    "each file listed once"))
        else:
            findings.append(Finding("overlap", entry.path, None, f"listed in the {owner[entry.path]} split and the "
                                    f"{split} split", "each file in one split"))
    return jobs, findings


def _run(jobs: list, check: Callable, workers: int, counter: _Counter, progress_seconds: float | None) -> list:
    """check(job) for every job on `workers` threads, in job order, with a progress line every few seconds."""
    total = sum(entry.bytes for _, entry in jobs)
    started = last = time.perf_counter()
    pool = concurrent.futures.ThreadPoolExecutor(max(1, workers))
    try:
        futures = [pool.submit(check, job) for job in jobs]
        pending, done_count = set(futures), 0
        while pending:
            done, pending = concurrent.futures.wait(pending, timeout=1.0,
                                                    return_when=concurrent.futures.FIRST_COMPLETED)
            done_count += len(done)
            now = time.perf_counter()
            if progress_seconds is not None and now - last >= progress_seconds and pending:
                last = now
                print(f"validate: {done_count}/{len(jobs)} files, {counter.value / 1e6:.1f} of {total / 1e6:.1f} MB, "
                      f"{counter.value / 1e6 / (now - started):.1f} MB/s", file=sys.stderr, flush=True)
        return [future.result() for future in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _check_aux_files(manifest: Manifest, counter: _Counter) -> list[Finding]:
    findings = []
    for entry in manifest.aux_files.values():
        size = _present(manifest.root, entry.path, entry.bytes, findings)
        if size is None:
            continue
        kind, expected, digest = _digest(entry.sha256, entry.xxh3_128)
        with open(manifest.root / entry.path, "rb") as raw:
            _HashingReader(raw, digest, counter).drain()
        if size == entry.bytes:
            _check_digest(entry.path, kind, expected, digest.hexdigest(), findings)
    return findings


def _unlisted_files(manifest: Manifest) -> list[Finding]:
    """Files under the directories that hold record files (train/, validation/) that the manifest does not list."""
    listed = {p for split in manifest.splits.values() for e in split.files for p in (e.path, e.index) if p}
    listed |= {a.path for a in manifest.aux_files.values()}
    directories = sorted({Path(p).parent for p in listed} - {Path(".")})
    findings = []
    for directory in directories:
        if not (manifest.root / directory).is_dir():
            continue
        for path in sorted((manifest.root / directory).rglob("*")):
            rel = path.relative_to(manifest.root).as_posix()
            if rel not in listed and not path.is_dir():
                size = path.lstat().st_size
                findings.append(Finding("unlisted", rel, None, f"a file of {size} bytes that {MANIFEST_NAME} does "
                                        f"not list", "only the listed files (a leftover or foreign file)"))
    return findings


def _shared_samples(jobs: list[tuple[str, FileEntry]], results: list[FileResult]) -> list[Finding]:
    """A finding for every record whose sample bytes equal those of a record in an earlier split."""
    first: dict[bytes, tuple[str, str, int]] = {}
    findings = []
    for (split, entry), result in zip(jobs, results):
        for record, digest in result.samples:
            seen = first.setdefault(digest, (split, entry.path, record))
            if seen[0] != split:
                findings.append(Finding("overlap", entry.path, record, f"the same sample as {seen[1]} record "
                                        f"{seen[2]} ({seen[0]} split)", f"no sample in both the {seen[0]} and "
                                        f"the {split} split"))
    return findings


# ---------------------------------------------------------------------------- the report
def format_report(report: Report, max_per_kind: int = 10) -> str:
    """The human-readable report: a summary, then the problems grouped by kind (at most `max_per_kind` each)."""
    splits = ", ".join(f"{name} {files} files / {records} records" for name, (files, records) in report.splits.items())
    rate = report.bytes_read / 1e6 / max(report.seconds, 1e-9)
    lines = [f"{report.root}: {report.format}, compression {report.compression}; {splits}",
             f"checked {report.files} record files, {report.records} records, {report.bytes_read / 1e6:.1f} MB in "
             f"{report.seconds:.1f} s ({rate:.1f} MB/s)"]
    if not report.findings:
        lines.append("no problems found")
        return "\n".join(lines)
    counts = report.counts
    lines.append(f"{len(report.findings)} problems: " + ", ".join(f"{kind} {n}" for kind, n in counts.items()))
    for kind, count in counts.items():
        lines.append(f"{kind} ({count}): {KINDS[kind]}")
        shown = [f for f in report.findings if f.kind == kind][:max_per_kind]
        lines += [f"  {finding.message}" for finding in shown]
        if count > len(shown):
            lines.append(f"  ... and {count - len(shown)} more (--json writes them all)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data_dir", type=Path, metavar="DATA_DIR", help="a converted dataset (with manifest.json)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the report, every finding included, as JSON to PATH")
    parser.add_argument("--workers", type=tfrecords.positive_int, default=tfrecords.available_cpus(), metavar="K",
                        help="files checked in parallel threads (default: CPUs available, %(default)s)")
    parser.add_argument("--max-per-kind", type=tfrecords.positive_int, default=10, metavar="N",
                        help="problems printed of each kind; the counts are always complete (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    report = validate(args.data_dir, workers=args.workers)
    if args.json is not None:
        write_json_atomic(report.to_dict(), args.json)
    print(format_report(report, args.max_per_kind), flush=True)
    return exits.BAD_INPUT if report.findings else exits.SUCCESS  # a dataset with findings is bad input
