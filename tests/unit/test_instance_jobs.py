"""A throughput result's instances as separate jobs (jobs/instances.py) and their shared start
(common/campaign/start.py): one script per instance with its own recorded seed, and a wait before the training
starts, at a moment or at a barrier on the shared file system."""
import json
import subprocess
import threading
import time

import pytest

from common.base.errors import BenchError
from common.campaign import start
from common.campaign.run import main as campaign_main
from jobs.__main__ import main as jobs_main
from jobs.site import example_sites, load_site

NEVER = lambda: False  # noqa: E731  (no stop request)


def render_instances(tmp_path, *extra, site="perlmutter", instances=3, nodes=4):
    out = tmp_path / "tp.sh"
    code = jobs_main(["render", "--site", site, "--bench", "cosmoflow", "--nodes", str(nodes), "--instances", str(instances),
                      "--separate-jobs", "--out", str(out), *extra])
    return code, out


def test_every_instance_gets_a_job_of_its_own_nodes_and_a_seed_no_other_instance_has(tmp_path):
    code, _ = render_instances(tmp_path)
    assert code == 0
    manifest = json.loads((tmp_path / "tp-instances.json").read_text())
    assert [j["seed"] for j in manifest["jobs"]] == [1000, 1001, 1002]
    assert manifest["campaign_dir"] == "$OUTPUT_ROOT/throughput-cosmoflow-perlmutter-n4x3"
    assert manifest["start"] == "barrier"
    for job in manifest["jobs"]:
        script = (tmp_path / job["script"]).read_text()
        assert "#SBATCH --nodes=4" in script.splitlines()  # one instance's nodes, not the result's 12
        assert f"instance {job['index']} of 3 (seed {job['seed']})" in script
        assert f"--instances 3 --instance {job['index']} --seed 1000 --barrier" in script
        assert f"STAGE_NAME='throughput-cosmoflow-perlmutter-n4x3-run_{job['index']:03d}'" in script
        assert 'CAMPAIGN_DIR="$OUTPUT_ROOT/throughput-cosmoflow-perlmutter-n4x3"' in script
    submit = (tmp_path / "tp-submit.sh").read_text()
    assert 'sbatch "$s"' in submit and "seq 0 2" in submit
    assert not list(tmp_path.glob(".*tmp*"))


@pytest.mark.parametrize("site", example_sites())
def test_every_schedulers_submit_script_passes_shellcheck(site, tmp_path):
    code, _ = render_instances(tmp_path, site=site, instances=2, nodes=1)
    assert code == 0
    for name in ("tp-submit.sh", "tp-instance_000.sh"):
        check = subprocess.run(["shellcheck", str(tmp_path / name)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout
    scheduler = load_site(site).scheduler
    word = {"slurm": "sbatch", "lsf": "bsub", "pbs": "qsub", "pjsub": "pjsub", "sge": "qsub", "cobalt": "qsub",
            "local": "bash"}[scheduler]
    assert f'    {word} ' in (tmp_path / "tp-submit.sh").read_text()


def test_a_start_time_goes_into_every_script(tmp_path):
    code, _ = render_instances(tmp_path, "--start-at", "2026-12-04T02:00:00Z", instances=2)
    assert code == 0
    assert "--instance 1 --seed 1000 --start-at 2026-12-04T02:00:00Z" in (tmp_path / "tp-instance_001.sh").read_text()
    assert json.loads((tmp_path / "tp-instances.json").read_text())["start"] == "2026-12-04T02:00:00Z"


@pytest.mark.parametrize("extra, message", [
    (["--start-at", "tomorrow"], "--start-at 'tomorrow': expected seconds since the epoch or an ISO 8601 time"),
    (["--start-at", "2026-12-04T02:00:00"], "no time zone"),
])
def test_a_bad_start_time_is_refused_naming_it(tmp_path, capsys, extra, message):
    code, _ = render_instances(tmp_path, *extra)
    assert code == 2 and message in " ".join(capsys.readouterr().err.split())
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, message", [
    (["--instances", "2", "--start-at", "1"], "give --separate-jobs too"),
    (["--separate-jobs"], "--separate-jobs and --start-at go with --instances M"),
    (["--instances", "2", "--separate-jobs"], "give --out STEM.sh"),
])
def test_flags_that_do_not_go_together_are_refused(argv, message, capsys):
    assert jobs_main(["render", "--site", "perlmutter", "--bench", "cosmoflow", "--nodes", "1", *argv]) == 2
    assert message in " ".join(capsys.readouterr().err.split())


# ------------------------------------------------------------------------------------------- the shared start
@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(start, "GRACE_SECONDS", 0.3)
    monkeypatch.setattr(start, "POLL_SECONDS", 0.05)


def test_parse_when_reads_epoch_seconds_and_iso_times_with_a_zone():
    assert start.parse_when("1764813600") == 1764813600.0
    assert start.parse_when("2026-12-04T02:00:00Z") == start.parse_when("2026-12-04T03:00:00+01:00")
    with pytest.raises(BenchError, match="no time zone"):
        start.parse_when("2026-12-04 02:00")


def test_instances_arriving_apart_start_at_one_moment_after_the_last_arrives(tmp_path, quick):
    got, errors = {}, []

    def instance(index: int):
        try:
            got[index] = (start.wait_for_start(start.StartPlan(barrier=True), tmp_path, index, 2, NEVER), time.time())
        except BaseException as err:  # noqa: BLE001  (reported by the assertion below)
            errors.append(err)

    first = threading.Thread(target=instance, args=(0,))
    first.start()
    time.sleep(0.8)
    arrived = time.time()
    assert 0 not in got  # still waiting for instance 1
    instance(1)
    first.join(timeout=10)
    assert not errors and got[0][0] == got[1][0] >= arrived
    assert all(woke >= got[i][0] for i, (_, woke) in got.items())  # neither starts before the shared moment
    record = json.loads((tmp_path / "barrier" / "start.json").read_text())
    assert record["instances"] == [0, 1] and record["start_at"] == got[0][0]


def test_a_wait_past_its_limit_leaves_the_barrier(tmp_path, quick):
    with pytest.raises(start.StartAbandoned, match=r"instance 1 left the barrier .* \(not there: 0, 2\)"):
        start.wait_for_start(start.StartPlan(barrier=True, wait_limit=0.3), tmp_path, 1, 3, NEVER)
    assert not list((tmp_path / "barrier").iterdir())  # its ready file removed: the others do not count it


def test_a_stop_request_while_waiting_abandons_the_start(tmp_path, quick):
    with pytest.raises(start.StartAbandoned, match="a stop request"):
        start.wait_for_start(start.StartPlan(barrier=True), tmp_path, 0, 2, lambda: True)
    with pytest.raises(start.StartAbandoned, match="a stop request came"):
        start.wait_for_start(start.StartPlan(at=time.time() + 30), tmp_path, 0, 2, lambda: True)


def test_an_instance_that_comes_after_its_round_opened_starts_at_once_and_says_how_late(tmp_path, quick, capsys):
    folder = tmp_path / "barrier"
    folder.mkdir()
    (folder / "start.json").write_text(json.dumps({"start_at": time.time() - 120, "instances": [0, 1]}))
    began = time.time()
    start.wait_for_start(start.StartPlan(barrier=True), tmp_path, 1, 2, NEVER)
    assert time.time() - began < 1
    assert "instance 1 starts 120 s after the shared start" in capsys.readouterr().out


def test_a_start_time_is_waited_for_and_one_past_is_reported(tmp_path, quick, capsys):
    at = time.time() + 0.5
    assert start.wait_for_start(start.StartPlan(at=at), tmp_path, 0, 2, NEVER) == at and time.time() >= at
    start.wait_for_start(start.StartPlan(at=time.time() - 60), tmp_path, 0, 2, NEVER)
    assert "starts 60 s after the shared start" in capsys.readouterr().out
    with pytest.raises(start.StartAbandoned, match="past the wait limit"):
        start.wait_for_start(start.StartPlan(at=time.time() + 3600, wait_limit=60), tmp_path, 0, 2, NEVER)


def test_a_damaged_start_record_is_named(tmp_path):
    (tmp_path / "barrier").mkdir()
    (tmp_path / "barrier" / "start.json").write_text("{}")
    with pytest.raises(BenchError, match=r"start.json: not a barrier's start record"):
        start.wait_for_start(start.StartPlan(barrier=True), tmp_path, 0, 2, NEVER)


@pytest.mark.parametrize("argv, message", [
    (["--barrier"], "--barrier: the shared start of instances submitted as separate jobs; give --instance I"),
    (["--instances", "2", "--instance", "2", "--barrier"], "--instance 2: expected 0 to M-1 with --instances M"),
    (["--instances", "2", "--instance", "0"], "give one shared start, --start-at WHEN or --barrier (given: neither)"),
    (["--instances", "2", "--instance", "0", "--barrier", "--start-at", "5"], "(given: --start-at and --barrier)"),
    (["--instances", "2", "--instance", "0", "--barrier", "--wait-limit", "-1"], "--wait-limit -1.0: expected"),
])
def test_the_campaigns_instance_flags_are_checked_before_anything_runs(tmp_path, capsys, argv, message):
    config = tmp_path / "c.yaml"
    config.write_text("{}\n")
    code = campaign_main(["run", "cosmoflow", str(config), "--out", str(tmp_path / "out"), *argv])
    assert code == 2 and message in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "out").exists()
