"""Dataset manifests: the typed description of a converted dataset directory (`manifest.json`).

A converter writes `manifest.json` last, atomically, so a directory without one is an unfinished conversion. The
manifest names the record format, the shape and dtype of one sample, the target size (and, for targets that are not a
vector, their shape and dtype), the compression, where the data came from, for every split its sample count and files
(path relative to the directory, record count, byte size, sha256 and xxh3-128, and the DALI index file if any), and
any auxiliary files the loader needs (DeepCAM's normalisation statistics). Loaders call `load_manifest`,
`check_split_files` and `check_aux_file` before reading anything. See docs/formats.md.

A path may pass through a link: an index of the official CosmoFlow release (`python -m data_prep index`)
links its split directories to the input, so its files are read where they lie.

The module is format-agnostic: each benchmark registers its format id and highest supported version in `FORMATS`.
"""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Literal

from common.base import documents
from common.base.documents import NOT_STORED, OMITTED, REQUIRED, check
from common.base.errors import BenchError

MANIFEST_NAME = "manifest.json"
PACK_NAME = "pack.json"  # a packed dataset's description (common/io/packing.py)
# Format id -> highest version this code reads.
FORMATS = {"cosmoflow-tfrecord": 1, "deepcam-tfrecord": 1}
COMPRESSIONS = ("none", "gzip")


def check_relative(rel: str | None, key: str) -> None:
    """A path the manifest lists must stay inside the dataset directory."""
    check(rel is None or not (rel.startswith("/") or ".." in rel.split("/")), key, rel,  # as PurePosixPath, faster
          "a path relative to the dataset directory")


def check_xxh3(digest: str | None, key: str) -> None:
    check(digest is None or bool(_XXH3_HEX.fullmatch(digest)), key, digest, "32 lower-case hex digits")


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One record file of a split; paths are relative to the dataset directory."""

    path: str
    records: int
    bytes: int
    sha256: str
    index: str | None  # DALI index ("offset size" per record), None for compressed files
    index_sha256: str | None
    # xxh3-128 of the file (staging and verification use it: about 15x cheaper than sha256) and its index. A
    # manifest holds it; None only in memory, before it is computed.
    xxh3_128: str | None = dataclasses.field(default=None, metadata=REQUIRED)
    index_xxh3_128: str | None = dataclasses.field(default=None, metadata=OMITTED)
    # The size of a compressed file's record stream once decompressed (`python -m data_prep index` records it;
    # staging that decompresses plans its free space with it); None for uncompressed files and converters'.
    uncompressed_bytes: int | None = dataclasses.field(default=None, metadata=OMITTED)

    def __post_init__(self):
        for key in ("records", "bytes"):
            check(getattr(self, key) >= 0, key, getattr(self, key), "an integer >= 0")
        check(self.uncompressed_bytes is None or self.uncompressed_bytes >= 0, "uncompressed_bytes",
              self.uncompressed_bytes, "an integer >= 0 or null")
        check_relative(self.path, "path")
        check_relative(self.index, "index")
        check((self.index is None) == (self.index_sha256 is None), "index_sha256", self.index_sha256,
              f"{'null' if self.index is None else 'a digest'}, as index is {self.index!r} (both or neither set)")
        check_xxh3(self.xxh3_128, "xxh3_128")
        check_xxh3(self.index_xxh3_128, "index_xxh3_128")


@dataclasses.dataclass(frozen=True)
class AuxFile:
    """A file the loader needs besides the records (e.g. normalisation statistics), checked by xxh3-128."""

    path: str
    bytes: int
    sha256: str
    xxh3_128: str | None = dataclasses.field(default=None, metadata=REQUIRED)

    def __post_init__(self):
        check(self.bytes >= 0, "bytes", self.bytes, "an integer >= 0")
        check_relative(self.path, "path")
        check_xxh3(self.xxh3_128, "xxh3_128")


@dataclasses.dataclass(frozen=True)
class SplitEntry:
    samples: int
    files: tuple[FileEntry, ...]

    def __post_init__(self):
        total = sum(f.records for f in self.files)
        check(self.samples == total, "samples", self.samples, f"the {total} records its {len(self.files)} files hold")


def _positive_shape(shape: tuple[int, ...] | None, key: str) -> None:
    check(shape is None or (len(shape) > 0 and all(s > 0 for s in shape)), key, shape and list(shape),
          "a list of positive integers")


@dataclasses.dataclass(frozen=True)
class Manifest:
    root: Path = dataclasses.field(kw_only=True, metadata=NOT_STORED)  # the dataset directory
    format: str  # an id of FORMATS
    version: int
    sample_shape: tuple[int, ...]
    sample_dtype: str
    target_size: int
    compression: Literal["none", "gzip"]
    splits: dict[str, SplitEntry]
    source: dict  # converter-specific provenance: input directory, sizes, counts
    seed: int | None = None  # seed of the train/validation split, when the converter drew one
    # A target that is not a float32 vector (DeepCAM's (H, W) uint8 label map); None: (target_size,) float32.
    target_shape: tuple[int, ...] | None = dataclasses.field(default=None, metadata=OMITTED)
    target_dtype: str | None = dataclasses.field(default=None, metadata=OMITTED)
    aux_files: dict[str, AuxFile] = dataclasses.field(default_factory=dict, metadata=OMITTED)  # name -> file
    # Statistics of the training inputs computed by the converter, in its own form (CosmoFlow: per-channel
    # mean and std of log(1 + counts)); {} when the converter records none.
    input_stats: dict = dataclasses.field(default_factory=dict, metadata=OMITTED)

    def __post_init__(self):
        check(self.format in FORMATS, "format", self.format, f"one of {sorted(FORMATS)}")
        check(1 <= self.version <= FORMATS[self.format], "version", self.version,
              f"1 to {FORMATS[self.format]}, the versions of {self.format} this code reads (reconvert the dataset "
              f"or update the suite)")
        _positive_shape(self.sample_shape, "sample_shape")
        _positive_shape(self.target_shape, "target_shape")
        check(self.target_size >= 1, "target_size", self.target_size, "an integer >= 1")
        check((self.target_shape is None) == (self.target_dtype is None), "target_dtype", self.target_dtype,
              f"set together with target_shape (found {self.target_shape!r})")

    def check_indexes(self, where: Path) -> None:
        """A manifest on disk records the xxh3-128 of every DALI index it lists (`where`: its file)."""
        for name, split in self.splits.items():
            for i, entry in enumerate(split.files):
                if entry.index is not None and entry.index_xxh3_128 is None:
                    raise BenchError(f"{where}: key splits.{name}.files[{i}].index_xxh3_128 = None: expected the "
                                     f"xxh3-128 of the index {entry.index}")

    def to_dict(self) -> dict:
        """The JSON form (the fields in order; the optional ones only when set)."""
        return documents.to_dict(self)


def digest_file(path, digests: list, chunk_bytes: int) -> list[str]:
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            for digest in digests:
                digest.update(chunk)
    return [digest.hexdigest() for digest in digests]


def xxh3_128_file(path: str | os.PathLike, chunk_bytes: int = 8 << 20) -> str:
    """Hex xxh3-128 of a file, read in chunks."""
    import xxhash
    return digest_file(path, [xxhash.xxh3_128()], chunk_bytes)[0]


# ---------------------------------------------------------------------------- reading
def load_manifest(data_dir: str | os.PathLike, expected_format: str | None = None) -> Manifest:
    """Read and validate `data_dir/manifest.json` (through `Manifest`).

    Args:
        data_dir: a converted dataset directory.
        expected_format: the format id the caller reads; None accepts any id in `FORMATS`.
    Raises:
        BenchError: missing directory or manifest, bad JSON, unknown, missing or mistyped keys, an unknown
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
    manifest = documents.read(path, Manifest, kind="json", root=root)
    manifest.check_indexes(path)
    if expected_format is not None and manifest.format != expected_format:
        raise BenchError(f"{path}: format {manifest.format!r}, expected {expected_format!r}; "
                         f"this directory holds another kind of dataset")
    return manifest


def check_unstaged_source(data_cfg) -> None:
    """A packed dataset cannot be read in place: it needs data.stage_dir."""
    if (Path(data_cfg.dir) / PACK_NAME).is_file():
        raise BenchError(f"data.dir {data_cfg.dir} is a packed dataset ({PACK_NAME}); set data.stage_dir to a "
                         f"node-local directory to unpack it into, or point data.dir at the unpacked dataset")


def parse_manifest(obj: Any, root: Path, where: Path) -> Manifest:
    """A manifest from its JSON form `obj` (read from `where`), with its dataset directory `root`."""
    manifest = documents.build_from(where, obj, Manifest, root=root)
    manifest.check_indexes(where)
    return manifest


_XXH3_HEX = re.compile(r"[0-9a-f]{32}")
_DECIMAL = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit() also accepts '²', which int() refuses


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
    """Check that a split's files exist with the sizes, record counts and (optionally) checksums listed (xxh3-128).

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
            _check_digest(path, entry.xxh3_128)
            if entry.index is not None:
                _check_digest(manifest.root / entry.index, entry.index_xxh3_128)


def check_shard_files(manifest: Manifest, shards: dict, verify_checksums: bool = False) -> None:
    """`check_split_files` for just the files each split's shard reads (`shard.files`: absolute paths)."""
    for split, shard in shards.items():
        read = {Path(f).relative_to(manifest.root).as_posix() for f in shard.files}
        check_split_files(manifest, split, verify_checksums=verify_checksums, only=read)


def check_aux_file(manifest: Manifest, name: str) -> Path:
    """The path of auxiliary file `name`, checked against its size and xxh3-128 (always: such files are small).

    Raises BenchError when the manifest lists no such file or the file is missing or differs.
    """
    where = manifest.root / MANIFEST_NAME
    if name not in manifest.aux_files:
        raise BenchError(f"{where}: no auxiliary file {name!r} (found {sorted(manifest.aux_files)}); this "
                         f"dataset was converted without it, reconvert it")
    entry = manifest.aux_files[name]
    path = _check_present(manifest.root / entry.path, entry.bytes,
                          f"as {name!r} but missing; copy it back or reconvert the dataset")
    _check_digest(path, entry.xxh3_128)
    return path


def record_bytes(manifest: Manifest, only: set[str] | None = None) -> float:
    """Mean on-disk bytes of one record over all splits, or over the files `only` lists (read-bandwidth figures)."""
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


def _check_digest(path: Path, xxh3_128: str) -> None:
    """The file's xxh3-128 must be the manifest's."""
    found = xxh3_128_file(path)
    if found != xxh3_128:
        raise BenchError(f"{path}: xxh3_128 {found}, the manifest says {xxh3_128}; the file is corrupt or "
                         f"was changed, reconvert the dataset")
