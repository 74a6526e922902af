"""One Mesh-TF mesh over 4 real processes on localhost equals the Keras model.

Each process runs `python -m cosmoflow.mesh.check --rank R --addresses ...` and starts a TensorFlow
server; rank 0 builds the mesh on `/job:worker/task:<i>/cpu:0` and compares it with the Keras model
on the same weights and batch, then releases the others. Spatial [2, 1] (the batch split over the other 2
processes) and [2, 2] (halos across processes in depth and height), max pooling. What crosses processes is the
same for every case: halo planes, merged activations and batch shares; [1, 2] and average pooling differ only
inside a device, which tests/unit/test_mesh_model.py compares on virtual devices (its tolerances, too).
"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, checkout_first_on_path

pytestmark = pytest.mark.slow

RANKS = 4


def free_ports(count: int) -> list[int]:
    """Ports the OS has just handed out (held together, so they differ, then released for the servers)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def launch(rank: int, addresses: list[str], out: Path, logs: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "cosmoflow.mesh.check", "--rank", str(rank), "--addresses", *addresses,
            "--spatial", "2x1", "2x2", "--pooling", "max", "--input-shape", "24", "16", "16", "4",
            "--conv-filters", "4", "4", "8", "8", "--batch", "4", "--out", str(out)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "PYTHONPATH": checkout_first_on_path()}
    log = open(logs / f"rank{rank}.log", "w")
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def run_ranks(tmp_path: Path) -> tuple[list[int], Path]:
    """Start every rank, wait for all (rank 0 first); kill what is left on any failure or timeout."""
    addresses = [f"localhost:{p}" for p in free_ports(RANKS)]
    out = tmp_path / "diffs.json"
    procs = [launch(rank, addresses, out, tmp_path) for rank in range(RANKS)]
    try:
        first = procs[0].wait(timeout=180)
        # Rank 0 releases the others when it is done; if it failed, they are killed below.
        rest = [p.wait(timeout=60) for p in procs[1:]] if first == 0 else [p.poll() for p in procs[1:]]
        return [first, *rest], out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_mesh_over_four_processes_equals_keras(tmp_path):
    codes, out = run_ranks(tmp_path)
    logs = "\n".join(f"--- rank {r}\n" + (tmp_path / f"rank{r}.log").read_text()[-3000:] for r in range(RANKS))
    assert codes == [0] * RANKS, logs
    records = {(r["pooling"], tuple(r["spatial"])): r for r in json.loads(out.read_text())}
    assert set(records) == {("max", (2, 1)), ("max", (2, 2))}
    for (pooling, spatial), r in records.items():
        # Every process's device is in the mesh: [2, 1] splits the batch over the other two.
        assert r["devices"] == [f"/job:worker/task:{i}/cpu:0" for i in range(RANKS)]
        assert r["batch_splits"] == RANKS // (spatial[0] * spatial[1])
        assert r["outputs"]["rel"] <= 1e-5 and r["loss"]["rel"] <= 1e-5, (pooling, spatial, r)
        for name, grad in zip(r["weights"], r["gradients"]):
            assert grad["rel"] <= 1e-4, (pooling, spatial, name, grad)
        assert min(r["reference"]["gradient_norms"]) > 1e-4
