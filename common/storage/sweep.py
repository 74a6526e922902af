"""Can this storage feed N accelerators? Emulated epochs at growing rank counts (issue 50).

    python -m common.campaign storage --bench cosmoflow --accelerator h100 --data DIR --ranks 1 2 4 8 \\
        [--epochs 3] [--config CONFIG] [--out storage/cosmo-h100] [--au-threshold 0.7] [--stage-dir DIR] \\
        [--launcher TEMPLATE] [config overrides ...]

For each rank count, one emulated run (train.emulate, common/storage/emulate.py) of `--epochs` epochs reads DIR
through the benchmark's real input path, each rank standing for one accelerator, with the dataset evicted from
the page cache before every epoch. Each run writes OUT/ranks_<n>/ (config.yaml, mlperf.log, summary.json,
train.log); OUT/storage.json gathers, per count, the accelerator utilisation (AU, overall and the lowest
rank's), the samples/s the input delivered, the storage MB/s, the input wait per step and whether AU passes
the threshold (MLPerf Storage's 70% for CosmoFlow; DeepCAM has none there: give --au-threshold), and names the
largest count that passes. The config is the benchmark's full-size one unless --config names another; its
model.input_shape is set to the dataset's sample shape (an emulated run builds no model, but decodes samples of
that shape).
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from common.base.errors import BenchError
from common.base.files import write_json_atomic
from common.base.host import cpu_flags, cpu_model
from common.base.version import code_version
from common.campaign.spec import DEFAULT_LAUNCHER
from common.storage.accelerators import AU_THRESHOLD, RATES

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {"cosmoflow": "cosmoflow/configs/cosmo.yaml", "deepcam": "deepcam/configs/deepcam.yaml"}
RESULT = "storage.json"
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bench", required=True, choices=sorted(CONFIGS))
    parser.add_argument("--accelerator", required=True, choices=[*RATES, "custom"])
    parser.add_argument("--samples-per-second", type=float, default=0.0,
                        help="per accelerator, with --accelerator custom")
    parser.add_argument("--data", required=True, help="the dataset (its manifest.json), where the runs read it")
    parser.add_argument("--ranks", type=int, nargs="+", required=True, help="rank counts, each one emulated run")
    parser.add_argument("--epochs", type=int, default=3, help="emulated epochs per run (default %(default)s)")
    parser.add_argument("--config", default="", help="the benchmark's config (default: its full-size one)")
    parser.add_argument("--out", default="", help="where the runs and storage.json go (default: "
                                                  "storage/<bench>-<accelerator>)")
    parser.add_argument("--au-threshold", type=float, default=0.0,
                        help="the AU a count must reach to pass (default: MLPerf Storage's, 0.7 for CosmoFlow)")
    parser.add_argument("--stage-dir", default="", help="node-local directory each run stages DIR into first")
    parser.add_argument("--launcher", default=DEFAULT_LAUNCHER,
                        help="how a run is launched; {np} and {python} are filled in (default: %(default)s)")


def storage_command(args: argparse.Namespace, overrides: list[str]) -> int:
    """Run the sweep; 0 when at least one count passes, 1 when none does."""
    threshold = check_args(args)
    out = Path(args.out or f"storage/{args.bench}-{args.accelerator}")
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for ranks in sorted(set(args.ranks)):
        rows.append(run_count(args, overrides, out, ranks, threshold))
        print(row_line(rows[-1]), flush=True)
        write_json_atomic(result(args, threshold, rows), out / RESULT)
    best = largest_passing(rows)
    tried = " ".join(str(r["ranks"]) for r in rows)
    feeds = f"this storage and these hosts feed {best} emulated {args.accelerator} (of {tried} ranks tried)" if best \
        else f"none of the rank counts tried ({tried}) reached an AU of {threshold:.0%}"
    print(f"{feeds} ({args.bench}; {out / RESULT})", flush=True)
    return 0 if best else 1


def check_args(args: argparse.Namespace) -> float:
    """The AU threshold, after checking what the command line gives (the dataset's manifest read last, once: its
    sample shape kept in `args.sample_shape` for every run)."""
    from common.io.manifest import load_manifest
    if any(n < 1 for n in args.ranks) or args.epochs < 1:
        raise BenchError(f"--ranks {args.ranks} --epochs {args.epochs}: expected counts >= 1")
    if (args.accelerator == "custom") != (args.samples_per_second > 0):
        raise BenchError(f"--samples-per-second {args.samples_per_second}: expected > 0 with --accelerator custom "
                         f"and only then (given --accelerator {args.accelerator})")
    threshold = args.au_threshold or AU_THRESHOLD.get(args.bench, 0.0)
    if not 0 < threshold <= 1:
        raise BenchError(f"--au-threshold {args.au_threshold}: MLPerf Storage has no AU mark for {args.bench}; "
                         f"give one in (0, 1]")
    if not (Path(args.data) / "manifest.json").is_file():
        raise BenchError(f"--data {args.data}: no manifest.json there (a dataset made by data_prep convert or "
                         f"index)")
    args.sample_shape = list(load_manifest(args.data).sample_shape)  # refused now, before anything is written
    return threshold


def run_count(args: argparse.Namespace, overrides: list[str], out: Path, ranks: int, threshold: float) -> dict:
    """One emulated run on `ranks` ranks; its row of the sweep."""
    run_dir = out / f"ranks_{ranks}"
    command = [*shlex.split(args.launcher.format(np=ranks, python=Path(sys.executable).parent)), sys.executable,
               str(REPO / args.bench / "train.py"), args.config or str(REPO / CONFIGS[args.bench]),
               *run_overrides(args, run_dir, ranks), *overrides]
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"{ranks} rank(s): {shlex.join(command)}", flush=True)
    t0 = time.time()
    with open(run_dir / "train.log", "wb") as log:
        code = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    row = {"ranks": ranks, "exit_code": code, "wall_seconds": time.time() - t0, "run": str(run_dir)}
    summary = run_dir / "summary.json"
    emulation = json.loads(summary.read_text()).get("emulation") if summary.is_file() else None
    if code not in (0, 1) or not emulation:
        return row | {"passes": False, "error": f"exit {code}; see {run_dir / 'train.log'}"}
    keys = ("au", "au_min", "samples_per_second", "storage_mb_per_second", "input_wait_per_step_seconds",
            "page_cache")
    return row | {k: emulation[k] for k in keys} | {"passes": emulation["au"] is not None
                                                     and emulation["au"] >= threshold}


def run_overrides(args: argparse.Namespace, run_dir: Path, ranks: int) -> list[str]:
    """The emulated run's config: the accelerator, the dataset, its sample shape and counts, the epochs."""
    found = [f"train.emulate.accelerator={args.accelerator}", f"data.dir={args.data}",
             f"model.input_shape={json.dumps(args.sample_shape).replace(' ', '')}", f"train.max_epochs={args.epochs}",
             f"run.output_dir={run_dir}", "tensorboard.enabled=false",
             "data.train_samples=0", "data.val_samples=0"]  # the dataset's own counts
    if args.samples_per_second:
        found.append(f"train.emulate.samples_per_second={args.samples_per_second}")
    if args.stage_dir:
        found.append(f"data.stage_dir={Path(args.stage_dir) / f'ranks_{ranks}'}")
    return found


def largest_passing(rows: list[dict]) -> int:
    return max((r["ranks"] for r in rows if r["passes"]), default=0)


def row_line(row: dict) -> str:
    if "error" in row:
        return f"  {row['ranks']:4d} ranks: failed, {row['error']}"
    return (f"  {row['ranks']:4d} ranks: AU {row['au']:.1%} (lowest rank {row['au_min']:.1%}), "
            f"{row['samples_per_second']:.1f} samples/s, {row['storage_mb_per_second'] or 0:.1f} MB/s from storage, "
            f"input wait {row['input_wait_per_step_seconds'] * 1e3:.1f} ms/step: "
            f"{'passes' if row['passes'] else 'fails'}")


def result(args: argparse.Namespace, threshold: float, rows: list[dict]) -> dict:
    flags = cpu_flags()
    return {"date": time.strftime("%Y-%m-%d"), "host": {"cpu": cpu_model(),
                                                       "isa_flags": [f for f in ISA_FLAGS if f in flags]},
            "code": code_version(), "benchmark": args.bench, "accelerator": args.accelerator, "data": str(args.data),
            "epochs": args.epochs, "au_threshold": threshold, "counts": rows,
            "largest_passing": largest_passing(rows)}
