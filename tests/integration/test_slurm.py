"""A rendered Slurm script submitted to a real Slurm: a single-node cluster (munged, slurmctld, slurmd from
Debian's packages, which set-up installs) started once per test session (tests/integration/conftest.py).

The job is a small CosmoFlow training with 2 tasks (srun --mpi=pmix), staging its data to node-local
storage; its MLPerf log must pass the official checker's structural rules and record success for the
run's own target, validation MAE 0.40, which only a model that learned meets (chance is 0.5; a small
model does not reach the rules' 0.124; the mini dataset's full training through the same path is
measured in docs/jobs.md). Needs root, to run the daemons.

A campaign as a chain of jobs (docs/jobs.md, "Chains of jobs"): the shipped localhost-slurm site rendered with
`--runs 1 --chain 4`, submitted by its submit script; one job gets the stop signal, one is cancelled with
`scancel`, a later job finishes and scores the campaign, the last finds nothing left.
"""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from common.campaign.compliance import check_log
from jobs.render import Job, render
from jobs.site import load_site
from tests.conftest import REPO, checkout_first_on_path, run_cmd, show
from tests.integration.cosmo_fixtures import LEARNED_MAE, corrupt_last_train_file, write_config, write_learning_config

# serial: one local Slurm node of this host's cores, whose jobs these tests time (Makefile)
pytestmark = [pytest.mark.slow, pytest.mark.serial]


# ------------------------------------------------------------------------------- jobs followed in scontrol
# A job's states once it has ended (scontrol shows COMPLETING until its processes are gone).
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE")


def _submit(script: Path, env: dict, cwd: Path) -> str:
    """`sbatch SCRIPT` from `cwd`: the job's id."""
    proc = subprocess.run(["sbatch", "--parsable", str(script)], env=env, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().split(";")[0]


def _job_state(env: dict, job: str) -> tuple[str, str]:
    """A job's state and exit code from `scontrol show job` (the local Slurm keeps ended jobs an hour)."""
    text = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
    state = re.search(r"JobState=(\S+)", text)
    code = re.search(r"ExitCode=(\S+)", text)
    return (state.group(1) if state else "UNKNOWN"), (code.group(1) if code else "")


def _ended(env: dict, job: str) -> bool:
    """Has the job ended (scontrol says so)?"""
    return _job_state(env, job)[0] in ENDED


def _wait_for(what: str, predicate, timeout: float, context) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s\n{context()}")
        time.sleep(0.5)


def _training(run: Path) -> bool:
    """Has the run in `run` (a campaign's run directory) started its first epoch (its MLPerf log says so)?"""
    log = run / "mlperf.log"
    return log.is_file() and '"key": "epoch_start"' in log.read_text(errors="replace")


def _two_task_site(tmp_path: Path, data: Path, stage: bool = True) -> Path:
    """A site file for the test's Slurm: 2 tasks (srun --mpi=pmix), this checkout, `data` as CosmoFlow's, staged to
    a directory of the test's (`stage`) or read in place."""
    site_file = tmp_path / "slurm-test.yaml"
    site_file.write_text(yaml.safe_dump({
        "name": "slurm-test", "description": "single-node Slurm started by the test", "scheduler": "slurm",
        "launcher_args": "--mpi=pmix", "time_limit": "00:20:00", "ranks_per_node": 2, "cpus_per_rank": 1,
        "python": sys.executable, "suite_dir": str(REPO), "data": {"cosmoflow": str(data)},
        "output_root": str(tmp_path / "out"), "stage_dir": str(tmp_path / "stage") if stage else "",
        "env": {"PYTHONPATH": checkout_first_on_path()}}))
    return site_file


def test_a_rendered_script_runs_under_slurm_and_its_log_passes_the_checker(slurm, cosmo_learnable, tmp_path):
    site_file = _two_task_site(tmp_path, cosmo_learnable)
    config = write_learning_config(tmp_path / "small.yaml", cosmo_learnable, tmp_path / "unused")
    script = tmp_path / "job.sh"
    script.write_text(render(load_site(str(site_file)), Job(bench="cosmoflow", nodes=1, config=str(config))))
    t0 = time.time()
    # Followed with scontrol, not `sbatch --wait`: that polls the job 2, 8, then 32 s apart (up to half of
    # MinJobAge), and so returned some 30 s after this job's end.
    job = _submit(script, slurm, tmp_path)
    log = tmp_path / f"cosmoflow-slurm-test-n1-{job}.out"  # the script's own --output, in the submit directory
    read = lambda: log.read_text(errors="replace") if log.is_file() else ""  # noqa: E731
    _wait_for("the job ending", lambda: _ended(slurm, job), 900, lambda: read()[-5000:])
    output = read()
    assert _job_state(slurm, job) == ("COMPLETED", "0:0"), f"{_job_state(slurm, job)}\n{output[-5000:]}"
    runs = list((tmp_path / "out").glob("cosmoflow-*"))
    assert len(runs) == 1, output[-3000:]
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["status"] == "success" and summary["final_metric"] < LEARNED_MAE
    assert summary["io"]["ranks"][0]["staging"]["copied"] and str(tmp_path / "stage") in \
        summary["io"]["ranks"][0]["staging"]["dir"]
    checked = check_log(runs[0] / "mlperf.log")
    assert checked.only_target_failed, checked.output
    assert "compliance checker (hpc 3.0.0)" in output  # the script checked the log itself
    print(f"the job took {time.time() - t0:.0f} s")


def test_bad_input_that_one_task_meets_is_the_jobs_exit_code_under_srun(slurm, cosmo_small, writable_copy, tmp_path):
    """A corrupt record only task 1 reads: srun reports the largest of its tasks' codes, and task 0 ends as task 1
    did (common/runtime/failures.py), so the job's code is the run's, 2 (bad input), not 4 (internal error)."""
    data = writable_copy(cosmo_small)
    corrupt_last_train_file(data)
    config = write_config(tmp_path / "tiny.yaml", data, tmp_path / "unused")
    script = tmp_path / "job.sh"
    # read in place: staging would check every file's checksum on every node first (each rank then exits 2 itself)
    script.write_text(render(load_site(str(_two_task_site(tmp_path, data, stage=False))),
                             Job(bench="cosmoflow", nodes=1, config=str(config),
                                 overrides=("data.shuffle=false", "data.loader=tfdata", "train.max_epochs=2"))))
    job = _submit(script, slurm, tmp_path)
    log = tmp_path / f"cosmoflow-slurm-test-n1-{job}.out"
    read = lambda: log.read_text(errors="replace") if log.is_file() else ""  # noqa: E731
    _wait_for("the job ending", lambda: _ended(slurm, job), 600, lambda: read()[-5000:])
    assert _job_state(slurm, job) == ("FAILED", "2:0"), f"{_job_state(slurm, job)}\n{read()[-5000:]}"
    summary = json.loads(next((tmp_path / "out").glob("cosmoflow-*/summary.json")).read_text())
    assert summary["error"] == "PeerFailed" and summary["reason"].startswith("rank 1: "), summary


# ---------------------------------------------------------------------------- a campaign driven as a chain of jobs
CHAIN_JOBS = 4
CHAIN_TIMEOUT = 1200  # seconds for the whole chain: four jobs, three trainings of under a minute each here
# A larger model than the learning config's, evaluated after its 20 epochs only: a training runs 10-15 s
# after its first epoch starts here (the signals, sent then, reach it within about 2 s, so they come while it
# trains, with room for a faster host) and meets the target.
CHAIN_RUN = {"model": {"conv_filters": [16, 32, 64, 64], "dense_units": [64, 32]},
             "train": {"max_epochs": 20, "eval_every": 20}}


def _render_chain(tmp_path: Path, config: Path) -> Path:
    """The shipped localhost-slurm site's chain of CHAIN_JOBS jobs for a 1-run campaign."""
    script = tmp_path / "chain" / "cosmo.sh"
    script.parent.mkdir()
    proc = run_cmd([sys.executable, "-m", "jobs", "render", "--site", "localhost-slurm", "--bench", "cosmoflow",
                    "--nodes", 1, "--runs", 1, "--chain", CHAIN_JOBS, "--time", "00:10:00", "--stop-margin", 60,
                    "--config", config, "--out", script])
    assert proc.returncode == 0, show(proc)
    assert "#SBATCH --signal=B:USR1@60" in script.read_text()
    return script


def test_a_campaign_chain_goes_on_after_a_stop_signal_and_a_cancelled_job(slurm, cosmo_learnable, tmp_path):
    """Four chained jobs of the shipped localhost-slurm site run a 1-run campaign: job 1 gets the scheduler's
    stop signal (what `--signal=B:USR1@60` sends at the margin) during its training and exits 75, job 2 is
    cancelled (`scancel`) during the run's second attempt, job 3 trains the run to the end and scores the
    campaign, job 4 finds nothing left. (A driver going on to a campaign's next run: test_campaign.py.)"""
    config = write_learning_config(tmp_path / "small.yaml", cosmo_learnable, tmp_path / "unused", **CHAIN_RUN)
    script = _render_chain(tmp_path, config)
    # The site's paths are $PWD-relative (submit from a checkout); the rendered script takes each from the
    # environment, which sbatch passes on to the jobs.
    out_root = tmp_path / "runs"
    env = {**slurm, "SUITE_DIR": str(REPO), "DATA_DIR": str(cosmo_learnable), "OUTPUT_ROOT": str(out_root),
           "STAGE_DIR": str(tmp_path / "stage"), "PYTHON": sys.executable, "DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": checkout_first_on_path()}
    t0 = time.time()
    submitted = subprocess.run([str(script.with_name("cosmo-submit.sh"))], env=env, cwd=tmp_path,
                               capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    jobs = re.findall(r"job \d+/\d+: (\d+)", submitted.stdout)
    assert len(jobs) == CHAIN_JOBS, submitted.stdout
    campaign = out_root / "campaign-cosmoflow-localhost-slurm-n1"
    first_run = campaign / "runs" / "run_000"
    outputs = lambda: "".join(p.read_text(errors="replace")[-4000:] for p in sorted(tmp_path.glob("*.out")))

    _wait_for("job 1 training its first run", lambda: _training(first_run), 600, outputs)
    stop_signal = subprocess.run(["scancel", "--signal=USR1", "--batch", jobs[0]], env=slurm, capture_output=True,
                                 text=True)
    assert stop_signal.returncode == 0, stop_signal.stderr
    _wait_for("job 1 ending", lambda: _ended(slurm, jobs[0]), 300, outputs)
    # job 2 moves job 1's stopped attempt aside and starts the run again
    aborted = campaign / "runs" / "aborted"
    _wait_for("job 2 training the first run again", lambda: _job_state(slurm, jobs[1])[0] == "RUNNING" and
              aborted.is_dir() and any(aborted.iterdir()) and _training(first_run), 600, outputs)
    cancel = subprocess.run(["scancel", jobs[1]], env=slurm, capture_output=True, text=True)
    assert cancel.returncode == 0, cancel.stderr
    _wait_for("the chain ending", lambda: all(_ended(slurm, j) for j in jobs), CHAIN_TIMEOUT, outputs)
    print(f"the chain of {CHAIN_JOBS} jobs took {time.time() - t0:.0f} s")
    states = [_job_state(slurm, j) for j in jobs]
    logs = {j: (tmp_path / f"cosmoflow-localhost-slurm-n1-{j}.out").read_text(errors="replace") for j in jobs}
    report = "\n".join(f"--- job {j} {states[i]}\n{logs[j][-3000:]}" for i, j in enumerate(jobs))

    # job 1: the signal went on to the driver and the training; exit 75
    assert states[0] == ("FAILED", "75:0"), report
    assert "USR1: passed on to the campaign driver" in logs[jobs[0]], report
    assert "stopped by SIGUSR1" in logs[jobs[0]] and "campaign driver exit 75" in logs[jobs[0]], report
    # job 2: cancelled; the driver stopped its training
    assert states[1][0] == "CANCELLED", report
    assert "TERM: the campaign driver stops its trainings" in logs[jobs[1]], report
    assert "an unfinished earlier attempt moved to" in logs[jobs[1]], report  # job 1's
    # job 3: the run's third attempt, then the score (1 run: reported, not valid under the rules' 10)
    assert "run 1/1: success" in logs[jobs[2]], report
    assert states[2] == ("FAILED", "1:0") and "campaign driver exit 1 " in logs[jobs[2]], report  # not valid
    assert "nothing left for this job" in logs[jobs[3]] and states[3] == ("COMPLETED", "0:0"), report
    attempts = sorted(aborted.iterdir())
    assert len(attempts) == 2, report  # job 1's stopped attempt and job 2's cancelled one
    for attempt, signal_name in zip(attempts, ("SIGUSR1", "SIGTERM")):  # each stopped in its first epoch
        stopped = json.loads((attempt / "summary.json").read_text())
        assert stopped["stopped"] and stopped["status"] == "aborted", stopped
        assert stopped["reason"].startswith(f"stopped by {signal_name}"), stopped
    record = json.loads((first_run / "campaign_run.json").read_text())
    summary = json.loads((first_run / "summary.json").read_text())
    assert record["seed"] == 1000 and summary["status"] == "success", (record, summary)
    # the score: the run succeeded; 1 run of a small model is reported, not a valid MLPerf score
    score = json.loads((campaign / "score.json").read_text())
    assert [r["status"] for r in score["runs"]] == ["success"] and not score["valid"], score
    assert (campaign / "score.md").is_file(), report
    assert not (tmp_path / "stage").exists() or not any((tmp_path / "stage").iterdir()), "staged copies left"


# ---------------------------------------------------------------------------- throughput instances as separate jobs
HELD_SECONDS = 20  # how long the second instance's job stays queued after the first has reached the barrier


def _init_start_ms(log: Path) -> float:
    return next(json.loads(line[9:]) for line in log.read_text().splitlines() if '"key": "init_start"' in line)["time_ms"]


def _logged_seed(log: Path) -> int:
    return next(json.loads(line[9:]) for line in log.read_text().splitlines() if '"key": "seed"' in line)["value"]


def test_separate_instance_jobs_start_their_trainings_together_after_the_later_ones_queueing(
        slurm, cosmo_learnable, tmp_path):
    """Two instances of one throughput result rendered as separate jobs (`--separate-jobs`, a barrier): the second
    job is held in the queue (`sbatch --hold`) for HELD_SECONDS after the first has reached the barrier; neither
    training starts before the second arrives, so both init_starts follow the barrier's start moment, within seconds
    of each other; each trained with the seed the renderer gave it, and the last to end scored the campaign."""
    site_file = tmp_path / "instances.yaml"
    site_file.write_text(yaml.safe_dump({
        "name": "slurm-instances", "description": "single-node Slurm started by the test, one task per instance",
        "scheduler": "slurm", "launcher_args": "--mpi=pmix", "time_limit": "00:20:00", "ranks_per_node": 1,
        "cpus_per_rank": 1, "python": sys.executable, "driver_python": sys.executable, "suite_dir": str(REPO),
        "data": {"cosmoflow": str(cosmo_learnable)}, "output_root": str(tmp_path / "out"),
        "stage_dir": str(tmp_path / "stage"), "env": {"PYTHONPATH": checkout_first_on_path()}}))
    config = write_learning_config(tmp_path / "small.yaml", cosmo_learnable, tmp_path / "unused")
    proc = run_cmd([sys.executable, "-m", "jobs", "render", "--site", site_file, "--bench", "cosmoflow", "--nodes", 1,
                    "--instances", 2, "--separate-jobs", "--config", config, "--out", tmp_path / "tp.sh"])
    assert proc.returncode == 0, show(proc)
    seeds = {j["index"]: j["seed"] for j in json.loads((tmp_path / "tp-instances.json").read_text())["jobs"]}
    campaign = tmp_path / "out" / "throughput-cosmoflow-slurm-instances-n1x2"
    first = _submit(tmp_path / "tp-instance_000.sh", slurm, tmp_path)
    held = subprocess.run(["sbatch", "--parsable", "--hold", str(tmp_path / "tp-instance_001.sh")], env=slurm,
                          cwd=tmp_path, capture_output=True, text=True)
    assert held.returncode == 0, held.stderr
    second = held.stdout.strip().split(";")[0]
    outputs = lambda: "".join(p.read_text(errors="replace")[-4000:] for p in sorted(tmp_path.glob("*.out")))  # noqa: E731
    _wait_for("instance 0 at the barrier", lambda: (campaign / "barrier" / "ready_000.json").is_file(), 300, outputs)
    time.sleep(HELD_SECONDS)
    assert not (campaign / "runs" / "run_000").exists(), outputs()  # no training before the second arrives
    release = subprocess.run(["scontrol", "release", second], env=slurm, capture_output=True, text=True)
    assert release.returncode == 0, release.stderr
    released = time.time()
    _wait_for("both jobs ending", lambda: _ended(slurm, first) and _ended(slurm, second), 900, outputs)
    report = outputs()
    opened = json.loads((campaign / "barrier" / "start.json").read_text())
    assert opened["instances"] == [0, 1] and opened["start_at"] >= released - 1, (opened, report)
    starts = []
    for index in (0, 1):
        log = campaign / "runs" / f"run_{index:03d}" / "mlperf.log"
        assert _logged_seed(log) == seeds[index] == 1000 + index, report
        starts.append(_init_start_ms(log))
        assert starts[-1] >= opened["start_at"] * 1000, report  # the wait is before init_start
        assert check_log(log).only_target_failed, report
    assert abs(starts[0] - starts[1]) < 10_000, (starts, report)  # together, though queued 20 s apart
    print(f"init_starts {abs(starts[0] - starts[1]):.0f} ms apart, {min(starts) / 1000 - opened['start_at']:.1f} s "
          f"after the shared start, which came {opened['start_at'] - released:.1f} s after the release")
    codes = sorted(_job_state(slurm, j)[1] for j in (first, second))
    assert "1:0" in codes and set(codes) <= {"0:0", "1:0"}, (codes, report)  # the scorer: 2 of the rules' 10 instances
    score = json.loads((campaign / "score.json").read_text())
    assert score["mode"] == "throughput" and [r["seed"] for r in score["runs"]] == [1000, 1001], score
    assert all(r["only_target_failed"] for r in score["runs"]), score
    assert not (tmp_path / "stage").exists() or not any((tmp_path / "stage").iterdir()), "staged copies left"
