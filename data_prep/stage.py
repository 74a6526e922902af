"""Stage a dataset (plain or packed) to local storage, verifying every file, and report the rate.

Copies a converted dataset directory, or unpacks a packed one (`python -m data_prep pack`), into
STAGE_DIR/<format>-<manifest digest>/node/, the directory `data.stage_mode=node` training would
stage into, and prints that directory, the bytes, the time and GB/s. Use it to stage ahead of a job
(the MLPerf HPC v3.0 rules allow staging outside the timed run) or to time staging on its own;
training configs with data.stage_dir stage inside the run themselves. With --decompress (the
config's data.stage_decompress), record files without a DALI index, such as the GZIP files of
the official CosmoFlow release indexed by `python -m data_prep index`, are written uncompressed with
DALI index files, into STAGE_DIR/<format>-<manifest digest>-uncompressed/node/. With --reuse, files an
earlier staging left there are kept once proven equal to the source (unchanged since a staging checked them,
or hashed again); the line printed says how many were written, re-hashed, vouched for and staged again, and by
which checksum. See docs/staging.md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from common.io.staging import Layout, StageResult, open_source, plan, stage
from data_prep import tfrecords


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, type=Path, metavar="DIR",
                        help="a converted dataset (manifest.json) or a packed one (pack.json)")
    parser.add_argument("--stage-dir", required=True, type=Path, metavar="DIR",
                        help="local directory to stage into, e.g. /tmp or /dev/shm")
    parser.add_argument("--threads", type=tfrecords.positive_int, default=tfrecords.available_cpus(), metavar="T",
                        help="files or archives copied in parallel (default: CPUs available, %(default)s)")
    parser.add_argument("--reuse", action="store_true",
                        help="keep files an earlier staging left, once proven equal to the source (unchanged since "
                             "it checked them, or hashed again); stage the rest (default: start afresh)")
    parser.add_argument("--decompress", action="store_true",
                        help="write record files that have no DALI index (GZIP ones) uncompressed with one, so that "
                             "DALI can read the copy (data.stage_decompress)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def checksum_names(kinds: str) -> str:
    """'xxh3_128+sha256' as the run reports it -> 'xxh3-128 or sha256' for people."""
    return " or ".join(k.replace("xxh3_128", "xxh3-128") for k in kinds.split("+") if k) or "(no file written)"


def run(args: argparse.Namespace) -> int:
    source = open_source(args.input)
    the_plan = plan(source, "node", Layout(), rank_files=lambda *_: (), decompress=args.decompress)
    result = stage(source, the_plan, args.stage_dir, threads=args.threads, reuse=args.reuse, progress=True)
    figures = result.figures()
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    compressed = figures["compression_ratio"] not in (None, 1)
    ratio = f", compression ratio {figures['compression_ratio']:.2f}" if compressed else ""
    print(f"staged {result.files} files ({result.bytes_written / 1e9:.3f} GB written, {result.bytes_read / 1e9:.3f} GB "
          f"read{ratio}; {result.files_reused} reused) from {source.kind} {source.root} into {result.dir} in "
          f"{result.seconds:.2f} s: {figures['write_gb_per_second']:.2f} GB/s on {result.threads} threads; "
          f"{checks(result)}", flush=True)
    return 0


def checks(result: StageResult) -> str:
    """What staging checked, in words: the files it wrote, the ones it reused, the ones it staged again."""
    said = [f"every file written checked by its {checksum_names(result.checksum)}" if result.files else
            "no file written"]
    if result.files_reused:
        vouched = result.files_reused - result.files_rechecked
        said.append(f"of the {result.files_reused} reused, {result.files_rechecked} re-hashed and matched their "
                    f"checksums and {vouched} unchanged since a staging checked them (size, times and inode as "
                    f"its stamp records)")
    if result.files_recopied:
        said.append(f"{result.files_recopied} found changed or unproven and staged again")
    return "; ".join(said)
