"""The suite's own shell scripts pass shellcheck (Debian's package, installed by scripts/setup.sh)."""
import shutil
import subprocess

from tests.conftest import REPO


def test_the_shell_scripts_pass_shellcheck():
    assert shutil.which("shellcheck"), "shellcheck is missing: scripts/setup.sh installs Debian's package"
    scripts = sorted(str(p) for p in (REPO / "scripts").glob("*.sh")) + [str(REPO / ".ci/run")]
    proc = subprocess.run(["shellcheck", "--shell=bash", *scripts], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
