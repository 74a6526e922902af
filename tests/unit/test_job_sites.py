"""The example sites of ABCI (Grid Engine), Theta (Cobalt, aprun), HAL (Slurm, a partition named by the job's
GPUs) and Frontera (Slurm, ibrun): their directives, launchers and placement files, and shellcheck."""
import os
import subprocess

import pytest

from common.base.errors import BenchError
from jobs.render import Job, render
from jobs.site import load_site

NEW_SITES = ("abci", "theta", "hal", "frontera")


def lines(script: str) -> list[str]:
    return script.splitlines()


def placement_block(script: str, first: str) -> str:
    """The script's lines from the one starting with `first` up to the change of directory before the launch."""
    body = lines(script)
    start = next(i for i, line in enumerate(body) if line.startswith(first))
    end = body.index('cd "$SUITE_DIR"', start)
    return "\n".join(body[start:end]) + "\n"


def site_file(tmp_path, text: str):
    path = tmp_path / "site.yaml"
    path.write_text("suite_dir: /suite\ndata: {cosmoflow: /data}\noutput_root: /out\n" + text)
    return load_site(str(path))


@pytest.mark.parametrize("site_name", NEW_SITES)
@pytest.mark.parametrize("bench", ["cosmoflow", "deepcam"])
def test_each_new_site_renders_both_benchmarks_and_passes_shellcheck(site_name, bench, tmp_path):
    site = load_site(site_name)
    script = render(site, Job(bench=bench, nodes=4))
    path = tmp_path / "job.sh"
    path.write_text(script)
    check = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    assert f'"$SUITE_DIR/{bench}/train.py"' in script and f'"mlperf.platform={site_name}"' in script
    assert site.description.startswith("example:")


def test_grid_engine_directives_ask_for_whole_nodes_and_the_time_and_name_the_group():
    script = render(load_site("abci"), Job(bench="cosmoflow", nodes=4, time_limit="00:30:00"))
    head = lines(script)[:9]
    for line in ("#$ -N cosmoflow-abci-n4", "#$ -l rt_F=4", "#$ -l h_rt=00:30:00", "#$ -cwd", "#$ -j y",
                 "#$ -S /bin/bash", "# submit with: qsub -g gaa00000 <this script>"):
        assert line in head
    assert not any(line.startswith("#$ -g") for line in head)  # ABCI takes the group on the command line
    assert 'JOB_ID="${JOB_ID:-' in script


def test_grid_engine_queue_and_extra_lines_follow_the_site(tmp_path):
    site = site_file(tmp_path, "name: ge\nscheduler: sge\nconstraint: rt_AF\nqueue: gpu\n"
                               "scheduler_args: ['-l USE_BEEOND=1']\n")
    script = render(site, Job(bench="cosmoflow", nodes=2, instances=3))
    assert {"#$ -l rt_AF=6", "#$ -q gpu", "#$ -l USE_BEEOND=1"} <= set(lines(script))


def test_grid_engine_without_a_resource_type_is_refused(tmp_path):
    with pytest.raises(BenchError, match=r"scheduler sge: constraint is empty; .*ABCI: rt_F"):
        site_file(tmp_path, "name: ge\nscheduler: sge\n")


def test_grid_engine_mpirun_reads_a_host_file_made_from_the_jobs_hosts(tmp_path):
    script = render(load_site("abci"), Job(bench="deepcam", nodes=2))
    assert 'mpirun --hostfile "$HOSTS_DIR/all" -np 8 --map-by ppr:4:node:PE=10 --bind-to core -x PATH ' \
           '-x LD_LIBRARY_PATH "$PYTHON"' in script
    pe_hostfile = tmp_path / "pe_hostfile"  # Grid Engine's format: host, slots, queue, processors
    pe_hostfile.write_text("g0001 4 gpu@g0001 UNDEFINED\ng0002 4 gpu@g0002 UNDEFINED\ng0001 4 gpu@g0001 UNDEFINED\n")
    env = {"PATH": os.environ["PATH"], "OUTPUT_ROOT": str(tmp_path), "JOB_ID": "77", "PE_HOSTFILE": str(pe_hostfile)}
    subprocess.run(["bash", "-euc", placement_block(script, "HOSTS_DIR=")], env=env, check=True)
    assert (tmp_path / "hosts-77" / "all").read_text() == "g0001 slots=4\ng0002 slots=4\n"


def test_a_grid_engine_throughput_job_gives_every_instance_a_host_file_of_its_own(tmp_path):
    script = render(load_site("abci"), Job(bench="deepcam", nodes=2, instances=3))
    assert "#$ -l rt_F=6" in lines(script)
    assert "--launcher \"mpirun --hostfile '$HOSTS_DIR/instance_{run:03d}' -np 8 " in script
    pe_hostfile = tmp_path / "pe_hostfile"
    pe_hostfile.write_text("".join(f"g000{i} 4 gpu@g000{i} UNDEFINED\n" for i in range(1, 7)))
    env = {"PATH": os.environ["PATH"], "OUTPUT_ROOT": str(tmp_path), "JOB_ID": "78", "PE_HOSTFILE": str(pe_hostfile)}
    subprocess.run(["bash", "-euc", placement_block(script, "HOSTS_DIR=")], env=env, check=True)
    hosts = tmp_path / "hosts-78"
    assert [(hosts / f"instance_{i:03d}").read_text() for i in range(3)] == \
           [f"g000{2 * i + 1} slots=4\ng000{2 * i + 2} slots=4\n" for i in range(3)]


def test_cobalt_directives_give_nodes_minutes_project_queue_and_attributes():
    script = render(load_site("theta"), Job(bench="cosmoflow", nodes=8, time_limit="01:30:00"))
    head = lines(script)[:7]
    for line in ("#COBALT --jobname cosmoflow-theta-n8", "#COBALT -n 8", "#COBALT -t 90", "#COBALT -A YourProject",
                 "#COBALT -q default",
                 "#COBALT --attrs mcdram=cache:numa=quad:ssds=required:ssd_size=128:filesystems=home,theta-fs0"):
        assert line in head
    assert 'JOB_ID="${COBALT_JOBID:-' in script


def test_aprun_starts_the_ranks_with_depth_and_threads_per_core():
    script = render(load_site("theta"), Job(bench="cosmoflow", nodes=8))
    assert 'aprun -n 32 -N 4 -d 32 -cc depth -j 2 "$PYTHON" "$SUITE_DIR/cosmoflow/train.py"' in script
    assert "export KMP_BLOCKTIME=0" in script and "export OMP_NUM_THREADS=16" in script
    # Concurrent instances: ALPS gives each aprun nodes of its own, so the launcher is the same for each.
    throughput = render(load_site("theta"), Job(bench="cosmoflow", nodes=8, instances=2))
    assert "#COBALT -n 16" in lines(throughput) and "--launcher 'aprun -n 32 -N 4 -d 32 -cc depth -j 2'" in throughput


@pytest.mark.parametrize("nodes,instances,partition", [(1, 0, "gpux4"), (4, 0, "gpux16"), (2, 2, "gpux16")])
def test_hals_partition_is_named_by_the_gpus_the_job_takes(nodes, instances, partition):
    script = render(load_site("hal"), Job(bench="deepcam", nodes=nodes, instances=instances))
    assert f"#SBATCH --partition={partition}" in lines(script)
    assert "#SBATCH --gpus-per-node=4" in lines(script)
    assert f"srun --nodes={nodes} --ntasks={4 * nodes} --ntasks-per-node=4 --cpus-per-task=40 --cpu-bind=cores " \
           f"--gpus-per-task=1" in script


def test_an_unknown_placeholder_in_the_queue_is_named(tmp_path):
    site = site_file(tmp_path, "name: q\nscheduler: slurm\nqueue: 'gpux{{ gpus }}'\n")
    with pytest.raises(BenchError, match=r"site q: queue 'gpux\{\{ gpus \}\}': unknown placeholder \{\{ gpus \}\}"):
        render(site, Job(bench="cosmoflow", nodes=1))


def test_ibrun_takes_the_tasks_from_the_allocation():
    script = render(load_site("frontera"), Job(bench="cosmoflow", nodes=16))
    assert {"#SBATCH --nodes=16", "#SBATCH --ntasks-per-node=4", "#SBATCH --ntasks=64",
            "#SBATCH --partition=normal", "#SBATCH --account=YourProject"} <= set(lines(script))
    assert 'ibrun "$PYTHON" "$SUITE_DIR/cosmoflow/train.py"' in script
    runs = render(load_site("frontera"), Job(bench="cosmoflow", nodes=16, runs=3))
    assert "--launcher ibrun \\" in runs


def test_an_ibrun_throughput_job_writes_one_launch_script_per_instance_at_its_offset(tmp_path):
    script = render(load_site("frontera"), Job(bench="deepcam", nodes=4, instances=3))
    assert "#SBATCH --ntasks=48" in lines(script) and "--launcher \"'$LAUNCH_DIR/instance_{run:03d}'\"" in script
    env = {"PATH": os.environ["PATH"], "OUTPUT_ROOT": str(tmp_path), "SLURM_JOB_ID": "9"}
    subprocess.run(["bash", "-euc", placement_block(script, "LAUNCH_DIR=")], env=env, check=True)
    for i in range(3):
        launch = tmp_path / "launch-9" / f"instance_{i:03d}"
        assert launch.read_text() == f'#!/bin/bash\nexec ibrun -n 16 -o {16 * i} task_affinity "$@"\n'
        assert os.access(launch, os.X_OK)


def test_ibrun_outside_slurm_is_refused(tmp_path):
    with pytest.raises(BenchError, match=r"launcher ibrun with scheduler pbs: ibrun \(TACC\) reads its tasks"):
        site_file(tmp_path, "name: t\nscheduler: pbs\nlauncher: ibrun\n")
