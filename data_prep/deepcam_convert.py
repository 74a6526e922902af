"""Convert DeepCAM HDF5 snapshots into TFRecords (several samples per file) with DALI indexes and a manifest.

Input, in the layout of the real DeepCAM dataset (or made by `python -m data_prep climate-synth`):

  DIR/stats.h5              group `climate`: count, mean, sqmean, minval, maxval, each (16,)
  DIR/train/*.h5            one snapshot each: climate/data (H, W, 16) float32, climate/labels_0 (H, W)
  DIR/validation/*.h5       with labels exactly 0, 1 or 2 (stored as floats in the real files)

One snapshot is one record, a tf.train.Example with `data`, the float32 little-endian C-order bytes of
the (H, W, 16) channels-last fields, and `label`, the uint8 bytes of the (H, W) class map (the format:
common/io/formats/deepcam.py). Each split's
snapshots, sorted by file name, fill record files of --samples-per-file records in that order:

  OUT/train/part_000000.tfrecord       snapshots 0..N-1 of train (GZIP-compressed with --compression gzip)
  OUT/train/part_000000.tfrecord.idx   DALI index, uncompressed files only
  OUT/validation/...
  OUT/stats.h5                         a byte copy of DIR/stats.h5: the directory is self-contained
  OUT/manifest.json                    written last: a directory without it is unfinished

Every snapshot is checked as it is read (datasets, shape equal to the first train file's, 16 channels,
finite data, labels in {0, 1, 2}); bad input stops the run with a message naming the file. Interrupted
runs resume: record files are written under temporary names and renamed when complete, and rerunning
the same command keeps finished files, giving output byte-identical to an uninterrupted run.
OUT/.deepcam-convert.json records the settings and input fingerprints; a rerun with other settings or
changed input files is refused. Do not run two conversions into the same OUT at once. See docs/formats.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import time
from pathlib import Path

import numpy as np

from common.base.errors import BenchError
from common.base.files import atomic_path
from common.io.formats import SPLITS
from common.io.formats.deepcam import (CHANNELS, CLASSES, FORMAT, SAMPLE_DTYPE, STATS_AUX, STATS_NAME, TARGET_DTYPE,
                                       VERSION, read_stats, record_features, sample_shape)
from common.io.hdf5 import open_file, reading
from common.io.manifest import MANIFEST_NAME, AuxFile, Manifest, SplitEntry, xxh3_128_file
from common.io.manifest_write import sha256_file, write_manifest
from data_prep import tfrecords

STATE_NAME = ".deepcam-convert.json"
SUFFIXES = (".h5", ".hdf5")
DATA_KEY, LABEL_KEY = "climate/data", "climate/labels_0"  # in the input snapshots
# A full-size sample is 768 x 1152 x 16 float32 + 768 x 1152 uint8 = 57.5 MB: 4 make a 230 MB file.
DEFAULT_SAMPLES_PER_FILE = 4


@dataclasses.dataclass(frozen=True)
class InputFile:
    """An input file with the size and modification time that identify its version."""

    path: Path
    bytes: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> InputFile:
        stat = path.stat()
        return cls(path, stat.st_size, stat.st_mtime_ns)

    def fingerprint(self) -> list:
        return [self.path.name, self.bytes, self.mtime_ns]


@dataclasses.dataclass(frozen=True)
class Group:
    """One record file to write: its snapshots in order (picklable, for the worker processes)."""

    inputs: tuple[Path, ...]
    output: Path
    image_shape: tuple[int, int]  # (H, W) every snapshot must have
    reference: Path  # the file `image_shape` was taken from, for messages
    compression: str
    gzip_level: int


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything that determines the output bytes."""

    input_dir: Path
    out_dir: Path
    image_shape: tuple[int, int]
    reference: Path
    samples_per_file: int
    compression: str
    gzip_level: int
    stats: InputFile
    splits: dict[str, tuple[InputFile, ...]]  # split -> snapshots sorted by name

    def groups(self, split: str) -> list[Group]:
        files, n = self.splits[split], self.samples_per_file
        return [Group(inputs=tuple(f.path for f in files[i:i + n]),
                      output=self.out_dir / split / f"part_{i // n:06d}.tfrecord",
                      image_shape=self.image_shape, reference=self.reference, compression=self.compression,
                      gzip_level=self.gzip_level) for i in range(0, len(files), n)]

    def settings(self) -> dict:
        """What a resumed run must share with the interrupted one (saved in OUT/.deepcam-convert.json)."""
        return {
            "format": FORMAT, "version": VERSION,
            "image_shape": list(self.image_shape), "channels": CHANNELS,
            "samples_per_file": self.samples_per_file, "compression": self.compression,
            "gzip_level": self.gzip_level if self.compression == "gzip" else None,
            "stats": self.stats.fingerprint(),
            "inputs": {split: [f.fingerprint() for f in files] for split, files in self.splits.items()},
        }


# ---------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, type=Path, metavar="DIR",
                        help="DeepCAM dataset directory: stats.h5, train/*.h5, validation/*.h5")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="dataset directory to write")
    parser.add_argument("--samples-per-file", type=tfrecords.positive_int, default=DEFAULT_SAMPLES_PER_FILE,
                        metavar="N", help="records per TFRecord file; 4 give ~230 MB files at the full "
                                          "768x1152 size (default: %(default)s)")
    parser.add_argument("--compression", choices=tfrecords.COMPRESSIONS, default="none",
                        help="record file compression; DALI needs 'none' (default: %(default)s)")
    parser.add_argument("--gzip-level", type=int, choices=range(1, 10), default=6, metavar="L",
                        help="zlib level 1-9 for --compression gzip (default: %(default)s)")
    parser.add_argument("--workers", type=tfrecords.positive_int, default=tfrecords.available_cpus(),
                        metavar="K", help="parallel processes, one record file each "
                                          "(default: CPUs available, %(default)s)")


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    plan = make_plan(args)
    prepare_output(plan)
    stats = copy_stats(plan)
    groups = {split: plan.groups(split) for split in SPLITS}
    jobs = [g for split in SPLITS for g in groups[split]]
    results = dict(zip((g.output for g in jobs),
                       tfrecords.run_in_pool(convert_group, jobs, args.workers, "deepcam-convert", "file")))
    manifest = build_manifest(plan, groups, results, stats)
    write_manifest(manifest, plan.out_dir)
    print(summary_line(plan, manifest, results, time.perf_counter() - started), flush=True)
    return 0


# ---------------------------------------------------------------------------- input
def make_plan(args: argparse.Namespace) -> Plan:
    """Find the snapshots and the statistics, check the statistics and take (H, W) from the first snapshot."""
    input_dir: Path = args.input
    if not input_dir.is_dir():
        raise BenchError(f"{input_dir}: input directory not found (expected a DeepCAM dataset with "
                         f"{STATS_NAME}, train/ and validation/)")
    stats_path = input_dir / STATS_NAME
    if not stats_path.is_file():
        raise BenchError(f"{stats_path}: not found; a DeepCAM dataset directory holds the per-channel "
                         f"statistics file {STATS_NAME} (group climate: count, mean, sqmean, minval, maxval) "
                         f"beside train/ and validation/")
    read_stats(stats_path)
    splits = {split: scan_split(input_dir / split) for split in SPLITS}
    reference = splits[SPLITS[0]][0].path
    return Plan(input_dir=input_dir.resolve(), out_dir=args.out, image_shape=image_shape_of(reference),
                reference=reference, samples_per_file=args.samples_per_file, compression=args.compression,
                gzip_level=args.gzip_level, stats=InputFile.of(stats_path), splits=splits)


def scan_split(directory: Path) -> tuple[InputFile, ...]:
    """The snapshot files of one split directory, sorted by name."""
    if not directory.is_dir():
        raise BenchError(f"{directory}: split directory not found; a DeepCAM dataset has train/ and "
                         f"validation/ directories of snapshot HDF5 files")
    entries = list(directory.iterdir())
    # Hidden names are other tools' temporaries (climate-synth writes .data-000003.h5.tmp-PID).
    paths = sorted(p for p in entries if p.suffix in SUFFIXES and not p.name.startswith(".") and p.is_file())
    if not paths:
        raise BenchError(f"{directory}: no snapshot files (*.h5, *.hdf5) among its {len(entries)} entries")
    return tuple(InputFile.of(p) for p in paths)


def image_shape_of(path: Path) -> tuple[int, int]:
    """(H, W) of one snapshot, after checking its layout (without reading the fields)."""
    with reading(path), open_file(path) as f:
        data, _ = _sample_datasets(f, path)
        return data.shape[:2]


def read_sample(path: Path, image_shape: tuple[int, int], reference: Path) -> tuple[np.ndarray, np.ndarray]:
    """One snapshot, checked: (H, W, 16) little-endian float32 fields and (H, W) uint8 labels."""
    with reading(path), open_file(path) as f:
        data, labels = _sample_datasets(f, path)
        if data.shape[:2] != tuple(image_shape):
            raise BenchError(f"{path}: {DATA_KEY} has shape {data.shape}, but {reference.name} has "
                             f"{(*image_shape, CHANNELS)}; every snapshot of a dataset must have the same size")
        try:
            fields, classes = data[()], labels[()]
        except OSError as err:
            raise BenchError(f"{path}: reading the datasets failed ({err}); the file is truncated or "
                             f"corrupt") from None
    return _checked_fields(fields, path), _checked_labels(classes, path)


def _sample_datasets(f, path: Path):
    """The data and label datasets of an open snapshot, checked for shapes and dtypes."""
    import h5py
    found = []
    f.visit(found.append)
    for key in (DATA_KEY, LABEL_KEY):
        if not isinstance(f.get(key), h5py.Dataset):
            raise BenchError(f"{path}: no dataset {key!r} (found {found}); expected a DeepCAM snapshot with "
                             f"{DATA_KEY} (H, W, {CHANNELS}) and {LABEL_KEY} (H, W)")
    data, labels = f[DATA_KEY], f[LABEL_KEY]
    if data.ndim != 3 or data.shape[2] != CHANNELS:
        raise BenchError(f"{path}: {DATA_KEY} has shape {data.shape}, expected (H, W, {CHANNELS}): "
                         f"{CHANNELS} channels last")
    if data.dtype.kind != "f":
        raise BenchError(f"{path}: {DATA_KEY} has dtype {data.dtype}, expected float32")
    if labels.shape != data.shape[:2]:
        raise BenchError(f"{path}: {LABEL_KEY} has shape {labels.shape}, expected {data.shape[:2]} "
                         f"(the height and width of {DATA_KEY} {data.shape})")
    if labels.dtype.kind not in "iuf":
        raise BenchError(f"{path}: {LABEL_KEY} has dtype {labels.dtype}, expected numbers (class ids "
                         f"{', '.join(map(str, CLASSES))})")
    return data, labels


def _checked_fields(fields: np.ndarray, path: Path) -> np.ndarray:
    fields = np.ascontiguousarray(fields, dtype="<f4")  # (H, W, C)
    finite = np.isfinite(fields)
    if not finite.all():
        bad = np.argwhere(~finite)
        where = tuple(int(i) for i in bad[0])
        raise BenchError(f"{path}: {DATA_KEY} holds {len(bad)} non-finite float32 value(s), the first "
                         f"{fields[where].item()} at (row, column, channel) {where}; expected finite numbers")
    return fields


def _checked_labels(classes: np.ndarray, path: Path) -> np.ndarray:
    valid = np.zeros(classes.shape, dtype=bool)
    for c in CLASSES:
        valid |= classes == c
    if not valid.all():
        bad = np.argwhere(~valid)
        where = tuple(int(i) for i in bad[0])
        raise BenchError(f"{path}: {LABEL_KEY} holds {len(bad)} value(s) that are not class ids, the first "
                         f"{classes[where].item()!r} at (row, column) {where}; expected exactly "
                         f"{', '.join(map(str, CLASSES))}")
    return classes.astype(np.uint8)  # (H, W)


# ---------------------------------------------------------------------------- output directory
def prepare_output(plan: Plan) -> None:
    """Check that OUT is new or holds this conversion, interrupted or finished; record the settings."""
    planned = [plan.out_dir / STATS_NAME, *(g.output for split in SPLITS for g in plan.groups(split))]
    tfrecords.begin_conversion(plan.out_dir, STATE_NAME, plan.settings(), planned, SPLITS, "deepcam-convert")


def copy_stats(plan: Plan) -> AuxFile:
    """Copy stats.h5 into OUT (under a temporary name, then renamed), unless an identical copy is there."""
    source, target = plan.stats.path, plan.out_dir / STATS_NAME
    digest = sha256_file(source)
    if not (target.is_file() and sha256_file(target) == digest):
        with atomic_path(target) as tmp:
            shutil.copyfile(source, tmp)
    return AuxFile(path=STATS_NAME, bytes=target.stat().st_size, sha256=digest, xxh3_128=xxh3_128_file(target))


# ---------------------------------------------------------------------------- conversion
def convert_group(group: Group) -> tuple[tfrecords.RecordFile, bool]:
    """Write one record file (and index), or describe it if an earlier run finished it.

    Returns the file and whether it was reused.
    """
    done = tfrecords.existing_record_file(group.output, len(group.inputs), group.compression)
    if done is not None:
        return done, True
    records = (encode_sample(*read_sample(path, group.image_shape, group.reference)) for path in group.inputs)
    return tfrecords.write_record_file(group.output, records, group.compression, group.gzip_level), False


def encode_sample(fields: np.ndarray, labels: np.ndarray) -> bytes:
    """A serialized tf.train.Example of one snapshot: `data` (H, W, 16) float32, `label` (H, W) uint8."""
    return tfrecords.serialize_example(record_features(fields, labels))


# ---------------------------------------------------------------------------- manifest and summary
def build_manifest(plan: Plan, groups: dict[str, list[Group]],
                   results: dict[Path, tuple[tfrecords.RecordFile, bool]], stats: AuxFile) -> Manifest:
    splits = {}
    for split in SPLITS:
        files = tuple(tfrecords.file_entry(results[g.output][0], plan.out_dir) for g in groups[split])
        splits[split] = SplitEntry(samples=sum(f.records for f in files), files=files)
    height, width = plan.image_shape
    source = {
        "kind": "deepcam-hdf5",
        "dir": str(plan.input_dir),
        "snapshots": {split: len(files) for split, files in plan.splits.items()},
        "samples_per_file": plan.samples_per_file,
        "record_order": "each split's snapshot files sorted by name, samples_per_file per record file",
        "gzip_level": plan.gzip_level if plan.compression == "gzip" else None,
    }
    return Manifest(root=plan.out_dir, format=FORMAT, version=VERSION,
                    sample_shape=sample_shape(height, width), sample_dtype=SAMPLE_DTYPE, target_size=height * width,
                    target_shape=(height, width), target_dtype=TARGET_DTYPE, compression=plan.compression,
                    splits=splits, source=source, aux_files={STATS_AUX: stats})


def summary_line(plan: Plan, manifest: Manifest, results: dict, seconds: float) -> str:
    written = [rf for rf, reused in results.values() if not reused]
    samples = sum(rf.records for rf in written)
    height, width = plan.image_shape
    input_mb = samples * height * width * CHANNELS * 4 / 1e6
    record_mb = sum(f.bytes for s in manifest.splits.values() for f in s.files) / 1e6
    counts = ", ".join(f"{split} {manifest.splits[split].samples} samples "
                       f"({_files(len(manifest.splits[split].files))})" for split in SPLITS)
    kind = "uncompressed" if plan.compression == "none" else plan.compression
    rate = max(seconds, 1e-9)
    return (f"deepcam-convert: {counts}; {record_mb:.1f} MB of records ({kind}); {_files(len(written))} "
            f"written ({samples / rate:.1f} samples/s, {input_mb / rate:.1f} MB/s of float32 input), "
            f"{_files(len(results) - len(written))} reused, in {seconds:.1f} s -> {plan.out_dir / MANIFEST_NAME}")


def _files(count: int) -> str:
    return f"{count} file{'' if count == 1 else 's'}"
