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
import json
import os
import stat
from pathlib import Path
from typing import Any

from common.base.errors import BenchError
from common.io.manifest import MANIFEST_NAME, Manifest, _check_relative, _get, _parse, get_count

PACK_NAME = "pack.json"
PACK_FORMAT = "packed-dataset"
PACK_VERSION = 1
SUFFIXES = {"zstd": ".tar.zst", "gzip": ".tar.gz", "none": ".tar"}


@dataclasses.dataclass(frozen=True)
class Member:
    """One file inside an archive; `path` is relative to the dataset directory."""

    path: str
    bytes: int
    sha256: str
    xxh3_128: str | None = None  # hex digest; packs made by this version always have it

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return d if self.xxh3_128 else {k: v for k, v in d.items() if k != "xxh3_128"}


@dataclasses.dataclass(frozen=True)
class Archive:
    path: str  # relative to the pack directory
    bytes: int
    sha256: str
    members: tuple[Member, ...]


@dataclasses.dataclass(frozen=True)
class Pack:
    root: Path  # the pack directory; not stored in the JSON
    compression: str  # "zstd", "gzip" or "none"
    dataset_manifest: dict  # the packed dataset's manifest.json, as JSON
    archives: tuple[Archive, ...]
    source: dict  # provenance: the packed directory, settings

    def manifest(self) -> Manifest:
        """The packed dataset's manifest (its root is the pack directory, where no record file lives)."""
        return _parse(self.dataset_manifest, self.root, self.root / PACK_NAME)

    def members(self) -> dict[str, tuple[Archive, Member]]:
        """Every packed file by its dataset path, with the archive holding it."""
        return {m.path: (a, m) for a in self.archives for m in a.members}

    def to_dict(self) -> dict:
        return {"format": PACK_FORMAT, "version": PACK_VERSION, "compression": self.compression,
                "source": self.source, "dataset_manifest": self.dataset_manifest,
                "archives": [{"path": a.path, "bytes": a.bytes, "sha256": a.sha256,
                              "members": [m.to_dict() for m in a.members]} for a in self.archives]}


def load_pack(pack_dir: str | os.PathLike) -> Pack:
    """Read and validate `pack_dir/pack.json`; raises BenchError naming the file and the problem."""
    root = Path(pack_dir)
    path = root / PACK_NAME
    if not path.is_file():
        raise BenchError(f"{root}: no {PACK_NAME}; not a packed dataset (made by `python -m data_prep pack`), "
                         f"or its packing did not finish")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:  # ValueError: bad JSON, or an integer of > 4300 digits
        raise BenchError(f"{path}: not a readable JSON pack description ({err})") from None
    except RecursionError:
        raise BenchError(f"{path}: not a JSON pack description (nested too deeply)") from None
    return parse_pack(obj, root)


def parse_pack(obj: Any, root: Path) -> Pack:
    where = root / PACK_NAME
    if not isinstance(obj, dict):
        raise BenchError(f"{where}: a JSON {type(obj).__name__}, expected an object")
    if _get(obj, "format", str, where) != PACK_FORMAT:
        raise BenchError(f"{where}: format {obj['format']!r}, expected {PACK_FORMAT!r}")
    if not 1 <= _get(obj, "version", int, where) <= PACK_VERSION:
        raise BenchError(f"{where}: version {obj['version']}, this code reads 1 to {PACK_VERSION}")
    compression = _get(obj, "compression", str, where)
    if compression not in SUFFIXES:
        raise BenchError(f"{where}: compression {compression!r}, expected one of {list(SUFFIXES)}")
    archives = tuple(_parse_archive(a, where, i) for i, a in enumerate(_get(obj, "archives", list, where)))
    pack = Pack(root=root, compression=compression, dataset_manifest=_get(obj, "dataset_manifest", dict, where),
                archives=archives, source=_get(obj, "source", dict, where))
    _check_complete(pack, where)
    return pack


def _parse_archive(obj: Any, where: Path, i: int) -> Archive:
    label = f"archive {i}"
    if not isinstance(obj, dict):
        raise BenchError(f"{where}: {label} is a JSON {type(obj).__name__}, expected an object")
    members = []
    for j, m in enumerate(_get(obj, "members", list, where, label)):
        if not isinstance(m, dict):
            raise BenchError(f"{where}: {label} member {j} is {m!r}, expected an object")
        member = Member(path=_get(m, "path", str, where, f"{label} member {j}"),
                        bytes=get_count(m, "bytes", where, f"{label} member {j}"),
                        sha256=_get(m, "sha256", str, where, f"{label} member {j}"),
                        xxh3_128=_get(m, "xxh3_128", str, where, f"{label} member {j}") if "xxh3_128" in m else None)
        _check_relative(member.path, where, f"{label} member {j}")
        members.append(member)
    archive = Archive(path=_get(obj, "path", str, where, label), bytes=get_count(obj, "bytes", where, label),
                      sha256=_get(obj, "sha256", str, where, label), members=tuple(members))
    _check_relative(archive.path, where, label)
    return archive


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
    pairs = [("sha256", member.sha256, listed.sha256)]
    if member.xxh3_128 and listed.xxh3_128:
        pairs.append(("xxh3_128", member.xxh3_128, listed.xxh3_128))
    if not is_index:
        pairs.append(("bytes", member.bytes, listed.bytes))
    for key, found, expected in pairs:
        if found != expected:
            raise BenchError(f"{where}: member {member.path} has {key} {found}, the dataset manifest says {expected}")
