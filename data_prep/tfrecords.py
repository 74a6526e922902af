"""Writing TFRecord files for the converters: tf.train.Example records, DALI index files, staging.

The framing of a TFRecord file and its DALI index are described, and read, in common/io/tfrecord.py.
Every file is written under a temporary name in its final directory (`.NAME.tmp-PID`,
common/base/files.py) and renamed when complete, so a file with its final name is always whole.
TensorFlow is imported only by the functions that need it (CRC32C and GZIP come from its C++ writer).

The last section holds plumbing a converter needs around its records: a process pool with a
progress bar, the check that a resumed run has the settings of the interrupted one, and the
manifest entry of a finished file.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from common.base.errors import BenchError
from common.base.files import TEMP_MARK, atomic_path, write_json_atomic
from common.io.manifest import COMPRESSIONS, MANIFEST_NAME, FileEntry
from common.io.manifest_write import file_digests
from common.io.tfrecord import FRAMING_BYTES, index_path, index_text, read_index


@dataclasses.dataclass(frozen=True)
class RecordFile:
    """A finished TFRecord file and its DALI index (None when compressed)."""

    path: Path
    records: int
    bytes: int
    sha256: str
    index: Path | None
    index_sha256: str | None
    xxh3_128: str | None = None
    index_xxh3_128: str | None = None

    @classmethod
    def of(cls, path: Path, records: int, data: Path, index: Path | None, index_data: Path | None) -> "RecordFile":
        """The description of record file `path` (index `index`), digested from `data` and `index_data` (the
        same files, or their temporary names before the rename)."""
        sha, xxh = file_digests(data)
        index_sha, index_xxh = file_digests(index_data) if index_data else (None, None)
        return cls(path=path, records=records, bytes=data.stat().st_size, sha256=sha, index=index,
                   index_sha256=index_sha, xxh3_128=xxh, index_xxh3_128=index_xxh)


def quiet_tensorflow():
    """TensorFlow, imported without its start-up banner in a data tool's output."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    return tf


# ---------------------------------------------------------------------------- records
def serialize_example(features: Mapping[str, bytes | np.ndarray]) -> bytes:
    """A serialized tf.train.Example: bytes become a BytesList of one value, float arrays a FloatList
    (float32), integer arrays an Int64List. Serialization is deterministic (map keys sorted)."""
    quiet_tensorflow()
    from tensorflow.core.example import example_pb2  # the proto class itself: tf.train's wrappers are slower

    example = example_pb2.Example()
    for key, value in features.items():
        feature = example.features.feature[key]
        if isinstance(value, bytes):
            feature.bytes_list.value.append(value)
            continue
        array = np.asarray(value).ravel()
        if array.dtype.kind == "f":
            feature.float_list.value.extend(array.astype(np.float32).tolist())
        elif array.dtype.kind in "iub":
            feature.int64_list.value.extend(array.astype(np.int64).tolist())
        else:
            raise TypeError(f"feature {key!r}: cannot store dtype {array.dtype} in a tf.train.Example")
    return example.SerializeToString(deterministic=True)


def write_record_file(path: str | os.PathLike, records: Iterable[bytes], compression: str = "none",
                      gzip_level: int = 6) -> RecordFile:
    """Write serialized records to a TFRecord file, with a DALI index beside it when uncompressed.

    Both files are staged under temporary names and renamed only after the last record, so an
    exception (from `records`, or KeyboardInterrupt) leaves neither a final file nor a temporary; a
    killed process leaves only a temporary, which `remove_stale_temps` deletes before a rerun.

    Args:
        path: the final record file, e.g. OUT/train/universe_000000.tfrecord.
        records: serialized records, consumed one at a time (a generator keeps memory bounded).
        compression: "none" or "gzip" (zlib at `gzip_level`, 1-9).
    Returns:
        The record file with its record count, size and sha256 (and its index's).
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression {compression!r}, expected one of {COMPRESSIONS}")
    path = Path(path)
    with atomic_path(path) as tmp:
        lengths = _write_records(tmp, records, compression, gzip_level)
        if compression != "none":
            result = RecordFile.of(path, len(lengths), tmp, None, None)
        else:
            _check_framing(tmp, lengths)
            with atomic_path(index_path(path)) as tmp_index:  # renamed first: a finished file has its index
                tmp_index.write_text(index_text(lengths))
                result = RecordFile.of(path, len(lengths), tmp, index_path(path), tmp_index)
    return result


def _write_records(path: Path, records: Iterable[bytes], compression: str, gzip_level: int) -> list[int]:
    """Write the records to `path` with TensorFlow's writer; their payload lengths."""
    tf = quiet_tensorflow()
    options = tf.io.TFRecordOptions(compression_type="GZIP" if compression == "gzip" else "",
                                    compression_level=gzip_level if compression == "gzip" else None)
    lengths = []
    with tf.io.TFRecordWriter(str(path), options=options) as writer:
        for record in records:
            writer.write(record)
            lengths.append(len(record))
    return lengths


def existing_record_file(path: str | os.PathLike, records: int, compression: str) -> RecordFile | None:
    """The finished file at `path` (and its index when uncompressed), or None if it must be (re)written.

    Files are renamed into place only when complete, so existence means complete; an uncompressed
    file must also agree with its index (`records` lines covering the file exactly). The checksums are
    recomputed from the files.
    """
    path = Path(path)
    index = index_path(path) if compression == "none" else None
    if not path.is_file() or (index and not index.is_file()):
        return None
    size = path.stat().st_size
    if index:
        try:
            entries = read_index(index)
        except ValueError:  # not "offset size" lines
            return None
        if len(entries) != records or sum(s for _, s in entries) != size:
            return None
    return RecordFile.of(path, records, path, index, index)


# ---------------------------------------------------------------------------- framing
def _check_framing(path: Path, lengths: list[int]) -> None:
    # The index is computed from the payload lengths; make sure the writer framed them as assumed.
    expected = sum(lengths) + FRAMING_BYTES * len(lengths)
    found = path.stat().st_size
    if found != expected:
        raise RuntimeError(f"{path}: {found} bytes after writing {len(lengths)} records, expected {expected} "
                           f"({FRAMING_BYTES} bytes of framing per record); the index would be wrong")


# ---------------------------------------------------------------------------- staging
def remove_stale_temps(directory: str | os.PathLike) -> list[Path]:
    """Delete temporaries left in `directory` by an interrupted run; returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = sorted(p for p in directory.iterdir() if p.name.startswith(".") and TEMP_MARK in p.name and p.is_file())
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


# ---------------------------------------------------------------------------- converter plumbing
def run_in_pool(function: Callable[[Any], Any], jobs: Sequence[Any], workers: int, desc: str,
                unit: str) -> list:
    """`function(job)` for every job, in job order, with a progress bar on stderr.

    One worker runs in this process; more run in spawned processes (they start clean even when the
    caller has TensorFlow and its threads loaded). On an error, running jobs finish (their files are
    complete and a rerun reuses them), queued ones never start, and the error is raised here.
    """
    from tqdm import tqdm
    workers = max(1, min(workers, len(jobs)))
    results: list = [None] * len(jobs)
    with tqdm(total=len(jobs), unit=unit, desc=desc, file=sys.stderr) as bar:
        if workers == 1:
            for i, job in enumerate(jobs):
                results[i] = function(job)
                bar.update()
            return results
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        try:
            pending = {pool.submit(function, job): i for i, job in enumerate(jobs)}
            for future in concurrent.futures.as_completed(pending):
                results[pending[future]] = future.result()
                bar.update()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    return results


def begin_conversion(out: Path, state_name: str, settings: dict, planned: Iterable[Path],
                     subdirs: Iterable[str], tool: str) -> None:
    """Make `out` ready for a (possibly resumed) conversion and record its settings in `out/state_name`.

    An earlier run's directory must have been made with the same settings; a directory holding any
    of the `planned` outputs without a state file is refused. The manifest is removed before anything
    is rewritten (a manifest never describes files in flux; the same settings rewrite it identically),
    and temporaries left by a killed run are deleted.
    """
    state = out / state_name
    if state.is_file():
        check_resume_state(state, settings, tool)
    else:
        stray = next((p for p in [out / MANIFEST_NAME, *planned] if p.exists()), None)
        if stray is not None:
            raise BenchError(f"{out}: holds {stray} but no {state_name}, so it was not written by {tool} with "
                             f"these settings; choose an empty --out directory or delete it")
    directories = [out, *(out / name for name in subdirs)]
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(settings, state)
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    for directory in directories:
        remove_stale_temps(directory)


def check_resume_state(state: Path, settings: dict, tool: str) -> None:
    """Refuse to continue a conversion in `state.parent` whose recorded settings differ from `settings`."""
    try:
        earlier = json.loads(state.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BenchError(f"{state}: unreadable record of an earlier {tool} run ({err}); delete {state.parent} "
                         f"and convert again") from None
    difference = first_difference(earlier, settings)
    if difference is None:
        return
    key, before, now = difference
    raise BenchError(f"{state}: {state.parent} holds a {tool} conversion with {key} = {_brief(before)}, but "
                     f"this run has {key} = {_brief(now)}; rerun with the earlier arguments and input files to "
                     f"resume, or choose a new --out directory (or delete this one)")


def first_difference(before: Any, now: Any, key: str = "settings") -> tuple[str, Any, Any] | None:
    """(dotted key, value before, value now) of the first leaf where two JSON values differ, else None.

    A list of scalars is a leaf (e.g. one input file's [name, bytes, mtime]), so the key names the entry.
    """
    if before == now:
        return None
    if isinstance(before, dict) and isinstance(now, dict):
        for name in [*now, *(k for k in before if k not in now)]:
            found = first_difference(before.get(name), now.get(name), f"{key}.{name}")
            if found:
                return found
    if (isinstance(before, list) and isinstance(now, list) and len(before) == len(now)
            and any(isinstance(v, (list, dict)) for v in before + now)):
        for i, (a, b) in enumerate(zip(before, now)):
            found = first_difference(a, b, f"{key}[{i}]")
            if found:
                return found
    return key, before, now


def _brief(value: Any, limit: int = 160) -> str:
    text = json.dumps(value)
    if len(text) <= limit:
        return text
    items = f" ({len(value)} items)" if isinstance(value, (list, dict)) else ""
    return f"{text[:limit]}...{items}"


def file_entry(record_file: RecordFile, root: Path) -> FileEntry:
    """The manifest entry of a finished record file, with paths relative to the dataset directory `root`."""
    def relative(path: Path | None) -> str | None:
        return None if path is None else path.relative_to(root).as_posix()

    return FileEntry(path=relative(record_file.path), records=record_file.records, bytes=record_file.bytes,
                     sha256=record_file.sha256, index=relative(record_file.index),
                     index_sha256=record_file.index_sha256, xxh3_128=record_file.xxh3_128,
                     index_xxh3_128=record_file.index_xxh3_128)


def available_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value
