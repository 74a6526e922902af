"""What two processes on this machine's cores cost each other, with no communication between them.

    python benchmarks/corun.py [--apps deepcam cosmoflow] [--steps N] [--warmup N]

Two Horovod ranks on a 2-core node train slower than one process with two threads. This separates the
machine's part of that loss from the suite's. For each benchmark, in one run, with the training-step workers
of deepcam_throughput.py (reference size, batch 1) and cosmoflow_throughput.py (128^3, batch 4):
- `1 x 2`: one process on both cores (two intra-op threads);
- `alone`: one process pinned to core 0 (`taskset -c 0`, one thread), the other core idle;
- `pair`: two independent processes at once, pinned to core 0 and core 1, one thread each: the same work as
  two ranks without any allreduce, Horovod thread or MPI;
- `2 ranks, busy-poll`: `horovodrun -np 2`, one thread each, with Open MPI polling while it waits
  (OMPI_MCA_mpi_yield_when_idle=0, Open MPI's own default);
- `2 ranks`: the same with the suite's default (dist.mpi_yield_when_idle: Open MPI yields while it waits).
`pair` against `alone` is what the two cores cost each other (shared caches, memory bandwidth, the hypervisor);
`2 ranks` against `pair` is what data parallelism adds. Each worker also reports its threads' CPU over the
timed steps (threadcpu.py): compute, Horovod's and MPI's threads, the main thread. Writes
benchmarks/results/corun.json and the two tables between their markers in docs/metrics.md.
"""
from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

from harness import (REPO, RESULTS_DIR, check_marked_section, measured_note, replace_marked_section, run_header,
                     run_worker, sgemm_gflops, step_figures, take_worker_json, worker_command, worker_env,
                     write_json_atomic)

DOC = REPO / "docs/metrics.md"  # its tables live in the page of the system figures

RESULTS = RESULTS_DIR / "corun.json"
BEGIN, END = "<!-- corun:begin -->", "<!-- corun:end -->"
CPU_BEGIN, CPU_END = "<!-- corun-cpu:begin -->", "<!-- corun-cpu:end -->"
HERE = Path(__file__).resolve().parent
# app: (worker script, its case arguments, local batch, default warm-up, default timed steps)
APPS = {"deepcam": ("deepcam_throughput.py", ["--case", "reference"], 1, 1, 2),
        "cosmoflow": ("cosmoflow_throughput.py", ["--size", "128", "--batch", "4"], 4, 1, 3)}


def pinned_workers(app: str, cores: list[int], warmup: int, steps: int) -> list[dict]:
    """Run one single-rank worker per core in `cores` at once, each pinned to its core; their results."""
    script, case, _, _, _ = APPS[app]
    procs, outs = [], []
    for core in cores:
        out = RESULTS_DIR / f".corun-{app}-{core}.json"
        cmd = ["taskset", "-c", str(core),
               *worker_command(HERE / script, [*case, "--steps", str(steps), "--warmup", str(warmup)], out)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=worker_env()))
        outs.append(out)
    logs = [p.communicate()[0] for p in procs]
    return [take_worker_json(out, proc.returncode, proc.args, log[-3000:])
            for proc, out, log in zip(procs, outs, logs)]


def measure(app: str, warmup: int | None, steps: int | None) -> dict:
    """The four layouts of `app`, one after the other; samples/s per process and in all."""
    script, case, batch, default_warmup, default_steps = APPS[app]
    warmup = default_warmup if warmup is None else warmup
    steps = default_steps if steps is None else steps
    args = [*case, "--steps", str(steps), "--warmup", str(warmup)]
    rows = {}
    rows["1 x 2"] = [run_worker(HERE / script, args, 1, RESULTS_DIR / f".corun-{app}.json", f"{app} 1 x 2")]
    print(f"  {app}: alone on core 0 ...", flush=True)
    rows["alone"] = pinned_workers(app, [0], warmup, steps)
    print(f"  {app}: pair on cores 0 and 1 ...", flush=True)
    rows["pair"] = pinned_workers(app, [0, 1], warmup, steps)
    rows["2 ranks, busy-poll"] = [run_worker(HERE / script, args, 2, RESULTS_DIR / f".corun-{app}.json",
                                             f"{app} 2 ranks, busy-poll", env={"OMPI_MCA_mpi_yield_when_idle": "0"})]
    rows["2 ranks"] = [run_worker(HERE / script, args, 2, RESULTS_DIR / f".corun-{app}.json", f"{app} 2 ranks")]
    layouts = {}
    for name, results in rows.items():
        ranks = results[0]["ranks"] if name.startswith("2 ranks") else 1
        each = [step_figures(r["step_seconds"], batch, ranks) for r in results]
        layouts[name] = {"processes": len(results) * ranks, "threads_per_process": results[0]["threads_per_rank"],
                         "samples_per_second": sum(f["samples_per_second"] for f in each),
                         "median_step_seconds": [f["median_step_seconds"] for f in each],
                         "step_seconds": [r["step_seconds"] for r in results],
                         "thread_cpu": [cpu for r in results for cpu in r["thread_cpu"]]}
    alone, pair = layouts["alone"]["samples_per_second"], layouts["pair"]["samples_per_second"]
    return {"app": app, "local_batch": batch, "layouts": layouts,
            "pair_per_process_over_alone": pair / 2 / alone,
            "ranks_over_pair": layouts["2 ranks"]["samples_per_second"] / pair,
            "ranks_over_one_by_two": layouts["2 ranks"]["samples_per_second"] / layouts["1 x 2"]["samples_per_second"]}


def table(result: dict) -> str:
    rows = ["| benchmark | 1 x 2 | alone (1 core) | pair (2 x 1, no communication) | 2 ranks, MPI busy-polling "
            "| 2 ranks (horovodrun) | pair per process / alone | 2 ranks / pair | 2 ranks / 1 x 2 |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        sps = {k: v["samples_per_second"] for k, v in r["layouts"].items()}
        rows.append(f"| {r['app']} | {sps['1 x 2']:.4g} | {sps['alone']:.4g} | {sps['pair']:.4g} "
                    f"| {sps['2 ranks, busy-poll']:.4g} | {sps['2 ranks']:.4g} "
                    f"| {r['pair_per_process_over_alone']:.2f} | {r['ranks_over_pair']:.2f} "
                    f"| {r['ranks_over_one_by_two']:.2f} |")
    return "\n".join(rows + ["\nsamples/s over all processes. " + measured_note(result).strip()])


def cpu_table(result: dict) -> str:
    """CPU seconds per timed step and process by thread role (threadcpu.py), averaged over the processes."""
    rows = ["| benchmark | layout | median step (s) | compute threads: user + system | Horovod and MPI threads "
            "| main thread | compute threads' minor faults per step |", "|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        for name, layout in r["layouts"].items():
            cpu = {role: mean_role(layout["thread_cpu"], role) for role in ("compute", "runtime", "main")}
            step = max(layout["median_step_seconds"])
            rows.append(f"| {r['app']} | {name} | {step:.2f} | {cpu['compute']['user_s']:.2f} + "
                        f"{cpu['compute']['system_s']:.2f} | {cpu_seconds(cpu['runtime']):.2f} "
                        f"| {cpu_seconds(cpu['main']):.2f} | {cpu['compute']['minor_faults']:,.0f} |")
    return "\n".join(rows)


def mean_role(processes: list[dict], role: str) -> dict:
    """One role's figures averaged over the processes."""
    return {k: sum(p[role][k] for p in processes) / len(processes) for k in processes[0][role]}


def cpu_seconds(figures: dict) -> float:
    return figures["user_s"] + figures["system_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--apps", nargs="+", choices=sorted(APPS), default=["deepcam", "cosmoflow"])
    p.add_argument("--steps", type=int, help="timed steps per process (default: deepcam 2, cosmoflow 3)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default 1)")
    args = p.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("corun needs at least 2 cores (it pins one process to core 0 and one to core 1)")
    check_marked_section(DOC, BEGIN, END)
    check_marked_section(DOC, CPU_BEGIN, CPU_END)
    print("sgemm ...", flush=True)
    result = {**run_header(sgemm_gflops())}
    result["runs"] = [measure(app, args.warmup, args.steps) for app in args.apps]
    write_json_atomic(RESULTS, result)
    replace_marked_section(DOC, BEGIN, END, table(result))
    replace_marked_section(DOC, CPU_BEGIN, CPU_END, cpu_table(result))
    print(f"wrote {RESULTS} and the table in {DOC}")


if __name__ == "__main__":
    main()
