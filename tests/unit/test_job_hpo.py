"""A hyperparameter search's worker as a batch job (jobs/hpo.py, docs/hpo.md "As scheduler jobs"): the rendered
script for each scheduler, the flags it refuses, the scheduler's TERM passed on to the worker, and the worker's
overrides (a job's settings) in its trials, its dry run and its study's hpo.json."""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from common.base.errors import BenchError
from common.hpo import __main__ as hpo_main
from common.hpo import space as spaces
from common.hpo.space import Param, Space, load_space
from common.hpo import study as studies
from common.hpo.study import StudySettings, open_study, saved_settings
from common.hpo.trial import Launch, TrialResult, trial_command
from jobs.__main__ import main as jobs_main
from jobs.render import Job, render
from jobs.site import load_site
from tests.conftest import REPO

# one example site per scheduler
SITES = {"slurm": "perlmutter", "lsf": "summit", "pbs": "polaris", "pjsub": "fugaku", "sge": "abci",
         "cobalt": "theta", "local": "localhost"}
CONFIG = str(REPO / "cosmoflow/configs/cosmo_mini.yaml")
LR = Param("optimizer.base_lr", "float", 0.001, 0.05, log=True)


def worker_job(**changes) -> Job:
    return Job(**{"bench": "cosmoflow", "nodes": 2, "hpo": "studies/cosmo/space.yaml", "trials": 12,
                  "overrides": ("train.max_epochs=6",), **changes})


def launcher_line(script: str) -> str:
    return next(line.strip() for line in script.splitlines() if line.strip().startswith("--launcher "))


@pytest.mark.parametrize("scheduler", sorted(SITES))
def test_a_worker_renders_for_every_scheduler_and_passes_bash_and_shellcheck(scheduler, tmp_path):
    site = load_site(SITES[scheduler])
    nodes = 1 if scheduler == "local" else 2
    script = render(site, worker_job(nodes=nodes))
    path = tmp_path / "worker.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    check = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    assert 'SPACE="$SUITE_DIR/studies/cosmo/space.yaml"' in script
    assert '[ -f "$SPACE" ] || fail "search space $SPACE does not exist"' in script
    assert f'STUDY_DIR="$OUTPUT_ROOT/hpo-space-{site.name}-n{nodes}"' in script
    assert '"$DRIVER_PYTHON" -m common.hpo run "$SPACE" --out "$STUDY_DIR" --trials 12 \\' in script
    assert f'    --np {nodes * site.ranks_per_node} --python "$PYTHON"' in script
    assert '    "${SETTINGS[@]}" &' in script and "trap stop_worker TERM" in script
    settings = script.split("SETTINGS=(")[1].split(")\n")[0]
    assert '"data.dir=$DATA_DIR"' in settings and f'"mlperf.platform={site.name}"' in settings
    assert "train.max_epochs=6" in settings and "data.stage_dir" not in settings  # each trial stages on its own
    if site.stage_dir:
        assert '--stage-dir "$STAGE_DIR/$STAGE_NAME"' in script and 'STAGE_NAME="cosmoflow-$JOB_ID"' in script
    # the launcher is the campaigns' template of the site's launcher
    campaign = render(site, Job(bench="cosmoflow", nodes=nodes, runs=3))
    assert launcher_line(script) == launcher_line(campaign)
    assert "--hpo studies/cosmo/space.yaml --trials 12" in script.split("\n# from the site")[0]


def test_the_study_directory_is_the_space_files_or_the_one_given():
    site = load_site("perlmutter")
    assert 'STUDY_DIR="$OUTPUT_ROOT/searches/b8"' in render(site, worker_job(study_dir="searches/b8"))
    assert 'STUDY_DIR="/scratch/b8"' in render(site, worker_job(study_dir="/scratch/b8"))
    assert 'SPACE="/abs/space.yaml"' in render(site, worker_job(hpo="/abs/space.yaml"))
    assert "#SBATCH --job-name=hpo-cosmoflow-perlmutter-n2" in render(site, worker_job())


@pytest.mark.parametrize("changes, message", [
    ({"runs": 3}, r"--hpo with --runs: .*leave out --runs"),
    ({"instances": 2}, r"--hpo with --instances"),
    ({"runs": 3, "chain": 2}, r"--hpo with --runs, --chain"),
    ({"config": "cosmoflow/configs/cosmo.yaml"}, r"--hpo with --config: .*\(which names the config\)"),
    ({"trials": 0}, r"--hpo needs --trials T"),
    ({"hpo": ""}, r"--trials and --study-dir go with --hpo"),
])
def test_flags_a_worker_cannot_take_are_refused_by_name(changes, message):
    with pytest.raises(BenchError, match=message):
        worker_job(**changes)


def test_a_space_of_another_benchmark_is_refused_when_it_is_at_hand(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"benchmark": "deepcam"}))
    argv = ["render", "--site", "perlmutter", "--bench", "cosmoflow", "--nodes", "2", "--hpo", str(space)]
    assert jobs_main([*argv, "--trials", "4"]) == 2
    assert "the space searches deepcam, but --bench is cosmoflow" in " ".join(capsys.readouterr().err.split())
    assert jobs_main([*argv, "--runs", "3"]) == 2
    assert "--hpo with --runs" in capsys.readouterr().err


# ---------------------------------------------------------------------------- the scheduler's TERM
FAKE_WORKER = textwrap.dedent("""\
    import os, pathlib, signal, sys, time
    stage = pathlib.Path(sys.argv[sys.argv.index("--stage-dir") + 1]) / "run_000"
    stage.mkdir(parents=True)  # as a trial staging its data
    pathlib.Path(sys.argv[-1].split("=", 1)[1]).write_text(" ".join(sys.argv[1:]))  # the job's override args=PATH
    def stop(*_):  # (the signal may come while print is still flushing)
        os.write(1, b"worker: TERM\\n")
        os._exit(143)
    signal.signal(signal.SIGTERM, stop)
    print("worker ready", flush=True)
    time.sleep(60)
""")


def test_the_batch_shell_passes_term_on_to_the_worker_and_cleans_the_stage_up(tmp_path):
    """As a scheduler that signals the batch shell only: the worker gets TERM, the job exits with its code, and
    the EXIT trap removes the job's stage directory (not its neighbours)."""
    script = tmp_path / "worker.sh"
    assert jobs_main(["render", "--site", "localhost", "--bench", "cosmoflow", "--nodes", "1", "--hpo",
                      str(tmp_path / "space.yaml"), "--trials", "3", f"args={tmp_path / 'args.txt'}",
                      "--out", str(script)]) == 0
    (tmp_path / "space.yaml").write_text("benchmark: cosmoflow\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    (tmp_path / "worker.py").write_text(FAKE_WORKER)
    (tmp_path / "stage" / "another-job").mkdir(parents=True)
    fake_python = tmp_path / "python"
    fake_python.write_text(f'#!/bin/bash\nexec {sys.executable} {tmp_path / "worker.py"} "$@"\n')
    fake_python.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "SUITE_DIR": str(REPO), "DATA_DIR": str(tmp_path / "data"),
           "OUTPUT_ROOT": str(tmp_path / "out"), "STAGE_DIR": str(tmp_path / "stage"),
           "DRIVER_PYTHON": str(fake_python)}
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    lines = [proc.stdout.readline() for _ in range(2)]
    assert lines[-1].strip() == "worker ready", lines
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143, out
    assert "TERM: passed on to the search worker" in out and out.count("worker: TERM") == 1, out
    args = (tmp_path / "args.txt").read_text()
    assert "common.hpo run" in args and f"--out {tmp_path / 'out'}/hpo-space-localhost-n1 --trials 3" in args
    assert f"--launcher horovodrun -np 2 -H localhost:2 data.dir={tmp_path / 'data'}" in args
    assert [p.name for p in (tmp_path / "stage").iterdir()] == ["another-job"]


def test_a_second_term_does_not_cut_the_workers_unwinding_short():
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as stopped:
            hpo_main._exit_on_sigterm(signal.SIGTERM, None)
        assert stopped.value.code == 143 and signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


# ---------------------------------------------------------------------------- the worker's overrides
def write_space(tmp_path: Path) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"benchmark": "cosmoflow", "config": CONFIG, "overrides": ["train.max_epochs=6"],
                                    "params": {LR.name: {"type": "float", "low": LR.low, "high": LR.high,
                                                         "log": True}}}))
    return path


@pytest.mark.parametrize("override", ["optimizer.base_lr=0.1", "run.seed=3", "run.output_dir=/x", "no-equals"])
def test_a_worker_override_of_what_the_search_sets_is_refused(tmp_path, override):
    with pytest.raises(BenchError, match=rf"search space .*: override '{override}': expected key=value of a key the "
                                         rf"search does not set \(run.seed, run.output_dir, optimizer.base_lr\)"):
        load_space(write_space(tmp_path), 1, ("data.dir=/d", override))


def test_the_command_line_takes_overrides_after_the_options_and_refuses_a_searched_one(tmp_path, capsys):
    before = signal.getsignal(signal.SIGTERM)
    try:
        code = hpo_main.main(["run", str(write_space(tmp_path)), "--out", str(tmp_path / "study"), "--trials", "1",
                              "data.dir=/d", "--np", "1", "optimizer.base_lr=0.1"])
    finally:
        signal.signal(signal.SIGTERM, before)
    assert code == 2 and "override 'optimizer.base_lr=0.1'" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "study").exists()


def test_the_dry_run_of_the_space_plans_its_configs_with_the_workers_overrides(tmp_path, monkeypatch):
    planned = []
    monkeypatch.setattr(spaces, "plan", lambda bench, config, overrides, ranks: planned.append(overrides) or {})
    load_space(write_space(tmp_path), 4, ("data.dir=/d", "mlperf.platform=site"))
    assert planned == [["train.max_epochs=6", "data.dir=/d", "mlperf.platform=site", f"{LR.name}={v}"]
                       for v in (LR.low, LR.high)]


def test_every_trial_gets_the_workers_overrides_after_the_spaces_and_a_stage_directory_of_its_own(tmp_path):
    space = Space("cosmoflow", CONFIG, (LR,), overrides=("train.max_epochs=6",))
    launch = Launch(2, "srun -n {np}", "/py", ("data.dir=/d",), stage_dir="/stage/job-7")
    command = trial_command(space, tmp_path, 5, {LR.name: 0.01}, launch)
    assert command[:3] == ["srun", "-n", "2"] and command[3] == "/py"
    assert command[5:] == [CONFIG, "train.max_epochs=6", "data.dir=/d", "data.stage_dir=/stage/job-7/run_005",
                           f"{LR.name}=0.01", "run.seed=1000", f"run.output_dir={tmp_path}/runs/run_005"]


def test_a_worker_with_other_overrides_is_refused_but_not_one_with_another_launcher(tmp_path):
    space, out = Space("cosmoflow", CONFIG, (LR,)), tmp_path / "study"
    mine = StudySettings(trials=3, launch=Launch(2, "srun --hostfile /job1/hosts", overrides=("data.dir=/d",)))
    open_study(space, out, mine)
    elsewhere = Launch(2, "srun --hostfile /job2/hosts", "/other/python", ("data.dir=/d",), stage_dir="/s")
    open_study(space, out, StudySettings(trials=3, launch=elsewhere))  # how a worker reaches its nodes: its own
    other = StudySettings(trials=3, launch=Launch(2, "srun", overrides=("data.dir=/elsewhere",)))
    with pytest.raises(BenchError, match=r"a study started with other settings \(overrides differ from .*hpo.json"):
        open_study(space, out, other)
    assert saved_settings(out)[1].launch.overrides == ("data.dir=/d",)


# ---------------------------------------------------------------------------- workers started together
def test_workers_started_together_draw_a_trials_settings_by_its_number(tmp_path, monkeypatch):
    """Jobs of an array start their workers at once, each with a sampler of the space's seed: a trial's draw
    follows its number, so two workers do not both train the same random settings."""
    def trained(space, out, trial, values, launch):
        return TrialResult(trial.number, values, "complete", 1.0, "success", 1, 1.0, 8, 0, 1.0)
    monkeypatch.setattr(studies, "run_trial", trained)
    space, settings = Space("cosmoflow", CONFIG, (LR,), sampler="random"), StudySettings(3, Launch(2, "srun"))
    workers = [open_study(space, tmp_path / "study", settings) for _ in range(2)]
    for study in workers:
        studies._one_trial(study, study.ask(), space, tmp_path / "study", settings)
    drawn = [t.params[LR.name] for t in workers[0].trials]
    assert len(drawn) == 2 and drawn[0] != drawn[1]
    alone = open_study(space, tmp_path / "alone", settings)
    for _ in range(2):
        studies._one_trial(alone, alone.ask(), space, tmp_path / "alone", settings)
    assert [t.params[LR.name] for t in alone.trials] == drawn  # the same draws, by number
