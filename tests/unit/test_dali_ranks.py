"""The real DALI and tf.data pipelines of cosmoflow.data and deepcam.data on several ranks with shuffling: in every
epoch (exactly train_steps batches, no shuffle buffer reaching across its end) the ranks read disjoint samples
that together cover the split (less the remainder each builder documents), and each rank reads a new order every
epoch; for per-rank sharding and for data.stage_mode=node_share.

The ranks are simulated in one process through the builders' `DistEnv` (rank, size, node, local rank and size):
each builder sees only its own rank, as under horovodrun. Every record carries its sample's number: CosmoFlow's
target y[0], DeepCAM's every field value (stats.h5 makes the normalisation the identity).
"""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from common.io.manifest import AuxFile, Manifest, SplitEntry, xxh3_128_file
from common.io.manifest_write import sha256_file, write_manifest
from common.runtime.dist import DistEnv
from data_prep import tfrecords
from tests.conftest import require_dali

require_dali()  # DALI's TensorFlow plugin: a broken build fails these tests (tests/conftest.py)

TRAIN_FILES, VAL_FILES = 8, 4  # train: 8 files of 4 records (samples 0-31); validation: 4 files of 2
PER_TRAIN_FILE, PER_VAL_FILE = 4, 2
BATCH, EPOCHS = 2, 3
COSMO_SHAPE, DEEPCAM_SHAPE = (4, 4, 4, 4), (4, 4, 16)


def _write_split(root: Path, split: str, files: int, per_file: int, features) -> SplitEntry:
    entries = []
    for f in range(files):
        records = [tfrecords.serialize_example(features(f * per_file + i)) for i in range(per_file)]
        record_file = tfrecords.write_record_file(root / split / f"part_{f:03d}.tfrecord", records)
        entries.append(tfrecords.file_entry(record_file, root))
    return SplitEntry(samples=files * per_file, files=tuple(entries))


def _splits(root: Path, features) -> dict[str, SplitEntry]:
    return {"train": _write_split(root, "train", TRAIN_FILES, PER_TRAIN_FILE, features),
            "validation": _write_split(root, "validation", VAL_FILES, PER_VAL_FILE, features)}


@pytest.fixture(scope="module")
def cosmo_records(tmp_path_factory) -> Path:
    return write_cosmo_records(tmp_path_factory.mktemp("cosmo"))


@pytest.fixture(scope="module")
def deepcam_records(tmp_path_factory) -> Path:
    return write_deepcam_records(tmp_path_factory.mktemp("deepcam"))


def write_cosmo_records(root: Path) -> Path:
    """CosmoFlow records whose target y is (n, 0, 0, 0) for sample n (cube full of n)."""
    from common.io.formats import cosmoflow as fmt

    def features(n):
        return fmt.record_features(np.full(COSMO_SHAPE, n, np.int16), [n, 0, 0, 0])

    write_manifest(Manifest(root=root, format=fmt.FORMAT, version=fmt.VERSION, sample_shape=COSMO_SHAPE,
                            sample_dtype=fmt.SAMPLE_DTYPE, target_size=fmt.TARGET_SIZE, compression="none",
                            splits=_splits(root, features), source={"kind": "test"}), root)
    return root


def write_deepcam_records(root: Path) -> Path:
    """DeepCAM records whose fields are all n for sample n, with stats.h5 minval 0, maxval 1 (no rescaling)."""
    from common.io.formats import deepcam as fmt
    height, width, channels = DEEPCAM_SHAPE

    def features(n):
        return fmt.record_features(np.full(DEEPCAM_SHAPE, n, np.float32), np.zeros((height, width), np.uint8))

    root.mkdir(parents=True, exist_ok=True)
    stats = root / fmt.STATS_NAME
    with h5py.File(stats, "w") as f:
        for key, value in {"count": 1.0, "mean": 0.5, "sqmean": 0.5, "minval": 0.0, "maxval": 1.0}.items():
            f[f"{fmt.STATS_GROUP}/{key}"] = np.full(channels, value, np.float64)
    aux = AuxFile(path=fmt.STATS_NAME, bytes=stats.stat().st_size, sha256=sha256_file(stats),
                  xxh3_128=xxh3_128_file(stats))
    write_manifest(Manifest(root=root, format=fmt.FORMAT, version=fmt.VERSION, sample_shape=DEEPCAM_SHAPE,
                            sample_dtype=fmt.SAMPLE_DTYPE, target_size=height * width, target_shape=(height, width),
                            target_dtype=fmt.TARGET_DTYPE, compression="none", splits=_splits(root, features),
                            source={"kind": "test"}, aux_files={fmt.STATS_AUX: aux}), root)
    return root


def ranks(nodes: int, local_size: int) -> list[DistEnv]:
    return [DistEnv(rank=node * local_size + local, size=nodes * local_size, local_rank=local,
                    local_size=local_size, node=node) for node in range(nodes) for local in range(local_size)]


def _staging(node_share: bool) -> dict:
    # The builders read node_share's layout from the config; the staged copy is the dataset itself here.
    return {"stage_dir": "/unused", "stage_mode": "node_share"} if node_share else {}


def cosmo(records: Path, dist: DistEnv, node_share: bool, **cfg):
    from cosmoflow.config import CosmoDataConfig
    from cosmoflow.data import build_datasets
    cfg = CosmoDataConfig(**{"dir": str(records), "loader": "dali", "shuffle": True, "shuffle_buffer": 4,
                             **_staging(node_share), **cfg})
    return build_datasets(cfg, COSMO_SHAPE, BATCH, dist, seed=5)


def deepcam(records: Path, dist: DistEnv, node_share: bool, **cfg):
    from deepcam.config import DeepCamDataConfig
    from deepcam.data import build_datasets
    cfg = DeepCamDataConfig(**{"dir": str(records), "loader": "dali", "shuffle": True, "shuffle_buffer": 4,
                               **_staging(node_share), **cfg})
    return build_datasets(cfg, DEEPCAM_SHAPE, BATCH, dist, seed=5)


def cosmo_ids(batch) -> list[int]:
    return [int(v) for v in np.asarray(batch[1])[:, 0]]


def deepcam_ids(batch) -> list[int]:
    x = np.asarray(batch[0])  # (B, H, W, 16), every value the sample's number
    assert np.all(x == x[:, :1, :1, :1])
    return [int(v) for v in x[:, 0, 0, 0]]


def epochs(data, ids, count: int = EPOCHS) -> list[list[int]]:
    """The sample numbers one rank's training dataset gives in `count` epochs (train_steps batches each)."""
    it = iter(data.train)
    return [[n for _ in range(data.train_steps) for n in ids(next(it))] for _ in range(count)]


def check_epochs(runs: list[list[list[int]]], expected: list[int]) -> None:
    """Every epoch the ranks' samples are disjoint and exactly `expected`; each rank's order is shuffled and
    changes every epoch."""
    for epoch in range(EPOCHS):
        read = sorted(n for run in runs for n in run[epoch])
        assert read == expected, f"epoch {epoch}: the ranks read {read}, expected each of {expected} once"
    for rank, run in enumerate(runs):
        assert len({tuple(e) for e in run}) == EPOCHS, f"rank {rank} reads the same order twice: {run}"
        assert run[0] != sorted(run[0]), f"rank {rank} reads its samples in order: {run[0]}"


BUILDERS = {"cosmoflow": (cosmo, cosmo_ids, "cosmo_records"), "deepcam": (deepcam, deepcam_ids, "deepcam_records")}


# Per-rank sharding, where the ranks divide the split evenly: every sample once per epoch.
@pytest.mark.parametrize("loader", ["dali", "tfdata"])
@pytest.mark.parametrize("app", ["cosmoflow", "deepcam"])
def test_two_ranks_read_the_whole_split_once_per_epoch_in_new_orders(app, loader, request):
    build, ids, fixture = BUILDERS[app]
    records = request.getfixturevalue(fixture)
    runs = []
    for dist in ranks(1, 2):
        data = build(records, dist, node_share=False, loader=loader)
        assert data.loader == loader and data.train_steps == 16 // BATCH and data.train_samples == 32
        runs.append(epochs(data, ids))
    check_epochs(runs, list(range(32)))


def test_cosmoflow_drop_reads_whole_files_and_leaves_out_the_last_files_mod_ranks(cosmo_records):
    """8 files over 3 ranks with data.uneven_files=drop: files 6 and 7 (samples 24-31) are not read; each rank
    reads 2 files, 8 samples = 4 steps of 2; train_samples says the 24 read."""
    runs = []
    for dist in ranks(1, 3):
        data = cosmo(cosmo_records, dist, node_share=False, uneven_files="drop")
        assert (data.train_steps, data.train_samples) == (4, 24)
        runs.append(epochs(data, cosmo_ids))
    check_epochs(runs, list(range(24)))


def test_deepcam_leaves_out_the_tail_of_the_split_that_is_not_a_whole_batch_per_rank(deepcam_records):
    """32 samples over 3 ranks, batch 2: each rank reads a block of 32 // 3 = 10 (a multiple of the batch), so
    samples 30 and 31 are left out; 5 steps per rank; train_samples says the split's 32 (as the reference logs)."""
    runs = []
    for dist in ranks(1, 3):
        data = deepcam(deepcam_records, dist, node_share=False)
        assert (data.train_steps, data.train_samples) == (5, 32)
        run = epochs(data, deepcam_ids)
        assert all(set(e) == set(range(10 * dist.rank, 10 * dist.rank + 10)) for e in run)  # its block only
        runs.append(run)
    check_epochs(runs, list(range(30)))


@pytest.mark.parametrize("loader", ["dali", "tfdata"])
@pytest.mark.parametrize("app", ["cosmoflow", "deepcam"])
@pytest.mark.parametrize("nodes, local_size", [(1, 2), (2, 2)])
def test_node_share_ranks_read_the_whole_split_once_per_epoch_in_new_orders(app, nodes, local_size, loader,
                                                                            request):
    """Each node's ranks divide the node's files (node n holds files n, n + nodes, ...) afresh every epoch, so
    a rank's samples, not only their order, change between epochs, and nothing is left out (node_share refuses
    a split that does not divide)."""
    build, ids, fixture = BUILDERS[app]
    records = request.getfixturevalue(fixture)
    runs, per_node = [], {}
    for dist in ranks(nodes, local_size):
        data = build(records, dist, node_share=True, loader=loader)
        assert data.loader == loader and data.train_steps * BATCH * nodes * local_size == 32
        run = epochs(data, ids)
        node_samples = {n for f in range(dist.node, TRAIN_FILES, nodes) for n in range(4 * f, 4 * f + 4)}
        assert all(set(e) <= node_samples for e in run)  # only its node's share
        per_node.setdefault(dist.node, []).append(run)
        runs.append(run)
    check_epochs(runs, list(range(32)))
    for node_runs in per_node.values():
        first = node_runs[0]
        assert len({frozenset(e) for e in first}) > 1, "a rank reads the same samples every epoch"


@pytest.mark.parametrize("app", ["cosmoflow", "deepcam"])
@pytest.mark.parametrize("node_share", [False, True])
def test_a_rebuilt_stream_skipped_by_the_consumed_batches_continues_the_uninterrupted_one(app, node_share, request):
    """What an exact DALI resume can rest on: the stream is a function of the seed and the rank layout, so the
    same builder with the same seed, less the batches a checkpoint consumed (Progress.global_step), gives the
    batches the uninterrupted run reads next."""
    from common.runtime.checkpoint import Progress
    build, ids, fixture = BUILDERS[app]
    records = request.getfixturevalue(fixture)
    dist = ranks(1, 2)[1]
    straight = [n for epoch in epochs(build(records, dist, node_share), ids) for n in epoch]
    data = build(records, dist, node_share)
    consumed = Progress(epoch=2, step=3).global_step(data.train_steps)
    resumed = iter(data.train.skip(consumed))
    rest = [n for _ in range(EPOCHS * data.train_steps - consumed) for n in ids(next(resumed))]
    assert rest == straight[consumed * BATCH:]


@pytest.mark.parametrize("app", ["cosmoflow", "deepcam"])
@pytest.mark.parametrize("node_share", [False, True])
def test_a_tf_data_stream_restored_from_its_saved_iterator_continues_the_uninterrupted_one(app, node_share, request,
                                                                                           tmp_path):
    """What an exact tf.data resume rests on: the iterator saved inside epoch 2 (as checkpoints save it) and read
    into a rebuilt stream gives the uninterrupted stream's batches, across the next epoch's new orders too."""
    import tensorflow as tf
    build, ids, fixture = BUILDERS[app]
    records = request.getfixturevalue(fixture)
    dist = ranks(1, 2)[1]
    data = build(records, dist, node_share, loader="tfdata")
    straight = [n for epoch in epochs(data, ids) for n in epoch]
    consumed = data.train_steps + 3
    it = iter(build(records, dist, node_share, loader="tfdata").train)
    for _ in range(consumed):
        next(it)
    tf.train.Checkpoint(iterator=it).write(str(tmp_path / "input"))
    restored = iter(build(records, dist, node_share, loader="tfdata").train)
    tf.train.Checkpoint(iterator=restored).read(str(tmp_path / "input")).expect_partial()
    rest = [n for _ in range(EPOCHS * data.train_steps - consumed) for n in ids(next(restored))]
    assert rest == straight[consumed * BATCH:]


def test_cosmoflow_node_share_drop_reads_with_tf_data_and_leaves_out_different_files_each_epoch(cosmo_records):
    """8 files on one node of 3 ranks with data.uneven_files=drop and data.loader=auto: tf.data (DALI divides
    records, not files), 2 files = 8 samples = 4 steps a rank; each epoch 24 different samples, and the 2 files
    left over change between epochs; data.loader=dali is refused with the reason."""
    from common.base.errors import BenchError
    runs = []
    for dist in ranks(1, 3):
        data = cosmo(cosmo_records, dist, node_share=True, uneven_files="drop", loader="auto")
        assert (data.loader, data.train_steps, data.train_samples) == ("tfdata", 4, 24)
        it = iter(data.train)
        runs.append([[n for _ in range(data.train_steps) for n in cosmo_ids(next(it))] for _ in range(6)])
    left_out = []
    for epoch in range(6):
        read = [n for run in runs for n in run[epoch]]
        assert len(read) == len(set(read)) == 24
        left_out.append(frozenset(range(32)) - set(read))
    assert len(set(left_out)) > 1 and frozenset().union(*left_out) != frozenset(left_out[0])
    with pytest.raises(BenchError, match=r"data.loader=dali: .* 8 files for its 3 ranks"):
        cosmo(cosmo_records, ranks(1, 3)[0], node_share=True, uneven_files="drop")
