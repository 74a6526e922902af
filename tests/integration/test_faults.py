"""Faults with real processes: a stop signal sent to one rank under horovodrun stops both after the same step,
with a checkpoint, run_stop aborted and exit code 75, and the resumed run (attempt 2, the first attempt's files
kept) gives the uninterrupted 2-rank run's weights and history; its log passes the checker's structural rules.
With DALI and on the hybrid mesh path, a run resumed from the checkpoint after epoch 1 of its own uninterrupted
run (copied into a directory of its own: the state a run stopped there leaves) gives that run's weights and
history. Resuming at an epoch's end and inside one on one process: tests/unit/test_checkpoint.py."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from common.campaign.compliance import check_log
from common.base.procs import rank_process
from tests.conftest import BIN, REPO, checkout_first_on_path, horovodrun, log_events, show
from tests.integration.cosmo_fixtures import write_config

# serial: a stop must reach every rank within the time these tests allow, on an otherwise idle host (Makefile)
pytestmark = [pytest.mark.slow, pytest.mark.serial]
TRAIN = REPO / "cosmoflow/train.py"
EPOCHS = 3
# Dropout and batch norm make each rank's RNG and running statistics part of the state; tf.data (not DALI)
# so that the input position is saved too. A checkpoint after every epoch: the final checkpoints of two runs
# compare, and the DALI and mesh tests resume from the one after epoch 1.
FAULT_CFG = {"model": {"input_shape": [16, 16, 16, 4], "conv_filters": [4, 8, 16, 16], "dense_units": [16, 8],
                       "dropout": 0.2},
             "data": {"shuffle_buffer": 8, "loader": "tfdata"},
             "train": {"max_epochs": EPOCHS, "local_batch_size": 4, "target": 1e-6},
             "checkpoint": {"every_epochs": 1, "keep": 10}}


@pytest.fixture(scope="module")
def straight(cosmo_dataset, tmp_path_factory):
    """The uninterrupted 2-rank run's output directory."""
    out = tmp_path_factory.mktemp("straight2") / "run"
    cfg = write_config(out.parent / "c.yaml", cosmo_dataset, out, **FAULT_CFG)
    proc = horovodrun(2, [TRAIN, cfg])
    assert proc.returncode == 1, show(proc)  # the target is out of reach: all EPOCHS epochs run
    assert json.loads((out / "summary.json").read_text())["epochs"] == EPOCHS
    return out


def _checkpoints(out):
    return sorted((out / "checkpoints").glob("ckpt-*"))


def _final_checkpoint(out):
    return _checkpoints(out)[-1]


def _copy_first_checkpoint(source, out):
    """A run directory `out` holding only the first checkpoint of the run in `source` (after its epoch 1)."""
    first = _checkpoints(source)[0]
    shutil.copytree(first, out / "checkpoints" / first.name)
    return first


def _assert_same_run(a, b):
    """Same final weights (rank 0's model and optimizer, every rank's own variables) and the same history."""
    ckpt_a, ckpt_b = _final_checkpoint(a), _final_checkpoint(b)
    assert ckpt_a.name == ckpt_b.name
    for name in sorted(p.name for p in ckpt_a.glob("*.npz")):
        with np.load(ckpt_a / name) as x, np.load(ckpt_b / name) as y:
            for key in x:
                np.testing.assert_allclose(x[key], y[key], rtol=1e-5, atol=1e-6, err_msg=f"{name} {key}")
    keys = ("epoch", "loss", "mae", "val_loss")
    history = [[tuple(h[k] for k in keys) for h in json.loads((out / "summary.json").read_text())["history"]]
               for out in (a, b)]
    np.testing.assert_allclose(np.array(history[0]), np.array(history[1]), rtol=1e-5)


def test_a_resumed_dali_run_replays_its_input_and_gives_the_straight_run(cosmo_dataset, tmp_path):
    """data.loader=dali (on the CPU): the resumed run rebuilds each rank's DALI stream with the checkpoint's seed
    and skips the batches consumed, so epoch 2 reads what the uninterrupted run's did."""
    sections = {**FAULT_CFG, "data": {**FAULT_CFG["data"], "loader": "dali"},
                "train": {**FAULT_CFG["train"], "max_epochs": 2}}
    outs = {name: tmp_path / name for name in ("straight", "resumed")}
    for name, out in outs.items():
        write_config(tmp_path / f"{name}.yaml", cosmo_dataset, out, **sections)
    proc = horovodrun(2, [TRAIN, tmp_path / "straight.yaml"])
    assert proc.returncode == 1, show(proc)  # the target is out of reach
    _copy_first_checkpoint(outs["straight"], outs["resumed"])
    resumed = horovodrun(2, [TRAIN, tmp_path / "resumed.yaml", "checkpoint.resume=true"])
    assert "the DALI training input was replayed: 8 batches skipped per rank" in resumed.stdout, show(resumed)
    _assert_same_run(outs["straight"], outs["resumed"])
    meta = json.loads((_final_checkpoint(outs["resumed"]) / "meta.json").read_text())
    assert meta["input"]["loader"] == "dali" and meta["input"]["layout"]["ranks"] == 2, meta["input"]


def _rank_process(launcher: subprocess.Popen, rank: int) -> psutil.Process:
    return rank_process(launcher.pid, rank)


def test_a_signal_to_one_rank_stops_both_with_a_checkpoint_and_the_resumed_run_finishes_the_same(
        cosmo_dataset, straight, tmp_path):
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", cosmo_dataset, out, **FAULT_CFG)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "PYTHONPATH": checkout_first_on_path()}
    launcher = subprocess.Popen([BIN / "horovodrun", "-np", "2", "-H", "localhost:2", sys.executable, TRAIN, cfg],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in launcher.stdout:  # wait for the first epoch's line, then signal rank 1 only
        lines.append(line)
        if "epoch   1/" in line:
            break
    victim = _rank_process(launcher, 1)
    sent = time.monotonic()
    victim.send_signal(signal.SIGUSR1)
    rest, _ = launcher.communicate(timeout=120)
    took = time.monotonic() - sent
    output = "".join(lines) + rest
    assert "stopped by " in output and "checkpoint " in output, output
    # mpirun passes the first failing rank's exit code on; Gloo's launcher names it.
    assert launcher.returncode == 75 or "exit with status code 75" in output, (launcher.returncode, output)
    assert took < 30, f"stopping took {took:.1f} s"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped"] and summary["status"] == "aborted" and summary["epochs"] < EPOCHS
    assert "stopped by another rank's stop signal" in summary["reason"]  # rank 0 was not signalled itself
    events = log_events(out / "mlperf.log")
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "aborted"
    meta = json.loads((_final_checkpoint(out) / "meta.json").read_text())
    assert meta["ranks"] == 2 and meta["input_state"] and "input_rank_00001.index" in meta["files"]
    resumed = horovodrun(2, [TRAIN, cfg, "checkpoint.resume=true"])
    assert f"resuming from {out}/checkpoints/ckpt-" in resumed.stdout, show(resumed)
    _assert_same_run(straight, out)
    # The resumed attempt's record: the first attempt's files kept, both attempts' time, the epochs it ran.
    epoch = meta["progress"]["epoch"]  # the epoch the stop interrupted (a step inside it)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["attempt"] == 2 and summary["resumed_from"]["epoch"] == epoch and summary["epochs"] == EPOCHS
    assert summary["time_to_train_all_attempts_seconds"] > summary["time_to_train_seconds"]
    assert (out / "attempts" / "1" / "mlperf.log").is_file() and (out / "attempts" / "1" / "summary.json").is_file()
    events = log_events(out / "mlperf.log")
    resume = [e for e in events if e["key"] == "resumed_from_checkpoint"]
    assert len(resume) == 1 and resume[0]["value"]["epoch"] == epoch and resume[0]["value"]["attempt"] == 2
    assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "epoch_start"] == list(range(epoch, EPOCHS + 1))
    assert check_log(out / "mlperf.log").only_target_failed
    print(f"stop signal to exit: {took:.1f} s; stopped at epoch {meta['progress']['epoch']} step "
          f"{meta['progress']['step']}")


def test_the_hybrid_mesh_path_resumed_from_a_checkpoint_gives_its_straight_run(cosmo_dataset, tmp_path):
    """parallel.spatial=[1,2] (one group of 2 ranks): the checkpoint holds the Keras state every rank keeps and
    the mesh reloads it. The input restarts on resume (the hybrid path saves no input position), so the input is
    read in file order: every epoch then reads the same batches, and the runs must agree."""
    sections = {**FAULT_CFG, "model": {**FAULT_CFG["model"], "dropout": 0.0},
                "data": {**FAULT_CFG["data"], "shuffle": False}, "train": {**FAULT_CFG["train"], "max_epochs": 2}}
    outs = {name: tmp_path / name for name in ("straight", "resumed")}
    for name, out in outs.items():
        write_config(tmp_path / f"{name}.yaml", cosmo_dataset, out, **sections)
    proc = horovodrun(2, [TRAIN, tmp_path / "straight.yaml", "parallel.spatial=[1,2]"], timeout=600)
    assert proc.returncode == 1, show(proc)  # the target is out of reach
    _copy_first_checkpoint(outs["straight"], outs["resumed"])
    resumed = horovodrun(2, [TRAIN, tmp_path / "resumed.yaml", "parallel.spatial=[1,2]", "checkpoint.resume=true"],
                         timeout=600)
    assert "resuming from" in resumed.stdout and "the training input starts afresh" in resumed.stdout, show(resumed)
    _assert_same_run(outs["straight"], outs["resumed"])
    summary = json.loads((outs["resumed"] / "summary.json").read_text())
    assert summary["attempt"] == 2 and summary["epochs"] == 2 and summary["parallel"]["weights_identical"]
    assert check_log(outs["resumed"] / "mlperf.log").only_target_failed
