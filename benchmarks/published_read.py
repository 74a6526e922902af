"""How fast the suite reads and scores a published MLPerf HPC results tree, on one core, saved as JSON.

    python benchmarks/published_read.py [ROOT] [--round 1.0] [--repeats 3] [--out benchmarks/results/published_read.json]

ROOT (default /work/shared/mlperf_hpc_results_v1.0) is read as `python -m common.campaign.analysis scores ROOT`
reads it, with this process pinned to one core: `read` times the tolerant reading of every result file alone
(common/campaign/analysis/published.py), `read_and_score` the whole of score_roots (reading, the rules, the RCP
normalisation), `check` mlperf-logging's compliance checker over every file (the --check option), timed apart.
Each is the best of --repeats runs after one warm-up (imports and the RCP tables loaded); MB are 10^6 bytes of
result files. The JSON names the date, the CPU (/proc/cpuinfo's model and its avx2, avx512f, amx_bf16 flags)
and the commit.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common.base.files import write_json_atomic  # noqa: E402
from common.base.host import cpu_model  # noqa: E402
from harness import caption_flags  # noqa: E402
from common.base.version import code_version  # noqa: E402
from common.campaign.analysis import published, scores  # noqa: E402

DEFAULT_ROOT = Path("/work/shared/mlperf_hpc_results_v1.0")
FLAGS = ("avx2", "avx512f", "amx_bf16")


def pin_to_one_core() -> int:
    """Pin this process to the first core it may run on; returns that core."""
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def best_seconds(step, repeats: int) -> float:
    """The fastest of `repeats` timed calls of step(), after one untimed warm-up call."""
    with contextlib.redirect_stderr(io.StringIO()):  # the progress bar
        step()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    return min(times)


def measure(root: Path, round_: str | None, repeats: int) -> dict:
    subs = published.find_submissions(root, round_, [])
    files = [p for sub in subs for p in sub.results]
    megabytes = sum(p.stat().st_size for p in files) / 1e6
    read = best_seconds(lambda: [published.read_run(p) for p in files], repeats)
    scored = best_seconds(lambda: scores.score_roots([root], round_), repeats)
    check = best_seconds(lambda: scores.compliance_findings(subs), 1)
    flags = set(caption_flags().split())  # avx2, avx512f, amx_bf16 among them
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "cpu": cpu_model(),
        "cpu_flags": {flag: flag in flags for flag in FLAGS}, "code": code_version(), "root": str(root),
        "submissions": len(subs), "result_files": len(files), "megabytes": round(megabytes, 3), "repeats": repeats,
        "read": {"seconds": round(read, 3), "megabytes_per_second": round(megabytes / read, 1)},
        "read_and_score": {"seconds": round(scored, 3), "megabytes_per_second": round(megabytes / scored, 1)},
        "check": {"seconds": round(check, 3), "megabytes_per_second": round(megabytes / check, 2)},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", nargs="?", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--round", default=None, help="the round, where ROOT's path does not name it")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/published_read.json")
    args = parser.parse_args(argv)
    core = pin_to_one_core()
    result = {"core": core, **measure(args.root, args.round, args.repeats)}
    write_json_atomic(result, args.out)
    print(f"{result['megabytes']} MB in {result['result_files']} result files on core {core} of {result['cpu']}: "
          f"read {result['read']['megabytes_per_second']} MB/s, read and score "
          f"{result['read_and_score']['megabytes_per_second']} MB/s, compliance checker {result['check']['seconds']}"
          f" s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
