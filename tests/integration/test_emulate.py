"""Emulated accelerators over the real input path (common/storage/): a 2-rank horovodrun CosmoFlow run whose
steps wait an H100's time builds no model, reads every training sample once per epoch from a dataset evicted
from the page cache before each epoch, reports accelerator utilisation, and logs open division with a log the
real compliance checker fails on the quality target only."""
import json

import pytest

from common.campaign.compliance import check_log
from common.campaign.summary import read_summary
from tests.conftest import REPO, horovodrun, log_events, show
from tests.integration.cosmo_fixtures import write_config

pytestmark = pytest.mark.slow


def test_emulated_h100_run_reads_real_input_and_reports_au(cosmo_dataset, tmp_path):
    data, out = cosmo_dataset, tmp_path / "run"  # eviction reads and changes nothing
    cfg = write_config(tmp_path / "c.yaml", data, out, train={"max_epochs": 2, "local_batch_size": 4,
                                                               "emulate": {"accelerator": "h100"}})
    proc = horovodrun(2, [REPO / "cosmoflow/train.py", cfg])
    assert proc.returncode == 1, show(proc)  # an emulated run never reaches its target
    summary = json.loads((out / "summary.json").read_text())
    emulation = summary["emulation"]
    assert emulation["accelerator"] == "h100" and emulation["accelerators"] == 2
    assert emulation["samples_per_second_per_accelerator"] == pytest.approx(1 / 0.00350)
    assert 0 < emulation["au"] <= 1 and emulation["au_threshold"] == 0.7
    assert emulation["passes"] == (emulation["au"] >= 0.7)
    # Delivered samples/s cannot exceed what two emulated H100s consume.
    assert 0 < emulation["samples_per_second"] <= 2 / 0.00350
    ranks = emulation["per_rank"]
    assert [r["rank"] for r in ranks] == [0, 1]
    # 64 training samples in batches of 4 over 2 ranks: 8 steps an epoch, each epoch's first not measured.
    assert all(r["measured_steps"] == 2 * 7 for r in ranks), ranks
    assert all(r["emulated_seconds_all_steps"] == pytest.approx(16 * 4 * 0.00350) for r in ranks), ranks
    # One node: local rank 0 evicts before each epoch, and the files left the page cache.
    evictions = ranks[0]["evictions"]
    assert len(evictions) == 2 and not ranks[1]["evictions"], ranks
    assert all(e["resident_share"] == 0 and e["files"] > 0 for e in evictions), evictions
    assert emulation["page_cache"].startswith("evicted before every epoch"), emulation
    assert all(r["read_bytes"] > 0 for r in ranks), ranks  # read from storage, not the page cache
    # No model: the precision is not probed, and the evaluation scores zeros (MAE far from the target).
    assert summary["precision"]["precision"] == "float32" and "emulated" in summary["precision"]["reason"]
    assert summary["final_metric"] > 0.124
    events = log_events(out / "mlperf.log")
    values = {e["key"]: e["value"] for e in events}
    assert values["submission_division"] == "open" and values["emulated_accelerator"] == "h100"
    assert values["train_samples"] == 64
    assert [e["key"] for e in events].count("eval_stop") == 2
    checked = check_log(out / "mlperf.log")
    assert not checked.passed and checked.only_target_failed, checked.output
    # A campaign of emulated runs reads their summaries through its strict schema.
    assert read_summary(out / "summary.json").emulation["accelerators"] == 2
