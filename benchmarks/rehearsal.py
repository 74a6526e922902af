"""Rehearsals at many ranks on one node: emulated accelerators (train.emulate) need no compute, so one node can
run the rank counts a cluster would, over the real input path and Horovod (issue 50 §2).

    python benchmarks/rehearsal.py [--apps cosmoflow deepcam] [--ranks 8 16] [--fit-gib 20] [--slurm 16]
        [--work DIR] [--out benchmarks/results/rehearsal.json] [--append]

For each application and rank count, under horovodrun on localhost:
1. `run`: two emulated epochs (h100-hpc rates, local batch 1), staged by rank
   (data.stage_mode=rank) and by node share (node_share, which reshuffles the node's share every epoch), each
   checked: exit 1 (an emulated run never reaches its target); the MLPerf log's events (one run_start and
   run_stop, an epoch_start and epoch_stop per epoch, an eval_stop per evaluation) and the compliance checker's
   verdict (the quality target only); the sharding from each rank's I/O report (every training sample once per
   epoch: the ranks' planned records add up to epochs x the split, each rank's to its steps x local batch, and
   the bytes the ranks read add up to at least those records' bytes).
2. `stop`: the same run with more epochs, SIGUSR1 to a few ranks (1, the middle one and the last) in the first
   epoch: every rank stops after the same step with a checkpoint (exit 75);
3. `resume`: checkpoint.resume=true: the input position restored exactly (DALI's stream replayed to the step),
   the run ends as an uninterrupted one would (its epochs, its last epoch's steps).
Each run's start-up (launch to run_start), per-step overhead (the wall time of a measured step beyond its
emulated compute, input wait included), the step's allreduce (its time, and the part a step waited for beyond
its emulated compute), delivered samples/s, AU and each rank's peak RSS are recorded. With
--fit-gib, the largest count whose ranks fit in that memory (at the largest peak RSS a rank has shown so far)
is rehearsed last. With --slurm N (as root), a rendered campaign of two N-rank emulated CosmoFlow
runs is submitted to a one-node Slurm on this host that declares N CPUs (jobs/localslurm.py, overcommitted).
Writes benchmarks/results/rehearsal.json and the table between its markers in docs/performance.md.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import (DOC, REPO, RESULTS_DIR, measured_on, replace_marked_section, run_header, sgemm_gflops,
                     write_json_atomic)

sys.path.insert(0, str(REPO))
from common.base.mlperf_log import read_events  # noqa: E402
from common.base.procs import rank_process  # noqa: E402
from common.campaign.compliance import check_log  # noqa: E402

RESULTS = RESULTS_DIR / "rehearsal.json"
BEGIN, END = "<!-- rehearsal:begin -->", "<!-- rehearsal:end -->"
BIN = Path(sys.executable).parent
APPS = {  # config, overrides, dataset maker
    "cosmoflow": ("cosmoflow/configs/cosmo_mini.yaml", ["model.input_shape=[16,16,16,4]",
                                                        "model.conv_filters=[16,32,64,128]",
                                                        "train.local_batch_size=1"]),
    "deepcam": ("deepcam/configs/deepcam_mini.yaml", ["train.local_batch_size=1", "train.eval_every_steps=0"]),
}
COMMON = ["train.emulate.accelerator=h100-hpc", "tensorboard.enabled=false", "system.window_steps=0"]
STOPPED = 75


def make_data(app: str, work: Path, ranks: int) -> Path:
    """The rehearsal's dataset for `ranks` ranks, made once with data_prep: 24 training and 8 validation samples
    per rank, one per file (CosmoFlow: 16^3 universes; DeepCAM: 96 x 144 snapshots), so that every staging mode
    divides it evenly."""
    out = work / f"{app}-data-{ranks}"
    if (out / "tfrecords" / "manifest.json").is_file():
        return out / "tfrecords"
    py, train, val = [sys.executable, "-m", "data_prep"], 24 * ranks, 8 * ranks
    steps = ([[*py, "cosmo-synth", "--out", out / "raw", "--universes", train + val, "--size", "16", "--box-size",
               "128", "--prior", "mini", "--seed", "7"],
              [*py, "cosmo-convert", "--input", out / "raw", "--out", out / "tfrecords", "--sample-size", "16",
               "--val-universes", val, "--seed", "7"]] if app == "cosmoflow" else
             [[*py, "deepcam-synth", "--out", out / "raw", "--train", train, "--validation", val, "--height", "96",
               "--width", "144", "--seed", "2026"],
              [*py, "deepcam-convert", "--input", out / "raw", "--out", out / "tfrecords"]])
    for step in steps:
        subprocess.run([str(s) for s in step], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return out / "tfrecords"


def launch(app: str, ranks: int, out: Path, overrides: list[str]) -> subprocess.Popen:
    config, own = APPS[app]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "FI_PROVIDER": "none",
           "PYTHONPATH": str(REPO)}
    command = [str(BIN / "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}", sys.executable,
               str(REPO / app / "train.py"), str(REPO / config), *own, *COMMON, f"run.output_dir={out}", *overrides]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, out: Path, launched: float, lines: tuple = ()) -> dict:
    """Wait for a run; its exit code, output tail, start-up seconds, summary and events."""
    rest, _ = proc.communicate(timeout=3600)
    output = "".join(lines) + rest
    out.mkdir(parents=True, exist_ok=True)
    (out / "launcher.log").write_text(output)
    events = read_events(out / "mlperf.log") if (out / "mlperf.log").is_file() else []
    start = next((e["time_ms"] / 1000 for e in events if e["key"] == "run_start"), None)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    return {"code": proc.returncode, "tail": output[-3000:], "startup_seconds": start - launched if start else None,
            "summary": summary, "events": events}


def count(events: list[dict], key: str) -> int:
    return sum(e["key"] == key for e in events)


def checks_of_run(result: dict, out: Path, epochs: int) -> dict:
    """What a finished emulated run must show: (name -> passed)."""
    summary, events = result["summary"], result["events"]
    if not summary or not (out / "io_report.json").is_file():
        return {"the run finished": False}
    evaluations = summary.get("history", [])
    found = {"exit 1 (target not reached)": result["code"] == 1 or "exit with status code 1" in result["tail"],
             "one run_start, one run_stop": count(events, "run_start") == 1 == count(events, "run_stop"),
             f"{epochs} epoch_start and epoch_stop": count(events, "epoch_start") == epochs == count(events,
                                                                                                   "epoch_stop"),
             "an eval_stop per evaluation": count(events, "eval_stop") == len([h for h in evaluations
                                                                               if "val_loss" in h]) > 0,
             "checker: only the target failed": check_log(out / "mlperf.log").only_target_failed}
    return found | sharding_checks(out, summary, epochs)


def sharding_checks(out: Path, summary: dict, epochs: int) -> dict:
    """Every training sample once per epoch, from each rank's I/O report."""
    report = json.loads((out / "io_report.json").read_text())
    ranks, batch = report["ranks"], summary["config"]["train"]["local_batch_size"]
    steps = [h["steps"] for h in summary["history"]]
    planned = [r["planned"]["train_records"] for r in ranks]
    read = sum(r["measured"].get("rchar", 0) for r in ranks)
    return {"ranks' training records = epochs x split": sum(planned) == epochs * summary["train_samples"],
            "each rank's records = its steps x local batch": all(p == sum(steps) * batch for p in planned),
            "bytes read >= the planned records' bytes": read >= report["totals"]["planned_bytes"]}


def figures_of(result: dict) -> dict:
    emulation, system = result["summary"].get("emulation") or {}, result["summary"].get("system") or {}
    per_rank = emulation.get("per_rank", [])
    overhead = [(r["wall_seconds"] - r["compute_seconds"]) / r["measured_steps"] for r in per_rank
                if r.get("measured_steps")]
    rss = system.get("peak_rss_mb") or []
    allreduce = [r["allreduce_ms_per_step"] for r in per_rank if r.get("allreduce_ms_per_step") is not None]
    exposed = [r["allreduce_exposed_ms_per_step"] for r in per_rank
               if r.get("allreduce_exposed_ms_per_step") is not None]
    return {"startup_seconds": result["startup_seconds"], "au": emulation.get("au"),
            "allreduce_ms_per_step": sum(allreduce) / len(allreduce) if allreduce else None,
            "allreduce_exposed_ms_per_step": sum(exposed) / len(exposed) if exposed else None,
            "samples_per_second": emulation.get("samples_per_second"),
            "step_overhead_ms": 1e3 * sum(overhead) / len(overhead) if overhead else None,
            "rss_mb_max": max(rss) if rss else None, "rss_mb_mean": sum(rss) / len(rss) if rss else None}


def rehearse_run(app: str, data: Path, ranks: int, work: Path, mode: str) -> dict:
    """Two emulated epochs staged by `mode` (rank or node_share): checks and figures."""
    out = work / f"{app}-{ranks}-{mode}"
    stage = work / "stage" / out.name
    launched = time.time()
    result = finish(launch(app, ranks, out, [f"data.dir={data}", f"data.stage_dir={stage}",
                                             f"data.stage_mode={mode}", "train.max_epochs=2"]), out, launched)
    return {"checks": checks_of_run(result, out, 2), "figures": figures_of(result), "output": str(out),
            **({"tail": result["tail"]} if result["code"] not in (0, 1) else {})}


def rehearse_stop_and_resume(app: str, data: Path, ranks: int, work: Path, epochs: int = 3) -> dict:
    """SIGUSR1 to a few ranks in the first epoch: all stop after one step with a checkpoint; the resumed run
    replays its input to that step and ends as an uninterrupted run would."""
    out = work / f"{app}-{ranks}-stop"
    overrides = [f"data.dir={data}", f"train.max_epochs={epochs}", "checkpoint.keep_trained=false"]
    launched = time.time()
    proc, lines = launch(app, ranks, out, overrides), []
    for line in proc.stdout:
        lines.append(line)
        if "step " in line or "epoch   1/" in line:  # a progress line: training is under way
            break
    victims = sorted({1, ranks // 2, ranks - 1} - {0}) if ranks > 1 else [0]
    for rank in victims if proc.poll() is None else []:  # (a run that ended before training: its tail says why)
        rank_process(proc.pid, rank).send_signal(signal.SIGUSR1)
    stopped = finish(proc, out, launched, tuple(lines))
    checkpoints = sorted((out / "checkpoints").glob("ckpt-*"))
    meta = json.loads((checkpoints[-1] / "meta.json").read_text()) if checkpoints else {}
    resumed = finish(launch(app, ranks, out, [*overrides, "checkpoint.resume=true"]), out, time.time())
    history = resumed["summary"].get("history", [])
    per_rank = (stopped["summary"].get("emulation") or {}).get("per_rank", [])
    checks = {"stopped: exit 75": stopped["code"] == STOPPED or f"status code {STOPPED}" in stopped["tail"],
              "every rank stopped after the same step": len(per_rank) == ranks and len(
                  {r["training_steps"] for r in per_rank}) == 1,
              "a checkpoint of the step": bool(meta) and stopped["summary"].get("stopped") is True,
              "resumed from it": resumed["summary"].get("resumed_from", {}).get("step") == meta.get(
                  "progress", {}).get("step"),
              "input replayed to the step": "the data order is the uninterrupted run's" in resumed["tail"],
              "the resumed run ends as an uninterrupted one": (resumed["code"] == 1 or "status code 1" in
                                                               resumed["tail"]) and len(history) == epochs}
    return {"signalled_ranks": victims, "stopped_at": meta.get("progress", {}).get("step"),
            "checks": checks, "output": str(out)}


def rehearse_slurm(app: str, data: Path, ranks: int, work: Path, runs: int = 2) -> dict:
    """A rendered campaign of `runs` emulated runs of `ranks` tasks, submitted to a one-node Slurm on this host
    whose node declares `ranks` CPUs (overcommitted): every run ends with `ranks` ranks and a log that fails only
    on the target."""
    import yaml
    from jobs.localslurm import local_slurm, submit
    from jobs.render import Job, render
    from jobs.site import load_site
    root = work / f"slurm-{app}-{ranks}"
    root.mkdir(parents=True, exist_ok=True)
    config, own = APPS[app]
    site = root / "site.yaml"
    site.write_text(yaml.safe_dump({
        "name": "rehearsal", "description": f"{ranks} tasks on one overcommitted node", "scheduler": "slurm",
        "launcher_args": "--mpi=pmix", "time_limit": "02:00:00", "ranks_per_node": ranks, "cpus_per_rank": 1,
        "python": sys.executable, "suite_dir": str(REPO), "data": {app: str(data)},
        "output_root": str(root / "out"), "stage_dir": "", "env": {"PYTHONPATH": str(REPO), "FI_PROVIDER": "none"}}))
    script = root / "job.sh"
    script.write_text(render(load_site(str(site)), Job(bench=app, nodes=1, config=config, runs=runs,
                                                       overrides=(*own, *COMMON, "train.max_epochs=2"))))
    t0 = time.time()
    with local_slurm(ranks) as env:
        code, _, output = submit(script, env, root, timeout=7200, cwd=root)
    summaries = [json.loads(p.read_text()) for p in sorted((root / "out").glob("campaign-*/runs/run_*/summary.json"))]
    logs = sorted((root / "out").glob("campaign-*/runs/run_*/mlperf.log"))
    checks = {f"{runs} runs, each of {ranks} ranks": len(summaries) == runs and all(
                  s.get("ranks") == ranks and s.get("emulation", {}).get("accelerators") == ranks for s in summaries),
              "every log fails only on the target": len(logs) == runs and all(
                  check_log(log).only_target_failed for log in logs)}
    return {"ranks": ranks, "job_exit_code": code, "seconds": time.time() - t0, "checks": checks,
            "passed": all(checks.values()), "output_tail": output[-2000:], "script": str(script)}


def largest_fitting(results: list[dict], fit_gib: float) -> int:
    """The rank count whose ranks fit in `fit_gib` at the largest peak RSS a rank has shown."""
    rss = [r["figures"]["rss_mb_max"] for r in results if r["figures"].get("rss_mb_max")]
    return int(fit_gib * 1024 // max(rss)) if rss else 0


def rehearse(app: str, ranks: list[int], fit_gib: float, work: Path, saved=lambda _entry: None) -> list[dict]:
    """Each rank count's rehearsal (`saved` is called with each as it ends), then the largest that fits."""
    done = []
    counts = list(ranks)
    while counts:
        n = counts.pop(0)
        print(f"{app}: {n} ranks ...", flush=True)
        data = make_data(app, work, n)
        entry = {"ranks": n, **{mode: rehearse_run(app, data, n, work, mode) for mode in ("rank", "node_share")}}
        entry["stop_resume"] = rehearse_stop_and_resume(app, data, n, work)
        entry["figures"] = entry["rank"]["figures"]
        entry["passed"] = all(all(entry[k]["checks"].values()) for k in ("rank", "node_share", "stop_resume"))
        print(json.dumps({"ranks": n, "passed": entry["passed"], **entry["figures"]}), flush=True)
        done.append(entry)
        saved(entry)
        fit = largest_fitting(done, fit_gib) if fit_gib and not counts else 0
        if fit > max(e["ranks"] for e in done):
            counts.append(fit)  # the largest count that fits, once the others have measured a rank's memory
    return done


def table(result: dict) -> str:
    """The rehearsals' table for docs/performance.md: a row per application and rank count, its run's caption
    under it."""
    rows = ["| benchmark | ranks | checks passed | start-up (s) | allreduce ms/step (beyond compute) | "
            "step overhead (ms) | samples/s | AU | peak RSS per rank (MB) |", "|---|---|---|---|---|---|---|---|---|"]
    runs = []
    for app, entries in result["apps"].items():
        for e in entries:
            f, checks = e["figures"], [c for k in ("rank", "node_share", "stop_resume") for c in e[k]["checks"].values()]
            run = measured_on(e["run"])
            runs += [run] if run not in runs else []
            rows.append(f"| {app} | {e['ranks']} | {sum(checks)} of {len(checks)} | {_fmt(f['startup_seconds'], 0)} | "
                        f"{_fmt(f.get('allreduce_ms_per_step'), 1)} ({_fmt(f.get('allreduce_exposed_ms_per_step'), 1)})"
                        f" | {_fmt(f['step_overhead_ms'], 1)} | {_fmt(f['samples_per_second'], 0)} | "
                        f"{_fmt(f['au'], 3)} | {_fmt(f['rss_mb_max'], 0)} |")
    slurm = result.get("slurm")
    notes = [f"Slurm: a rendered campaign of 2 runs of {slurm['ranks']} ranks on a local Slurm declaring "
             f"{slurm['ranks']} CPUs: {'passed' if slurm['passed'] else 'failed'} ({slurm['seconds']:.0f} s)."] \
        if slurm else []
    return "\n".join(rows + [""] + [f"Run{'s' if len(runs) > 1 else ''}: " + " / ".join(runs)] + notes)


def _fmt(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--apps", nargs="+", default=list(APPS), choices=list(APPS))
    parser.add_argument("--ranks", nargs="+", type=int, default=[8, 16])
    parser.add_argument("--fit-gib", type=float, default=20.0, help="0: no largest-that-fits count")
    parser.add_argument("--work", default="", help="datasets and runs (default: a temporary directory)")
    parser.add_argument("--slurm", type=int, default=0, metavar="N",
                        help="also a campaign of N-rank emulated CosmoFlow runs under a local Slurm (needs root)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--append", action="store_true",
                        help="add to --out's rehearsals (each entry keeps its own header) instead of replacing them")
    args = parser.parse_args(argv)
    import tempfile
    work = Path(args.work or tempfile.mkdtemp(prefix="rehearsal-"))
    header = run_header(sgemm_gflops()) | {"fit_gib": args.fit_gib, "work": str(work)}
    result = json.loads(args.out.read_text()) if args.append and args.out.is_file() else header | {"apps": {}}
    for app in args.apps:
        def save(entry: dict, app: str = app) -> None:
            result["apps"].setdefault(app, []).append(entry | {"run": header})
            write_json_atomic(args.out, result)
        rehearse(app, args.ranks, args.fit_gib, work, save)
    if args.slurm:
        print(f"slurm: a campaign of {args.slurm}-rank runs ...", flush=True)
        result["slurm"] = rehearse_slurm("cosmoflow", make_data("cosmoflow", work, args.slurm), args.slurm, work)
        write_json_atomic(args.out, result)
    replace_marked_section(DOC, BEGIN, END, table(result))
    failed = [f"{app} {e['ranks']}" for app, entries in result["apps"].items() for e in entries if not e["passed"]]
    failed += ["slurm"] if args.slurm and not result["slurm"]["passed"] else []
    print(f"wrote {args.out}; " + (f"failed: {', '.join(failed)}" if failed else "every rehearsal passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
