"""DeepCAM's training step with the decoder's transposed convolutions computed both ways, saved as JSON.

    python benchmarks/deconv_step.py [--cases deepcam deepcam_mini] [--precisions float32 mixed_bfloat16]
        [--rounds 2] [--threads N] [--out benchmarks/results/deconv_step.json]

`model.deconv: phased` (four stride-1 convolutions per upsampling layer, deepcam/model.py PhasedConvTranspose)
against `transposed` (Keras' Conv2DTranspose): the same network, parameters and outputs. Each figure is
train.precision=auto's probe measurement (common/runtime/precision_measure.py: the application's training step,
forward, backward and update on a synthetic batch of the config's shape and local batch, in a fresh process,
the median of its timed steps), the two ways interleaved in each round (every second round in reverse order),
numpy's sgemm rate before each round. The header names the CPU and its ISA flags.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from harness import REPO, RESULTS_DIR, run_header, sgemm_gflops, write_json_atomic

sys.path.insert(0, str(REPO))
from common.runtime import precision, precision_measure  # noqa: E402

CASES = {"deepcam": "deepcam/configs/deepcam.yaml", "deepcam_mini": "deepcam/configs/deepcam_mini.yaml"}
WAYS = ("transposed", "phased")


def measure_case(case: str, precisions: list[str], rounds: int, threads: int) -> dict:
    """Each precision's step seconds per way and round, their medians and phased over transposed."""
    seconds = {p: {w: [] for w in WAYS} for p in precisions}
    sgemm = []
    for r in range(rounds):
        sgemm.append(sgemm_gflops())
        for p in precisions:
            for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                print(f"  {case} round {r + 1}/{rounds}: {p}, model.deconv={way} ...", flush=True)
                seconds[p][way].append(precision_measure.measure_in_subprocess(
                    "deepcam", str(REPO / CASES[case]), [f"model.deconv={way}"], p, threads))
    medians = {p: {w: statistics.median(v) for w, v in by_way.items()} for p, by_way in seconds.items()}
    return {"case": case, "config": CASES[case], "threads": threads, "step_seconds": seconds,
            "median_step_seconds": medians, "sgemm_gflops": sgemm,
            "phased_over_transposed": {p: m["phased"] / m["transposed"] for p, m in medians.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--precisions", nargs="+", choices=precision.CANDIDATES, default=list(precision.CANDIDATES))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the step's threads")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "deconv_step.json")
    args = p.parse_args(argv)
    result = {**run_header(sgemm_gflops()), "cases": [measure_case(c, args.precisions, args.rounds, args.threads)
                                                      for c in args.cases]}
    write_json_atomic(args.out, result)
    for case in result["cases"]:
        for prec, m in case["median_step_seconds"].items():
            print(f"{case['case']} {prec}: transposed {m['transposed']:.4g} s, phased {m['phased']:.4g} s "
                  f"({case['phased_over_transposed'][prec]:.2f}x)")
    print(f"wrote {args.out} ({result['cpu']}; {result['isa_flags']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
