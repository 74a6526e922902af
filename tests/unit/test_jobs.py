"""Job scripts: every example site renders every kind of job, and the scripts pass bash -n and shellcheck."""
import os
import subprocess
from pathlib import Path

import pytest

from common.base.errors import BenchError
from jobs.__main__ import main as jobs_main
from jobs.render import Job, render
from jobs.site import example_sites, load_site
from tests.conftest import REPO

SITES = example_sites()
JOBS = {"one": {}, "runs": {"runs": 3}, "instances": {"instances": 2},
        "separate": {"instances": 2, "separate": True, "instance": 1}}


def nodes_for(site) -> int:
    return 1 if site.scheduler == "local" else 4


def test_the_examples_cover_every_scheduler_and_container_kind():
    sites = [load_site(name) for name in SITES]
    assert {s.scheduler for s in sites} == {"slurm", "lsf", "pbs", "pjsub", "sge", "cobalt", "local"}
    assert {s.container.kind for s in sites} >= {"none", "shifter", "sarus"}


@pytest.mark.parametrize("site_name", SITES)
@pytest.mark.parametrize("bench", ["cosmoflow", "deepcam"])
@pytest.mark.parametrize("kind", sorted(JOBS))
def test_every_site_renders_every_job_and_it_passes_bash_and_shellcheck(site_name, bench, kind, tmp_path):
    site = load_site(site_name)
    script = render(site, Job(bench=bench, nodes=nodes_for(site), overrides=("train.max_epochs=3",), **JOBS[kind]))
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert script.startswith("#!/bin/bash\n") and "set -euo pipefail" in script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True).returncode == 0
    check = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    assert f"export HOROVOD_FUSION_THRESHOLD={int(site.horovod.fusion_threshold_mb * 2**20)}" in script
    assert f'"dist.fusion_threshold_mb={site.horovod.fusion_threshold_mb:g}"' in script
    assert "train.max_epochs=3" in script
    if kind == "one":
        assert f'"$SUITE_DIR/{bench}/train.py"' in script and "common.campaign.compliance" in script
    else:
        count = {"runs": "--runs 3", "instances": "--instances 2"}.get(kind, "--instances 2 --instance 1 --seed 1000")
        assert f"-m common.campaign run {bench}" in script and count in script and "--launcher" in script


def test_directives_follow_the_site_and_the_job():
    script = render(load_site("perlmutter"), Job(bench="cosmoflow", nodes=128))
    for line in ("#SBATCH --nodes=128", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --account=m0000", "#SBATCH --constraint=gpu", "#SBATCH --exclusive"):
        assert line in script.splitlines()
    assert "srun --nodes=128 --ntasks=512 --ntasks-per-node=4 --cpus-per-task=32 --cpu-bind=cores " \
           "--gpus-per-task=1 shifter --image=" in script
    summit = render(load_site("summit"), Job(bench="deepcam", nodes=2, time_limit="00:30:00"))
    assert "#BSUB -nnodes 2" in summit and "#BSUB -W 30" in summit and "#BSUB -alloc_flags NVME" in summit
    assert "jsrun --nrs=12 --tasks_per_rs=1 --cpu_per_rs=7 --gpu_per_rs=1 --rs_per_host=6" in summit
    polaris = render(load_site("polaris"), Job(bench="deepcam", nodes=10))
    assert "#PBS -l select=10:ncpus=32" in polaris and "mpiexec -n 40 --ppn 4 --depth 8 --cpu-bind depth" in polaris
    fugaku = render(load_site("fugaku"), Job(bench="cosmoflow", nodes=16))
    assert '#PJM -L "node=16"' in fugaku and "mpiexec -n 64 " in fugaku and "'parallel.spatial=[4,1]'" in fugaku
    assert "parallel.spatial" not in render(load_site("fugaku"), Job(bench="deepcam", nodes=16))


def test_a_campaign_launcher_keeps_its_placeholders_literal(tmp_path):
    site = load_site("localhost")
    script = render(site, Job(bench="cosmoflow", nodes=1, runs=2))
    assert "--launcher 'horovodrun -np 2 -H localhost:2'" in script
    assert '--stage-dir "$STAGE_DIR"' in script and '"data.stage_dir=$STAGE_DIR"' not in script


@pytest.mark.parametrize("text,message", [
    ("name: x\nscheduler: slurm\nbogus: 1\n", r"unknown key\(s\) bogus"),
    ("name: x\nscheduler: moab\n", r"scheduler = 'moab': expected one of"),
    ("name: x\nsuite_dir: relative/path\n", r"suite_dir 'relative/path': expected an absolute path"),
    ("name: x\ncontainer: {kind: sarus}\n", r"container.kind sarus: container.image is empty"),
    ("name: x\nranks_per_node: 3\naccelerators_per_node: 4\n", r"accelerators_per_node 4 and ranks_per_node 3"),
    ("scheduler: slurm\n", r"name is empty"),
])
def test_bad_site_files_are_named_with_the_key(tmp_path, text, message):
    path = tmp_path / "site.yaml"
    path.write_text(text)
    with pytest.raises(BenchError, match=rf"site file {path}: .*{message}"):
        load_site(str(path))


def test_a_job_without_the_sites_paths_or_with_horovodrun_across_nodes_is_refused(tmp_path):
    path = tmp_path / "bare.yaml"
    path.write_text("name: bare\nscheduler: slurm\n")
    with pytest.raises(BenchError, match=r"site bare: suite_dir, data.cosmoflow, output_root not set"):
        render(load_site(str(path)), Job(bench="cosmoflow", nodes=1))
    with pytest.raises(BenchError, match=r"launcher horovodrun on 2 nodes"):
        render(load_site("localhost"), Job(bench="cosmoflow", nodes=2))
    with pytest.raises(BenchError, match=r"site 'nowhere': .*nowhere.yaml does not exist \(examples: abci, cori-knl"):
        load_site("nowhere")


def test_the_rendered_script_stops_before_any_work_when_a_path_is_wrong(tmp_path):
    out = tmp_path / "job.sh"
    assert jobs_main(["render", "--site", "localhost", "--bench", "cosmoflow", "--nodes", "1", "--out", str(out)]) == 0
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(out)], cwd=tmp_path, env={**env, "SUITE_DIR": str(tmp_path)},
                          capture_output=True, text=True)
    assert proc.returncode == 2 and f"SUITE_DIR={tmp_path} is not the suite's checkout" in proc.stderr
    proc = subprocess.run(["bash", str(out)], cwd=REPO, env={**env, "DATA_DIR": str(tmp_path / "none")},
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "holds no manifest.json or pack.json" in proc.stderr
    assert not list(Path(tmp_path).glob(".job.sh.tmp*"))


def test_a_throughput_job_allocates_every_instance_its_own_nodes():
    slurm = render(load_site("perlmutter"), Job(bench="deepcam", nodes=16, instances=5))
    assert "#SBATCH --nodes=80" in slurm.splitlines() and "srun --nodes=16 --ntasks=64 " in slurm
    pbs = render(load_site("polaris"), Job(bench="deepcam", nodes=16, instances=5))
    assert "#PBS -l select=80:ncpus=32" in pbs
    assert 'sort -u "$PBS_NODEFILE" | split -d -a 3 -l 16 - "$HOSTS_DIR/instance_"' in pbs
    assert "--launcher \"mpiexec --hostfile '$HOSTS_DIR/instance_{run:03d}' -n 64 " in pbs


def test_the_rendered_examples_in_the_docs_are_current():
    from jobs.docs import DOCS, refreshed
    pages = sorted(DOCS.glob("*.md"))
    assert {p.stem for p in pages} == {"slurm", "lsf", "pbs", "pjsub", "sge", "cobalt", "local"}
    for page in pages:
        text = page.read_text()
        assert "<!-- rendered:end -->" in text and refreshed(text) == text, \
            f"{page} is out of date: run `python -m jobs.docs`"


def test_the_local_slurm_config_names_this_host_its_cores_and_two_ports(tmp_path):
    from jobs.localslurm import slurm_conf
    conf = dict(line.split("=", 1) for line in slurm_conf(tmp_path, "nodeA").splitlines()
                if "=" in line and not line.startswith(("NodeName", "PartitionName")))
    assert conf["SlurmctldHost"] == "nodeA" and conf["StateSaveLocation"] == f"{tmp_path}/state"
    assert conf["SlurmctldPort"] != conf["SlurmdPort"]
    assert f"NodeName=nodeA CPUs={os.cpu_count()} " in slurm_conf(tmp_path, "nodeA")


def test_submitting_a_missing_script_names_it_and_exits_2(tmp_path, capsys):
    from jobs.localslurm import main
    assert main(["submit", str(tmp_path / "nope.sh")]) == 2
    assert f"{tmp_path / 'nope.sh'}: no such job script" in capsys.readouterr().err
