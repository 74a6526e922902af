"""Staging at full scale in rendered jobs: node_share in the real-data examples, the refusal of a node-local
directory smaller than a node's share, the clean-up of every node's copy, Fugaku's LLIO and vcoordfiles."""
import subprocess
from pathlib import Path

import pytest

from common.base.errors import BenchError
from jobs.render import DATASET_GB, Job, render, stage_share_gb
from jobs.site import SITES_DIR, example_sites, load_site

SET_PLUS_U = "set +u  # module and conda's activate scripts read unset variables"
DEMO_SITES = ("localhost", "localhost-slurm")  # the mini demo data: whole copies are small
REAL_SITES = [s for s in example_sites() if s not in DEMO_SITES]
# The command prefix that starts one task per node for each scheduler's example (4 nodes).
PER_NODE = {"perlmutter": "srun --nodes=4 --ntasks=4 --ntasks-per-node=1 find",
            "frontera": "srun --nodes=4 --ntasks=4 --ntasks-per-node=1 find",
            "summit": "jsrun --nrs=4 --rs_per_host=1 --tasks_per_rs=1 --cpu_per_rs=1 find",
            "polaris": "mpiexec -n 4 --ppn 1 find",
            "fugaku": 'mpiexec --vcoordfile "$VCOORD_DIR/nodes" -n 4 find',
            "abci": 'mpirun --hostfile "$STAGE_HOSTS" -np 4 --map-by ppr:1:node find',
            "theta": "aprun -n 4 -N 1 find",
            "localhost": "    find"}


def site_file(tmp_path: Path, example: str, extra: str) -> str:
    path = tmp_path / f"{example}-custom.yaml"
    path.write_text((SITES_DIR / f"{example}.yaml").read_text() + extra)
    return str(path)


@pytest.mark.parametrize("site_name", REAL_SITES)
def test_the_real_data_examples_stage_each_node_its_share(site_name):
    site = load_site(site_name)
    assert site.stage_mode == "node_share"
    assert '"data.stage_mode=node_share"' in render(site, Job(bench="deepcam", nodes=64))


def test_the_share_per_node_follows_the_mode_and_the_overrides():
    perlmutter = load_site("perlmutter")
    assert stage_share_gb(perlmutter, Job(bench="deepcam", nodes=64)) == pytest.approx(DATASET_GB["deepcam"] / 64)
    whole = Job(bench="deepcam", nodes=64, overrides=("data.stage_mode=node",))
    assert stage_share_gb(perlmutter, whole) == DATASET_GB["deepcam"]
    decompressed = Job(bench="cosmoflow", nodes=100, overrides=("data.stage_decompress=true",))
    assert stage_share_gb(perlmutter, decompressed) == pytest.approx(98.96)
    # Fugaku's CosmoFlow: Mesh-TF groups of 4 ranks, each rank staging its group's shard
    assert stage_share_gb(load_site("fugaku"), Job(bench="cosmoflow", nodes=512)) == \
        pytest.approx(DATASET_GB["cosmoflow"] * 4 / 512)


def test_a_stage_dir_smaller_than_a_nodes_share_is_refused_with_the_facts(tmp_path):
    path = site_file(tmp_path, "perlmutter", "stage_capacity_gb: 128\n")
    site = load_site(path)
    with pytest.raises(BenchError) as err:
        render(site, Job(bench="cosmoflow", nodes=2, runs=3))
    message = str(err.value)
    for fact in (path, "stage_dir /dev/shm holds 128 GB per node", "855 GB per node", "node_share staging",
                 "1710 GB", "on 2 nodes", "at least 14 nodes", "another stage_dir"):
        assert fact in message, (fact, message)
    assert "trap clean_stage EXIT" in render(site, Job(bench="cosmoflow", nodes=14, runs=3))
    with pytest.raises(BenchError, match="use data.stage_mode node_share"):
        render(site, Job(bench="cosmoflow", nodes=64, overrides=("data.stage_mode=node",)))


def test_a_sites_dataset_size_wins_over_the_official_one(tmp_path):
    site = load_site(site_file(tmp_path, "perlmutter", "stage_capacity_gb: 128\ndataset_gb: {cosmoflow: 200}\n"))
    render(site, Job(bench="cosmoflow", nodes=2))
    with pytest.raises(BenchError, match=r"dataset_gb.cosmo 1: expected a benchmark"):
        load_site(site_file(tmp_path, "perlmutter", "dataset_gb: {cosmo: 1}\n"))
    with pytest.raises(BenchError, match=r"stage_capacity_gb -1: expected >= 0"):
        load_site(site_file(tmp_path, "perlmutter", "stage_capacity_gb: -1\n"))


@pytest.mark.parametrize("site_name", sorted(PER_NODE))
def test_every_nodes_staged_copy_is_removed_when_the_job_exits(site_name):
    site = load_site(site_name)
    nodes = 1 if site.scheduler == "local" else 4
    one = render(site, Job(bench="deepcam", nodes=nodes))
    campaign = render(site, Job(bench="deepcam", nodes=nodes, runs=3))
    for script in (one, campaign):
        assert "trap clean_stage EXIT" in script
        assert PER_NODE[site_name] + ' "$STAGE_DIR" -mindepth 1 -maxdepth 1 -name "$STAGE_NAME" -exec rm -rf {} +' \
            in script
        # the trap is set before anything is staged
        assert script.index("trap clean_stage EXIT") < script.index("SETTINGS=(")
    assert 'STAGE_NAME="deepcam-$JOB_ID"' in one and '"data.stage_dir=${STAGE_DIR:+$STAGE_DIR/$STAGE_NAME}"' in one
    assert f"STAGE_NAME='campaign-deepcam-{site.name}-n{nodes}-run_*'" in campaign


def test_the_clean_up_removes_the_jobs_copies_and_nothing_else(tmp_path):
    """The script's own clean-up lines, on a local stage directory, run through bash as the trap runs them."""
    script = render(load_site("localhost"), Job(bench="cosmoflow", nodes=1, runs=2))
    lines = script.splitlines()
    block = lines[lines.index(next(l for l in lines if l.startswith("STAGE_NAME="))):
                  lines.index("trap clean_stage EXIT") + 1]
    stage = tmp_path / "stage"
    for name in ("campaign-cosmoflow-localhost-n1-run_000", "campaign-cosmoflow-localhost-n1-run_001",
                 "campaign-cosmoflow-other-n1-run_000", "keep"):
        (stage / name / "node").mkdir(parents=True)
    run = subprocess.run(["bash", "-c", "\n".join(["set -euo pipefail", f"STAGE_DIR={stage}", *block, "exit 3"])],
                         capture_output=True, text=True)
    assert run.returncode == 3, run.stderr
    assert sorted(p.name for p in stage.iterdir()) == ["campaign-cosmoflow-other-n1-run_000", "keep"]


def test_fugaku_asks_llio_for_the_node_temporary_area_and_gives_instances_vcoordfiles(tmp_path):
    site = load_site("fugaku")
    assert site.stage_dir == "$PJM_LOCALTMP"
    script = render(site, Job(bench="deepcam", nodes=2, instances=3))
    assert "#PJM --llio localtmp-size=89088Mi" in script.splitlines()
    assert "--launcher \"mpiexec --vcoordfile '$VCOORD_DIR/instance_{run:03d}' -n 8\"" in script
    lines = script.splitlines()
    start = lines.index('VCOORD_DIR="$OUTPUT_ROOT/vcoord-$PJM_JOBID"')
    block = lines[start:start + 4] + lines[lines.index("for i in $(seq 0 2); do"):lines.index("done") + 1]
    run = subprocess.run(["bash", "-c", "\n".join(["set -euo pipefail", f"OUTPUT_ROOT={tmp_path}", "PJM_JOBID=7",
                                                   *block])], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    vcoord = tmp_path / "vcoord-7"
    assert (vcoord / "nodes").read_text().split() == [f"({n})" for n in range(6)]
    for i in range(3):
        assert (vcoord / f"instance_{i:03d}").read_text().split() == \
            [f"({n})" for n in range(2 * i, 2 * i + 2) for _ in range(4)]
    custom = load_site(site_file(tmp_path, "fugaku", "stage_capacity_gb: 50\n"))
    assert "#PJM --llio localtmp-size=47683Mi" in render(custom, Job(bench="deepcam", nodes=512))


@pytest.mark.parametrize("site_name", ["summit", "polaris", "hal", "abci"])
def test_set_u_is_lifted_around_the_sites_module_and_setup_lines(site_name):
    site = load_site(site_name)
    lines = render(site, Job(bench="deepcam", nodes=4)).splitlines()
    start, end = lines.index(SET_PLUS_U), lines.index("set -u")
    inside = lines[start + 1:end]
    assert all(f"module load {m}" in inside for m in site.modules) and all(s in inside for s in site.setup)
    assert not any(l.startswith(("module load", "conda ")) for l in lines[:start] + lines[end:])


def test_a_setup_line_reading_an_unset_variable_runs_under_the_script(tmp_path):
    site = load_site(site_file(tmp_path, "localhost", 'setup: [\'echo "conda: ${CONDA_NOT_SET_ANYWHERE}"\']\n'))
    lines = render(site, Job(bench="cosmoflow", nodes=1)).splitlines()
    start, end = lines.index(SET_PLUS_U), lines.index("set -u")
    run = subprocess.run(["bash", "-c", "\n".join(["set -euo pipefail", *lines[start:end + 1], "echo after"])],
                         capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.split("\n")[-2] == "after", run.stderr
