"""Elastic Horovod training with real processes: three workers on three local host names (one slot each).
A SIGSTOPped rank 0: its watchdog kills it after dist.elastic.hang_timeout_s; the other two roll back to the last
commit, go on at size 2 and reach the target (a validation MAE only a model that learned meets), the new rank 0
continuing the same MLPerf log, which summary.json and the log record the reset in and which passes the checker's
structural rules. Two workers, a host added to the discovery file in epoch 1: its worker joins at the next commit
(2, 3); then a SIGKILLed rank 0 re-admitted on its host after Horovod's blacklist cooldown (3, 2, 3), and a stop
signal to one worker: all three stop with exit 75 and a checkpoint, which a plain run resumes. DeepCAM: 2
workers, one killed, the run finishes alone (its unreachable target: tests/integration/test_deepcam_e2e.py says
why)."""
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time

from pathlib import Path

import psutil
import pytest

from common.runtime.checkpoint import check_checkpoint
from common.campaign.compliance import check_log
from common.base import mlperf_log
from common.base.procs import rank_process
from tests.conftest import BIN, REPO, checkout_first_on_path, log_events, run_cmd, show
from tests.integration.cosmo_fixtures import LEARNED_MAE, write_learning_config

# serial: Gloo's 5 s timeout and the hang timeout these tests time hold on an otherwise idle host (Makefile)
pytestmark = [pytest.mark.slow, pytest.mark.serial]
TRAIN = REPO / "cosmoflow/train.py"
# The learnable dataset's 120 training and 24 validation files: 3 and 2 ranks both divide them. Evaluations
# every 4 epochs: the first after the fault in epoch 3, and at the earliest epoch the small model meets its
# target (cosmo_fixtures.LEARNED_MAE: about 4 epochs); a run that has not met it yet goes on to epoch 8.
ELASTIC_CFG = {"data": {"shuffle_buffer": 8, "loader": "tfdata"},
               "train": {"max_epochs": 20, "local_batch_size": 4, "eval_every": 4, "target": LEARNED_MAE},
               "dist": {"elastic": {"enabled": True, "commit_every_steps": 2}}}


# Three names for this machine: Horovod blacklists the host of a failed worker.
LOCAL_HOSTS = ("localhost:1", "127.0.0.1:1", f"{os.uname().nodename}:1")


def _discovery_script(hosts):
    """A host discovery script that prints the lines of the file `hosts` (edited to add a host)."""
    script = hosts.parent / "discover.sh"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m common.runtime.elastic_procs hosts {hosts}\n")
    script.chmod(0o755)
    return script


def _launch(tmp_path, data, workers: int, hosts, launcher_args=(), gloo_timeout=5,
            **sections) -> tuple[subprocess.Popen, object]:
    """horovodrun in elastic mode (2 to 3 workers, `workers` at the start) on the tiny CosmoFlow run."""
    out = tmp_path / "run"
    cfg = write_learning_config(tmp_path / "c.yaml", data, out, **(ELASTIC_CFG | sections))
    return _launch_app(TRAIN, cfg, workers, hosts, launcher_args, gloo_timeout=gloo_timeout), out


# Gloo's timeout bounds both the wait before a dead peer is declared failed and the wait for a joining worker's
# start-up (TensorFlow import, model build: over 5 s on 2 loaded cores). The fault tests shorten it to 5 s; the
# tests where a worker joins keep a timeout its start-up fits in, or every worker aborts in hvd.init.
JOIN_GLOO_TIMEOUT = 30  # Horovod's default


def _launch_app(train, cfg, workers: int, hosts, launcher_args=(), sizes=(2, 3), gloo_timeout=5) -> subprocess.Popen:
    """horovodrun in elastic mode (`sizes` = (min, max) workers, `workers` at the start): application `train`,
    config `cfg`, Gloo timeout `gloo_timeout` s."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "PYTHONPATH": checkout_first_on_path(),
           "HOROVOD_GLOO_TIMEOUT_SECONDS": str(gloo_timeout), "PYTHONFAULTHANDLER": "1"}
    launcher = subprocess.Popen(
        [BIN / "horovodrun", "--network-interface", "lo", "-np", str(workers), "--min-np", str(sizes[0]), "--max-np", str(sizes[1]),
         "--host-discovery-script", _discovery_script(hosts), *launcher_args, sys.executable, train, cfg],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return launcher


def _finished(tmp_path, launcher, out, status: str = "success") -> dict:
    """summary.json of the run once horovodrun has exited (its output kept in horovodrun.log)."""
    output = _output(tmp_path, launcher)
    assert (out / "summary.json").is_file(), output[-8000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == status, output[-8000:]
    return summary


def _output(tmp_path, launcher) -> str:
    """horovodrun's output once it has exited, also kept in horovodrun.log; a launcher still running after 180 s
    is killed and fails the test with its output (kept in horovodrun.log too)."""
    try:
        output, _ = launcher.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        launcher.kill()
        output, _ = launcher.communicate()
        (tmp_path / "horovodrun.log").write_text(output)
        raise AssertionError(f"horovodrun still running after 180 s: killed\n{output[-8000:]}") from None
    finally:
        if launcher.poll() is None:
            launcher.kill()
    (tmp_path / "horovodrun.log").write_text(output)
    return output


def _wait_for(log, launcher, what: str, logged, timeout=120) -> None:
    """Wait until `logged(events)` holds for the events of the MLPerf log `log` (being written: read tolerantly)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and launcher.poll() is None:
        if log.is_file() and logged(mlperf_log.read_events(log)):
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not logged within {timeout} s (launcher exit {launcher.poll()})")


def _wait_for_epoch(log, epoch, launcher, timeout=120):
    _wait_for(log, launcher, f"the start of epoch {epoch}",
              lambda events: any(e["key"] == "epoch_start" and e["metadata"]["epoch_num"] >= epoch for e in events),
              timeout)


def _resets(events) -> list[dict]:
    return [e for e in events if e["key"] == "elastic_reset"]


def _evaluated_after_a_rejoin(events) -> bool:
    """Whether the events hold an evaluation after a reset to 3 ranks that follows a reset to 2."""
    sizes = [(i, e["value"]["size"]) for i, e in enumerate(events) if e["key"] == "elastic_reset"]
    down = next((n for n, (_, size) in enumerate(sizes) if size == 2), None)
    back = next((i for i, size in sizes[down + 1:] if size == 3), None) if down is not None else None
    return back is not None and any(e["key"] == "eval_error" for e in events[back:])


def _signal_in_epoch(launcher, out, rank: int, sig, epoch: int = 3, delay: float = 0.0) -> float:
    """Send `sig` to the worker that started as `rank` once `epoch` has begun (`delay` s later); returns
    time.monotonic() of the sending. Kills the launcher when anything fails."""
    try:
        victim = rank_process(launcher.pid, rank)
        _wait_for_epoch(out / "mlperf.log", epoch, launcher)
        time.sleep(delay)
        victim.send_signal(sig)
        return time.monotonic()
    except BaseException:
        launcher.kill()
        raise


# Shorter than the default (60 s) to keep the test short; above the Gloo timeout (5 s), which the others wait out
# before they reach the rendezvous where they wait for the stopped worker to go.
HANG_TIMEOUT = 7
WATCHDOG_KILL = re.compile(r"elastic watchdog: the worker on host (\S+) \(pid (\d+), rank (\d+)\) sent no heartbeat "
                           r"for ([\d.]+) s \(dist.elastic.hang_timeout_s=(\S+)\): .* killed it with SIGKILL at (\S+),")


def test_a_stopped_worker_is_killed_after_the_hang_timeout_and_the_run_finishes_at_size_two(tmp_path, cosmo_learnable):
    """The stopped worker is rank 0: the new rank 0 continues the MLPerf log and writes the summary."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("\n".join(LOCAL_HOSTS) + "\n")
    elastic_cfg = {**ELASTIC_CFG["dist"]["elastic"], "hang_timeout_s": HANG_TIMEOUT}
    launcher, out = _launch(tmp_path, cosmo_learnable, 3, hosts, dist={"elastic": elastic_cfg})
    victim = rank_process(launcher.pid, 0)
    victim_host = victim.environ()["HOROVOD_HOSTNAME"]
    try:
        _signal_in_epoch(launcher, out, 0, signal.SIGSTOP, delay=0.15)  # a few of its 10 steps
        stopped = time.time()
        summary = _finished(tmp_path, launcher, out)  # horovodrun killed after 180 s: the test cannot hang
    finally:
        try:
            victim.kill()  # SIGKILL ends a stopped process too, when its watchdog has not
        except psutil.NoSuchProcess:
            pass
    output = (tmp_path / "horovodrun.log").read_text()
    kills = WATCHDOG_KILL.findall(output)
    assert len(kills) == 1, output[-8000:]
    host, pid, rank, silent, timeout, at = kills[0]
    assert (host, int(pid), rank, float(timeout)) == (victim_host, victim.pid, "0", HANG_TIMEOUT), kills
    # Killed a full timeout after its last heartbeat, which came before the stop (they are 1 s apart): within the
    # stated timeout of the stop, give or take 3 s for a watchdog woken late on 2 loaded cores.
    detected = datetime.datetime.fromisoformat(at).timestamp() - stopped
    assert float(silent) >= HANG_TIMEOUT and 0 < detected <= HANG_TIMEOUT + 3, (detected, kills)
    elastic = summary["elastic"]
    assert elastic["resets"] == 1 and elastic["sizes"] == [3, 2] and summary["ranks"] == 2, elastic
    assert elastic["hang_timeout_s"] == HANG_TIMEOUT and 0 < elastic["seconds_lost"][0] < 60
    events = log_events(out / "mlperf.log")
    resets = [e for e in events if e["key"] == "elastic_reset"]
    assert len(resets) == 1 and resets[0]["value"]["size"] == 2 and resets[0]["value"]["epoch"] >= 3
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "success"
    assert [e["key"] for e in events].count("run_start") == 1  # one log, continued by the new rank 0
    assert check_log(out / "mlperf.log").only_target_failed
    print(f"rank 0 stopped; killed by its watchdog {detected:.2f} s later (no heartbeat for {silent} s, "
          f"hang_timeout_s={HANG_TIMEOUT}); first step at size 2 {resets[0]['time_ms'] / 1000 - stopped:.2f} s "
          f"after the stop; rolled back to epoch {resets[0]['value']['epoch']} step {resets[0]['value']['step']}")


def test_a_host_added_to_discovery_joins_a_killed_worker_comes_back_after_the_cooldown_and_a_stop_signal_stops_all(
        tmp_path, cosmo_learnable):
    """Two workers; a third host added to discovery in epoch 1 joins (size 3). The worker that started as rank 0 is
    then SIGKILLed: the other two go on at size 2 in the same log; its host, blacklisted for 1 to 2 s, gets a worker
    again (size 3), and the run evaluates at size 3. A stop signal to one worker then stops all three with exit 75
    and a checkpoint of 3 ranks, from which a plain run of one process goes on to the target."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("\n".join(LOCAL_HOSTS[:2]) + "\n")
    # An evaluation every 2 epochs against a target out of reach: the run cannot end before the worker has come
    # back and the stop signal (the plain run that resumes it has the small model's target).
    launcher, out = _launch(tmp_path, cosmo_learnable, 2, hosts, ["--blacklist-cooldown-range", "1", "2"],
                            gloo_timeout=JOIN_GLOO_TIMEOUT,
                            train={**ELASTIC_CFG["train"], "max_epochs": 48, "eval_every": 2, "target": 1e-6})
    log = out / "mlperf.log"
    try:
        # The others notice the host change within seconds, at a commit, and wait there for the new worker's
        # start-up (TensorFlow import, model build).
        _wait_for_epoch(log, 1, launcher)
        hosts.write_text("\n".join(LOCAL_HOSTS) + "\n")
        _wait_for(log, launcher, "the reset to size 3", lambda events: bool(_resets(events)))
        joined_epoch = _resets(mlperf_log.read_events(log))[0]["value"]["epoch"]
    except BaseException:
        launcher.kill()
        raise
    _signal_in_epoch(launcher, out, 0, signal.SIGKILL, epoch=joined_epoch + 1, delay=0.15)  # a few of its steps
    killed = time.time()
    try:
        _wait_for(log, launcher, "an evaluation after the second reset to size 3", _evaluated_after_a_rejoin)
        rank_process(launcher.pid, 1).send_signal(signal.SIGUSR1)  # the worker that started as rank 1
        sent = time.monotonic()
    except BaseException:
        launcher.kill()
        raise
    output = _output(tmp_path, launcher)
    took = time.monotonic() - sent
    # Every worker stops with the stop code; Horovod's elastic launcher then exits 1, naming the code.
    assert output.count("exit with status code 75") == 3 and launcher.returncode == 1, output[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped"] and summary["status"] == "aborted" and summary["ranks"] == 3, summary
    elastic = summary["elastic"]
    # Up to 3 when the host joins, down to 2 after the kill, back to 3 when the host's blacklisting has expired
    # and its worker has joined.
    assert elastic["resets"] == 3 and elastic["sizes"] == [2, 3, 2, 3], elastic
    events = log_events(log)
    resets = [e for e in events if e["key"] == "elastic_reset"]
    assert [r["value"]["size"] for r in resets] == [3, 2, 3] and resets[1]["value"]["epoch"] > joined_epoch
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "aborted"
    assert [e["key"] for e in events].count("run_start") == 1  # one log, continued by whoever is rank 0
    assert check_log(log).only_target_failed
    ckpt = check_checkpoint(Path(summary["checkpoint"]))
    assert ckpt["ranks"] == 3 and ckpt["progress"]["epoch"] > joined_epoch
    # Elastic runs cannot resume (docs/faults.md); a plain run at another size (one process) goes on from the
    # checkpoint to the small model's target.
    resumed = run_cmd([sys.executable, TRAIN, tmp_path / "c.yaml", "dist.elastic.enabled=false",
                       "checkpoint.resume=true", f"train.target={LEARNED_MAE}"])
    assert resumed.returncode == 0 and "resuming from" in resumed.stdout, show(resumed)
    final = json.loads((out / "summary.json").read_text())
    assert final["status"] == "success" and final["attempt"] == 2 and final["ranks"] == 1
    print(f"a worker joined: {elastic['seconds_lost'][0]:.2f} s from the host change's notice to the first step "
          f"at size 3 (its start-up included); rank 0 killed; sizes {elastic['sizes']}, seconds lost "
          f"{elastic['seconds_lost']}, re-admitted {resets[2]['time_ms'] / 1000 - killed:.1f} s after the kill; "
          f"stop signal to the last worker's exit: {took:.1f} s; checkpoint at epoch {ckpt['progress']['epoch']} "
          f"step {ckpt['progress']['step']}")


def test_deepcam_killing_a_worker_rolls_back_and_finishes_alone(tmp_path, tmp_path_factory):
    """DeepCAM's state (batch norm, LAMB moments, its input) through a reset, 2 -> 1 workers: three workers on
    2 cores spent 110 s of 270 s tracing DeepCAM again after the reset; the 3 -> 2 mechanics are CosmoFlow's
    tests above. Killed in epoch 2, after an epoch's commit; the run's 4 epochs end with the evaluation."""
    from tests.integration.test_deepcam_e2e import TINY, make_dataset as deepcam_dataset, write_config as deepcam_config
    # 8 training and 4 validation samples: 2 steps per epoch at 2 ranks of batch 2 (a commit at each epoch's
    # end), 4 at 1.
    data = deepcam_dataset(tmp_path_factory.mktemp("deepcam"), 32, 48, train=8, validation=4)
    out = tmp_path / "run"
    cfg = deepcam_config(tmp_path / "c.yaml", "deepcam_mini.yaml", data, out, TINY | {
        "train": {**TINY["train"], "max_epochs": 4, "eval_every": 4, "target": 1.0},
        "data": {**TINY["data"], "loader": "tfdata"}, "dist": {"elastic": {"enabled": True, "commit_every_steps": 2}}})
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("\n".join(LOCAL_HOSTS[:2]) + "\n")
    launcher = _launch_app(REPO / "deepcam/train.py", cfg, 2, hosts, sizes=(1, 2))
    _signal_in_epoch(launcher, out, 1, signal.SIGKILL, epoch=2)
    summary = _finished(tmp_path, launcher, out, status="aborted")  # all 4 epochs run, the target not reached
    elastic = summary["elastic"]
    assert elastic["resets"] == 1 and elastic["sizes"] == [2, 1] and summary["ranks"] == 1, elastic
    assert summary["benchmark"] == "deepcam" and summary["epochs"] == 4 and 0.0 < summary["final_metric"] < 1.0
    resets = [e for e in log_events(out / "mlperf.log") if e["key"] == "elastic_reset"]
    assert len(resets) == 1 and resets[0]["value"]["size"] == 1 and resets[0]["value"]["epoch"] >= 2
    assert check_log(out / "mlperf.log").only_target_failed
    print(f"DeepCAM: rank 1 killed; {elastic['seconds_lost'][0]:.2f} s from the failure's detection to the first "
          f"step at size 1")
