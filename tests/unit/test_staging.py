"""common.io.staging and data_prep pack: identical copies, plans per mode, checksums, resumption, errors."""
import dataclasses
import errno
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from common.io import pycopy, staging
from common.base.errors import BenchError
from common.io.manifest import (MANIFEST_NAME, AuxFile, FileEntry, Manifest, SplitEntry, check_unstaged_source,
                                load_manifest, xxh3_128_file)
from common.io.manifest_write import sha256_file, write_manifest
from common.io.packing import PACK_NAME, load_pack
from common.io.staging import Layout, open_source, plan, stage, staged_dir
from data_prep.__main__ import main as data_prep_main

FILES = {"train": 8, "validation": 4}  # record files per split, 3 records each


def _write(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return sha256_file(path)


def make_dataset(root: Path, file_bytes: int = 40_000, xxh3: bool = True) -> Path:
    """A dataset directory the staging code accepts: record files with indexes, an aux file, a manifest (with
    sha256 and xxh3-128 digests, as the converters write them)."""
    rng = np.random.default_rng(0)
    splits = {}
    for split, count in FILES.items():
        entries = []
        for i in range(count):
            rel = f"{split}/part_{i:03d}.tfrecord"
            # Compressible but not trivial: small integers, as CosmoFlow's counts.
            data = rng.poisson(2, file_bytes).astype(np.uint8).tobytes()
            digest = _write(root / rel, data)
            index = f"0 {file_bytes // 3}\n{file_bytes // 3} {file_bytes // 3}\n{2 * (file_bytes // 3)} " \
                    f"{file_bytes - 2 * (file_bytes // 3)}\n"
            index_digest = _write(root / (rel + ".idx"), index.encode())
            entries.append(FileEntry(rel, 3, file_bytes, digest, rel + ".idx", index_digest,
                                     *(map(xxh3_128_file, (root / rel, root / (rel + ".idx"))) if xxh3 else ())))
        splits[split] = SplitEntry(3 * count, tuple(entries))
    aux_digest = _write(root / "stats.h5", b"statistics" * 10)
    manifest = Manifest(root=root, format="cosmoflow-tfrecord", version=1, sample_shape=(4, 4, 4, 4),
                        sample_dtype="int16", target_size=4, compression="none", splits=splits,
                        source={"test": True}, aux_files={"stats": AuxFile(
                            "stats.h5", 100, aux_digest, xxh3_128_file(root / "stats.h5") if xxh3 else None)})
    write_manifest(manifest, root)
    return root


def pack(src: Path, out: Path, compression: str = "zstd", archives: int = 4, *extra: str) -> Path:
    code = data_prep_main(["pack", "--input", str(src), "--out", str(out), "--compression", compression,
                           "--archives", str(archives), "--workers", "1", *extra])
    assert code == 0
    return out


def rank_files(manifest, rank, ranks):  # CosmoFlow's file-by-file sharding
    return [p for s in ("train", "validation") for e in manifest.splits[s].files[rank::ranks] for p in (e.path, e.index)]


def node_plan(source):
    return plan(source, "node", Layout(), rank_files)


def assert_same_files(staged: Path, src: Path, paths):
    for rel in paths:
        assert (staged / rel).read_bytes() == (src / rel).read_bytes(), rel


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("ds") / "data")


@pytest.mark.parametrize("compression", ["zstd", "gzip", "none"])
def test_packed_and_plain_staging_give_the_dataset_byte_for_byte(dataset, tmp_path, compression):
    packed = pack(dataset, tmp_path / "packed", compression)
    for src in (dataset, packed):
        source = open_source(src)
        result = stage(source, node_plan(source), tmp_path / f"local-{src.name}")
        out = Path(result.dir)
        assert_same_files(out, dataset, source.files)
        assert load_manifest(out).to_dict() == load_manifest(dataset).to_dict()
        record = json.loads((out / staging.STAGED_NAME).read_text())
        assert record["result"]["files"] == 2 * sum(FILES.values()) + 1 and result.files_reused == 0
        assert result.checksum == "xxh3_128"
        assert result.copier == "python"
        assert result.reads == ("stream" if src == packed and compression != "none" else "read")
        assert not list(out.rglob(f"*{staging.TEMP_MARK}*"))
    pack_info = load_pack(packed)
    assert pack_info.compression == compression and len(pack_info.archives) == 9  # 4 + 4 + aux
    assert all(sha256_file(packed / a.path) == a.sha256 for a in pack_info.archives)


def test_staging_never_modifies_its_input(dataset, tmp_path):
    before = {p: sha256_file(p) for p in dataset.rglob("*") if p.is_file()}
    source = open_source(dataset)
    stage(source, node_plan(source), tmp_path / "local")
    assert {p: sha256_file(p) for p in dataset.rglob("*") if p.is_file()} == before


def test_interleaved_archives_align_with_rank_shards(dataset, tmp_path):
    source = open_source(pack(dataset, tmp_path / "packed", "zstd", 4))
    mine = set(plan(source, "rank", Layout(rank=1, size=2, local_rank=1, local_size=2), rank_files).files)
    holding = {a.path for a in source.pack.archives if {m.path for m in a.members} & mine - {"stats.h5"}}
    # Files 1, 3, 5, 7 of train live in archives 1 and 3 of 4 (file i in archive i mod 4).
    assert holding == {f"train-0000{k}-of-00004.tar.zst" for k in (1, 3)} | {
        f"validation-0000{k}-of-00004.tar.zst" for k in (1, 3)}


def block_rank_files(manifest, rank, ranks):  # DeepCAM-like contiguous blocks of files
    return [p for s in ("train", "validation") for e in _block(manifest.splits[s].files, rank, ranks)
            for p in (e.path, e.index)]


def _block(entries, rank, ranks):
    return entries[rank * len(entries) // ranks:(rank + 1) * len(entries) // ranks]


def _archives_read(source, files) -> set[str]:
    """The record archives holding any of `files` (what a rank of data.stage_mode=rank unpacks)."""
    return {a.path for a in source.pack.archives if {m.path for m in a.members} & (set(files) - {"stats.h5"})}


@pytest.mark.parametrize("layout,sharding", [("interleaved", rank_files), ("contiguous", block_rank_files)])
def test_align_ranks_gives_each_rank_archives_of_its_own_files_only(dataset, tmp_path, layout, sharding):
    # 0.12 MiB archives: 3 for train's 8 files (0.31 MiB), 2 for validation's 4; aligned to 2 ranks: 4 and 2.
    def archives_per_rank(out, *extra):
        code = data_prep_main(["pack", "--input", str(dataset), "--out", str(out), "--archive-mb", "0.12",
                               "--layout", layout, "--workers", "1", *extra])
        assert code == 0
        source = open_source(out)
        return source, [_archives_read(source, plan(source, "rank", Layout(rank=r, size=2, local_rank=r,
                                                                             local_size=2), sharding).files)
                        for r in range(2)]
    source, (rank0, rank1) = archives_per_rank(tmp_path / "unaligned")
    assert sum(a.path.startswith("train-") for a in source.pack.archives) == 3
    assert rank0 & rank1  # some archive holds files of both ranks: both unpack it
    source, (rank0, rank1) = archives_per_rank(tmp_path / "aligned", "--align-ranks", "2")
    names = [a.path for a in source.pack.archives]
    assert sum(n.startswith("train-") for n in names) == 4 and sum(n.startswith("validation-") for n in names) == 2
    assert not rank0 & rank1 and rank0 | rank1 == set(names) - {"aux.tar.zst"}
    assert load_pack(tmp_path / "aligned").source["align_ranks"] == 2


def test_align_ranks_rounds_up_caps_at_one_archive_per_file_and_refuses_a_count_it_cannot_keep(dataset, tmp_path,
                                                                                                  capsys):
    def split_counts(out, align):
        code = data_prep_main(["pack", "--input", str(dataset), "--out", str(out), "--compression", "none",
                               "--workers", "1", "--align-ranks", str(align)])  # 256 MiB: one archive per split
        assert code == 0
        names = [a.path for a in load_pack(out).archives]
        return [sum(n.startswith(f"{split}-") for n in names) for split in FILES]
    assert split_counts(tmp_path / "three", 3) == [3, 3]
    assert split_counts(tmp_path / "sixteen", 16) == [8, 4]  # more ranks than files: one file per archive
    code = data_prep_main(["pack", "--input", str(dataset), "--out", str(tmp_path / "bad"), "--archives", "3",
                           "--align-ranks", "2"])
    assert code == 2 and not (tmp_path / "bad").exists()
    assert "--archives 3 is not a multiple of --align-ranks 2: use --archives 4" in capsys.readouterr().err


@pytest.mark.parametrize("size,local_size", [(1, 1), (2, 2), (4, 2), (6, 3), (4, 1)])
def test_plans_cover_every_file_of_the_dataset(dataset, size, local_size):
    source = open_source(dataset)
    every = set(source.files)
    layouts = [Layout(rank=r, size=size, local_rank=r % local_size, local_size=local_size, node=r // local_size,
                      nodes=size // local_size) for r in range(size)]
    if FILES["validation"] % size == 0:  # rank mode needs files to divide evenly between the ranks
        by_rank = [set(plan(source, "rank", lay, rank_files).files) - {"stats.h5"} for lay in layouts]
        assert set().union(*by_rank) == every - {"stats.h5"}
        assert sum(len(s) for s in by_rank) == len(every) - 1  # no file staged twice
    shares = {lay.node: set(plan(source, "node_share", lay, rank_files).files) - {"stats.h5"} for lay in layouts}
    assert set().union(*shares.values()) == every - {"stats.h5"}
    assert sum(len(s) for s in shares.values()) == len(every) - 1
    copiers = [plan(source, "node", lay, rank_files).copies for lay in layouts]
    assert copiers == [lay.local_rank == 0 for lay in layouts]


def test_a_flipped_byte_in_the_source_is_caught_and_nothing_is_renamed(dataset, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(dataset, src)
    victim = src / "train/part_005.tfrecord"
    data = bytearray(victim.read_bytes())
    data[1234] ^= 0x01
    victim.write_bytes(bytes(data))
    source = open_source(src)
    with pytest.raises(BenchError, match=r"part_005.tfrecord has xxh3_128 .* the source lists .*checksum mismatch"):
        stage(source, node_plan(source), tmp_path / "local", threads=1)
    out = staged_dir(tmp_path / "local", source, "node")
    assert not (out / "train/part_005.tfrecord").exists() and not (out / MANIFEST_NAME).exists()
    assert not list(out.rglob(f"*{staging.TEMP_MARK}*"))


def test_plain_staging_verifies_xxh3_when_the_manifest_records_it(tmp_path):
    src = make_dataset(tmp_path / "src", xxh3=True)
    source = open_source(src)
    assert source.files["train/part_001.tfrecord"].xxh3_128 == xxh3_128_file(src / "train/part_001.tfrecord")
    result = stage(source, node_plan(source), tmp_path / "ok", threads=2)
    assert result.checksum == "xxh3_128"
    assert_same_files(Path(result.dir), src, source.files)
    assert load_manifest(result.dir).to_dict() == load_manifest(src).to_dict()  # xxh3 keys kept
    victim = src / "validation/part_002.tfrecord.idx"
    victim.write_bytes(victim.read_bytes().replace(b"0 ", b"0\t", 1))  # same size, one byte changed
    with pytest.raises(BenchError, match=r"part_002.tfrecord.idx has xxh3_128 [0-9a-f]{32}, the source lists "
                                         r"[0-9a-f]{32}; the source is corrupt \(checksum mismatch\)"):
        stage(open_source(src), node_plan(source), tmp_path / "bad", threads=1)


@pytest.mark.parametrize("compression,method,message", [
    ("none", "read", r"checksum mismatch"),
    ("none", "mmap", r"checksum mismatch"),
    ("none", "kernel", r"checksum mismatch"),
    ("zstd", "read", r"corrupt (or truncated archive|zstd)|checksum mismatch"),
    ("gzip", "read", r"corrupt or truncated archive|checksum mismatch"),
])
def test_a_flipped_byte_in_an_archive_is_caught(dataset, tmp_path, compression, method, message):
    packed = pack(dataset, tmp_path / "packed", compression, 2)
    archive = next(packed.glob("train-00001-of-00002*"))
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x40
    archive.write_bytes(bytes(data))
    source = open_source(packed)
    with pytest.raises(BenchError, match=message) as err:
        stage(source, node_plan(source), tmp_path / "local", threads=1, copier=pycopy.Copier(method=method))
    assert str(archive) in str(err.value)
    assert not (staged_dir(tmp_path / "local", source, "node") / MANIFEST_NAME).exists()


def test_missing_truncated_and_misfiled_archives_are_named(dataset, tmp_path):
    packed = pack(dataset, tmp_path / "packed", "zstd", 2)
    source = open_source(packed)
    first = packed / source.pack.archives[0].path
    saved = first.read_bytes()
    first.unlink()
    with pytest.raises(BenchError, match=rf"{first}: archive listed in .*pack.json is missing"):
        stage(source, node_plan(source), tmp_path / "a")
    first.write_bytes(saved[:-100])
    with pytest.raises(BenchError, match=rf"{first}: {len(saved) - 100} bytes, pack.json says {len(saved)}"):
        stage(source, node_plan(source), tmp_path / "b")
    first.write_bytes(saved)
    # pack.json moving one member to another archive: one archive lacks it, the other holds an unlisted file.
    obj = json.loads((packed / PACK_NAME).read_text())
    moved = obj["archives"][0]["members"].pop()
    obj["archives"][1]["members"].append(moved)
    (packed / PACK_NAME).write_text(json.dumps(obj))
    source = open_source(packed)
    with pytest.raises(BenchError, match=rf"(member {moved['path']} listed in pack.json is missing from the archive"
                                         rf"|holds '{moved['path']}', which pack.json does not list)"):
        stage(source, node_plan(source), tmp_path / "c", threads=1)


def test_too_little_free_space_is_refused_before_copying(dataset, tmp_path, monkeypatch):
    source = open_source(dataset)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(staging.shutil, "disk_usage", lambda path: usage._replace(free=100_000))
    with pytest.raises(BenchError, match=r"0.00 GB free, but staging needs 0.00 GB \(25 files, "
                                         r"data.stage_mode=node\) plus 64 MiB to spare"):
        stage(source, node_plan(source), tmp_path / "local")
    out = staged_dir(tmp_path / "local", source, "node")
    assert not [p for p in out.rglob("*") if p.is_file()]


def test_an_interrupted_staging_is_never_complete_and_resumes(dataset, tmp_path, monkeypatch):
    source = open_source(pack(dataset, tmp_path / "packed", "zstd", 2))
    real_write, written = staging._write_verified, []

    def dies_after_five(stream, dest, member, where, bar):
        if len(written) == 5:
            raise KeyboardInterrupt  # what a killed job leaves: some files renamed, the rest never written
        real_write(stream, dest, member, where, bar)
        written.append(member.path)

    monkeypatch.setattr(staging, "_write_verified", dies_after_five)
    with pytest.raises(KeyboardInterrupt):
        stage(source, node_plan(source), tmp_path / "local", threads=1)
    out = staged_dir(tmp_path / "local", source, "node")
    assert not (out / MANIFEST_NAME).exists() and not (out / staging.STAGED_NAME).exists()
    with pytest.raises(BenchError, match="has no manifest.json"):
        load_manifest(out)
    (out / f".part.tfrecord{staging.TEMP_MARK}999-1").write_bytes(b"half")  # a killed writer's temporary
    monkeypatch.setattr(staging, "_write_verified", real_write)
    resumed = stage(source, node_plan(source), tmp_path / "local", reuse=True)
    assert resumed.files_reused == 5 and resumed.files == len(source.files) - 5
    assert_same_files(out, dataset, source.files)
    assert not list(out.rglob(f"*{staging.TEMP_MARK}*"))
    fresh = stage(source, node_plan(source), tmp_path / "local")  # without reuse: everything again
    assert fresh.files_reused == 0 and fresh.files == len(source.files)


def test_pack_refuses_a_corrupt_dataset_and_resumes_its_own_output(dataset, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(dataset, src)
    victim = src / "validation/part_002.tfrecord"
    data = bytearray(victim.read_bytes())
    data[7] ^= 0x10
    victim.write_bytes(bytes(data))
    code = data_prep_main(["pack", "--input", str(src), "--out", str(tmp_path / "bad"), "--archives", "2",
                           "--workers", "1"])
    assert code == 2 and not (tmp_path / "bad" / PACK_NAME).exists()
    out = pack(dataset, tmp_path / "good", "gzip", 2)
    first = json.loads((out / PACK_NAME).read_text())
    (out / PACK_NAME).unlink()
    (out / "validation-00000-of-00002.tar.gz").unlink()
    pack(dataset, out, "gzip", 2)
    assert json.loads((out / PACK_NAME).read_text()) == first
    assert data_prep_main(["pack", "--input", str(dataset), "--out", str(out), "--compression", "zstd",
                           "--archives", "2"]) == 2  # other settings into the same directory: refused


def test_packed_data_dir_needs_a_stage_dir(dataset, tmp_path):
    from cosmoflow.config import CosmoDataConfig
    packed = pack(dataset, tmp_path / "packed", "none", 1)
    with pytest.raises(BenchError, match=r"is a packed dataset \(pack.json\); set data.stage_dir"):
        check_unstaged_source(CosmoDataConfig(dir=str(packed)))
    check_unstaged_source(CosmoDataConfig(dir=str(dataset)))
    with pytest.raises(BenchError, match="neither manifest.json .* nor pack.json"):
        open_source(tmp_path)


def test_stage_command_prints_the_rate(dataset, tmp_path, capsys):
    assert data_prep_main(["stage", "--input", str(dataset), "--stage-dir", str(tmp_path / "l"), "--threads", "2"]) == 0
    line = capsys.readouterr().out
    # staging names the checksum it checked (it once printed "sha256" whatever it had checked)
    assert "staged 25 files" in line and "on 2 threads; every file written checked by its xxh3-128" in line
    from data_prep.stage import checksum_names
    assert checksum_names("sha256+xxh3_128") == "sha256 or xxh3-128" and checksum_names("xxh3_128") == "xxh3-128"


def test_result_figures():
    result = staging.StageResult(dir="d", mode="node", scope="node", source="s", source_kind="packed",
                                 compression="zstd", copied=True, files=3, bytes_written=4_000_000_000,
                                 bytes_read=1_000_000_000, seconds=2.0)
    figures = result.figures()
    assert figures["write_gb_per_second"] == 2.0 and figures["read_gb_per_second"] == 0.5
    assert figures["compression_ratio"] == 4.0
    assert dataclasses.replace(result, copied=False).figures()["write_gb_per_second"] is None


@pytest.mark.parametrize("method", pycopy.METHODS)
def test_every_plain_copy_method_gives_the_files_and_catches_a_flipped_byte(tmp_path, method):
    src = make_dataset(tmp_path / "src", xxh3=True)
    src.joinpath("train/part_000.tfrecord").write_bytes(b"")  # an empty file (manifest updated): copied too
    manifest = load_manifest(src)
    entry = manifest.splits["train"].files[0]
    emptied = dataclasses.replace(entry, bytes=0, sha256=sha256_file(src / entry.path),
                                  xxh3_128=xxh3_128_file(src / entry.path))
    splits = dict(manifest.splits, train=dataclasses.replace(
        manifest.splits["train"], files=(emptied, *manifest.splits["train"].files[1:])))
    write_manifest(dataclasses.replace(manifest, splits=splits), src)
    (src / "train/stray.bin").write_bytes(b"x")  # not in the manifest: never staged, must not disturb
    source, copier = open_source(src), pycopy.Copier(method=method)
    result = stage(source, node_plan(source), tmp_path / "local", threads=2, copier=copier)
    assert (result.reads, result.copier) == (method, "python")
    assert result.source_fs == staging.filesystem_type(src) != ""
    assert result.dest_fs == staging.filesystem_type(tmp_path / "local") != ""
    assert_same_files(Path(result.dir), src, source.files)
    assert not (Path(result.dir) / "train/stray.bin").exists()
    victim = src / "train/part_003.tfrecord"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0x80
    victim.write_bytes(bytes(data))
    with pytest.raises(BenchError, match=r"part_003.tfrecord has xxh3_128 .*checksum mismatch"):
        stage(open_source(src), node_plan(source), tmp_path / "again", threads=1, copier=copier)
    assert not [p for p in (tmp_path / "again").rglob("*part_003*")]  # neither renamed nor left as temporary


def test_the_default_copier_is_the_python_one_reading_into_a_buffer(tmp_path):
    src = make_dataset(tmp_path / "src", xxh3=True)
    source = open_source(src)
    result = stage(source, node_plan(source), tmp_path / "a")
    assert (result.copier, result.reads) == ("python", "read")
    with pytest.raises(BenchError, match=r"copy method 'cat': expected one of \['read', 'mmap', 'kernel'\]"):
        pycopy.Copier(method="cat")


def test_every_copy_method_unpacks_an_uncompressed_pack_alike(dataset, tmp_path):
    source = open_source(pack(dataset, tmp_path / "packed", "none", 3))
    for method in pycopy.METHODS:
        result = stage(source, node_plan(source), tmp_path / method, threads=2, copier=pycopy.Copier(method=method))
        assert result.reads == method and result.bytes_read == sum(a.bytes for a in source.pack.archives)
        assert_same_files(Path(result.dir), dataset, source.files)


@pytest.fixture(params=["same file system", "tmpfs"])
def copy_dest(request, tmp_path):
    """Where copies go: beside the source (ext4 here) or on /dev/shm (tmpfs, another file system)."""
    if request.param == "same file system":
        return tmp_path / "out"
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    out = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="stagecopy-test-"))
    request.addfinalizer(lambda: shutil.rmtree(out, ignore_errors=True))
    return out


@pytest.mark.parametrize("method", pycopy.METHODS)
def test_copy_of_a_byte_range_and_of_too_short_a_source(tmp_path, copy_dest, method):
    import xxhash
    data = np.random.default_rng(3).integers(0, 256, 3 * pycopy.BUFFER_BYTES + 9000, dtype=np.uint8).tobytes()
    copy_dest.mkdir(exist_ok=True)
    src, dst = tmp_path / "archive.tar", copy_dest / "member"
    src.write_bytes(data)
    buffer = memoryview(bytearray(4096))  # as staging's per-thread buffer, here far smaller than the ranges
    # Ranges inside one piece and across pieces, unaligned to pages, at the end, empty, the whole file.
    for offset, length in [(512, 1000), (5000, pycopy.BUFFER_BYTES + 3), (len(data) - 7, 7), (4096, 0),
                           (0, len(data))]:
        piece = data[offset:offset + length]
        assert pycopy.copy(src, dst, buffer, offset, length, method=method) == \
            (xxhash.xxh3_128(piece).hexdigest(), length)
        assert dst.read_bytes() == piece
    with pytest.raises(BenchError, match=rf"copying .*archive.tar to .*: the source has {len(data)} bytes, too few "
                                         rf"for 100 bytes from offset {len(data) - 50}; it is truncated"):
        pycopy.copy(src, dst, buffer, len(data) - 50, 100, method=method)


@pytest.mark.parametrize("method", pycopy.METHODS)
def test_copy_gives_the_bytes_and_the_digest_and_names_what_failed(tmp_path, copy_dest, method):
    import hashlib

    import xxhash
    data = np.random.default_rng(2).integers(0, 256, pycopy.BUFFER_BYTES * 2 + 123, dtype=np.uint8).tobytes()
    copy_dest.mkdir(exist_ok=True)
    for content in (data, b"", b"x"):
        src, dst = tmp_path / "src.bin", copy_dest / "dst.bin"
        src.write_bytes(content)
        for buffer_bytes in (pycopy.BUFFER_BYTES, 1000):
            dst.write_bytes(b"old, longer content to be truncated" * 10)
            assert pycopy.copy(src, dst, bytearray(buffer_bytes), method=method) == \
                (xxhash.xxh3_128(content).hexdigest(), len(content))
            assert dst.read_bytes() == content
        assert pycopy.copy(src, dst, bytearray(100), kind="sha256", method=method) == \
            (hashlib.sha256(content).hexdigest(), len(content))
    with pytest.raises(BenchError, match=r"copying .*missing.bin to .*: cannot open the source: No such file"):
        pycopy.copy(tmp_path / "missing.bin", tmp_path / "out.bin", bytearray(100), method=method)
    with pytest.raises(BenchError, match=r"copying .*src.bin to .*no-dir/out.bin: cannot create the copy: No such"):
        pycopy.copy(tmp_path / "src.bin", tmp_path / "no-dir" / "out.bin", bytearray(100), method=method)


def test_read_chunks_give_the_stream_including_empty_ones(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, staging.CHUNK * 2 + 123, dtype=np.uint8).tobytes()
    for content in (data, b""):
        path = tmp_path / "f"
        path.write_bytes(content)
        with open(path, "rb", buffering=0) as f:
            assert b"".join(bytes(c) for c in staging._read_chunks(f)) == content


def test_filesystem_type_is_that_of_the_longest_mount_point():
    assert staging.filesystem_type("/proc/self") == "proc"
    assert staging.filesystem_type("/") != ""


@pytest.mark.parametrize("method", pycopy.METHODS)
def test_a_batch_renames_what_it_checked_and_stops_at_the_first_bad_copy(tmp_path, method):
    import xxhash
    contents = [b"first file", b"second file", b"third file"]
    for i, data in enumerate(contents):
        (tmp_path / f"src{i}").write_bytes(data)

    def jobs(sizes, digests, sources=("src0", "src1", "src2")):
        return [pycopy.Job(str(tmp_path / s), 0, -1, str(tmp_path / f".out{i}.tmp"), str(tmp_path / f"out{i}"), size,
                           digest) for i, (s, size, digest) in enumerate(zip(sources, sizes, digests))]

    good = [xxhash.xxh3_128(d).hexdigest() for d in contents]
    sizes = [len(d) for d in contents]
    assert pycopy.copy_batch(jobs(sizes, good), bytearray(4), method) is None  # buffer far smaller
    assert [(tmp_path / f"out{i}").read_bytes() for i in range(3)] == contents
    for out in tmp_path.glob("out*"):
        out.unlink()
    wrong_size = pycopy.copy_batch(jobs([sizes[0], 99, sizes[2]], good), bytearray(64), method)
    assert (wrong_size.index, wrong_size.code, wrong_size.size, wrong_size.digest) == \
        (1, pycopy.SIZE_MISMATCH, sizes[1], good[1])
    wrong_digest = pycopy.copy_batch(jobs(sizes, [good[0], good[0], good[2]]), bytearray(64), method)
    assert (wrong_digest.index, wrong_digest.code, wrong_digest.digest) == (1, pycopy.DIGEST_MISMATCH, good[1])
    missing = pycopy.copy_batch(jobs(sizes, good, ("src0", "src1", "nothing")), bytearray(64), method)
    assert (missing.index, missing.code) == (2, errno.ENOENT) and "cannot open the source" in missing.message
    # The good copies before a failure are in place; the failed one is neither renamed nor left as temporary.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("src")) == ["out0", "out1"]


def test_batches_keep_the_order_and_their_limits(monkeypatch):
    monkeypatch.setattr(staging, "BATCH_FILES", 3)
    monkeypatch.setattr(staging, "BATCH_BYTES", 100)
    monkeypatch.setattr(staging, "BATCH_SHARE", 1)
    sizes = [10, 10, 10, 10, 90, 200, 5]
    files = {f"f{i}": staging.Member(path=f"f{i}", bytes=b, sha256="") for i, b in enumerate(sizes)}
    assert staging._batches(list(files), files) == [["f0", "f1", "f2"], ["f3", "f4"], ["f5"], ["f6"]]
    assert staging._batches([], files) == []


def test_batches_shrink_so_threads_finish_together(monkeypatch):
    monkeypatch.setattr(staging, "BATCH_SHARE", 2)
    files = {f"f{i}": staging.Member(path=f"f{i}", bytes=10, sha256="") for i in range(16)}
    # 160 bytes on 2 threads: a batch is at most 160 / (2 * 2) = 40 bytes, four files.
    batches = staging._batches(list(files), files, threads=2)
    assert [len(b) for b in batches] == [4, 4, 4, 4]
    assert [p for b in batches for p in b] == list(files)
    assert staging.batch_bytes(10 << 30, 2) == staging.BATCH_BYTES  # capped for large datasets
    assert staging.batch_bytes(0, 2) == 1  # at least one file per batch all the same


def test_a_plain_file_missing_from_a_batch_is_named(tmp_path):
    src = make_dataset(tmp_path / "src", xxh3=True)
    (src / "train/part_005.tfrecord").unlink()
    source = open_source(src)
    with pytest.raises(BenchError, match=r"train/part_005.tfrecord: listed in the manifest but missing"):
        stage(source, node_plan(source), tmp_path / "local", threads=2)
    assert not list((tmp_path / "local").rglob(f"*{staging.TEMP_MARK}*"))


# ---------------------------------------------------------------------------- tar headers (tarfile)
def _pax_header(records: bytes) -> bytes:
    """A pax extended header (type x) holding `records`, padded to whole blocks."""
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, len(records)
    return info.tobuf(tarfile.USTAR_FORMAT) + records + bytes(-len(records) % 512)


def _rewrite_archive(packed: Path, index: int, edit) -> Path:
    """Archive `index` of a pack with its tar bytes replaced by edit(tar bytes), recompressed as the pack is,
    and pack.json updated to its new size (what staging checks before reading it)."""
    import zstandard
    obj = json.loads((packed / PACK_NAME).read_text())
    path = packed / obj["archives"][index]["path"]
    compressed = obj["compression"] == "zstd"
    tar = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes()) if compressed else \
        path.read_bytes()
    tar = edit(tar)
    path.write_bytes(zstandard.ZstdCompressor().compress(tar) if compressed else tar)
    obj["archives"][index]["bytes"] = path.stat().st_size
    (packed / PACK_NAME).write_text(json.dumps(obj))
    return path


def _second_header(tar: bytes) -> int:
    """The offset of the second member's header: after the first header and its data's whole blocks."""
    size = tarfile.TarInfo.frombuf(tar[:512], "utf-8", "surrogateescape").size
    return 512 + -(-size // 512) * 512


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("where", ["first", "second"])
def test_a_pax_header_of_length_zero_ends_quickly_with_an_error_naming_the_archive(dataset, tmp_path, compression,
                                                                                     where):
    # "00 path=x": a record that claims no length at all. The hand-written pax parser staging had looped on
    # it forever; tarfile rejects it.
    packed = pack(dataset, tmp_path / "packed", compression, 2)
    at = (lambda tar: 0) if where == "first" else _second_header
    archive = _rewrite_archive(packed, 0, lambda tar: tar[:at(tar)] + _pax_header(b"00 path=x\n") + tar[at(tar):])
    source, outcome = open_source(packed), []

    def run():
        try:
            stage(source, node_plan(source), tmp_path / "local", threads=1)
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001  (reported by the assertions below)
            outcome.append(err)

    worker = threading.Thread(target=run, daemon=True)
    started = time.perf_counter()
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "staging did not end within 60 s on a pax header of length 0"
    assert time.perf_counter() - started < 60
    err = outcome[0]
    assert isinstance(err, BenchError), repr(err)
    assert str(archive) in str(err)
    assert re.search(r"damaged tar header at byte \d+ of the (decompressed )?archive, "
                     r"(before any member|after member \S+) \(.+\); expected a ustar or pax header", str(err)), err
    assert not (staged_dir(tmp_path / "local", source, "node") / MANIFEST_NAME).exists()


def test_a_header_failing_its_checksum_after_the_first_member_is_an_error_not_the_end(dataset, tmp_path):
    # tarfile alone takes a bad header after the first member for the end of the archive and stops.
    packed = pack(dataset, tmp_path / "packed", "none", 2)
    first = load_pack(packed).archives[0].members[0].path

    def spoil(tar: bytes) -> bytes:
        at = _second_header(tar)
        return tar[:at] + bytes([tar[at] ^ 0x01]) + tar[at + 1:]  # a name byte: the checksum no longer matches

    archive = _rewrite_archive(packed, 0, spoil)
    source = open_source(packed)
    with pytest.raises(BenchError, match=rf"{archive}: damaged tar header at byte \d+ of the archive, after member "
                                         rf"{first} \(bad checksum\); expected a ustar or pax header with a valid "
                                         rf"checksum"):
        stage(source, node_plan(source), tmp_path / "local", threads=1)


def test_a_member_that_is_not_a_regular_file_is_named(dataset, tmp_path):
    packed = pack(dataset, tmp_path / "packed", "none", 2)
    directory = tarfile.TarInfo("train")
    directory.type = tarfile.DIRTYPE
    archive = _rewrite_archive(packed, 0, lambda tar: directory.tobuf(tarfile.PAX_FORMAT) + tar)
    source = open_source(packed)
    with pytest.raises(BenchError, match=rf"{archive}: member 'train' is not a regular file \(tar type b'5'\)"):
        stage(source, node_plan(source), tmp_path / "local", threads=1)


def test_a_compressed_archive_is_read_front_to_back_only():
    stream = staging._ForwardStream(io.BytesIO(bytes(range(256)) * 100))
    assert stream.read(10) == bytes(range(10)) and stream.tell() == 10
    assert stream.seek(5, os.SEEK_CUR) == 15 and stream.read(1) == bytes([15])
    assert stream.seek(25_000) == 25_000 and stream.seek(30_000) == 25_600  # past the end: stops there
    with pytest.raises(OSError, match="read front to back: cannot seek from byte 25600 to 100"):
        stream.seek(100)


# ---------------------------------------------------------------------------- regressions found by fuzzing
# (tests/fuzz/test_manifest_fuzz.py, docs/fuzzing.md)
def test_pack_json_that_is_nested_too_deeply_or_holds_negative_sizes(dataset, tmp_path):
    packed = pack(dataset, tmp_path / "packed", "none", 1)
    good = json.loads((packed / PACK_NAME).read_text())
    (packed / PACK_NAME).write_text("[" * 100_000)
    with pytest.raises(BenchError, match="pack.json: not readable JSON \\(nested too deeply\\)"):
        load_pack(packed)
    good["archives"][0]["bytes"] = -1
    (packed / PACK_NAME).write_text(json.dumps(good))
    with pytest.raises(BenchError, match=r"pack.json: key archives\[0\].bytes = -1: expected an integer >= 0"):
        load_pack(packed)


def test_pack_whose_dataset_names_a_file_too_long_for_the_file_system(dataset, tmp_path):
    packed = pack(dataset, tmp_path / "packed", "none", 1)
    obj = json.loads((packed / PACK_NAME).read_text())
    entry = obj["dataset_manifest"]["splits"]["train"]["files"][0]
    entry["index"], entry["index_sha256"] = "x" * 300, "0" * 64
    (packed / PACK_NAME).write_text(json.dumps(obj))
    with pytest.raises(BenchError, match=f"pack.json: 1 file\\(s\\) of the dataset are in no archive, the first x{{300}}"):
        load_pack(packed)
