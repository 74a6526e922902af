"""Convert CosmoFlow HDF5 universes into TFRecord samples (sub-cubes) with DALI indexes and a manifest.

Each universe's `full` (N, N, N, 4) counts are cut into (N/n)^3 non-overlapping cubes of n^3 cells,
taken in C order over the (N/n)^3 grid of cubes (first axis slowest, last fastest). A cube is one
record: a tf.train.Example with `x`, the int16 little-endian C-order bytes of the (n, n, n, 4) cube,
and `y`, the universe's 4 `unitPar` floats (the format: common/io/formats/cosmoflow.py). Universes
are split into train and validation by a seeded draw (no universe in both), one file per universe:

  OUT/train/universe_000003.tfrecord        (GZIP-compressed with --compression gzip)
  OUT/train/universe_000003.tfrecord.idx    DALI index, uncompressed files only
  OUT/validation/...
  OUT/manifest.json                         written last: a directory without it is unfinished

Interrupted runs resume: files are written under temporary names and renamed when complete, and
rerunning the same command keeps finished files, giving output byte-identical to an uninterrupted
run. OUT/.cosmo-convert.json records the settings; a rerun with other settings or changed input
files is refused. Do not run two conversions into the same OUT at once. See docs/formats.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from common.base.errors import BenchError
from common.io.formats import SPLITS
from common.io.formats import cosmoflow_prep
from common.io.formats.cosmoflow import (CHANNELS, FORMAT, SAMPLE_DTYPE, TARGET_SIZE, VERSION, record_features,
                                         sample_shape)
from common.io.hdf5 import reading
from common.io.manifest import MANIFEST_NAME, Manifest, SplitEntry
from common.io.manifest_write import write_manifest
from data_prep import tfrecords

STATE_NAME = ".cosmo-convert.json"
SUFFIXES = (".h5", ".hdf5")
INT16_MIN, INT16_MAX = np.iinfo(np.int16).min, np.iinfo(np.int16).max


@dataclasses.dataclass(frozen=True)
class Universe:
    """One input HDF5 file, checked: `full` is (size, size, size, 4) integers, `unitPar` 4 finite floats."""

    path: Path
    size: int
    file_bytes: int
    mtime_ns: int
    target: tuple[float, ...]

    @property
    def name(self) -> str:
        return self.path.stem


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything that determines the output bytes."""

    input_dir: Path
    out_dir: Path
    universe_size: int
    sample_size: int
    compression: str
    gzip_level: int
    seed: int
    splits: dict[str, tuple[Universe, ...]]  # split -> universes sorted by name

    @property
    def samples_per_universe(self) -> int:
        return (self.universe_size // self.sample_size) ** 3

    def output(self, split: str, universe: Universe) -> Path:
        return self.out_dir / split / f"{universe.name}.tfrecord"

    def settings(self) -> dict:
        """What a resumed run must share with the interrupted one (saved in OUT/.cosmo-convert.json)."""
        return {
            "format": FORMAT, "version": VERSION,
            "universe_size": self.universe_size, "sample_size": self.sample_size,
            "compression": self.compression,
            "gzip_level": self.gzip_level if self.compression == "gzip" else None,
            "seed": self.seed,
            "splits": {split: [u.name for u in universes] for split, universes in self.splits.items()},
            "inputs": {u.path.name: {"bytes": u.file_bytes, "mtime_ns": u.mtime_ns}
                       for u in sorted((u for us in self.splits.values() for u in us), key=lambda u: u.name)},
        }


@dataclasses.dataclass(frozen=True)
class Job:
    """One universe to convert (picklable, for the worker processes)."""

    universe: Universe
    output: Path
    sample_size: int
    compression: str
    gzip_level: int
    records: int


# ---------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, type=Path, metavar="DIR",
                        help="directory of universe HDF5 files (*.h5, *.hdf5)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="dataset directory to write")
    parser.add_argument("--sample-size", required=True, type=tfrecords.positive_int, metavar="n",
                        help="edge of a sample cube in cells; must divide the universe size N")
    parser.add_argument("--compression", choices=tfrecords.COMPRESSIONS, default="none",
                        help="record file compression; DALI needs 'none' (default: %(default)s)")
    parser.add_argument("--gzip-level", type=_gzip_level, default=6, metavar="L",
                        help="zlib level 1-9 for --compression gzip; 1 is several times faster, files "
                             "~15%% larger (default: %(default)s)")
    val = parser.add_mutually_exclusive_group()
    val.add_argument("--val-fraction", type=_fraction, default=0.2, metavar="F",
                     help="fraction of universes for validation, rounded, at least 1 when F > 0 "
                          "(default: %(default)s)")
    val.add_argument("--val-universes", type=_non_negative_int, metavar="K", help="number of validation universes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/validation split (default: 0)")
    parser.add_argument("--workers", type=tfrecords.positive_int, default=tfrecords.available_cpus(), metavar="W",
                        help="parallel processes, one universe each (default: CPUs available, %(default)s)")


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    universes = scan_universes(args.input)
    plan = make_plan(args, universes)
    prepare_output(plan)
    jobs = [Job(u, plan.output(split, u), plan.sample_size, plan.compression, plan.gzip_level,
                plan.samples_per_universe) for split in SPLITS for u in plan.splits[split]]
    results = convert_all(jobs, args.workers)
    stats = input_stats(plan.splits[SPLITS[0]], args.workers)
    manifest = build_manifest(plan, results, stats)
    write_manifest(manifest, plan.out_dir)
    print(summary_line(plan, manifest, results, time.perf_counter() - started), flush=True)
    return 0


# ---------------------------------------------------------------------------- input
def scan_universes(input_dir: Path) -> list[Universe]:
    """The universes in `input_dir`, sorted by name, checked for layout and a common size."""
    if not input_dir.is_dir():
        raise BenchError(f"{input_dir}: input directory not found (expected CosmoFlow universe HDF5 files)")
    entries = list(input_dir.iterdir())
    paths = sorted(p for p in entries if p.suffix in SUFFIXES and p.is_file())
    if not paths:
        raise BenchError(f"{input_dir}: no universe files (*.h5, *.hdf5) among its {len(entries)} entries; "
                         f"generate some with `python -m data_prep cosmo-synth` or point --input at the raw "
                         f"CosmoFlow files")
    universes = [inspect_universe(p) for p in paths]
    first = universes[0]
    for u in universes[1:]:
        if u.size != first.size:
            raise BenchError(f"{u.path}: universe size {u.size}, but {first.path.name} has {first.size}; all "
                             f"universes of a dataset must have the same size")
    seen = {}
    for u in universes:
        if u.name in seen:
            raise BenchError(f"{u.path}: {seen[u.name].name} has the same name {u.name!r}; both would be "
                             f"written to {u.name}.tfrecord")
        seen[u.name] = u.path
    return universes


def inspect_universe(path: Path) -> Universe:
    """Check one file's datasets without reading the counts."""
    import h5py
    with reading(path), h5py.File(path, "r") as f:
        for key in ("full", "unitPar"):
            if key not in f or not isinstance(f[key], h5py.Dataset):
                raise BenchError(f"{path}: no dataset {key!r} (found {sorted(f.keys(), key=str)}); expected a "
                                 f"CosmoFlow universe with 'full' (N, N, N, 4) counts and 'unitPar' (4,)")
        full, unit = f["full"], f["unitPar"]
        shape = full.shape
        if len(shape) != 4 or shape[3] != CHANNELS or not shape[0] == shape[1] == shape[2] or shape[0] < 1:
            raise BenchError(f"{path}: 'full' has shape {shape}, expected (N, N, N, {CHANNELS}): a cube of N^3 "
                             f"cells with {CHANNELS} channels last")
        if full.dtype.kind not in "iu":
            raise BenchError(f"{path}: 'full' has dtype {full.dtype}, expected integer counts (int16)")
        if unit.shape != (TARGET_SIZE,) or unit.dtype.kind not in "fiu":
            raise BenchError(f"{path}: 'unitPar' is {unit.dtype} with shape {unit.shape}, expected "
                             f"({TARGET_SIZE},) floats")
        target = np.asarray(unit[()], dtype=np.float32)
    if not np.all(np.isfinite(target)):
        raise BenchError(f"{path}: 'unitPar' is {target.tolist()}, expected {TARGET_SIZE} finite numbers")
    stat = path.stat()
    return Universe(path=path, size=shape[0], file_bytes=stat.st_size, mtime_ns=stat.st_mtime_ns,
                    target=tuple(float(t) for t in target))


def make_plan(args: argparse.Namespace, universes: list[Universe]) -> Plan:
    size = universes[0].size
    n = args.sample_size
    if size % n:
        divisors = ", ".join(str(d) for d in range(1, size + 1) if size % d == 0)
        raise BenchError(f"{universes[0].path}: universe size {size} is not a multiple of --sample-size {n}; "
                         f"choose one of its divisors ({divisors})")
    n_val = validation_count(len(universes), args.val_fraction, args.val_universes, args.input)
    return Plan(input_dir=args.input.resolve(), out_dir=args.out, universe_size=size, sample_size=n,
                compression=args.compression, gzip_level=args.gzip_level, seed=args.seed,
                splits=split_universes(universes, n_val, args.seed))


def validation_count(universes: int, fraction: float, count: int | None, input_dir: Path) -> int:
    """K validation universes: `count` if given, else round(fraction * universes), at least 1 if fraction > 0."""
    if count is None:
        count = math.floor(fraction * universes + 0.5)
        count = max(count, 1) if fraction > 0 else 0
    if count >= universes:
        raise BenchError(f"{input_dir}: {universes} universes, and {count} for validation would leave none for "
                         f"training; lower --val-fraction/--val-universes or add universes")
    return count


def split_universes(universes: list[Universe], n_val: int, seed: int) -> dict[str, tuple[Universe, ...]]:
    """A seeded draw of `n_val` validation universes from the name-sorted list; the rest train."""
    ordered = sorted(universes, key=lambda u: u.name)
    chosen = set(np.random.default_rng(seed).permutation(len(ordered))[:n_val].tolist())
    train, validation = SPLITS
    return {train: tuple(u for i, u in enumerate(ordered) if i not in chosen),
            validation: tuple(u for i, u in enumerate(ordered) if i in chosen)}


# ---------------------------------------------------------------------------- output directory
def prepare_output(plan: Plan) -> None:
    """Check that OUT is new or holds this conversion, interrupted or finished; record the settings."""
    planned = [plan.output(s, u) for s in SPLITS for u in plan.splits[s]]
    tfrecords.begin_conversion(plan.out_dir, STATE_NAME, plan.settings(), planned, SPLITS, "cosmo-convert")


# ---------------------------------------------------------------------------- conversion
def convert_all(jobs: list[Job], workers: int) -> dict[Path, tuple[tfrecords.RecordFile, bool]]:
    """Run every job (in a pool when `workers` > 1); output path -> (file, reused)."""
    results = tfrecords.run_in_pool(convert_universe, jobs, workers, "cosmo-convert", "universe")
    return {job.output: result for job, result in zip(jobs, results)}


def convert_universe(job: Job) -> tuple[tfrecords.RecordFile, bool]:
    """Write one universe's record file (and index), or describe it if an earlier run finished it.

    Returns the file and whether it was reused.
    """
    done = tfrecords.existing_record_file(job.output, job.records, job.compression)
    if done is not None:
        return done, True
    records = (tfrecords.serialize_example(record_features(cube, job.universe.target))
               for cube in iter_subcubes(job.universe.path, job.sample_size))
    return tfrecords.write_record_file(job.output, records, job.compression, job.gzip_level), False


def iter_subcubes(path: Path, n: int) -> Iterator[np.ndarray]:
    """The (n, n, n, 4) little-endian int16 cubes of a universe in C order over the (N/n)^3 grid.

    Reads one slab of n planes (n, N, N, 4) at a time, so memory stays at 1/(N/n) of a universe.
    Every universe is checked for negative counts here: the statistics (log1p_moments) read only training ones.
    """
    import h5py
    with reading(path), h5py.File(path, "r") as f:
        full = f["full"]
        grid = full.shape[0] // n
        for i in range(grid):
            slab = _as_int16(full[i * n:(i + 1) * n], path, i * n)  # (n, N, N, 4)
            for j in range(grid):
                for k in range(grid):
                    yield slab[:, j * n:(j + 1) * n, k * n:(k + 1) * n]


def _as_int16(block: np.ndarray, path: Path, first_plane: int) -> np.ndarray:
    planes = f"planes {first_plane}-{first_plane + block.shape[0] - 1}"
    low = int(block.min())
    if low < 0:  # log(1 + x) of a negative count is NaN or -inf in training
        raise BenchError(f"{path}: 'full' holds negative values (min {low}) in {planes}; expected particle "
                         f"counts >= 0")
    if block.dtype.kind == "i" and block.dtype.itemsize == 2:
        return block.astype("<i2", copy=False)
    high = int(block.max())
    if high > INT16_MAX:
        raise BenchError(f"{path}: 'full' ({block.dtype}) holds values from {low} to {high} in {planes}, outside "
                         f"{INT16_MIN} to {INT16_MAX}; samples are stored as int16 counts")
    return block.astype("<i2")


# ---------------------------------------------------------------------------- input statistics
def input_stats(universes: tuple[Universe, ...], workers: int) -> dict:
    """Per-channel mean and std of log(1 + counts) over every cell of the training universes.

    Recorded in the manifest for loaders that standardise their input (config data.normalize); computed
    from the HDF5 inputs, so a resumed conversion gets the same figures as an uninterrupted one.
    """
    moments = tfrecords.run_in_pool(log1p_moments, [u.path for u in universes], workers,
                                    "cosmo-convert stats", "universe")
    return cosmoflow_prep.input_stats(np.sum(moments, axis=0), SPLITS[0], {"universes": len(universes)})


def log1p_moments(path: Path, planes: int = 8) -> np.ndarray:
    """(3, C) float64: cell count, sum and sum of squares of log(1 + counts) per channel of one universe."""
    import h5py
    moments = np.zeros((3, CHANNELS))
    with reading(path), h5py.File(path, "r") as f:
        full = f["full"]
        for first in range(0, full.shape[0], planes):
            block = full[first:first + planes]
            if block.min() < 0:
                raise BenchError(f"{path}: 'full' holds negative values (min {block.min()}) in planes "
                                 f"{first}-{first + len(block) - 1}; expected particle counts >= 0")
            moments += cosmoflow_prep.log1p_moments(block)
    return moments


# ---------------------------------------------------------------------------- manifest and summary
def build_manifest(plan: Plan, results: dict[Path, tuple[tfrecords.RecordFile, bool]],
                   stats: dict) -> Manifest:
    splits = {}
    for split in SPLITS:
        files = tuple(tfrecords.file_entry(results[plan.output(split, u)][0], plan.out_dir) for u in plan.splits[split])
        splits[split] = SplitEntry(samples=sum(f.records for f in files), files=files)
    n = plan.sample_size
    source = {
        "kind": "cosmoflow-hdf5",
        "dir": str(plan.input_dir),
        "universe_size": plan.universe_size,
        "universes": sum(len(us) for us in plan.splits.values()),
        "samples_per_universe": plan.samples_per_universe,
        "sub_cube_order": "C order over the (N/n)^3 grid of cubes, first axis slowest",
        "gzip_level": plan.gzip_level if plan.compression == "gzip" else None,
    }
    return Manifest(root=plan.out_dir, format=FORMAT, version=VERSION, sample_shape=sample_shape(n),
                    sample_dtype=SAMPLE_DTYPE, target_size=TARGET_SIZE, compression=plan.compression, splits=splits,
                    source=source, seed=plan.seed, input_stats=stats)


def summary_line(plan: Plan, manifest: Manifest, results: dict, seconds: float) -> str:
    written = sum(1 for _, reused in results.values() if not reused)
    total_bytes = sum(f.bytes for s in manifest.splits.values() for f in s.files)
    input_mb = written * plan.universe_size ** 3 * CHANNELS * 2 / 1e6
    counts = ", ".join(f"{split} {manifest.splits[split].samples} samples ({_count(len(plan.splits[split]))})"
                       for split in SPLITS)
    kind = "uncompressed" if plan.compression == "none" else plan.compression
    return (f"cosmo-convert: {counts}; {total_bytes / 1e6:.1f} MB of records ({kind}); "
            f"{_count(written)} converted ({input_mb / max(seconds, 1e-9):.1f} MB/s of int16 input), "
            f"{_count(len(results) - written)} reused, in {seconds:.1f} s -> {plan.out_dir / MANIFEST_NAME}")


def _count(universes: int) -> str:
    return f"{universes} universe{'' if universes == 1 else 's'}"


# ---------------------------------------------------------------------------- argument types
def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not in [0, 1)")
    return value


def _gzip_level(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 9:
        raise argparse.ArgumentTypeError(f"{value} is not a zlib level 1-9")
    return value
