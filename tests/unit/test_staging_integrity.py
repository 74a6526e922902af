"""Staging's integrity (issue 25): a reused file is proven equal to its source, a full disk is reported as a full
disk, and `data_prep stage` says what it checked."""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from common.base.errors import BenchError
from common.io import decompress, pycopy, staging
from common.io.manifest import MANIFEST_NAME
from common.io.staging import open_source, stage, staged_dir
from data_prep.__main__ import main as data_prep_main
from tests.unit.test_index_staging import indexed, stage_node  # noqa: F401  (indexed: a module fixture)
from tests.unit.test_staging import assert_same_files, make_dataset, node_plan, pack

FREE = 7_000_000_000  # what the patched file system reports free: enough for the free-space check


@pytest.fixture(scope="module")
def xxh3_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("ds") / "data", xxh3=True)


def flip_byte(path: Path, at: int = 100) -> None:
    """Change one byte of `path` in place: same size, same inode."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))


def stage_again(source, root, **kwargs):
    return stage(source, node_plan(source), root, threads=2, reuse=True, **kwargs)


def count_hashes(monkeypatch) -> list[str]:
    """The staged files reuse re-hashes, in a list that fills as it does."""
    hashed, real = [], pycopy.digest_file

    def recording(path, kind, buffer):
        hashed.append(os.path.basename(path))
        return real(path, kind, buffer)

    monkeypatch.setattr(pycopy, "digest_file", recording)
    return hashed


def stamp_written_later(dest: Path) -> None:
    """Date the stamp a second after it was written, as a staging that ran for longer than a clock tick leaves
    it: no file it lists is then 'racy' (changed within the tick the stamp was written in)."""
    stamp = dest / staging.STAMP_NAME
    st = stamp.stat()
    os.utime(stamp, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


# ---------------------------------------------------------------------------- reuse
@pytest.mark.parametrize("compression", ["plain", "zstd", "none"])
def test_reuse_copies_again_a_staged_file_with_a_flipped_byte(xxh3_dataset, tmp_path, compression):
    src = xxh3_dataset if compression == "plain" else pack(xxh3_dataset, tmp_path / "packed", compression, 2)
    source = open_source(src)
    first = stage(source, node_plan(source), tmp_path / "local", threads=2)
    victim = Path(first.dir) / "train/part_004.tfrecord"
    flip_byte(victim)
    again = stage_again(source, tmp_path / "local")
    assert victim.read_bytes() == (xxh3_dataset / "train/part_004.tfrecord").read_bytes()
    assert (again.files, again.files_reused, again.files_recopied) == (1, 24, 1)
    assert_same_files(Path(again.dir), xxh3_dataset, source.files)


def test_reuse_hashes_only_what_the_stamp_cannot_vouch_for(xxh3_dataset, tmp_path, monkeypatch):
    source = open_source(xxh3_dataset)
    dest = Path(stage(source, node_plan(source), tmp_path / "local", threads=2).dir)
    stamp_written_later(dest)
    hashed = count_hashes(monkeypatch)
    untouched = stage_again(source, tmp_path / "local")
    assert hashed == [] and (untouched.files_reused, untouched.files_rechecked, untouched.files) == (25, 0, 0)
    # A flipped byte whose file gets its old modification time back: the change time still differs.
    victim = dest / "validation/part_001.tfrecord"
    st = victim.stat()
    flip_byte(victim)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert victim.stat().st_mtime_ns == st.st_mtime_ns and victim.stat().st_size == st.st_size
    stamp_written_later(dest)
    again = stage_again(source, tmp_path / "local")
    assert hashed == ["part_001.tfrecord"]
    assert (again.files, again.files_recopied, again.files_rechecked) == (1, 1, 0)
    assert victim.read_bytes() == (xxh3_dataset / "validation/part_001.tfrecord").read_bytes()


def test_reuse_rehashes_every_file_of_a_racy_stamp_or_of_an_interrupted_staging(xxh3_dataset, tmp_path,
                                                                                 monkeypatch):
    source = open_source(xxh3_dataset)
    dest = Path(stage(source, node_plan(source), tmp_path / "local", threads=2).dir)
    os.utime(dest / staging.STAMP_NAME, ns=(0, 0))  # every file changed "after" the stamp: none is vouched for
    hashed = count_hashes(monkeypatch)
    racy = stage_again(source, tmp_path / "local")
    assert (racy.files_reused, racy.files_rechecked, len(hashed)) == (25, 25, 25)
    (dest / staging.STAMP_NAME).unlink()  # as a killed staging leaves it: files renamed, no stamp
    (dest / MANIFEST_NAME).unlink()
    hashed.clear()
    resumed = stage_again(source, tmp_path / "local")
    assert (resumed.files_reused, resumed.files_rechecked, len(hashed)) == (25, 25, 25)
    (dest / staging.STAMP_NAME).write_text("{not json")  # a damaged stamp vouches for nothing
    assert stage_again(source, tmp_path / "local").files_rechecked == 25


def test_reuse_of_decompressed_files_needs_the_stamp_and_the_same_bytes(indexed, tmp_path):  # noqa: F811
    first = stage_node(indexed, tmp_path)
    dest = Path(first.dir)
    text = (dest / MANIFEST_NAME).read_text()
    victim = sorted((dest / "train").glob("*.tfrecord"))[3]
    good = victim.read_bytes()
    flip_byte(victim, at=len(good) // 2)  # inside a record's payload: the index still covers the file
    again = stage_node(indexed, tmp_path, reuse=True)
    assert victim.read_bytes() == good
    assert (again.files, again.files_reused, again.files_recopied) == (1, 39, 1)
    assert (dest / MANIFEST_NAME).read_text() == text
    (dest / staging.STAMP_NAME).unlink()  # no stamp: nothing proves a decompressed file is what was written
    unproven = stage_node(indexed, tmp_path, reuse=True)
    assert (unproven.files, unproven.files_reused, unproven.files_recopied) == (40, 0, 40)
    assert (dest / MANIFEST_NAME).read_text() == text


# ---------------------------------------------------------------------------- a full disk
class _FailingFile:
    """A file whose writes (mode "wb") or reads fail with `code` after `after` bytes."""

    def __init__(self, file, code: int, after: int):
        self.file, self.code, self.left = file, code, after

    def _spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise OSError(self.code, os.strerror(self.code))

    def write(self, data):
        self._spend(len(data))
        return self.file.write(data)

    def read(self, n=-1):
        data = self.file.read(n)
        self._spend(len(data))
        return data

    def readinto(self, buffer):
        got = self.file.readinto(buffer)
        self._spend(got)
        return got

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()
        return False


def failing_open(code: int, after: int, mode_wanted: str):
    def fake_open(path, mode="r", *args, **kwargs):
        file = open(path, mode, *args, **kwargs)
        return _FailingFile(file, code, after) if mode == mode_wanted else file
    return fake_open


def no_space(monkeypatch, compression: str) -> None:
    """The first write of a staged file fails with ENOSPC, where the path of `compression` writes: the copier
    (plain files and uncompressed archives) or the file staging opens for a member of a compressed archive. The
    disk reports FREE bytes free."""
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=FREE))
    if compression in ("plain", "none"):
        def full(fd, piece):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(pycopy, "_write_all", full)
    else:
        monkeypatch.setattr(staging, "open", failing_open(errno.ENOSPC, 0, "wb"), raising=False)


def assert_names_a_full_disk(err: BenchError, dest: Path) -> None:
    message = str(err)
    assert re.search(rf"cannot write {re.escape(str(dest))}/\S+{re.escape(staging.TEMP_MARK)}\d+-\d+: ", message), \
        message
    assert "No space left on device [ENOSPC]" in message, message
    assert f"{FREE / 1e9:.2f} GB ({FREE} bytes) free" in message, message
    assert "repack" not in message and "corrupt" not in message, message


@pytest.mark.parametrize("compression", ["zstd", "gzip", "none", "plain"])
def test_a_full_disk_while_unpacking_or_copying_says_so(xxh3_dataset, tmp_path, monkeypatch, compression):
    src = xxh3_dataset if compression == "plain" else pack(xxh3_dataset, tmp_path / "packed", compression, 2)
    source = open_source(src)
    no_space(monkeypatch, compression)
    with pytest.raises(BenchError) as err:
        stage(source, node_plan(source), tmp_path / "local", threads=1)
    dest = staged_dir(tmp_path / "local", source, "node")
    assert_names_a_full_disk(err.value, dest)
    assert not list(dest.rglob(f"*{staging.TEMP_MARK}*")) and not (dest / MANIFEST_NAME).exists()


class _ShortWrites(_FailingFile):
    """A file that writes at most 1000 bytes a call, as write(2) may on a disk filling up."""

    def write(self, data):
        return self.file.write(data[:1000])


def test_short_writes_are_written_on_not_renamed_short(xxh3_dataset, tmp_path, monkeypatch):
    source = open_source(pack(xxh3_dataset, tmp_path / "packed", "zstd", 2))

    def short_open(path, mode="r", *args, **kwargs):
        file = open(path, mode, *args, **kwargs)
        return _ShortWrites(file, 0, 0) if mode == "wb" else file

    monkeypatch.setattr(staging, "open", short_open, raising=False)
    result = stage(source, node_plan(source), tmp_path / "local", threads=1)
    assert_same_files(Path(result.dir), xxh3_dataset, source.files)


def test_a_full_disk_while_decompressing_says_so(indexed, tmp_path, monkeypatch):  # noqa: F811
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=FREE))
    monkeypatch.setattr(decompress, "open", failing_open(errno.ENOSPC, 0, "wb"), raising=False)
    with pytest.raises(BenchError) as err:
        stage_node(indexed, tmp_path)
    dest = staged_dir(tmp_path, open_source(indexed), "node", decompress=True)
    assert_names_a_full_disk(err.value, dest)


def test_an_io_error_reading_an_archive_is_not_called_corrupt(xxh3_dataset, tmp_path, monkeypatch):
    source = open_source(pack(xxh3_dataset, tmp_path / "packed", "zstd", 2))
    monkeypatch.setattr(staging, "open", failing_open(errno.EIO, 1000, "rb"), raising=False)
    with pytest.raises(BenchError) as err:
        stage(source, node_plan(source), tmp_path / "local", threads=1)
    message = str(err.value)
    assert re.search(r"packed/\S+\.tar\.zst: cannot read the archive .*Input/output error \[EIO\]", message), message
    assert "repack" not in message and "corrupt" not in message, message


# ---------------------------------------------------------------------------- what data_prep stage says
def test_stage_command_says_what_it_checked_and_what_it_reused(xxh3_dataset, tmp_path, capsys):
    command = ["stage", "--input", str(xxh3_dataset), "--stage-dir", str(tmp_path / "l"), "--threads", "2"]
    assert data_prep_main(command) == 0
    line = capsys.readouterr().out
    assert "every file written checked by its xxh3-128" in line and "sha256" not in line, line
    dest = next((tmp_path / "l").glob("*/node"))
    flip_byte(dest / "train/part_002.tfrecord")
    assert data_prep_main(command + ["--reuse"]) == 0
    line = capsys.readouterr().out
    assert "staged 1 files" in line and "24 reused" in line, line
    assert re.search(r"of the 24 reused, \d+ re-hashed and matched their checksums and \d+ unchanged since", line), \
        line
    assert "1 found changed or unproven and staged again" in line, line
    assert data_prep_main(command + ["--reuse", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert (figures["files"], figures["files_reused"], figures["files_recopied"]) == (0, 25, 0)
    assert figures["checksum"] == "xxh3_128" and "files_rechecked" in figures
