"""Staging inside real 2-rank trainings: packed sources, the three modes, the MLPerf log and the I/O report."""
import json
import sys

import pytest

from common.campaign.compliance import check_log
from tests.conftest import REPO, horovodrun, log_events, run_cmd, show
from tests.integration import cosmo_fixtures
from tests.integration.test_deepcam_e2e import TINY as DEEPCAM_TINY
from tests.integration.test_deepcam_e2e import make_dataset as make_deepcam_dataset
from tests.integration.test_deepcam_e2e import write_config as write_deepcam_config

pytestmark = pytest.mark.slow
COSMO_TRAIN, DEEPCAM_TRAIN = REPO / "cosmoflow/train.py", REPO / "deepcam/train.py"


def pack(src, out, *args):
    proc = run_cmd([sys.executable, "-m", "data_prep", "pack", "--input", src, "--out", out, "--workers", 1, *args])
    assert proc.returncode == 0, show(proc)
    return out


@pytest.fixture(scope="module")
def cosmo(cosmo_dataset, tmp_path_factory):
    packed = tmp_path_factory.mktemp("cosmo-staging") / "packed"
    return cosmo_dataset, pack(cosmo_dataset, packed, "--compression", "zstd", "--archives", 2)


def _cosmo_run(tmp_path, data_dir, name, **data):
    out = tmp_path / name
    cfg = cosmo_fixtures.write_config(tmp_path / f"{name}.yaml", data_dir, out,
                                      data={"shuffle_buffer": 8, "stage_dir": str(tmp_path / "local"), **data},
                                      train={"max_epochs": 2, "target": 1e-6})
    proc = horovodrun(2, [COSMO_TRAIN, cfg])
    assert proc.returncode == 1, show(proc)  # the target is out of reach: two full epochs
    return out, proc


def test_packed_node_share_staging_is_timed_inside_the_run_and_reported(cosmo, tmp_path):
    _, packed = cosmo
    out, proc = _cosmo_run(tmp_path, packed, "share", stage_mode="node_share", stage_timing="in_run")
    keys = [e["key"] for e in log_events(out / "mlperf.log")]
    assert keys.index("run_start") < keys.index("staging_start") < keys.index("staging_stop") \
        < keys.index("train_samples") < keys.index("epoch_start")
    assert check_log(out / "mlperf.log").structural_problems == ()
    report = json.loads((out / "io_report.json").read_text())
    staging = report["staging"]
    assert staging["mode"] == "node_share" and staging["source_kind"] == "packed" and staging["staging_ranks"] == 1
    assert staging["files"] == 24 and staging["compression_ratio"] > 1.2  # int16 counts compress well
    assert report["staging_seconds_over_mean_epoch_seconds"] > 0
    assert [r["planned"]["train_records"] for r in report["ranks"]] == [64, 64]  # 2 epochs x 8 steps x 4
    assert all(r["measured"]["rchar"] > 0 for r in report["ranks"])
    assert json.loads((out / "summary.json").read_text())["io"] == report
    assert "staged into" in proc.stdout


def test_rank_and_node_staging_train_on_identical_data(cosmo, tmp_path):
    plain, packed = cosmo
    node_out, _ = _cosmo_run(tmp_path, plain, "node", stage_mode="node")
    rank_out, _ = _cosmo_run(tmp_path, packed, "rank", stage_mode="rank")
    direct = tmp_path / "direct"
    cfg = cosmo_fixtures.write_config(tmp_path / "direct.yaml", plain, direct, data={"shuffle_buffer": 8},
                                      train={"max_epochs": 2, "target": 1e-6})
    assert horovodrun(2, [COSMO_TRAIN, cfg]).returncode == 1
    histories = [[h["mae"] for h in json.loads((o / "summary.json").read_text())["history"]]
                 for o in (node_out, rank_out, direct)]
    assert histories[0] == histories[1] == histories[2]
    rank_report = json.loads((rank_out / "io_report.json").read_text())["staging"]
    assert rank_report["staging_ranks"] == 2 and rank_report["files"] == 24  # each rank its own 12


def test_staging_before_the_run_precedes_init_and_passes_the_checker(cosmo, tmp_path):
    _, packed = cosmo
    out, _ = _cosmo_run(tmp_path, packed, "before", stage_mode="node", stage_timing="before_run")
    keys = [e["key"] for e in log_events(out / "mlperf.log")]
    assert keys[:2] == ["staging_start", "staging_stop"] and keys[2] == "init_start"
    assert check_log(out / "mlperf.log").structural_problems == ()


def test_a_packed_dataset_without_a_stage_dir_is_refused(cosmo, tmp_path):
    _, packed = cosmo
    cfg = cosmo_fixtures.write_config(tmp_path / "c.yaml", packed, tmp_path / "run", data={"shuffle_buffer": 8})
    proc = horovodrun(2, [COSMO_TRAIN, cfg])
    assert proc.returncode == 2 and f"data.dir {packed} is a packed dataset (pack.json)" in proc.stderr, show(proc)


def test_deepcam_stages_a_gzip_pack_per_rank_and_trains(tmp_path):
    records = make_deepcam_dataset(tmp_path / "dc", 32, 48, train=16, validation=8)
    packed = pack(records, tmp_path / "packed", "--compression", "gzip", "--archives", 2, "--layout", "contiguous")
    out = tmp_path / "run"
    cfg = write_deepcam_config(tmp_path / "c.yaml", "deepcam_mini.yaml", packed, out, DEEPCAM_TINY | {
        "train": {**DEEPCAM_TINY["train"], "target": 1.0},  # not reached (test_deepcam_e2e.py says why)
        "data": {**DEEPCAM_TINY["data"], "stage_dir": str(tmp_path / "local"), "stage_mode": "rank"}})
    proc = horovodrun(2, [DEEPCAM_TRAIN, cfg])
    assert proc.returncode == 1 and "not reached in 2 epochs" in proc.stdout, show(proc)
    report = json.loads((out / "io_report.json").read_text())
    assert report["staging"]["compression"] == "gzip" and report["staging"]["staging_ranks"] == 2
    assert check_log(out / "mlperf.log").structural_problems == ()


def test_a_staging_killed_with_sigkill_is_not_complete_and_resumes(tmp_path):
    import os
    import signal
    import subprocess
    import time
    from common.io.manifest import MANIFEST_NAME
    from common.io.staging import STAGED_NAME, TEMP_MARK, open_source, staged_dir
    from tests.unit.test_staging import make_dataset
    data = make_dataset(tmp_path / "data", file_bytes=8_000_000)  # 12 files of 8 MB: long enough to interrupt
    packed = pack(data, tmp_path / "packed", "--compression", "gzip", "--level", "1", "--archives", 1)
    dest = staged_dir(tmp_path / "local", open_source(packed), "node")
    cmd = [sys.executable, "-m", "data_prep", "stage", "--input", str(packed), "--stage-dir", str(tmp_path / "local"),
           "--threads", "1"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        finished = [p for p in dest.rglob("*.tfrecord")] if dest.exists() else []
        if len(finished) >= 2:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "staging finished before it could be killed"
    assert not (dest / MANIFEST_NAME).exists() and not (dest / STAGED_NAME).exists()
    killed_with = len(list(dest.rglob("*.tfrecord")))
    resumed = run_cmd(cmd + ["--reuse", "--json"])
    assert resumed.returncode == 0, show(resumed)
    figures = json.loads(resumed.stdout)
    assert figures["files_reused"] >= killed_with >= 2 and figures["files"] + figures["files_reused"] == 25
    assert not list(dest.rglob(f"*{TEMP_MARK}*"))
    for path in data.rglob("*"):
        if path.is_file() and path.name != MANIFEST_NAME:
            assert (dest / path.relative_to(data)).read_bytes() == path.read_bytes()
