"""Bytes read and decode rate of one rank of a CosmoFlow spatial group: whole records against per-block records.

    python benchmarks/block_io.py --data DIR [--spatial 2x1 2x2 4x1] [--loader dali] [--batch 8]
        [--batches 64] [--warmup 8]

For each partitioning, the per-block records are written first when DIR lacks them (`python -m data_prep
cosmo-blocks`, timed). Then one process per case, pinned to one core with data.read_threads=1, builds the
training input with cosmoflow.data.build_datasets exactly as a rank of a spatial group does (task 0's block;
every task's block has the same size) and pulls --warmup batches, then times --batches more. Cases:

    data     the whole sample (a data-parallel rank)
    whole    the block cut from the whole records (data.blocks=whole)
    records  the block's own records (data.blocks=records)

Each case records the bytes its process read (/proc/self/io rchar, page cache included) per sample over the
timed batches, and samples per second. The records are read once before each measurement, so they come
from the page cache, as staged data does. Writes benchmarks/results/block_io.json and the table between the
markers in docs/performance.md, both with this invocation's runs only.
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
from harness import (DOC, REPO, RESULTS_DIR, check_marked_section, measured_note, replace_marked_section, run_header,
                     sgemm_gflops, write_json_atomic)

from common.base.version import code_version

RESULTS = RESULTS_DIR / "block_io.json"
BEGIN, END = "<!-- block-io:begin -->", "<!-- block-io:end -->"
CONFIG = REPO / "cosmoflow/configs/cosmo_mini.yaml"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a cosmoflow-tfrecord dataset (e.g. the demo's mini one)")
    p.add_argument("--spatial", nargs="+", default=["2x1", "2x2", "4x1"], help="partitionings DxH")
    p.add_argument("--loader", choices=["tfdata", "dali"], default="dali")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--batches", type=int, default=64)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--worker", nargs=2, metavar=("SPATIAL", "MODE"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args, *args.worker)
    check_marked_section(DOC, BEGIN, END)
    result = run_header(sgemm_gflops()) | {
        "code": code_version(REPO), "data": str(args.data), "loader": args.loader, "batch": args.batch,
        "batches": args.batches, "blocks_written": [], "cases": []}
    result["cases"].append(measure(args, "1x1", "data"))
    for spatial in args.spatial:
        result["blocks_written"] += ensure_blocks(args.data, spatial)
        for mode in ("whole", "records"):
            result["cases"].append(measure(args, spatial, mode))
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


def measure(args: argparse.Namespace, spatial: str, mode: str) -> dict:
    """One case in a fresh process (its own read counters), after the files it reads sit in the page cache."""
    warm_cache(args.data if mode != "records" else args.data / f"blocks_{spatial}" / "0_0")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--data", str(args.data), "--loader", args.loader,
           "--batch", str(args.batch), "--batches", str(args.batches), "--warmup", str(args.warmup),
           "--worker", spatial, mode]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"})
    if proc.returncode != 0:
        raise SystemExit(f"block_io worker {spatial} {mode} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    case = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{spatial} {mode}: {case['bytes_per_sample'] / 1e3:.1f} kB/sample, {case['samples_per_second']:.0f} "
          f"samples/s", flush=True)
    return case


def warm_cache(root: Path) -> None:
    for path in sorted(root.glob("*/*.tfrecord")):
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass


def worker(args: argparse.Namespace, spatial_text: str, mode: str) -> int:
    os.sched_setaffinity(0, {0})  # one core, before TensorFlow starts its threads
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from common.io.iostats import read_proc_io
    from common.runtime.config import load_config
    from common.runtime.dist import DistEnv
    from cosmoflow.config import CosmoConfig
    from cosmoflow.data import build_datasets
    from cosmoflow.mesh.groups import sample_block
    from common.io.manifest import load_manifest
    spatial = tuple(int(p) for p in spatial_text.split("x"))
    blocks = "whole" if mode in ("data", "whole") else "records"
    shape = ",".join(map(str, load_manifest(args.data).sample_shape))  # the dataset's samples, whatever their size
    cfg = load_config(str(CONFIG), [f"data.dir={args.data}", f"data.loader={args.loader}", "data.read_threads=1",
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
    print(json.dumps({"spatial": spatial_text, "mode": mode, "block_shape": list(x.shape[1:]),
                      "block_records": data.block_records, "decoded_fraction": data.decoded_fraction,
                      "bytes_per_sample": (after["rchar"] - before["rchar"]) / samples,
                      "record_bytes": data.record_bytes, "seconds": seconds, "samples_per_second": samples / seconds}))
    return 0


def table(result: dict) -> str:
    data = next(c for c in result["cases"] if c["mode"] == "data")
    rows = ["| layout | reads | sample handed on | bytes read per sample | of the whole sample's | samples/s (1 core) "
            "| against the whole sample's |", "|---|---|---|---|---|---|---|"]
    names = {"data": "whole records, whole sample", "whole": "whole records, block cut",
             "records": "the block's own records"}
    for c in result["cases"]:
        rows.append(f"| {'data' if c['mode'] == 'data' else c['spatial']} | {names[c['mode']]} | "
                    f"{' x '.join(map(str, c['block_shape']))} | {c['bytes_per_sample'] / 1e3:,.1f} kB | "
                    f"{c['bytes_per_sample'] / data['bytes_per_sample']:.2f} | {c['samples_per_second']:,.0f} | "
                    f"{c['samples_per_second'] / data['samples_per_second']:.2f}x |")
    written = "; ".join(f"{w['spatial']} {w['seconds']:.0f} s" for w in result["blocks_written"])
    notes = [f"\nData: {result['data']} ({result['loader']}, batch {result['batch']}, {result['batches']} timed "
             f"batches after the warm-up, from the page cache; task 0's block).",
             f"Per-block records written by this run: {written}." if written else
             "Per-block records were already there (written by an earlier run).",
             measured_note(result).strip() + f" Code {result['code']}."]
    return "\n".join(rows) + "\n" + "\n".join(notes)


if __name__ == "__main__":
    sys.exit(main())
