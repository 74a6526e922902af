"""train.emulate's rates, config checks and figures (common/storage/), and page-cache eviction on a real file."""
import os

import pytest

from common.base.errors import BenchError
from common.runtime.config import load_config, resolve
from common.storage import page_cache
from common.storage.accelerators import EmulateConfig, rate
from common.storage.emulate import emulation_summary
from cosmoflow.config import CosmoConfig, closed_differences
from cosmoflow.rcp import with_rcp
from tests.conftest import REPO

MINI = REPO / "cosmoflow/configs/cosmo_mini.yaml"


def test_rates_come_from_their_sources():
    samples_per_second, source = rate(EmulateConfig("h100"), "cosmoflow", 4)
    assert samples_per_second == pytest.approx(1 / 0.00350) and "MLPerf Storage" in source
    assert rate(EmulateConfig("a100"), "cosmoflow", 1)[0] == pytest.approx(1 / 0.00551)
    assert rate(EmulateConfig("h100-hpc"), "cosmoflow", 8)[0] == 206.7
    assert rate(EmulateConfig("h100-hpc"), "deepcam", 1)[0] == 30.0
    assert rate(EmulateConfig("a100-hpc"), "deepcam", 8)[0] == 40.8
    assert rate(EmulateConfig("custom", 12.5), "deepcam", 3) == (12.5, "train.emulate.samples_per_second")


def test_a_rate_its_source_does_not_have_is_refused_with_the_alternatives():
    with pytest.raises(BenchError, match="no rate for deepcam.*h100-hpc or a100-hpc or custom"):
        rate(EmulateConfig("h100"), "deepcam", 1)
    with pytest.raises(BenchError, match="train.local_batch_size 1 and 8 only .* not 2"):
        rate(EmulateConfig("a100-hpc"), "deepcam", 2)


@pytest.mark.parametrize("overrides, message", [
    (["train.emulate.accelerator=custom"], "samples_per_second = 0.0: expected samples/s > 0"),
    (["train.emulate.accelerator=h100", "train.emulate.samples_per_second=10"], "set only with accelerator=custom"),
    (["train.emulate.accelerator=b200"], "train.emulate.accelerator"),
])
def test_inconsistent_emulation_config_is_refused(overrides, message):
    with pytest.raises(BenchError, match=message):
        load_config(MINI, overrides, CosmoConfig)


def test_an_emulated_run_logs_open_and_reads_without_mapping_for_eviction():
    cfg = load_config(MINI, ["train.emulate.accelerator=h100", "mlperf.division=auto"], CosmoConfig)
    resolved = resolve(cfg, 2, with_rcp, closed_differences)
    assert resolved.mlperf.division == "open" and resolved.data.dali_mmap is False
    kept = resolve(load_config(MINI, ["train.emulate.accelerator=h100", "train.emulate.page_cache=keep"],
                               CosmoConfig), 2, with_rcp, closed_differences)
    assert kept.data.dali_mmap is True
    with pytest.raises(BenchError, match="train.emulate.accelerator=h100: steps emulated"):
        resolve(load_config(MINI, ["train.emulate.accelerator=h100", "mlperf.division=closed"], CosmoConfig), 2,
                with_rcp, closed_differences)


def test_evict_drops_a_files_pages_and_counts_them(tmp_path):
    path = tmp_path / "records" / "a.tfrecord"
    path.parent.mkdir()
    path.write_bytes(os.urandom(4 << 20))  # dirty pages: eviction writes them back first
    path.read_bytes()
    resident, pages = page_cache.resident_pages([path])
    assert pages == (4 << 20) // os.sysconf("SC_PAGE_SIZE") and resident > 0
    result = page_cache.evict(tmp_path / "records")
    assert result["files"] == 1 and result["resident_pages"] == 0 and not result["cached"], result
    assert path.read_bytes()  # unchanged, readable
    assert page_cache.resident_pages([path])[0] == pages


def _rank(rank, compute, wall, evictions=(), steps=10):
    return {"rank": rank, "au": compute / wall, "compute_seconds": compute, "wall_seconds": wall,
            "samples_per_second": 40 / wall, "input_wait_per_step_seconds": 0.01, "measured_steps": steps,
            "storage_mb_per_second": 5.0, "evictions": list(evictions)}


def test_summary_passes_on_the_overall_au_and_says_how_the_cache_was_kept():
    clean = {"resident_share": 0.0, "cached": False}
    ranks = [_rank(0, 7.5, 10.0, [clean]), _rank(1, 6.0, 10.0)]
    summary = emulation_summary("h100", 285.7, "src", "cosmoflow", 4, ranks)
    assert summary["au"] == pytest.approx(0.675) and summary["au_min"] == pytest.approx(0.6)
    assert summary["passes"] is False and summary["samples_per_second"] == pytest.approx(8.0)
    assert summary["storage_mb_per_second"] == 10.0 and summary["page_cache"].startswith("evicted")
    warm = emulation_summary("h100", 285.7, "src", "cosmoflow", 4,
                             [_rank(0, 8.0, 10.0, [{"resident_share": 0.4, "cached": True}])])
    assert warm["passes"] is True and warm["page_cache"].startswith("cached: up to 40%")
    deepcam = emulation_summary("h100-hpc", 30.0, "src", "deepcam", 1, [_rank(0, 8.0, 10.0)])
    assert deepcam["passes"] is None and deepcam["page_cache"] == "cached: train.emulate.page_cache=keep"


def _sweep_args(tmp_path, **given):
    import argparse
    from common.storage import sweep
    parser = argparse.ArgumentParser()
    sweep.add_arguments(parser)
    argv = ["--bench", "cosmoflow", "--accelerator", "h100", "--data", str(tmp_path / "data"), "--ranks", "1", "2",
            "--out", str(tmp_path / "out")]
    for key, value in given.items():
        argv += [f"--{key.replace('_', '-')}", *str(value).split()]
    return parser.parse_args(argv)


@pytest.mark.parametrize("given, message", [
    ({}, "no manifest.json there"),
    ({"bench": "deepcam", "accelerator": "h100-hpc"}, "MLPerf Storage has no AU mark for deepcam"),
    ({"bench": "deepcam", "accelerator": "h100-hpc", "au_threshold": 0.9}, "no manifest.json there"),
])
def test_storage_sweep_refuses_a_missing_dataset_and_writes_nothing(tmp_path, given, message):
    from common.storage.sweep import storage_command
    with pytest.raises(BenchError, match=message):
        storage_command(_sweep_args(tmp_path, **given), [])
    assert not (tmp_path / "out").exists()


def test_storage_sweep_checks_its_arguments(tmp_path):
    from common.storage.sweep import check_args
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text('{"format": "cosmoflow-tfrecord"')
    with pytest.raises(BenchError, match="manifest.json"):
        check_args(_sweep_args(tmp_path))
    with pytest.raises(BenchError, match="--samples-per-second 0.0: expected > 0 with --accelerator custom"):
        check_args(_sweep_args(tmp_path, accelerator="custom"))


def test_the_largest_passing_count_is_the_answer():
    from common.storage.sweep import largest_passing, row_line
    rows = [{"ranks": 1, "passes": True}, {"ranks": 2, "passes": True}, {"ranks": 4, "passes": False},
            {"ranks": 8, "passes": False, "error": "exit 137; see train.log"}]
    assert largest_passing(rows) == 2 and largest_passing(rows[2:]) == 0
    assert "failed, exit 137" in row_line(rows[3])
