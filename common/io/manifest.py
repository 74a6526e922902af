"""Dataset manifests: the typed description of a converted dataset directory (`manifest.json`).

A converter writes `manifest.json` last, atomically, so a directory without one is an unfinished
conversion. The manifest names the record format, the shape and dtype of one sample, the target
size (and, for targets that are not a vector, their shape and dtype), the compression, where the
data came from, for every split its sample count and files (path relative to the directory, record
count, byte size, sha256, and the DALI index file if any), and any auxiliary files the loader needs
(DeepCAM's normalisation statistics). Loaders call `load_manifest`, `check_split_files` and
`check_aux_file` before reading anything. See docs/formats.md.

A path may pass through a link: an index of the official CosmoFlow release (`python -m data_prep index`)
links its split directories to the input, so its files are read where they lie.

The module is format-agnostic: each benchmark registers its format id and highest supported
version in `FORMATS`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from common.base.files import write_json_atomic
from common.base.errors import BenchError

MANIFEST_NAME = "manifest.json"
# Format id -> highest version this code reads.
FORMATS = {"cosmoflow-tfrecord": 1, "deepcam-tfrecord": 1}
COMPRESSIONS = ("none", "gzip")


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One record file of a split; paths are relative to the dataset directory."""

    path: str
    records: int
    bytes: int
    sha256: str
    index: str | None  # DALI index ("offset size" per record), None for compressed files
    index_sha256: str | None
    # xxh3-128 of the file and its index, recorded by current converters (staging and verification use it
    # instead of sha256: about 15x cheaper); None in manifests written before it was added.
    xxh3_128: str | None = None
    index_xxh3_128: str | None = None
    # The size of a compressed file's record stream once decompressed (`python -m data_prep index` records it;
    # staging that decompresses plans its free space with it); None for uncompressed files and converters'.
    uncompressed_bytes: int | None = None


# Keys written only when set: manifests written before they existed keep their form.
OPTIONAL_KEYS = ("xxh3_128", "index_xxh3_128", "uncompressed_bytes")


@dataclasses.dataclass(frozen=True)
class AuxFile:
    """A file the loader needs besides the records (e.g. normalisation statistics), checked by sha256."""

    path: str
    bytes: int
    sha256: str
    xxh3_128: str | None = None


@dataclasses.dataclass(frozen=True)
class SplitEntry:
    samples: int
    files: tuple[FileEntry, ...]


@dataclasses.dataclass(frozen=True)
class Manifest:
    root: Path  # the dataset directory; not stored in the JSON
    format: str
    version: int
    sample_shape: tuple[int, ...]
    sample_dtype: str
    target_size: int
    compression: str  # "none" or "gzip"
    splits: dict[str, SplitEntry]
    source: dict  # converter-specific provenance: input directory, sizes, counts
    seed: int | None = None  # seed of the train/validation split, when the converter drew one
    # A target that is not a float32 vector (DeepCAM's (H, W) uint8 label map); None: (target_size,) float32.
    target_shape: tuple[int, ...] | None = None
    target_dtype: str | None = None
    aux_files: dict[str, AuxFile] = dataclasses.field(default_factory=dict)  # name -> file
    # Statistics of the training inputs computed by the converter, in its own form (CosmoFlow: per-channel
    # mean and std of log(1 + counts)); {} when the converter records none.
    input_stats: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON form, in a fixed key order so equal manifests serialise to equal bytes.

        The optional keys are written only when set, so manifests that do not use them keep their form.
        """
        target = {} if self.target_shape is None else {"target_shape": list(self.target_shape),
                                                       "target_dtype": self.target_dtype}
        aux = {name: _entry_dict(f) for name, f in self.aux_files.items()}
        return {
            "format": self.format,
            "version": self.version,
            "sample_shape": list(self.sample_shape),
            "sample_dtype": self.sample_dtype,
            "target_size": self.target_size,
            **target,
            "compression": self.compression,
            "seed": self.seed,
            "source": self.source,
            "splits": {name: {"samples": split.samples, "files": [_entry_dict(f) for f in split.files]}
                       for name, split in self.splits.items()},
            **({"aux_files": aux} if aux else {}),
            **({"input_stats": self.input_stats} if self.input_stats else {}),
        }


def _entry_dict(entry: FileEntry | AuxFile) -> dict:
    """An entry's JSON form; the OPTIONAL_KEYS only when set."""
    # Its fields are plain values, so no deep copy (dataclasses.asdict): thousands of entries per manifest.
    return {f.name: v for f in dataclasses.fields(entry)
            if (v := getattr(entry, f.name)) is not None or f.name not in OPTIONAL_KEYS}


# ---------------------------------------------------------------------------- writing
def write_manifest(manifest: Manifest | dict, data_dir: str | os.PathLike, indent: int | None = 2) -> Path:
    """Write `data_dir/manifest.json` atomically (temporary name, then rename); returns its path.

    `indent` None writes compact JSON, several times faster and a third smaller for hundreds of thousands of files.
    """
    obj = manifest.to_dict() if isinstance(manifest, Manifest) else manifest
    _parse(obj, Path(data_dir), Path(data_dir) / MANIFEST_NAME)  # never write a manifest we could not load
    return write_json_atomic(obj, Path(data_dir) / MANIFEST_NAME, indent=indent)


def sha256_file(path: str | os.PathLike, chunk_bytes: int = 8 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    return _digest_file(path, [hashlib.sha256()], chunk_bytes)[0]


def file_digests(path: str | os.PathLike, chunk_bytes: int = 8 << 20) -> tuple[str, str]:
    """(sha256, xxh3-128) of a file, both from one pass over it."""
    import xxhash
    return tuple(_digest_file(path, [hashlib.sha256(), xxhash.xxh3_128()], chunk_bytes))


def _digest_file(path, digests: list, chunk_bytes: int) -> list[str]:
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            for digest in digests:
                digest.update(chunk)
    return [digest.hexdigest() for digest in digests]


def xxh3_128_file(path: str | os.PathLike, chunk_bytes: int = 8 << 20) -> str:
    """Hex xxh3-128 of a file, read in chunks."""
    import xxhash
    return _digest_file(path, [xxhash.xxh3_128()], chunk_bytes)[0]


# ---------------------------------------------------------------------------- reading
def load_manifest(data_dir: str | os.PathLike, expected_format: str | None = None) -> Manifest:
    """Read and validate `data_dir/manifest.json`.

    Args:
        data_dir: a converted dataset directory.
        expected_format: the format id the caller reads; None accepts any id in `FORMATS`.
    Raises:
        BenchError: missing directory or manifest, bad JSON, missing or mistyped keys, an unknown
            format id or version, or a split whose sample count differs from its files' records.
    """
    root = Path(data_dir)
    path = root / MANIFEST_NAME
    if not root.is_dir():
        raise BenchError(f"{root}: dataset directory not found (expected a converted dataset with "
                         f"{MANIFEST_NAME})")
    if not path.is_file():
        raise BenchError(f"{root}: the directory exists but has no {MANIFEST_NAME}; the conversion is "
                         f"unfinished or was interrupted (rerun the converter with the same arguments to "
                         f"resume), or this is not a converted dataset")
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as err:  # ValueError: JSONDecodeError, UnicodeDecodeError, a 5,000-digit integer
        raise BenchError(f"{path}: not a readable JSON manifest ({err})") from None
    except RecursionError:
        raise BenchError(f"{path}: not a JSON manifest (nested too deeply)") from None
    manifest = _parse(obj, root, path)
    if expected_format is not None and manifest.format != expected_format:
        raise BenchError(f"{path}: format {manifest.format!r}, expected {expected_format!r}; "
                         f"this directory holds another kind of dataset")
    return manifest


def _parse(obj: Any, root: Path, where: Path) -> Manifest:
    if not isinstance(obj, dict):
        raise BenchError(f"{where}: the manifest is a JSON {type(obj).__name__}, expected an object")
    fmt = _get(obj, "format", str, where)
    version = _get(obj, "version", int, where)
    if fmt not in FORMATS:
        raise BenchError(f"{where}: unknown format {fmt!r}, expected one of {sorted(FORMATS)}")
    if not 1 <= version <= FORMATS[fmt]:
        raise BenchError(f"{where}: {fmt} version {version}, this code reads versions 1 to {FORMATS[fmt]}; "
                         f"reconvert the dataset or update the suite")
    shape = _shape(obj, "sample_shape", where)
    compression = _get(obj, "compression", str, where)
    if compression not in COMPRESSIONS:
        raise BenchError(f"{where}: compression {compression!r}, expected one of {list(COMPRESSIONS)}")
    seed = obj.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise BenchError(f"{where}: 'seed' is {seed!r}, expected an integer or null")
    splits = {name: _parse_split(name, value, where) for name, value in _get(obj, "splits", dict, where).items()}
    target_shape = _shape(obj, "target_shape", where) if "target_shape" in obj else None
    target_dtype = _get(obj, "target_dtype", str, where) if "target_dtype" in obj else None
    if (target_shape is None) != (target_dtype is None):
        raise BenchError(f"{where}: target_shape {target_shape!r} and target_dtype {target_dtype!r}; both or "
                         f"neither must be set")
    aux = {name: _parse_aux(name, value, where)
           for name, value in (_get(obj, "aux_files", dict, where) if "aux_files" in obj else {}).items()}
    stats = _get(obj, "input_stats", dict, where) if "input_stats" in obj else {}
    return Manifest(root=root, format=fmt, version=version, sample_shape=tuple(shape),
                    sample_dtype=_get(obj, "sample_dtype", str, where),
                    target_size=get_count(obj, "target_size", where, minimum=1), compression=compression,
                    splits=splits, source=_get(obj, "source", dict, where), seed=seed,
                    target_shape=target_shape, target_dtype=target_dtype, aux_files=aux,
                    input_stats=stats)


def _shape(obj: dict, key: str, where: Path) -> tuple[int, ...]:
    shape = _get(obj, key, list, where)
    if not shape or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape):
        raise BenchError(f"{where}: {key} {shape!r}, expected a list of positive integers")
    return tuple(shape)


def _parse_aux(name: str, obj: Any, where: Path) -> AuxFile:
    label = f"aux file {name!r}"
    if not isinstance(obj, dict):
        raise BenchError(f"{where}: {label} is a JSON {type(obj).__name__}, expected an object")
    entry = AuxFile(path=_get(obj, "path", str, where, label), bytes=get_count(obj, "bytes", where, label),
                    sha256=_get(obj, "sha256", str, where, label), xxh3_128=_xxh3(obj, "xxh3_128", where, label))
    _check_relative(entry.path, where, label)
    return entry


def _parse_split(name: str, obj: Any, where: Path) -> SplitEntry:
    label = f"split {name!r}"
    if not isinstance(obj, dict):
        raise BenchError(f"{where}: {label} is a JSON {type(obj).__name__}, expected an object")
    samples = get_count(obj, "samples", where, label)
    files = tuple(_parse_file(f, where, f"{label} file {i}")
                  for i, f in enumerate(_get(obj, "files", list, where, label)))
    total = sum(f.records for f in files)
    if samples != total:
        raise BenchError(f"{where}: {label} says {samples} samples, but its {len(files)} files hold "
                         f"{total} records")
    return SplitEntry(samples=samples, files=files)


def _parse_file(obj: Any, where: Path, label: str) -> FileEntry:
    if not isinstance(obj, dict):
        raise BenchError(f"{where}: {label} is a JSON {type(obj).__name__}, expected an object")
    index = _get(obj, "index", (str, type(None)), where, label)
    entry = FileEntry(path=_get(obj, "path", str, where, label),
                      records=get_count(obj, "records", where, label),
                      bytes=get_count(obj, "bytes", where, label),
                      sha256=_get(obj, "sha256", str, where, label), index=index,
                      index_sha256=_get(obj, "index_sha256", (str, type(None)), where, label),
                      xxh3_128=_xxh3(obj, "xxh3_128", where, label),
                      index_xxh3_128=_xxh3(obj, "index_xxh3_128", where, label),
                      uncompressed_bytes=(get_count(obj, "uncompressed_bytes", where, label)
                                          if obj.get("uncompressed_bytes") is not None else None))
    for rel in (entry.path, entry.index):
        if rel is not None:
            _check_relative(rel, where, label)
    if (entry.index is None) != (entry.index_sha256 is None):
        raise BenchError(f"{where}: {label} ({entry.path}) has index {entry.index!r} but index_sha256 "
                         f"{entry.index_sha256!r}; both or neither must be set")
    return entry


_XXH3_HEX = re.compile(r"[0-9a-f]{32}")
_DECIMAL = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit() also accepts '²', which int() refuses


def _xxh3(obj: dict, key: str, where: Path, label: str) -> str | None:
    """An optional xxh3-128 hex digest (32 hex digits)."""
    value = obj.get(key)
    if value is not None and not (isinstance(value, str) and _XXH3_HEX.fullmatch(value)):
        raise BenchError(f"{where}: {label} {key} {value!r}, expected 32 lower-case hex digits or no such key")
    return value


def _check_relative(rel: str, where: Path, label: str) -> None:
    if rel.startswith("/") or ".." in rel.split("/"):  # as PurePosixPath would say, faster
        raise BenchError(f"{where}: {label} path {rel!r} must be relative to the dataset directory")


def get_count(obj: dict, key: str, where: Path, label: str = "", minimum: int = 0) -> int:
    """obj[key], which must be an integer >= `minimum` (a count or a size)."""
    value = _get(obj, key, int, where, label)
    if value < minimum:
        context = f"{label}: " if label else ""
        raise BenchError(f"{where}: {context}{key!r} is {value}, expected an integer >= {minimum}")
    return value


def _get(obj: dict, key: str, kind, where: Path, label: str = "") -> Any:
    """obj[key], which must exist and have type `kind` (bool is not accepted as int)."""
    context = f"{label}: " if label else ""
    if key not in obj:
        raise BenchError(f"{where}: {context}missing key {key!r} (found {sorted(obj)})")
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise BenchError(f"{where}: {context}{key!r} is {value!r}, expected {names}")
    return value


# ---------------------------------------------------------------------------- checking files
def check_split_counts(manifest: Manifest, expected: dict[str, int], where: str) -> None:
    """Each split in `expected` ("train", "validation") exists and, when its expected count is
    non-zero, holds exactly that many samples (the config keys data.train_samples / data.val_samples)."""
    for split, want in expected.items():
        if split not in manifest.splits:
            raise BenchError(f"{where}: no {split!r} split (found {sorted(manifest.splits)})")
        if want and manifest.splits[split].samples != want:
            key = "data.train_samples" if split == "train" else "data.val_samples"
            raise BenchError(f"{where}: the {split} split has {manifest.splits[split].samples} samples, but the "
                             f"config expects {want} ({key}); point data.dir at the right dataset or set {key}=0")


def check_split_files(manifest: Manifest, split: str, verify_checksums: bool = False,
                      only: set[str] | None = None) -> None:
    """Check that a split's files exist with the sizes, record counts and (optionally) checksums listed
    (xxh3-128 when recorded, else sha256).

    Index files must have one "offset size" line per record covering the record file exactly.
    `only`: check just these paths (the files this rank reads; a rank's staged copy holds no others).
    Raises BenchError naming the first file that does not match.
    """
    if split not in manifest.splits:
        raise BenchError(f"{manifest.root / MANIFEST_NAME}: no {split!r} split (found {sorted(manifest.splits)})")
    for entry in manifest.splits[split].files:
        if only is not None and entry.path not in only:
            continue
        try:
            path = _check_present(manifest.root / entry.path, entry.bytes,
                                  f"({split} split) but missing; the dataset is incomplete, reconvert it")
        except BenchError:
            _check_link(manifest, entry.path)  # a clearer error when the file is missing because a link broke
            raise
        if entry.index is not None:
            _check_index(manifest.root / entry.index, entry)
        if verify_checksums:
            _check_digest(path, entry.sha256, entry.xxh3_128)
            if entry.index is not None:
                _check_digest(manifest.root / entry.index, entry.index_sha256, entry.index_xxh3_128)


def check_shard_files(manifest: Manifest, shards: dict, verify_checksums: bool = False) -> None:
    """`check_split_files` for just the files each split's shard reads (`shard.files`: absolute paths)."""
    for split, shard in shards.items():
        read = {Path(f).relative_to(manifest.root).as_posix() for f in shard.files}
        check_split_files(manifest, split, verify_checksums=verify_checksums, only=read)


def check_aux_file(manifest: Manifest, name: str) -> Path:
    """The path of auxiliary file `name`, checked against its size and sha256 (always: such files are small).

    Raises BenchError when the manifest lists no such file or the file is missing or differs.
    """
    where = manifest.root / MANIFEST_NAME
    if name not in manifest.aux_files:
        raise BenchError(f"{where}: no auxiliary file {name!r} (found {sorted(manifest.aux_files)}); this "
                         f"dataset was converted without it, reconvert it")
    entry = manifest.aux_files[name]
    path = _check_present(manifest.root / entry.path, entry.bytes,
                          f"as {name!r} but missing; copy it back or reconvert the dataset")
    _check_digest(path, entry.sha256, entry.xxh3_128)
    return path


def record_bytes(manifest: Manifest, only: set[str] | None = None) -> float:
    """Mean on-disk bytes of one record over all splits, or over the files `only` lists (for read-bandwidth
    figures)."""
    files = [e for split in manifest.splits.values() for e in split.files if only is None or e.path in only]
    return sum(e.bytes for e in files) / max(1, sum(e.records for e in files))


def _check_link(manifest: Manifest, rel: str) -> None:
    """A listed file reached through a link whose target is gone (an indexed dataset's split directory links
    to the input, `python -m data_prep index`) is named with the link, not as a missing file."""
    parts = rel.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        link = manifest.root.joinpath(*parts[:depth])
        if link.is_symlink() and not link.exists():
            raise BenchError(f"{link}: links to {os.readlink(link)}, which does not exist, so {rel} cannot be read; "
                             f"the indexed input moved or is not mounted here: index it again where it is now "
                             f"(python -m data_prep index) or mount it at the old place")


def _check_present(path: Path, expected_bytes: int, when_missing: str) -> Path:
    """`path`, which must exist with the size the manifest lists; `when_missing` ends the missing-file error."""
    try:
        size = path.stat().st_size if path.is_file() else None
    except OSError as err:  # e.g. a name too long for the file system
        raise BenchError(f"{path}: listed in the manifest but cannot be read ({err.strerror})") from None
    if size is None:
        raise BenchError(f"{path}: listed in the manifest {when_missing}")
    if size != expected_bytes:
        raise BenchError(f"{path}: {size} bytes, the manifest says {expected_bytes}; the file was changed or "
                         f"truncated, reconvert the dataset")
    return path


def _check_index(path: Path, entry: FileEntry) -> None:
    try:
        lines = path.read_text().splitlines() if path.is_file() else None
    except (OSError, UnicodeDecodeError) as err:
        raise BenchError(f"{path}: DALI index of {entry.path} is not readable text ({err}); reconvert the "
                         f"dataset") from None
    if lines is None:
        raise BenchError(f"{path}: DALI index of {entry.path} listed in the manifest but missing; "
                         f"reconvert the dataset")
    if len(lines) != entry.records:
        raise BenchError(f"{path}: {len(lines)} index lines, expected {entry.records} (one per record of "
                         f"{entry.path})")
    end = 0
    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if len(fields) != 2 or not all(_DECIMAL.fullmatch(f) for f in fields) or int(fields[0]) != end:
            raise BenchError(f"{path}: line {number} is {line!r}, expected \"{end} <size>\" (the offset where "
                             f"the previous record ends, then the record's size)")
        end += int(fields[1])
    if end != entry.bytes:
        raise BenchError(f"{path}: the index covers {end} bytes, but {entry.path} has {entry.bytes}")


def _check_digest(path: Path, sha256: str, xxh3_128: str | None) -> None:
    """The file's xxh3-128 when the manifest records it, else its sha256, must match."""
    kind, expected = ("xxh3_128", xxh3_128) if xxh3_128 else ("sha256", sha256)
    found = xxh3_128_file(path) if xxh3_128 else sha256_file(path)
    if found != expected:
        raise BenchError(f"{path}: {kind} {found}, the manifest says {expected}; the file is corrupt or "
                         f"was changed, reconvert the dataset")
