"""Measure `data_prep index` (files/s, GB/s) and staging with decompression over the official release's layout.

    python benchmarks/index_throughput.py [--fixtures reference small] [--workers 1 2] [--repeats 3]
        [--work-dir DIR] [--dest /dev/shm] [--results JSON]

Fixtures, written once under --work-dir by the suite's own writer of the layout (cosmo-synth, then
data_prep cosmo-released: GZIP TFRecords of one sample each, in train/ and validation/) and reused after:

    reference  16 universes of 256^3 cells (1 Mpc/h, --mean-count 1, about the real data's density) cut into
               128 files of 128^3 x 4 samples: the release's sample (16 MiB uncompressed)
    small      256 universes of 64^3 cut into 2,048 files of 32^3 x 4 samples (256 KiB): per-file costs

For each fixture and --workers count W it times, --repeats times (rounds interleaved, median reported):

    index full    python -m data_prep index --workers W (every byte read, statistics over every training file)
    index quick   --verify quick --stats-files 0 (files hashed, record counts from the GZIP trailers)
    stage         python -m data_prep stage --decompress --threads W of the index into --dest: GZIP files
                  written uncompressed with DALI indexes, every source file verified
    stage copy    python -m data_prep stage of the same index without --decompress: the GZIP files as they are

Each command runs in a fresh process into a fresh output; the figures are the command's own (--json): the
per-file phase of index (without the start of its worker processes, which import TensorFlow, or the first
record's probe; the wall time is recorded too) and staging's timed part. The fixtures are read into the page cache first, so the figures
are CPU rates, not a disk's. GB/s is 1e9 bytes per second of the files as stored (compressed); uncompressed
GB/s is given beside. Writes benchmarks/results/index_throughput.json and the table between the markers in
docs/datasets.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common.base.version import code_version

# Run as a script, so benchmarks/ is on sys.path.
from harness import (REPO, RESULTS_DIR, check_marked_section, measured_on, replace_marked_section, run_header,
                     sgemm_gflops)
from harness import write_json_atomic

DOC = REPO / "docs/datasets.md"  # its table lives beside the command it measures
RESULTS = RESULTS_DIR / "index_throughput.json"
BEGIN, END = "<!-- index-throughput:begin -->", "<!-- index-throughput:end -->"
DEFAULT_WORK_DIR = Path("/tmp/hpc-sciml-bench-index")
CASES = ("index full", "index quick", "stage", "stage copy")
CODE_DIRS = ("common/io", "data_prep")  # the code measured


@dataclasses.dataclass(frozen=True)
class Fixture:
    """A released-layout fixture: the cosmo-synth and cosmo-released arguments that make it."""

    name: str
    synth: tuple[str, ...]
    release: tuple[str, ...]


FIXTURES = {
    "reference": Fixture("reference", ("--universes", "16", "--size", "256", "--box-size", "256", "--mean-count", "1",
                                       "--seed", "2026"),
                         ("--sample-size", "128", "--val-universes", "2")),
    "small": Fixture("small", ("--universes", "256", "--size", "64", "--seed", "2026"),
                     ("--sample-size", "32", "--val-universes", "28")),
}


def data_prep(*args: str) -> str:
    """Run `python -m data_prep ARGS`; its stdout. Exits with its output when it fails."""
    cmd = [sys.executable, "-m", "data_prep", *map(str, args)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def make_fixture(spec: Fixture, work_dir: Path) -> dict:
    """The fixture's release directory (made when missing) and its size."""
    root = work_dir / spec.name
    release = root / "release"
    if not (root / "done").is_file():
        print(f"  making the {spec.name} fixture in {root}", flush=True)
        shutil.rmtree(root, ignore_errors=True)
        data_prep("cosmo-synth", "--out", root / "raw", *spec.synth, "--workers", "2")
        data_prep("cosmo-released", "--input", root / "raw", "--out", release, *spec.release, "--workers", "2")
        shutil.rmtree(root / "raw")
        (root / "done").write_text("")
    files = [p for p in release.rglob("*.tfrecord")]
    return {"dir": str(release), "files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def read_into_page_cache(directory: Path) -> None:
    for path in directory.rglob("*.tfrecord"):
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass


# ---------------------------------------------------------------------------- one measurement
def run_index(release: Path, out: Path, workers: int, quick: bool) -> dict:
    """One `index` into a fresh `out`: its figures, plus the wall time of the whole command."""
    shutil.rmtree(out, ignore_errors=True)
    extra = ["--verify", "quick", "--stats-files", "0"] if quick else []
    t0 = time.perf_counter()
    figures = json.loads(data_prep("index", "--input", release, "--out", out, "--workers", workers, "--json", *extra))
    figures["wall_seconds"] = time.perf_counter() - t0
    figures["uncompressed_gb_per_second"] = figures["uncompressed_bytes"] / figures["seconds"] / 1e9
    return figures


def run_stage(index: Path, dest: Path, threads: int, decompress: bool) -> dict:
    """One `stage` of the index into a fresh `dest`: staging's figures."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    extra = ["--decompress"] if decompress else []
    figures = json.loads(data_prep("stage", "--input", index, "--stage-dir", dest, "--threads", threads, "--json",
                                   *extra))
    shutil.rmtree(dest, ignore_errors=True)
    return figures


def measure(case: str, fixture: dict, work_dir: Path, dest: Path, workers: int) -> dict:
    """One run of `case` with `workers` threads: files/s, GB/s (stored bytes), uncompressed GB/s, seconds."""
    release, index = Path(fixture["dir"]), work_dir / "index-out"
    if case.startswith("index"):
        f = run_index(release, index, workers, quick=case == "index quick")
        return {"seconds": f["seconds"], "wall_seconds": f["wall_seconds"], "files_per_second": f["files_per_second"],
                "gb_per_second": f["gb_per_second"], "uncompressed_gb_per_second": f["uncompressed_gb_per_second"]}
    if not (index / "manifest.json").is_file():
        run_index(release, index, 2, quick=True)
    f = run_stage(index, dest / "hpc-sciml-bench-index-stage", workers, decompress=case == "stage")
    return {"seconds": f["seconds"], "files_per_second": f["files"] / f["seconds"],
            "gb_per_second": f["read_gb_per_second"], "uncompressed_gb_per_second": f["write_gb_per_second"]}


def summarise(runs: list[dict]) -> dict:
    """The median of each figure over the repeats, and every value."""
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]} | {"runs": runs}


# ---------------------------------------------------------------------------- the table
def table_rows(result: dict) -> list[str]:
    rows = ["| fixture | sample | files | case | workers | files/s | GB/s (stored) | GB/s uncompressed | seconds |",
            "|---|---|---|---|---|---|---|---|---|"]
    for c in result["cases"]:
        fixture = result["fixtures"][c["fixture"]]
        rows.append(f"| {c['fixture']} | {fixture['sample']} | {fixture['files']:,} | {c['case']} | {c['workers']} | "
                    f"{c['files_per_second']:,.1f} | {c['gb_per_second']:.3f} | {c['uncompressed_gb_per_second']:.3f} "
                    f"| {c['seconds']:.2f} |")
    load = ", ".join(f"{v:.2f}" for v in (result["loadavg_start"][0], result["loadavg_end"][0]))
    rows.append(f"\nMedian of {result['repeats']} interleaved runs; sources in the page cache; staging to "
                f"{result['dest']}. Load average (1 min) at start and end: {load}. sgemm "
                f"{result['sgemm_gflops']:.0f} GFLOP/s. {measured_on({**result, 'commit': _code_note(result['code'])})}")
    return rows


def _code_note(code: dict) -> str:
    changed = f" with {len(code['modified'])} files of {', '.join(CODE_DIRS)} changed" if code["modified"] else ""
    return f"{code['commit'][:7]}{changed}"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fixtures", nargs="+", choices=list(FIXTURES), default=list(FIXTURES))
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--workers", nargs="+", type=int, default=[1, 2],
                   help="worker processes of index, threads of staging (default: 1 2)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="fixtures and outputs (%(default)s)")
    p.add_argument("--dest", type=Path, default=Path("/dev/shm"), help="where staging writes (%(default)s)")
    p.add_argument("--results", type=Path, default=RESULTS,
                   help="the JSON to write (default: %(default)s, whose run the table in docs/datasets.md shows)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    check_marked_section(DOC, BEGIN, END)
    loadavg_start, started = os.getloadavg(), time.perf_counter()
    header = run_header(sgemm_gflops())
    fixtures, cases = {}, []
    for name in args.fixtures:
        fixture = make_fixture(FIXTURES[name], args.work_dir)
        n = int(FIXTURES[name].release[1])
        fixture["sample"] = f"{n}^3 x 4"
        fixtures[name] = fixture
        read_into_page_cache(Path(fixture["dir"]))
        runs = {(case, w): [] for case in args.cases for w in args.workers}
        for round_ in range(args.repeats):
            for case, w in runs:
                print(f"  {name}: {case}, {w} workers, round {round_ + 1}", flush=True)
                runs[(case, w)].append(measure(case, fixture, args.work_dir / name, args.dest, w))
        cases += [{"fixture": name, "case": case, "workers": w, **summarise(r)} for (case, w), r in runs.items()]
    result = {**header, "loadavg_start": loadavg_start, "loadavg_end": os.getloadavg(),
              "total_seconds": time.perf_counter() - started, "repeats": args.repeats, "dest": str(args.dest),
              "code": code_version(CODE_DIRS), "fixtures": fixtures, "cases": cases}
    write_json_atomic(args.results, result)
    table = "\n".join(table_rows(result))
    print(table)
    if args.results.resolve() == RESULTS.resolve():
        replace_marked_section(DOC, BEGIN, END, table)
        print(f"wrote {RESULTS} and the table in {DOC}")


if __name__ == "__main__":
    main()
