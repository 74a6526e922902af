"""How long `make test`'s tests take at two commits, run back to back on this host, saved as JSON.

    python benchmarks/suite_time.py [--commits OLD NEW] [--out benchmarks/results/suite_time.json]
                                    [--pytest-args "..."] [--timeout-min 120]
    python benchmarks/suite_time.py --commits NEW --baseline EARLIER.json    # the old commit's figures recorded

For each commit (default: 10755c2, the commit before issue 46's work, then HEAD) a clean checkout is made with
`git worktree add` in a temporary directory, this checkout's .venv is linked into it, and what `make test` runs
there after set-up runs (the worktree first on PYTHONPATH: .venv holds this checkout as an editable install):
`make test-suite` where the commit's Makefile has it (the unit and fuzz tests on 2 pytest-xdist processes, then
the integration tests), else `python -m pytest tests`; each pytest run writes a JUnit XML report. The result:
the wall-clock seconds of the whole run, the tests passed, failed, skipped and errored, and every test's seconds
(setup, call and teardown together, as JUnit reports them; with 2 processes their sum exceeds the wall clock).
The commits run one after the other, never together, so that they share the host's state; the result says which
CPU ran them.
Set-up (.venv, the Horovod and DALI builds) is not timed: both checkouts use the one already built.

The JSON holds, per commit, the totals and the 40 slowest tests; `ratio` is the second commit's seconds over the
first's. Progress (pytest's own output) streams to the terminal. With one commit and `--baseline`, the first run is
taken from an earlier result (its first run), and `back_to_back` is false: the two were not measured together.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from harness import worktree  # noqa: E402  (a script beside the benchmarks, not a package)

BEFORE = "10755c2"  # the last commit before issue 46's work
SLOWEST = 40


def resolve(commit: str) -> str:
    """The full hash of `commit`; exits with a message naming it when git does not know it."""
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{commit}^{{commit}}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"suite_time: {commit!r} is not a commit of {REPO}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def junit_figures(reports: list[Path]) -> dict:
    """Counts and per-test seconds from pytest JUnit XML reports (one per pytest run)."""
    if not reports:
        raise SystemExit("suite_time: no JUnit report written; did pytest start?")
    cases = []
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for case in (case for report in reports for case in _parsed(report).iter("testcase")):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        tag = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        outcome = {"failure": "failed", "error": "errors"}.get(tag, tag)
        counts[outcome] += 1
        cases.append((float(case.get("time", 0.0)), name, outcome))
    cases.sort(reverse=True)
    return {**counts, "tests": len(cases), "seconds_in_tests": round(sum(c[0] for c in cases), 1),
            "slowest": [{"test": n, "seconds": round(s, 2), "outcome": o} for s, n, o in cases[:SLOWEST]],
            "slowest_share": round(sum(c[0] for c in cases[:SLOWEST]) / max(sum(c[0] for c in cases), 1e-9), 3)}


def _parsed(report: Path) -> ET.Element:
    try:
        return ET.parse(report).getroot()
    except (OSError, ET.ParseError) as err:
        raise SystemExit(f"suite_time: {report}: no readable JUnit report ({err}); did pytest start?") from err


def suite_command(tree: Path, reports: Path) -> list[str]:
    """What `make test` runs at the commit checked out in `tree`, without set-up: `make test-suite` where the
    Makefile has that target (the unit and fuzz tests on 2 processes, then the integration tests), else the
    older `python -m pytest tests`. Each pytest run writes a JUnit report into `reports`."""
    python = str(REPO / ".venv/bin/python")
    if "\ntest-suite:" in (tree / "Makefile").read_text():
        return ["make", "--no-print-directory", "test-suite", f"PY={python}", f"JUNIT_DIR={reports}"]
    return [python, "-m", "pytest", "tests", f"--junitxml={reports / 'all.xml'}"]


def run_suite(commit: str, pytest_args: list[str], timeout_s: float, work: Path) -> dict:
    """The tests of `commit` in a clean worktree, with this checkout's .venv."""
    with worktree(commit, work / commit[:7]) as tree:
        reports = work / f"{commit[:7]}-junit"
        reports.mkdir()
        cmd = suite_command(tree, reports)
        print(f"== {commit[:7]}: {shlex.join(cmd)} (in {tree})", flush=True)
        start = time.monotonic()
        # The project is installed editable: without the worktree first on the path, a script it starts
        # (python cosmoflow/train.py) would import this checkout's packages.
        env = {**os.environ, "PYTHONPATH": str(tree),
               "PYTEST_ADDOPTS": shlex.join(["-p", "no:cacheprovider", *pytest_args])}
        try:
            proc = subprocess.run(cmd, cwd=tree, env=env, timeout=timeout_s)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        wall = time.monotonic() - start
        return {"commit": commit[:7], "exit_code": code, "wall_seconds": round(wall, 1),
                "wall_minutes": round(wall / 60, 2), "command": shlex.join(cmd),
                **junit_figures(sorted(reports.glob("*.xml")))}


def main(argv=None) -> int:
    from harness import run_header, sgemm_gflops, write_json_atomic
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", nargs="+", metavar="COMMIT", default=[BEFORE, "HEAD"],
                        help="OLD NEW, or NEW alone with --baseline")
    parser.add_argument("--baseline", type=Path, help="an earlier result whose first run stands for OLD")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/suite_time.json")
    parser.add_argument("--pytest-args", default="", help="more pytest arguments, one shell-quoted string")
    parser.add_argument("--timeout-min", type=float, default=120.0, help="per commit (default 120)")
    args = parser.parse_args(argv)
    if not (REPO / ".venv/bin/python").is_file():
        sys.exit(f"suite_time: {REPO / '.venv/bin/python'} not found; run make setup first")
    if len(args.commits) != (1 if args.baseline else 2):
        parser.error("give --commits OLD NEW, or --commits NEW with --baseline EARLIER.json")
    commits = [resolve(c) for c in args.commits]
    result = run_header(sgemm_gflops()) | {"pytest_args": args.pytest_args, "runs": [],
                                           "back_to_back": args.baseline is None}
    if args.baseline:
        try:
            earlier = json.loads(args.baseline.read_text())
            result["runs"].append(earlier["runs"][0] | {"recorded": str(args.baseline), "date": earlier["date"],
                                                        "cpu": earlier["cpu"]})
        except (OSError, ValueError, KeyError, IndexError) as err:
            sys.exit(f"suite_time: {args.baseline}: not a suite_time.py result ({err})")
    with tempfile.TemporaryDirectory(prefix="suite-time-") as tmp:
        for commit in commits:
            result["runs"].append(run_suite(commit, shlex.split(args.pytest_args), args.timeout_min * 60, Path(tmp)))
    old, new = result["runs"]
    result["ratio"] = round(new["wall_seconds"] / old["wall_seconds"], 3)
    write_json_atomic(args.out, result)
    for run in result["runs"]:
        print(f"{run['commit']}: {run['wall_minutes']} min, {run['passed']} passed, {run['failed']} failed, "
              f"{run['errors']} errors, {run['skipped']} skipped (exit {run['exit_code']})")
    print(f"ratio {result['ratio']} (new / old); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
