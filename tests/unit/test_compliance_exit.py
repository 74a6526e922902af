"""`python -m common.campaign.compliance RUN_DIR`'s exit codes (common/base/exits.py), with the real checker:
5 when it refuses a log, 2 when there is no log."""
import json

from common.base import exits
from common.campaign import compliance


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
