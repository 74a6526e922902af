"""cosmo-convert: HDF5 universes -> TFRecord sub-cubes, DALI indexes, manifest; splits, resume, bad input."""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from common.base.errors import BenchError
from common.io.manifest import check_split_files, load_manifest, xxh3_128_file
from common.io import tfrecord
from data_prep import cosmo_convert, tfrecords
from tests.conftest import require_dali


def make_universe(path: Path, size: int = 8, seed: int = 0, dtype="int16", channels: int = 4,
                  shape=None, datasets=("full", "unitPar"), high: int = 50) -> Path:
    """A tiny universe file: random counts in `full`, random `unitPar` in [-1, 1]."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        if "full" in datasets:
            f["full"] = rng.integers(0, high, size=shape or (size, size, size, channels)).astype(dtype)
        if "unitPar" in datasets:
            f["unitPar"] = rng.uniform(-1, 1, size=4).astype(np.float32)
    return path


def make_universes(directory: Path, count: int, size: int = 8) -> Path:
    for i in range(count):
        make_universe(directory / f"universe_{i:06d}.h5", size=size, seed=i)
    return directory


def convert(input_dir: Path, out: Path, sample_size: int = 4, compression: str = "none", val_universes=None,
            val_fraction: float = 0.2, seed: int = 0, workers: int = 1) -> int:
    args = argparse.Namespace(input=input_dir, out=out, sample_size=sample_size, compression=compression,
                              gzip_level=6, val_fraction=val_fraction, val_universes=val_universes, seed=seed,
                              workers=workers)
    return cosmo_convert.run(args)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root (hidden ones included), relative path -> content."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def read_samples(path: Path, compression: str, n: int):
    import tensorflow as tf
    features = {"x": tf.io.FixedLenFeature([], tf.string), "y": tf.io.FixedLenFeature([4], tf.float32)}
    for record in tf.data.TFRecordDataset(str(path), compression_type="GZIP" if compression == "gzip" else ""):
        example = tf.io.parse_single_example(record, features)
        x = tf.reshape(tf.io.decode_raw(example["x"], tf.int16, little_endian=True), (n, n, n, 4))
        yield x.numpy(), example["y"].numpy()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Five 8^3 universes: with --sample-size 4, 8 samples each."""
    return make_universes(tmp_path_factory.mktemp("universes"), 5)


# ---------------------------------------------------------------------------- records and indexes
@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_records_are_the_subcubes_in_c_order(inputs, tmp_path, compression, capsys):
    assert convert(inputs, tmp_path, compression=compression, val_universes=2) == 0
    assert "train 24 samples (3 universes), validation 16 samples (2 universes)" in capsys.readouterr().out
    manifest = load_manifest(tmp_path, expected_format="cosmoflow-tfrecord")
    assert (manifest.sample_shape, manifest.sample_dtype, manifest.compression) == ((4, 4, 4, 4), "int16",
                                                                                    compression)
    for split in ("train", "validation"):
        check_split_files(manifest, split, verify_checksums=True)
        for entry in manifest.splits[split].files:
            assert (entry.index is None) == (compression == "gzip")
            assert entry.xxh3_128 == xxh3_128_file(tmp_path / entry.path)
            assert entry.index_xxh3_128 == (None if entry.index is None else xxh3_128_file(tmp_path / entry.index))
            with h5py.File(inputs / (Path(entry.path).stem + ".h5"), "r") as f:
                full, unit = f["full"][()], f["unitPar"][()]
            samples = list(read_samples(tmp_path / entry.path, compression, 4))
            assert len(samples) == entry.records == 8
            for i, (x, y) in enumerate(samples):
                a, b, c = np.unravel_index(i, (2, 2, 2))  # C order over the grid of cubes
                np.testing.assert_array_equal(x, full[4 * a:4 * a + 4, 4 * b:4 * b + 4, 4 * c:4 * c + 4])
                np.testing.assert_array_equal(y, unit)


def test_index_matches_the_framing(inputs, tmp_path):
    convert(inputs, tmp_path, sample_size=2, val_universes=1)
    manifest = load_manifest(tmp_path)
    for entry in manifest.splits["train"].files + manifest.splits["validation"].files:
        index = tfrecord.read_index(tmp_path / entry.index)
        assert index == tfrecord.read_framing(tmp_path / entry.path)  # offsets of the length headers
        assert len(index) == entry.records == 64
        assert index[-1][0] + index[-1][1] == entry.bytes


def test_dali_reads_the_records_with_the_index(inputs, tmp_path):
    require_dali("nvidia.dali")
    import nvidia.dali.fn as fn
    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import pipeline_def, types
    convert(inputs, tmp_path, val_universes=1)
    entry = load_manifest(tmp_path).splits["train"].files[0]

    @pipeline_def(batch_size=8, num_threads=1, device_id=None)
    def pipeline():
        record = fn.readers.tfrecord(path=[str(tmp_path / entry.path)], index_path=[str(tmp_path / entry.index)],
                                     features={"x": tfrec.FixedLenFeature((), tfrec.string, ""),
                                               "y": tfrec.FixedLenFeature([4], tfrec.float32, 0.0)})
        return fn.reinterpret(record["x"], dtype=types.INT16, shape=[4, 4, 4, 4]), record["y"]

    pipe = pipeline()
    pipe.build()
    x, y = pipe.run()
    with h5py.File(inputs / (Path(entry.path).stem + ".h5"), "r") as f:
        full, unit = f["full"][()], f["unitPar"][()]
    for i in range(8):
        a, b, c = np.unravel_index(i, (2, 2, 2))
        np.testing.assert_array_equal(np.array(x[i]), full[4 * a:4 * a + 4, 4 * b:4 * b + 4, 4 * c:4 * c + 4])
        np.testing.assert_array_equal(np.array(y[i]), unit)


def test_manifest_records_log_count_statistics_of_the_training_universes(inputs, tmp_path):
    convert(inputs, tmp_path, val_universes=2, workers=2)
    manifest = load_manifest(tmp_path)
    train = [inputs / f"{e.path.split('/')[-1].replace('.tfrecord', '.h5')}" for e in manifest.splits["train"].files]
    values = np.concatenate([np.log1p(h5py.File(p, "r")["full"][...].astype(np.float64)).reshape(-1, 4)
                             for p in train])
    stats = manifest.input_stats
    assert stats["transform"] == "log1p" and stats["universes"] == 3 and stats["cells_per_channel"] == len(values)
    np.testing.assert_allclose(stats["mean"], values.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(stats["std"], values.std(axis=0), rtol=1e-5)


def test_negative_counts_are_refused(tmp_path):
    make_universes(tmp_path / "in", 3)
    with h5py.File(tmp_path / "in/universe_000002.h5", "r+") as f:
        f["full"][5, 0, 0, 1] = -3
    with pytest.raises(BenchError, match=r"universe_000002.h5: 'full' holds negative values \(min -3\) in planes 4-7"):
        convert(tmp_path / "in", tmp_path / "out", val_universes=0)
    assert not (tmp_path / "out/manifest.json").exists()


def test_serialized_example_parses_in_tensorflow():
    import tensorflow as tf
    record = tfrecords.serialize_example({"x": b"\x01\x02", "y": np.float32([0.5, -1]), "z": np.int32([7])})
    example = tf.train.Example.FromString(record)
    assert example.features.feature["x"].bytes_list.value == [b"\x01\x02"]
    assert list(example.features.feature["y"].float_list.value) == [0.5, -1.0]
    assert list(example.features.feature["z"].int64_list.value) == [7]


def test_integer_input_that_fits_int16_gives_the_same_records(tmp_path):
    for dtype, directory in (("int16", "a"), ("uint32", "b")):
        make_universe(tmp_path / directory / "universe_000000.h5", dtype=dtype)
        big_endian = ">i2" if dtype == "int16" else dtype
        make_universe(tmp_path / directory / "universe_000001.h5", seed=1, dtype=big_endian)
        convert(tmp_path / directory, tmp_path / f"out_{directory}", val_universes=1)
    a, b = tree(tmp_path / "out_a"), tree(tmp_path / "out_b")
    assert {k: v for k, v in a.items() if k.endswith((".tfrecord", ".idx"))} == \
        {k: v for k, v in b.items() if k.endswith((".tfrecord", ".idx"))}


# ---------------------------------------------------------------------------- splits
def test_split_by_universe_is_seeded(tmp_path):
    universes = [cosmo_convert.Universe(Path(f"u{i:02d}.h5"), 8, 0, 0, (0.0,) * 4) for i in range(20)]
    splits = cosmo_convert.split_universes(universes, 4, seed=1)
    train, val = ({u.name for u in splits[s]} for s in ("train", "validation"))
    assert len(val) == 4 and not train & val and train | val == {u.name for u in universes}
    assert cosmo_convert.split_universes(universes[::-1], 4, seed=1) == splits  # input order does not matter
    assert cosmo_convert.split_universes(universes, 4, seed=2) != splits


@pytest.mark.parametrize("fraction, count, expected", [(0.2, None, 2), (0.01, None, 1), (0.0, None, 0),
                                                       (0.25, None, 3), (0.5, 3, 3)])
def test_validation_count(fraction, count, expected):
    assert cosmo_convert.validation_count(10, fraction, count, Path("in")) == expected


def test_validation_must_leave_training_universes():
    with pytest.raises(BenchError, match="in: 3 universes, and 3 for validation would leave none"):
        cosmo_convert.validation_count(3, 0.2, 3, Path("in"))


def test_output_is_independent_of_workers_and_gzip_is_deterministic(inputs, tmp_path):
    convert(inputs, tmp_path / "one", compression="gzip", val_universes=2, seed=3, workers=1)
    convert(inputs, tmp_path / "two", compression="gzip", val_universes=2, seed=3, workers=2)  # spawned processes
    one, two = tree(tmp_path / "one"), tree(tmp_path / "two")
    assert one == two
    train = {Path(f.path).name for f in load_manifest(tmp_path / "one").splits["train"].files}
    validation = {Path(f.path).name for f in load_manifest(tmp_path / "one").splits["validation"].files}
    assert len(train) == 3 and len(validation) == 2 and not train & validation


# ---------------------------------------------------------------------------- resume
@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_resume_after_interruption_is_byte_identical(inputs, tmp_path, compression):
    clean, resumed = tmp_path / "clean", tmp_path / "resumed"
    convert(inputs, clean, compression=compression)
    convert(inputs, resumed, compression=compression)
    manifest = load_manifest(resumed)
    lost, kept = manifest.splits["train"].files[0], manifest.splits["train"].files[1]
    # The state an interruption leaves: no manifest, a universe missing, a half-written temporary.
    (resumed / "manifest.json").unlink()
    (resumed / lost.path).unlink()
    (resumed / "train" / f".{Path(lost.path).name}.tmp-99999").write_bytes(b"partial")
    kept_stat = (resumed / kept.path).stat()
    convert(inputs, resumed, compression=compression)
    assert tree(resumed) == tree(clean)
    assert (resumed / kept.path).stat().st_mtime_ns == kept_stat.st_mtime_ns  # finished files not rewritten


KILLABLE = """
import argparse, sys
from data_prep import cosmo_convert
parser = argparse.ArgumentParser()
cosmo_convert.add_arguments(parser)
sys.exit(cosmo_convert.run(parser.parse_args()))
"""


def test_resume_after_the_process_is_killed(tmp_path):
    inputs = make_universes(tmp_path / "in", 4, size=64)  # gzip: a few tenths of a second per universe
    out = tmp_path / "killed"
    argv = ["--input", inputs, "--out", out, "--sample-size", "32", "--compression", "gzip", "--workers", "1"]
    proc = subprocess.Popen([sys.executable, "-c", KILLABLE, *map(str, argv)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def mid_file() -> bool:  # one universe finished, the next one half-written
        return bool(list(out.glob("*/*.tfrecord")) and list(out.glob("*/.*.tmp-*")))

    try:
        deadline = time.monotonic() + 120
        while not mid_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # no clean-up: as when a node fails or a job is killed
        proc.wait()
    assert not (out / "manifest.json").exists(), "the conversion finished before it could be killed"
    assert list(out.glob("*/.*.tmp-*")), "killed with no file half-written"
    convert(inputs, out, compression="gzip", sample_size=32)
    convert(inputs, tmp_path / "clean", compression="gzip", sample_size=32)
    assert tree(out) == tree(tmp_path / "clean")


def test_rerun_on_a_finished_dataset_changes_nothing(inputs, tmp_path, capsys):
    convert(inputs, tmp_path)
    before = tree(tmp_path)
    convert(inputs, tmp_path)
    assert tree(tmp_path) == before
    last = capsys.readouterr().out.splitlines()[-1]
    assert "0 universes converted" in last and "5 universes reused" in last


def test_failure_mid_file_leaves_nothing_that_looks_finished(tmp_path):
    make_universe(tmp_path / "in/universe_000000.h5")
    bad = make_universe(tmp_path / "in/universe_000001.h5", dtype="int32")
    with h5py.File(bad, "r+") as f:
        f["full"][6, 0, 0, 0] = 40000  # in the second slab: the first samples are already written
    with pytest.raises(BenchError, match="universe_000001.h5: 'full' .* values from 0 to 40000 .* int16"):
        convert(tmp_path / "in", tmp_path / "out", val_universes=0)
    assert not (tmp_path / "out/manifest.json").exists()
    assert sorted(p.name for p in (tmp_path / "out/train").iterdir()) == \
        ["universe_000000.tfrecord", "universe_000000.tfrecord.idx"]


def test_rerun_with_other_settings_is_refused(inputs, tmp_path):
    convert(inputs, tmp_path, sample_size=4)
    with pytest.raises(BenchError, match="settings.sample_size = 4, but this run has settings.sample_size = 2"):
        convert(inputs, tmp_path, sample_size=2)
    with pytest.raises(BenchError, match="compression"):
        convert(inputs, tmp_path, compression="gzip")
    assert load_manifest(tmp_path).sample_shape == (4, 4, 4, 4)  # the finished dataset is untouched


def test_changed_input_is_refused(tmp_path):
    make_universes(tmp_path / "in", 3)
    convert(tmp_path / "in", tmp_path / "out")
    os.utime(tmp_path / "in/universe_000001.h5", ns=(1, 1))
    with pytest.raises(BenchError, match=r"inputs.universe_000001.h5.mtime_ns = \d+, but this run has .* = 1;"):
        convert(tmp_path / "in", tmp_path / "out")


def test_foreign_files_in_out_are_refused(inputs, tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train/universe_000000.tfrecord").write_bytes(b"old")
    with pytest.raises(BenchError, match="universe_000000.tfrecord but no .cosmo-convert.json"):
        convert(inputs, tmp_path)


# ---------------------------------------------------------------------------- bad input
def test_missing_input_directory(tmp_path):
    with pytest.raises(BenchError, match=f"{tmp_path / 'nope'}: input directory not found"):
        convert(tmp_path / "nope", tmp_path / "out")


def test_no_universe_files(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(BenchError, match=rf"{tmp_path}: no universe files \(\*.h5, \*.hdf5\)"):
        convert(tmp_path, tmp_path / "out")


@pytest.mark.parametrize("kwargs, message", [
    (dict(datasets=("unitPar",)), r"no dataset 'full' \(found \['unitPar'\]\)"),
    (dict(datasets=("full",)), r"no dataset 'unitPar' \(found \['full'\]\)"),
    (dict(shape=(8, 8, 4, 4)), r"'full' has shape \(8, 8, 4, 4\), expected \(N, N, N, 4\)"),
    (dict(channels=3), r"'full' has shape \(8, 8, 8, 3\), expected \(N, N, N, 4\)"),
    (dict(dtype="float32"), r"'full' has dtype float32, expected integer counts"),
    (dict(dtype="int32", high=70000),
     r"'full' \(int32\) holds values from \d+ to 6\d{4} in planes 0-3, outside -32768 to 32767"),
])
def test_bad_universe_file(tmp_path, kwargs, message):
    make_universe(tmp_path / "in/universe_000000.h5")
    bad = make_universe(tmp_path / "in/universe_000001.h5", **kwargs)
    with pytest.raises(BenchError, match=message) as err:
        convert(tmp_path / "in", tmp_path / "out", val_universes=0)
    assert str(bad) in str(err.value)


def test_not_an_hdf5_file(tmp_path):
    (tmp_path / "universe_000000.h5").write_bytes(b"not hdf5")
    with pytest.raises(BenchError, match="universe_000000.h5: not a readable HDF5 file"):
        convert(tmp_path, tmp_path / "out")


def test_universes_of_different_sizes(tmp_path):
    make_universe(tmp_path / "universe_000000.h5", size=8)
    make_universe(tmp_path / "universe_000001.h5", size=4)
    with pytest.raises(BenchError, match="universe_000001.h5: universe size 4, but universe_000000.h5 has 8"):
        convert(tmp_path, tmp_path / "out")


def test_sample_size_must_divide_the_universe(inputs, tmp_path):
    with pytest.raises(BenchError, match="universe_000000.h5: universe size 8 is not a multiple of "
                                         "--sample-size 3"):
        convert(inputs, tmp_path, sample_size=3)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cosmo-convert")
    cosmo_convert.add_arguments(parser)
    return parser.parse_args(argv)


def test_command_line(inputs, tmp_path):
    args = parse(["--input", str(inputs), "--out", str(tmp_path), "--sample-size", "8", "--val-universes", "1",
                  "--seed", "5", "--workers", "1"])
    assert cosmo_convert.run(args) == 0
    manifest = load_manifest(tmp_path)
    assert manifest.seed == 5 and manifest.source["universe_size"] == 8
    assert [s.samples for s in manifest.splits.values()] == [4, 1]


@pytest.mark.parametrize("argv, message", [
    (["--val-fraction", "0.1", "--val-universes", "1"], "not allowed with argument"),
    (["--val-fraction", "1.5"], "1.5 is not in \\[0, 1\\)"),
    (["--compression", "zstd"], "invalid choice: 'zstd'"),
    (["--workers", "0"], "0 is not a positive integer"),
    (["--gzip-level", "0"], "0 is not a zlib level 1-9"),
])
def test_command_line_rejects_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse(["--input", "in", "--out", "out", "--sample-size", "4", *argv])
    assert re.search(message, capsys.readouterr().err)


# ---------------------------------------------------------------------------- regressions found by fuzzing
# (tests/fuzz/test_hdf5_fuzz.py, docs/fuzzing.md)
def test_corrupted_metadata_names_the_file(tmp_path):
    make_universes(tmp_path / "in", 2)
    bad = tmp_path / "in/universe_000001.h5"
    data = bytearray(bad.read_bytes())
    data[16] = 0xFF  # the superblock's base address: h5py raised RuntimeError looking up 'full'
    bad.write_bytes(bytes(data))
    with pytest.raises(BenchError, match=f"{bad}: not a readable HDF5 file \\(.*\\); it is truncated, corrupt"):
        convert(tmp_path / "in", tmp_path / "out")


def test_a_corrupt_compressed_chunk_names_the_file(tmp_path):
    make_universes(tmp_path / "in", 2)
    bad = tmp_path / "in/universe_000001.h5"
    rng = np.random.default_rng(0)
    with h5py.File(bad, "w") as f:
        f.create_dataset("full", data=rng.integers(0, 50, (8, 8, 8, 4)).astype(np.int16), chunks=(2, 8, 8, 4),
                         compression="gzip")
        f["unitPar"] = np.zeros(4, np.float32)
        chunk = f["full"].id.get_chunk_info(1)
    data = bytearray(bad.read_bytes())
    data[chunk.byte_offset + chunk.size // 2] ^= 0xFF  # h5py raised OSError (inflate() failed) reading it
    bad.write_bytes(bytes(data))
    with pytest.raises(BenchError, match=f"{bad}: not a readable HDF5 file \\(Can't synchronously read data"):
        convert(tmp_path / "in", tmp_path / "out", val_universes=0)


def test_negative_counts_in_a_validation_universe_are_refused(tmp_path):
    make_universes(tmp_path / "in", 3)
    splits = cosmo_convert.split_universes(cosmo_convert.scan_universes(tmp_path / "in"), 1, seed=0)
    (victim,) = splits["validation"]
    with h5py.File(victim.path, "r+") as f:
        f["full"][6, 0, 0, 2] = -1
    # Validation universes are not part of the statistics, which were the only check of the counts' sign.
    with pytest.raises(BenchError, match=f"{victim.path}: 'full' holds negative values \\(min -1\\) in planes 4-7"):
        convert(tmp_path / "in", tmp_path / "out", val_universes=1, seed=0)
