"""The campaign's spec, its commands and resuming rules (the runs themselves: tests/integration/test_campaign.py)."""
import json
import sys
from pathlib import Path

import pytest

from common.campaign import run as campaign
from common.campaign.run import CampaignSpec, open_campaign, run_command, spec_from_args
from common.campaign.spec import load_spec
from common.base.errors import BenchError
from tests.conftest import summary_fields


def spec(**fields) -> CampaignSpec:
    return CampaignSpec(**{"benchmark": "cosmoflow", "config": "cosmoflow/configs/cosmo_mini.yaml", **fields})


def test_run_commands_carry_the_launcher_the_seed_and_the_run_directory(tmp_path):
    s = spec(ranks=4, seed=7, overrides=("train.local_batch_size=2",), stage_dir="/dev/shm/st",
             launcher="srun -n {np} --label")
    command = run_command(s, tmp_path / "camp", 3)
    assert command[:4] == ["srun", "-n", "4", "--label"]
    assert command[4:7] == [sys.executable, str(campaign.REPO / "cosmoflow/train.py"), "cosmoflow/configs/cosmo_mini.yaml"]
    assert command[7:] == ["train.local_batch_size=2", "data.stage_dir=/dev/shm/st/camp-run_003", "run.seed=10",
                           f"run.output_dir={tmp_path / 'camp/runs/run_003'}"]
    default = run_command(spec(), tmp_path / "camp", 0)
    assert default[:5] == [str(Path(sys.executable).parent / "horovodrun"), "-np", "2", "-H", "localhost:2"]
    inside = run_command(spec(python="python3", launcher="srun -n {np} shifter --image=x"), tmp_path / "c", 0)
    assert inside[:6] == ["srun", "-n", "2", "shifter", "--image=x", "python3"]
    with pytest.raises(BenchError, match=r"unknown placeholder 'nodes'; it may use \{np\}, \{run\} and \{python\}"):
        run_command(spec(launcher="srun -N {nodes}"), tmp_path, 0)


@pytest.mark.parametrize("configured,chosen,fixed", [("auto", "mixed_bfloat16", "mixed_bfloat16"),
                                                      ("auto", "float32", "float32"),
                                                      ("float32", "float32", None)])
def test_later_runs_train_in_the_precision_the_first_run_chose_under_auto(tmp_path, configured, chosen, fixed):
    out = tmp_path / "camp"
    assert not any(a.startswith("train.precision=") for a in run_command(spec(), out, 0))  # nothing chosen yet
    first = out / "runs" / "run_000"
    first.mkdir(parents=True)
    choice = {"precision": chosen, "reason": "probed", "step_seconds": {}, "epochs_ratio": None,
              "configured": configured}
    (first / "summary.json").write_text(json.dumps(summary_fields(precision=choice)))
    later = [a for a in run_command(spec(), out, 1) if a.startswith("train.precision=")]
    assert later == ([f"train.precision={fixed}"] if fixed else [])  # an explicit precision needs no fixing
    assert campaign.fixed_precision(spec(), out) == fixed


def test_the_rules_count_is_the_default():
    assert spec().count == 10 and spec(benchmark="deepcam").count == 5 and spec(runs=3).count == 3


@pytest.mark.parametrize("fields,message", [
    ({"benchmark": "resnet"}, r"key benchmark = 'resnet': expected one of \['cosmoflow', 'deepcam'\]"),
    ({"ranks": 0}, r"key ranks = 0: expected >= 1"),
    ({"system": "a/b"}, r"key system = 'a/b': expected a non-empty file name"),
    ({"overrides": ("run.seed=3",)}, r"key overrides = 'run.seed=3': expected no run.seed or run.output_dir: the campaign sets them itself"),
    ({"mode": "throughput", "overrides": ("data.stage_dir=/tmp/x",)},
     r"data.stage_dir with concurrent instances: they would stage into one directory; give --stage-dir"),
])
def test_inconsistent_specs_are_refused(fields, message):
    with pytest.raises(BenchError, match=message):
        spec(**fields)


def test_runs_and_instances_together_are_refused():
    args = campaign.parse_args(["run", "cosmoflow", "c.yaml", "--out", "x", "--runs", "3", "--instances", "2"])
    with pytest.raises(BenchError, match=r"--runs 3 and --instances 2: give one"):
        spec_from_args(args)
    throughput = spec_from_args(campaign.parse_args(["run", "deepcam", "c.yaml", "a.b=1", "--out", "x",
                                                      "--instances", "4"]))
    assert throughput.mode == "throughput" and throughput.count == 4 and throughput.overrides == ("a.b=1",)
    after = spec_from_args(campaign.parse_args(["run", "deepcam", "c.yaml", "a.b=1", "--out", "x", "--np", "1",
                                                "c.d=2", "e.f=3"]))
    assert after.overrides == ("a.b=1", "c.d=2", "e.f=3") and after.ranks == 1
    with pytest.raises(SystemExit):
        campaign.parse_args(["run", "deepcam", "c.yaml", "--out", "x", "--bogus"])


def test_a_campaign_resumes_only_with_its_own_arguments_but_may_grow(tmp_path, capsys):
    out = tmp_path / "camp"
    open_campaign(out, spec(runs=2))
    open_campaign(out, spec(runs=2))  # the same: fine
    with pytest.raises(BenchError, match=r"campaign.json: this campaign was started with other arguments \(overrides: "
                                         r"\[\] there, \['train.local_batch_size=8'\] now\)"):
        open_campaign(out, spec(runs=2, overrides=("train.local_batch_size=8",)))
    with pytest.raises(BenchError, match=r"runs: 2 there, 1 now"):
        open_campaign(out, spec(runs=1))
    open_campaign(out, spec(runs=3))
    assert "extended from 2 to 3 runs" in capsys.readouterr().out
    saved = json.loads((out / "campaign.json").read_text())
    assert saved["spec"]["runs"] == 3 and saved["code"]["commit"]
    assert load_spec(out) == spec(runs=3)
    with pytest.raises(BenchError, match=r"nothing: no campaign.json; not a campaign directory"):
        load_spec(tmp_path / "nothing")


def test_the_progress_line_is_the_newest_epoch_line_without_launcher_prefixes(tmp_path):
    log = tmp_path / "train.log"
    assert campaign.progress_line(log) == ""  # not there yet
    log.write_text("[1,0]<stderr>:WARNING: something\n"
                   "[1,0]<stdout>:epoch   7/12 step 14336  loss 0.0728  mae 0.2016 (target < 0.124)\n"
                   "[1,0]<stdout>:  epoch 8 step 777/2048  loss 0.0629  103.53 samples/s\n"
                   "[1,1]<stderr>:E0000 remapper failed\n")
    assert campaign.progress_line(log) == "epoch 8 step 777/2048  loss 0.0629  103.53 samples/s"


def test_a_campaign_json_without_newer_keys_resumes_with_their_defaults(tmp_path):
    out = tmp_path / "camp"
    open_campaign(out, spec(runs=2))
    saved = json.loads((out / "campaign.json").read_text())
    del saved["spec"]["python"]  # written before the key existed
    (out / "campaign.json").write_text(json.dumps(saved))
    open_campaign(out, spec(runs=2))
    assert load_spec(out) == spec(runs=2)


def test_code_version_names_modified_files_whole(tmp_path, monkeypatch):
    """`git status --porcelain` starts an unstaged change with a space; the path must keep its first letter."""
    import subprocess
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    (tmp_path / "common").mkdir()
    (tmp_path / "common/a.py").write_text("1\n")
    (tmp_path / "other.py").write_text("1\n")
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "x"]):
        subprocess.run([*git, *args], check=True)
    (tmp_path / "common/a.py").write_text("2\n")
    (tmp_path / "other.py").write_text("2\n")
    from common.base import version as version_module
    monkeypatch.setattr(version_module, "REPO", tmp_path)
    version = version_module.code_version()
    assert len(version["commit"]) == 40 and version["modified"] == ["common/a.py", "other.py"]
    assert version_module.code_version(("common",))["modified"] == ["common/a.py"]
