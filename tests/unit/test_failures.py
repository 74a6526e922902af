"""One rank's failure as every rank's (common/runtime/run.py shared_failures, common/runtime/failures.py): the
failing rank's note, and a rank whose collective failed with Horovod's shutdown ending as the noted rank did."""
import os
import subprocess
import sys
import types

import pytest

from common.base.errors import BenchError
from common.base.cli import guarded
from common.runtime import failures
from common.runtime.run import shared_failures
from tests.conftest import REPO

SHUTDOWN = RuntimeError("{{function_node x}} Horovod has been shut down. This was caused by an exception on one of "
                        "the ranks")


def dist(rank, size=2):
    return types.SimpleNamespace(rank=rank, size=size)


def fail_with(err, out, rank, size=2):
    with shared_failures(out, dist(rank, size)):
        raise err


def test_a_ranks_own_error_is_noted_with_its_code_and_raised_as_it_was(tmp_path):
    with pytest.raises(BenchError, match="corrupt record"):
        fail_with(BenchError("train/u4.tfrecord: corrupt record"), tmp_path, 1)
    with pytest.raises(KeyError):
        fail_with(KeyError("x"), tmp_path, 0)
    notes = {n["rank"]: n for n in (failures._read(p) for p in (tmp_path / "failures").glob("rank_*.json"))}
    assert notes[1]["code"] == 2 and notes[1]["reason"] == "train/u4.tfrecord: corrupt record"
    assert notes[0]["code"] == 4 and notes[0]["reason"] == "KeyError: 'x'"


@pytest.mark.parametrize("code", [2, 4])
def test_horovods_shutdown_becomes_the_noted_ranks_failure_with_its_exit_code(tmp_path, code):
    cause = BenchError("u4: corrupt") if code == 2 else ValueError("boom")
    with pytest.raises(type(cause)):
        fail_with(cause, tmp_path, 1)
    with pytest.raises(failures.PeerFailed, match=r"^rank 1: .*(u4: corrupt|ValueError: boom)") as raised:
        fail_with(SHUTDOWN, tmp_path, 0)
    assert raised.value.__cause__ is SHUTDOWN and raised.value.exit_code == code

    def peer_failed():
        raise raised.value
    assert guarded(peer_failed) == code


def test_a_shutdown_without_a_note_stays_what_it_was_and_old_notes_are_passed_over(tmp_path, monkeypatch):
    monkeypatch.setattr(failures, "PEER_WAIT_SECONDS", 0.3)
    with pytest.raises(BenchError):
        fail_with(BenchError("bad"), tmp_path, 1)
    old = failures.PROCESS_START - 60
    for note in (tmp_path / "failures").iterdir():
        os.utime(note, (old, old))  # an earlier attempt's
    with pytest.raises(RuntimeError, match="Horovod has been shut down"):
        fail_with(SHUTDOWN, tmp_path, 0)


def test_one_process_writes_no_note(tmp_path):
    with pytest.raises(BenchError):
        fail_with(BenchError("bad"), tmp_path, 0, size=1)
    assert not (tmp_path / "failures").exists()


def test_a_note_written_before_the_module_is_imported_is_this_processs(tmp_path):
    """A run imports failures.py only once a rank has failed; another rank's note written earlier in the run
    still counts (only notes older than the process are an earlier attempt's)."""
    code = ("import json, sys, time; from pathlib import Path; p = Path(sys.argv[1]) / 'failures' / 'rank_00001.json'; "
            "p.parent.mkdir(); p.write_text(json.dumps({'rank': 1, 'code': 2, 'reason': 'bad'})); time.sleep(0.2); "
            "from common.runtime import failures; print(failures.wait_for_note(Path(sys.argv[1]), 0)['reason'])")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "bad", proc.stderr
