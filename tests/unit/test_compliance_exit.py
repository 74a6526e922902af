"""`python -m common.campaign.compliance RUN_DIR`'s exit codes (common/base/exits.py), with the real checker:
5 when it refuses a log, 2 when there is no log."""
import json

from common.base import exits
from common.campaign import compliance
from tests.conftest import REPO


def test_a_log_the_checker_refuses_exits_5_and_records_its_verdict(tmp_path, capsys):
    event = {"namespace": "", "time_ms": 1, "event_type": "INTERVAL_START", "key": "init_start", "value": None,
             "metadata": {"file": "train.py", "lineno": 1}}
    (tmp_path / "mlperf.log").write_text(f":::MLLOG {json.dumps(event)}\n")  # no submission keys, no run
    assert compliance.main([str(tmp_path)]) == exits.CHECKER_FAILED == 5
    assert "FAILED" in capsys.readouterr().out
    assert json.loads((tmp_path / "compliance.json").read_text())["passed"] is False


def test_no_log_is_bad_input_exit_2(tmp_path, capsys):
    assert compliance.main([str(tmp_path)]) == exits.BAD_INPUT
    assert f"MLPerf log {tmp_path / 'mlperf.log'} does not exist" in " ".join(capsys.readouterr().err.split())


def _fixture_log(path, accuracy=None, without=()):
    """The committed DeepCAM log (it passes: IoU 0.8269 in epoch 7) with every eval_accuracy set to
    `accuracy` and the events `without` left out."""
    lines = []
    for line in (REPO / "tests/data/deepcam_mlperf.log").read_text().splitlines():
        event = json.loads(line.split(":::MLLOG ", 1)[1])
        if event["key"] in without:
            continue
        if accuracy is not None and event["key"] == "eval_accuracy":
            event["value"] = accuracy
        lines.append(":::MLLOG " + json.dumps(event))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_checker_without_the_target_tells_a_missed_target_from_any_other_failure(tmp_path, capsys):
    passed = compliance.check_log(_fixture_log(tmp_path / "a.log"))
    assert passed.passed and passed.passed_without_target and not passed.only_target_failed
    missed = compliance.check_log(_fixture_log(tmp_path / "b.log", accuracy=0.5))
    assert not missed.passed and missed.only_target_failed
    assert missed.target_checks == (("eval_accuracy", "v['value'] >= 0.82 and v['value'] <= 1."),)
    broken = compliance.check_log(_fixture_log(tmp_path / "c.log", accuracy=0.5, without=("init_stop",)))
    assert not broken.passed and not broken.passed_without_target and not broken.only_target_failed
    (tmp_path / "run").mkdir()
    _fixture_log(tmp_path / "run/mlperf.log", accuracy=0.5)
    assert compliance.main([str(tmp_path / "run")]) == exits.CHECKER_FAILED
    assert "misses only the quality target" in capsys.readouterr().out
    assert json.loads((tmp_path / "run/compliance.json").read_text())["passed_without_target"] is True
