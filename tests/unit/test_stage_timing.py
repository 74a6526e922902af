"""When staging happens and what the log then says (issue 47 §1): data.stage_timing in_init (the default),
in_run and before_init, the old name before_run refused, a data.dir in RAM making the run open, and the estimate
of init's length (common/io/stage_rate.py) in a run and in `jobs render`. The order inside real 2-rank trainings:
tests/integration/test_staging_e2e.py."""
import json
import subprocess
import sys

import pytest

from common.base.errors import BenchError
from common.base.files import ram_filesystem
from common.io import stage_rate
from common.runtime.config import data_differences, load_config, resolve
from common.runtime.dist import DistEnv, StopRequests
from common.runtime.run import Run
from cosmoflow.config import CosmoConfig, closed_differences
from cosmoflow.rcp import with_rcp
from jobs.render import Job, init_estimate, render
from jobs.site import load_site
from tests.conftest import REPO
from tests.unit.test_staging import make_dataset

REFERENCE = REPO / "cosmoflow/configs/cosmo.yaml"
MINI = REPO / "cosmoflow/configs/cosmo_mini.yaml"


def _reference(*overrides):
    return load_config(REFERENCE, list(overrides), CosmoConfig)


def test_staging_is_in_init_by_default_and_the_old_before_run_is_refused_naming_before_init():
    assert _reference().data.stage_timing == "in_init"
    with pytest.raises(BenchError) as err:
        _reference("data.stage_timing=before_run")
    assert "data.stage_timing" in str(err.value) and "'before_run'" in str(err.value)
    assert "before_init (the old name before_run" in str(err.value)
    with pytest.raises(BenchError, match="one of \\('in_init', 'in_run', 'before_init'\\)"):
        _reference("data.stage_timing=later")
    with pytest.raises(BenchError, match="data.stage_rate_gb_s"):
        _reference("data.stage_rate_gb_s=-1")


def test_staging_before_init_and_a_data_dir_in_ram_make_the_run_open_with_the_reason(tmp_path):
    assert data_differences(_reference(f"data.dir={tmp_path}", "data.stage_dir=/dev/shm").data) == []
    before = _reference(f"data.dir={tmp_path}", f"data.stage_dir={tmp_path}/s", "data.stage_timing=before_init")
    assert data_differences(before.data) == [
        "data.stage_timing before_init (staging before init_start, untimed and unlogged; the rules' order stages "
        "inside init: in_init)"]
    assert data_differences(_reference("data.stage_timing=before_init").data) == []  # nothing staged
    if ram_filesystem("/dev/shm") != "tmpfs":
        pytest.skip("/dev/shm is not a tmpfs here")
    in_ram = _reference("data.dir=/dev/shm")
    found = data_differences(in_ram.data)
    assert len(found) == 1 and "data.dir /dev/shm is on tmpfs, in RAM" in found[0] and "durable" in found[0]
    said = []
    resolved = resolve(in_ram, 128, with_rcp, closed_differences, announce=said.append)
    assert resolved.mlperf.division == "open" and "data.dir /dev/shm is on tmpfs" in said[0]
    assert resolve(_reference(f"data.dir={tmp_path}"), 128, with_rcp, closed_differences).mlperf.division == "closed"
    with pytest.raises(BenchError, match="mlperf.division=closed, but .*tmpfs"):
        resolve(_reference("data.dir=/dev/shm", "mlperf.division=closed"), 128, with_rcp, closed_differences)


def test_ram_filesystem_reads_the_type_of_the_resolved_path(tmp_path):
    assert ram_filesystem(tmp_path / "missing") == ""
    if ram_filesystem("/dev/shm") == "tmpfs":
        link = tmp_path / "link"
        link.symlink_to("/dev/shm")
        assert ram_filesystem(link) == "tmpfs"


def _staged_run(tmp_path, timing):
    data = make_dataset(tmp_path / "data")
    cfg = load_config(MINI, [f"run.output_dir={tmp_path}/run", f"data.dir={data}", f"data.stage_dir={tmp_path}/s",
                             f"data.stage_timing={timing}", "data.stage_mode=node", "system.enabled=false",
                             "tensorboard.enabled=false", "mlperf.platform=test"], CosmoConfig)
    return cfg, Run.open("cosmoflow", cfg, DistEnv(), StopRequests())


def _keys(out):
    return [json.loads(line.split(":::MLLOG ", 1)[1])["key"] for line in (out / "mlperf.log").read_text().splitlines()]


def test_a_run_staging_before_init_stages_without_logging_it(tmp_path, capsys):
    cfg, run = _staged_run(tmp_path, "before_init")
    with run:
        data = run.stage(lambda *_: [], "before_init")
        run.init_start()
        assert run.stage(lambda *_: [], "in_init") == data  # staged once
    assert run.staging.files == 25 and data.dir == run.staging.dir  # 12 record files, their indexes, the aux file
    assert "staging_start" not in _keys(tmp_path / "run") and _keys(tmp_path / "run")[0] == "init_start"
    out = capsys.readouterr().out
    assert "data.stage_timing=before_init" in out and "before init_start" in out


def test_a_run_staging_in_init_logs_its_bytes_and_rate_after_an_estimate(tmp_path, capsys):
    cfg, run = _staged_run(tmp_path, "in_init")
    with run:
        run.stage(lambda *_: [], "before_init")
        run.init_start()
        run.stage(lambda *_: [], "in_init")
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in
              (tmp_path / "run/mlperf.log").read_text().splitlines()]
    keys = [e["key"] for e in events]
    assert keys[0] == "init_start" and keys.index("staging_start") < keys.index("staging_stop")
    meta = events[keys.index("staging_stop")]["metadata"]
    assert meta["staged_bytes"] == run.staging.bytes_written > 480_000 and meta["staging_seconds"] >= 0
    assert meta["staging_gb_per_second"] >= 0
    out = capsys.readouterr().out
    assert out.index("staging 0.000 GB per node") < out.index("staged into")
    assert "of init" in out and "warning" not in out


def _results(tmp_path, rates):
    path = tmp_path / "staging_throughput.json"
    path.write_text(json.dumps({"date": "2026-11-25", "machine": "vm 2 cores", "cores": 2, "cases": [
        {"method": m, "source": s, "mode": mode, "write_gb_per_second": r} for m, s, mode, r in rates]}))
    return path


def test_the_measured_rate_is_the_slowest_staging_case_of_the_source_and_mode(tmp_path):
    path = _results(tmp_path, [("staging", "plain", "node", 2.9), ("staging", "plain", "node", 2.5),
                               ("staging", "zstd", "node", 0.6), ("cp -r", "plain", "node", 0.1),
                               ("staging", "plain", "rank", 2.2)])
    assert stage_rate.measured("plain", "node", path).gb_s == 2.5
    assert stage_rate.measured("plain", "node_share", path).gb_s == 2.5  # stages as node does
    assert stage_rate.measured("zstd", "rank", path) is None
    assert "2026-11-25, vm 2 cores" in stage_rate.measured("plain", "rank", path).source
    assert stage_rate.measured("plain", "node", tmp_path / "missing.json") is None
    assert stage_rate.rate(4.0, "plain", "node").source == "data.stage_rate_gb_s"


def test_the_estimate_warns_only_when_staging_in_init_passes_25_minutes():
    at = stage_rate.Rate(1.0, "data.stage_rate_gb_s")
    line, late = stage_rate.estimate(1500e9, at, "in_init")  # exactly 25 minutes
    assert not late and "about 25.0 min of init" in line
    line, late = stage_rate.estimate(1600e9, at, "in_init")
    assert late and "past 25 minutes" in line and "within 30 minutes of init_start" in line
    assert not stage_rate.estimate(1600e9, at, "in_run")[1]  # timed in the run: init is not at stake
    line, late = stage_rate.estimate(1e9, None, "in_init")
    assert not late and "no rate" in line and "data.stage_rate_gb_s" in line


def test_jobs_render_estimates_init_for_the_sites_dataset_and_node_count(tmp_path):
    site = load_site("perlmutter")
    line, late = init_estimate(site, Job(bench="deepcam", nodes=1))
    assert late and "GB per node" in line and "past 25 minutes" in line
    assert not init_estimate(site, Job(bench="deepcam", nodes=64))[1]  # node_share: 1/64 each
    assert init_estimate(site, Job(bench="deepcam", nodes=1, overrides=("data.stage_timing=in_run",))) == ("", False)
    path = tmp_path / "fast.yaml"
    path.write_text((REPO / "jobs/sites/perlmutter.yaml").read_text() + "stage_rate_gb_s: 100\n")
    fast = load_site(str(path))
    line, late = init_estimate(fast, Job(bench="deepcam", nodes=1))
    assert not late and f"site file {path}: stage_rate_gb_s" in line
    assert '"data.stage_rate_gb_s=100"' in render(fast, Job(bench="deepcam", nodes=1))
    proc = subprocess.run([sys.executable, "-m", "jobs", "render", "--site", "perlmutter", "--bench", "deepcam",
                           "--nodes", "1"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr.startswith("warning: staging") and "#SBATCH" in proc.stdout
