"""common/base/files.py: a file or directory appears under its final name only when written whole."""
from __future__ import annotations

import os

import pytest

from common.base.files import atomic_path, temp_path, write_json_atomic, write_text_atomic


def test_the_temporary_is_hidden_beside_the_final_name(tmp_path):
    assert temp_path(tmp_path / "a.json") == tmp_path / f".a.json.tmp-{os.getpid()}"


def test_a_file_is_renamed_into_place_when_the_block_succeeds(tmp_path):
    final = tmp_path / "sub" / "out.bin"  # the parent is created
    with atomic_path(final) as tmp:
        tmp.write_bytes(b"whole")
        assert not final.exists() and tmp.parent == final.parent
    assert final.read_bytes() == b"whole"
    assert sorted(p.name for p in final.parent.iterdir()) == ["out.bin"]


def test_a_failed_block_leaves_neither_the_final_name_nor_a_temporary(tmp_path):
    final = tmp_path / "out.bin"
    final.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_path(final) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("disk full")
    assert final.read_bytes() == b"old"  # the earlier version stays
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_a_directory_replaces_the_old_one_whole(tmp_path):
    final = tmp_path / "report"
    (final / "stale").mkdir(parents=True)
    with atomic_path(final) as tmp:
        (tmp / "figures").mkdir(parents=True)
        (tmp / "summary.md").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == ["figures", "summary.md"]
    with pytest.raises(KeyError):
        with atomic_path(final) as tmp:
            (tmp / "half").mkdir(parents=True)
            raise KeyError("interrupted")
    assert sorted(p.name for p in final.iterdir()) == ["figures", "summary.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_a_leftover_of_a_process_with_the_same_pid_is_replaced(tmp_path):
    final = tmp_path / "report"
    (temp_path(final) / "leftover").mkdir(parents=True)
    with atomic_path(final) as tmp:
        tmp.mkdir()
        (tmp / "new").write_text("x")
    assert [p.name for p in final.iterdir()] == ["new"]


def test_text_and_json(tmp_path):
    assert write_text_atomic("hello\n", tmp_path / "a.txt").read_text() == "hello\n"
    assert write_json_atomic({"a": 1}, tmp_path / "b.json").read_text() == '{\n  "a": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.json"]
