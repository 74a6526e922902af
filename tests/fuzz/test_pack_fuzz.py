"""Fuzzing the packed-dataset reader: staging (common/io/staging.py) unpacking the tar archives of a packed
dataset (common/io/packing.py) with the standard library's `tarfile`, uncompressed, gzip and zstd.

Inputs: a tiny packed dataset (12 record files with DALI indexes and an auxiliary file, in 5 archives) with
- the stored bytes of one archive corrupted (the compressed stream for gzip and zstd), its size in pack.json
  kept (which staging checks first) or updated;
- the tar stream of one archive changed, recompressed, and pack.json updated to its new size: corrupted bytes
  anywhere; one header field (name, size, type, magic, checksum, ...) rewritten, with the header's checksum
  recomputed so that tarfile takes it or not; an inserted pax extended or global header (records of length 0
  such as `00 path=x`, lengths that run past the header, paths that leave the directory or name another
  member, sizes, charsets, GNU sparse keys, bytes that are not UTF-8) or GNU long-name header;
- pack.json with one to three values mutated (as in test_manifest_fuzz.py), or a number of 5,000 digits.
Each is staged in `node` mode (every member wanted) and in `rank` mode (rank 0 of 4, which skips the members
of the other ranks). Promise: a BenchError naming the archive or pack.json, with no staged directory that
looks complete (no manifest.json written) and no temporary file left; or a staged directory whose files are
those of the dataset and pass its manifest's size and checksum checks. Never another exception, nor a hang
(10 s per input, SIGALRM).

Two findings in Python 3.11.7's tarfile are tested apart (docs/fuzzing.md): a member whose pax `size` is
negative made tarfile read the same headers again forever when staging skipped the member, and a pax header
of many `hdrcharset=` records takes time quadratic in its size. Staging's `_StrictTarInfo` refuses both.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.io import staging
from common.io.manifest import MANIFEST_NAME, check_split_counts, load_manifest, xxh3_128_file
from common.io.manifest_write import sha256_file
from common.io.packing import PACK_NAME, dataset_files
from common.io.staging import Layout, open_source, plan, stage
from tests.conftest import copy_of
from tests.fuzz.harness import Hang, corruptions, fuzz, outcome_of, time_limit, timed
from tests.fuzz.test_manifest_fuzz import json_mutation, write_json
from tests.unit.test_staging import make_dataset, pack
from tests.unit.test_staging import rank_files as cosmoflow_rank_files

LIMIT_S = 10.0  # per input; staging this pack takes about 20 ms
COMPRESSIONS = ("none", "gzip", "zstd")
MODES = {"node": Layout(), "rank": Layout(rank=0, size=4, local_rank=0, local_size=4)}
BLOCK = tarfile.BLOCKSIZE


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """12 record files of 600 bytes with their indexes and a stats file, xxh3-128 in the manifest."""
    return make_dataset(tmp_path_factory.mktemp("dataset") / "data", file_bytes=600, xxh3=True)


@pytest.fixture(scope="module")
def packs(dataset, tmp_path_factory) -> dict[str, Path]:
    """compression -> the dataset packed into 2 archives per split and one of the auxiliary file."""
    return {c: pack(dataset, tmp_path_factory.mktemp(f"pack-{c}") / "packed", c, 2) for c in COMPRESSIONS}


# ---------------------------------------------------------------------------- archives as tar streams
def decompress(data: bytes, compression: str) -> bytes:
    if compression == "zstd":
        import zstandard
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return gzip.decompress(data) if compression == "gzip" else data


def compress(tar: bytes, compression: str) -> bytes:
    if compression == "zstd":
        import zstandard
        return zstandard.ZstdCompressor(write_checksum=True).compress(tar)
    return gzip.compress(tar, mtime=0) if compression == "gzip" else tar


def archive_path(root: Path, index: int) -> Path:
    return root / json.loads((root / PACK_NAME).read_text())["archives"][index]["path"]


def rewrite_archive(root: Path, index: int, data: bytes) -> None:
    """Archive `index` holds `data` (as stored); pack.json gets its new size and sha256."""
    obj = json.loads((root / PACK_NAME).read_text())
    path = root / obj["archives"][index]["path"]
    path.write_bytes(data)
    obj["archives"][index]["bytes"], obj["archives"][index]["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (root / PACK_NAME).write_text(json.dumps(obj))


def headers(tar: bytes) -> list[tuple[int, str, int]]:
    """(offset, name, size) of each member header of an intact tar stream, then (end-of-archive offset, "", 0)."""
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as archive:
        members = [(m.offset, m.name, m.size) for m in archive.getmembers()]
        end = archive.offset
    return members + [(end, "", 0)]


def with_checksum(block: bytes) -> bytes:
    """A 512-byte header with its checksum field set to match its other bytes."""
    block = block[:148] + b" " * 8 + block[156:]
    return block[:148] + b"%06o\0 " % sum(block) + block[156:]


def extension_header(kind: bytes, payload: bytes, declared: int) -> bytes:
    """A header of type `kind` (x: pax extended, g: pax global, L: GNU long name) declaring `declared` bytes of
    data, followed by `payload` padded to whole blocks."""
    info = tarfile.TarInfo("././@PaxHeader" if kind in b"xg" else "././@LongLink")
    info.type, info.size = kind, 0
    block = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
    block[124:136] = b"%011o\0" % declared if 0 <= declared < 8 ** 11 else b"\x80" + declared.to_bytes(11, "big")
    return with_checksum(bytes(block)) + payload + bytes(-len(payload) % BLOCK)


# ---------------------------------------------------------------------------- strategies
FIELDS = {"name": (0, 100), "mode": (100, 8), "uid": (108, 8), "gid": (116, 8), "size": (124, 12),
          "mtime": (136, 12), "chksum": (148, 8), "type": (156, 1), "linkname": (157, 100), "magic": (257, 6),
          "version": (263, 2), "uname": (265, 32), "gname": (297, 32), "devmajor": (329, 8), "devminor": (337, 8),
          "prefix": (345, 155)}
TYPES = [b"0", b"\0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"L", b"K", b"S", b"x", b"g", b"V", b"M", b"Z"]
PAX_KEYS = ["path", "linkpath", "size", "uid", "gid", "mtime", "uname", "gname", "hdrcharset", "comment",
            "GNU.sparse.map", "GNU.sparse.size", "GNU.sparse.realsize", "GNU.sparse.name", "GNU.sparse.major",
            "GNU.sparse.minor", "GNU.sparse.offset", "GNU.sparse.numbytes"]
RAW_RECORDS = [b"00 path=x\n", b"0 path=x\n", b"000 path=x\n", b"1 path=x\n", b"5 path=x\n", b"9 path=x\n",
               b"99999999999999999999 path=x\n", b"path=x\n", b"11 path=x", b" 11 path=x\n", b"12 path\n",
               b"11 =x\n", b"10 \xff\xfe=x\n", b"", b"\n" * 20, bytes(100)]


def pax_values(names: list[str], negative: bool):
    """Values of pax records: member names, paths that leave the directory, numbers (negative ones only when
    `negative`), charsets, sparse maps, bytes that are not UTF-8."""
    numbers = ["0", "1", "5", "600", "601", "4096", "99999999999999999999", "1e3", "nan", "0x10", ""]
    if negative:
        numbers += ["-1", "-512", "-1536"]
    return (st.sampled_from(names + ["../x", "/etc/passwd", "", ".", "train", "x" * 300, "train/../../x"])
            | st.sampled_from(numbers) | st.sampled_from(["BINARY", "ISO-IR 10646 2000 UTF-8", "0,5,10", "1", "0,"])
            | st.text(max_size=12)).map(str.encode) | st.binary(max_size=12)


def record_length(body: bytes) -> int:
    """The length field of a pax record " KEY=VALUE\\n": the record's bytes, its own digits included."""
    length = len(body) + 1
    while length != len(body) + len(str(length)):
        length = len(body) + len(str(length))
    return length


@st.composite
def pax_records(draw, names: list[str], negative: bool) -> bytes:
    """One to four pax records, each "LENGTH KEY=VALUE\\n" with its length right or wrong, or a raw one."""
    records = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 4)) == 0:
            records.append(draw(st.sampled_from(RAW_RECORDS)))
            continue
        key = draw(st.sampled_from(PAX_KEYS) | st.text(min_size=1, max_size=8).filter(lambda k: "=" not in k))
        body = b" " + key.encode("utf-8", "surrogateescape") + b"=" + draw(pax_values(names, negative)) + b"\n"
        length = record_length(body)
        length += draw(st.sampled_from([0, 0, 0, -1, 1, -length, 1000]))
        records.append(str(length).encode() + body)
    return b"".join(records)


@st.composite
def tar_edits(draw, tar: bytes, negative: bool):
    """A changed tar stream and what was done (for the failing example's report)."""
    members = headers(tar)
    names = [name for _, name, _ in members if name]
    kind = draw(st.sampled_from(["bytes", "field", "pax", "longname"]))
    at, name, size = draw(st.sampled_from(members))
    if kind == "bytes":
        corruption = draw(corruptions(len(tar)))
        return corruption.apply(tar), corruption
    if kind == "field":
        field = draw(st.sampled_from(sorted(FIELDS)))
        start, width = FIELDS[field]
        special = {"size": [b"%011o\0" % v for v in (0, max(size - 1, 0), size + 1, size + BLOCK, 8 ** 11 - 1)]
                   + [b"\x80" + (2 ** 62).to_bytes(11, "big"), b"abcdefghijk\0"] + ([b"\xff" * 12] if negative
                                                                                    else []),
                   "type": TYPES, "magic": [b"ustar\0", b"ustar ", b"\0" * 6],
                   "name": [n.encode().ljust(100, b"\0") for n in names] + [b"../x".ljust(100, b"\0")]}
        value = draw(st.sampled_from(special.get(field, [b"\0" * width])) | st.binary(min_size=width, max_size=width))
        block = tar[at:at + BLOCK]
        block = block[:start] + value[:width].ljust(width, b"\0") + block[start + width:]
        fixed = draw(st.booleans(), label="checksum recomputed")
        block = with_checksum(block) if fixed and field != "chksum" else block
        return tar[:at] + block + tar[at + BLOCK:], (field, at, value, fixed)
    if kind == "pax":
        records = draw(pax_records(names, negative))
        declared = len(records) + draw(st.sampled_from([0, 0, 0, -1, 1, BLOCK, 10 ** 6]))
        header = extension_header(draw(st.sampled_from([b"x", b"g"])), records, max(declared, 0))
        return tar[:at] + header + tar[at:], ("pax", at, records, declared)
    long_name = draw(st.sampled_from(names + ["../x", "x" * 300, ""]).map(str.encode) | st.binary(max_size=40))
    declared = len(long_name) + draw(st.sampled_from([0, 1, -1, BLOCK]))
    return tar[:at] + extension_header(b"L", long_name + b"\0", max(declared, 0)) + tar[at:], \
        ("longname", at, long_name, declared)


# ---------------------------------------------------------------------------- the promise
def rank_files(manifest, rank: int, ranks: int) -> list[str]:
    """CosmoFlow's file-by-file sharding, refusing a manifest without a training or validation split (the
    applications' `files_read` raise KeyError there: docs/fuzzing.md, open finding)."""
    check_split_counts(manifest, {"train": 0, "validation": 0}, str(manifest.root / PACK_NAME))
    return cosmoflow_rank_files(manifest, rank, ranks)


def stage_pack(root: Path, mode: str, stage_root: Path):
    source = open_source(root)
    the_plan = plan(source, mode, MODES[mode], rank_files)
    return stage(source, the_plan, stage_root, threads=1), the_plan.files


def check_staging(root: Path, dataset: Path, mode: str, stage_root: Path, limit_s: float = LIMIT_S) -> str:
    """Stage the pack at `root` and assert the promise; returns the outcome for the tally."""
    started = time.perf_counter()
    with time_limit(limit_s):
        outcome, value = outcome_of(lambda: stage_pack(root, mode, stage_root))
    seconds = time.perf_counter() - started
    # staging turns the SIGALRM of the time limit into a BenchError like any other exception inside an archive
    assert seconds < limit_s and Hang.__name__ not in str(value), f"{root} ({mode}): no result after {seconds:.1f} s"
    assert outcome != "crash", f"{root} ({mode}):\n{value}"
    leftovers = [p for p in stage_root.rglob("*") if staging.TEMP_MARK in p.name]
    assert not leftovers, leftovers
    if outcome == "BenchError":
        assert str(root) in value, value
        assert not list(stage_root.rglob(MANIFEST_NAME)), f"{value}, yet a staged manifest.json was written"
        return "BenchError"
    result, files = value
    staged = Path(result.dir)
    manifest = load_manifest(staged)
    listed = dataset_files(manifest)
    for rel in files:
        data = (staged / rel).read_bytes()
        assert data == (dataset / rel).read_bytes(), f"{staged / rel} differs from the packed file"
        assert rel in listed, f"{staged / rel}: staged, but the staged manifest does not list it"
        member = listed[rel]
        assert len(data) == member.bytes and sha256_file(staged / rel) == member.sha256, \
            f"{staged / rel}: the staged manifest says {member}"
        assert member.xxh3_128 in (None, xxh3_128_file(staged / rel)), f"{staged / rel}: the staged manifest says " \
                                                                     f"{member}"
    return "staged as packed"


# ---------------------------------------------------------------------------- the tests
@fuzz(examples=60, deadline_s=30)
@given(data=st.data(), compression=st.sampled_from(COMPRESSIONS), mode=st.sampled_from(sorted(MODES)),
       resized=st.booleans())
def test_corrupted_archive_bytes(dataset, packs, tmp_path_factory, data, compression, mode, resized):
    root = copy_of(packs[compression], tmp_path_factory, "packed")
    index = data.draw(st.integers(0, 4), label="archive")
    stored = archive_path(root, index).read_bytes()
    changed = data.draw(corruptions(len(stored)), label="corruption").apply(stored)
    if resized:
        rewrite_archive(root, index, changed)
    else:
        archive_path(root, index).write_bytes(changed)
    with timed(f"pack: corrupted archive bytes ({compression})") as box:
        box[0] = check_staging(root, dataset, mode, tmp_path_factory.mktemp("staged"))


@fuzz(examples=120, deadline_s=30)
@given(data=st.data(), compression=st.sampled_from(COMPRESSIONS), mode=st.sampled_from(sorted(MODES)))
def test_changed_tar_stream(dataset, packs, tmp_path_factory, data, compression, mode):
    root = copy_of(packs[compression], tmp_path_factory, "packed")
    index = data.draw(st.integers(0, 4), label="archive")
    tar = decompress(archive_path(root, index).read_bytes(), compression)
    # Negative sizes only where every member is wanted: skipping one is tarfile's endless loop (tested below).
    changed, _ = data.draw(tar_edits(tar, negative=mode == "node"), label="edit")
    rewrite_archive(root, index, compress(changed, compression))
    with timed(f"pack: changed tar stream ({compression}, {mode})") as box:
        box[0] = check_staging(root, dataset, mode, tmp_path_factory.mktemp("staged"))


@fuzz(examples=60, deadline_s=30)
@given(data=st.data(), compression=st.sampled_from(COMPRESSIONS), mode=st.sampled_from(sorted(MODES)))
def test_mutated_pack_json_staged(dataset, packs, tmp_path_factory, data, compression, mode):
    root = copy_of(packs[compression], tmp_path_factory, "packed")
    obj = json.loads((root / PACK_NAME).read_text())
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        obj = data.draw(json_mutation(obj), label="mutated pack.json")
    write_json(root / PACK_NAME, obj)
    if data.draw(st.integers(0, 9), label="an integer too long to convert if 0") == 0:
        text = (root / PACK_NAME).read_text()
        numbers = [m.span() for m in re.finditer(r"(?<=: )-?\d+", text)]
        if numbers:
            start, end = data.draw(st.sampled_from(numbers), label="number")
            (root / PACK_NAME).write_text(text[:start] + "1" + "0" * 5000 + text[end:])
    with timed("pack: mutated pack.json, staged") as box:
        box[0] = check_staging(root, dataset, mode, tmp_path_factory.mktemp("staged"))


# ---------------------------------------------------------------------------- open findings in tarfile
SHORT_S = 2.0  # these inputs take milliseconds once the bugs are fixed; the time limit is the test's cost until then


def _insert_before(root: Path, member: str, header: bytes) -> None:
    """`header` inserted before `member`'s header in the first (uncompressed) archive."""
    tar = archive_path(root, 0).read_bytes()
    at = next(offset for offset, name, _ in headers(tar) if name == member)
    rewrite_archive(root, 0, tar[:at] + header + tar[at:])


# Python 3.11.7\'s tarfile takes a negative pax size and looks for the next header before this one (CVE-2025-8194);
# _StrictTarInfo refuses it.
def test_a_negative_pax_size_pointing_back_ends_with_an_error(dataset, packs, tmp_path_factory):
    root = copy_of(packs["none"], tmp_path_factory, "packed")
    # The pax header takes 2 blocks and its member's header one: size -3 blocks points at the pax header again.
    # train/part_002.tfrecord is in the first archive, and rank 0 of 4 does not read it.
    _insert_before(root, "train/part_002.tfrecord", extension_header(b"x", b"14 size=-1536\n", 14))
    assert check_staging(root, dataset, "rank", tmp_path_factory.mktemp("staged"), SHORT_S) == "BenchError"


# Python 3.11.7\'s tarfile searches a pax header with a backtracking regular expression (CVE-2024-6232);
# _StrictTarInfo refuses pax headers over 64 KiB.
def test_a_large_pax_header_of_hdrcharset_records_ends_quickly(dataset, packs, tmp_path_factory):
    root = copy_of(packs["none"], tmp_path_factory, "packed")
    records = b"1 hdrcharset=" * 80_000  # 1 MB, no newline: each of the 80,000 matches scans to the end
    _insert_before(root, "train/part_002.tfrecord", extension_header(b"x", records, len(records)))
    assert check_staging(root, dataset, "node", tmp_path_factory.mktemp("staged"), SHORT_S) == "BenchError"

