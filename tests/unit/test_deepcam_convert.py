"""deepcam-convert: HDF5 snapshots -> TFRecords (several per file), DALI indexes, stats copy, manifest; resume,
bad input with exit code 2."""
from __future__ import annotations

import argparse
import hashlib
import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
import xxhash

from common.base.errors import BenchError
from common.io.manifest import check_aux_file, check_split_files, load_manifest
from common.io import tfrecord
from data_prep import deepcam_convert, tfrecords
from data_prep.__main__ import main as data_prep_main

SHAPE = (32, 48)  # (H, W) of the tiny snapshots
CHANNELS = 16


def make_snapshot(path: Path, seed: int = 0, shape=SHAPE, channels: int = CHANNELS, label_dtype="float32",
                  keys=("climate/data", "climate/labels_0"), label_shape=None) -> Path:
    """A tiny snapshot: normal fields in `climate/data`, classes 0/1/2 in `climate/labels_0`."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        if "climate/data" in keys:
            f["climate/data"] = rng.normal(3.0, 2.0, size=(*shape, channels)).astype(np.float32)
        if "climate/labels_0" in keys:
            f["climate/labels_0"] = rng.integers(0, 3, size=label_shape or shape).astype(label_dtype)
    return path


def write_stats(path: Path, snapshots: list[Path], size: int = CHANNELS) -> Path:
    """stats.h5 in the reference's layout, from the snapshots' fields (size: entries per dataset)."""
    fields = np.stack([h5py.File(p, "r")["climate/data"][()] for p in snapshots]).astype(np.float64)
    per_channel = fields.reshape(-1, fields.shape[-1])
    values = {"count": np.full(CHANNELS, len(per_channel), np.float64), "mean": per_channel.mean(0),
              "sqmean": (per_channel ** 2).mean(0), "minval": per_channel.min(0), "maxval": per_channel.max(0)}
    with h5py.File(path, "w") as f:
        for key, value in values.items():
            f[f"climate/{key}"] = np.resize(value, size)
    return path


def make_dataset(root: Path, train: int = 5, validation: int = 3, shape=SHAPE) -> Path:
    """A DeepCAM dataset directory: train/ and validation/ snapshots and stats.h5 from the train fields."""
    snapshots = {split: [make_snapshot(root / split / f"data-{i:03d}.h5", seed=100 * s + i, shape=shape)
                         for i in range(count)]
                 for s, (split, count) in enumerate((("train", train), ("validation", validation)))}
    write_stats(root / "stats.h5", snapshots["train"])
    return root


def convert(input_dir: Path, out: Path, samples_per_file: int = 2, compression: str = "none",
            workers: int = 1) -> int:
    args = argparse.Namespace(input=input_dir, out=out, samples_per_file=samples_per_file,
                              compression=compression, gzip_level=6, workers=workers)
    return deepcam_convert.run(args)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root (hidden ones included), relative path -> content."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def digests(root: Path) -> dict[str, tuple[str, int]]:
    return {k: (hashlib.sha256(v).hexdigest(), (root / k).stat().st_mtime_ns) for k, v in tree(root).items()}


def read_records(path: Path, compression: str):
    """(fields (H, W, 16) float32, labels (H, W) uint8) of every record of a file."""
    import tensorflow as tf
    features = {"data": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.string)}
    for record in tf.data.TFRecordDataset(str(path), compression_type="GZIP" if compression == "gzip" else ""):
        example = tf.io.parse_single_example(record, features)
        data = np.frombuffer(example["data"].numpy(), dtype="<f4").reshape(*SHAPE, CHANNELS)
        yield data, np.frombuffer(example["label"].numpy(), dtype=np.uint8).reshape(SHAPE)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """5 train and 3 validation 32x48 snapshots: with 2 per file, 3 + 2 record files."""
    return make_dataset(tmp_path_factory.mktemp("deepcam"))


# ---------------------------------------------------------------------------- records, manifest, indexes
@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_records_hold_the_snapshots_in_name_order(inputs, tmp_path, compression, capsys):
    before = digests(inputs)
    assert convert(inputs, tmp_path, compression=compression) == 0
    assert "train 5 samples (3 files), validation 3 samples (2 files)" in capsys.readouterr().out
    manifest = load_manifest(tmp_path, expected_format="deepcam-tfrecord")
    for split in ("train", "validation"):
        check_split_files(manifest, split, verify_checksums=True)
        snapshots = sorted((inputs / split).glob("*.h5"))
        records = [r for entry in manifest.splits[split].files for r in read_records(tmp_path / entry.path,
                                                                                      compression)]
        assert len(records) == len(snapshots) == manifest.splits[split].samples
        for path, (data, labels) in zip(snapshots, records):
            with h5py.File(path, "r") as f:
                np.testing.assert_array_equal(data, f["climate/data"][()])
                np.testing.assert_array_equal(labels, f["climate/labels_0"][()].astype(np.uint8))
        assert all(labels.max() == 2 and labels.min() == 0 for _, labels in records)
    assert digests(inputs) == before  # input neither changed nor touched


def test_manifest_describes_the_dataset(inputs, tmp_path):
    convert(inputs, tmp_path, samples_per_file=2)
    manifest = load_manifest(tmp_path)
    assert (manifest.format, manifest.version, manifest.compression) == ("deepcam-tfrecord", 1, "none")
    assert (manifest.sample_shape, manifest.sample_dtype) == ((32, 48, 16), "float32")
    assert (manifest.target_shape, manifest.target_dtype, manifest.target_size) == ((32, 48), "uint8", 32 * 48)
    assert [f.records for f in manifest.splits["train"].files] == [2, 2, 1]
    assert [f.path for f in manifest.splits["validation"].files] == ["validation/part_000000.tfrecord",
                                                                    "validation/part_000001.tfrecord"]
    assert manifest.source["snapshots"] == {"train": 5, "validation": 3}
    assert manifest.source["samples_per_file"] == 2 and manifest.source["dir"] == str(inputs.resolve())
    stats = manifest.aux_files["stats"]
    assert stats.path == "stats.h5" and stats.sha256 == hashlib.sha256((inputs / "stats.h5").read_bytes()).hexdigest()
    assert stats.xxh3_128 == xxhash.xxh3_128((inputs / "stats.h5").read_bytes()).hexdigest()
    assert (tmp_path / "stats.h5").read_bytes() == (inputs / "stats.h5").read_bytes()
    assert check_aux_file(manifest, "stats") == tmp_path / "stats.h5"


def test_index_matches_the_framing(inputs, tmp_path):
    convert(inputs, tmp_path, samples_per_file=3)
    manifest = load_manifest(tmp_path)
    for entry in manifest.splits["train"].files + manifest.splits["validation"].files:
        index = tfrecord.read_index(tmp_path / entry.index)
        assert index == tfrecord.read_framing(tmp_path / entry.path)
        assert len(index) == entry.records and index[-1][0] + index[-1][1] == entry.bytes


def test_output_is_deterministic_and_independent_of_workers(inputs, tmp_path):
    convert(inputs, tmp_path / "one", compression="gzip", workers=1)
    convert(inputs, tmp_path / "two", compression="gzip", workers=2)  # spawned processes
    assert tree(tmp_path / "one") == tree(tmp_path / "two")


def test_integer_labels_give_the_same_records(tmp_path):
    for dtype in ("float32", "int64"):
        for split in ("train", "validation"):
            make_snapshot(tmp_path / dtype / split / "a.h5", seed=1, label_dtype=dtype)
        write_stats(tmp_path / dtype / "stats.h5", [tmp_path / dtype / "train/a.h5"])
        convert(tmp_path / dtype, tmp_path / f"out-{dtype}")
    a, b = tree(tmp_path / "out-float32"), tree(tmp_path / "out-int64")
    assert {k: v for k, v in a.items() if ".tfrecord" in k} == {k: v for k, v in b.items() if ".tfrecord" in k}


# ---------------------------------------------------------------------------- resume
@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_resume_after_interruption_is_byte_identical(inputs, tmp_path, compression):
    clean, resumed = tmp_path / "clean", tmp_path / "resumed"
    convert(inputs, clean, compression=compression)
    convert(inputs, resumed, compression=compression)
    train = load_manifest(resumed).splits["train"].files
    lost, kept = train[0], train[1]
    # The state an interruption leaves: no manifest, a record file missing, a half-written temporary.
    (resumed / "manifest.json").unlink()
    (resumed / lost.path).unlink()
    (resumed / "train" / f".{Path(lost.path).name}.tmp-99999").write_bytes(b"partial")
    kept_mtime = (resumed / kept.path).stat().st_mtime_ns
    convert(inputs, resumed, compression=compression)
    assert tree(resumed) == tree(clean)
    assert (resumed / kept.path).stat().st_mtime_ns == kept_mtime  # finished files are not rewritten


def test_a_damaged_record_file_is_rewritten(inputs, tmp_path):
    convert(inputs, tmp_path)
    clean = tree(tmp_path)
    (tmp_path / "manifest.json").unlink()
    with open(tmp_path / "validation/part_000001.tfrecord", "ab") as f:
        f.write(b"junk")  # no longer matches its index
    convert(inputs, tmp_path)
    assert tree(tmp_path) == clean


def test_rerun_on_a_finished_dataset_changes_nothing(inputs, tmp_path, capsys):
    convert(inputs, tmp_path)
    before = digests(tmp_path)
    convert(inputs, tmp_path)
    after = digests(tmp_path)
    assert {k: h for k, (h, _) in after.items()} == {k: h for k, (h, _) in before.items()}
    data_files = [k for k in before if k.startswith(("train/", "validation/", "stats"))]
    assert len(data_files) == 11 and all(after[k] == before[k] for k in data_files)  # not even rewritten
    last = capsys.readouterr().out.splitlines()[-1]
    assert "0 files written" in last and "5 files reused" in last


def test_failure_leaves_nothing_that_looks_finished(tmp_path):
    make_dataset(tmp_path / "in", train=4, validation=1)
    with h5py.File(tmp_path / "in/train/data-003.h5", "r+") as f:
        f["climate/labels_0"][5, 7] = 4  # in the second record file, after its first record
    with pytest.raises(BenchError, match=r"data-003.h5: climate/labels_0 holds 1 value\(s\) .* the first 4.0 "
                                         r"at \(row, column\) \(5, 7\); expected exactly 0, 1, 2"):
        convert(tmp_path / "in", tmp_path / "out")
    assert not (tmp_path / "out/manifest.json").exists()
    assert sorted(p.name for p in (tmp_path / "out/train").iterdir()) == ["part_000000.tfrecord",
                                                                       "part_000000.tfrecord.idx"]


def test_rerun_with_other_settings_is_refused(inputs, tmp_path):
    convert(inputs, tmp_path, samples_per_file=2)
    with pytest.raises(BenchError, match="samples_per_file = 2, but this run has settings.samples_per_file = 3"):
        convert(inputs, tmp_path, samples_per_file=3)
    with pytest.raises(BenchError, match="settings.compression = \"none\""):
        convert(inputs, tmp_path, compression="gzip")
    assert load_manifest(tmp_path).splits["train"].files[0].records == 2  # the finished dataset is untouched


def test_changed_input_is_refused_naming_the_file(tmp_path):
    make_dataset(tmp_path / "in")
    convert(tmp_path / "in", tmp_path / "out")
    os.utime(tmp_path / "in/validation/data-001.h5", ns=(1, 1))
    with pytest.raises(BenchError, match=r"settings.inputs.validation\[1\] = \[\"data-001.h5\", \d+, \d+\], "
                                         r"but this run has .*\[\"data-001.h5\", \d+, 1\]"):
        convert(tmp_path / "in", tmp_path / "out")


def test_foreign_files_in_out_are_refused(inputs, tmp_path):
    (tmp_path / "stats.h5").write_bytes(b"old")
    with pytest.raises(BenchError, match="stats.h5 but no .deepcam-convert.json"):
        convert(inputs, tmp_path)


# ---------------------------------------------------------------------------- bad input: message and exit code 2
def _corrupt(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _edit(path: Path, key: str, value) -> None:
    with h5py.File(path, "r+") as f:
        f[key][value[0]] = value[1]


BAD_INPUTS = {
    "wrong channel count": (lambda d: make_snapshot(d / "train/data-002.h5", channels=15), "train/data-002.h5",
                            r"climate/data has shape \(32, 48, 15\), expected \(H, W, 16\)"),
    "image shape differs": (lambda d: make_snapshot(d / "validation/data-001.h5", shape=(32, 40)),
                            "validation/data-001.h5",
                            r"climate/data has shape \(32, 40, 16\), but data-000.h5 has \(32, 48, 16\)"),
    "label outside 0-2": (lambda d: _edit(d / "train/data-004.h5", "climate/labels_0", ((3, 9), 3)),
                          "train/data-004.h5", r"the first 3.0 at \(row, column\) \(3, 9\); expected exactly 0, 1, 2"),
    "non-integer label": (lambda d: _edit(d / "train/data-001.h5", "climate/labels_0", ((0, 1), 1.5)),
                          "train/data-001.h5", r"1 value\(s\) that are not class ids, the first 1.5 at"),
    "NaN in data": (lambda d: _edit(d / "train/data-000.h5", "climate/data", ((1, 2, 3), np.nan)),
                    "train/data-000.h5", r"1 non-finite float32 value\(s\), the first nan at \(row, column, "
                                         r"channel\) \(1, 2, 3\)"),
    "inf in data": (lambda d: _edit(d / "validation/data-002.h5", "climate/data", ((4, 0, 15), -np.inf)),
                    "validation/data-002.h5", r"the first -inf at \(row, column, channel\) \(4, 0, 15\)"),
    "missing stats.h5": (lambda d: (d / "stats.h5").unlink(), "stats.h5", r"not found; a DeepCAM dataset"),
    "wrong stats shape": (lambda d: write_stats(d / "stats.h5", [d / "train/data-000.h5"], size=15), "stats.h5",
                          r"climate/count is float64 with shape \(15,\), expected \(16,\) numbers"),
    "truncated snapshot": (lambda d: _corrupt(d / "train/data-003.h5"), "train/data-003.h5",
                           r"not a readable HDF5 file \(.*\); it is truncated, corrupt or not HDF5"),
    "truncated stats": (lambda d: _corrupt(d / "stats.h5"), "stats.h5", r"not a readable HDF5 file"),
    "missing labels": (lambda d: make_snapshot(d / "train/data-001.h5", keys=("climate/data",)),
                       "train/data-001.h5", r"no dataset 'climate/labels_0' \(found \['climate', 'climate/data'\]\)"),
    "label shape": (lambda d: make_snapshot(d / "train/data-001.h5", label_shape=(32, 47)), "train/data-001.h5",
                    r"climate/labels_0 has shape \(32, 47\), expected \(32, 48\)"),
    "string labels": (lambda d: make_snapshot(d / "train/data-001.h5", label_dtype="S1"), "train/data-001.h5",
                      r"climate/labels_0 has dtype \|S1, expected numbers"),
    "no validation": (lambda d: [p.unlink() for p in (d / "validation").iterdir()], "validation",
                      r"no snapshot files \(\*.h5, \*.hdf5\) among its 0 entries"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_2_naming_the_file(tmp_path, case, capsys):
    spoil, culprit, message = BAD_INPUTS[case]
    data = make_dataset(tmp_path / "in", train=5, validation=3)
    spoil(data)
    before = digests(data)
    code = data_prep_main(["deepcam-convert", "--input", str(data), "--out", str(tmp_path / "out"),
                           "--workers", "1"])
    err = " ".join(capsys.readouterr().err.split())  # undo the message's line wrapping
    assert code == 2, err
    assert f"error: {data / culprit}: " in err
    assert re.search(message, err), err
    assert digests(data) == before
    assert not (tmp_path / "out/manifest.json").exists()


def test_missing_input_directory(tmp_path):
    with pytest.raises(BenchError, match=f"{tmp_path / 'nope'}: input directory not found"):
        convert(tmp_path / "nope", tmp_path / "out")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="deepcam-convert")
    deepcam_convert.add_arguments(parser)
    return parser.parse_args(argv)


def test_command_line(inputs, tmp_path, capsys):
    assert data_prep_main(["deepcam-convert", "--input", str(inputs), "--out", str(tmp_path),
                           "--samples-per-file", "4", "--compression", "gzip", "--workers", "1"]) == 0
    manifest = load_manifest(tmp_path)
    assert [len(s.files) for s in manifest.splits.values()] == [2, 1] and manifest.compression == "gzip"
    assert manifest.splits["train"].files[0].index is None
    assert parse(["--input", "a", "--out", "b"]).samples_per_file == 4
    assert "-> " + str(tmp_path / "manifest.json") in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--samples-per-file", "0"], "0 is not a positive integer"),
    (["--compression", "zstd"], "invalid choice: 'zstd'"),
    (["--workers", "0"], "0 is not a positive integer"),
    (["--gzip-level", "10"], "invalid choice: 10"),
])
def test_command_line_rejects_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse(["--input", "in", "--out", "out", *argv])
    assert re.search(message, capsys.readouterr().err)


def test_hidden_files_are_not_snapshots(tmp_path):
    make_dataset(tmp_path / "in", train=2, validation=1)
    (tmp_path / "in/train/.data-009.h5").write_bytes(b"another tool's temporary")
    convert(tmp_path / "in", tmp_path / "out")
    assert load_manifest(tmp_path / "out").splits["train"].samples == 2


# ---------------------------------------------------------------------------- regressions found by fuzzing
# (tests/fuzz/test_hdf5_fuzz.py, docs/fuzzing.md)
def test_corrupted_snapshot_metadata_exits_2_naming_the_file(tmp_path, capsys):
    data = make_dataset(tmp_path / "in", train=3, validation=2)
    bad = data / "train/data-001.h5"
    raw = bytearray(bad.read_bytes())
    raw[16] = 0xFF  # h5py raised RuntimeError (object visitation failed) listing its datasets
    bad.write_bytes(bytes(raw))
    code = data_prep_main(["deepcam-convert", "--input", str(data), "--out", str(tmp_path / "out"), "--workers", "1"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and f"error: {bad}: not a readable HDF5 file (" in err, err
