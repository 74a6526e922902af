"""What a dead worker costs an elastic run: CosmoFlow mini to its target under Horovod's elastic launcher.

A fault run starts `--workers` workers (one slot on each of as many names for this machine, since Horovod
blacklists the host of a failed worker), waits until epoch `--kill-epoch` has done about `--kill-fraction`
of its steps (judged from the previous epoch's length), SIGKILLs the worker that started as rank
`--victim-rank`, and lets the survivors finish. With `--baseline` the same elastic run without the kill
goes first. The JSON (default benchmarks/results/elastic_fault.json) holds, per run: status, epochs, final
MAE, time to train, per-epoch samples/s, and for the fault run the kill time, the reset Horovod made (size,
epoch and step rolled back to, seconds from the failure's detection to the first step after it) and the
seconds from the SIGKILL to that step. Keep the machine otherwise idle.

    .venv/bin/python benchmarks/elastic_fault.py --data demo/data/cosmo_mini/tfrecords --baseline
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import REPO, RESULTS_DIR, write_json_atomic  # noqa: E402
from common.base.procs import rank_process  # noqa: E402

CONFIG = REPO / "cosmoflow/configs/cosmo_mini.yaml"
HOST_NAMES = ("localhost", "127.0.0.1", os.uname().nodename)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="the CosmoFlow mini TFRecords (make demo makes them)")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--min-workers", type=int, default=2)
    p.add_argument("--kill-epoch", type=int, default=2)
    p.add_argument("--kill-fraction", type=float, default=0.5, help="of the epoch's steps done at the kill")
    p.add_argument("--victim-rank", type=int, default=1)
    p.add_argument("--baseline", action="store_true", help="also run without the kill, first")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "elastic_fault.json")
    p.add_argument("--timeout", type=float, default=5400, help="seconds per run")
    p.add_argument("overrides", nargs="*", help="extra key=value config overrides")
    args = p.parse_args(argv)
    if not (args.data / "manifest.json").is_file():
        p.error(f"--data {args.data}: no manifest.json there; run make demo (or scripts/mini_data.sh) first")
    if not 1 <= args.min_workers < args.workers <= len(HOST_NAMES):
        p.error(f"--min-workers {args.min_workers}, --workers {args.workers}: expected 1 <= min < workers <= "
                f"{len(HOST_NAMES)} (one host name per worker)")
    if not 0 < args.kill_fraction < 1 or args.kill_epoch < 2:
        p.error("--kill-fraction must be in (0, 1) and --kill-epoch >= 2 (the epoch before it gives the timing)")
    return args


def events(log: Path) -> list[dict]:
    if not log.is_file():
        return []
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines() if ":::MLLOG" in line]


def epoch_starts(log: Path) -> dict[int, float]:
    """epoch number -> time.time() of its (first) epoch_start."""
    starts = {}
    for e in events(log):
        if e["key"] == "epoch_start":
            starts.setdefault(e["metadata"]["epoch_num"], e["time_ms"] / 1000)
    return starts


def launch(args, work: Path, out: Path) -> subprocess.Popen:
    hosts = work / "hosts.txt"
    hosts.write_text("".join(f"{name}:1\n" for name in HOST_NAMES[:args.workers]))
    discover = work / "discover.sh"
    discover.write_text(f"#!/bin/sh\nexec {sys.executable} -m common.runtime.elastic_procs hosts {hosts}\n")
    discover.chmod(0o755)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "HOROVOD_GLOO_TIMEOUT_SECONDS": "5",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [str(Path(sys.executable).with_name("horovodrun")), "--network-interface", "lo", "-np", str(args.workers),
           "--min-np", str(args.min_workers), "--max-np", str(args.workers), "--host-discovery-script", str(discover),
           sys.executable, str(REPO / "cosmoflow/train.py"), str(CONFIG), f"data.dir={args.data.resolve()}",
           f"run.output_dir={out}", "dist.elastic.enabled=true", "data.uneven_files=drop", *args.overrides]
    print("$ " + " ".join(cmd), flush=True)
    with open(work / "horovodrun.log", "w") as output:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT)


def kill_mid_epoch(args, launcher: subprocess.Popen, log: Path) -> float:
    """SIGKILL the victim about kill_fraction into epoch kill_epoch; returns time.time() of the kill."""
    victim = rank_process(launcher.pid, args.victim_rank, timeout=600)
    while launcher.poll() is None:
        starts = epoch_starts(log)
        if args.kill_epoch in starts:
            length = starts[args.kill_epoch] - starts[args.kill_epoch - 1]
            time.sleep(max(0.0, starts[args.kill_epoch] + args.kill_fraction * length - time.time()))
            victim.send_signal(signal.SIGKILL)
            killed = time.time()
            print(f"killed rank {args.victim_rank} (pid {victim.pid}) {killed - starts[args.kill_epoch]:.1f} s into "
                  f"epoch {args.kill_epoch} (the previous epoch took {length:.1f} s)", flush=True)
            return killed
        time.sleep(0.5)
    raise SystemExit(f"the run ended (exit {launcher.returncode}) before epoch {args.kill_epoch}")


def run_once(args, kill: bool, work: Path) -> dict:
    out = work / "run"
    launcher = launch(args, work, out)
    killed = None
    try:
        if kill:
            killed = kill_mid_epoch(args, launcher, out / "mlperf.log")
        launcher.wait(timeout=args.timeout)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    summary_path = out / "summary.json"
    if not summary_path.is_file():
        tail = (work / "horovodrun.log").read_text()[-4000:]
        raise SystemExit(f"no {summary_path} (horovodrun exit {launcher.returncode}); its output ends:\n{tail}")
    return figures(json.loads(summary_path.read_text()), events(out / "mlperf.log"), killed)


def figures(summary: dict, log: list[dict], killed: float | None) -> dict:
    run_start = next(e["time_ms"] / 1000 for e in log if e["key"] == "run_start")
    result = {key: summary[key] for key in ("status", "epochs", "final_metric", "time_to_train_seconds", "ranks",
                                            "loader", "samples_per_second_steady")}
    result["epochs_samples_per_second"] = [round(h.get("samples_per_second", 0.0), 1) for h in summary["history"]]
    result["epochs_train_seconds"] = [round(h.get("train_seconds", 0.0), 1) for h in summary["history"]]
    result["elastic"] = summary.get("elastic")
    if killed is not None:
        resets = [e for e in log if e["key"] == "elastic_reset"]
        result["killed_after_run_start_seconds"] = round(killed - run_start, 2)
        if resets:
            result["kill_to_first_step_seconds"] = round(resets[0]["time_ms"] / 1000 - killed, 2)
    return result


def main(argv=None) -> None:
    args = parse_args(argv)
    report = {"command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]), "host": platform.node(),
              "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"), "workers": args.workers,
              "min_workers": args.min_workers, "kill_epoch": args.kill_epoch, "kill_fraction": args.kill_fraction,
              "victim_rank": args.victim_rank, "runs": {}}
    for kind in (["baseline"] if args.baseline else []) + ["fault"]:
        work = Path(tempfile.mkdtemp(prefix=f"elastic-{kind}-"))
        print(f"{kind} run in {work} (kept: its horovodrun.log and run/)", flush=True)
        t0 = time.perf_counter()
        report["runs"][kind] = run_once(args, kind == "fault", work)
        report["runs"][kind]["wall_seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(report["runs"][kind], indent=1), flush=True)
        write_json_atomic(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
