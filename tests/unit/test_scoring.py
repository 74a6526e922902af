"""Campaign scoring on logs with known answers.

The logs are a real DeepCAM mini run's MLPerf log (tests/data/deepcam_mlperf.log, `make demo`, open
division) with its times moved and stretched so that run_start .. run_stop lasts a chosen number of
minutes; a failed run has every eval_accuracy below the target and status aborted. Each test checks the
score against the known answer; score_campaign also makes mlperf-logging's result summariser score the
written layout and refuses to finish when the two differ.
"""
import json
import re
from pathlib import Path

import pytest

from common.base import mlperf_log
from common.campaign import run as campaign, scoring
from common.campaign.run import CampaignSpec, open_campaign, run_dir
from common.base.errors import BenchError
from tests.conftest import summary_fields

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "deepcam_mlperf.log"
T0 = 1_800_000_000_000  # ms


def write_log(path: Path, start_ms: float, minutes: float, seed: int, success: bool = True) -> None:
    """The fixture with run_start at `start_ms`, run_stop `minutes` later, everything else in proportion."""
    events = mlperf_log.read_events(FIXTURE, strict=True)
    times = {e["key"]: e["time_ms"] for e in events if e["key"] in ("run_start", "run_stop")}
    first, scale = times["run_start"], minutes * 60_000 / (times["run_stop"] - times["run_start"])
    lines = []
    for e in events:
        e["time_ms"] = round(start_ms + (e["time_ms"] - first) * scale)
        if e["key"] == "seed":
            e["value"] = seed
        if not success and e["key"] == "eval_accuracy":
            e["value"] = 0.5
        if not success and e["key"] == "run_stop":
            e["metadata"]["status"] = "aborted"
        lines.append(":::MLLOG " + json.dumps(e))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def make_campaign(out: Path, runs: list[tuple[float, float, bool]], mode: str = "time_to_train") -> CampaignSpec:
    """A finished campaign whose run i started at runs[i][0] minutes after T0 and lasted runs[i][1]."""
    spec = CampaignSpec(benchmark="deepcam", config="deepcam/configs/deepcam_mini.yaml", mode=mode, runs=len(runs),
                        ranks=1, system="testbox")
    open_campaign(out, spec)
    for i, (start, minutes, success) in enumerate(runs):
        write_log(run_dir(out, i) / "mlperf.log", T0 + start * 60_000, minutes, spec.seed_of(i), success)
        summary = summary_fields(status="success" if success else "aborted")
        (run_dir(out, i) / "summary.json").write_text(json.dumps(summary))
        campaign.finish_run(spec, out, i, 0 if success else 1, ["train"], 0.0)
    return spec


def test_olympic_mean_drops_the_fastest_and_the_slowest(tmp_path):
    make_campaign(tmp_path, [(0, 10, True), (20, 12, True), (40, 11, True), (60, 14, True), (80, 13, True)])
    result = scoring.score_campaign(tmp_path)
    assert result.score_minutes == pytest.approx(12.0, abs=1e-6)
    assert result.summariser_minutes == pytest.approx(result.score_minutes, abs=1e-9)
    assert result.valid and result.reason == "" and result.division == "open"
    assert [r.counted for r in result.runs] == [False, True, True, False, True]
    assert result.package_checker["passed"], result.package_checker
    layout = tmp_path / "submission"
    assert sorted(p.name for p in (layout / "results/testbox/strong/deepcam").iterdir()) == \
        [f"result_{i}.txt" for i in range(5)]
    system = json.loads((layout / "systems/testbox.json").read_text())
    assert system["system_name"] == "testbox" and system["division"] == "open"
    assert (layout / "benchmarks/deepcam/implementations/hpc-sciml-bench/code_version.json").is_file()
    saved = json.loads((tmp_path / "score.json").read_text())
    assert saved["score_minutes"] == pytest.approx(12.0, abs=1e-6)
    assert re.search(r"time to train \(olympic mean\) 12\.000 min", (tmp_path / "score.md").read_text())


def test_one_failed_run_is_dropped_as_the_slowest_two_leave_no_score(tmp_path):
    make_campaign(tmp_path / "one", [(0, 10, True), (20, 12, True), (40, 11, True), (60, 14, False), (80, 13, True)])
    one = scoring.score_campaign(tmp_path / "one")
    # Compliant 10, 11, 12, 13: the fastest goes, the failure takes the slowest's place: mean(11, 12, 13).
    assert one.score_minutes == pytest.approx(12.0, abs=1e-6) and one.valid
    assert [r.compliant for r in one.runs] == [True, True, True, False, True]
    assert any("eval_accuracy" in p or "eval_" in p for p in one.runs[3].problems)
    assert one.package_checker["passed"]  # one failure is accepted under olympic scoring
    make_campaign(tmp_path / "two", [(0, 10, True), (20, 12, False), (40, 11, True), (60, 14, False), (80, 13, True)])
    two = scoring.score_campaign(tmp_path / "two")
    assert two.score_minutes is None and two.summariser_minutes is None and not two.valid
    assert "2 runs failed" in two.reason
    assert not two.package_checker["passed"]


def test_a_run_without_a_log_counts_as_failed_and_keeps_its_result_file(tmp_path):
    make_campaign(tmp_path, [(0, 10, True), (20, 12, True), (40, 11, True), (60, 14, True), (80, 13, True)])
    (run_dir(tmp_path, 4) / "mlperf.log").unlink()
    result = scoring.score_campaign(tmp_path)
    assert not result.runs[4].compliant and "no MLPerf log" in result.runs[4].problems[0]
    # Compliant 10, 11, 12, 14; the failure takes the slowest's place, so only the fastest goes.
    assert result.score_minutes == pytest.approx((11 + 12 + 14) / 3, abs=1e-6) and result.valid
    assert (tmp_path / "submission/results/testbox/strong/deepcam/result_4.txt").read_bytes() == b""


def test_throughput_is_the_span_from_the_first_start_to_the_last_stop(tmp_path):
    make_campaign(tmp_path, [(0, 10, True), (1, 12, True), (2, 11, True), (0.5, 14, True), (1.5, 13, True)],
                  mode="throughput")
    result = scoring.score_campaign(tmp_path)
    assert result.score_minutes == pytest.approx(14.5, abs=1e-6)
    assert result.summariser_minutes == pytest.approx(14.5, abs=1e-6) and result.valid
    assert (tmp_path / "submission/results/testbox/weak/deepcam/result_4.txt").is_file()


def test_a_throughput_campaign_short_of_the_rules_count_is_scored_but_not_valid(tmp_path):
    make_campaign(tmp_path, [(0, 10, True), (1, 12, True)], mode="throughput")
    result = scoring.score_campaign(tmp_path)
    assert result.score_minutes == pytest.approx(13.0, abs=1e-6)
    assert result.summariser_minutes is None and not result.valid
    assert "2 instances converged; the rules ask for at least 5" in result.reason


def test_an_unfinished_campaign_is_not_scored(tmp_path):
    make_campaign(tmp_path, [(0, 10, True), (20, 12, True)])
    (run_dir(tmp_path, 1) / campaign.RUN_RECORD).unlink()
    with pytest.raises(BenchError, match=r"run_001: this run has not finished; resume the campaign"):
        scoring.score_campaign(tmp_path)
