"""Shared test helpers: running real horovodrun jobs and the project's command lines."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def checkout_first_on_path() -> str:
    """PYTHONPATH with this checkout first: subprocesses import its code, not that of another checkout the
    environment's editable install points at (a git worktree, say)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def run_cmd(args, timeout=600, env=None, cwd=REPO) -> subprocess.CompletedProcess:
    """Run a command, capturing output; the environment is ours plus `env`, with this checkout's code first."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": checkout_first_on_path(), **(env or {})}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def horovodrun(np_: int, args, timeout=900, env=None) -> subprocess.CompletedProcess:
    """`horovodrun -np N -H localhost:N python ARGS` (MPI controller: horovodrun prefers it when built in)."""
    return run_cmd([BIN / "horovodrun", "-np", np_, "-H", f"localhost:{np_}", sys.executable, *args],
                   timeout=timeout, env=env)


def show(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"


@pytest.fixture
def repo() -> Path:
    return REPO
