"""Per-channel statistics of DeepCAM climate files (stats.h5), for synthetic or real data.

stats.h5 holds group `climate` with datasets `count` (grid cells seen, per channel), `mean`, `sqmean`
(mean of squares), `minval`, `maxval`, each (16,) float64 in the channel order of the data, as the
real dataset's stats file, which the reference normalises with (x - minval) / (maxval - minval).
When the files carry labels it also holds `label_counts` (3,) int64: cells per class (background,
tropical cyclone, atmospheric river), from which class frequencies and loss weights follow.

The statistics are exact sums in float64: each file's sums (pairwise summation per channel) are
computed independently, possibly in parallel, then added in file order, so the result does not depend
on the number of workers. Labels may be stored with any numeric dtype; their values must be 0, 1 or 2.

`python -m data_prep deepcam-stats --data DIR/train` recomputes DIR/stats.h5 from a directory of
*.h5 files (`climate/data` (H, W, C) and optionally `climate/labels_0` (H, W)).
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from common.base.errors import BenchError
from common.base.files import atomic_path
from common.io.formats.deepcam import CLASSES, STATS_GROUP, STATS_KEYS, STATS_NAME

NUM_CLASSES = len(CLASSES)


@dataclasses.dataclass(frozen=True)
class PartialStats:
    """The float64 sums of one file."""

    cells: int  # grid cells (H * W)
    total: np.ndarray  # (C,) sum of values
    total_sq: np.ndarray  # (C,) sum of squares
    minval: np.ndarray  # (C,)
    maxval: np.ndarray  # (C,)
    class_counts: np.ndarray | None  # (3,) int64, or None without labels


@dataclasses.dataclass(frozen=True)
class ChannelStats:
    """Statistics over a set of files: what stats.h5 holds."""

    files: int
    count: np.ndarray  # (C,) float64, cells per channel
    mean: np.ndarray  # (C,) float64
    sqmean: np.ndarray  # (C,) float64
    minval: np.ndarray  # (C,) float64
    maxval: np.ndarray  # (C,) float64
    class_counts: np.ndarray | None = None  # (3,) int64

    @property
    def std(self) -> np.ndarray:
        """(C,) population standard deviation."""
        return np.sqrt(np.maximum(self.sqmean - self.mean ** 2, 0.0))

    @property
    def class_frequencies(self) -> np.ndarray:
        """(3,) fraction of cells per class (NaN without labels)."""
        if self.class_counts is None or self.class_counts.sum() == 0:
            return np.full(NUM_CLASSES, np.nan)
        return self.class_counts / self.class_counts.sum()


# ---------------------------------------------------------------------------- computing
def partial_stats(data: np.ndarray, labels: np.ndarray | None = None) -> PartialStats:
    """The sums of one snapshot: data (H, W, C), labels (H, W) with values 0..2 or None."""
    channels = data.shape[-1]
    by_channel = np.ascontiguousarray(data.reshape(-1, channels).T, dtype=np.float64)  # (C, H*W)
    counts = None
    if labels is not None:
        counts = np.bincount(np.asarray(labels).reshape(-1).astype(np.int64), minlength=NUM_CLASSES)
    return PartialStats(cells=by_channel.shape[1], total=by_channel.sum(axis=1),
                        total_sq=np.square(by_channel).sum(axis=1), minval=by_channel.min(axis=1),
                        maxval=by_channel.max(axis=1), class_counts=counts)


def combine(partials: Sequence[PartialStats]) -> ChannelStats:
    """Add per-file sums in the given order into statistics."""
    if not partials:
        raise BenchError("no files to compute statistics over")
    channels = len(partials[0].total)
    total, total_sq = np.zeros(channels), np.zeros(channels)
    minval, maxval = np.full(channels, np.inf), np.full(channels, -np.inf)
    cells = 0
    for p in partials:
        cells += p.cells
        total += p.total
        total_sq += p.total_sq
        minval = np.minimum(minval, p.minval)
        maxval = np.maximum(maxval, p.maxval)
    counts = None
    if all(p.class_counts is not None for p in partials):
        counts = np.sum([p.class_counts for p in partials], axis=0).astype(np.int64)
    count = np.full(channels, float(cells))
    return ChannelStats(files=len(partials), count=count, mean=total / count, sqmean=total_sq / count,
                        minval=minval, maxval=maxval, class_counts=counts)


def file_partial_stats(path: Path) -> PartialStats:
    """Read one climate file and return its sums; BenchError names the file and what is wrong."""
    import h5py
    try:
        with h5py.File(path, "r") as f:
            if "climate/data" not in f:
                raise BenchError(f"{path}: no dataset climate/data (expected the DeepCAM layout)")
            data = f["climate/data"][()]
            labels = f["climate/labels_0"][()] if "climate/labels_0" in f else None
    except OSError as err:
        raise BenchError(f"{path}: not a readable HDF5 file ({err})") from None
    if data.ndim != 3:
        raise BenchError(f"{path}: climate/data has shape {data.shape}, expected (H, W, channels)")
    if labels is not None:
        _check_labels(path, labels, data.shape[:2])
    return partial_stats(data, labels)


def _check_labels(path: Path, labels: np.ndarray, shape: tuple[int, int]) -> None:
    if labels.shape != shape:
        raise BenchError(f"{path}: climate/labels_0 has shape {labels.shape}, expected {shape} like climate/data")
    if not np.issubdtype(labels.dtype, np.number):
        raise BenchError(f"{path}: climate/labels_0 has dtype {labels.dtype}, expected a numeric type")
    bad = ~np.isin(labels, np.arange(NUM_CLASSES))
    if bad.any():
        raise BenchError(f"{path}: climate/labels_0 holds {labels[bad][0].item()!r} ({int(bad.sum())} cells), "
                         f"expected only the classes 0, 1, 2")


def directory_stats(directory: Path, workers: int = 1) -> ChannelStats:
    """Statistics over every *.h5 file of a directory (sorted by name; stats.h5 itself excluded)."""
    files = sorted(p for p in Path(directory).glob("*.h5") if p.name != STATS_NAME)
    if not files:
        raise BenchError(f"{directory}: no *.h5 files to compute statistics over")
    if workers <= 1:
        partials = [file_partial_stats(p) for p in files]
    else:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            partials = pool.map(file_partial_stats, files, chunksize=max(1, len(files) // (8 * workers)))
    channels = {len(p.total) for p in partials}
    if len(channels) != 1:
        raise BenchError(f"{directory}: files differ in their number of channels ({sorted(channels)})")
    return combine(partials)


# ---------------------------------------------------------------------------- stats.h5
def write_stats(path: Path, stats: ChannelStats, attrs: dict | None = None) -> Path:
    """Write stats.h5 to a temporary name beside `path`, then rename it into place."""
    import h5py
    path = Path(path)
    try:
        with atomic_path(path) as temp, h5py.File(temp, "w") as f:
            group = f.create_group(STATS_GROUP)
            for name in STATS_KEYS:
                group.create_dataset(name, data=np.asarray(getattr(stats, name), dtype=np.float64))
            if stats.class_counts is not None:
                group.create_dataset("label_counts", data=stats.class_counts.astype(np.int64))
            f.attrs.update({"files": stats.files, **(attrs or {})})
    except OSError as err:
        raise BenchError(f"{path}: could not write the statistics ({err})") from None
    return path


def read_stats(path: Path, channels: int | None = None) -> ChannelStats:
    """Read a stats.h5 (ours or the real dataset's; `count` and `label_counts` are optional)."""
    import h5py
    try:
        with h5py.File(path, "r") as f:
            keys = {name: f"{STATS_GROUP}/{name}" for name in (*STATS_KEYS, "label_counts")}
            values = {name: f[keys[name]][()] for name in STATS_KEYS if keys[name] in f}
            counts = f[keys["label_counts"]][()] if keys["label_counts"] in f else None
            files = int(f.attrs.get("files", 0))
    except OSError as err:
        raise BenchError(f"{path}: not a readable HDF5 file ({err})") from None
    missing = [name for name in ("mean", "sqmean", "minval", "maxval") if name not in values]
    if missing:
        raise BenchError(f"{path}: no dataset climate/{missing[0]}; expected climate/mean, sqmean, minval, maxval")
    size = len(values["mean"]) if channels is None else channels
    for name, value in values.items():
        if value.shape != (size,):
            raise BenchError(f"{path}: climate/{name} has shape {value.shape}, expected ({size},)")
    count = values.get("count", np.full(size, np.nan))
    return ChannelStats(files=files, count=np.asarray(count, np.float64),
                        **{n: np.asarray(values[n], np.float64) for n in ("mean", "sqmean", "minval", "maxval")},
                        class_counts=None if counts is None else np.asarray(counts, np.int64))


# ---------------------------------------------------------------------------- command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options."""
    parser.add_argument("--data", type=Path, required=True, help="directory of training *.h5 files")
    parser.add_argument("--out", type=Path, default=None,
                        help="stats file to write (default: stats.h5 beside the data directory)")
    parser.add_argument("--workers", type=int, default=1, help="processes reading files (default 1)")


def run(args: argparse.Namespace) -> int:
    """Recompute stats.h5 over a directory; print the channel ranges and class frequencies."""
    data_dir = Path(args.data)
    if not data_dir.is_dir():
        raise BenchError(f"--data {data_dir}: not a directory")
    if args.workers < 1:
        raise BenchError(f"--workers {args.workers}: expected a positive number of processes")
    out = Path(args.out) if args.out is not None else data_dir.resolve().parent / STATS_NAME
    started = time.perf_counter()
    stats = directory_stats(data_dir, args.workers)
    write_stats(out, stats, attrs={"source": str(data_dir.resolve())})
    print(describe(stats), flush=True)
    print(f"deepcam-stats: {stats.files} files in {time.perf_counter() - started:.1f} s -> {out}", flush=True)
    return 0


def describe(stats: ChannelStats, names: Sequence[str] | None = None) -> str:
    """A table of the per-channel statistics and the class frequencies."""
    if names is None:
        from data_prep.climate_labels import VARIABLES
        names = VARIABLES if len(stats.mean) == len(VARIABLES) else [str(i) for i in range(len(stats.mean))]
    lines = [f"{'channel':8s} {'mean':>12s} {'std':>12s} {'min':>12s} {'max':>12s}"]
    lines += [f"{name:8s} {m:12.5g} {s:12.5g} {lo:12.5g} {hi:12.5g}"
              for name, m, s, lo, hi in zip(names, stats.mean, stats.std, stats.minval, stats.maxval)]
    if stats.class_counts is not None:
        from data_prep.climate_labels import CLASSES
        lines.append("classes: " + ", ".join(f"{c} {100 * f:.3f}%"
                                             for c, f in zip(CLASSES, stats.class_frequencies)))
    return "\n".join(lines)
