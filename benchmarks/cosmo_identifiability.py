"""How well simple statistics of one CosmoFlow sample recover each parameter, per prior.

    python benchmarks/cosmo_identifiability.py [--train 256] [--test 64] [--size 64] [--sample 32]

Generates universes in memory (data_prep.cosmo_synth), cuts them into sample^3 sub-cubes, fits
ordinary least squares from ~40 statistics of each sub-cube to unitPar on the training universes
and reports the held-out mean absolute error per parameter (chance, predicting 0, is 0.5).
Writes benchmarks/results/cosmo_identifiability.json.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from common.base.files import write_json_atomic
from data_prep.cosmo_identify import least_squares_mae, subcube_dataset
from data_prep.cosmo_synth import PARAM_NAMES, PRIORS, SynthSpec

RESULTS = Path(__file__).resolve().parent / "results/cosmo_identifiability.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", type=int, default=256, help="training universes")
    p.add_argument("--test", type=int, default=64, help="held-out universes")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--sample", type=int, default=32)
    args = p.parse_args()
    rows = []
    for prior in sorted(PRIORS):
        t0 = time.perf_counter()
        spec = SynthSpec(size=args.size, seed=2026, prior=prior)
        train = subcube_dataset(spec, range(args.train), args.sample)
        test = subcube_dataset(spec, range(100_000, 100_000 + args.test), args.sample)
        mae = least_squares_mae(*train, *test)
        rows.append({"prior": prior, "mae": dict(zip(PARAM_NAMES, map(float, mae))), "mean": float(mae.mean()),
                     "train_samples": len(train[0]), "test_samples": len(test[0])})
        print(f"{prior:5s} " + "  ".join(f"{n} {m:.3f}" for n, m in zip(PARAM_NAMES, mae))
              + f"  mean {mae.mean():.3f}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    write_json_atomic({"date": time.strftime("%Y-%m-%d"), "size": args.size, "sample": args.sample, "rows": rows},
                      RESULTS)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
