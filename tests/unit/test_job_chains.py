"""Chains of jobs (jobs/chain.py): the rendered job and submit scripts of every chained scheduler, the stop
signal's way from the scheduler to the campaign driver, and the campaign's exit 75 with a fake launcher."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from common.base.errors import BenchError
from common.campaign.run import (CampaignSpec, CampaignStopped, StopRequest, load_record, run_campaign, run_dir,
                                 training_pids, was_stopped)
from jobs import chain as chains
from jobs.__main__ import main as jobs_main
from jobs.render import Job, render
from jobs.site import load_site
from tests.conftest import REPO, checkout_first_on_path, summary_fields

CHAINED = {"slurm": "perlmutter", "lsf": "summit", "pbs": "polaris", "pjsub": "fugaku"}
CONFIG = str(REPO / "cosmoflow/configs/cosmo_mini.yaml")


def render_chain(tmp_path: Path, site: str, *extra: str) -> tuple[str, str]:
    out = tmp_path / "chain.sh"
    assert jobs_main(["render", "--site", site, "--bench", "cosmoflow", "--nodes", "2", "--runs", "10",
                      "--chain", "4", *extra, "--out", str(out)]) == 0
    submit = tmp_path / "chain-submit.sh"
    assert os.access(out, os.X_OK) and os.access(submit, os.X_OK)
    return out.read_text(), submit.read_text()


@pytest.mark.parametrize("site", [*CHAINED.values(), "localhost-slurm"])
def test_every_chained_scheduler_renders_scripts_that_pass_bash_and_shellcheck(site, tmp_path):
    render_chain(tmp_path, site)
    for path in (tmp_path / "chain.sh", tmp_path / "chain-submit.sh"):
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
        check = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout
    script = (tmp_path / "chain.sh").read_text()
    assert "--runs 10 --chain 4" in script  # the rendering command, in the script's note
    assert '"$DRIVER_PYTHON" -m common.campaign run cosmoflow' in script and "--runs 10" in script
    assert f'CAMPAIGN_DIR="$OUTPUT_ROOT/campaign-cosmoflow-{site}-n2"' in script


def test_the_signal_before_the_limit_is_asked_for_as_each_scheduler_can(tmp_path):
    slurm, _ = render_chain(tmp_path, "perlmutter", "--stop-margin", "300")
    assert "#SBATCH --signal=B:USR1@300" in slurm.splitlines()
    assert "trap 'forward USR1' USR1" in slurm and '"${SETTINGS[@]}" &' in slurm and "DRIVER_PID=$!" in slurm
    lsf, _ = render_chain(tmp_path, "summit", "--stop-margin", "301")  # -wt counts minutes: rounded up
    assert {"#BSUB -wa USR1", "#BSUB -wt 6"} <= set(lsf.splitlines())
    for site in ("polaris", "fugaku"):  # 02:00:00 less 600 s; no directive for it
        script, _ = render_chain(tmp_path, site, "--time", "01:00:00")
        assert "STOP_AFTER=$((3000 - SECONDS))" in script
        assert 'timeout --foreground --preserve-status --signal=USR1 "$STOP_AFTER" "$DRIVER_PYTHON"' in script
        assert "signal" not in "".join(line for line in script.splitlines() if line.startswith("#P"))


def test_the_submit_scripts_chain_by_each_schedulers_dependency(tmp_path):
    expected = {"slurm": 'sbatch --parsable --dependency="afterany:$1" "$SCRIPT"',
                "lsf": 'bsub -w "ended($1)" <"$SCRIPT"',
                "pbs": 'qsub -W "depend=afterany:$1" "$SCRIPT"',
                "pjsub": 'pjsub --step --sparam "jid=$1" "$SCRIPT"'}
    for scheduler, site in CHAINED.items():
        _, submit = render_chain(tmp_path, site)
        assert expected[scheduler] in submit and 'JOBS="${JOBS:-4}"' in submit
        assert 'SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/chain.sh"' in submit


FAKE_SUBMITTERS = {
    "sbatch": 'n=$(($(wc -l <"$LOG") + 1)); echo "sbatch $*" >>"$LOG"; echo "$((100 + n));cluster"',
    "bsub": 'n=$(($(wc -l <"$LOG") + 1)); read -r first; echo "bsub $* [$first]" >>"$LOG"; '
            'echo "Job <$((200 + n))> is submitted to queue <batch>."',
    "qsub": 'n=$(($(wc -l <"$LOG") + 1)); echo "qsub $*" >>"$LOG"; echo "$((300 + n)).pbs-server"',
    "pjsub": 'n=$(wc -l <"$LOG"); echo "pjsub $*" >>"$LOG"; echo "[INFO] PJM 0000 pjsub Job 400_$n submitted."',
}


@pytest.mark.parametrize("scheduler", sorted(CHAINED))
def test_the_submit_script_submits_the_chain_in_order(scheduler, tmp_path):
    """Fake submit commands record their arguments and answer as the real ones do."""
    render_chain(tmp_path, CHAINED[scheduler])
    bin_dir, log = tmp_path / "bin", tmp_path / "submitted.log"
    bin_dir.mkdir()
    log.write_text("")
    command = {"slurm": "sbatch", "lsf": "bsub", "pbs": "qsub", "pjsub": "pjsub"}[scheduler]
    (bin_dir / command).write_text(f"#!/bin/bash\nLOG={log}\n{FAKE_SUBMITTERS[command]}\n")
    (bin_dir / command).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "JOBS": "3"}
    done = subprocess.run(["bash", str(tmp_path / "chain-submit.sh")], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    script = tmp_path / "chain.sh"
    calls = log.read_text().splitlines()
    assert calls == {
        "slurm": [f"sbatch --parsable {script}", f"sbatch --parsable --dependency=afterany:101 {script}",
                  f"sbatch --parsable --dependency=afterany:102 {script}"],
        "lsf": ["bsub  [#!/bin/bash]", "bsub -w ended(201) [#!/bin/bash]", "bsub -w ended(202) [#!/bin/bash]"],
        "pbs": [f"qsub {script}", f"qsub -W depend=afterany:301.pbs-server {script}",
                f"qsub -W depend=afterany:302.pbs-server {script}"],
        "pjsub": [f"pjsub --step {script}", f"pjsub --step --sparam jid=400 {script}",
                  f"pjsub --step --sparam jid=400 {script}"]}[scheduler]
    assert done.stdout.count("job ") == 3


@pytest.mark.parametrize("job,site,message", [
    (Job(bench="cosmoflow", nodes=2, chain=3), "perlmutter", "--chain needs --runs N"),
    (Job(bench="cosmoflow", nodes=2, instances=2, chain=3), "perlmutter", "--chain needs --runs N"),
    (Job(bench="cosmoflow", nodes=2, runs=10, chain=3), "abci", "chains are rendered for slurm, lsf, pbs, pjsub"),
    (Job(bench="cosmoflow", nodes=1, runs=10, chain=3), "localhost", "chains are rendered for"),
    (Job(bench="cosmoflow", nodes=2, runs=10, chain=3, stop_margin=7200), "perlmutter",
     r"--stop-margin 7200 s: expected more than 0 and less than the time limit \(7200 s\)"),
])
def test_chains_the_scheduler_or_job_cannot_make_are_refused(job, site, message):
    with pytest.raises(BenchError, match=message):
        render(load_site(site), job)


def test_a_chain_needs_out_for_its_two_scripts(capsys):
    args = ["render", "--site", "perlmutter", "--bench", "cosmoflow", "--nodes", "2", "--runs", "3", "--chain", "2"]
    assert jobs_main(args) == 2
    assert "give --out" in capsys.readouterr().err


def test_an_unchained_campaign_is_rendered_as_before():
    script = render(load_site("perlmutter"), Job(bench="cosmoflow", nodes=2, runs=10))
    assert "--signal" not in script and "DRIVER_PID" not in script and "done_runs" not in script


def done_check(tmp_path: Path, records: int, scored: bool) -> subprocess.CompletedProcess:
    """The job script's first campaign lines, on a campaign directory with `records` finished runs of 3."""
    campaign = tmp_path / "out" / "campaign-cosmoflow-perlmutter-n2"
    for i in range(records):
        (campaign / "runs" / f"run_{i:03d}").mkdir(parents=True)
        (campaign / "runs" / f"run_{i:03d}" / "campaign_run.json").write_text("{}")
    if scored:
        (campaign / "score.json").write_text("{}")
    job = Job(bench="cosmoflow", nodes=2, runs=3, chain=2)
    lines = ["set -euo pipefail", f"OUTPUT_ROOT={tmp_path / 'out'}", *chains.done_check(load_site("perlmutter"), job),
             "echo going on"]
    return subprocess.run(["bash", "-c", "\n".join(lines)], capture_output=True, text=True)


def test_a_job_that_finds_the_campaign_done_exits_0_at_once(tmp_path):
    first = done_check(tmp_path / "a", 0, False)  # no campaign directory yet
    assert first.returncode == 0 and first.stdout == "going on\n", first.stderr
    assert done_check(tmp_path / "b", 3, False).stdout == "going on\n"  # runs done, not scored yet
    assert done_check(tmp_path / "c", 2, True).stdout == "going on\n"
    done = done_check(tmp_path / "d", 3, True)
    assert done.returncode == 0 and "all 3 runs done and scored; nothing left" in done.stdout
    assert "going on" not in done.stdout


# ---------------------------------------------------------------------------- the signal's way, in bash
FAKE_DRIVER = textwrap.dedent("""\
    import signal, sys, time
    asked = []
    signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))  # as the campaign driver: noted, acted on later
    print("driver ready", flush=True)
    for _ in range(600):
        if asked:
            sys.exit(75)
        time.sleep(0.1)
""")


def driver_script(tmp_path: Path, scheduler: str, limit: int, margin: int) -> Path:
    site, job = load_site(CHAINED[scheduler]), Job(bench="cosmoflow", nodes=1, runs=2, chain=2, stop_margin=margin)
    (tmp_path / "driver.py").write_text(FAKE_DRIVER)
    driver = [f"{sys.executable} {tmp_path / 'driver.py'} \\", '    "${SETTINGS[@]}"']
    lines = ["#!/bin/bash", "set -euo pipefail", 'fail() { echo "error: $*" >&2; exit 2; }', "SETTINGS=(a=1)",
             *chains.run_driver(site, job, limit, driver)]
    path = tmp_path / "job.sh"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_batch_shell_passes_the_schedulers_usr1_on_to_the_driver_and_exits_75(tmp_path):
    proc = subprocess.Popen(["bash", str(driver_script(tmp_path, "slurm", 7200, 600))], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "driver ready"
    proc.send_signal(signal.SIGUSR1)  # as Slurm's --signal=B:USR1 does: the batch shell only
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 75 and "USR1: passed on to the campaign driver" in out


def test_without_a_schedulers_signal_timeout_sends_usr1_before_the_limit(tmp_path):
    started = time.time()
    done = subprocess.run(["bash", str(driver_script(tmp_path, "pbs", 64, 60))], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 75, done.stderr
    assert 1 <= time.time() - started < 20 and "campaign driver exit 75" in done.stdout


# ---------------------------------------------------------------------------- the campaign with a fake launcher
FAKE_LAUNCHER = textwrap.dedent("""\
    # A launcher and training in one: MODE=wait waits for SIGUSR1 and exits 75 as a stopped training does;
    # MODE=succeed writes a successful summary at once.
    import json, os, pathlib, signal, sys, time
    out = pathlib.Path(next(a for a in sys.argv if a.startswith("run.output_dir=")).split("=", 1)[1])
    summary = json.loads(SUMMARY_JSON)  # a complete summary.json (tests/conftest.py summary_fields)
    def stopped(*_):
        (out / "summary.json").write_text(json.dumps(dict(summary, status="aborted", stopped=True)))
        sys.exit(75)
    signal.signal(signal.SIGUSR1, stopped)
    if os.environ["MODE"] == "succeed":
        (out / "summary.json").write_text(json.dumps(summary))
        sys.exit(0)
    print("training", flush=True)
    time.sleep(60)
""").replace("SUMMARY_JSON", repr(json.dumps(summary_fields())))


def fake_spec(tmp_path: Path) -> CampaignSpec:
    (tmp_path / "launcher.py").write_text(FAKE_LAUNCHER)
    return CampaignSpec(benchmark="cosmoflow", config=CONFIG, runs=2, ranks=1,
                        launcher=f"{sys.executable} {tmp_path / 'launcher.py'}")


def wait_for_training(out: Path, index: int) -> None:
    log = run_dir(out, index) / "train.log"
    for _ in range(300):
        if log.is_file() and "training" in log.read_text():
            return
        time.sleep(0.1)
    raise AssertionError(f"{log}: the fake training did not start")


def test_the_stop_goes_to_local_python_trainings_else_to_the_launcher(tmp_path):
    train = tmp_path / "cosmoflow" / "train.py"
    rank = f"{sys.executable} -c 'import time; time.sleep(30)' {train}"
    launcher = subprocess.Popen(["bash", "-c", f"{rank} & {rank} & wait"])  # as horovodrun starts its ranks
    alone = subprocess.Popen(["sleep", "30"])  # as srun: the ranks are elsewhere
    try:
        for _ in range(100):
            found = training_pids(launcher.pid)
            if len(found) == 2:
                break
            time.sleep(0.1)
        assert len(found) == 2 and launcher.pid not in found
        assert training_pids(alone.pid) == [alone.pid]
    finally:
        for proc in (launcher, alone):
            for pid in training_pids(proc.pid):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()


def test_a_stopped_run_is_not_recorded_and_the_next_start_runs_it_again(tmp_path, monkeypatch):
    spec, out = fake_spec(tmp_path), tmp_path / "campaign"
    monkeypatch.setenv("MODE", "wait")
    stop = StopRequest()

    def signal_later():  # the driver's handler only notes the signal; the wait loop passes it on
        wait_for_training(out, 0)
        stop.signum = signal.SIGUSR1

    threading.Thread(target=signal_later, daemon=True).start()
    with pytest.raises(CampaignStopped, match="0 of 2 runs done; run 1 stopped"):
        run_campaign(spec, out, stop)
    assert load_record(out, 0) is None and json.loads((run_dir(out, 0) / "summary.json").read_text())["stopped"]
    monkeypatch.setenv("MODE", "succeed")
    records = run_campaign(spec, out)
    assert [r.status for r in records] == ["success", "success"]
    assert len(list((out / "runs" / "aborted").iterdir())) == 1  # the stopped attempt, kept aside


def test_after_a_stop_only_a_run_whose_summary_says_it_ended_on_its_own_counts_as_done(tmp_path):
    directory = run_dir(tmp_path, 0)
    directory.mkdir(parents=True)
    assert was_stopped(tmp_path, 0, 1)  # no summary: killed before the training handled the signal
    (directory / "summary.json").write_text(json.dumps(summary_fields(status="aborted", stopped=True)))
    assert was_stopped(tmp_path, 0, 1)  # horovodrun's exit code when its workers exit 75
    (directory / "summary.json").write_text(json.dumps(summary_fields()))
    assert not was_stopped(tmp_path, 0, 0) and was_stopped(tmp_path, 0, 75)


def test_a_stop_between_runs_starts_no_further_run(tmp_path, monkeypatch):
    spec, out = fake_spec(tmp_path), tmp_path / "campaign"
    monkeypatch.setenv("MODE", "succeed")
    stop = StopRequest()
    stop.signum = signal.SIGUSR1
    with pytest.raises(CampaignStopped, match="0 of 2 runs done; run 1 not started"):
        run_campaign(spec, out, stop)
    assert not run_dir(out, 0).exists()


def test_the_campaign_driver_exits_75_on_usr1(tmp_path):
    fake_spec(tmp_path)
    out = tmp_path / "campaign"
    env = {**os.environ, "MODE": "wait", "PYTHONPATH": checkout_first_on_path()}
    proc = subprocess.Popen([sys.executable, "-m", "common.campaign", "run", "cosmoflow", CONFIG, "--out", str(out),
                             "--runs", "2", "--np", "1", "--launcher", f"{sys.executable} {tmp_path / 'launcher.py'}"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_training(out, 0)
    proc.send_signal(signal.SIGUSR1)
    text, _ = proc.communicate(timeout=60)
    assert proc.returncode == 75, text
    assert "stopped by SIGUSR1: 0 of 2 runs done; run 1 stopped (exit 75)" in text
    assert load_record(out, 0) is None


def test_a_run_the_deadline_cannot_hold_is_not_started(tmp_path, monkeypatch, capsys):
    spec, out = fake_spec(tmp_path), tmp_path / "campaign"
    monkeypatch.setenv("MODE", "succeed")
    spec = dataclasses.replace(spec, runs=3)
    run_campaign(dataclasses.replace(spec, runs=1), out)  # one run done: its wall time is the estimate
    took = load_record(out, 0).wall_seconds
    with pytest.raises(CampaignStopped, match=r"1 of 3 runs done; run 2 not started: .* min left before the "
                                              r"deadline, and a run took up to"):
        run_campaign(spec, out, deadline=time.time() + took / 2)
    assert not run_dir(out, 1).exists()
    assert [r.status for r in run_campaign(spec, out, deadline=time.time() + took + 3600)] == ["success"] * 3


def test_a_chained_jobs_driver_gets_the_moment_its_stop_margin_begins(tmp_path):
    script = driver_script(tmp_path, "slurm", 7200, 600).read_text()
    assert 'DEADLINE=$(($(date +%s) + 6600 - SECONDS))' in script
    assert '    --deadline "$DEADLINE" \\\n    "${SETTINGS[@]}" &' in script
