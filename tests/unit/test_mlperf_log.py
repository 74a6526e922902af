"""The MLPerf-log reader: good lines, junk lines, a half-written last line, and a published v1.0 result."""
from pathlib import Path

import pytest

from common.base import mlperf_log
from common.base.errors import BenchError

DATA = Path(__file__).resolve().parents[1] / "data"
# MLPerf HPC v1.0 results (Apache 2.0), ANL ThetaGPU OC20 run 1, unchanged: 143 events, then two lines its
# job script printed.
PUBLISHED = DATA / "published_v1.0_anl_thetagpu_oc20_result_1.txt"

GOOD = [':::MLLOG {"key": "run_start", "value": null, "time_ms": 10, "metadata": {}}',
        ':::MLLOG {"key": "eval_error", "value": 0.4, "time_ms": 20, "metadata": {"epoch_num": 1}}',
        ':::MLLOG {"key": "eval_error", "value": 0.3, "time_ms": 30, "metadata": {"epoch_num": 2}}']


def test_good_lines_give_their_events_in_order():
    events = mlperf_log.parse_lines(GOOD)
    assert [e["time_ms"] for e in events] == [10, 20, 30]
    assert [e["value"] for e in mlperf_log.events_by_key(events, "eval_error")] == [0.4, 0.3]
    assert mlperf_log.first_value(events, "eval_error") == 0.4
    assert mlperf_log.first_value(events, "run_stop", "none") == "none"
    assert mlperf_log.metadata(events[1]) == {"epoch_num": 1} and mlperf_log.metadata({"metadata": 3}) == {}


def test_junk_lines_are_skipped_and_a_launchers_rank_tag_is_read_through():
    lines = ["Total time taken = 12.5", "", ":::MLLOG [1, 2]", ":::MLLOG {broken", GOOD[0],
             "[1,0]<stdout>:" + GOOD[1], "WARNING: something"]
    assert [e["time_ms"] for e in mlperf_log.parse_lines(lines)] == [10, 20]
    assert mlperf_log.parse_line("no event here") is None and mlperf_log.parse_line(":::MLLOG 7") is None


def test_strict_reading_names_the_file_and_line_of_a_broken_event(tmp_path):
    log = tmp_path / "mlperf.log"
    log.write_text("banner\n" + GOOD[0] + "\n:::MLLOG {broken\n")
    with pytest.raises(BenchError, match=r"mlperf\.log:3: not a JSON MLPerf event: ':::MLLOG \{broken'"):
        mlperf_log.read_events(log, strict=True)
    assert len(mlperf_log.read_events(log)) == 1  # the tolerant reading skips it


def test_a_half_written_last_line_is_skipped(tmp_path):
    log = tmp_path / "mlperf.log"
    log.write_text("\n".join(GOOD) + "\n" + GOOD[0][:40])  # a training still writing its log
    assert [e["time_ms"] for e in mlperf_log.read_events(log)] == [10, 20, 30]


def test_an_unreadable_log_is_an_error_naming_it(tmp_path):
    with pytest.raises(BenchError, match=r"missing\.log: cannot read the MLPerf log"):
        mlperf_log.read_events(tmp_path / "missing.log")


def test_a_published_v1_0_result_reads_whole():
    events = mlperf_log.read_events(PUBLISHED, strict=True)  # the job script's two lines are not events
    assert len(events) == 143 and len(PUBLISHED.read_text().splitlines()) == 145
    assert mlperf_log.first_value(events, "submission_benchmark") == "oc20"
    assert mlperf_log.first_value(events, "global_batch_size") == 1024
    evals = mlperf_log.events_by_key(events, "eval_error")
    assert len(evals) == 24 and mlperf_log.metadata(evals[-1])["epoch_num"] == 24
    assert mlperf_log.metadata(mlperf_log.events_by_key(events, "run_stop")[0])["status"] == "success"
