"""Scores with their bootstrap intervals, and two campaigns compared (common/campaign/uncertainty.py).

Campaigns are built as in test_scoring.py: a real DeepCAM log with run_start .. run_stop stretched to chosen
minutes."""
import json

import numpy as np
import pytest

from common.base.errors import BenchError
from common.campaign import scoring, uncertainty
from common.campaign.run import main as campaign_main
from common.campaign.scoring import RunScore, olympic_minutes
from tests.unit.test_scoring import make_campaign


def as_runs(minutes: list[float], failed: int) -> list[RunScore]:
    runs = [RunScore(index=i, seed=i, status="success", compliant=True, problems=[], run_start_ms=0.0,
                     run_stop_ms=m * 60_000, division="open", nodes=1, scale=1) for i, m in enumerate(minutes)]
    return runs + [RunScore(index=len(minutes) + i, seed=0, status="aborted", compliant=False, problems=["x"],
                            run_start_ms=None, run_stop_ms=None, division="open", nodes=1, scale=1)
                   for i in range(failed)]


@pytest.mark.parametrize("failed", [0, 1, 2])
@pytest.mark.parametrize("count", [2, 3, 5, 10])
def test_the_vectorised_olympic_mean_is_the_scorings(count, failed):
    minutes = list(np.random.default_rng(count).uniform(10, 20, size=count))
    ours = uncertainty.olympic_means(np.asarray([minutes]), failed)
    theirs, _ = olympic_minutes(as_runs(minutes, failed))
    assert (ours is None) == (theirs is None)
    if theirs is not None:
        assert ours[0] == pytest.approx(theirs)


def test_an_interval_holds_the_score_within_the_runs_values_and_is_repeatable():
    minutes = [10.0, 11.0, 12.0, 13.0, 14.0]
    interval = uncertainty.olympic_interval(minutes, failed=0)
    assert 10.0 <= interval.low < 12.0 < interval.high <= 14.0
    assert uncertainty.olympic_interval(minutes, failed=0) == interval  # seeded: a score does not drift
    assert uncertainty.olympic_interval([12.0] * 5, failed=0) == \
        uncertainty.Interval(12.0, 12.0, 0.95, uncertainty.RESAMPLES)
    narrow = uncertainty.olympic_interval(minutes, failed=0, confidence=0.5)
    assert interval.low <= narrow.low < narrow.high <= interval.high


def test_too_few_runs_give_no_interval_and_a_bad_confidence_is_refused():
    assert uncertainty.olympic_interval([10.0, 11.0], failed=0).low is None  # both dropped
    assert uncertainty.olympic_interval([], failed=1).low is None
    with pytest.raises(BenchError, match="confidence 95.0: expected a fraction"):
        uncertainty.olympic_interval([10.0, 11.0, 12.0], failed=0, confidence=95.0)


def test_the_interval_covers_the_true_olympic_mean_of_simulated_campaigns_most_of_the_time():
    """Campaigns of 10 runs drawn from one distribution: the 95% interval should hold the distribution's
    olympic mean in most of them (a percentile bootstrap of 10 values undercovers somewhat)."""
    rng = np.random.default_rng(1)
    truth = float(uncertainty.olympic_means(np.sort(rng.normal(30, 2, size=(200_000, 10))), 0).mean())
    hits = 0
    for k in range(200):
        runs = list(rng.normal(30, 2, size=10))
        interval = uncertainty.olympic_interval(runs, failed=0, resamples=2000, seed=k)
        hits += interval.low <= truth <= interval.high
    assert 0.8 <= hits / 200 <= 0.99, hits


def test_score_md_and_json_carry_the_intervals_and_the_epochs_to_converge(tmp_path):
    make_campaign(tmp_path, [(0, 10, True), (20, 12, True), (40, 11, True), (60, 14, True), (80, 13, True)])
    result = scoring.score_campaign(tmp_path)
    saved = json.loads((tmp_path / "score.json").read_text())
    interval = saved["score_interval"]
    assert 10 <= interval["low"] < result.score_minutes < interval["high"] <= 14
    assert interval["confidence"] == 0.95 and "bootstrap" in interval["method"]
    epochs = {r["epochs"] for r in saved["runs"]}
    assert len(epochs) == 1 and isinstance(epochs.pop(), int)  # the same log, stretched: its last evaluation
    assert saved["epochs_mean"] == saved["runs"][0]["epochs"]
    text = (tmp_path / "score.md").read_text()
    assert f"- 95% interval of the time to train: [{interval['low']:.3f}, {interval['high']:.3f}] min" in text
    assert "- epochs to converge (olympic mean of the compliant runs):" in text


def test_compare_says_which_campaign_is_faster_only_when_the_interval_excludes_zero(tmp_path, capsys):
    fast = [(0, 10, True), (20, 12, True), (40, 11, True), (60, 14, True), (80, 13, True)]
    make_campaign(tmp_path / "a", fast)
    make_campaign(tmp_path / "b", [(s, m + 10, ok) for s, m, ok in fast])
    make_campaign(tmp_path / "c", [(s, m + 0.5, ok) for s, m, ok in fast])
    for name in "abc":
        scoring.score_campaign(tmp_path / name)
    capsys.readouterr()
    assert campaign_main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    text = capsys.readouterr().out
    assert "A - B: -10.000 min" in text and "A is faster" in text and "do not overlap" in text
    text = uncertainty.compare(tmp_path / "c", tmp_path / "a")
    assert "A - B: +0.500 min" in text and "no difference shown" in text and "intervals overlap" in text


def test_compare_refuses_what_it_cannot_compare(tmp_path):
    make_campaign(tmp_path / "a", [(0, 10, True), (20, 12, True), (40, 11, True)])
    make_campaign(tmp_path / "t", [(0, 10, True), (0, 12, True)], mode="throughput")
    for name in "at":
        scoring.score_campaign(tmp_path / name)
    with pytest.raises(BenchError, match=r"score\.json: no such file; score the campaign first"):
        uncertainty.compare(tmp_path / "a", tmp_path / "missing")
    with pytest.raises(BenchError, match="a throughput campaign; compare compares time-to-train campaigns"):
        uncertainty.compare(tmp_path / "a", tmp_path / "t")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "score.json").write_text("{}")
    with pytest.raises(BenchError, match=r"broken/score\.json: not a campaign score \(KeyError"):
        uncertainty.compare(tmp_path / "a", broken)
