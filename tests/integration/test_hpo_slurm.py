"""A hyperparameter search run by two Slurm jobs (docs/hpo.md, "As scheduler jobs"): the shipped localhost-slurm
site rendered with `--hpo` on the small CosmoFlow space of tests/integration/test_hpo.py, the script submitted
twice, so two workers share one study (of one finished trial) through its journal. The first job is cancelled
(`scancel`) while it trains its trial: its worker gets the TERM, marks that trial failed and queues its settings
again; the second worker runs them and writes the report (a worker going on to further trials:
tests/integration/test_hpo.py). On this two-core host the jobs (two tasks each) run one after the other. Needs
root, to run the daemons (the session's cluster: tests/integration/conftest.py).
"""
import csv
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, checkout_first_on_path, run_cmd, show
from tests.integration.test_hpo import write_space
from tests.integration.test_slurm import _ended, _job_state, _submit, _training, _wait_for

# serial: one local Slurm node of this host's cores, whose jobs these tests time (Makefile)
pytestmark = [pytest.mark.slow, pytest.mark.serial]
TRIALS = 1
STARTED = re.compile(r"^trial (\d+): \w+\.\w+=", re.M)  # a worker's line as it starts a trial


def _render(tmp_path: Path, dataset: Path) -> Path:
    """The shipped site's worker script for test_hpo's space, with one enqueued trial (fewer dry runs)."""
    space = write_space(tmp_path, dataset)
    raw = yaml.safe_load(space.read_text())
    raw["enqueue"] = raw["enqueue"][:1]  # a setting that reaches the target: the report has a best config
    space.write_text(yaml.safe_dump(raw, sort_keys=False))
    script = tmp_path / "hpo.sh"
    proc = run_cmd([sys.executable, "-m", "jobs", "render", "--site", "localhost-slurm", "--bench", "cosmoflow",
                    "--nodes", 1, "--hpo", space, "--trials", TRIALS, "--time", "00:10:00", "--out", script])
    assert proc.returncode == 0, show(proc)
    return script


def test_two_jobs_share_a_study_and_a_cancelled_jobs_trial_runs_again_in_the_other(slurm, cosmo_learnable, tmp_path):
    script = _render(tmp_path, cosmo_learnable)
    out_root, stage = tmp_path / "runs", tmp_path / "stage"
    env = {**slurm, "SUITE_DIR": str(REPO), "DATA_DIR": str(cosmo_learnable), "OUTPUT_ROOT": str(out_root),
           "STAGE_DIR": str(stage), "PYTHON": sys.executable, "DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": checkout_first_on_path()}
    t0 = time.time()
    jobs = [_submit(script, env, tmp_path) for _ in range(2)]
    study = out_root / "hpo-space-localhost-slurm-n1"
    logs = {j: tmp_path / f"hpo-cosmoflow-localhost-slurm-n1-{j}.out" for j in jobs}
    read = lambda j: logs[j].read_text(errors="replace") if logs[j].is_file() else ""  # noqa: E731
    outputs = lambda: "\n".join(f"--- job {j} {_job_state(slurm, j)}\n{read(j)[-3000:]}" for j in jobs)  # noqa: E731

    def trial_training() -> bool:
        started = STARTED.findall(read(jobs[0]))
        return len(started) >= 1 and _training(study / "runs" / f"run_{int(started[0]):03d}")

    _wait_for("job 1 training its trial", trial_training, 420, outputs)
    cancelled = int(STARTED.findall(read(jobs[0]))[0])
    cancel = subprocess.run(["scancel", jobs[0]], env=slurm, capture_output=True, text=True)
    assert cancel.returncode == 0, cancel.stderr
    _wait_for("both jobs ending", lambda: all(_ended(slurm, j) for j in jobs), 600, outputs)
    print(f"two workers took {time.time() - t0:.0f} s")
    report = outputs()
    assert _job_state(slurm, jobs[0])[0] == "CANCELLED", report
    assert "TERM: passed on to the search worker" in read(jobs[0]), report
    assert _job_state(slurm, jobs[1]) == ("COMPLETED", "0:0") and "search worker exit 0" in read(jobs[1]), report

    # every trial was trained by one worker only, and each worker trained one
    started = [[int(n) for n in STARTED.findall(read(j))] for j in jobs]
    assert started[0] and started[1] and not set(started[0]) & set(started[1]), (started, report)
    rows = list(csv.DictReader((study / "trials.csv").open()))
    assert sorted(int(r["trial"]) for r in rows) == sorted(started[0] + started[1]), (rows, report)
    # the cancelled trial failed, its settings queued again and trained to an end by the other worker
    by_number = {int(r["trial"]): r for r in rows}
    assert by_number[cancelled]["state"] == "fail", rows
    assert sum(r["state"] in ("complete", "pruned") for r in rows) >= TRIALS, rows
    settings = lambda r: (r["optimizer.base_lr"], r["schedule.warmup_epochs"])  # noqa: E731
    again = [r for r in rows if settings(r) == settings(by_number[cancelled]) and int(r["trial"]) > cancelled]
    assert len(again) == 1 and again[0]["state"] in ("complete", "pruned") and int(again[0]["trial"]) in started[1], \
        rows  # and no other trial drew the same settings (each trial's draw has a seed of its own)

    # the report, and the site's settings in the trials' configs and the best one
    assert "## Best settings per global batch size" in (study / "report.md").read_text()
    best = yaml.safe_load((study / "best" / "cosmoflow_b8.yaml").read_text())
    assert best["mlperf"]["platform"] == "localhost-slurm" and best["data"]["dir"] == str(cosmo_learnable), best
    first = started[0][0]  # job 1's first trial, staged below the job's directory
    trial = yaml.safe_load((study / "runs" / f"run_{first:03d}" / "config.yaml").read_text())
    assert trial["data"]["stage_dir"] == f"{stage}/cosmoflow-{jobs[0]}/run_{first:03d}", trial["data"]
    assert trial["mlperf"]["platform"] == "localhost-slurm" and trial["run"]["seed"] == 1000, trial
    assert not list(stage.glob("*")), f"left in the stage directory: {sorted(stage.rglob('*'))}"
