"""A single-node Slurm on this host, for running rendered Slurm scripts for real (docs/jobs.md).

    python -m jobs.localslurm submit SCRIPT [--dir DIR] [--timeout SECONDS] [--cpus N]

starts munged, slurmctld and slurmd from Debian's packages (scripts/setup.sh installs them) with a
one-node `slurm.conf` (this host, its cores, 80% of its memory, free ports) in a fresh directory under
/tmp, waits for the node to be idle, submits SCRIPT with `sbatch --wait` from the current directory,
prints the job's output, stops the daemons, removes their directory, and exits with the job's exit code.
Needs root (the daemons run as root and munge). `local_slurm()` is the same cluster as a context manager,
which tests/integration/test_slurm.py uses.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from common.base.cli import guarded
from common.base.errors import BenchError

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scancel")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def slurm_conf(root: Path, host: str, cpus: int = 0) -> str:
    """A one-node cluster's configuration: state, spool, logs and the munge socket under `root`. `cpus`: the CPUs
    the node declares (0: this host's); more than it has overcommits them (slurmd's config_overrides), so that a
    job of that many tasks can run here, as a rehearsal of many ranks on one node."""
    memory_mb = int(int(Path("/proc/meminfo").read_text().split()[1]) / 1024 * 0.8)
    overrides = ["SlurmdParameters=config_overrides"] if cpus > (os.cpu_count() or 1) else []
    return "\n".join([*overrides,
        "ClusterName=scimllocal", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", f"AuthInfo=socket={root}/munge/munge.socket", "CredType=cred/munge",
        f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd.log",
        f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "SchedulerType=sched/builtin", "MpiDefault=none", "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        # no accounting database: `scontrol show job` keeps ended jobs' state and exit code for an hour
        "MinJobAge=3600",
        f"NodeName={host} CPUs={max(cpus, os.cpu_count() or 1)} RealMemory={memory_mb} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP", ""])


def check_prerequisites() -> None:
    missing = [d for d in DAEMONS if not shutil.which(d) and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        raise BenchError(f"a local Slurm needs {', '.join(missing)}, not found on PATH or in /usr/sbin: "
                         f"scripts/setup.sh installs Debian's munge, slurmctld, slurmd and slurm-client")
    if os.geteuid() != 0:
        raise BenchError(f"starting munged, slurmctld and slurmd needs root; this is uid {os.geteuid()}")


def _start_daemons(root: Path, env: dict) -> None:
    munge = f"/usr/sbin/munged --socket={root}/munge/munge.socket --pid-file={root}/munge/munged.pid " \
            f"--log-file={root}/munge/munged.log --seed-file={root}/munge/seed"
    subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", munge], check=True)
    subprocess.run(["/usr/sbin/slurmctld", "-f", env["SLURM_CONF"]], check=True, env=env)
    subprocess.run(["/usr/sbin/slurmd", "-f", env["SLURM_CONF"]], check=True, env=env)


def _wait_idle(root: Path, env: dict, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                         text=True).stdout.strip() != "idle":
        if time.time() > deadline:
            log = (root / "slurmctld.log").read_text()[-3000:] if (root / "slurmctld.log").exists() else ""
            raise BenchError(f"the local Slurm node was not idle {timeout:.0f} s after start; "
                             f"end of {root / 'slurmctld.log'}:\n{log}")
        time.sleep(1)


def _stop(root: Path, env: dict) -> None:
    subprocess.run(["scancel", "--full", "--user=root"], env=env, capture_output=True)
    for pid_file in (root / "slurmd.pid", root / "slurmctld.pid", root / "munge/munged.pid"):
        if pid_file.is_file():
            subprocess.run(["kill", pid_file.read_text().strip()], capture_output=True)
    time.sleep(1)
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def local_slurm(cpus: int = 0) -> Iterator[dict]:
    """The environment (with SLURM_CONF) of a running single-node cluster whose node declares `cpus` CPUs (0: this
    host's); stopped and removed on exit."""
    check_prerequisites()
    # Not below a mode-700 directory: the munge user must reach its socket.
    root = Path(tempfile.mkdtemp(prefix="sciml-slurm-"))
    root.chmod(0o755)
    for d in ("state", "spool", "munge"):
        (root / d).mkdir()
    shutil.chown(root / "munge", "munge", "munge")
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, socket.gethostname().split(".")[0], cpus))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        _start_daemons(root, env)
        _wait_idle(root, env)
        yield env
    finally:
        _stop(root, env)


def submit(script: Path, env: dict, out_dir: Path, timeout: float, echo: bool = False,
           cwd: Path | None = None) -> tuple[int, str, str]:
    """`sbatch --wait` SCRIPT from `cwd` (default: the current directory): the exit code, sbatch's own output and the job's.
    `echo`: print the job's output as it grows (progress of a long training)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(["sbatch", "--wait", f"--output={out_dir}/slurm-%j.out", str(script)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    deadline, shown = time.time() + timeout, 0
    while proc.poll() is None:
        if time.time() > deadline:
            proc.kill()
            raise BenchError(f"{script}: the job did not finish within {timeout:.0f} s (--timeout)")
        time.sleep(2)
        shown = _echo_new(out_dir, shown) if echo else shown
    shown = _echo_new(out_dir, shown) if echo else shown
    return proc.returncode, proc.stdout.read(), _job_output(out_dir)


def _job_output(out_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(out_dir.glob("slurm-*.out")))


def _echo_new(out_dir: Path, shown: int) -> int:
    text = _job_output(out_dir)
    if len(text) > shown:
        sys.stdout.write(text[shown:])
        sys.stdout.flush()
    return len(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.localslurm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub_submit = sub.add_parser("submit", help="start a one-node Slurm, sbatch --wait SCRIPT, stop it")
    sub_submit.add_argument("script", type=Path)
    sub_submit.add_argument("--dir", type=Path, default=Path("."), help="where the job's slurm-<id>.out goes")
    sub_submit.add_argument("--timeout", type=float, default=7200, help="seconds to wait for the job")
    sub_submit.add_argument("--cpus", type=int, default=0,
                            help="CPUs the node declares (default: this host's; more overcommits them)")
    args = parser.parse_args(argv)

    def run() -> int:
        if not args.script.is_file():
            raise BenchError(f"{args.script}: no such job script")
        if args.cpus < 0:
            raise BenchError(f"--cpus {args.cpus}: expected >= 0 (0: this host's)")
        with local_slurm(args.cpus) as env:
            print(f"local Slurm up (SLURM_CONF={env['SLURM_CONF']}); sbatch --wait {args.script}", flush=True)
            t0 = time.time()
            rc, sbatch_output, _ = submit(args.script.resolve(), env, args.dir.resolve(), args.timeout, echo=True)
        print(sbatch_output.strip())
        print(f"job finished with exit code {rc} after {time.time() - t0:.0f} s (sbatch --wait)")
        return rc

    return guarded(run)


if __name__ == "__main__":
    sys.exit(main())
