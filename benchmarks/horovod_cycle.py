"""What Horovod's cycle time costs two ranks on one node: CosmoFlow training steps at several
HOROVOD_CYCLE_TIME values (config key dist.cycle_time_ms), data parallel and hybrid, all in one run.

    python benchmarks/horovod_cycle.py [--cycles 1 10 50] [--controllers mpi gloo] [--sizes mini full]

Each cycle, Horovod's background thread on every rank wakes and coordinates with the other ranks, whether
or not a tensor waits to be reduced; a tensor waits up to one cycle before its allreduce starts. So a short
cycle costs CPU all the time and a long one costs latency once per collective. Each case is a case of
benchmarks/mesh_throughput.py (the same worker: the app's model and steps on in-memory batches) run with
`dist.cycle_time_ms=C` under `horovodrun [--gloo] -np 2`. Recorded per case: the median step time,
samples/s, and each rank's user and system CPU seconds per step (os.times over the timed steps; a rank
that only computes uses about its wall time, what the coordination adds shows above that, mostly as system
time). Writes benchmarks/results/horovod_cycle.json and the table between the markers in
docs/metrics.md.
"""
from __future__ import annotations

import argparse
import time

# Run as a script, so benchmarks/ is on sys.path.
from harness import (REPO, RESULTS_DIR, check_marked_section, measured_note, replace_marked_section, run_header,
                     sgemm_gflops, write_json_atomic)
from mesh_throughput import SIZES, Case, measure

DOC = REPO / "docs/metrics.md"  # its tables live in the page of the system figures

RESULTS = RESULTS_DIR / "horovod_cycle.json"
BEGIN, END = "<!-- horovod-cycle:begin -->", "<!-- horovod-cycle:end -->"
CASES = {"mini": ("2:1x1", "2:2x1"), "full": ("2:1x1@4", "2:2x1@4")}
STEPS = {"mini": (60, 5), "full": (3, 1)}  # timed, warm-up


def run_case(size: str, case: Case, controller: str, cycle: float) -> dict:
    steps, warmup = STEPS[size]
    launcher = ("--gloo",) if controller == "gloo" else ()
    run = measure(size, case, steps, warmup, case.local_batch or SIZES[size].local_batch,
                  (f"dist.cycle_time_ms={cycle:g}",), launcher)
    cpu = run["cpu_seconds_per_step_per_rank"]
    return {"size": size, "case": case.label, "layout": "data" if case.spatial == (1, 1) else
            f"{case.spatial[0]}x{case.spatial[1]}", "controller": controller, "cycle_time_ms": cycle,
            "ranks": case.ranks, "local_batch": run["local_batch"], "input_shape": run["input_shape"],
            "median_step_seconds": run["median_step_seconds"], "step_seconds": run["step_seconds"],
            "samples_per_second": run["samples_per_second"], "cpu_seconds_per_step_per_rank": cpu}


def table_rows(result: dict) -> list[str]:
    rows = ["| sample | case | controller | cycle (ms) | median step (s) | samples/s | x cycle 1 ms | "
            "CPU s/step per rank: user + system |", "|---|---|---|---|---|---|---|---|"]
    runs = result["runs"]
    for r in runs:
        base = next((b for b in runs if b["cycle_time_ms"] == 1 and (b["size"], b["case"], b["controller"]) ==
                     (r["size"], r["case"], r["controller"])), None)
        ratio = f"{r['samples_per_second'] / base['samples_per_second']:.2f}" if base else "-"
        cpu = ", ".join(f"{c['user']:.2f} + {c['system']:.2f}" for c in r["cpu_seconds_per_step_per_rank"])
        layout = "data parallel" if r["layout"] == "data" else f"hybrid {r['layout']}"
        rows.append(f"| {r['input_shape'][0]}^3 | {r['ranks']} ranks, {layout}, local batch {r['local_batch']} | "
                    f"{r['controller']} | {r['cycle_time_ms']:g} | {r['median_step_seconds']:.3f} | "
                    f"{r['samples_per_second']:.2f} | {ratio} | {cpu} |")
    return rows + [measured_note(result)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", nargs="+", type=float, default=[1.0, 10.0, 50.0])
    p.add_argument("--controllers", nargs="+", choices=["mpi", "gloo"], default=["mpi"])
    p.add_argument("--sizes", nargs="+", choices=list(CASES), default=list(CASES))
    args = p.parse_args()
    if min(args.cycles) <= 0:
        p.error(f"--cycles {args.cycles}: expected values > 0 (milliseconds)")
    check_marked_section(DOC, BEGIN, END)
    print("sgemm ...", flush=True)
    gflops, started, runs = sgemm_gflops(), time.perf_counter(), []
    for size in args.sizes:
        for label in CASES[size]:
            for controller in args.controllers:
                for cycle in args.cycles:
                    runs.append(run_case(size, Case.parse(label), controller, cycle))
                    r = runs[-1]
                    print(f"    {r['samples_per_second']:.2f} samples/s, step {r['median_step_seconds']:.3f} s",
                          flush=True)
    result = {**run_header(gflops), "total_seconds": time.perf_counter() - started, "runs": runs}
    write_json_atomic(RESULTS, result)
    replace_marked_section(DOC, BEGIN, END, "\n".join(table_rows(result)))
    print(f"wrote {RESULTS} and the table in {DOC}")


if __name__ == "__main__":
    main()
