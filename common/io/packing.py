"""Packed datasets: a converted dataset as a few compressed tar archives plus `pack.json`.

`python -m data_prep pack` writes them; `common.io.staging` unpacks them to node-local storage.
Each archive ("shard") holds whole files of the dataset (record files with their DALI indexes,
or the auxiliary files) under their paths relative to the dataset directory. `pack.json` holds the
dataset's own manifest (written into the staged directory last), the compression, and per archive
its size, sha256 and members, each with its size, sha256 and xxh3-128 digest, so that unpacking can
verify every byte it writes: with xxh3-128, which is several times faster than sha256 and as good at
catching corruption (it is not a cryptographic hash; the packer checked each file's sha256 against the
dataset's manifest while computing it). See docs/formats.md.
"""
from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path
from typing import Literal

from common.base import documents
from common.base.documents import NOT_STORED, REQUIRED, Count, check
from common.base.errors import BenchError
from common.io.manifest import MANIFEST_NAME, PACK_NAME, Manifest, check_relative, check_xxh3, parse_manifest

PACK_FORMAT = "packed-dataset"
PACK_VERSION = 1
SUFFIXES = {"zstd": ".tar.zst", "gzip": ".tar.gz", "none": ".tar"}


@dataclasses.dataclass(frozen=True)
class Member:
    """One file inside an archive; `path` is relative to the dataset directory."""

    path: str
    bytes: Count  # -1 in memory: an index file not found (dataset_files)
    sha256: str
    xxh3_128: str | None = dataclasses.field(default=None, metadata=REQUIRED)  # None only in memory

    def __post_init__(self):
        check_relative(self.path, "path")
        check_xxh3(self.xxh3_128, "xxh3_128")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Archive:
    path: str  # relative to the pack directory
    bytes: int
    sha256: str
    members: tuple[Member, ...]

    def __post_init__(self):
        check(self.bytes >= 0, "bytes", self.bytes, "an integer >= 0")
        check_relative(self.path, "path")


@dataclasses.dataclass(frozen=True)
class Pack:
    root: Path = dataclasses.field(kw_only=True, metadata=NOT_STORED)  # the pack directory
    compression: Literal["zstd", "gzip", "none"]  # the keys of SUFFIXES
    dataset_manifest: dict  # the packed dataset's manifest.json, as JSON
    archives: tuple[Archive, ...]
    source: dict  # provenance: the packed directory, settings
    format: Literal["packed-dataset"] = dataclasses.field(default=PACK_FORMAT, metadata=REQUIRED)
    version: Literal[1] = dataclasses.field(default=PACK_VERSION, metadata=REQUIRED)

    def manifest(self) -> Manifest:
        """The packed dataset's manifest (its root is the pack directory, where no record file lives)."""
        return parse_manifest(self.dataset_manifest, self.root, self.root / PACK_NAME)

    def members(self) -> dict[str, tuple[Archive, Member]]:
        """Every packed file by its dataset path, with the archive holding it."""
        return {m.path: (a, m) for a in self.archives for m in a.members}

    def to_dict(self) -> dict:
        return {"format": PACK_FORMAT, "version": PACK_VERSION, "compression": self.compression,
                "source": self.source, "dataset_manifest": self.dataset_manifest,
                "archives": [{"path": a.path, "bytes": a.bytes, "sha256": a.sha256,
                              "members": [m.to_dict() for m in a.members]} for a in self.archives]}


def load_pack(pack_dir: str | os.PathLike) -> Pack:
    """Read and validate `pack_dir/pack.json` (through `Pack`, then against its own dataset manifest); raises
    BenchError naming the file and the problem."""
    root = Path(pack_dir)
    path = root / PACK_NAME
    if not path.is_file():
        raise BenchError(f"{root}: no {PACK_NAME}; not a packed dataset (made by `python -m data_prep pack`), "
                         f"or its packing did not finish")
    pack = documents.read(path, Pack, kind="json", root=root)
    _check_complete(pack, path)
    return pack


def dataset_files(manifest: Manifest) -> dict[str, Member]:
    """Every file a dataset directory holds besides manifest.json: record files, indexes, auxiliary files."""
    files = {}
    for split in manifest.splits.values():
        for e in split.files:
            files[e.path] = Member(e.path, e.bytes, e.sha256, e.xxh3_128)
            if e.index is not None:
                files[e.index] = Member(e.index, _index_bytes(manifest, e.index), e.index_sha256, e.index_xxh3_128)
    for aux in manifest.aux_files.values():
        files[aux.path] = Member(aux.path, aux.bytes, aux.sha256, aux.xxh3_128)
    return files


def _index_bytes(manifest: Manifest, index: str) -> int:
    """Index sizes are not in the manifest; they are read from the dataset (at packing) or the pack."""
    try:
        # One call, from strings (a Path per index cost 8 ms of CosmoFlow's thousand indexes)
        st = os.stat(os.path.join(manifest.root, index))
        return st.st_size if stat.S_ISREG(st.st_mode) else -1
    except (OSError, ValueError):  # a name too long for the file system, or holding NUL: no such file here either
        return -1


def _check_complete(pack: Pack, where: Path) -> None:
    """The archives hold exactly the files of the packed dataset, each once, with the size and checksums its
    manifest lists."""
    manifest = pack.manifest()
    members: dict[str, Member] = {}
    for archive in pack.archives:
        for m in archive.members:
            if m.path in members:
                raise BenchError(f"{where}: {m.path} is packed twice (second time in {archive.path})")
            members[m.path] = m
    if MANIFEST_NAME in members:
        raise BenchError(f"{where}: {MANIFEST_NAME} must not be an archive member (it is written last when staging)")
    expected = dataset_files(manifest)
    missing = sorted(set(expected) - set(members))
    if missing:
        raise BenchError(f"{where}: {len(missing)} file(s) of the dataset are in no archive, the first {missing[0]}")
    unlisted = sorted(set(members) - set(expected))
    if unlisted:  # staging would write it beside a manifest that does not list it
        raise BenchError(f"{where}: {len(unlisted)} archive member(s) are no file of the dataset manifest, the first "
                         f"{unlisted[0]}")
    indexes = {e.index for split in manifest.splits.values() for e in split.files if e.index}
    for path, m in members.items():
        _check_member(m, expected[path], path in indexes, where)


def _check_member(member: Member, listed: Member, is_index: bool, where: Path) -> None:
    """A member's size and digests are those the dataset manifest lists, which staging writes beside the files
    it verified with the member's (index sizes are not in the manifest)."""
    pairs = [("sha256", member.sha256, listed.sha256), ("xxh3_128", member.xxh3_128, listed.xxh3_128)]
    if not is_index:
        pairs.append(("bytes", member.bytes, listed.bytes))
    for key, found, expected in pairs:
        if found != expected:
            raise BenchError(f"{where}: member {member.path} has {key} {found}, the dataset manifest says {expected}")
