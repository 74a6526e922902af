"""The hyperparameter search end to end with real trainings (horovodrun -np 2, the campaigns' default launcher):
a trial of a small CosmoFlow model that learns, then a worker killed (SIGTERM) during a second trial, whose
learning rate is too small; the next start runs its settings again, and the median pruner stops them; then the
report with the best settings as a config."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from common.campaign.compliance import check_log
from tests.conftest import REPO, checkout_first_on_path, run_cmd, show
from tests.integration.cosmo_fixtures import LEARNED_MAE, write_learning_config

pytestmark = pytest.mark.slow
GOOD = {"optimizer.base_lr": 0.02, "schedule.warmup_epochs": 1}
SLOW = {"optimizer.base_lr": 0.0002, "schedule.warmup_epochs": 1}  # learns nothing in 8 epochs


def write_space(tmp_path, dataset):
    """The small CosmoFlow space: GOOD, then SLOW enqueued; the median pruner compares a trial with the first
    complete one from epoch 2 on."""
    config = write_learning_config(tmp_path / "small.yaml", dataset, tmp_path / "unused")
    space = {"benchmark": "cosmoflow", "config": str(config), "overrides": [f"train.target={LEARNED_MAE}"],
             "sampler": {"name": "tpe", "seed": 3, "startup_trials": 4},
             "pruner": {"name": "median", "startup_trials": 1, "warmup_epochs": 2},
             "params": {"optimizer.base_lr": {"type": "float", "low": 0.0002, "high": 0.03, "log": True},
                        "schedule.warmup_epochs": {"type": "int", "low": 0, "high": 2}},
             "enqueue": [GOOD, SLOW]}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def hpo(args, timeout=900):
    return run_cmd([sys.executable, "-m", "common.hpo", *args], timeout=timeout)


def trials(out):
    return {int(p.parent.name[4:]): json.loads(p.read_text()) for p in (out / "runs").glob("run_*/trial.json")}


def test_a_search_prunes_a_bad_trial_survives_a_killed_worker_and_reports_the_best(tmp_path, cosmo_learnable):
    space, out = write_space(tmp_path, cosmo_learnable), tmp_path / "study"
    # a worker killed as a scheduler kills a job, during its second trial: the trial fails, its settings queued again
    env = {**os.environ, "PYTHONPATH": checkout_first_on_path(), "TF_CPP_MIN_LOG_LEVEL": "2"}
    worker = subprocess.Popen([sys.executable, "-m", "common.hpo", "run", str(space), "--out", str(out),
                               "--trials", "2"], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = out / "runs" / "run_001" / "mlperf.log"
    deadline = time.time() + 300
    while not (log.is_file() and '"epoch_start"' in log.read_text()):
        assert time.time() < deadline and worker.poll() is None, worker.stdout.read() if worker.poll() else "slow"
        time.sleep(0.5)
    worker.send_signal(signal.SIGTERM)
    said, _ = worker.communicate(timeout=120)
    assert worker.returncode == 143, said
    done = trials(out)
    assert list(done) == [0] and done[0]["state"] == "complete", said  # trial 1: no record, it did not run its course
    assert done[0]["status"] == "success" and done[0]["epochs"] <= 8 and done[0]["value"] == done[0]["epochs"]
    assert "trial 0 (1/2): target reached" in said and "trial 1: optimizer.base_lr=0.0002" in said, said
    # trial 0 reached the test's target, not the rules': the checker fails that check and no other
    assert check_log(out / "runs" / "run_000" / "mlperf.log").only_target_failed

    # the next start runs the killed trial's settings again, and the pruner stops them
    again = hpo(["run", space, "--out", out, "--trials", 2])
    assert again.returncode == 0, show(again)
    done = trials(out)
    assert done[2]["params"] == SLOW and done[2]["state"] == "pruned", show(again)
    assert "trial 2: pruned at epoch" in again.stdout and "2 of 2 trials finished" in again.stdout, show(again)
    rows = (out / "trials.csv").read_text().splitlines()
    assert rows[2].split(",")[1] == "fail" and len(rows) == 4  # header, trials 0-2 (1 failed)
    best = yaml.safe_load((out / "best" / "cosmoflow_b8.yaml").read_text())
    assert best["optimizer"]["base_lr"] == GOOD["optimizer.base_lr"]
    assert "## Best settings per global batch size" in (out / "report.md").read_text()
    # the trials are runs the analysis report reads
    report = run_cmd([sys.executable, "-m", "common.campaign.analysis", "runs", out])
    assert report.returncode == 0 and report.stdout.count("cosmoflow") >= 2, show(report)
