"""RCP files from the suite's own runs, round-tripped through mlperf-logging's RCP checker (common/campaign/rcps.py).

Campaigns are built as in test_scoring.py from a real DeepCAM log; each run's last evaluation is moved to a
chosen epoch, which is what the RCP checker reads as the run's epochs to converge."""
import json
import re
from pathlib import Path

import pytest

from common.base import exits
from common.base.errors import BenchError
from common.campaign import rcps, scoring
from common.campaign.run import main as campaign_main, run_dir
from tests.unit.test_scoring import make_campaign


def campaign_with_epochs(out: Path, epochs: list[int], minutes: float = 10.0) -> Path:
    """A scored DeepCAM campaign whose run i converged at epoch epochs[i]."""
    make_campaign(out, [(20 * i, minutes + i, True) for i in range(len(epochs))])
    for i, epoch in enumerate(epochs):
        log = run_dir(out, i) / "mlperf.log"
        lines = log.read_text().splitlines()
        last = max(n for n, line in enumerate(lines) if '"key": "eval_accuracy"' in line)
        event = json.loads(lines[last][len(":::MLLOG "):])
        event["metadata"]["epoch_num"] = epoch
        lines[last] = ":::MLLOG " + json.dumps(event)
        log.write_text("\n".join(lines) + "\n")
    scoring.score_campaign(out)
    return out


def test_an_rcp_file_from_a_campaign_round_trips_through_mlperf_loggings_checker(tmp_path, capsys):
    reference = campaign_with_epochs(tmp_path / "ref", [8, 9, 9, 10, 9])
    out = tmp_path / "rcps_deepcam_mine.json"
    assert campaign_main(["rcp", str(reference), "--out", str(out), "--label", "mine"]) == 0
    said = capsys.readouterr().out
    assert "deepcam_mine_" in said and "the rules ask a reference for 10" in said  # 5 runs, not 10
    records = json.loads(out.read_text())
    (name, record), = records.items()
    assert record["Benchmark"] == "deepcam" and name == f"deepcam_mine_{record['BS']}"
    assert record["Epochs to converge"] == [8, 9, 9, 9, 10]
    assert record["Hyperparams"]["global_batch_size"] == record["BS"] and "opt_name" in record["Hyperparams"]
    # the official checker reads the file, and the campaign it came from passes against it
    from mlperf_logging.rcp_checker.rcp_checker import RCP_Checker
    with open(out) as f:
        checker = RCP_Checker("hpc", "3.0.0", "deepcam", False, f)
    assert checker.rcp_data[name]["RCP Mean"] == pytest.approx(9.0)
    assert campaign_main(["rcp-check", str(reference), "--rcps", str(out)]) == 0
    assert re.search(r"RCP checker: passed: RCP found, RCP test PASSED", capsys.readouterr().out)
    # a campaign converging in far fewer epochs than the reference fails it
    fast = campaign_with_epochs(tmp_path / "fast", [3, 3, 4, 3, 3])
    verdict = rcps.check_campaign(fast, out)
    assert not verdict["passed"] and "RCP test FAILED" in verdict["message"]
    assert campaign_main(["rcp-check", str(fast), "--rcps", str(out)]) == exits.CHECKER_FAILED == 5


def test_runs_that_did_not_converge_are_left_out_and_too_few_are_refused(tmp_path):
    campaign = campaign_with_epochs(tmp_path / "c", [8, 9, 10])
    log = run_dir(campaign, 1) / "mlperf.log"
    log.write_text(log.read_text().replace('"status": "success"', '"status": "aborted"'))
    with pytest.raises(BenchError, match=r"deepcam_local_\d+: 2 converged runs at global batch \d+ .*at least 3"):
        rcps.build_rcps([campaign])
    campaign_with_epochs(tmp_path / "d", [7, 8, 9])
    records, notes = rcps.build_rcps([campaign, tmp_path / "d"])
    assert sorted(next(iter(records.values()))["Epochs to converge"]) == [7, 8, 8, 9, 10]
    assert "(1 not converged, left out)" in notes[0]


def test_runs_with_other_hyperparameters_at_one_batch_are_refused(tmp_path):
    campaign_with_epochs(tmp_path / "a", [8, 9, 9])
    other = campaign_with_epochs(tmp_path / "b", [8, 9, 9])
    for i in range(3):
        log = run_dir(other, i) / "mlperf.log"
        log.write_text(re.sub(r'("key": "opt_lr", "value": )[0-9.e-]+', r"\g<1>0.5", log.read_text()))
    with pytest.raises(BenchError, match=r"differ in opt_lr \(opt_lr: 0\.5 against .*one set of hyperparameters"):
        rcps.build_rcps([tmp_path / "a", other])


def test_bad_input_names_the_file(tmp_path):
    with pytest.raises(BenchError, match=r"no finished run with an MLPerf log"):
        rcps.build_rcps([tmp_path])
    campaign = campaign_with_epochs(tmp_path / "c", [8, 9, 9])
    with pytest.raises(BenchError, match=r"--rcps .*missing\.json: no such file"):
        rcps.check_campaign(campaign, tmp_path / "missing.json")
    with pytest.raises(BenchError, match=r"--label 'a b'"):
        rcps.write_rcps([campaign], tmp_path / "x.json", label="a b")
    log = run_dir(campaign, 0) / "mlperf.log"
    log.write_text(log.read_text() + ":::MLLOG {broken\n")
    with pytest.raises(BenchError, match=r"mlperf\.log:\d+: not a JSON MLPerf event"):
        rcps.build_rcps([campaign])
