"""What asking "does any rank want to stop?" costs per training step, and what riding it in the gradient
allreduce saves.

    python benchmarks/stop_signal_cost.py [--ranks 2] [--steps 200] [--repeats 3]

A worker under `horovodrun -np N` builds the CosmoFlow mini network (32^3 x 4, 16..256 filters, batch 4 per
rank, in-memory data) and times, interleaved `--repeats` times, `--steps` training steps each way:
- `separate`: the step, then `StopRequests.agreed`: a blocking one-scalar allreduce of its own (before);
- `riding`: the step with the stop flag in its grouped gradient allreduce, then reading the agreed value;
and, alone, `--steps` calls of `agreed` (the bare collective). Writes benchmarks/results/stop_signal_cost.json
and the table between the markers in docs/faults.md.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

# Run as a script, so benchmarks/ is on sys.path.
from harness import (REPO, RESULTS_DIR, check_marked_section, measured_on, replace_marked_section, run_header,
                     run_worker, sgemm_gflops, write_json_atomic, write_worker_result)

DOC = REPO / "docs/faults.md"  # its table lives beside what it measures

RESULTS = RESULTS_DIR / "stop_signal_cost.json"
BEGIN, END = "<!-- stop-signal-cost:begin -->", "<!-- stop-signal-cost:end -->"
MINI = dict(input_shape=(32, 32, 32, 4), conv_filters=(16, 32, 64, 128, 256), pooling="avg", dropout=0.0)


def _per_call(fn, calls: int) -> float:
    """Median over 5 blocks of `calls` // 5 calls: seconds per call."""
    block = max(1, calls // 5)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(block):
            fn()
        times.append((time.perf_counter() - t) / block)
    return float(np.median(times))


def worker(steps: int, repeats: int, out: str) -> None:
    from common.runtime.config import DistConfig
    from common.runtime.dist import init_distributed
    dist = init_distributed(DistConfig())
    import keras

    from common.runtime.strategy import make_train_step
    from common.runtime.dist import StopRequests
    from cosmoflow.model import build_model, mse_loss
    keras.utils.set_random_seed(0)
    model = build_model(**MINI)
    optimizer = keras.optimizers.SGD(0.001, momentum=0.9)
    optimizer.build(model.trainable_variables)
    dist.broadcast_variables(model.variables + optimizer.variables)
    requests = StopRequests()
    plain = make_train_step(model, optimizer, mse_loss, dist)
    riding = make_train_step(model, optimizer, mse_loss, dist, requests.flag())
    rng = np.random.default_rng(dist.rank)
    x = np.log1p(rng.poisson(20, (4, 32, 32, 32, 4))).astype(np.float32)
    y = rng.uniform(-1, 1, (4, 4)).astype(np.float32)
    ways = {"separate": lambda: (float(plain(x, y)), requests.agreed_now(dist)),
            "riding": lambda: (float(riding(x, y)), requests.flag().stop_agreed()),
            "collective_alone": lambda: requests.agreed_now(dist)}
    for fn in ways.values():
        for _ in range(5):
            fn()  # tracing, allocation
    seconds = {name: [] for name in ways}
    for _ in range(repeats):
        for name, fn in ways.items():
            seconds[name].append(_per_call(fn, steps))
    write_worker_result(out, [], dist, per_call_seconds=seconds)


def table(result: dict) -> str:
    ms = {k: np.asarray(v) * 1e3 for k, v in result["per_call_seconds"].items()}
    labels = {"separate": "step + separate stop allreduce (before)",
              "riding": "step with the flag in its gradient allreduce (now)",
              "collective_alone": "the separate stop allreduce alone"}
    rows = ["| way | ms per call, median of repeats | range over repeats |", "|---|---|---|"]
    rows += [f"| {labels[k]} | {np.median(v):.2f} | {v.min():.2f} - {v.max():.2f} |" for k, v in ms.items()]
    saved = float(np.median(ms["separate"]) - np.median(ms["riding"]))
    spread = float(max(np.ptp(ms["separate"]), np.ptp(ms["riding"])))
    verdict = "within" if abs(saved) <= spread else "outside"
    return ("\n".join(rows) + f"\n\nSaved per step: {saved:.2f} ms, {verdict} the {spread:.1f} ms spread of a step's "
            f"repeats; {result['ranks']} ranks on one node, CosmoFlow mini network, batch 4 per rank. sgemm "
            f"{result['sgemm_gflops']:.1f} GFLOP/s. {measured_on(result)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.repeats, args.out)
        return
    check_marked_section(DOC, BEGIN, END)
    header = run_header(sgemm_gflops())
    measured = run_worker(__file__, ["--steps", str(args.steps), "--repeats", str(args.repeats)], args.ranks,
                          RESULTS_DIR / ".stop_signal_worker.json", f"{args.ranks} ranks, {args.steps} steps")
    result = {**header, "command": f"benchmarks/stop_signal_cost.py --ranks {args.ranks} --steps {args.steps} "
                                   f"--repeats {args.repeats}", **measured}
    write_json_atomic(RESULTS, result)
    replace_marked_section(DOC, BEGIN, END, table(result))
    print(table(result))


if __name__ == "__main__":
    main()
