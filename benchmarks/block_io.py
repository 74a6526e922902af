"""Bytes read and decode rate of one rank of a CosmoFlow spatial group: whole records against per-block records.

    python benchmarks/block_io.py --data DIR [--spatial 2x1 2x2 4x1] [--loaders tfdata dali] [--batch 8]
        [--batches 64] [--warmup 8]

For each partitioning, the per-block records are written first when DIR lacks them (`python -m data_prep
cosmo-blocks`, timed). Then one process per case, pinned to one core with data.read_threads=1, builds the
training input with cosmoflow.data.build_datasets exactly as a rank of a spatial group does (task 0's block;
every task's block has the same size) and pulls --warmup batches, then times --batches more. Cases:

    data     the whole sample (a data-parallel rank)
    whole    the block cut from the whole records (data.blocks=whole)
    records  the block's own records (data.blocks=records)

Each case runs with each loader and records samples per second, the mean record size the manifest gives for
the files it reads, and the bytes its process read (/proc/self/io rchar, page cache included) per sample over
the timed batches. DALI maps the files into memory (mmap), which rchar does not count: its rchar is left out
of the table, and tf.data's (read calls) is the measured figure. The records are read once before each measurement, so they come
from the page cache, as staged data does. Writes benchmarks/results/block_io.json and the table between the
markers in docs/mesh.md, both with this invocation's runs only.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# Run as a script, so benchmarks/ is on sys.path.
from harness import (REPO, RESULTS_DIR, check_marked_section, measured_note, replace_marked_section, run_header,
                     sgemm_gflops, write_json_atomic)

from common.base.version import code_version

DOC = REPO / "docs/mesh.md"  # its tables live beside what they measure
RESULTS = RESULTS_DIR / "block_io.json"
BEGIN, END = "<!-- block-io:begin -->", "<!-- block-io:end -->"
CONFIG = REPO / "cosmoflow/configs/cosmo_mini.yaml"
CODE_PATHS = ("common", "cosmoflow", "data_prep", "benchmarks/block_io.py")  # what the measured pipelines run


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a cosmoflow-tfrecord dataset (e.g. the demo's mini one)")
    p.add_argument("--spatial", nargs="+", default=["2x1", "2x2", "4x1"], help="partitionings DxH")
    p.add_argument("--loaders", nargs="+", choices=["tfdata", "dali"], default=["tfdata", "dali"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--batches", type=int, default=64)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--worker", nargs=3, metavar=("SPATIAL", "MODE", "LOADER"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args, *args.worker)
    check_marked_section(DOC, BEGIN, END)
    result = run_header(sgemm_gflops()) | {
        "code": code_version(CODE_PATHS), "data": str(args.data), "loaders": args.loaders, "batch": args.batch,
        "batches": args.batches, "blocks_written": [], "cases": []}
    for spatial in args.spatial:
        result["blocks_written"] += ensure_blocks(args.data, spatial)
    for spatial, mode in [("1x1", "data")] + [(s, m) for s in args.spatial for m in ("whole", "records")]:
        result["cases"].append({loader: measure(args, spatial, mode, loader) for loader in args.loaders})
    write_json_atomic(RESULTS, result)
    replace_marked_section(DOC, BEGIN, END, table(result))
    print(table(result))
    return 0


def ensure_blocks(data: Path, spatial: str) -> list[dict]:
    """Write DIR's blocks for `spatial` with data_prep cosmo-blocks unless they are there; what it took."""
    if (data / f"blocks_{spatial}").is_dir():
        return []
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "data_prep", "cosmo-blocks", "--data", str(data), "--spatial", spatial],
                   cwd=REPO, check=True)
    return [{"spatial": spatial, "seconds": time.perf_counter() - t0}]


def measure(args: argparse.Namespace, spatial: str, mode: str, loader: str) -> dict:
    """One case in a fresh process (its own read counters), after the files it reads sit in the page cache."""
    warm_cache(args.data if mode != "records" else args.data / f"blocks_{spatial}" / "0_0")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--data", str(args.data), "--batch", str(args.batch),
           "--batches", str(args.batches), "--warmup", str(args.warmup), "--worker", spatial, mode, loader]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"})
    if proc.returncode != 0:
        raise SystemExit(f"block_io worker {spatial} {mode} {loader} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    case = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{spatial} {mode} {loader}: {case['record_bytes'] / 1e3:.1f} kB/record, rchar "
          f"{case['bytes_per_sample'] / 1e3:.1f} kB/sample, {case['samples_per_second']:.0f} samples/s", flush=True)
    return case


def warm_cache(root: Path) -> None:
    for path in sorted(root.glob("*/*.tfrecord")):
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass


def worker(args: argparse.Namespace, spatial_text: str, mode: str, loader: str) -> int:
    os.sched_setaffinity(0, {0})  # one core, before TensorFlow starts its threads
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from common.runtime.monitor import read_proc_io
    from common.runtime.config import load_config
    from common.runtime.dist import DistEnv
    from cosmoflow.config import CosmoConfig
    from cosmoflow.data import build_datasets
    from cosmoflow.mesh.groups import sample_block
    from common.io.manifest import load_manifest
    spatial = tuple(int(p) for p in spatial_text.split("x"))
    blocks = "whole" if mode in ("data", "whole") else "records"
    shape = ",".join(map(str, load_manifest(args.data).sample_shape))  # the dataset's samples, whatever their size
    cfg = load_config(str(CONFIG), [f"data.dir={args.data}", f"data.loader={loader}", "data.read_threads=1",
                                    f"data.blocks={blocks}", f"parallel.spatial=[{spatial[0]},{spatial[1]}]",
                                    f"model.input_shape=[{shape}]", "model.conv_filters=[4]"],  # no model is built
                      CosmoConfig)
    block = None if mode == "data" else sample_block(cfg.model.input_shape, spatial, 0)
    data = build_datasets(cfg.data, cfg.model.input_shape, args.batch, DistEnv(), 0, block=block)
    batches = iter(data.train)
    for _ in range(args.warmup):
        next(batches)
    before, t0 = read_proc_io(), time.perf_counter()
    for _ in range(args.batches):
        x, _y = next(batches)
    seconds, after = time.perf_counter() - t0, read_proc_io()
    samples = args.batches * args.batch
    print(json.dumps({"spatial": spatial_text, "mode": mode, "loader": loader, "block_shape": list(x.shape[1:]),
                      "block_records": data.block_records, "decoded_fraction": data.decoded_fraction,
                      "bytes_per_sample": (after["rchar"] - before["rchar"]) / samples,
                      "record_bytes": data.record_bytes, "seconds": seconds, "samples_per_second": samples / seconds}))
    return 0


def table(result: dict) -> str:
    """Rows per case; bytes from tf.data's read calls and the manifests, rates of every loader measured."""
    loaders = result["loaders"]
    first = result["cases"][0]
    base = {loader: first[loader] for loader in loaders}
    header = ("| layout | reads | sample handed on | record kB per sample | of the whole's | tf.data rchar kB per sample | "
              + " | ".join(f"{loader} samples/s (1 core)" for loader in loaders) + " |")
    rows = [header, "|" + "---|" * (6 + len(loaders))]
    names = {"data": "whole records, whole sample", "whole": "whole records, block cut",
             "records": "the block's own records"}
    for case in result["cases"]:
        any_run = case[loaders[0]]
        rchar = f"{case['tfdata']['bytes_per_sample'] / 1e3:,.1f}" if "tfdata" in case else ""
        rates = " | ".join(f"{case[loader]['samples_per_second']:,.0f} "
                           f"({case[loader]['samples_per_second'] / base[loader]['samples_per_second']:.2f}x)"
                           for loader in loaders)
        rows.append(f"| {'data' if any_run['mode'] == 'data' else any_run['spatial']} | {names[any_run['mode']]} | "
                    f"{' x '.join(map(str, any_run['block_shape']))} | {any_run['record_bytes'] / 1e3:,.1f} | "
                    f"{any_run['record_bytes'] / base[loaders[0]]['record_bytes']:.2f} | {rchar} | {rates} |")
    written = "; ".join(f"{w['spatial']} {w['seconds']:.0f} s" for w in result["blocks_written"])
    notes = [f"\nData: {result['data']} (batch {result['batch']}, {result['batches']} timed batches after the warm-up, "
             f"from the page cache; task 0's block). Rates in brackets: against the whole sample's with that loader.",
             f"Per-block records written by this run (`data_prep cosmo-blocks`, 2 workers): {written}." if written else
             "Per-block records were already there (written by an earlier run).",
             measured_note(result).strip()]
    return "\n".join(rows) + "\n" + "\n".join(notes)


if __name__ == "__main__":
    sys.exit(main())
