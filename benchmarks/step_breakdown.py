"""Where an application's training step goes, by kind of op, in float32 and in mixed_bfloat16.

    python benchmarks/step_breakdown.py [--app cosmoflow] [--config cosmoflow/configs/cosmo_mini.yaml]
        [--threads 1] [--warmup 3] [--out benchmarks/results/step_breakdown_<app>.json] [overrides ...]

For each precision a fresh process (a Keras policy is global) builds the step `train.precision=auto`'s probe
times (common/runtime/precision_measure.py's probe_step: forward, backward and update on a synthetic batch of the
config's shape and local batch, on --threads threads: 1 is a rank's share in the 2-rank demo), warms it up,
and traces one step with TensorFlow's profiler, one op at a time (inter-op parallelism 1). The op threads'
seconds are summed by kind: convolution forward, weight and input gradients (dense and depthwise), pooling,
matrix products, casts (what mixed_bfloat16 adds), and the rest (element-wise ops, batch norm, the optimizer's
update, ...; its largest op types are listed). Writes the two breakdowns, the traced step seconds and the host (CPU, ISA flags) as JSON.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from deepcam_profile import kind_of, traced_step
from harness import REPO, RESULTS_DIR, run_header, sgemm_gflops, write_json_atomic

PRECISIONS = ("float32", "mixed_bfloat16")
CONFIGS = {"cosmoflow": "cosmoflow/configs/cosmo_mini.yaml", "deepcam": "deepcam/configs/deepcam_mini.yaml"}


def category(op_type: str) -> str:
    """The kind of an op type for the breakdown."""
    conv = kind_of(op_type)
    if conv:
        return f"conv_{conv}"
    if "Pool" in op_type:
        return "pooling"
    if "MatMul" in op_type or "Einsum" in op_type:
        return "matmul"
    if op_type == "Cast":
        return "cast"
    return "other"


def op_seconds(xspace, top: int = 10) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per category on TensorFlow's op threads (`tf_Compute` lines) of a profiler XSpace, and the `top`
    op types of the `other` category with theirs."""
    table: collections.Counter = collections.Counter()
    others: collections.Counter = collections.Counter()
    for plane in xspace.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                op, _, op_type = name.rpartition(":")
                if op and "::" not in name:  # an op is "name:Type"; "ExecutorState::Process" encloses them
                    table[category(op_type)] += event.duration_ps / 1e12
                    if category(op_type) == "other":
                        others[op_type] += event.duration_ps / 1e12
    return dict(table), dict(others.most_common(top))


def worker(app: str, config: str, precision: str, threads: int, warmup: int, overrides: list[str]) -> dict:
    sys.path.insert(0, str(REPO))
    from common.runtime.precision_measure import probe_step
    steps, x, y = probe_step(app, config, precision, threads, [*overrides, "dist.inter_op_threads=1"])
    for _ in range(warmup):
        float(steps.train(x, y))
    with tempfile.TemporaryDirectory() as logdir:
        seconds, xspace = traced_step(steps.train, x, y, logdir)
    table, others = op_seconds(xspace)
    return {"precision": precision, "traced_step_seconds": seconds, "op_seconds": table, "other_top": others}


def run_worker(args, precision: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", precision, "--app", args.app, "--config", args.config,
           "--threads", str(args.threads), "--warmup", str(args.warmup), *args.overrides]
    print(f"  {args.app} {precision} ...", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(cmd[1:])} failed with exit {proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--app", choices=list(CONFIGS), default="cosmoflow")
    p.add_argument("--config", help="default: the application's mini config")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", type=Path)
    p.add_argument("--worker", choices=PRECISIONS, help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    args.config = str(REPO / (args.config or CONFIGS[args.app]))
    if args.worker:
        print(json.dumps(worker(args.app, args.config, args.worker, args.threads, args.warmup, args.overrides)))
        return
    result = {**run_header(sgemm_gflops()), "app": args.app, "config": args.config, "threads": args.threads,
              "overrides": args.overrides, "precisions": [run_worker(args, precision) for precision in PRECISIONS]}
    out = args.out or RESULTS_DIR / f"step_breakdown_{args.app}.json"
    write_json_atomic(out, result)
    for r in result["precisions"]:
        parts = ", ".join(f"{k} {v:.4f}" for k, v in sorted(r["op_seconds"].items(), key=lambda kv: -kv[1]))
        print(f"{r['precision']}: traced step {r['traced_step_seconds']:.4f} s; op seconds: {parts}")
        print("  other: " + ", ".join(f"{k} {v:.4f}" for k, v in r["other_top"].items()))
    print(f"wrote {out} ({result['cpu']}; {result['isa_flags']})")


if __name__ == "__main__":
    main()
