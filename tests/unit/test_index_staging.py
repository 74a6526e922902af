"""Staging an indexed release with decompression (data.stage_decompress): uncompressed records with DALI indexes,
a manifest that says so, DALI reading the copy as tf.data reads the source, reuse, and a corrupt source."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from common.base.errors import BenchError
from common.io.manifest import check_split_files, load_manifest
from common.io.staging import Layout, open_source, plan, stage
from cosmoflow.data import files_read
from data_prep import validate
from tests.unit.test_index import SAMPLE, index, release
from tests.unit.test_cosmo_convert import make_universes

SHAPE = (SAMPLE, SAMPLE, SAMPLE, 4)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    root = tmp_path_factory.mktemp("indexed")
    released = release(make_universes(root / "universes", 5), root / "release")
    assert index(released, root / "index") == 0
    return root / "index"


def stage_node(indexed, stage_root, reuse=False):
    source = open_source(indexed)
    return stage(source, plan(source, "node", Layout(), lambda *_: (), decompress=True), stage_root, threads=2,
                 reuse=reuse)


def test_staging_decompresses_into_records_dali_can_read(indexed, tmp_path):
    result = stage_node(indexed, tmp_path)
    staged = load_manifest(result.dir)
    assert result.dir.endswith("-uncompressed/node") and staged.compression == "none"
    assert staged.source["staged_decompressed"]["files"] == 40
    assert result.compression == "gzip" and result.figures()["compression_ratio"] > 1
    for split in ("train", "validation"):
        check_split_files(staged, split, verify_checksums=True)  # sizes, indexes, digests
    assert all(e.index and e.uncompressed_bytes is None for e in staged.splits["train"].files)
    report = validate.validate(result.dir, workers=2, progress_seconds=None)
    assert not report.findings, validate.format_report(report)


def test_dali_reads_the_staged_copy_as_tf_data_reads_the_source(indexed, tmp_path):
    from common.runtime.dist import DistEnv
    from cosmoflow.config import CosmoDataConfig
    from cosmoflow.data import build_datasets
    staged = stage_node(indexed, tmp_path).dir
    batches = {}
    for name, data_dir, loader in (("tfdata", indexed, "tfdata"), ("dali", staged, "dali")):
        datasets = build_datasets(CosmoDataConfig(dir=str(data_dir), loader=loader, shuffle=False), SHAPE, 4,
                                  DistEnv(), seed=0)
        assert datasets.loader == loader
        batches[name] = [tuple(np.asarray(t) for t in b) for _, b in zip(range(3), datasets.train)]
    for (x_a, y_a), (x_b, y_b) in zip(batches["tfdata"], batches["dali"]):
        np.testing.assert_array_equal(x_a, x_b)
        np.testing.assert_array_equal(y_a, y_b)


def test_a_rank_stages_and_describes_only_its_files(indexed, tmp_path):
    source = open_source(indexed)
    manifest = source.manifest
    the_plan = plan(source, "rank", Layout(rank=1, size=2, local_rank=1, local_size=2),
                    lambda m, r, s: files_read(m, r, s, 4), decompress=True)
    result = stage(source, the_plan, tmp_path, threads=2)
    staged = load_manifest(result.dir)
    mine = set(files_read(manifest, 1, 2, 4))
    assert result.files == len(mine) == 20
    assert {e.path for s in staged.splits.values() for e in s.files if e.index} == mine
    from common.io.input import resolve_loader
    assert resolve_loader("dali", staged, ("train", "validation"), files=mine) == "dali"


def test_reuse_keeps_decompressed_files_and_gives_the_same_manifest(indexed, tmp_path):
    first = stage_node(indexed, tmp_path)
    text = (tmp_path / first.dir / "manifest.json").read_text()
    again = stage_node(indexed, tmp_path, reuse=True)
    assert (again.files, again.files_reused) == (0, 40)
    assert (tmp_path / again.dir / "manifest.json").read_text() == text


def test_a_corrupt_source_stops_staging_naming_the_file(indexed, tmp_path):
    released = shutil.copytree(load_manifest(indexed).source["dir"], tmp_path / "release")
    assert index(released, tmp_path / "index") == 0
    bad = sorted((released / "train").iterdir())[2]
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x01
    bad.write_bytes(bytes(data))
    with pytest.raises(BenchError, match=rf"{bad.name}.*the source is corrupt"):
        stage_node(tmp_path / "index", tmp_path / "stage")
    assert not list((tmp_path / "stage").rglob(f"*{bad.name}*"))  # nothing of it, final or temporary


def test_a_packed_source_cannot_be_decompressed(tmp_path):
    from tests.unit.test_staging import make_dataset, pack
    packed = pack(make_dataset(tmp_path / "plain"), tmp_path / "packed")
    with pytest.raises(BenchError, match="a packed dataset; data.stage_decompress"):
        plan(open_source(packed), "node", Layout(), lambda *_: (), decompress=True)


@pytest.mark.parametrize("spatial", [(2, 1), (2, 2), (1, 4)])
def test_each_rank_of_a_group_decodes_only_its_block_with_either_loader(indexed, tmp_path, spatial):
    """A spatial group's ranks read the group's shard in the same order; each gets its block of every sample
    (cut from the raw bytes), and the blocks make up the whole batch the leader would have read."""
    from common.runtime.dist import DistEnv
    from cosmoflow.config import CosmoDataConfig
    from cosmoflow.data import build_datasets
    from cosmoflow.mesh.groups import sample_block
    staged = stage_node(indexed, tmp_path).dir
    for data_dir, loader in ((indexed, "tfdata"), (staged, "dali")):
        cfg = CosmoDataConfig(dir=str(data_dir), loader=loader, shuffle=True)
        whole = build_datasets(cfg, SHAPE, 4, DistEnv(), seed=3)
        expected = [tuple(np.asarray(t) for t in b) for _, b in zip(range(3), whole.train)]
        for task in range(spatial[0] * spatial[1]):
            block = sample_block(SHAPE, spatial, task)
            datasets = build_datasets(cfg, SHAPE, 4, DistEnv(), seed=3, block=block)
            assert datasets.decoded_fraction == pytest.approx(1 / (spatial[0] * spatial[1]))
            for _, (x, y), (x_whole, y_whole) in zip(range(3), datasets.train, expected):
                assert x.shape == (4, SAMPLE // spatial[0], SAMPLE // spatial[1], SAMPLE, 4)
                np.testing.assert_array_equal(np.asarray(x), block.cut(x_whole))
                np.testing.assert_array_equal(np.asarray(y), y_whole)


def test_a_block_outside_the_samples_is_refused_naming_the_rows(indexed):
    from common.runtime.dist import DistEnv
    from cosmoflow.config import CosmoDataConfig
    from cosmoflow.data import build_datasets
    from cosmoflow.mesh.groups import SampleBlock
    with pytest.raises(BenchError, match=r"depth rows 2:6 do not lie in the samples' depth 4"):
        build_datasets(CosmoDataConfig(dir=str(indexed), loader="tfdata"), SHAPE, 4, DistEnv(), seed=0,
                       block=SampleBlock((2, 6), (0, 4)))
