"""Stage the same data with each copier of common/io, side by side in one run, against cp -r and tar -x.

    python benchmarks/copier_compare.py [--datasets cosmoflow deepcam] [--dests /dev/shm /tmp]
        [--sources plain none] [--copiers native python-read python-mmap python-kernel] [--repeats 5]

What is timed: `common.io.staging.stage` of the whole dataset in data.stage_mode=node with one thread
per core (opening the source, planning, copying and verifying every file, the manifest), once per copier:

    native         the C copier (XXH3 from libxxhash) that this comparison decided against: removed from
                   common/io after it; measured only where common/io/nativecopy.py is present and built
                   (restore it, and common/io/native/, from the commit benchmarks/results/copier_compare.json
                   names to measure it again)
    python-<m>     common/io/pycopy.py with method m: read (preadv, hash, write), mmap (hash and write
                   from a map of the source) or kernel (hash from a map, copy_file_range/sendfile)

and the commands a site would type for the same source (cp -r of the plain directory, tar -x of the
uncompressed archives; each sequential and 2 at a time, as benchmarks/staging_throughput.py). Sources:
the plain converted dataset (xxh3-128 in its manifest) and a copy packed uncompressed (`pack
--compression none`): the two kinds staging gives to a copier; compressed packs are decompressed in
Python whatever the copier. Data: a CosmoFlow set of 192 64^3 universes (32^3 samples, ~0.4 GB) and
the DeepCAM mini set of `make demo` (~1.0 GB), made with `python -m data_prep` under --data-dir when
missing. Every source is read into the page cache before its runs, so every run reads from memory
(the fraction still cached afterwards is recorded, from fincore); the caches are not dropped. The
output is deleted and `sync` run before every run, and as much memory as the run writes is written and
freed just before it (see staging_throughput.warm_free_memory). Rounds are interleaved (every case once
per round, the order rotated each round) and the median of --repeats rounds is reported with every
value; CPU time is user + system of all threads (staging) or of all processes (baselines).

The decision this answers (the project's issue 21): the native copier is kept only where it clearly
beats the best Python method (more than NATIVE_MARGIN more throughput, or NATIVE_CPU_MARGIN less CPU
per GB) in a case whose best Python staging misses GOAL x the faster baseline. Writes
benchmarks/results/copier_compare.json and prints a table.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

# Run as a script, so benchmarks/ is on sys.path.
from harness import REPO, RESULTS_DIR, write_json_atomic
from staging_throughput import (baseline_commands, cached_fraction, other_jobs, read_into_page_cache, run_command,
                                source_files, warm_free_memory)

from common.base.version import code_version
from common.io import pycopy
from common.io.staging import Layout, filesystem_type, open_source, plan, stage

RESULTS = RESULTS_DIR / "copier_compare.json"
DEFAULT_DATA_DIR = Path("/tmp/copier-compare/data")
DEFAULT_WORK_DIR = Path("/tmp/copier-compare/packed")
SCRATCH_NAME = "copier-compare-scratch"
GOAL = 0.8  # staging GB/s over the faster baseline's
NATIVE_MARGIN = 0.10  # native throughput over the best Python method's, minus 1, that counts as a clear win
NATIVE_CPU_MARGIN = 0.20  # CPU s/GB saved by native against the best Python method that counts as marked
PYTHON_COPIERS = tuple(f"python-{m}" for m in pycopy.METHODS)
DATASETS = {  # name: (synth command, convert command), as `make demo` makes them (CosmoFlow smaller)
    "cosmoflow": (("cosmo-synth", "--universes", "192", "--size", "64", "--prior", "mini", "--seed", "2026"),
                  ("cosmo-convert", "--sample-size", "32", "--val-universes", "16", "--seed", "2026")),
    "deepcam": (("deepcam-synth", "--train", "1024", "--validation", "128", "--height", "96", "--width", "144",
                 "--seed", "2026"), ("deepcam-convert",)),
}


# ----------------------------------------------------------------------------- data
def make_dataset(name: str, data_dir: Path) -> Path:
    """The converted dataset `name` under `data_dir`, made (and its raw HDF5 deleted) when missing."""
    records = data_dir / name / "tfrecords"
    if (records / "manifest.json").is_file():
        return records
    synth, convert = DATASETS[name]
    raw = data_dir / name / "raw"
    print(f"  making {records}", flush=True)
    _run([sys.executable, "-m", "data_prep", *synth, "--out", str(raw)])
    _run([sys.executable, "-m", "data_prep", *convert, "--input", str(raw), "--out", str(records)])
    shutil.rmtree(raw)
    return records


def make_pack(name: str, records: Path, work_dir: Path) -> Path:
    """`records` packed uncompressed (archives aligned to 2 ranks) under `work_dir`, made when missing."""
    out = work_dir / f"{name}-none"
    if not (out / "pack.json").is_file():
        shutil.rmtree(out, ignore_errors=True)
        print(f"  packing {records} into {out}", flush=True)
        _run([sys.executable, "-m", "data_prep", "pack", "--input", str(records), "--out", str(out),
              "--compression", "none", "--align-ranks", "2"])
    return out


def _run(cmd: list[str]) -> None:
    import subprocess
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")


# ----------------------------------------------------------------------------- copiers and runs
def copiers(names: list[str]) -> dict[str, object]:
    """The copier objects to compare, by name; `native` only when common/io/nativecopy.py is there and built."""
    out = {}
    for name in names:
        if name == "native":
            native = _native()
            if native is None:
                print("  native: not available (common/io/nativecopy.py missing or not built), skipped", flush=True)
                continue
            out[name] = native
        else:
            out[name] = pycopy.Copier(method=name.removeprefix("python-"))
    return out


def _native():
    try:
        from common.io import nativecopy
    except ImportError:
        return None
    return nativecopy.load()


def run_staging(source_dir: Path, copier, scratch: Path, nbytes: int, threads: int) -> dict:
    """Time one staging of the whole source with `copier`: wall and CPU seconds (all threads)."""
    warmed = warm_free_memory(nbytes)
    t0, cpu0 = time.perf_counter(), time.process_time()
    source = open_source(source_dir)
    the_plan = plan(source, "node", Layout(), lambda manifest, rank, ranks: [])  # node mode: stages every file
    result = stage(source, the_plan, scratch, threads=threads, copier=copier)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"seconds": seconds, "cpu_seconds": cpu, "warm_seconds": warmed, "bytes_written": result.bytes_written,
            "bytes_read": result.bytes_read, "copier": result.copier, "reads": result.reads,
            "checksum": result.checksum, "dest_fs": result.dest_fs, "source_fs": result.source_fs}


@dataclasses.dataclass(frozen=True)
class Trial:
    """One thing timed: a copier's staging or a baseline command."""

    kind: str  # "staging" or "baseline"
    name: str  # the copier's name or the baseline's
    run: Callable[[], dict]


def trials_of(source_dir: Path, kind: str, scratch: Path, chosen: dict, threads: int) -> list[Trial]:
    """The stagings and baselines of one source at one destination (GB/s of all: the dataset's bytes)."""
    nbytes = sum(m.bytes for m in open_source(source_dir).files.values())
    out = [Trial("staging", name, lambda c=copier: run_staging(source_dir, c, scratch, nbytes, threads))
           for name, copier in chosen.items()]
    commands = baseline_commands(source_dir, kind, scratch / "copy")
    return out + [Trial("baseline", name, lambda c=cmd: run_command(c, nbytes, nbytes))
                  for name, cmd in commands.items()]


def measure(dataset: str, dest: Path, kind: str, source_dir: Path, chosen: dict, repeats: int,
            threads: int) -> list[dict]:
    """Every trial of one source at one destination, `repeats` interleaved rounds (order rotated each
    round) after one untimed warm-up round; one entry per trial."""
    scratch = dest / SCRATCH_NAME
    trials = trials_of(source_dir, "plain" if kind == "plain" else "none", scratch, chosen, threads)
    files = source_files(source_dir)
    read_into_page_cache(files)
    runs: dict[str, list[dict]] = {t.name: [] for t in trials}
    for round_ in range(-1, repeats):
        for t in trials[round_ % len(trials):] + trials[:round_ % len(trials)]:
            _clear(scratch)
            figures = t.run()
            if round_ >= 0:
                runs[t.name].append(figures)
                print(f"    {dataset} -> {dest} {kind} {t.name} [{round_ + 1}/{repeats}]: "
                      f"{figures['bytes_written'] / figures['seconds'] / 1e9:.2f} GB/s", flush=True)
    _clear(scratch)
    scratch.rmdir()
    cached = cached_fraction(files)
    where = {"dataset": dataset, "dest": str(dest), "source": kind}
    return [{**where, "kind": t.kind, "name": t.name, **summarise(runs[t.name]), "source_cached_after": cached,
             "runs": runs[t.name]} for t in trials]


def _clear(scratch: Path) -> None:
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    os.sync()


def summarise(runs: list[dict]) -> dict:
    """Median seconds, GB/s written and CPU s/GB of the runs."""
    seconds = statistics.median(r["seconds"] for r in runs)
    written = runs[0]["bytes_written"]
    return {"median_seconds": seconds, "seconds_all": [r["seconds"] for r in runs], "bytes_written": written,
            "gb_per_second": written / seconds / 1e9,
            "gb_per_second_all": [written / r["seconds"] / 1e9 for r in runs],
            "cpu_seconds_per_gb": statistics.median(r["cpu_seconds"] for r in runs) / (written / 1e9)}


# ----------------------------------------------------------------------------- verdict and outputs
def compare(cases: list[dict]) -> list[dict]:
    """Per dataset, destination and source: each staging against the faster baseline, and native against
    the best Python method (by throughput), with whether native clearly wins where it matters."""
    out = []
    for key in sorted({(c["dataset"], c["dest"], c["source"]) for c in cases}):
        same = [c for c in cases if (c["dataset"], c["dest"], c["source"]) == key]
        best = max((c for c in same if c["kind"] == "baseline"), key=lambda c: c["gb_per_second"])
        ratios = {c["name"]: c["gb_per_second"] / best["gb_per_second"] for c in same if c["kind"] == "staging"}
        python = max((c for c in same if c["name"].startswith("python-")), key=lambda c: c["gb_per_second"])
        native = next((c for c in same if c["name"] == "native"), None)
        row = {"dataset": key[0], "dest": key[1], "source": key[2], "best_baseline": best["name"],
               "best_baseline_gb_per_second": best["gb_per_second"], "ratio_to_baseline": ratios,
               "best_python": python["name"], "best_python_meets_goal": ratios[python["name"]] >= GOAL}
        if native:
            row["native_throughput_gain"] = native["gb_per_second"] / python["gb_per_second"] - 1
            row["native_cpu_saving"] = 1 - native["cpu_seconds_per_gb"] / python["cpu_seconds_per_gb"]
            row["native_clearly_wins_where_it_matters"] = not row["best_python_meets_goal"] and (
                row["native_throughput_gain"] > NATIVE_MARGIN or row["native_cpu_saving"] > NATIVE_CPU_MARGIN)
        out.append(row)
    return out


def by_copier(comparisons: list[dict], cases: list[dict]) -> dict[str, dict]:
    """Each copier over all cases: its lowest and median ratio to the faster baseline and its median CPU s/GB
    (what the default method is chosen by)."""
    out = {}
    for name in dict.fromkeys(c["name"] for c in cases if c["kind"] == "staging"):
        ratios = [c["ratio_to_baseline"][name] for c in comparisons if name in c["ratio_to_baseline"]]
        cpu = [c["cpu_seconds_per_gb"] for c in cases if c["name"] == name]
        out[name] = {"lowest_ratio": min(ratios), "median_ratio": statistics.median(ratios),
                     "median_cpu_seconds_per_gb": statistics.median(cpu), "cases_meeting_goal": sum(
                         r >= GOAL for r in ratios), "cases": len(ratios)}
    return out


def verdict(comparisons: list[dict]) -> str:
    """What the figures say about keeping the native copier."""
    measured = [c for c in comparisons if "native_throughput_gain" in c]
    if not measured:
        return "native copier not measured (not available)"
    wins = [c for c in measured if c["native_clearly_wins_where_it_matters"]]
    if wins:
        return "keep native: it clearly wins where the best Python method misses the goal in " + ", ".join(
            f"{c['dataset']} {c['source']} -> {c['dest']}" for c in wins)
    return ("remove native: in no case does it clearly beat the best Python method (by more than "
            f"{NATIVE_MARGIN:.0%} throughput or {NATIVE_CPU_MARGIN:.0%} CPU per GB) where that misses {GOAL} x the "
            f"faster of cp -r / tar -x")


def table(result: dict) -> list[str]:
    """One row per case: GB/s (all runs), CPU s/GB, ratio to the faster baseline."""
    rows = ["| dataset | dest | source | copier / command | GB/s median (runs) | CPU s/GB | / best baseline |",
            "|---|---|---|---|---|---|---|"]
    best = {(c["dataset"], c["dest"], c["source"]): c["best_baseline_gb_per_second"] for c in result["comparisons"]}
    for c in result["cases"]:
        ratio = c["gb_per_second"] / best[c["dataset"], c["dest"], c["source"]]
        rows.append(f"| {c['dataset']} | {c['dest']} | {c['source']} | {c['name']} | {c['gb_per_second']:.2f} "
                    f"({', '.join(f'{g:.2f}' for g in c['gb_per_second_all'])}) | {c['cpu_seconds_per_gb']:.2f} | "
                    f"{ratio:.2f} |")
    rows += ["", "| copier | lowest / best baseline | median / best baseline | median CPU s/GB | cases >= goal |",
             "|---|---|---|---|---|"]
    for name, c in result["by_copier"].items():
        rows.append(f"| {name} | {c['lowest_ratio']:.2f} | {c['median_ratio']:.2f} | "
                    f"{c['median_cpu_seconds_per_gb']:.2f} | {c['cases_meeting_goal']} of {c['cases']} |")
    return rows + ["", f"Verdict: {result['verdict']}", result["page_cache"]]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    p.add_argument("--dests", nargs="+", type=Path, default=[Path("/dev/shm"), Path("/tmp")])
    p.add_argument("--sources", nargs="+", choices=["plain", "none"], default=["plain", "none"],
                   help="plain: the converted directory; none: a copy packed uncompressed")
    p.add_argument("--copiers", nargs="+", choices=["native", *PYTHON_COPIERS],
                   default=["native", *PYTHON_COPIERS])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="staging threads (default: the cores)")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR)
    p.add_argument("--results", type=Path, default=RESULTS)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    started, load0, jobs0, code = time.perf_counter(), os.getloadavg(), other_jobs(), code_version(("common",))
    chosen, cases = copiers(args.copiers), []
    for name in args.datasets:
        records = make_dataset(name, args.data_dir)
        sources = {"plain": records, "none": make_pack(name, records, args.work_dir) if "none" in args.sources
                   else None}
        for dest in args.dests:
            for kind in args.sources:
                print(f"  {name} -> {dest}, {kind} (load {os.getloadavg()[0]:.2f})", flush=True)
                cases += measure(name, dest, kind, sources[kind], chosen, args.repeats, args.threads)
    comparisons = compare(cases)
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.uname().nodename} {os.cpu_count()} cores",
              "code": code, "threads": args.threads, "repeats": args.repeats, "goal": GOAL,
              "native_margin": NATIVE_MARGIN, "native_cpu_margin": NATIVE_CPU_MARGIN,
              "loadavg_start": load0, "loadavg_end": os.getloadavg(), "other_jobs_at_start": jobs0,
              "other_jobs_at_end": other_jobs(), "total_seconds": time.perf_counter() - started,
              "filesystems": {**{str(d): filesystem_type(d) for d in args.dests},
                              "sources": filesystem_type(args.data_dir)},
              "page_cache": "Sources read into the page cache before their runs (not dropped); fraction of source "
                            f"bytes cached after the runs: {_cached_range(cases)}.",
              "comparisons": comparisons, "by_copier": by_copier(comparisons, cases), "verdict": verdict(comparisons),
              "cases": cases}
    write_json_atomic(args.results, result)
    print("\n".join(table(result)))
    print(f"wrote {args.results}")


def _cached_range(cases: list[dict]) -> str:
    values = [c["source_cached_after"] for c in cases if c["source_cached_after"] is not None]
    return f"{min(values):.2f} to {max(values):.2f}" if values else "not measured (no fincore)"


if __name__ == "__main__":
    main()
