"""Sharding covers every sample exactly once per epoch, for several rank and node counts."""
from collections import Counter
from pathlib import Path

import pytest

from common.base.errors import BenchError
from common.io.manifest import FileEntry, Manifest, SplitEntry
from common.io.node_share import epoch_file_indices, local_files_dataset, node_share
from tests.conftest import require_dali


def manifest(files: int, records: int = 4, val_files: int = 4) -> Manifest:
    def split(name, count):
        entries = tuple(FileEntry(f"{name}/f{i:03d}.tfrecord", records, 100 * records, "0" * 64,
                                  f"{name}/f{i:03d}.tfrecord.idx", "0" * 64) for i in range(count))
        return SplitEntry(records * count, entries)
    return Manifest(root=Path("/data"), format="cosmoflow-tfrecord", version=1, sample_shape=(4, 4, 4, 4),
                    sample_dtype="int16", target_size=4, compression="none",
                    splits={"train": split("train", files), "validation": split("validation", val_files)}, source={})


@pytest.mark.parametrize("nodes,local_size", [(1, 1), (1, 2), (2, 2), (2, 3), (4, 2), (3, 1)])
def test_node_shares_read_every_record_once_per_epoch(nodes, local_size):
    m = manifest(files=nodes * local_size * 3)
    for epoch in range(3):
        read = Counter()
        for node in range(nodes):
            for local in range(local_size):
                share = node_share(m, "train", (node, nodes), (local, local_size), local_batch=4)
                picked = epoch_file_indices(len(share.files), local, local_size, seed=5, epoch=epoch, shuffle=True)
                assert sum(share.files[i].records for i in picked) == share.samples_per_rank
                read.update(share.files[i].path for i in picked)
        assert set(read.values()) == {1} and len(read) == len(m.splits["train"].files)
        assert share.global_samples == m.splits["train"].samples


def test_the_division_inside_a_node_changes_between_epochs_and_is_seeded():
    picks = [epoch_file_indices(12, 0, 3, seed=1, epoch=e, shuffle=True) for e in range(4)]
    assert len({tuple(p) for p in picks}) == 4
    assert picks[0] == epoch_file_indices(12, 0, 3, seed=1, epoch=0, shuffle=True)
    assert epoch_file_indices(12, 1, 3, seed=1, epoch=0, shuffle=False) == [4, 5, 6, 7]  # DALI's shard 1 of 3


def test_the_tf_data_division_is_the_planned_one():
    import tensorflow as tf
    files = [f"f{i}" for i in range(6)]
    got = [x.decode() for x in local_files_dataset(files, 1, 2, seed=3, shuffle=True).take(9).as_numpy_iterator()]
    expected = [files[i] for e in range(3) for i in epoch_file_indices(6, 1, 2, seed=3, epoch=e, shuffle=True)]
    assert got == expected
    pairs = local_files_dataset((files, tf.range(6, dtype=tf.int64).numpy()), 0, 2, seed=3, shuffle=False)
    assert [int(n) for _, n in pairs.take(3).as_numpy_iterator()] == [0, 1, 2]


@pytest.mark.parametrize("case,message", [
    (dict(files=10, nodes=4, local_size=1, batch=4), r"do not divide evenly between 4 nodes .*files per node \[3, 3, 2, 2\]"),
    (dict(files=6, nodes=2, local_size=2, batch=4), r"has 3 files, not a multiple of the 2 ranks per node"),
    (dict(files=8, nodes=2, local_size=2, batch=3), r"each rank reads 8 train samples .* not a multiple of the local batch size 3"),
])
def test_uneven_node_shares_are_refused(case, message):
    m = manifest(files=case["files"])
    with pytest.raises(BenchError, match=message):
        node_share(m, "train", (0, case["nodes"]), (0, case["local_size"]), case["batch"])


@pytest.mark.parametrize("files,nodes,local_size", [(7, 1, 2), (10, 4, 1), (11, 2, 3), (34, 1, 8)])
def test_dropped_node_shares_leave_out_different_files_each_epoch(files, nodes, local_size):
    """data.uneven_files=drop: equal samples per rank, no file twice in an epoch, and within a node the files
    left over change from epoch to epoch, so every file the nodes keep is read over a few epochs."""
    m = manifest(files=files)
    kept = files // nodes * nodes  # the node cut: files beyond the first nodes * (files // nodes) are not read
    per_rank = files // nodes // local_size
    seen = Counter()
    for epoch in range(12):
        read = Counter()
        for node in range(nodes):
            for local in range(local_size):
                share = node_share(m, "train", (node, nodes), (local, local_size), local_batch=4, drop=True)
                assert len(share.files) == files // nodes and share.samples_per_rank == per_rank * 4
                picked = epoch_file_indices(len(share.files), local, local_size, seed=5, epoch=epoch, shuffle=True)
                read.update(share.files[i].path for i in picked)
        assert set(read.values()) == {1} and len(read) == per_rank * local_size * nodes
        seen.update(read)
    assert set(seen) == {f"train/f{i:03d}.tfrecord" for i in range(kept)}


def test_without_drop_an_uneven_node_share_names_the_setting_that_allows_it():
    with pytest.raises(BenchError, match=r"has 7 files, not a multiple of the 2 ranks .*data.uneven_files=drop "
                                         r"leaves 1 of them out each epoch"):
        node_share(manifest(files=7), "train", (0, 1), (0, 2), 4)
    with pytest.raises(BenchError, match=r"has 1 files for its 2 ranks; each rank needs at least one file"):
        node_share(manifest(files=1), "train", (0, 1), (0, 2), 4, drop=True)


def test_dropped_node_shares_read_with_tf_data_not_dali():
    """DALI divides a node's records, so a node whose ranks do not divide its files reads with tf.data (auto) or is
    refused (data.loader=dali); shards that divide keep DALI."""
    from types import SimpleNamespace
    from common.io.input import rank_shards
    from common.io.node_share import node_share_loader
    from common.runtime.dist import DistEnv
    m = manifest(files=7, val_files=4)
    cfg = SimpleNamespace(stage_dir="/stage", stage_mode="node_share", uneven_files="drop")
    dist = DistEnv(rank=0, size=2, local_rank=0, local_size=2)
    shards = rank_shards(m, cfg, dist, 4, None)
    assert (shards["train"].samples, shards["train"].global_samples) == (12, 24) and len(shards["train"].files) == 7
    assert node_share_loader(m, "dali", "auto", shards, dist) == "tfdata"
    with pytest.raises(BenchError, match=r"data.loader=dali: each node's share of the train split has 7 files for "
                                         r"its 2 ranks .*DALI divides a node's records"):
        node_share_loader(m, "dali", "dali", shards, dist)
    even_manifest = manifest(files=8)
    even = rank_shards(even_manifest, cfg, dist, 4, None)
    assert node_share_loader(even_manifest, "dali", "dali", even, dist) == "dali"


@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
def test_cosmoflow_rank_shards_cover_every_file_once(ranks):
    from cosmoflow.data import files_read, shard_split
    m = manifest(files=16, val_files=8)
    for split in ("train", "validation"):
        shards = [shard_split(m, split, r, ranks, local_batch=4) for r in range(ranks)]
        files = Counter(f for s in shards for f in s.files)
        assert set(files.values()) == {1} and len(files) == len(m.splits[split].files)
        assert sum(s.samples for s in shards) == m.splits[split].samples
    staged = Counter(p for r in range(ranks) for p in files_read(m, r, ranks, 4))
    assert set(staged.values()) == {1} and len(staged) == 2 * (16 + 8)


def test_cosmoflow_refuses_a_rank_count_that_does_not_divide_the_files_unless_told_to_drop():
    from cosmoflow.data import shard_split
    m = manifest(files=16, records=4, val_files=8)
    with pytest.raises(BenchError, match=r"16 files give the 3 ranks unequal sample counts \[24, 20, 20\].*"
                                         r"data.uneven_files=drop"):
        shard_split(m, "train", 0, 3, local_batch=4)


@pytest.mark.parametrize("ranks", [3, 5, 6])
def test_cosmoflow_drop_leaves_out_the_last_files_mod_ranks_and_reads_the_rest_once(ranks):
    from cosmoflow.data import files_read, shard_split
    m = manifest(files=16, records=4, val_files=8)
    for split in ("train", "validation"):
        entries = m.splits[split].files
        kept = len(entries) - len(entries) % ranks
        shards = [shard_split(m, split, r, ranks, local_batch=4, drop=True) for r in range(ranks)]
        files = Counter(f for s in shards for f in s.files)
        assert set(files.values()) == {1}
        assert sorted(files) == sorted(str(m.root / e.path) for e in entries[:kept])
        assert {s.samples for s in shards} == {4 * (kept // ranks)}
        assert shards[0].global_samples == 4 * kept
    staged = Counter(p for r in range(ranks) for p in files_read(m, r, ranks, 4, drop=True))
    assert set(staged.values()) == {1} and len(staged) == 2 * (16 - 16 % ranks + 8 - 8 % ranks)


def test_cosmoflow_drop_changes_nothing_when_the_ranks_divide_the_files():
    from cosmoflow.data import shard_split
    m = manifest(files=16, val_files=8)
    for r in range(4):
        assert shard_split(m, "train", r, 4, 4, drop=True) == shard_split(m, "train", r, 4, 4)


@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_deepcam_rank_blocks_read_each_sample_at_most_once_and_leave_out_less_than_a_batch_per_rank(ranks):
    from deepcam.data import shard_split
    m = manifest(files=16, records=4, val_files=8)
    for split in ("train", "validation"):
        seen = Counter()
        for r in range(ranks):
            shard = shard_split(m, split, r, ranks, local_batch=2)
            offsets = {e.path: 4 * i for i, e in enumerate(m.splits[split].files)}
            for path, (start, count) in zip(shard.files, shard.runs):
                name = str(Path(path).relative_to(m.root))
                seen.update(range(offsets[name] + start, offsets[name] + start + count))
            assert shard.samples % 2 == 0
        total = m.splits[split].samples
        assert set(seen.values()) == {1} and total - len(seen) < ranks * 2


def _numbered_records(root: Path, files: int, per_file: int) -> tuple[list[str], list[str]]:
    """Record files whose records hold their global number (file * per_file + i), with DALI indexes."""
    import numpy as np
    from data_prep import tfrecords
    paths, indexes = [], []
    for f in range(files):
        records = [tfrecords.serialize_example({"n": np.array([f * per_file + i], np.float32)})
                   for i in range(per_file)]
        path = root / f"f{f}.tfrecord"
        record_file = tfrecords.write_record_file(path, records, "none")
        paths.append(str(record_file.path))
        indexes.append(str(record_file.index))
    return paths, indexes


def _dali_epochs(paths, indexes, reader_args: dict, batch: int, epochs: int) -> list[list[int]]:
    import numpy as np
    import nvidia.dali.fn as fn
    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None, seed=11)
    def pipeline():
        return fn.readers.tfrecord(path=paths, index_path=indexes, initial_fill=4, name="reader",
                                   features={"n": tfrec.FixedLenFeature([1], tfrec.float32, 0.0)},
                                   **reader_args)["n"]
    pipe = pipeline()
    pipe.build()
    steps = pipe.epoch_size("reader") // reader_args.get("num_shards", 1) // batch
    return [[int(np.array(t)[0]) for _ in range(steps) for t in pipe.run()[0]] for _ in range(epochs)]


@pytest.mark.parametrize("local_size", [1, 2])
def test_dali_reader_reads_every_sample_once_per_epoch_in_a_new_order(tmp_path, local_size):
    require_dali("nvidia.dali")
    from common.io.input import dali_reader_sharding
    paths, indexes = _numbered_records(tmp_path, files=4, per_file=8)
    runs = [_dali_epochs(paths, indexes, dali_reader_sharding(
        None if local_size == 1 else (rank, local_size), 5, shuffle=True), batch=4, epochs=4)
        for rank in range(local_size)]
    for epoch in range(4):
        read = [n for run in runs for n in run[epoch]]
        assert sorted(read) == list(range(32)), f"epoch {epoch}"  # each sample once across the ranks
    orders = [tuple(runs[0][epoch]) for epoch in range(4)]
    assert len(set(orders)) == 4 and orders[0] != tuple(sorted(orders[0]))  # shuffled, anew every epoch
    first_files = {order[0] // 8 for order in orders}
    assert len(first_files) > 1  # the file order changes too, not only the draws from the buffer


@pytest.mark.parametrize("app", ["cosmoflow", "deepcam"])
def test_files_read_names_a_missing_split(app):
    # data.stage_mode=rank plans from files_read before the loaders check the splits (found by fuzzing).
    import importlib
    files_read = importlib.import_module(f"{app}.data").files_read
    m = manifest(files=4, val_files=2)
    del m.splits["validation"]
    with pytest.raises(BenchError, match="no 'validation' split \\(found \\['train'\\]\\)"):
        files_read(m, 0, 2, 2)


def test_node_share_shards_are_cut_by_the_io_layer_not_the_applications_split():
    from types import SimpleNamespace
    from common.io.input import rank_shards
    from common.runtime.dist import DistEnv
    m = manifest(files=8, val_files=4)
    cfg = SimpleNamespace(stage_dir="/stage", stage_mode="node_share")

    def split(_):
        raise AssertionError("data.stage_mode=node_share does not call the application's split")

    shards = rank_shards(m, cfg, DistEnv(rank=1, size=2, local_rank=1, local_size=2), 4, split)
    train, val = shards["train"], shards["validation"]
    assert train.files == tuple(f"/data/train/f{i:03d}.tfrecord" for i in range(8)) and train.local == (1, 2)
    assert train.runs == ((0, 4),) * 8 and (train.samples, train.global_samples) == (16, 32)
    assert (val.samples, val.global_samples) == (8, 16)  # what the two ranks evaluate together
    rank_mode = rank_shards(m, SimpleNamespace(stage_dir="", stage_mode="node_share"), DistEnv(), 4,
                            lambda _: ("mine", "also mine"))
    assert rank_mode == {"train": "mine", "validation": "also mine"}
