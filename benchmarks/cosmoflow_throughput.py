"""Measure CosmoFlow training throughput and this machine's sgemm rate, in one run.

    python benchmarks/cosmoflow_throughput.py [--sizes 128 32] [--ranks 1 2] [--steps 6] [--rounds 2]

For each sample size and rank count it launches a worker (under `horovodrun -np N` for N > 1)
that times real training steps (forward, backward, grouped gradient allreduce, SGD update)
of the reference network on in-memory data, batch 4 per rank, float32. Each size's rank counts
are measured in --rounds rounds, every second one in reverse order (1 2, 2 1), with numpy's sgemm
rate before each measurement, so that a change in the machine's speed during the run weighs on
both alike; each row pools its rounds' steps. It writes
benchmarks/results/cosmoflow_throughput.json and rewrites the table between the markers in
docs/performance.md. Input I/O is not part of this figure (see the loader benchmarks).
"""
from __future__ import annotations

import argparse

import numpy as np

# Run as a script, so benchmarks/ is on sys.path.
from harness import (DOC, RESULTS_DIR, check_marked_section, measure_groups, measured_note, ratios_line,
                     replace_marked_section, run_worker, step_figures, time_steps_with_threads,
                     write_json_atomic, write_worker_result)
from threadcpu import started_threads

RESULTS = RESULTS_DIR / "cosmoflow_throughput.json"
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


def worker(size: int, batch: int, steps: int, warmup: int, out: str, precision: str = "float32") -> None:
    """Time `steps` training steps on this rank in `precision` (a Keras policy); rank 0 writes the result."""
    from common.runtime.config import DistConfig
    from common.runtime.dist import init_distributed
    dist, runtime_threads = started_threads(lambda: init_distributed(DistConfig()))
    import keras
    import tensorflow as tf

    from common.runtime.strategy import make_train_step
    from cosmoflow.model import build_model, mse_loss
    keras.mixed_precision.set_global_policy(precision)  # as the run sets train.precision, before the model
    model = build_model(input_shape=(size, size, size, 4))
    optimizer = keras.optimizers.SGD(0.001, momentum=0.9)
    optimizer.build(model.trainable_variables)
    dist.broadcast_variables(model.variables + optimizer.variables)
    step = make_train_step(model, optimizer, mse_loss, dist)
    rng = np.random.default_rng(dist.rank)
    # Tensors once, as the input pipeline hands them over: no 134 MB numpy copy inside each timed step.
    x = tf.convert_to_tensor(np.log1p(rng.poisson(20, (batch, size, size, size, 4))).astype(np.float32))
    y = tf.convert_to_tensor(rng.uniform(-1, 1, (batch, 4)).astype(np.float32))
    times, thread_cpu = time_steps_with_threads(lambda: float(step(x, y)), warmup, steps, runtime_threads, dist)
    write_worker_result(out, times, dist, thread_cpu=thread_cpu)


def measure(size: int, ranks: int, batch: int, steps: int, warmup: int, precision: str = "float32") -> dict:
    """Time one size on `ranks` ranks in a worker process, in `precision`; the figures of one table row."""
    args = ["--size", str(size), "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup),
            "--precision", precision]
    res = run_worker(__file__, args, ranks, RESULTS_DIR / f".worker-{size}-{ranks}.json",
                     f"{size}^3, {ranks} rank(s), {precision}: {warmup} warm-up + {steps} timed steps")
    figures = step_figures(res["step_seconds"], batch, ranks)
    return {"size": size, "ranks": ranks, "local_batch": batch, "threads_per_rank": res["threads_per_rank"],
            **figures, "gflop_per_sample": training_gflop_per_sample(size),
            "achieved_gflops": figures["samples_per_second"] * training_gflop_per_sample(size),
            "step_seconds": res["step_seconds"]}


def write_outputs(result: dict) -> None:
    write_json_atomic(RESULTS, result)
    rows = ["| sample | ranks x threads | samples/s | GFLOP/s achieved | fraction of sgemm |",
            "|---|---|---|---|---|"]
    for r in result["runs"]:
        rows.append(f"| {r['size']}^3 x 4 | {r['ranks']} x {r['threads_per_rank']} | {r['samples_per_second']:.2f} "
                    f"| {r['achieved_gflops']:.1f} | {r['achieved_gflops'] / r['sgemm_gflops']:.2f} |")
    line = ratios_line(result.get("rank_ratios", ()), lambda x: f"{x['size']}^3")
    rows += [line] if line else []
    rows.append(measured_note(result))
    replace_marked_section(DOC, BEGIN, END, "\n".join(rows))


def steps_for(size: int, steps: int) -> int:
    """Timed steps at `size`: half of --steps (at least 3) above 64^3, four times it at 32^3 and below."""
    return (steps if size <= 64 else max(3, steps // 2)) * (4 if size <= 32 else 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[128, 32])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2,
                   help="measurements of each row, in alternating order of the rank counts (default: 2)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, help=argparse.SUPPRESS)
    p.add_argument("--precision", default="float32", help=argparse.SUPPRESS)  # the worker's Keras policy
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: expected at least 1")
    if args.worker:
        return worker(args.size, args.batch, args.steps, args.warmup, args.out, args.precision)
    check_marked_section(DOC, BEGIN, END)
    result = measure_groups("size", args.sizes, args.ranks, args.rounds, lambda size, ranks: measure(
        size, ranks, args.batch, steps_for(size, args.steps), args.warmup))
    write_outputs(result)
    print(f"wrote {RESULTS} and the table in {DOC}")


if __name__ == "__main__":
    main()
