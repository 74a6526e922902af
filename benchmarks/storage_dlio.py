"""Can this storage feed N accelerators? The suite's emulated sweep beside DLIO's CosmoFlow workload, in one run.

    python benchmarks/storage_dlio.py --data DIR [--accelerator h100|a100] [--ranks 1 2 4] [--epochs 3]
        [--config CONFIG] [--work runs/storage_dlio] [--dlio-data DIR-dlio] [--dlio-evict epoch|run]
        [--setup-only] [config overrides ...]

For each rank count, in turn (the order of the two sides alternating from count to count), it runs
- the suite's side: `python -m common.campaign storage --bench cosmoflow --ranks N` (common/storage/sweep.py):
  emulated accelerators reading DIR through the suite's input path, the dataset evicted before every epoch;
- DLIO's side: dlio_benchmark under `mpirun -np N` (horovodrun's options: no binding, ob1, no openib), its own
  `cosmoflow_<accelerator>` workload with what must match overridden: DIR's training file count, samples per
  file, mean and standard deviation of its records' bytes (DALI indexes, else each file's mean), the suite's
  local batch as batch_size, the accelerator's seconds per sample times that batch as computation_time, the
  suite's read threads and prefetch depth, the epochs. DLIO reads synthetic files it generates itself
  (workflow.generate_data=True, once: kept in --dlio-data while the dataset section stays the same).

DLIO does nothing about the page cache: it only warns (summary.json `potential_caching`) when the data is smaller
than the host's memory; MLPerf Storage's rules ask for a dataset of 5x the memory instead. Here its training files
are evicted with common/storage/page_cache.evict before each epoch (--dlio-evict epoch, the default: one DLIO run
of one epoch per epoch, as the suite evicts before every epoch) or once before one run of all epochs (--dlio-evict
run: DLIO's own behaviour, its later epochs may read from memory). Each DLIO run also records the bytes the data's
block device read (/sys/dev/block/*/stat, device-wide) and how much of the data was resident afterwards.

DLIO is installed the first time into .venv-dlio from benchmarks/dlio/requirements.txt with `pip install
--no-deps` (only what its TensorFlow TFRecord path imports, not torch or DALI); where it cannot be installed or
run, its side of each row says why. Figures per count and side: AU and delivered samples/s, each side as its
own code defines them (DLIO: samples over each epoch's wall time, the first step's included; the suite and
DLIO's `samples_per_second_from_au`: AU x accelerators x the accelerator's rate, the first step of each epoch
left out). Writes benchmarks/results/storage_dlio_<accelerator>.json, prints a table, and rewrites the table
of every accelerator's latest run between its markers in docs/performance.md.
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
from typing import Sequence

from harness import (DOC, REPO, RESULTS_DIR, VenvError, check_marked_section, measured_on, pinned_venv, read_pins,
                     replace_marked_section, run_header, sgemm_gflops, write_json_atomic)

from common.base.errors import BenchError
from common.io.manifest import FileEntry, load_manifest
from common.io.tfrecord import read_index
from common.storage import page_cache
from common.storage.accelerators import AU_THRESHOLD, EmulateConfig, rate
from common.storage.sweep import CONFIGS

HERE = REPO / "benchmarks/dlio"
PINS = HERE / "requirements.txt"
VENV = REPO / ".venv-dlio"
WORKLOADS = {"h100": "cosmoflow_h100", "a100": "cosmoflow_a100"}  # DLIO's own workload files
BEGIN, END = "<!-- storage-dlio:begin -->", "<!-- storage-dlio:end -->"  # the table of both accelerators in DOC
# horovodrun's mpirun options on one host (horovod/runner/mpi_run.py): DLIO's ranks sit on the cores as the suite's do
MPIRUN = ("--allow-run-as-root", "-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib")
DATA_STAMP = "suite_workload.json"  # in --dlio-data: the dataset section its files were generated for
APP = "cosmoflow"  # MLPerf Storage and DLIO have no DeepCAM workload


class DlioUnavailable(RuntimeError):
    """DLIO could not be installed, generate its data or run; the message says why."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """DLIO's CosmoFlow workload fitted to the suite's dataset and emulated run."""

    accelerator: str
    num_files_train: int
    num_samples_per_file: int
    record_length: int  # mean on-disk bytes of a training record (TFRecord framing included)
    record_length_stdev: int
    batch_size: int  # the suite's local batch
    computation_time: float  # seconds per batch: batch_size x the accelerator's seconds per sample
    read_threads: int
    prefetch_size: int

    def dataset_overrides(self, folder: Path) -> list[str]:
        """Hydra overrides of the workload's dataset section: what DLIO generates and reads."""
        return [f"workload={WORKLOADS[self.accelerator]}", f"++workload.dataset.data_folder={folder}",
                f"++workload.dataset.num_files_train={self.num_files_train}",
                f"++workload.dataset.num_samples_per_file={self.num_samples_per_file}",
                f"++workload.dataset.record_length={self.record_length}",
                f"++workload.dataset.record_length_stdev={self.record_length_stdev}"]

    def train_overrides(self, epochs: int) -> list[str]:
        """Hydra overrides of the reader and train sections for a training run of `epochs` epochs."""
        return [f"++workload.reader.batch_size={self.batch_size}",
                f"++workload.reader.read_threads={self.read_threads}",
                f"++workload.reader.prefetch_size={self.prefetch_size}",
                f"++workload.train.computation_time={self.computation_time!r}", f"++workload.train.epochs={epochs}",
                "++workload.workflow.generate_data=False", "++workload.workflow.train=True"]


# ---------------------------------------------------------------------------- the workload from the suite's dataset
def record_sizes(root: Path, files: Sequence[FileEntry]) -> list[int]:
    """The bytes of every record of `files` (a split of the dataset at `root`): from each file's DALI index ("offset
    size" per line) where it has one, else the file's bytes over its records for each of them."""
    sizes: list[int] = []
    for entry in files:
        if entry.index is None:
            sizes += [round(entry.bytes / entry.records)] * entry.records if entry.records else []
            continue
        index = read_index(root / entry.index)
        if len(index) != entry.records:
            raise BenchError(f"{root / entry.index}: {len(index)} lines, expected {entry.records} (one per record "
                             f"of {entry.path})")
        sizes += [size for _, size in index]
    return sizes


def fit_workload(files: Sequence[FileEntry], sizes: Sequence[int], accelerator: str, local_batch: int,
                 read_threads: int, prefetch: int) -> Workload:
    """DLIO's workload for the training split `files` (its records' `sizes`) as the suite reads it: the same file
    count, samples per file (the mean, rounded, where files differ), record bytes and accelerator time per batch."""
    samples = sum(f.records for f in files)
    if not files or samples == 0 or len(sizes) != samples:
        raise BenchError(f"training split: {len(files)} files, {samples} records and {len(sizes)} record sizes; "
                         f"expected at least one record and a size for each")
    samples_per_second, _ = rate(EmulateConfig(accelerator=accelerator), APP, local_batch)
    return Workload(accelerator=accelerator, num_files_train=len(files),
                    num_samples_per_file=max(1, round(samples / len(files))),
                    record_length=round(statistics.fmean(sizes)), record_length_stdev=round(statistics.pstdev(sizes)),
                    batch_size=local_batch, computation_time=round(local_batch / samples_per_second, 9),
                    read_threads=read_threads, prefetch_size=prefetch)


def suite_settings(config: Path, overrides: Sequence[str]) -> tuple[int, int, int]:
    """The suite's local batch, read threads and prefetch depth under `config` and `overrides`."""
    from common.runtime.config import load_config
    from cosmoflow.config import CosmoConfig
    cfg = load_config(config, overrides, CosmoConfig)
    return cfg.train.local_batch_size, cfg.data.read_threads, cfg.data.prefetch


# ---------------------------------------------------------------------------- DLIO's environment
def pins() -> list[str]:
    """The exact packages of DLIO's environment."""
    return read_pins(PINS)


def dlio_python() -> Path:
    """DLIO's interpreter in .venv-dlio, built the first time (and again when the pins changed) with --no-deps."""
    try:
        return pinned_venv(VENV, pins(), "DLIO's environment", pip_options=("--no-deps",),
                           env=dlio_env(VENV / "bin/python"), finish=finish_dlio_venv)
    except VenvError as err:
        raise DlioUnavailable(str(err)) from None


def finish_dlio_venv(python: Path) -> None:
    """What a fresh .venv-dlio needs beyond its pins: git leaves it out, DLIO imports, tfrecord2idx is there."""
    (VENV / ".gitignore").write_text("*\n")  # what Python 3.13's venv writes: git then leaves the environment out
    cmd = [str(python), "-c", "import dlio_benchmark.main, tensorflow, mpi4py.MPI"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dlio_env(python))
    if proc.returncode != 0:
        raise DlioUnavailable(f"{VENV} does not import DLIO (exit {proc.returncode}, {' '.join(cmd)}): "
                              f"{(proc.stdout + proc.stderr)[-2000:]}")
    link_tfrecord2idx(python)


def link_tfrecord2idx(python: Path) -> None:
    """Give DLIO DALI's `tfrecord2idx`, which its TFRecord generator runs for every file it writes (the index serves
    only its DALI readers): the suite's environment's copy of the script, run by DLIO's interpreter without
    site-packages, where its `import tensorflow` fails at once and it reads with open() (with TensorFlow it
    imports it first: 4 s a file)."""
    script = Path(sys.executable).parent / "tfrecord2idx"
    if not script.is_file():
        raise DlioUnavailable(f"{script} not found: DLIO's TFRecord generator runs DALI's tfrecord2idx for every "
                              f"file it writes; the suite's environment has it once make setup installed DALI")
    wrapper = python.parent / "tfrecord2idx"
    wrapper.unlink(missing_ok=True)  # replace, never write through, whatever is there
    wrapper.write_text(f'#!/bin/sh\nexec "{python}" -I -S "{script}" "$@"\n')
    wrapper.chmod(0o755)


def dlio_env(python: Path) -> dict:
    """DLIO's environment: ours without the suite's PYTHONPATH, its venv first on PATH (dlio_benchmark,
    tfrecord2idx), no libfabric provider (as the suite's MPI jobs: tests/conftest.py), TensorFlow's log quiet."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PATH": f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
            "FI_PROVIDER": env.get("FI_PROVIDER", "none"), "TF_CPP_MIN_LOG_LEVEL": "2"}


# ---------------------------------------------------------------------------- running DLIO
def run_dlio(python: Path, ranks: int, overrides: Sequence[str], run_dir: Path) -> list[str]:
    """dlio_benchmark on `ranks` local ranks with `overrides`, its outputs and log in `run_dir`; the command.
    Raises DlioUnavailable with the log's tail when it fails."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    cmd = ["mpirun", *MPIRUN, "-np", str(ranks), "-H", f"localhost:{ranks}", "-x", "PATH", "-x", "FI_PROVIDER",
           "-x", "TF_CPP_MIN_LOG_LEVEL", str(python.parent / "dlio_benchmark"), *overrides,
           f"hydra.run.dir={run_dir}", f"++workload.output.folder={run_dir}",
           f"++workload.checkpoint.checkpoint_folder={run_dir / 'checkpoints'}"]
    log = run_dir / "mpirun.log"
    try:
        with open(log, "wb") as out:
            code = subprocess.run(cmd, cwd=run_dir, env=dlio_env(python), stdout=out,
                                  stderr=subprocess.STDOUT).returncode
    except FileNotFoundError as err:
        raise DlioUnavailable(f"cannot start {cmd[0]}: {err.strerror} (DLIO runs under Open MPI's mpirun)") from None
    if code != 0:
        raise DlioUnavailable(f"DLIO's mpirun exit {code} ({' '.join(cmd)}); the end of {log}:\n"
                              f"{log.read_text(errors='replace')[-2500:]}")
    return cmd


def generate_data(python: Path, workload: Workload, folder: Path, work: Path) -> dict:
    """DLIO's own synthetic files for `workload` in `folder`, generated by DLIO (workflow.generate_data=True) unless
    the files of the same dataset section are there already; what they are."""
    wanted, stamp = workload.dataset_overrides(folder), folder / DATA_STAMP
    seconds, generated = 0.0, False
    if not (stamp.is_file() and json.loads(stamp.read_text()) == wanted
            and len(list((folder / "train").glob("*.tfrecord"))) == workload.num_files_train):
        check_dlio_folder(folder)
        shutil.rmtree(folder, ignore_errors=True)
        ranks = max(1, min(os.cpu_count() or 1, workload.num_files_train))
        print(f"DLIO generates {workload.num_files_train} files into {folder} on {ranks} rank(s) ...", flush=True)
        t0 = time.perf_counter()
        run_dlio(python, ranks, [*wanted, "++workload.workflow.generate_data=True", "++workload.workflow.train=False"],
                 work / "dlio/generate")
        seconds, generated = time.perf_counter() - t0, True
        stamp.write_text(json.dumps(wanted))
    files = sorted((folder / "train").glob("*.tfrecord"))
    size = sum(f.stat().st_size for f in files)
    return {"folder": str(folder), "generated_now": generated, "generate_seconds": seconds, "files": len(files),
            "bytes": size, "record_bytes_mean": size / max(1, len(files) * workload.num_samples_per_file)}


def check_dlio_folder(folder: Path) -> None:
    """--dlio-data must be new, empty or made by this script: it is emptied before DLIO generates into it."""
    if folder.is_dir() and any(folder.iterdir()) and not (folder / DATA_STAMP).is_file():
        raise BenchError(f"--dlio-data {folder}: not empty and not made by this script (no {DATA_STAMP}); name an "
                         f"empty or new folder, which DLIO's files will fill")


def parse_dlio_summary(run_dir: Path) -> dict:
    """DLIO's figures of one run from the summary.json rank 0 writes into its output folder: per epoch, the AU
    (mean over ranks, as a fraction) and samples/s (summed over ranks), and what it says of the host and caching."""
    path = run_dir / "summary.json"
    if not path.is_file():
        raise DlioUnavailable(f"{path}: DLIO wrote no summary (see {run_dir / 'mpirun.log'})")
    summary = json.loads(path.read_text())
    metric = summary.get("metric", {})
    missing = [k for k in ("train_au_percentage", "train_throughput_samples_per_second") if k not in metric]
    if missing:
        raise DlioUnavailable(f"{path}: no metric.{' or metric.'.join(missing)} (a run that trained none?)")
    return {"accelerators": summary["num_accelerators"],
            "au_per_epoch": [au / 100 for au in metric["train_au_percentage"]],
            "samples_per_second_per_epoch": list(metric["train_throughput_samples_per_second"]),
            "au_meets_expectation": metric.get("train_au_meet_expectation"),
            "potential_caching": summary.get("potential_caching"),
            "data_size_per_host_gb": summary.get("data_size_per_host_GB")}


def disk_read_bytes(path: Path) -> int | None:
    """Bytes the block device holding `path` has read since boot (its sectors read, 512 bytes each); None where
    `path` is on no block device (tmpfs, overlay, a network file system)."""
    dev = os.stat(path).st_dev
    stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    return int(stat.read_text().split()[2]) * 512 if stat.is_file() else None


def dlio_count(python: Path, workload: Workload, data: dict, ranks: int, epochs: int, evict: str,
               work: Path) -> dict:
    """DLIO's side of one rank count: its runs (one per epoch, or one of all epochs), the data evicted before each.

    Per run, besides DLIO's figures: the share of the data's pages resident after the eviction and after the run,
    and the bytes the data's block device read during the whole run (device-wide, start-up included), also per
    epoch over the data's bytes: at least 1 where every epoch read the data from the device."""
    folder, runs = Path(data["folder"]), []
    plan = [(f"epoch_{e}", 1) for e in range(1, epochs + 1)] if evict == "epoch" else [("epochs", epochs)]
    for name, run_epochs in plan:
        eviction = page_cache.evict(folder / "train")
        before, run_dir = disk_read_bytes(folder), work / f"dlio/ranks_{ranks}/{name}"
        cmd = run_dlio(python, ranks, [*workload.dataset_overrides(folder), *workload.train_overrides(run_epochs)],
                       run_dir)
        read = None if before is None else disk_read_bytes(folder) - before
        resident, pages = page_cache.resident_pages(page_cache.files_under(folder / "train"))
        runs.append({**parse_dlio_summary(run_dir), "epochs": run_epochs,
                     "resident_share_after_eviction": eviction["resident_share"],
                     "resident_share_after_run": resident / pages if pages else 0.0,
                     "disk_read_bytes": read,
                     "disk_read_over_data_per_epoch": None if read is None else read / run_epochs / data["bytes"],
                     "command": cmd})
    return dlio_row(runs, ranks, workload)


def dlio_row(runs: list[dict], ranks: int, workload: Workload) -> dict:
    """One count's DLIO figures over all its runs' epochs: mean AU, mean samples/s, and AU x accelerators x rate."""
    au = [a for r in runs for a in r["au_per_epoch"]]
    throughput = [s for r in runs for s in r["samples_per_second_per_epoch"]]
    mean_au = statistics.fmean(au)
    return {"ranks": ranks, "au": mean_au, "au_per_epoch": au,
            "samples_per_second": statistics.fmean(throughput), "samples_per_second_per_epoch": throughput,
            "samples_per_second_from_au": mean_au * ranks * workload.batch_size / workload.computation_time,
            "runs": runs}


# ---------------------------------------------------------------------------- the suite's side
def suite_count(args: argparse.Namespace, ranks: int, work: Path) -> dict:
    """The suite's side of one rank count: its storage sweep at that count; the sweep's row, with the loader the
    run used, or the error."""
    out = work / "suite"
    (out / "storage.json").unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "common.campaign", "storage", "--bench", APP, "--accelerator", args.accelerator,
           "--data", str(args.data), "--ranks", str(ranks), "--epochs", str(args.epochs), "--out", str(out),
           "--config", str(args.config), *args.overrides]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
           "FI_PROVIDER": os.environ.get("FI_PROVIDER", "none"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    result = out / "storage.json"
    if proc.returncode not in (0, 1) or not result.is_file():  # 1: ran, AU below the threshold
        return {"ranks": ranks, "error": f"exit {proc.returncode} ({' '.join(cmd)}): "
                                         f"{(proc.stdout + proc.stderr)[-2000:]}"}
    row = json.loads(result.read_text())["counts"][0]
    summary = Path(row["run"]) / "summary.json"
    loader = json.loads(summary.read_text()).get("loader") if summary.is_file() else None
    return {**row, "loader": loader, "command": cmd}


# ---------------------------------------------------------------------------- the run
def prepare_dlio(args: argparse.Namespace, workload: Workload, work: Path) -> tuple[Path | None, dict]:
    """DLIO's interpreter and its generated data, or None and the reason DLIO cannot run here."""
    try:
        python = dlio_python()
        return python, generate_data(python, workload, Path(args.dlio_data), work)
    except DlioUnavailable as err:
        print(f"DLIO cannot run here: {err}", flush=True)
        return None, {"error": str(err)}


def measure_count(args: argparse.Namespace, index: int, ranks: int, python: Path | None, workload: Workload,
                  data: dict, work: Path) -> dict:
    """Both sides at `ranks`, the suite first at even positions in the sweep and DLIO first at odd ones."""
    def dlio() -> dict:
        if python is None:
            return {"ranks": ranks, "error": data["error"]}
        try:
            return dlio_count(python, workload, data, ranks, args.epochs, args.dlio_evict, work)
        except DlioUnavailable as err:
            return {"ranks": ranks, "error": str(err)}
    sides = {"suite": lambda: suite_count(args, ranks, work), "dlio": dlio}
    order = ["suite", "dlio"] if index % 2 == 0 else ["dlio", "suite"]
    done = {}
    for side in order:
        print(f"{ranks} rank(s): {side} ...", flush=True)
        load = os.getloadavg()[0]  # another job on the host shows here: the figures are then not this storage's
        done[side] = {**sides[side](), "load_average_1min": [load, os.getloadavg()[0]]}
        print(f"  {side_line(done[side])}", flush=True)
    return {"ranks": ranks, "order": order, "suite": done["suite"], "dlio": done["dlio"]}


def side_line(row: dict) -> str:
    """One side's figures at one count, or its error's first line."""
    load = "load average {:.1f} before, {:.1f} after".format(*row["load_average_1min"])
    if "error" in row:
        return f"failed: {row['error'].splitlines()[0]} ({load})"
    return f"AU {figure(row, 'au', '.1%')}, {figure(row, 'samples_per_second', '.1f')} samples/s ({load})"


def figure(row: dict, key: str, fmt: str) -> str:
    """`row[key]` in `fmt`; "failed" where the side failed, "n/a" where it measured no step."""
    if "error" in row:
        return "failed"
    return "n/a" if row.get(key) is None else format(row[key], fmt)


def table(result: dict) -> str:
    """What a run prints: its rows of the docs' table, the settings both sides ran with, and any side's error."""
    w = result["workload"]
    settings = (f"\n{w['record_length']} +- {w['record_length_stdev']} bytes a record, computation_time "
                f"{w['computation_time']} s a batch, {w['read_threads']} read threads. Samples/s: the suite's are AU x "
                f"accelerators x rate (each epoch's first step left out; DLIO's own figure of that kind is "
                f"`samples_per_second_from_au` in the JSON); DLIO's count every step over each epoch's wall time. DLIO "
                f"page cache: {result['dlio_page_cache']}.")
    errors = [f"{side} at {r['ranks']} rank(s): {r[side]['error']}" for r in result["counts"]
              for side in ("suite", "dlio") if "error" in r[side]]
    return "\n".join([doc_table([result]), settings] + [f"\n{e}" for e in errors])


def doc_table(results: list[dict]) -> str:
    """docs/performance.md's table: each accelerator's latest run, a row per rank count with both sides' AU,
    samples/s and verdict, and the largest count each side feeds; a caption per run."""
    rows = ["| emulated | ranks | suite AU | suite samples/s | suite MB/s | DLIO AU | DLIO samples/s | passes (70%): "
            "suite, DLIO |", "|---|---|---|---|---|---|---|---|"]
    captions = []
    for result in results:
        name = f"{result['accelerator']} ({1 / result['seconds_per_sample']:.1f}/s)"
        for r in result["counts"]:
            s, d = r["suite"], r["dlio"]
            rows.append(f"| {name} | {r['ranks']} | {figure(s, 'au', '.3f')} "
                        f"| {figure(s, 'samples_per_second', '.1f')} | {figure(s, 'storage_mb_per_second', '.1f')} "
                        f"| {figure(d, 'au', '.3f')} "
                        f"| {figure(d, 'samples_per_second', '.1f')} | {verdict(s)}, {verdict(d)} |")
        w = result["workload"]
        captions.append(f"{result['accelerator']}: largest passing count: suite {largest(result, 'suite')}, DLIO "
                        f"{largest(result, 'dlio')}. {w['num_files_train']} files x {w['num_samples_per_file']} "
                        f"samples ({result['suite_train_samples']} an epoch), batch {w['batch_size']}, "
                        f"{result['epochs']} epochs, evicted before each. {measured_on(result)}")
    return "\n".join(rows + [f"\n{c}" for c in captions])


def verdict(row: dict) -> str:
    return "failed" if "error" in row else "n/a" if row.get("au") is None else (
        "yes" if row["au"] >= AU_THRESHOLD[APP] else "no")


def largest(result: dict, side: str) -> int:
    """The most ranks at which `side` passed (0: none)."""
    return max((r["ranks"] for r in result["counts"] if verdict(r[side]) == "yes"), default=0)


def recorded_results() -> list[dict]:
    return [json.loads(results_path(a).read_text()) for a in sorted(WORKLOADS, reverse=True)
            if results_path(a).is_file()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="the suite's CosmoFlow dataset (its manifest.json)")
    p.add_argument("--accelerator", choices=sorted(WORKLOADS), default="h100")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4], help="rank counts (default %(default)s)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per count and side (default %(default)s)")
    p.add_argument("--config", type=Path,
                   help="the suite's config (default: the sweep's, cosmoflow/configs/cosmo.yaml)")
    p.add_argument("--work", type=Path, default=REPO / "runs/storage_dlio", help="runs and logs (default %(default)s)")
    p.add_argument("--dlio-data", type=Path, help="where DLIO generates its files (default: DATA-dlio, beside DATA: "
                                                  "the same storage)")
    p.add_argument("--dlio-evict", choices=("epoch", "run"), default="epoch",
                   help="evict DLIO's data before each epoch (one DLIO run per epoch) or once per run of all epochs")
    p.add_argument("--setup-only", action="store_true", help="build DLIO's environment and exit")
    p.add_argument("overrides", nargs="*",
                   help="the suite's config overrides (key=value), e.g. train.local_batch_size=8")
    args = p.parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o or o.startswith("-")]
    if bad or args.epochs < 1 or any(n < 1 for n in args.ranks):
        p.error(f"--ranks {args.ranks} --epochs {args.epochs} overrides {bad}: expected counts >= 1 and key=value")
    args.ranks = sorted(set(args.ranks))
    args.data, args.work = args.data.resolve(), args.work.resolve()  # the sweep runs in the checkout
    args.config = (args.config or REPO / CONFIGS[APP]).resolve()
    args.dlio_data = (args.dlio_data or args.data.with_name(f"{args.data.name}-dlio")).resolve()
    return args


def fitted_workload(args: argparse.Namespace) -> tuple[Workload, int]:
    """DLIO's workload for --data under the suite's config, and the suite's training samples; exits with the facts
    on bad input."""
    try:
        manifest = load_manifest(args.data)
        train = manifest.splits["train"].files
        batch, threads, prefetch = suite_settings(args.config, args.overrides)
        workload = fit_workload(train, record_sizes(manifest.root, train), args.accelerator, batch, threads, prefetch)
        check_dlio_folder(args.dlio_data)
    except BenchError as err:
        raise SystemExit(str(err)) from None
    return workload, sum(f.records for f in train)


def run_facts(args: argparse.Namespace, workload: Workload, train_samples: int) -> dict:
    """The results file's head: the machine (harness.run_header), the accelerator, both sides' settings."""
    when = "every epoch (one DLIO run per epoch)" if args.dlio_evict == "epoch" else "each run of all epochs"
    return {**run_header(sgemm_gflops()), "accelerator": args.accelerator,
            "seconds_per_sample": workload.computation_time / workload.batch_size, "epochs": args.epochs,
            "data": str(args.data), "suite_config": str(args.config), "overrides": args.overrides,
            "suite_train_samples": train_samples, "workload": dataclasses.asdict(workload),
            "dlio": next(p for p in pins() if p.startswith("dlio_benchmark==")), "dlio_evict": args.dlio_evict,
            "dlio_page_cache": f"none of its own (it warns when the data fits in memory); evicted here before {when}, "
                               f"{page_cache.METHOD}", "ranks_planned": args.ranks, "counts": []}


def main() -> None:
    args = parse_args()
    if args.setup_only:
        print(dlio_python())
        return
    workload, train_samples = fitted_workload(args)
    check_marked_section(DOC, BEGIN, END)
    print("sgemm ...", flush=True)
    result = run_facts(args, workload, train_samples)
    python, result["dlio_data"] = prepare_dlio(args, workload, args.work)
    results = results_path(args.accelerator)
    for index, ranks in enumerate(args.ranks):
        result["counts"].append(measure_count(args, index, ranks, python, workload, result["dlio_data"], args.work))
        write_json_atomic(results, result)  # after every count: a killed run keeps the counts it finished
    print(table(result))
    replace_marked_section(DOC, BEGIN, END, doc_table(recorded_results()))
    print(f"wrote {results} and the table in {DOC}")


def results_path(accelerator: str) -> Path:
    return RESULTS_DIR / f"storage_dlio_{accelerator}.json"


if __name__ == "__main__":
    main()
