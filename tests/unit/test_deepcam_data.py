"""deepcam.data: shapes, normalisation, sharding over ranks, tf.data == DALI, and the promised errors."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from common.runtime.config import build
from common.runtime.dist import DistEnv
from common.base.errors import BenchError
from deepcam.config import DeepCamDataConfig
from common.io.manifest import load_manifest
from common.io.formats.deepcam import read_stats
from deepcam.data import build_datasets, find_bad_record, normalization_constants, read_error, shard_split
from tests.conftest import require_dali
from tests.unit.test_deepcam_convert import convert, make_dataset

SAMPLE = (32, 48, 16)
TRAIN, VAL = 12, 6


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """12 train and 6 validation 32x48 snapshots."""
    return make_dataset(tmp_path_factory.mktemp("raw"), train=TRAIN, validation=VAL)


@pytest.fixture(scope="module")
def records(raw, tmp_path_factory) -> Path:
    """Uncompressed, 5 samples per file: train files of 5, 5, 2 records; validation 5, 1."""
    out = tmp_path_factory.mktemp("records")
    convert(raw, out, samples_per_file=5)
    return out


@pytest.fixture(scope="module")
def gzip_records(raw, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gzip")
    convert(raw, out, samples_per_file=5, compression="gzip")
    return out


def snapshots(raw: Path, split: str, normalization: str = "minmax") -> tuple[np.ndarray, np.ndarray]:
    """The split's fields normalised with numpy, (N, H, W, C) float32, and labels (N, H, W) int32, in name order."""
    stats = {}
    with h5py.File(raw / "stats.h5", "r") as f:
        stats = {k: f[f"climate/{k}"][()].astype(np.float64) for k in ("mean", "sqmean", "minval", "maxval")}
    if normalization == "minmax":
        shift, divisor = stats["minval"], stats["maxval"] - stats["minval"]
    else:
        shift, divisor = stats["mean"], np.sqrt(stats["sqmean"] - stats["mean"] ** 2)
    xs, ys = [], []
    for path in sorted((raw / split).glob("*.h5")):
        with h5py.File(path, "r") as f:
            xs.append((f["climate/data"][()] - shift.astype(np.float32)) / divisor.astype(np.float32))
            ys.append(f["climate/labels_0"][()].astype(np.int32))
    return np.stack(xs), np.stack(ys)


def take(dataset, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    it = iter(dataset)
    return [tuple(np.asarray(t) for t in next(it)) for _ in range(steps)]


def sample_ids(batches, reference: np.ndarray) -> list[int]:
    """Which reference sample each batch row is (by exact equality)."""
    ids = []
    for x, _ in batches:
        for row in x:
            (match,) = [i for i, r in enumerate(reference) if np.array_equal(r, row)]
            ids.append(match)
    return ids


def datasets(directory: Path, rank: int = 0, size: int = 1, batch: int = 2, **cfg):
    cfg = DeepCamDataConfig(dir=str(directory), **{"shuffle": False, **cfg})
    return build_datasets(cfg, SAMPLE, batch, DistEnv(rank=rank, size=size), seed=3)


# ---------------------------------------------------------------------------- tensors
@pytest.mark.parametrize("normalization", ["minmax", "meanstd"])
def test_batches_are_the_normalised_snapshots_in_order(raw, records, normalization):
    data = datasets(records, normalization=normalization)
    assert (data.train_steps, data.val_steps, data.train_samples, data.val_samples) == (6, 3, TRAIN, VAL)
    for split, dataset, steps in (("train", data.train, 6), ("validation", data.val, 3)):
        expected_x, expected_y = snapshots(raw, split, normalization)
        batches = take(dataset, steps + 1)  # one past the epoch: it starts again
        for step, (x, y) in enumerate(batches):
            assert x.shape == (2, *SAMPLE) and x.dtype == np.float32
            assert y.shape == (2, 32, 48) and y.dtype == np.int32
            rows = slice(2 * (step % steps), 2 * (step % steps) + 2)
            np.testing.assert_array_equal(x, expected_x[rows])  # the same float32 operations
            np.testing.assert_array_equal(y, expected_y[rows])
    x = np.concatenate([b[0] for b in take(data.train, 6)])
    if normalization == "minmax":  # the stats come from the train fields: exactly [0, 1] over the split
        assert x.min() == pytest.approx(0, abs=1e-6) and x.max() == pytest.approx(1, abs=1e-6)
    else:
        assert np.abs(x.mean(axis=(0, 1, 2))).max() < 1e-4 and np.allclose(x.std(axis=(0, 1, 2)), 1, atol=1e-3)


def test_gzip_records_read_the_same(records, gzip_records):
    plain, gzip = datasets(records), datasets(gzip_records)
    for a, b in zip(take(plain.train, 7) + take(plain.val, 3), take(gzip.train, 7) + take(gzip.val, 3)):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_shuffled_epochs_cover_the_block_in_new_orders(raw, records):
    data = datasets(records, shuffle=True, shuffle_buffer=4)
    reference, _ = snapshots(raw, "train")
    ids = sample_ids(take(data.train, 3 * data.train_steps), reference)
    epochs = [ids[i * TRAIN:(i + 1) * TRAIN] for i in range(3)]
    assert all(sorted(e) == list(range(TRAIN)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3 and epochs[0] != list(range(TRAIN))
    again = sample_ids(take(datasets(records, shuffle=True, shuffle_buffer=4).train, data.train_steps), reference)
    assert again == epochs[0]  # seeded


# ---------------------------------------------------------------------------- sharding
@pytest.mark.parametrize("batch", [2, 3])
def test_two_ranks_split_the_train_set_without_overlap(raw, records, batch):
    reference, _ = snapshots(raw, "train")
    blocks = []
    for rank in (0, 1):
        data = datasets(records, rank=rank, size=2, batch=batch)
        assert data.train_steps * batch == 6 and data.train_samples == TRAIN
        blocks.append(sample_ids(take(data.train, data.train_steps), reference))
    assert blocks == [list(range(6)), list(range(6, 12))]  # the whole split, no sample twice


@pytest.mark.parametrize("size, batch, blocks", [(2, 3, [[0, 1, 2], [3, 4, 5]]),
                                                 (4, 2, [[0, 1], [2, 3], [4], [5]]),
                                                 (2, 2, [[0, 1, 2], [3, 4, 5]])])
def test_validation_is_split_across_ranks_and_every_sample_evaluated(raw, records, size, batch, blocks):
    """The 6 validation samples over `size` ranks: all of them, each once, in blocks whose last batch may be
    partial; eval_samples (Datasets.val_samples) is the 6 evaluated."""
    reference, _ = snapshots(raw, "validation")
    for rank in range(size):
        data = datasets(records, rank=rank, size=size, batch=batch, shuffle=True)  # validation is never shuffled
        assert data.val_samples == VAL and data.val_rank_samples == len(blocks[rank])
        assert data.val_steps == -(-len(blocks[rank]) // batch)
        for _ in range(2):  # every evaluation reads the same block
            assert sample_ids(take(data.val, data.val_steps), reference) == blocks[rank]


def test_blocks_cut_across_files(records):
    manifest = load_manifest(records)  # train files of 5, 5 and 2 records

    def pieces(rank, size, batch):
        shard = shard_split(manifest, "train", rank, size, batch)
        return shard.samples, [(Path(path).stem, start, count) for path, (start, count) in zip(shard.files, shard.runs)]

    assert pieces(1, 2, 2) == (6, [("part_000001", 1, 4), ("part_000002", 0, 2)])
    # 6 per rank rounded down to batches of 4: records 0-3 and 4-7, the last 4 left out
    assert pieces(0, 2, 4) == (4, [("part_000000", 0, 4)])
    assert pieces(1, 2, 4) == (4, [("part_000000", 4, 1), ("part_000001", 0, 3)])
    assert pieces(2, 3, 1) == (4, [("part_000001", 3, 2), ("part_000002", 0, 2)])


# ---------------------------------------------------------------------------- tf.data == DALI
@pytest.mark.parametrize("rank, size, batch", [(0, 1, 4), (0, 2, 2), (1, 2, 2), (1, 2, 3), (2, 4, 2), (3, 4, 2)])
def test_tfdata_and_dali_give_identical_batches(records, rank, size, batch):
    require_dali()
    loaded = {}
    for loader in ("tfdata", "dali"):
        data = datasets(records, rank=rank, size=size, batch=batch, loader=loader)
        loaded[loader] = take(data.train, 2 * data.train_steps + 1) + take(data.val, 2 * data.val_steps)
    assert len(loaded["tfdata"]) == len(loaded["dali"]) > 3
    for (xa, ya), (xb, yb) in zip(loaded["tfdata"], loaded["dali"]):
        assert xb.dtype == np.float32 and yb.dtype == np.int32 and xb.shape[1:] == SAMPLE and len(xb) <= batch
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def test_shuffled_dali_reads_only_its_block(raw, records):
    require_dali()
    reference, _ = snapshots(raw, "train")
    data = datasets(records, rank=1, size=2, batch=2, loader="dali", shuffle=True, shuffle_buffer=4)
    ids = sample_ids(take(data.train, 2 * data.train_steps), reference)
    assert set(ids) == set(range(6, 12)) and ids != sorted(ids)


# ---------------------------------------------------------------------------- errors
def _copy(records: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(records, tmp_path / "copy"))


def _edit_manifest(root: Path, **changes) -> None:
    obj = json.loads((root / "manifest.json").read_text())
    obj.update(changes)
    (root / "manifest.json").write_text(json.dumps(obj))


@pytest.mark.parametrize("kwargs, message", [
    (dict(size=7, batch=1), r"the validation split has 6 samples for 7 ranks; every rank needs at least one"),
    (dict(batch=13), r"the train split has 12 samples, fewer than ranks x local batch = 1 x 13 = 13"),
])
def test_split_too_small_for_ranks_and_batch(records, kwargs, message):
    with pytest.raises(BenchError, match=message):
        datasets(records, **kwargs)


def test_missing_directory_and_manifest(tmp_path):
    with pytest.raises(BenchError, match=f"{tmp_path / 'nope'}: dataset directory not found"):
        datasets(tmp_path / "nope")
    with pytest.raises(BenchError, match=f"{tmp_path}: the directory exists but has no manifest.json"):
        datasets(tmp_path)


def test_wrong_format_id(records, tmp_path):
    root = _copy(records, tmp_path)
    _edit_manifest(root, format="cosmoflow-tfrecord")
    with pytest.raises(BenchError, match="format 'cosmoflow-tfrecord', expected 'deepcam-tfrecord'"):
        datasets(root)


def test_manifest_without_the_label_map_description(records, tmp_path):
    root = _copy(records, tmp_path)
    obj = json.loads((root / "manifest.json").read_text())
    del obj["target_dtype"]
    (root / "manifest.json").write_text(json.dumps(obj))
    with pytest.raises(BenchError, match=r"manifest.json: key target_dtype = None: expected set together with "
                                         r"target_shape \(found \(32, 48\)\)"):
        datasets(root)
    del obj["target_shape"]
    (root / "manifest.json").write_text(json.dumps(obj))
    with pytest.raises(BenchError, match=r"manifest.json: sample_dtype 'float32', sample_shape \[32, 48, 16\], target "
                                         r"None None, expected 'float32' fields of shape \[32, 48, 16\] and a "
                                         r"'uint8' \[32, 48\] label map; reconvert with deepcam-convert"):
        datasets(root)


def test_image_shape_differs_from_the_config(records):
    cfg = DeepCamDataConfig(dir=str(records))
    with pytest.raises(BenchError, match=r"samples have shape \[32, 48, 16\] \(H, W, C\), but the config expects "
                                         r"\[64, 96, 16\]"):
        build_datasets(cfg, (64, 96, 16), 2, DistEnv(), seed=0)
    with pytest.raises(BenchError, match=r"image shape \[32, 48\]: expected \[H, W, 16\]"):
        build_datasets(cfg, (32, 48), 2, DistEnv(), seed=0)


def test_dali_on_gzip_records_is_refused(gzip_records):
    with pytest.raises(BenchError, match="records are gzip-compressed, but DALI's TFRecord reader .* --compression none"):
        datasets(gzip_records, loader="dali")


def test_expected_sample_counts(records):
    with pytest.raises(BenchError, match=r"the train split has 12 samples, but the config expects 121266 "
                                         r"\(data.train_samples\)"):
        datasets(records, train_samples=121266)
    assert datasets(records, train_samples=12, val_samples=6).val_samples == 6


def test_changed_stats_file_is_refused(records, tmp_path):
    root = _copy(records, tmp_path)
    with h5py.File(root / "stats.h5", "r+") as f:
        f["climate/maxval"][0] = 99.0
    with pytest.raises(BenchError, match=f"{root / 'stats.h5'}: xxh3_128 [0-9a-f]{{32}}, the manifest says"):
        datasets(root)
    (root / "stats.h5").unlink()
    with pytest.raises(BenchError, match=f"{root / 'stats.h5'}: listed in the manifest as 'stats' but missing"):
        datasets(root)


def test_missing_truncated_or_misindexed_record_files_are_refused(records, tmp_path):
    root = _copy(records, tmp_path)
    train = load_manifest(root).splits["train"].files
    (root / train[1].path).unlink()
    with pytest.raises(BenchError, match=f"{root / train[1].path}: listed in the manifest \\(train split\\) but "
                                         f"missing"):
        datasets(root)
    shutil.copy(records / train[1].path, root / train[1].path)
    (root / train[0].path).write_bytes((records / train[0].path).read_bytes()[:-10])
    with pytest.raises(BenchError, match=f"{root / train[0].path}: {train[0].bytes - 10} bytes, the manifest says "
                                         f"{train[0].bytes}"):
        datasets(root)
    shutil.copy(records / train[0].path, root / train[0].path)
    index = root / train[2].index
    index.write_text(index.read_text() + "0 16\n")  # one line more than the file has records
    with pytest.raises(BenchError, match=f"{index}: {train[2].records + 1} index lines, expected "
                                         f"{train[2].records}"):
        datasets(root)


def test_a_channel_without_spread_is_refused(records):
    stats = read_stats(records / "stats.h5")
    stats["maxval"][5] = stats["minval"][5]
    with pytest.raises(BenchError, match=r"s.h5: channel 5 has maxval - minval = 0.0, so minmax normalisation"):
        normalization_constants(stats, "minmax", "s.h5")
    stats["sqmean"][2] = stats["mean"][2] ** 2
    with pytest.raises(BenchError, match=r"channel 2 has sqrt\(sqmean - mean\^2\) = 0.0"):
        normalization_constants(stats, "meanstd")


@pytest.mark.parametrize("raw_cfg, message", [
    ({"shuffle_buffer": 0}, "config key data.shuffle_buffer = 0: expected >= 1"),
    ({"normalization": "zscore"}, r"data.normalization = 'zscore': expected one of \['minmax', 'meanstd'\]"),
    ({"loader": "torch"}, r"data.loader = 'torch': expected one of \['auto', 'tfdata', 'dali'\]"),
    ({"val_samples": -1}, "data.val_samples = -1: expected >= 0"),
    ({"shufle": True}, "unknown key.* data.shufle; valid keys: dir, stage_dir, stage_mode"),
])
def test_config_is_validated(raw_cfg, message):
    with pytest.raises(BenchError, match=message):
        build(DeepCamDataConfig, raw_cfg, prefix="data.")
    assert build(DeepCamDataConfig, {"loader": "dali", "normalization": "meanstd"}).loader == "dali"


def test_read_error_names_the_corrupt_file_and_record(records, tmp_path):
    import tensorflow as tf
    root = _copy(records, tmp_path)
    manifest = load_manifest(root)
    entry = manifest.splits["train"].files[1]
    offset, _ = [tuple(map(int, line.split())) for line in (root / entry.index).read_text().splitlines()][2]
    with open(root / entry.path, "r+b") as f:  # one payload byte of record 2: its CRC no longer matches
        f.seek(offset + 100)
        byte = f.read(1)
        f.seek(offset + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    cfg = DeepCamDataConfig(dir=str(root), shuffle=False, loader="tfdata")  # DALI checks no record CRC
    data = build_datasets(cfg, SAMPLE, 2, DistEnv(), seed=0)  # sizes still match the manifest
    with pytest.raises(tf.errors.DataLossError) as err:
        take(data.train, data.train_steps)
    message = str(read_error(cfg, 2, DistEnv(), err.value))
    assert message.startswith(f"{root / entry.path}: corrupt or truncated TFRecord at record 2 (")
    assert "reconvert it" in message
    intact = read_error(DeepCamDataConfig(dir=str(records)), 2, DistEnv(), RuntimeError("boom"))
    assert str(intact).startswith("reading the DeepCAM records failed (boom); every record of the 5 files")
    # DALI's reader does not check record CRCs; the xxh3-128 of data.verify_checksums catches the byte, and
    # unset (auto) it is checked whenever DALI reads.
    for verify in (True, None):
        with pytest.raises(BenchError, match=f"{root / entry.path}: xxh3_128 [0-9a-f]{{32}}, the manifest says"):
            build_datasets(dataclasses.replace(cfg, loader="dali", verify_checksums=verify), SAMPLE, 2, DistEnv(),
                           seed=0)
    build_datasets(dataclasses.replace(cfg, loader="dali", verify_checksums=False), SAMPLE, 2, DistEnv(), seed=0)


def test_corrupted_stats_metadata_names_the_file(records, tmp_path):
    # Found by fuzzing (tests/fuzz/test_hdf5_fuzz.py): h5py raised RuntimeError listing the group.
    path = tmp_path / "stats.h5"
    raw = bytearray((records / "stats.h5").read_bytes())
    raw[1096] = 0x00
    path.write_bytes(bytes(raw))
    with pytest.raises(BenchError, match=f"{path}: not a readable HDF5 file \\(.*\\); it is truncated, corrupt"):
        read_stats(path)


def test_a_record_that_is_no_example_is_named(records, tmp_path):
    # Found by fuzzing (tests/fuzz/test_records_fuzz.py): TensorFlow's error quotes the undecodable payload and
    # surfaced as UnicodeDecodeError from the diagnosis itself.
    from data_prep import tfrecords
    path = tmp_path / "f.tfrecord"
    tfrecords.write_record_file(path, [b"\x80\x81\xff"])
    message = find_bad_record([str(path)], load_manifest(records))
    assert message.startswith(f"{path}: record 0 is not a tf.train.Example (its bytes do not parse as one)")
