"""train.precision=auto's probe on this host, for each application at its mini and full size, saved as JSON.

    python benchmarks/precision_probe.py [--cases cosmo_mini cosmo deepcam_mini deepcam] [--rounds 2]
        [--threads N] [--fpmath] [--out benchmarks/results/precision_probe.json] [--update]

Each case is the probe itself (common/runtime/precision.py: the application's training step, forward, backward
and update, on a synthetic batch of the config's shape and local batch, in a fresh process per precision),
float32 and mixed_bfloat16 interleaved over --rounds rounds, with numpy's sgemm rate before each round. It
records each median step, their ratio and what `auto` decides from them with the committed epochs record
(benchmarks/results/precision_epochs.json). The header names the CPU and its ISA flags (AMX, AVX512-BF16):
hosts of this kind differ, and bfloat16 pays only where the processor computes it natively. --fpmath adds a third
variant to each round: float32 under ONEDNN_DEFAULT_FPMATH_MODE=BF16 (oneDNN's implicit down-conversion of float32
matrix products and convolutions to bfloat16; the suite sets STRICT unless a site sets it), so that it can be
weighed as a candidate for `auto`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from harness import REPO, RESULTS_DIR, run_header, sgemm_gflops, write_json_atomic

sys.path.insert(0, str(REPO))
from common.runtime import precision, precision_measure  # noqa: E402

CASES = {"cosmo_mini": ("cosmoflow", "cosmoflow/configs/cosmo_mini.yaml"),
         "cosmo": ("cosmoflow", "cosmoflow/configs/cosmo.yaml"),
         "deepcam_mini": ("deepcam", "deepcam/configs/deepcam_mini.yaml"),
         "deepcam": ("deepcam", "deepcam/configs/deepcam.yaml")}


FPMATH = "float32_fpmath_bf16"  # --fpmath's variant: float32 with oneDNN's implicit bfloat16
VARIANTS = {"float32": ("float32", {}), "mixed_bfloat16": ("mixed_bfloat16", {}),
            FPMATH: ("float32", {"ONEDNN_DEFAULT_FPMATH_MODE": "BF16"})}


def measure_case(name: str, rounds: int, threads: int, fpmath: bool = False) -> dict:
    app, config = CASES[name]
    variants = [*precision.CANDIDATES, *([FPMATH] if fpmath else [])]
    seconds = {v: [] for v in variants}
    sgemm = []
    for r in range(rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        sgemm.append(sgemm_gflops())
        for v in order:
            print(f"  {name} round {r + 1}/{rounds}: {v} ...", flush=True)
            policy, env = VARIANTS[v]
            seconds[v].append(precision_measure.measure_in_subprocess(app, str(REPO / config), [], policy, threads, env))
    medians = {v: statistics.median(s) for v, s in seconds.items()}
    choice = precision.decide({p: medians[p] for p in precision.CANDIDATES}, precision.epochs_ratio(app))
    extra = {"fpmath_bf16_over_f32": medians[FPMATH] / medians["float32"]} if fpmath else {}
    return {"case": name, "app": app, "config": config, "threads": threads, "step_seconds": seconds,
            "median_step_seconds": medians, "bf16_over_f32": medians["mixed_bfloat16"] / medians["float32"], **extra,
            "auto": choice["precision"], "reason": choice["reason"], "sgemm_gflops": sgemm}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--fpmath", action="store_true", help="also float32 under ONEDNN_DEFAULT_FPMATH_MODE=BF16")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "precision_probe.json")
    parser.add_argument("--update", action="store_true", help="keep --out's other cases (each case records its own "
                                                              "date, commit and CPU)")
    args = parser.parse_args(argv)
    header = run_header(sgemm_gflops())
    kept = [c for c in json.loads(args.out.read_text())["cases"] if c["case"] not in args.cases] \
        if args.update and args.out.is_file() else []
    result = {**header, "threshold": precision.THRESHOLD, "cases": kept}
    for name in args.cases:
        result["cases"].append({**measure_case(name, args.rounds, args.threads, args.fpmath),
                                **{k: header[k] for k in ("date", "cpu", "isa_flags", "commit")}})
        write_json_atomic(args.out, result)  # each case as it completes
        case = result["cases"][-1]
        print(f"{name}: float32 {case['median_step_seconds']['float32']:.4g} s, mixed_bfloat16 "
              f"{case['median_step_seconds']['mixed_bfloat16']:.4g} s ({case['bf16_over_f32']:.2f}x): auto -> "
              f"{case['auto']}", flush=True)
    print(f"wrote {args.out} ({header['cpu']}; {header['isa_flags']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
