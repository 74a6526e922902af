"""A rendered Slurm script submitted to a real Slurm: a single-node cluster (munged, slurmctld, slurmd from
Debian's packages, which set-up installs) started in a temporary directory for this module.

The job is a tiny CosmoFlow training with 2 tasks (srun --mpi=pmix), staging its data to node-local
storage; its MLPerf log must pass the official checker's structural rules and record success for the
run's own loose target (a tiny model does not reach the rules' 0.124; the mini dataset's full training
through the same path is measured in docs/jobs.md). Needs root, to run the daemons.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from common.compliance import check_log
from jobs.render import Job, render
from jobs.site import load_site
from tests.conftest import REPO, checkout_first_on_path
from tests.integration.cosmo_fixtures import make_dataset, write_config

pytestmark = pytest.mark.slow
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def slurm_conf(root: Path, host: str) -> str:
    memory_mb = int(int(Path("/proc/meminfo").read_text().split()[1]) / 1024 * 0.8)
    return "\n".join([
        "ClusterName=scimltest", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", f"AuthInfo=socket={root}/munge/munge.socket", "CredType=cred/munge",
        f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd.log",
        f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "SchedulerType=sched/builtin", "MpiDefault=none", "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        f"NodeName={host} CPUs={os.cpu_count()} RealMemory={memory_mb} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP", ""])


@pytest.fixture(scope="module")
def slurm():
    """SLURM_CONF of a running single-node cluster; its daemons are stopped afterwards."""
    missing = [d for d in DAEMONS if not shutil.which(d) and not Path(f"/usr/sbin/{d}").exists()]
    assert not missing, f"{missing} missing: scripts/setup.sh installs Debian's slurmctld, slurmd, munge"
    assert os.geteuid() == 0, "starting munged, slurmctld and slurmd needs root"
    # Not below pytest's directories (mode 700): the munge user must reach its socket.
    root = Path(tempfile.mkdtemp(prefix="sciml-slurm-"))
    root.chmod(0o755)
    for d in ("state", "spool", "munge"):
        (root / d).mkdir()
    shutil.chown(root / "munge", "munge", "munge")
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, host))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munge = f"/usr/sbin/munged --socket={root}/munge/munge.socket --pid-file={root}/munge/munged.pid " \
            f"--log-file={root}/munge/munged.log --seed-file={root}/munge/seed"
    subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", munge], check=True)
    subprocess.run(["/usr/sbin/slurmctld", "-f", str(conf)], check=True, env=env)
    subprocess.run(["/usr/sbin/slurmd", "-f", str(conf)], check=True, env=env)
    try:
        deadline = time.time() + 60
        while subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout.strip() \
                != "idle":
            assert time.time() < deadline, (root / "slurmctld.log").read_text()[-3000:]
            time.sleep(1)
        yield env
    finally:
        subprocess.run(["scancel", "--full", "--user=root"], env=env, capture_output=True)
        for pid_file in (root / "slurmd.pid", root / "slurmctld.pid", root / "munge/munged.pid"):
            if pid_file.is_file():
                subprocess.run(["kill", pid_file.read_text().strip()], capture_output=True)
        time.sleep(1)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("cosmo"))


def test_a_rendered_script_runs_under_slurm_and_its_log_passes_the_checker(slurm, dataset, tmp_path):
    site_file = tmp_path / "slurm-test.yaml"
    site_file.write_text(yaml.safe_dump({
        "name": "slurm-test", "description": "single-node Slurm started by the test", "scheduler": "slurm",
        "launcher_args": "--mpi=pmix", "time_limit": "00:20:00", "ranks_per_node": 2, "cpus_per_rank": 1,
        "python": sys.executable, "suite_dir": str(REPO), "data": {"cosmoflow": str(dataset)},
        "output_root": str(tmp_path / "out"), "stage_dir": str(tmp_path / "stage"),
        "env": {"PYTHONPATH": checkout_first_on_path()}}))
    config = write_config(tmp_path / "tiny.yaml", dataset, tmp_path / "unused", train={"max_epochs": 2, "target": 0.9})
    script = tmp_path / "job.sh"
    script.write_text(render(load_site(str(site_file)), Job(bench="cosmoflow", nodes=1, config=str(config))))
    t0 = time.time()
    proc = subprocess.run(["sbatch", "--wait", f"--output={tmp_path}/slurm-%j.out", str(script)], env=slurm,
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    output = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr + output[-5000:]
    runs = list((tmp_path / "out").glob("cosmoflow-*"))
    assert len(runs) == 1, output[-3000:]
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["status"] == "success"
    assert summary["io"]["ranks"][0]["staging"]["copied"] and str(tmp_path / "stage") in \
        summary["io"]["ranks"][0]["staging"]["dir"]
    checked = check_log(runs[0] / "mlperf.log")
    assert checked.structural_problems == (), checked.messages
    assert "compliance checker (hpc 3.0.0)" in output  # the script checked the log itself
    print(f"sbatch --wait took {time.time() - t0:.0f} s")
