"""How often a score's 95% interval holds the true olympic mean: the bootstrap of common/campaign/uncertainty.py
on simulated campaigns.

Each campaign draws its runs' times to train from a known distribution (normal, or right-skewed log-normal as
time to train often is); its interval is computed exactly as `score.json`'s (olympic_interval: 10,000 resamples,
failed runs kept as observed). The true olympic mean is the mean of the olympic means of 200,000 campaigns of the
same shape. Coverage is the fraction of `--campaigns` campaigns whose interval holds it; a nominal 95% interval
should hold it in about 95%.

    python benchmarks/score_coverage.py [--campaigns 1000]

Writes benchmarks/results/score_coverage.json and the table between the markers in docs/campaigns.md.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from common.campaign import uncertainty
from harness import REPO, RESULTS_DIR, check_marked_section, code_commit, replace_marked_section, write_json_atomic

RESULTS = RESULTS_DIR / "score_coverage.json"
DOC = REPO / "docs/campaigns.md"
BEGIN, END = "<!-- score-coverage:begin -->", "<!-- score-coverage:end -->"
MEAN_MINUTES, SPREAD, SIGMA = 30.0, 2.0, 0.15  # normal: mean 30 min, sd 2; log-normal: median 30, sigma 0.15
LABELS = {"normal": "normal, mean 30, sd 2 min", "log-normal": "log-normal, median 30, sigma 0.15 (sd 4.5 min)"}
CASES = [("normal", 5, 0), ("normal", 10, 0), ("normal", 10, 1), ("log-normal", 5, 0), ("log-normal", 10, 0),
         ("log-normal", 10, 1)]  # distribution, runs, of which failed


def draw(rng: np.random.Generator, distribution: str, shape: tuple[int, ...]) -> np.ndarray:
    """Times to train in minutes: normal, or log-normal (a right tail)."""
    if distribution == "normal":
        return rng.normal(MEAN_MINUTES, SPREAD, size=shape)
    return MEAN_MINUTES * np.exp(rng.normal(0.0, SIGMA, size=shape))


def coverage(distribution: str, runs: int, failed: int, campaigns: int, seed: int) -> dict:
    """One case: the fraction of simulated campaigns whose interval holds the true olympic mean."""
    rng = np.random.default_rng(seed)
    passing = runs - failed
    truth = float(uncertainty.olympic_means(draw(rng, distribution, (200_000, passing)), failed).mean())
    hits, widths = 0, []
    for k in range(campaigns):
        interval = uncertainty.olympic_interval(list(draw(rng, distribution, (passing,))), failed, seed=k)
        hits += interval.low <= truth <= interval.high
        widths.append(interval.high - interval.low)
    return {"distribution": distribution, "runs": runs, "failed": failed, "campaigns": campaigns,
            "true_olympic_mean": truth, "coverage": hits / campaigns, "mean_width_minutes": float(np.mean(widths)),
            "nominal": uncertainty.CONFIDENCE, "resamples": uncertainty.RESAMPLES}


def table(result: dict) -> str:
    lines = ["| runs' distribution | runs (failed) | campaigns | held the true olympic mean | mean width (min) |",
             "|---|---|---:|---:|---:|"]
    for r in result["cases"]:
        lines.append(f"| {LABELS[r['distribution']]} | {r['runs']} ({r['failed']}) | {r['campaigns']} | "
                     f"{100 * r['coverage']:.1f}% | {r['mean_width_minutes']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--campaigns", type=int, default=1000, help="simulated campaigns per case")
    args = parser.parse_args()
    check_marked_section(DOC, BEGIN, END)
    started = time.perf_counter()
    cases = []
    for i, (distribution, runs, failed) in enumerate(CASES):
        cases.append(coverage(distribution, runs, failed, args.campaigns, seed=i))
        print(f"{distribution} {runs} runs ({failed} failed): {100 * cases[-1]['coverage']:.1f}%", flush=True)
    command = " ".join(["python benchmarks/score_coverage.py", *sys.argv[1:]])
    result = {"date": time.strftime("%Y-%m-%d"), "commit": code_commit(), "command": command, "distributions": LABELS,
              "cases": cases, "seconds": time.perf_counter() - started}
    write_json_atomic(RESULTS, result)
    text = table(result)
    print(text)
    replace_marked_section(DOC, BEGIN, END, f"{text}\n\n`{command}` ({result['date']}, commit {result['commit']}; a "
                                            "simulation, no machine figure in it; with 1,000 campaigns a share is +-2 "
                                            "points at 95%)")


if __name__ == "__main__":
    main()
