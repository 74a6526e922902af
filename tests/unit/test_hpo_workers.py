"""Several search workers sharing one study through its journal file, with a stand-in launcher whose
"training" writes the files a real one leaves (a real search: tests/integration/test_hpo.py)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
import yaml

from common.base.errors import BenchError
from common.hpo.study import STUDY_NAME
from tests.conftest import REPO, checkout_first_on_path, summary_fields

# Launcher and training in one: the run directory gets config.yaml, an MLPerf log whose evaluations reach the
# target at an epoch that grows as the learning rate moves away from 0.01, and a successful summary.
FAKE_LAUNCHER = textwrap.dedent("""\
    import json, math, pathlib, sys, time
    args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    out = pathlib.Path(args["run.output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    epochs = 2 + round(abs(math.log10(float(args["optimizer.base_lr"]) / 0.01)) * 4)
    (out / "config.yaml").write_text("train: {max_epochs: 12}\\n")
    def event(key, value, **meta):
        return ":::MLLOG " + json.dumps({"key": key, "value": value, "time_ms": 0, "metadata": meta}) + "\\n"
    lines = [event("global_batch_size", 8)] + [event("eval_error", 0.1 + 0.05 * (epochs - e), epoch_num=e)
                                               for e in range(1, epochs + 1)]
    lines.append(event("run_stop", None, status="success"))
    time.sleep(0.5)  # long enough for the two workers' trials to overlap
    (out / "mlperf.log").write_text("".join(lines))
    summary = dict(json.loads(SUMMARY_JSON), time_to_train_seconds=10.0 * epochs)
    (out / "summary.json").write_text(json.dumps(summary))
""").replace("SUMMARY_JSON", repr(json.dumps(summary_fields())))


def test_two_workers_share_a_study_and_together_finish_its_trials(tmp_path):
    (tmp_path / "launcher.py").write_text(FAKE_LAUNCHER)
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({
        "benchmark": "cosmoflow", "config": str(REPO / "cosmoflow/configs/cosmo_mini.yaml"),
        "sampler": {"name": "random", "seed": 5}, "pruner": {"name": "none"},
        "params": {"optimizer.base_lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}}}))
    out = tmp_path / "study"
    command = [sys.executable, "-m", "common.hpo", "run", str(space), "--out", str(out), "--trials", "6", "--np", "1",
               "--launcher", f"{sys.executable} {tmp_path / 'launcher.py'}"]
    env = {**os.environ, "PYTHONPATH": checkout_first_on_path()}
    workers = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True) for _ in range(2)]
    said = [w.communicate(timeout=300)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], said
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(out / "journal.log")))
    trials = optuna.load_study(study_name=STUDY_NAME, storage=storage).trials
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    # each worker stops once finished + running reach 6: together they may start one more than asked
    assert 6 <= len(complete) <= 7 and len(complete) == len(trials), said
    assert len({t.user_attrs["worker"] for t in complete}) == 2  # both ran trials
    assert sorted(t.number for t in trials) == list(range(len(trials)))  # one numbering, no collision
    for t in complete:
        record = json.loads((out / "runs" / f"run_{t.number:03d}" / "trial.json").read_text())
        assert record["value"] == t.value == record["epochs"]
    assert Path(out / "report.md").is_file() and Path(out / "best" / "cosmoflow_b8.yaml").is_file()


def test_a_search_is_a_section_of_the_analysis_report(tmp_path):
    """`python -m common.campaign.analysis report` given a study directory adds its best settings per batch size,
    its importances and its three figures; a directory that is not a study adds nothing."""
    (tmp_path / "launcher.py").write_text(FAKE_LAUNCHER)
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({
        "benchmark": "cosmoflow", "config": str(REPO / "cosmoflow/configs/cosmo_mini.yaml"),
        "sampler": {"name": "random", "seed": 5}, "pruner": {"name": "none"},
        "params": {"optimizer.base_lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True},
                   "schedule.warmup_epochs": {"type": "int", "low": 0, "high": 3}}}))
    out = tmp_path / "study"
    command = [sys.executable, "-m", "common.hpo", "run", str(space), "--out", str(out), "--trials", "5", "--np", "1",
               "--launcher", f"{sys.executable} {tmp_path / 'launcher.py'}"]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONPATH": checkout_first_on_path()},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    from common.campaign.analysis.__main__ import searches
    assert searches([str(tmp_path)]) == []
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    [(title, prose, best, figs)] = searches([str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # read, not written
    assert title == "Hyperparameter search study" and "5 trials (5 complete)" in prose and "objective epochs" in prose
    assert "optimizer.base_lr" in prose.split("importances (fANOVA):")[1]
    trials = [json.loads(p.read_text()) for p in sorted(out.glob("runs/run_*/trial.json"))]
    fastest = min(trials, key=lambda t: t["epochs"])
    assert list(best["global_batch_size"]) == [8] and best["epochs"].iloc[0] == fastest["epochs"]
    assert best["optimizer.base_lr"].iloc[0] == fastest["params"]["optimizer.base_lr"]
    assert sorted(figs) == ["hpo_study_epochs_vs_batch.png", "hpo_study_history.png", "hpo_study_importance.png"]
    assert all(png.startswith(b"\x89PNG") for png in figs.values())
    journal = (out / "journal.log").read_bytes()
    (out / "report.md").unlink()
    again = subprocess.run([sys.executable, "-m", "common.hpo", "report", str(out)], cwd=REPO, capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": checkout_first_on_path()}, timeout=300)
    assert again.returncode == 0 and (out / "report.md").is_file(), again.stdout + again.stderr
    assert (out / "journal.log").read_bytes() == journal  # `report` reads the study too
    (out / "journal.log").unlink()
    with pytest.raises(BenchError, match=r"study: no journal.log, the study's journal"):
        searches([str(out)])
    assert not (out / "journal.log").exists()
