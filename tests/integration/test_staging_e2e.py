"""Staging inside real 2-rank trainings: packed sources, the three modes, the MLPerf log and the I/O report."""
import json
import sys

import pytest

from common.campaign.compliance import check_log
from tests.conftest import REPO, log_events, run_cmd, show
from tests.integration import cosmo_fixtures
from tests.integration.deepcam_fixtures import pack, staged_two_rank_run

pytestmark = pytest.mark.slow
COSMO_TRAIN = REPO / "cosmoflow/train.py"


@pytest.fixture(scope="module")
def cosmo(cosmo_dataset, tmp_path_factory):
    packed = tmp_path_factory.mktemp("cosmo-staging") / "packed"
    return cosmo_dataset, pack(cosmo_dataset, packed, "--compression", "zstd", "--archives", 2)


@pytest.fixture(scope="module")
def runs(cosmo, cosmo_two_rank_run, tmp_path_factory):
    """The module's 2-rank CosmoFlow trainings: `share` stages the packed copy node_share, timed in the run;
    `rank` stages the packed copy, each rank its own share, inside init (the default stage_timing); `direct`
    reads the plain dataset where it lies (the session's `cosmo_two_rank_run`, of the same config). Each:
    (output directory, process). A plain dataset staged once per node (stage_mode=node): the hybrid run of
    test_mesh_train.py."""
    plain, packed = cosmo
    root = tmp_path_factory.mktemp("staging-runs")
    stage = {"stage_dir": str(root / "local")}
    return {"share": cosmo_fixtures.two_rank_run(root, packed, "share", **stage, stage_mode="node_share",
                                                 stage_timing="in_run"),
            "rank": cosmo_fixtures.two_rank_run(root, packed, "rank", **stage, stage_mode="rank"),
            "direct": cosmo_two_rank_run}


def test_packed_node_share_staging_is_timed_inside_the_run_and_reported(runs):
    out, proc = runs["share"]
    keys = [e["key"] for e in log_events(out / "mlperf.log")]
    assert keys.index("run_start") < keys.index("staging_start") < keys.index("staging_stop") \
        < keys.index("train_samples") < keys.index("epoch_start")
    assert check_log(out / "mlperf.log").only_target_failed
    report = json.loads((out / "io_report.json").read_text())
    staging = report["staging"]
    assert staging["mode"] == "node_share" and staging["source_kind"] == "packed" and staging["staging_ranks"] == 1
    assert staging["files"] == 24 and staging["compression_ratio"] > 1.2  # int16 counts compress well
    assert report["staging_seconds_over_mean_epoch_seconds"] > 0
    assert [r["planned"]["train_records"] for r in report["ranks"]] == [64, 64]  # 2 epochs x 8 steps x 4
    assert all(r["measured"]["rchar"] > 0 for r in report["ranks"])
    assert json.loads((out / "summary.json").read_text())["io"] == report
    assert "staged into" in proc.stdout


def test_each_rank_staging_its_share_of_a_packed_copy_trains_as_the_data_read_in_place(runs):
    histories = [[h["mae"] for h in json.loads((runs[name][0] / "summary.json").read_text())["history"]]
                 for name in ("rank", "direct")]
    assert len(histories[0]) == 2 and histories[0] == histories[1]
    rank_report = json.loads((runs["rank"][0] / "io_report.json").read_text())["staging"]
    assert rank_report["source_kind"] == "packed" and rank_report["staging_ranks"] == 2
    assert rank_report["files"] == 24  # each rank its own 12


def test_staging_by_default_is_inside_init_with_its_bytes_and_rate_and_passes_the_checker(runs):
    out, proc = runs["rank"]
    events = log_events(out / "mlperf.log")
    keys = [e["key"] for e in events]
    assert keys[0] == "init_start" and keys.index("init_start") < keys.index("staging_start") \
        < keys.index("staging_stop") < keys.index("init_stop") < keys.index("run_start")
    meta = events[keys.index("staging_stop")]["metadata"]
    report = json.loads((out / "io_report.json").read_text())["staging"]
    assert meta["staged_bytes"] > 0 and meta["staging_seconds"] > 0 and meta["staging_gb_per_second"] > 0
    assert "GB per node at" in proc.stdout and "of init" in proc.stdout  # the estimate, before staging
    assert report["files"] == 24
    assert check_log(out / "mlperf.log").only_target_failed


def test_a_packed_dataset_without_a_stage_dir_is_refused(cosmo, tmp_path):
    _, packed = cosmo
    cfg = cosmo_fixtures.write_config(tmp_path / "c.yaml", packed, tmp_path / "run", data={"shuffle_buffer": 8})
    proc = run_cmd([sys.executable, COSMO_TRAIN, cfg])  # one process: every rank reads data.dir alike
    error = " ".join(proc.stderr.split())  # the message is wrapped where the path's length puts it
    assert proc.returncode == 2 and f"data.dir {packed} is a packed dataset (pack.json)" in error, show(proc)


def test_deepcam_stages_a_gzip_pack_per_rank_and_trains(tmp_path_factory):
    """The 2-rank run of deepcam_fixtures.staged_two_rank_run (its log and summary: test_deepcam_e2e.py)."""
    out, proc = staged_two_rank_run(tmp_path_factory)
    assert "not reached in 2 epochs" in proc.stdout, show(proc)
    report = json.loads((out / "io_report.json").read_text())
    assert report["staging"]["compression"] == "gzip" and report["staging"]["staging_ranks"] == 2
    assert report["staging"]["mode"] == "rank" and report["staging"]["source_kind"] == "packed"
    # Each rank stages its own share, into a directory of its own: 7 of the pack's 14 files each.
    shares = [(r["staging"]["scope"], r["staging"]["files"]) for r in report["ranks"]]
    assert shares == [("rank-00000-of-00002", 7), ("rank-00001-of-00002", 7)] and report["staging"]["files"] == 14
    assert check_log(out / "mlperf.log").only_target_failed


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
