"""Write CosmoFlow universes in the layout of the official release: GZIP TFRecords, one sample per file.

Our own writer of fixtures for `python -m data_prep index` (tests, benchmarks, trying the commands of
docs/datasets.md without downloading 1.7 TB). It cuts HDF5 universes (cosmo-synth's, or real ones) into
sub-cubes and writes them as the reference's prepare.py wrote the published cosmoUniverse_2019_05_4parE_tf_v2:

  OUT/train/<parent>_<universe>_<iii>.tfrecord   sub-cube iii of a universe (C order over the grid of cubes,
                                                  first axis slowest); <parent> is the input directory's name
  OUT/validation/...                              or OUT/val/... with --val-dir val

Each file holds one tf.train.Example (x: the int16 bytes of an (n, n, n, 4) cube, y: the universe's 4 unitPar
floats), GZIP-compressed by TensorFlow's writer, and nothing else is written: no DALI index, no manifest.
Universes are split by cosmo-convert's seeded draw, so no universe is in both splits. Files are written
under temporary names and renamed when complete; a rerun writes only the missing ones.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from common.base.errors import BenchError
from common.io.formats import TRAIN, VALIDATION
from common.io.formats.cosmoflow import record_features
from common.io.formats.cosmoflow_prep import RELEASED_COMPRESSION, RELEASED_SPLIT_DIRS, released_file_name
from data_prep import cosmo_convert, tfrecords

VALIDATION_FRACTION = 1 / 9  # the release's 65,536 validation samples beside 524,288 training ones


@dataclasses.dataclass(frozen=True)
class Job:
    """One universe to write as (N/n)^3 files (picklable, for the worker processes)."""

    universe: cosmo_convert.Universe
    out_dir: Path  # the split's directory
    parent: str  # the name prepare.py puts first: the input directory's
    sample_size: int
    gzip_level: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, type=Path, metavar="DIR",
                        help="directory of universe HDF5 files (*.h5, *.hdf5), e.g. made by cosmo-synth")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory to write the layout into")
    parser.add_argument("--sample-size", required=True, type=tfrecords.positive_int, metavar="n",
                        help="edge of a sample cube in cells (128 in the release); must divide the universe size")
    parser.add_argument("--val-universes", type=int, default=None, metavar="K",
                        help="universes for validation (default: 1/9 of them, the release's share, at least 1)")
    names = RELEASED_SPLIT_DIRS[VALIDATION]
    parser.add_argument("--val-dir", choices=names, default=names[0],
                        help="name of the validation directory (default: %(default)s)")
    parser.add_argument("--gzip-level", type=int, choices=range(1, 10), default=6, metavar="L",
                        help="zlib level 1-9 (default: %(default)s, TensorFlow's default)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/validation draw (default: 0)")
    parser.add_argument("--workers", type=tfrecords.positive_int, default=tfrecords.available_cpus(), metavar="W",
                        help="parallel processes, one universe each (default: CPUs available, %(default)s)")


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    universes = cosmo_convert.scan_universes(args.input)
    size = universes[0].size
    if size % args.sample_size:
        raise BenchError(f"{universes[0].path}: universe size {size} is not a multiple of --sample-size "
                         f"{args.sample_size}")
    n_val = cosmo_convert.validation_count(len(universes), VALIDATION_FRACTION, args.val_universes, args.input)
    splits = cosmo_convert.split_universes(universes, n_val, args.seed)
    dirs = {TRAIN: args.out / RELEASED_SPLIT_DIRS[TRAIN][0], VALIDATION: args.out / args.val_dir}
    parent = args.input.resolve().name
    jobs = [Job(u, dirs[split], parent, args.sample_size, args.gzip_level)
            for split in (TRAIN, VALIDATION) for u in splits[split]]
    for directory in dirs.values():
        directory.mkdir(parents=True, exist_ok=True)
        tfrecords.remove_stale_temps(directory)
    written = sum(tfrecords.run_in_pool(write_universe, jobs, args.workers, "cosmo-released", "universe"))
    files = len(jobs) * (size // args.sample_size) ** 3
    print(f"cosmo-released: {files} files ({written} written, {files - written} kept) of "
          f"{args.sample_size}^3 samples from {len(universes)} universes ({n_val} for validation) in "
          f"{args.out}, {time.perf_counter() - started:.1f} s", flush=True)
    return 0


def write_universe(job: Job) -> int:
    """Write the universe's sub-cubes that are not there yet, one file each; returns how many were written."""
    written = 0
    for i, cube in enumerate(cosmo_convert.iter_subcubes(job.universe.path, job.sample_size)):
        path = job.out_dir / released_file_name(job.parent, job.universe.name, i)
        if path.is_file():
            continue
        record = tfrecords.serialize_example(record_features(cube, job.universe.target))
        tfrecords.write_record_file(path, [record], RELEASED_COMPRESSION, job.gzip_level)
        written += 1
    return written
