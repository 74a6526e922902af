"""benchmarks/harness.py's pinned environments (the reference's and DLIO's): built once per set of pins, a failed
step reported with its command."""
import hashlib
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import harness  # noqa: E402  (a script beside the benchmarks, not a package)


def test_pins_leave_out_comments_and_blank_lines(tmp_path):
    (tmp_path / "r.txt").write_text("# header\n\nabc==1.0  # why\n  def==2.0\n")
    assert harness.read_pins(tmp_path / "r.txt") == ["abc==1.0", "def==2.0"]


def test_an_environment_stamped_with_the_same_pins_is_not_built_again(tmp_path):
    venv, pins = tmp_path / "env", ["abc==1.0"]
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").write_text("")
    (venv / ".pins-sha256").write_text(hashlib.sha256("\n".join(pins).encode()).hexdigest())
    assert harness.pinned_venv(venv, pins, "test", finish=lambda _: pytest.fail("built again")) == venv / "bin/python"


def test_a_failed_install_names_the_environment_and_the_command_and_leaves_no_stamp(tmp_path):
    venv = tmp_path / "env"
    with pytest.raises(harness.VenvError, match=r"building .*env failed \(exit \d+, .* pip install .*/no/such.whl"):
        harness.pinned_venv(venv, [str(tmp_path / "no/such.whl")], "test", pip_options=("--no-index",))
    assert not (venv / ".pins-sha256").exists()
