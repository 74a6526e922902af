"""The suite's own shell scripts pass shellcheck (Debian's package, installed by scripts/setup.sh), and
make hpo-study checks its batch list (BATCHES) before it does anything."""
import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO


def test_the_shell_scripts_pass_shellcheck():
    assert shutil.which("shellcheck"), "shellcheck is missing: scripts/setup.sh installs Debian's package"
    scripts = sorted(str(p) for p in (REPO / "scripts").glob("*.sh")) + [str(REPO / ".ci/run")]
    proc = subprocess.run(["shellcheck", "--shell=bash", *scripts], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("batches, expected", [
    ("b8:2", "BATCHES word 'b8:2' is not name:ranks:local batch"),
    ("b8:2:4 x16:2:8", "BATCHES word 'x16:2:8'"),
    ("b8:0:4", "BATCHES word 'b8:0:4'"),
    ("", "BATCHES is empty"),
])
def test_the_hpo_study_refuses_a_bad_batch_list_before_making_data(tmp_path, batches, expected):
    env = {**os.environ, "BATCHES": batches, "DATA_ROOT": str(tmp_path / "data"),
           "STUDY_DIR": str(tmp_path / "study"), "REPORT_DIR": str(tmp_path / "report")}
    proc = subprocess.run([str(REPO / "scripts/hpo_study.sh")], capture_output=True, text=True, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr
    assert not any(tmp_path.iterdir()), "nothing is written before the list is checked"
