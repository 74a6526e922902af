"""An application's training step at two commits, interleaved on this host, saved as JSON.

    python benchmarks/step_compare.py --commits OLD NEW [--app deepcam] [--config deepcam/configs/deepcam.yaml]
        [--precisions float32 mixed_bfloat16] [--rounds 2] [--threads N]
        [--out benchmarks/results/step_compare_<app>.json] [overrides ...]

Each commit is checked out clean with `git worktree add` in a temporary directory, this checkout's .venv linked in;
the step is measured there as train.precision=auto's probe measures it (common/runtime/precision_measure.py: the
application's training step, forward, backward and update, on a synthetic batch of the config's shape and local
batch, in a fresh process on --threads threads, the median of its timed steps), the worktree first on the path.
Per precision the two commits alternate over --rounds rounds (OLD NEW, NEW OLD, ...), numpy's sgemm rate measured
before each measurement, so that a drift of the host falls on both alike. `new_over_old` is NEW's median step
over OLD's, pooled over the rounds and per round (each round's two measured back to back). The header names the
CPU and its ISA flags.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import REPO, RESULTS_DIR, interleaved, run_header, sgemm_gflops, worktree, write_json_atomic

sys.path.insert(0, str(REPO))
from common.base.errors import BenchError  # noqa: E402
from common.runtime import precision_measure  # noqa: E402

CONFIGS = {"cosmoflow": "cosmoflow/configs/cosmo.yaml", "deepcam": "deepcam/configs/deepcam.yaml"}
PRECISIONS = ("float32", "mixed_bfloat16")


def short_name(commit: str) -> str:
    """`commit`'s abbreviated hash, or `commit` itself where git does not know it (worktree then says why)."""
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=7", commit], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else commit


def measure(tree: Path, app: str, config: str, precision: str, threads: int, overrides: list[str]) -> float:
    """The median step seconds of `app` in `precision`, measured by a fresh process in `tree`."""
    # The project is installed editable: without the worktree first on the path its imports would be this checkout's.
    try:
        return precision_measure.measure_in_subprocess(app, config, overrides, precision, threads,
                                                       extra_env={"PYTHONPATH": str(tree)}, cwd=str(tree))
    except BenchError as err:
        raise SystemExit(f"{tree}: {err}") from None


def compare(trees: dict, args, precision: str) -> dict:
    """One precision's rounds: each commit's step seconds and sgemm rates, and NEW over OLD."""
    seconds: dict = {commit: [] for commit in trees}
    sgemm: dict = {commit: [] for commit in trees}
    for commit in interleaved(list(trees), args.rounds):
        sgemm[commit].append(sgemm_gflops())
        seconds[commit].append(measure(trees[commit], args.app, args.config, precision, args.threads,
                                       args.overrides))
        print(f"  {precision} {commit}: {seconds[commit][-1]:.4g} s a step "
              f"(sgemm just before: {sgemm[commit][-1]:.1f} GFLOP/s)", flush=True)
    old, new = list(trees)
    return {"precision": precision, "step_seconds": seconds, "sgemm_gflops": sgemm,
            "median_step_seconds": {c: statistics.median(s) for c, s in seconds.items()},
            "new_over_old": statistics.median(seconds[new]) / statistics.median(seconds[old]),
            "new_over_old_per_round": [n / o for n, o in zip(seconds[new], seconds[old])]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--commits", nargs=2, required=True, metavar=("OLD", "NEW"))
    p.add_argument("--app", choices=sorted(CONFIGS), default="deepcam")
    p.add_argument("--config", help="default: the application's full-size config")
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the step's threads")
    p.add_argument("--out", type=Path)
    p.add_argument("overrides", nargs="*", help="config overrides for both commits, e.g. train.local_batch_size=1")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: expected at least 1")
    args.config = args.config or CONFIGS[args.app]
    out = args.out or RESULTS_DIR / f"step_compare_{args.app}.json"
    result = {**run_header(sgemm_gflops()), "app": args.app, "config": args.config, "threads": args.threads,
              "overrides": args.overrides, "rounds": args.rounds}
    names = [short_name(commit) for commit in args.commits]
    if names[0] == names[1]:
        p.error(f"--commits {' '.join(args.commits)}: expected two different commits")
    with tempfile.TemporaryDirectory(prefix="step-compare-") as work, contextlib.ExitStack() as trees_open:
        trees = {name: trees_open.enter_context(worktree(commit, Path(work) / name))
                 for name, commit in zip(names, args.commits)}
        result["commits"] = names
        result["precisions"] = [compare(trees, args, precision) for precision in args.precisions]
    write_json_atomic(out, result)
    for r in result["precisions"]:
        rounds = ", ".join(f"{x:.3f}" for x in r["new_over_old_per_round"])
        print(f"{r['precision']}: {result['commits'][1]} / {result['commits'][0]} = {r['new_over_old']:.3f} "
              f"(rounds {rounds})")
    print(f"wrote {out} ({result['cpu']}; {result['isa_flags']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
