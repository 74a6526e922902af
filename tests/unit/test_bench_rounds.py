"""benchmarks/harness.py: the throughput benchmarks measure each row in rounds of alternating order, pool them,
and give the rank-count ratio per round, so that a drift in the machine's speed weighs on both rows alike."""
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import harness  # noqa: E402  (a script beside the benchmarks, not a package)


def _result(ranks: int, steps: list[float], batch: int = 4) -> dict:
    return {"ranks": ranks, "local_batch": batch, "threads_per_rank": 2 // ranks, "gflop_per_sample": 10.0,
            **harness.step_figures(steps, batch, ranks), "step_seconds": steps}


def test_rounds_alternate_their_order_so_each_pair_is_measured_back_to_back():
    assert harness.interleaved([1, 2], 1) == [1, 2]
    assert harness.interleaved([1, 2], 3) == [1, 2, 2, 1, 1, 2]
    with pytest.raises(ValueError, match="rounds 0: expected at least 1"):
        harness.interleaved([1, 2], 0)


def test_measure_rounds_takes_the_sgemm_rate_before_each_measurement_and_pools_each_key(monkeypatch):
    rates = iter([100.0, 90.0, 80.0, 70.0])
    monkeypatch.setattr(harness, "sgemm_gflops", lambda: next(rates))
    calls = []

    def measure(ranks):
        calls.append(ranks)
        return _result(ranks, [1.0 + len(calls)] * 3)

    pooled = harness.measure_rounds([1, 2], 2, measure)
    assert calls == [1, 2, 2, 1]
    one, two = pooled[1], pooled[2]
    assert [r["sgemm_gflops"] for r in one["rounds"]] == [100.0, 70.0]
    assert [r["sgemm_gflops"] for r in two["rounds"]] == [90.0, 80.0]
    assert one["sgemm_gflops"] == pytest.approx(85.0) and two["sgemm_gflops"] == pytest.approx(85.0)
    assert one["step_seconds"] == [2.0] * 3 + [5.0] * 3
    assert [r["median_step_seconds"] for r in one["rounds"]] == [2.0, 5.0]


def test_a_pooled_row_takes_its_figures_from_all_rounds_steps():
    row = harness.pool_rounds([{**_result(2, [1.0, 1.0, 3.0]), "sgemm_gflops": 100.0},
                               {**_result(2, [3.0, 3.0, 3.0]), "sgemm_gflops": 50.0}])
    assert row["median_step_seconds"] == 3.0
    assert row["samples_per_second"] == pytest.approx(8 / 3.0)
    assert row["achieved_gflops"] == pytest.approx(8 / 3.0 * 10.0)
    assert row["sgemm_gflops"] == 75.0
    assert [r["samples_per_second"] for r in row["rounds"]] == [8.0, pytest.approx(8 / 3.0)]


def test_the_rank_ratio_is_given_pooled_and_per_round_and_printed_under_the_table():
    one = harness.pool_rounds([{**_result(1, [1.0]), "sgemm_gflops": 1.0}, {**_result(1, [2.0]), "sgemm_gflops": 1.0}])
    two = harness.pool_rounds([{**_result(2, [2.0]), "sgemm_gflops": 1.0}, {**_result(2, [5.0]), "sgemm_gflops": 1.0}])
    ratio = harness.rank_ratio([one, two], ranks=2, base=1)
    # Pooled medians: 1.5 s (4 samples) against 3.5 s (8 samples).
    assert ratio["ratio"] == pytest.approx((8 / 3.5) / (4 / 1.5))
    assert ratio["per_round"] == [pytest.approx(1.0), pytest.approx(0.8)]
    assert harness.rank_ratio([one], ranks=2, base=1) is None
    line = harness.ratios_line([{"size": 32, **ratio}], lambda x: f"{x['size']}^3")
    assert "samples/s of 2 ranks over 1 rank(s)" in line and "32^3 0.86 (rounds 1.00, 0.80)" in line
    assert harness.ratios_line([], str) == ""


def test_the_note_under_a_table_gives_the_range_of_the_sgemm_rates_measured_in_the_run():
    rounds = [{"sgemm_gflops": 86.6}, {"sgemm_gflops": 142.0}]
    note = harness.measured_note({"date": "2026-11-27", "machine": "vm 2 cores", "cpu": "AMD EPYC, avx2",
                                  "sgemm_gflops": 114.3, "runs": [{"rounds": rounds}, {"rounds": rounds}]})
    assert "86.6-142.0 GFLOP/s, measured before each of the run's 4 measurements" in note
    assert "(AMD EPYC, avx2)" in note
    plain = harness.measured_note({"date": "2026-11-27", "machine": "vm 2 cores", "sgemm_gflops": 114.3})
    assert "114.3 GFLOP/s." in plain


def test_measure_groups_gives_each_group_its_rows_and_its_ratio_and_the_runs_mean_sgemm(monkeypatch):
    rates = iter([100.0, 80.0] * 4)
    monkeypatch.setattr(harness, "sgemm_gflops", lambda: next(rates))
    calls = []

    def measure(size, ranks):
        calls.append((size, ranks))
        return _result(ranks, [1.0 if ranks == 1 else 1.6])

    result = harness.measure_groups("size", [128, 32], [1, 2, 2], 2, measure)
    assert calls == [(128, 1), (128, 2), (128, 2), (128, 1), (32, 1), (32, 2), (32, 2), (32, 1)]
    assert [(r["ranks"], len(r["rounds"])) for r in result["runs"]] == [(1, 2), (2, 2), (1, 2), (2, 2)]
    assert [x["size"] for x in result["rank_ratios"]] == [128, 32]
    assert result["rank_ratios"][0]["ratio"] == pytest.approx((8 / 1.6) / 4)
    assert result["sgemm_gflops"] == pytest.approx(90.0) and result["rounds"] == 2
