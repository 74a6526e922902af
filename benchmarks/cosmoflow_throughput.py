"""Measure CosmoFlow training throughput and this machine's sgemm rate, in one run.

    python benchmarks/cosmoflow_throughput.py [--sizes 128 32] [--ranks 1 2] [--steps 6]

For each sample size and rank count it launches a worker (under `horovodrun -np N` for N > 1)
that times real training steps (forward, backward, grouped gradient allreduce, SGD update)
of the reference network on in-memory data, batch 4 per rank, float32. It writes
benchmarks/results/cosmoflow_throughput.json and rewrites the table between the markers in
docs/performance.md. Input I/O is not part of this figure (see the loader benchmarks).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks/results/cosmoflow_throughput.json"
DOC = REPO / "docs/performance.md"
BEGIN, END = "<!-- cosmoflow-throughput:begin -->", "<!-- cosmoflow-throughput:end -->"
FILTERS = (32, 64, 128, 256, 512)


def training_gflop_per_sample(size: int, channels: int = 4, filters=FILTERS, k: int = 3) -> float:
    """Multiply-adds x2 of the conv layers, x3 for forward + both backward passes (x2 for the first
    layer, whose input gradient is not needed); the dense layers are negligible."""
    total, cin, s = 0.0, channels, size
    for i, f in enumerate(filters):
        fwd = 2.0 * k ** 3 * cin * f * s ** 3
        total += fwd * (2 if i == 0 else 3)
        cin, s = f, s // 2
    return total / 1e9


def sgemm_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best-of-N numpy float32 matrix multiply rate (all cores)."""
    a, b = (np.random.default_rng(0).random((n, n), dtype=np.float32) for _ in range(2))
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def worker(size: int, batch: int, steps: int, warmup: int, out: str) -> None:
    """Time `steps` training steps on this rank; rank 0 writes the result."""
    from common.config import DistConfig
    from common.dist import init_distributed
    dist = init_distributed(DistConfig())
    import keras

    from common.loop import _make_train_step
    from cosmoflow.metrics import mse_loss
    from cosmoflow.model import build_model
    model = build_model(input_shape=(size, size, size, 4))
    optimizer = keras.optimizers.SGD(0.001, momentum=0.9)
    optimizer.build(model.trainable_variables)
    dist.broadcast_variables(model.variables + optimizer.variables)
    step = _make_train_step(model, optimizer, mse_loss, dist)
    rng = np.random.default_rng(dist.rank)
    x = np.log1p(rng.poisson(20, (batch, size, size, size, 4))).astype(np.float32)
    y = rng.uniform(-1, 1, (batch, 4)).astype(np.float32)
    for _ in range(warmup):
        float(step(x, y))
    times = [_timed(lambda: float(step(x, y))) for _ in range(steps)]
    if dist.is_root:
        Path(out).write_text(json.dumps({"step_seconds": times, "threads_per_rank": dist.threads,
                                         "ranks": dist.size}))


def measure(size: int, ranks: int, batch: int, steps: int, warmup: int) -> dict:
    out = REPO / f"benchmarks/results/.worker-{size}-{ranks}.json"
    cmd = [sys.executable, __file__, "--worker", "--size", str(size), "--batch", str(batch),
           "--steps", str(steps), "--warmup", str(warmup), "--out", str(out)]
    if ranks > 1:
        cmd = [str(Path(sys.executable).parent / "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}"] + cmd
    print(f"  {size}^3, {ranks} rank(s): {warmup} warm-up + {steps} timed steps ...", flush=True)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"worker failed ({' '.join(cmd)}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    res = json.loads(out.read_text())
    out.unlink()
    median = float(np.median(res["step_seconds"]))
    rate = batch * ranks / median
    return {"size": size, "ranks": ranks, "local_batch": batch, "threads_per_rank": res["threads_per_rank"],
            "median_step_seconds": median, "samples_per_second": rate,
            "gflop_per_sample": training_gflop_per_sample(size),
            "achieved_gflops": rate * training_gflop_per_sample(size), "step_seconds": res["step_seconds"]}


def write_outputs(result: dict) -> None:
    tmp = RESULTS.with_name(f".{RESULTS.name}.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, RESULTS)
    rows = ["| sample | ranks x threads | samples/s | GFLOP/s achieved | fraction of sgemm |",
            "|---|---|---|---|---|"]
    for r in result["runs"]:
        rows.append(f"| {r['size']}^3 x 4 | {r['ranks']} x {r['threads_per_rank']} | {r['samples_per_second']:.2f} "
                    f"| {r['achieved_gflops']:.1f} | {r['achieved_gflops'] / result['sgemm_gflops']:.2f} |")
    rows.append(f"\nsgemm (numpy, 2048^2, float32, all cores): {result['sgemm_gflops']:.1f} GFLOP/s. "
                f"Measured {result['date']} on {result['machine']}.")
    text = DOC.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n" + "\n".join(rows) + "\n" + text[stop:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[128, 32])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.size, args.batch, args.steps, args.warmup, args.out)
    print("sgemm ...", flush=True)
    gflops = sgemm_gflops()
    runs = []
    for size in args.sizes:
        for ranks in args.ranks:
            steps = args.steps if size <= 64 else max(3, args.steps // 2)
            runs.append(measure(size, ranks, args.batch, steps * (4 if size <= 32 else 1), args.warmup))
            print(f"    {runs[-1]['samples_per_second']:.2f} samples/s", flush=True)
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} {os.cpu_count()} cores",
              "sgemm_gflops": gflops, "runs": runs}
    write_outputs(result)
    print(f"wrote {RESULTS} and the table in {DOC}")


if __name__ == "__main__":
    main()
