"""Shared test helpers: real horovodrun jobs and the project's command lines, MLPerf logs read by the suite's reader,
DALI required (or skipped only where allowed), and private copies of the datasets session fixtures build once."""
from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common.base import mlperf_log

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# The tests' MPI jobs run on one host and use no fabric. horovodrun's `-mca btl ^openib` replaces the exclusion
# list of Debian's openmpi-mca-params.conf (`^uct,openib,ofi`), so Open MPI's ofi BTL loads, and libfabric's tcp
# provider then holds every rank for 1.0 s in MPI_Finalize (measured: hvd.shutdown() 1.01 s with it, 0.05 s with
# no provider). No provider: that second goes from each horovodrun job (a setting of the caller's wins).
os.environ.setdefault("FI_PROVIDER", "none")


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


def summary_fields(**fields) -> dict:
    """A complete summary.json (every key common/campaign/summary.py's strict reader requires) with `fields`
    over defaults, for tests that write one as a run would."""
    return {"benchmark": "cosmoflow", "status": "success", "reason": "test", "time_to_train_seconds": 1.0,
            "epochs": 1, "metric_name": "mae", "final_metric": 0.1, "target": 0.124, "ranks": 1, "nodes": 1,
            "threads_per_rank": 1, "gpu": False, "horovod": None, "train_samples": 8, "eval_samples": 4,
            "loader": "tfdata", "history": [], "config": {}} | fields


def log_events(log: Path) -> list[dict]:
    """The events of a log the suite wrote, read by the suite's reader; every line must be an event."""
    lines = log.read_text().splitlines()
    events = mlperf_log.parse_lines(lines, str(log), strict=True)
    assert len(events) == len(lines), f"{log}: {len(lines) - len(events)} of its {len(lines)} lines are no events"
    return events


ALLOW_NO_DALI = "ALLOW_NO_DALI"  # =1: a host without nvidia.dali skips the DALI tests instead of failing them


def require_dali(module: str = "nvidia.dali.plugin.tf"):
    """Import `module` of DALI for a test module. Without the nvidia.dali package at all: skip where
    ALLOW_NO_DALI=1, else fail saying so; with it, a failing import (a broken TensorFlow plugin build) fails."""
    if importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.dali") is None:
        if os.environ.get(ALLOW_NO_DALI) == "1":
            pytest.skip(f"nvidia.dali is not installed ({ALLOW_NO_DALI}=1)", allow_module_level=True)
        pytest.fail(f"nvidia.dali is not installed (make setup installs it); {ALLOW_NO_DALI}=1 skips the DALI "
                    f"tests on a host without it", pytrace=False)
    return importlib.import_module(module)  # an ImportError here is a broken install: the test fails


def copy_of(source: Path, tmp_path_factory, name: str = "data") -> Path:
    """A private copy of the directory `source` (a dataset a session fixture built once) that a test may
    damage: a new temporary directory each call, so each example of a fuzz test gets its own."""
    return Path(shutil.copytree(source, tmp_path_factory.mktemp("copy") / name))


@pytest.fixture
def writable_copy(tmp_path_factory):
    """`writable_copy(source)`: the test's own copy of a shared dataset, to write into (see `copy_of`)."""
    return lambda source, name="data": copy_of(source, tmp_path_factory, name)


@pytest.fixture
def repo() -> Path:
    return REPO
