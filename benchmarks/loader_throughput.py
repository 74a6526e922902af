"""Measure the input pipelines of CosmoFlow and DeepCAM, tf.data and DALI, with no training step.

    python benchmarks/loader_throughput.py [--apps cosmoflow deepcam] [--cases reference mini]
        [--loaders tfdata dali] [--ranks 1 2] [--batches N] [--warmup N] [--data-dir DIR]
        [--set key=value ...]

For each app, sample size (case), loader and rank count it launches a worker that builds the
training dataset with the app's own `build_datasets` (manifest checks, sharding, shuffling,
decoding, log1p or normalisation: exactly the tensors training gets), pulls `--warmup` untimed
batches, then times `--batches` more. Rank counts:

    1  one process pinned to one core before TensorFlow loads (os.sched_setaffinity(0, {0})),
       with data.read_threads=1, dist.threads_per_rank=1, dist.inter_op_threads=1
    2  horovodrun -np 2 on localhost, each rank reading its own shard with the config's settings

Cases, each from its config's data and train sections (local batch as configured):

    reference  CosmoFlow 128^3 x 4 (cosmo.yaml), DeepCAM 768 x 1152 x 16 (deepcam.yaml)
    mini       CosmoFlow 32^3 x 4 (cosmo_mini.yaml), DeepCAM 96 x 144 x 16 (deepcam_mini.yaml)

The datasets are made once with the project's data_prep tools (uncompressed records with DALI
indexes) under --data-dir and reused while their manifests match; their files are read before every
measurement, so the loaders read from the page cache, as from staged node-local data. Beside the
rates, each measurement records the cores the workers kept busy, the cores other jobs kept busy and
the machine's disk reads in the timed part, which show a disturbed figure. Each one-core figure is
compared with the one-process training rate at the same sample size from
benchmarks/results/{cosmoflow,deepcam}_throughput.json; the goal is a loader rate of at least GOAL
times that. Writes benchmarks/results/loader_throughput.json and the table between the markers in
docs/performance.md, both with the runs of this invocation only.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# Run as a script, so benchmarks/ is on sys.path.
from harness import (DOC, REPO, RESULTS_DIR, check_marked_section, measured_note, replace_marked_section,
                     run_header, run_worker, sgemm_gflops, time_steps, write_json_atomic, write_worker_result)

from common.base.version import code_version

RESULTS = RESULTS_DIR / "loader_throughput.json"
BEGIN, END = "<!-- loader-throughput:begin -->", "<!-- loader-throughput:end -->"
DEFAULT_DATA_DIR = Path("/tmp/hpc-sciml-bench-loader-data")
APPS = ("cosmoflow", "deepcam")
LOADERS = ("tfdata", "dali")
GOAL = 5.0  # loader samples/s on one core over training samples/s (one process) at the same sample size
ONE_CORE = {0}
ONE_CORE_OVERRIDES = ("data.read_threads=1", "dist.threads_per_rank=1", "dist.inter_op_threads=1")
CODE_DIRS = ("common", "cosmoflow", "deepcam", "data_prep")  # what the measured pipelines run
TRAINING_RESULTS = {"cosmoflow": RESULTS_DIR / "cosmoflow_throughput.json",
                    "deepcam": RESULTS_DIR / "deepcam_throughput.json"}


@dataclasses.dataclass(frozen=True)
class Case:
    """One app at one sample size: config, dataset recipe and default batch counts."""

    config: str  # YAML under the repository whose data, train and model.input_shape are used
    synth: tuple[str, ...]  # `python -m data_prep` arguments making the raw files (--out added)
    convert: tuple[str, ...]  # arguments converting them to records (--input, --out added)
    train_samples: int  # what the conversion gives: a multiple of 2 ranks x local batch
    val_samples: int
    warmup: int  # untimed batches (the first fills the shuffle buffer)
    batches: int  # timed batches


# Train/validation counts let 1 or 2 ranks each read a whole number of batches of both splits.
CASES = {
    ("cosmoflow", "reference"): Case(
        "cosmoflow/configs/cosmo.yaml", ("cosmo-synth", "--universes", "64", "--size", "128", "--seed", "7"),
        ("cosmo-convert", "--sample-size", "128", "--val-universes", "8", "--compression", "none"),
        train_samples=56, val_samples=8, warmup=2, batches=48),
    ("cosmoflow", "mini"): Case(
        "cosmoflow/configs/cosmo_mini.yaml",
        ("cosmo-synth", "--universes", "48", "--size", "64", "--prior", "mini", "--seed", "7"),
        ("cosmo-convert", "--sample-size", "32", "--val-universes", "4", "--compression", "none"),
        train_samples=352, val_samples=32, warmup=20, batches=2000),
    ("deepcam", "reference"): Case(
        "deepcam/configs/deepcam.yaml", ("deepcam-synth", "--train", "24", "--validation", "4", "--seed", "7"),
        ("deepcam-convert", "--compression", "none"), train_samples=24, val_samples=4, warmup=2, batches=48),
    ("deepcam", "mini"): Case(
        "deepcam/configs/deepcam_mini.yaml",
        ("deepcam-synth", "--train", "512", "--validation", "32", "--height", "96", "--width", "144", "--seed", "7"),
        ("deepcam-convert", "--compression", "none"), train_samples=512, val_samples=32, warmup=20, batches=2000),
}


def app_parts(app: str):
    """The app's config schema and data module (imports nothing of TensorFlow)."""
    if app == "cosmoflow":
        from cosmoflow import data
        from cosmoflow.config import CosmoConfig as schema
    else:
        from deepcam import data
        from deepcam.config import DeepCamConfig as schema
    return schema, data


def load_case_config(app: str, case: str, overrides=()):
    """The case's config with `overrides` applied."""
    from common.runtime.config import load_config
    schema, _ = app_parts(app)
    return load_config(REPO / CASES[app, case].config, overrides, schema=schema)


def worker_overrides(records: Path, loader: str, ranks: int, extra=()) -> list[str]:
    """Config overrides of one measurement: this dataset and loader, any sample count, one-core
    pinning, then the command line's `extra` ones."""
    base = [f"data.dir={records}", f"data.loader={loader}", "data.train_samples=0", "data.val_samples=0"]
    return base + (list(ONE_CORE_OVERRIDES) if ranks == 1 else []) + list(extra)


# ----------------------------------------------------------------------------- figures (pure)

def bytes_per_sample(file_entries) -> float:
    """On-disk bytes per record of a split: its files' bytes over their records."""
    return sum(e.bytes for e in file_entries) / sum(e.records for e in file_entries)


def loader_figures(rank_seconds, samples_per_rank: int, sample_bytes: float) -> dict:
    """Samples/s and MB/s (1e6 bytes read from the files) per rank and over all ranks.

    Args:
        rank_seconds: each rank's time to pull its `samples_per_rank` samples; the ranks start
            together, so the total rate is all samples over the slowest rank's time.
    """
    per_rank = [samples_per_rank / s for s in rank_seconds]
    total = samples_per_rank * len(rank_seconds) / max(rank_seconds)
    return {"samples_per_second": total, "mb_per_second": total * sample_bytes / 1e6,
            "rank_samples_per_second": per_rank, "rank_mb_per_second": [r * sample_bytes / 1e6 for r in per_rank]}


def batch_time_summary(seconds) -> dict:
    """Minimum, median, 90th percentile and maximum of the times of single batches."""
    import numpy as np
    q = np.percentile(seconds, [0, 50, 90, 100])
    return {"batches": len(seconds), "min": q[0], "median": q[1], "p90": q[2], "max": q[3]}


def training_rate(result: dict, app: str, sample_shape, ranks: int) -> dict | None:
    """The row of a training-throughput results file at this sample shape and rank count, or None."""
    for run in result.get("runs", []):
        shape = run.get("input_shape") or [run["size"]] * 3 + [4]  # CosmoFlow rows give only the cube edge
        if list(shape) == list(sample_shape) and run["ranks"] == ranks:
            return {"file": str(TRAINING_RESULTS[app].relative_to(REPO)), "date": result.get("date"),
                    "samples_per_second": run["samples_per_second"], "local_batch": run["local_batch"],
                    "threads_per_rank": run["threads_per_rank"], "width": run.get("width", 1.0)}
    return None


def compare(loader_rate: float, training: dict | None, ranks: int) -> dict:
    """Loader rate over training rate, and (one core only) whether it meets the goal."""
    if training is None:
        return {"ratio_to_training": None, "meets_goal": None}
    ratio = loader_rate / training["samples_per_second"]
    return {"ratio_to_training": ratio, "meets_goal": ratio >= GOAL if ranks == 1 else None}


# ----------------------------------------------------------------------------- data

def prepare_dataset(app: str, case: str, data_dir: Path) -> Path:
    """The case's converted dataset under `data_dir`, made with data_prep unless already complete."""
    spec, root = CASES[app, case], data_dir / f"{app}-{case}"
    records, raw = root / "tfrecords", root / "raw"
    if not (records / "manifest.json").is_file():
        print(f"  {app} {case}: making the dataset in {root}", flush=True)
        t0 = time.perf_counter()
        data_prep = [sys.executable, "-m", "data_prep"]
        _run([*data_prep, *spec.synth, "--out", str(raw)])
        _run([*data_prep, *spec.convert, "--input", str(raw), "--out", str(records)])
        shutil.rmtree(raw)  # the records hold everything the loaders read (DeepCAM's stats.h5 included)
        print(f"    {time.perf_counter() - t0:.0f} s", flush=True)
    check_dataset(app, case, records)
    return records


def check_dataset(app: str, case: str, records: Path) -> None:
    """Refuse a dataset whose manifest does not describe what this case measures."""
    from common.io.manifest import load_manifest
    manifest, spec = load_manifest(records), CASES[app, case]
    found = (list(manifest.sample_shape), manifest.compression,
             manifest.splits["train"].samples, manifest.splits["validation"].samples)
    expected = (list(load_case_config(app, case).model.input_shape), "none", spec.train_samples, spec.val_samples)
    if found != expected:
        raise SystemExit(f"{records}/manifest.json: sample shape, compression, train and validation samples are "
                         f"{found}, expected {expected}; remove {records.parent} to have it remade")


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-2000:]}")


def dataset_bytes(records: Path) -> int:
    return sum(f.stat().st_size for f in records.rglob("*") if f.is_file())


def read_into_page_cache(records: Path) -> None:
    """Read every file once, so that the timed reads come from the page cache.

    Done before every measurement: this VM pages out file pages left unread for about a minute.
    """
    for path in sorted(records.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                while f.read(64 << 20):
                    pass


def machine_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot, all cores (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait; guest time is already in user and nice
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def disk_read_bytes() -> int:
    """Bytes read from block devices since boot, whole machine (/proc/vmstat pgpgin, in KiB)."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("pgpgin "):
            return int(line.split()[1]) * 1024
    raise ValueError("/proc/vmstat: no pgpgin line")


def other_load(machine_busy: float, seconds: float, own_cores: float) -> float:
    """Cores other jobs kept busy: the machine's busy CPU seconds over `seconds`, less our own cores."""
    return max(0.0, machine_busy / seconds - own_cores)


def ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def code_state() -> dict:
    """The commit measured and the files of the measured packages that differ from it."""
    return code_version(CODE_DIRS)


# ----------------------------------------------------------------------------- worker

def worker(app: str, case: str, loader: str, ranks: int, records: str, batches: int, warmup: int,
           extra: list[str], out: str) -> None:
    """Pull `warmup` then `batches` timed training batches on this rank; rank 0 writes the result."""
    if ranks == 1:
        os.sched_setaffinity(0, ONE_CORE)  # before TensorFlow starts any thread
    cores = sorted(os.sched_getaffinity(0))
    from common.runtime.dist import init_distributed
    cfg = load_case_config(app, case, worker_overrides(Path(records), loader, ranks, extra))
    dist = init_distributed(cfg.dist)
    import tensorflow as tf
    _, data = app_parts(app)
    batch = cfg.train.local_batch_size
    datasets = data.build_datasets(cfg.data, cfg.model.input_shape, batch, dist, cfg.run.seed)
    batches_iter = iter(datasets.train)
    first = next(batches_iter)  # (x, y) as the training loop gets them; fills the shuffle buffer
    for _ in range(warmup - 1):
        next(batches_iter)
    dist.barrier()  # the ranks start timing together
    cpu, machine, disk = time.process_time(), machine_busy_seconds(), disk_read_bytes()
    times = time_steps(lambda: next(batches_iter), 0, batches)
    # Cores this process kept busy (all its threads): near 1 on one core unless another job shares it.
    cores_busy = (time.process_time() - cpu) / sum(times)
    machine, disk = machine_busy_seconds() - machine, disk_read_bytes() - disk  # whole machine, rank 0's window
    rank_seconds, rank_cores_busy = _per_rank(dist, sum(times), "seconds"), _per_rank(dist, cores_busy, "cores")
    write_worker_result(out, times, dist, rank_seconds=rank_seconds, rank_cores_busy=rank_cores_busy,
                        machine_busy_seconds=machine, disk_mb_read=disk / 1e6, cores=cores,
                        read_threads=cfg.data.read_threads,
                        inter_op_threads=cfg.dist.inter_op_threads, shuffle=cfg.data.shuffle,
                        shuffle_buffer=cfg.data.shuffle_buffer, prefetch=cfg.data.prefetch,
                        train_steps_per_epoch=datasets.train_steps,
                        batch=[{"shape": list(t.shape), "dtype": t.dtype.name} for t in first],
                        versions=_versions(tf))


def _per_rank(dist, value: float, name: str) -> list[float]:
    """`value` of every rank, in rank order (a sum of one-hot vectors); call on every rank."""
    import numpy as np
    import tensorflow as tf
    slots = np.zeros(dist.size)
    slots[dist.rank] = value
    return [float(v) for v in np.asarray(dist.sum(tf.constant(slots), name=f"per_rank_{name}"))]


def _versions(tf) -> dict:
    try:
        import nvidia.dali as dali
        dali_version = dali.__version__
    except ImportError:
        dali_version = None
    return {"tensorflow": tf.__version__, "dali": dali_version}


# ----------------------------------------------------------------------------- driver

def measure(app: str, case: str, loader: str, ranks: int, records: Path, batches: int | None,
            warmup: int | None, extra: list[str]) -> dict:
    """Time one loader on `ranks` ranks in a worker process; the figures of one table row."""
    spec, cfg = CASES[app, case], load_case_config(app, case)
    batches = spec.batches if batches is None else batches
    warmup = spec.warmup if warmup is None else warmup
    batch, shape = cfg.train.local_batch_size, list(cfg.model.input_shape)
    label = (f"{app} {case} ({' x '.join(map(str, shape))}, local batch {batch}), {loader}, "
             f"{'1 process on 1 core' if ranks == 1 else f'{ranks} ranks'}: {warmup} warm-up + {batches} timed batches")
    args = ["--app", app, "--case", case, "--loader", loader, "--ranks", str(ranks), "--records", str(records),
            "--batches", str(batches), "--warmup", str(warmup)] + (["--set", *extra] if extra else [])
    load = os.getloadavg()
    read_into_page_cache(records)
    res = run_worker(__file__, args, ranks, RESULTS_DIR / f".worker-loader-{app}-{case}-{loader}-{ranks}.json", label)
    batch_seconds = batch_time_summary(res.pop("step_seconds"))
    from common.io.manifest import load_manifest
    sample_bytes = bytes_per_sample(load_manifest(records).splits["train"].files)
    figures = loader_figures(res["rank_seconds"], batches * batch, sample_bytes)
    training = _training(app, shape, ranks)
    return {"app": app, "case": case, "config": spec.config, "loader": loader, "sample_shape": shape,
            "ranks": ranks, "local_batch": batch, "overrides": worker_overrides(records, loader, ranks, extra),
            "warmup_batches": warmup, "timed_batches": batches, "bytes_per_sample": sample_bytes, **figures,
            "training": training, **compare(figures["samples_per_second"], training, ranks),
            "loadavg_before": list(load), **res, "batch_seconds_rank0": batch_seconds,
            "other_cores_busy": other_load(res["machine_busy_seconds"], res["rank_seconds"][0],
                                           sum(res["rank_cores_busy"]))}


def _training(app: str, shape, ranks: int) -> dict | None:
    path = TRAINING_RESULTS[app]
    return training_rate(json.loads(path.read_text()), app, shape, ranks) if path.is_file() else None


def dali_over_tfdata(runs: list[dict], run: dict) -> float | None:
    """A DALI run's rate over the tf.data run of the same app, case and ranks in `runs`; None otherwise."""
    if run["loader"] != "dali":
        return None
    same = [r for r in runs if r["loader"] == "tfdata" and
            (r["app"], r["case"], r["ranks"]) == (run["app"], run["case"], run["ranks"])]
    return run["samples_per_second"] / same[0]["samples_per_second"] if same else None


def _fmt(value: float) -> str:
    """Three significant digits, without an exponent."""
    return f"{value:.3g}" if value < 1000 else f"{value:,.0f}"


def table_rows(result: dict) -> list[str]:
    """The markdown table of docs/performance.md, one row per measurement, and its notes."""
    rows = ["| app | sample | loader | layout | samples/s | MB/s | per rank samples/s | cores busy | other jobs' cores "
            "| disk MB read | DALI / tf.data | training samples/s | loader / training | 5x goal |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows += [_row(r) for r in result["runs"]]
    data = result["data"]
    rows.append(f"\nData: {data['bytes'] / 1e9:.2f} GB of uncompressed records in {data['dir']}, read from the page "
                f"cache ({data['ram_bytes'] / 2**30:.0f} GiB RAM). Load average (1 min) at start "
                f"{result['loadavg_start'][0]:.2f}, at end {result['loadavg_end'][0]:.2f}.")
    if result["extra_overrides"]:
        rows.append(f"Extra config overrides in every measurement: {' '.join(result['extra_overrides'])}.")
    return rows + [measured_note(result)]


def _row(r: dict) -> str:
    layout = "1 core" if r["ranks"] == 1 else f"{r['ranks']} ranks x {r['threads_per_rank']} thread"
    training, ratio, goal = "n/a", "n/a", ""
    if r["training"]:
        training, ratio = _fmt(r["training"]["samples_per_second"]), f"{r['ratio_to_training']:.1f}x"
    if r["meets_goal"] is not None:
        goal = "met" if r["meets_goal"] else "**not met**"
    vs = "" if r.get("dali_over_tfdata") is None else f"{r['dali_over_tfdata']:.2f}"
    return (f"| {r['app']} | {' x '.join(map(str, r['sample_shape']))} | {r['loader']} | {layout} "
            f"| {_fmt(r['samples_per_second'])} | {r['mb_per_second']:.0f} "
            f"| {' / '.join(_fmt(v) for v in r['rank_samples_per_second'])} | {sum(r['rank_cores_busy']):.2f} "
            f"| {r['other_cores_busy']:.2f} | {r['disk_mb_read']:.0f} | {vs} | {training} | {ratio} | {goal} |")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--apps", nargs="+", choices=APPS, default=list(APPS), help="default: both")
    p.add_argument("--cases", nargs="+", choices=["reference", "mini"], default=["reference", "mini"],
                   help="sample sizes (default: both)")
    p.add_argument("--loaders", nargs="+", choices=LOADERS, default=list(LOADERS), help="default: both")
    p.add_argument("--ranks", type=int, nargs="+", choices=[1, 2], default=[1, 2],
                   help="1: one process on one core; 2: horovodrun -np 2 (default: 1 2)")
    p.add_argument("--batches", type=int, help="timed batches of every case (default: reference 48, mini 2000)")
    p.add_argument("--warmup", type=int, help="untimed batches first, at least 1 (default: reference 2, mini 20)")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                   help=f"where the datasets are made and reused (default: {DEFAULT_DATA_DIR})")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="config overrides for every measurement, after the script's own (e.g. dist.cycle_time_ms=100)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--app", choices=APPS, help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--loader", choices=LOADERS, help=argparse.SUPPRESS)
    p.add_argument("--records", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.batches is not None and args.batches < 1 or args.warmup is not None and args.warmup < 1:
        p.error(f"--batches {args.batches}, --warmup {args.warmup}: expected at least 1 of each "
                f"(the first batch fills the shuffle buffer)")
    return args


def run_description(args, datasets: dict) -> dict:
    """What every results file says besides the figures: code, pinning, data and the goal."""
    return {"code": code_state(), "goal": f"one-core loader samples/s >= {GOAL:g} x one-process training "
                                          f"samples/s at the same sample size",
            "pinning": {"1": f"one process, os.sched_setaffinity(0, {sorted(ONE_CORE)}) in the worker before "
                             f"TensorFlow is imported (threads started later inherit it); "
                             f"{', '.join(ONE_CORE_OVERRIDES)}",
                        "2": "horovodrun -np 2 -H localhost:2, no affinity set; the config's data.read_threads, "
                             "dist.inter_op_threads and dist.threads_per_rank (0: cores / ranks = 1)"},
            "extra_overrides": args.overrides,
            "data": {"dir": str(args.data_dir), "bytes": sum(dataset_bytes(p) for p in datasets.values()),
                     "ram_bytes": ram_bytes(), "note": "uncompressed TFRecords with DALI indexes made by data_prep; "
                     "every file is read once before the measurements, so the loaders read from the page cache"}}


def main() -> None:
    args = parse_args()
    if args.worker:
        return worker(args.app, args.case, args.loader, args.ranks[0], args.records, args.batches, args.warmup,
                      args.overrides, args.out)
    check_marked_section(DOC, BEGIN, END)
    t_start, load_start = time.perf_counter(), os.getloadavg()
    print("sgemm ...", flush=True)
    gflops = sgemm_gflops()
    print(f"    {gflops:.1f} GFLOP/s", flush=True)
    datasets = {(app, case): prepare_dataset(app, case, args.data_dir) for app in args.apps for case in args.cases}
    runs = []
    for (app, case), records in datasets.items():
        for loader in args.loaders:
            for ranks in args.ranks:
                t0 = time.perf_counter()
                runs.append(r := measure(app, case, loader, ranks, records, args.batches, args.warmup, args.overrides))
                ratio = "" if r["ratio_to_training"] is None else f", {r['ratio_to_training']:.1f}x training"
                print(f"    {r['samples_per_second']:.3g} samples/s, {r['mb_per_second']:.0f} MB/s{ratio} "
                      f"({time.perf_counter() - t0:.0f} s in all)", flush=True)
    for r in runs:
        r["dali_over_tfdata"] = dali_over_tfdata(runs, r)
    result = {**run_header(gflops), "loadavg_start": list(load_start), "loadavg_end": list(os.getloadavg()),
              "seconds": time.perf_counter() - t_start, **run_description(args, datasets), "runs": runs}
    write_json_atomic(RESULTS, result)
    replace_marked_section(DOC, BEGIN, END, "\n".join(table_rows(result)))
    print(f"wrote {RESULTS} and the table in {DOC} ({result['seconds'] / 60:.1f} min)")


if __name__ == "__main__":
    main()
