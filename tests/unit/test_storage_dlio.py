"""The DLIO side-by-side benchmark's pure parts: DLIO's workload fitted to a dataset's training split, DLIO's
summary.json read, one count's figures. DLIO itself is not needed."""
import json
import sys
from pathlib import Path

import pytest

from common.base.errors import BenchError
from common.io.manifest import FileEntry
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import storage_dlio as sd  # noqa: E402  (a script beside harness.py, not a package)


def entry(name: str, sizes: list[int], indexed: bool) -> FileEntry:
    return FileEntry(path=f"train/{name}.tfrecord", records=len(sizes), bytes=sum(sizes), sha256="0" * 64,
                     index=f"train/{name}.tfrecord.idx" if indexed else None,
                     index_sha256="0" * 64 if indexed else None)


def write_index(root: Path, e: FileEntry, sizes: list[int]) -> None:
    """A DALI index as the converters write it: "offset size" per record."""
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    (root / "train").mkdir(exist_ok=True)
    (root / e.index).write_text("".join(f"{o} {s}\n" for o, s in zip(offsets, sizes)))


def test_record_sizes_come_from_the_indexes_else_each_files_mean(tmp_path):
    a, b = entry("a", [100, 120], indexed=True), entry("b", [90, 110], indexed=False)
    write_index(tmp_path, a, [100, 120])
    assert sd.record_sizes(tmp_path, [a, b]) == [100, 120, 100, 100]


def test_an_index_with_another_record_count_is_refused(tmp_path):
    a = entry("a", [100, 120], indexed=True)
    write_index(tmp_path, a, [100, 120, 80])
    with pytest.raises(BenchError, match=r"a\.tfrecord\.idx: 3 lines, expected 2"):
        sd.record_sizes(tmp_path, [a])


def test_the_workload_has_the_splits_files_records_and_the_accelerators_time_per_batch():
    files = [entry(str(i), [100, 120, 110, 130], indexed=False) for i in range(6)]
    sizes = [100, 120, 110, 130] * 6
    w = sd.fit_workload(files, sizes, "h100", local_batch=4, read_threads=2, prefetch=3)
    assert (w.num_files_train, w.num_samples_per_file) == (6, 4)
    assert (w.record_length, w.record_length_stdev) == (115, 11)  # mean 115, population stdev 11.18
    assert w.computation_time == pytest.approx(4 * 0.00350)
    assert (w.batch_size, w.read_threads, w.prefetch_size) == (4, 2, 3)
    a100 = sd.fit_workload(files, sizes, "a100", local_batch=8, read_threads=4, prefetch=2)
    assert a100.computation_time == pytest.approx(8 * 0.00551)


def test_files_of_different_record_counts_give_the_mean_count_rounded():
    files = [entry("a", [10] * 8, indexed=False), entry("b", [10] * 7, indexed=False)]
    assert sd.fit_workload(files, [10] * 15, "h100", 4, 2, 2).num_samples_per_file == 8


def test_a_split_without_records_or_sizes_is_refused():
    with pytest.raises(BenchError, match="0 files, 0 records and 0 record sizes"):
        sd.fit_workload([], [], "h100", 4, 2, 2)
    with pytest.raises(BenchError, match="1 files, 2 records and 1 record sizes"):
        sd.fit_workload([entry("a", [5, 5], indexed=False)], [5], "h100", 4, 2, 2)


def test_the_overrides_name_dlios_own_workload_and_every_fitted_value(tmp_path):
    w = sd.Workload("a100", 16, 8, 262210, 0, 4, 0.02204, 2, 2)
    data = w.dataset_overrides(tmp_path / "d")
    assert data[0] == "workload=cosmoflow_a100"
    assert {f"++workload.dataset.data_folder={tmp_path / 'd'}", "++workload.dataset.num_files_train=16",
            "++workload.dataset.num_samples_per_file=8", "++workload.dataset.record_length=262210",
            "++workload.dataset.record_length_stdev=0"} <= set(data)
    assert {"++workload.reader.batch_size=4", "++workload.reader.read_threads=2",
            "++workload.train.computation_time=0.02204", "++workload.train.epochs=1",
            "++workload.workflow.generate_data=False"} <= set(w.train_overrides(1))


# DLIO 2.0.0's summary.json as rank 0 wrote it for 2 ranks and 3 epochs (host_cpuinfo and host_meminfo left out):
# per epoch, AU in percent (the mean over ranks) and samples/s (the sum over ranks).
SUMMARY = {
    "start": "2026-12-06T05:31:06.673849", "num_accelerators": 2, "num_hosts": 1, "hostname": "vm",
    "metric": {"train_au_percentage": [70.39662655736744, 70.76755795750788, 77.26056360606827],
               "train_au_mean_percentage": 72.80824937364787, "train_au_meet_expectation": "success",
               "train_au_stdev_percentage": 3.1519014413591204,
               "train_throughput_samples_per_second": [302.0788916792117, 344.24377131618337, 388.01221341150995],
               "train_throughput_mean_samples_per_second": 344.778292135635,
               "train_throughput_stdev_samples_per_second": 35.08416765785283,
               "train_io_mean_MB_per_second": 86.19983393314178, "train_io_stdev_MB_per_second": 8.771577256376933},
    "num_files_train": 16, "num_files_eval": 0, "num_samples_per_file": 8, "host_cpu_count": [2],
    "host_processor_name": "", "potential_caching": [1], "host_memory_GB": [23.54029083251953],
    "data_size_per_host_GB": 0.03125190734863281, "epochs": 3, "end": "2026-12-06T05:31:09.682381"}


def test_dlios_summary_gives_au_as_a_fraction_and_samples_per_second_per_epoch(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))
    found = sd.parse_dlio_summary(tmp_path)
    assert found["accelerators"] == 2
    assert found["au_per_epoch"] == pytest.approx([0.7039662655736744, 0.7076755795750788, 0.7726056360606827])
    assert found["samples_per_second_per_epoch"] == SUMMARY["metric"]["train_throughput_samples_per_second"]
    assert found["au_meets_expectation"] == "success" and found["potential_caching"] == [1]


def test_a_run_without_a_summary_or_its_metrics_says_so(tmp_path):
    with pytest.raises(sd.DlioUnavailable, match="DLIO wrote no summary .*mpirun.log"):
        sd.parse_dlio_summary(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({**SUMMARY, "metric": {}}))
    with pytest.raises(sd.DlioUnavailable, match="no metric.train_au_percentage or metric.train_throughput"):
        sd.parse_dlio_summary(tmp_path)


def test_a_counts_figures_pool_its_runs_epochs():
    w = sd.Workload("h100", 16, 8, 262210, 0, 4, 0.014, 2, 2)
    runs = [{"au_per_epoch": [0.6], "samples_per_second_per_epoch": [300.0]},
            {"au_per_epoch": [0.8], "samples_per_second_per_epoch": [340.0]}]
    row = sd.dlio_row(runs, 2, w)
    assert row["au"] == pytest.approx(0.7) and row["samples_per_second"] == pytest.approx(320.0)
    assert row["au_per_epoch"] == [0.6, 0.8]
    assert row["samples_per_second_from_au"] == pytest.approx(0.7 * 2 / 0.00350)


def test_dlios_data_goes_beside_the_dataset_unless_told(tmp_path):
    args = sd.parse_args(["--data", str(tmp_path / "set"), "--ranks", "4", "1", "4"])
    assert args.dlio_data == (tmp_path / "set-dlio").resolve() and args.ranks == [1, 4] and args.epochs == 3
    with pytest.raises(SystemExit):
        sd.parse_args(["--data", "d", "--epochs", "0"])
    with pytest.raises(SystemExit):
        sd.parse_args(["--data", "d", "train.local_batch_size"])


def test_the_performance_table_gives_both_sides_verdicts_and_the_largest_passing_count_per_accelerator():
    def count(ranks, suite_au, dlio):
        return {"ranks": ranks, "suite": {"au": suite_au, "samples_per_second": 200.0 * ranks,
                                          "storage_mb_per_second": 50.0 * ranks}, "dlio": dlio}
    result = {"accelerator": "a100", "seconds_per_sample": 0.00551, "epochs": 2, "suite_train_samples": 8192,
              "date": "2026-12-06", "machine": "vm 2 cores", "cpu": "Intel Xeon, avx512f", "commit": "abc1234",
              "workload": {"num_files_train": 1024, "num_samples_per_file": 8, "batch_size": 4},
              "counts": [count(1, 0.87, {"au": 0.9, "samples_per_second": 160.0}),
                         count(2, 0.76, {"au": 0.69, "samples_per_second": 250.0}),
                         count(4, 0.55, {"ranks": 4, "error": "mpirun: exit 1"})]}
    text = sd.doc_table([result])
    assert "| a100 (181.5/s) | 1 | 0.870 | 200.0 | 50.0 | 0.900 | 160.0 | yes, yes |" in text
    assert "| a100 (181.5/s) | 2 | 0.760 | 400.0 | 100.0 | 0.690 | 250.0 | yes, no |" in text
    assert "| a100 (181.5/s) | 4 | 0.550 | 800.0 | 200.0 | failed | failed | no, failed |" in text
    assert "a100: largest passing count: suite 2, DLIO 1. 1024 files x 8 samples (8192 an epoch)" in text
    assert "Measured 2026-12-06 on vm 2 cores (Intel Xeon, avx512f)" in text
