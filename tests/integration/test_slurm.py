"""A rendered Slurm script submitted to a real Slurm: a single-node cluster (munged, slurmctld, slurmd from
Debian's packages, which set-up installs) started in a temporary directory for this module.

The job is a small CosmoFlow training with 2 tasks (srun --mpi=pmix), staging its data to node-local
storage; its MLPerf log must pass the official checker's structural rules and record success for the
run's own target, validation MAE 0.40, which only a model that learned meets (chance is 0.5; a small
model does not reach the rules' 0.124; the mini dataset's full training through the same path is
measured in docs/jobs.md). Needs root, to run the daemons.
"""
import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from common.campaign.compliance import check_log
from jobs.localslurm import local_slurm, submit
from jobs.render import Job, render
from jobs.site import load_site
from tests.conftest import REPO, checkout_first_on_path
from tests.integration.cosmo_fixtures import LEARNED_MAE, write_learning_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm():
    """The environment (SLURM_CONF) of a running single-node cluster; its daemons are stopped afterwards."""
    with local_slurm() as env:
        yield env


def test_a_rendered_script_runs_under_slurm_and_its_log_passes_the_checker(slurm, cosmo_learnable, tmp_path):
    site_file = tmp_path / "slurm-test.yaml"
    site_file.write_text(yaml.safe_dump({
        "name": "slurm-test", "description": "single-node Slurm started by the test", "scheduler": "slurm",
        "launcher_args": "--mpi=pmix", "time_limit": "00:20:00", "ranks_per_node": 2, "cpus_per_rank": 1,
        "python": sys.executable, "suite_dir": str(REPO), "data": {"cosmoflow": str(cosmo_learnable)},
        "output_root": str(tmp_path / "out"), "stage_dir": str(tmp_path / "stage"),
        "env": {"PYTHONPATH": checkout_first_on_path()}}))
    config = write_learning_config(tmp_path / "small.yaml", cosmo_learnable, tmp_path / "unused")
    script = tmp_path / "job.sh"
    script.write_text(render(load_site(str(site_file)), Job(bench="cosmoflow", nodes=1, config=str(config))))
    t0 = time.time()
    rc, sbatch_output, output = submit(script, slurm, tmp_path, timeout=900, cwd=tmp_path)
    assert rc == 0, sbatch_output + output[-5000:]
    runs = list((tmp_path / "out").glob("cosmoflow-*"))
    assert len(runs) == 1, output[-3000:]
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["status"] == "success" and summary["final_metric"] < LEARNED_MAE
    assert summary["io"]["ranks"][0]["staging"]["copied"] and str(tmp_path / "stage") in \
        summary["io"]["ranks"][0]["staging"]["dir"]
    checked = check_log(runs[0] / "mlperf.log")
    assert checked.structural_problems == (), checked.messages
    assert "compliance checker (hpc 3.0.0)" in output  # the script checked the log itself
    print(f"sbatch --wait took {time.time() - t0:.0f} s")
