"""The loader benchmark's figures: bytes per sample, per-rank and total rates, the training ratio."""
import sys
from pathlib import Path

import pytest

from common.io.manifest import FileEntry

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import loader_throughput as lt  # noqa: E402  (a script beside harness.py, not a package)


def entry(records: int, nbytes: int) -> FileEntry:
    return FileEntry(path="train/x.tfrecord", records=records, bytes=nbytes, sha256="0" * 64, index=None,
                     index_sha256=None)


def test_bytes_per_sample_is_file_bytes_over_records():
    assert lt.bytes_per_sample([entry(4, 400), entry(1, 150)]) == pytest.approx(110.0)


def test_total_rate_is_all_samples_over_the_slowest_rank():
    fig = lt.loader_figures([2.0, 4.0], samples_per_rank=8, sample_bytes=1e6)
    assert fig["rank_samples_per_second"] == pytest.approx([4.0, 2.0])
    assert fig["rank_mb_per_second"] == pytest.approx([4.0, 2.0])
    assert fig["samples_per_second"] == pytest.approx(4.0) and fig["mb_per_second"] == pytest.approx(4.0)


def test_training_rate_matches_shape_and_ranks():
    cosmo = {"date": "d", "runs": [{"size": 128, "ranks": 1, "local_batch": 4, "threads_per_rank": 2,
                                    "samples_per_second": 1.5},
                                   {"size": 32, "ranks": 1, "local_batch": 4, "threads_per_rank": 2,
                                    "samples_per_second": 60.0}]}
    deepcam = {"runs": [{"input_shape": [96, 144, 16], "ranks": 2, "local_batch": 4, "threads_per_rank": 1,
                         "samples_per_second": 37.0, "width": 0.125}]}
    assert lt.training_rate(cosmo, "cosmoflow", (32, 32, 32, 4), 1)["samples_per_second"] == 60.0
    assert lt.training_rate(deepcam, "deepcam", [96, 144, 16], 2)["width"] == 0.125
    assert lt.training_rate(deepcam, "deepcam", [96, 144, 16], 1) is None
    assert lt.training_rate({}, "cosmoflow", (128, 128, 128, 4), 1) is None


def test_goal_is_judged_on_one_core_only():
    training = {"samples_per_second": 2.0}
    assert lt.compare(10.0, training, 1) == {"ratio_to_training": 5.0, "meets_goal": True}
    assert lt.compare(9.0, training, 1)["meets_goal"] is False
    assert lt.compare(9.0, training, 2) == {"ratio_to_training": 4.5, "meets_goal": None}
    assert lt.compare(9.0, None, 1) == {"ratio_to_training": None, "meets_goal": None}


def test_dali_is_compared_with_tfdata_of_the_same_case_and_ranks():
    runs = [{"app": "deepcam", "case": "mini", "ranks": 1, "loader": "tfdata", "samples_per_second": 100.0},
            {"app": "deepcam", "case": "mini", "ranks": 2, "loader": "tfdata", "samples_per_second": 50.0},
            {"app": "deepcam", "case": "mini", "ranks": 1, "loader": "dali", "samples_per_second": 150.0},
            {"app": "cosmoflow", "case": "mini", "ranks": 1, "loader": "dali", "samples_per_second": 1.0}]
    assert lt.dali_over_tfdata(runs, runs[2]) == pytest.approx(1.5)
    assert lt.dali_over_tfdata(runs, runs[0]) is None and lt.dali_over_tfdata(runs, runs[3]) is None


@pytest.mark.parametrize("key", sorted(lt.CASES))
def test_case_datasets_give_whole_batches_on_one_and_two_ranks(key):
    case, cfg = lt.CASES[key], lt.load_case_config(*key)
    batch = cfg.train.local_batch_size
    for ranks in (1, 2):
        assert case.train_samples % (ranks * batch) == 0 and case.val_samples % (ranks * batch) == 0


def test_other_load_is_the_machine_busy_time_less_our_cores():
    assert lt.other_load(machine_busy=30.0, seconds=10.0, own_cores=2.0) == pytest.approx(1.0)
    assert lt.other_load(machine_busy=19.0, seconds=10.0, own_cores=2.0) == 0.0  # windows differ slightly


def test_batch_time_summary():
    summary = lt.batch_time_summary([0.3, 0.1, 0.2, 0.4, 10.0])
    assert summary["batches"] == 5 and summary["min"] == 0.1 and summary["median"] == 0.3 and summary["max"] == 10.0
