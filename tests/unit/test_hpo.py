"""The hyperparameter search's parts on tiny inputs: the space file, the evaluations read from a growing MLPerf
log, the objective, stale trials, the best settings per batch and the report (common/hpo)."""
import json
import os
import time
from pathlib import Path

import optuna
import pytest
import yaml

from common.base import documents
from common.base.errors import BenchError
from common.hpo import report
from common.hpo.space import load_space, override
from common.hpo.study import StudySettings, open_study, requeue_stale, saved_settings
from common.hpo.trial import EvalReader, Launch, TrialResult, _result, objective, trial_dir
from common.campaign.summary import Summary
from tests.conftest import REPO

CONFIG = str(REPO / "cosmoflow/configs/cosmo_mini.yaml")
SPACE = {"benchmark": "cosmoflow", "config": CONFIG, "overrides": ["train.max_epochs=6"],
         "params": {"optimizer.base_lr": {"type": "float", "low": 0.001, "high": 0.05, "log": True},
                    "schedule.warmup_epochs": {"type": "int", "low": 0, "high": 2},
                    "schedule.decay_epochs": {"type": "categorical", "choices": [[4, 5], [2, 3]]}},
         "enqueue": [{"optimizer.base_lr": 0.01, "schedule.warmup_epochs": 1, "schedule.decay_epochs": [4, 5]}]}


def write_space(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({**SPACE, **changes}, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    """SPACE, read and checked once (each check plans several configs with the application's dry run)."""
    return load_space(write_space(tmp_path_factory.mktemp("space")))


def test_a_space_file_is_read_with_its_defaults(space):
    assert space.objective == "epochs" and space.sampler == "tpe" and space.pruner == "median"
    assert [p.name for p in space.params] == list(SPACE["params"])
    assert space.params[2].choices == ([4, 5], [2, 3]) and space.params[1].kind == "int"
    assert override("schedule.decay_epochs", [4, 5]) == "schedule.decay_epochs=[4, 5]"
    assert override("optimizer.base_lr", 0.01) == "optimizer.base_lr=0.01"


@pytest.mark.parametrize("changes, message", [
    ({"objective": "loss"}, r"key objective = 'loss': expected one of \['epochs', 'time'\]"),
    ({"colour": 1}, r"unknown key\(s\) colour; valid keys: benchmark, config, params"),
    ({"params": {"optimizer.base_lr": {"type": "float", "low": 0.1, "high": 0.01}}, "enqueue": []}, r"key params.optimizer.base_lr.high = 0.01: expected a number above low \(0.1\)"),
    ({"params": {"optimizer.no_such_key": {"type": "float", "low": 0.1, "high": 0.2}}, "enqueue": []}, r"optimizer.no_such_key=0.1 makes no valid config: .*unknown key\(s\) optimizer.no_such_key"),
    ({"params": {"train.local_batch_size": {"type": "int", "low": 0, "high": 4}}, "enqueue": []},
     r"the trial setting train.local_batch_size=0 makes no valid config"),
    ({"params": {"run.seed": {"type": "int", "low": 0, "high": 4}}, "enqueue": []}, r"key params.run.seed = 'run.seed': expected a dotted config key"),
    ({"enqueue": [{"optimizer.base_lr": 0.5, "schedule.warmup_epochs": 1, "schedule.decay_epochs": [4, 5]}]},
     r"key enqueue\[0\].optimizer.base_lr = 0.5: expected a number in \[0.001, 0.05\]"),
    ({"enqueue": [{"optimizer.base_lr": 0.01}]}, r"key enqueue\[0\] = \['optimizer.base_lr'\]: expected every parameter"),
    ({"overrides": ["run.seed=3"]}, r"override 'run.seed=3': expected key=value of a key the search does not set"),
    ({"failure_penalty": 0.5}, r"key failure_penalty = 0.5: expected >= 1"),
])
def test_a_bad_space_is_refused_naming_the_file_and_the_key(tmp_path, changes, message):
    with pytest.raises(BenchError, match=message) as err:
        load_space(write_space(tmp_path, **changes))
    assert str(tmp_path / "space.yaml") in str(err.value)


def test_a_missing_or_broken_space_file_is_refused(tmp_path):
    with pytest.raises(BenchError, match="no such file"):
        load_space(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("params: [")
    with pytest.raises(BenchError, match="not readable YAML"):
        load_space(tmp_path / "bad.yaml")


def mllog(key: str, value, **metadata) -> str:
    return ":::MLLOG " + json.dumps({"key": key, "value": value, "time_ms": 0, "metadata": metadata}) + "\n"


def test_evaluations_are_read_as_the_log_grows_whole_lines_only(tmp_path):
    log = tmp_path / "mlperf.log"
    reader = EvalReader(log)
    assert reader.new() == []  # not written yet
    log.write_text(mllog("eval_error", 0.5, epoch_num=1) + mllog("epoch_stop", None, epoch_num=1))
    assert reader.new() == [(1.0, 0.5)]
    with open(log, "a") as f:
        f.write(mllog("eval_accuracy", 0.75, epoch_num=2.5) + mllog("eval_error", 0.3, epoch_num=3)[:30])
    assert reader.new() == [(2.5, 0.25)]  # DeepCAM's IoU as 1 - IoU; the half-written line waits
    with open(log, "a") as f:
        f.write(mllog("eval_error", 0.3, epoch_num=3)[30:])
    assert reader.new() == [(3.0, 0.3)]


def result(**fields) -> TrialResult:
    base = dict(number=0, params={}, state="complete", value=None, status="success", epochs=5.0, seconds=30.0,
                global_batch_size=8, exit_code=0, wall_seconds=40.0)
    return TrialResult(**{**base, **fields})


def test_the_objective_is_epochs_or_time_to_the_target_and_a_miss_scores_the_penalty(tmp_path, space):
    assert objective(space, result(), max_epochs=6) == 5.0
    assert objective(space, result(status="aborted", epochs=None, seconds=None), max_epochs=6) == 12.0
    timed = load_space(write_space(tmp_path, objective="time", failure_penalty=3))
    assert objective(timed, result(), 6) == 30.0
    assert objective(timed, result(status="aborted", epochs=None, seconds=None), 6) == 120.0


def fake_run(out: Path, number: int, status: str, epochs: float, batch: int = 8, code: int = 0) -> Path:
    directory = trial_dir(out, number)
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump({"train": {"max_epochs": 6}}))
    summary = Summary(benchmark="cosmoflow", status=status, reason="", time_to_train_seconds=10.0 * epochs, epochs=None,
                      metric_name="eval_error", final_metric=0.3, target=0.3, ranks=1, nodes=1, threads_per_rank=1,
                      gpu=False, horovod=None, train_samples=8, eval_samples=8, loader="tfdata", history=[], config={})
    documents.write(directory / "summary.json", summary)
    (directory / "mlperf.log").write_text(mllog("global_batch_size", batch) +
                                          mllog("eval_error", 0.3, epoch_num=epochs))
    return directory


def test_a_trials_result_comes_from_its_run_directory(tmp_path, space):
    fake_run(tmp_path, 0, "success", 4)
    hit = _result(space, trial_dir(tmp_path, 0), 0, {}, 0, 50.0, None)
    assert (hit.state, hit.value, hit.epochs, hit.seconds, hit.global_batch_size) == ("complete", 4.0, 4, 40.0, 8)
    fake_run(tmp_path, 1, "failure", 6, code=1)
    miss = _result(space, trial_dir(tmp_path, 1), 1, {}, 1, 50.0, None)
    assert (miss.state, miss.value, miss.epochs, miss.seconds) == ("complete", 12.0, None, None)
    pruned = _result(space, trial_dir(tmp_path, 1), 1, {}, 1, 50.0, 2.0)
    assert (pruned.state, pruned.value, pruned.pruned_at_epoch) == ("pruned", None, 2.0)
    fake_run(tmp_path, 2, "aborted", 1, code=2)
    with pytest.raises(BenchError, match=r"trial 2 was refused its input or config \(exit 2\)"):
        _result(space, trial_dir(tmp_path, 2), 2, {}, 2, 5.0, None)


def settings(trials: int = 3) -> StudySettings:
    return StudySettings(trials=trials, launch=Launch(1, "{python}/horovodrun -np {np} -H localhost:{np}"))


def test_a_trial_whose_worker_went_silent_is_failed_and_its_settings_queued_again(tmp_path, space):
    out = tmp_path / "study"
    study = open_study(space, out, settings())
    lost = study.ask()  # the enqueued trial
    lost.set_user_attr("worker", "elsewhere-123")
    beat = out / "workers" / "elsewhere-123"
    beat.parent.mkdir(parents=True, exist_ok=True)
    beat.touch()
    assert requeue_stale(study, out, stale_minutes=1, me="here-1") == []  # beating: left alone
    os.utime(beat, (time.time() - 120, time.time() - 120))
    assert requeue_stale(study, out, stale_minutes=1, me="here-1") == [lost.number]
    assert study.trials[lost.number].state == optuna.trial.TrialState.FAIL
    again = study.ask()
    assert again.params == study.trials[lost.number].params and again.number != lost.number


def test_a_study_resumes_only_with_its_own_settings_and_its_saved_settings_read_back(tmp_path, space):
    out = tmp_path / "study"
    open_study(space, out, settings())
    open_study(space, out, settings(trials=5))  # more trials: allowed
    with pytest.raises(BenchError, match=r"a study started with other settings \(space differ"):
        open_study(load_space(write_space(tmp_path, seed=7)), out, settings())
    back, saved = saved_settings(out)
    assert back == space and saved.trials == 5
    with pytest.raises(BenchError, match="no hpo.json; not a study directory"):
        saved_settings(tmp_path / "nothing")


def test_the_report_keeps_the_best_hit_per_batch_and_writes_configs_one_can_train_with(tmp_path, space):
    out = tmp_path / "study"
    study = open_study(space, out, settings())
    runs = [("success", 5, 8, 0.01), ("success", 4, 8, 0.02), ("failure", 6, 8, 0.04), ("success", 3, 16, 0.03)]
    for number, (status, epochs, batch, lr) in enumerate(runs):
        trial = study.ask({"optimizer.base_lr": optuna.distributions.FloatDistribution(0.001, 0.05, log=True)}) \
            if number else study.ask()
        fake_run(out, trial.number, status, epochs, batch)
        record = _result(space, trial_dir(out, trial.number), trial.number,
                         {"optimizer.base_lr": lr, "schedule.warmup_epochs": 1, "schedule.decay_epochs": [4, 5]},
                         0, 30.0, None)
        (trial_dir(out, trial.number) / "trial.json").write_text(json.dumps(record.__dict__))
        study.tell(trial, record.value)
    best = report.best_per_batch(report.trials_table(study, space, out))
    assert best[["global_batch_size", "trial", "epochs"]].values.tolist() == [[8, 1, 4], [16, 3, 3]]
    path = report.write_report(study, space, out, ranks=1)
    text = path.read_text()
    assert "## Best settings per global batch size" in text and "best/cosmoflow_b16.yaml" in text
    config = yaml.safe_load((out / "best" / "cosmoflow_b8.yaml").read_text())
    assert config["optimizer"]["base_lr"] == 0.02 and config["schedule"]["decay_epochs"] == [4, 5]
    assert config["train"]["max_epochs"] == 6 and config["run"]["seed"] == space.seed
    assert (out / "figures" / "history.png").stat().st_size > 1000 and (out / "trials.csv").is_file()
