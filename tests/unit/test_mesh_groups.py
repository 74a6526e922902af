"""The hybrid path's rank arithmetic and the checks that refuse a bad partitioning before any work."""
import dataclasses
import re
from types import SimpleNamespace

import pytest
import yaml

from common.runtime.config import load_config
from common.runtime.dist import DistEnv
from common.base.errors import BenchError
from cosmoflow.config import CosmoConfig, CosmoModelConfig, ParallelConfig
from cosmoflow.mesh.groups import data_view, group_layout
from cosmoflow.mesh.hybrid import check_hybrid
from tests.conftest import REPO

MINI = REPO / "cosmoflow/configs/cosmo_mini.yaml"


@pytest.mark.parametrize("size, spatial, expected", [
    # rank: (group, task, leader) for every rank
    (4, (2, 1), [(0, 0, 0), (0, 1, 0), (1, 0, 2), (1, 1, 2)]),
    (4, (1, 2), [(0, 0, 0), (0, 1, 0), (1, 0, 2), (1, 1, 2)]),
    (8, (2, 2), [(0, 0, 0), (0, 1, 0), (0, 2, 0), (0, 3, 0), (1, 0, 4), (1, 1, 4), (1, 2, 4), (1, 3, 4)]),
    (3, (1, 1), [(0, 0, 0), (1, 0, 1), (2, 0, 2)]),
    (4, (4, 1), [(0, 0, 0), (0, 1, 0), (0, 2, 0), (0, 3, 0)]),
])
def test_consecutive_ranks_form_groups(size, spatial, expected):
    layouts = [group_layout(rank, size, spatial) for rank in range(size)]
    assert [(g.group, g.task, g.leader) for g in layouts] == expected
    parts = spatial[0] * spatial[1]
    assert all(g.groups == size // parts and g.group_size == parts for g in layouts)
    assert [g.rank for g in layouts if g.is_leader] == list(range(0, size, parts))
    for g in layouts:  # every rank is in its own group's ranks, and the leader comes first
        assert g.rank in g.ranks and g.ranks[0] == g.leader and len(g.ranks) == parts


def test_partitioning_name_is_depth_by_height():
    assert group_layout(0, 8, [4, 2]).name == "4x2"


@pytest.mark.parametrize("size, spatial, message", [
    (2, (2, 2), "parallel.spatial [2, 2]: 4 partitions need at least 4 ranks, got 2"),
    (1, (2, 1), "parallel.spatial [2, 1]: 2 partitions need at least 2 ranks, got 1"),
    (3, (2, 1), "parallel.spatial [2, 1]: 3 ranks are not divisible by 2 partitions"),
    (6, (2, 2), "parallel.spatial [2, 2]: 6 ranks are not divisible by 4 partitions"),
])
def test_ranks_that_cannot_form_whole_groups_are_refused(size, spatial, message):
    with pytest.raises(BenchError, match=re.escape(message)):
        group_layout(0, size, spatial)


def test_data_view_has_one_reader_per_group():
    dist = DistEnv(rank=3, size=4, local_rank=3, local_size=4, horovod=True)
    view = data_view(dist, group_layout(3, 4, (2, 1)))
    assert (view.rank, view.size) == (1, 2)
    assert (view.local_rank, view.horovod) == (3, True)  # the rest is the rank's own


# ---------------------------------------------------------------------------- config
def test_parallel_section_defaults_to_data_parallel():
    cfg = load_config(MINI, [], CosmoConfig)
    assert cfg.parallel.spatial == (1, 1) and not cfg.parallel.hybrid and cfg.parallel.partitions == 1


def test_spatial_override_from_the_command_line():
    cfg = load_config(MINI, ["parallel.spatial=[2,1]"], CosmoConfig)
    assert cfg.parallel.spatial == (2, 1) and cfg.parallel.hybrid and cfg.parallel.partitions == 2


@pytest.mark.parametrize("value", ["[0,1]", "[2]", "[1,2,2]", "[-1,2]"])
def test_bad_spatial_values_name_the_key(value):
    with pytest.raises(BenchError, match=re.escape("parallel.spatial") + ".*expected \\[pd, ph\\]"):
        load_config(MINI, [f"parallel.spatial={value}"], CosmoConfig)


def test_unknown_parallel_key_is_refused():
    with pytest.raises(BenchError, match="unknown key.*parallel.blocks.*valid keys: spatial"):
        load_config(MINI, ["parallel.blocks=2"], CosmoConfig)


def _cfg(spatial, input_shape=(16, 16, 16, 4), **data):
    model = CosmoModelConfig(input_shape=input_shape, conv_filters=(4, 8, 16, 16), dense_units=(16, 8))
    return dataclasses.replace(CosmoConfig(), model=model, parallel=ParallelConfig(spatial=spatial),
                               data=dataclasses.replace(CosmoConfig().data, **data))


@pytest.mark.parametrize("spatial, size, message", [
    ((3, 1), 6, "depth 16 (input_shape [16, 16, 16, 4]) is not divisible by 3 partitions"),
    ((1, 5), 5, "height 16 (input_shape [16, 16, 16, 4]) is not divisible by 5 partitions"),
    ((2, 2), 2, "4 partitions need at least 4 ranks, got 2"),
    ((2, 1), 6, None),
    ((2, 1), 5, "5 ranks are not divisible by 2 partitions"),
])
def test_check_hybrid_uses_the_planner_and_the_rank_count(spatial, size, message):
    if message is None:
        check_hybrid(_cfg(spatial), size)
        return
    with pytest.raises(BenchError, match=re.escape(message)):
        check_hybrid(_cfg(spatial), size)


@pytest.mark.parametrize("spatial", [(2, 1), (1, 2), (2, 2), (4, 1), (4, 4)])
def test_the_tasks_blocks_tile_the_cube_in_the_meshs_device_order(spatial):
    """Task k holds block (k // ph, k % ph): Mesh-TF's numbering of the devices of "b:1;pd;ph", whose
    laid-out input slice k is that block; together the blocks cover every cell once."""
    import numpy as np
    from cosmoflow.mesh.groups import sample_block
    from cosmoflow.mesh.model import LAYOUT
    from cosmoflow.mesh.shim import import_mtf
    mtf = import_mtf()
    shape = (16, 32, 8, 4)
    cube = np.arange(np.prod(shape)).reshape(1, *shape)
    pd, ph = spatial
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(f"b:1;pd:{pd};ph:{ph}", LAYOUT, [""] * (pd * ph))
    laid_out = mtf.Shape([mtf.Dimension(n, s) for n, s in (("batch", 1), ("d_blocks", pd), ("h_blocks", ph),
                                                             ("d", 16 // pd), ("h", 32 // ph), ("w", 8), ("c0", 4))])
    blocks = [sample_block(shape, spatial, k) for k in range(pd * ph)]
    for k, block in enumerate(blocks):
        _, i, j, *_ = impl.slice_begin(laid_out, k)  # which depth and height block device k's input slice holds
        assert block.depth == (i * 16 // pd, (i + 1) * 16 // pd) and block.height == (j * 32 // ph, (j + 1) * 32 // ph)
        assert block.shape(shape) == (16 // pd, 32 // ph, 8, 4) and block.fraction(shape) == 1 / (pd * ph)
    cells = np.concatenate([block.cut(cube).ravel() for block in blocks])
    assert sorted(cells) == list(range(cube.size))
    with pytest.raises(BenchError, match=f"task {pd * ph}: expected 0 <= task < {pd * ph}"):
        sample_block(shape, spatial, pd * ph)


def test_check_hybrid_refuses_node_share_staging():
    with pytest.raises(BenchError, match="data.stage_mode node_share with parallel.spatial \\[2, 1\\]"):
        check_hybrid(_cfg((2, 1), stage_dir="/tmp/x", stage_mode="node_share"), 4)
    check_hybrid(_cfg((2, 1), stage_dir="/tmp/x", stage_mode="node"), 4)


def test_check_hybrid_wants_every_blocks_records_read_in_place(tmp_path):
    (tmp_path / "blocks_2x2" / "0_0").mkdir(parents=True)
    (tmp_path / "blocks_2x2" / "0_0" / "manifest.json").write_text("{}")
    with pytest.raises(BenchError, match=r"blocks_2x2 lacks the blocks \['0_1', '1_0', '1_1'\] of parallel.spatial "
                                         r"\[2, 2\]; write them with `python -m data_prep cosmo-blocks --data "):
        check_hybrid(_cfg((2, 2), dir=str(tmp_path), blocks="records"), 4)
    with pytest.raises(BenchError, match=r"data.blocks=records with data.stage_dir '/tmp/x': staging copies the "
                                         r"whole records"):
        check_hybrid(_cfg((2, 2), dir=str(tmp_path), blocks="records", stage_dir="/tmp/x"), 4)
    check_hybrid(_cfg((2, 2), dir=str(tmp_path), blocks="auto"), 4)  # auto: cut from the whole records if need be


def test_block_records_without_a_spatial_split_are_refused():
    with pytest.raises(BenchError, match=r"data.blocks.*records.*auto or whole without parallel.spatial"):
        _cfg((1, 1), blocks="records")


def test_check_hybrid_refuses_an_even_kernel():
    cfg = _cfg((2, 1))
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, kernel_size=4))
    with pytest.raises(BenchError, match="model.kernel_size 4: the mesh model needs an odd kernel size"):
        check_hybrid(cfg, 2)


# ---------------------------------------------------------------------------- sharding of the files
def _manifest(files: int):
    entries = [SimpleNamespace(path=f"train/{i}.tfrecord", index=f"train/{i}.idx", records=4) for i in range(files)]
    val = [SimpleNamespace(path=f"val/{i}.tfrecord", index=None, records=4) for i in range(files)]
    return SimpleNamespace(splits={"train": SimpleNamespace(files=entries), "validation": SimpleNamespace(files=val)},
                           root=REPO)


def test_every_rank_of_a_group_stages_its_groups_shard():
    from cosmoflow.train import rank_files
    cfg = load_config(MINI, ["parallel.spatial=[2,1]"], CosmoConfig)
    manifest = _manifest(4)
    files = [rank_files(cfg, manifest, rank, 4) for rank in range(4)]
    assert files[1] == files[0] and files[3] == files[2]  # each decodes its block of the group's samples
    assert files[0] == ["train/0.tfrecord", "train/0.idx", "train/2.tfrecord", "train/2.idx", "val/0.tfrecord",
                        "val/2.tfrecord"]
    assert files[2] == ["train/1.tfrecord", "train/1.idx", "train/3.tfrecord", "train/3.idx", "val/1.tfrecord",
                        "val/3.tfrecord"]
    # The same as the data-parallel path with one rank per group.
    plain = load_config(MINI, [], CosmoConfig)
    assert [rank_files(plain, manifest, rank, 2) for rank in range(2)] == [files[0], files[2]]


def test_the_train_entry_point_refuses_a_bad_partitioning_before_any_work(tmp_path, capsys):
    from cosmoflow import train
    out = tmp_path / "run"
    cfg = yaml.safe_load(MINI.read_text())
    cfg["run"]["output_dir"] = str(out)
    cfg["data"]["dir"] = str(tmp_path / "no-data")  # never looked at
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert train.main([str(path), "parallel.spatial=[3,1]"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "the cube's depth 32 (input_shape [32, 32, 32, 4]) is not divisible by 3 partitions" in err
    assert not out.exists()  # nothing written, not even config.yaml
    assert train.main([str(path), "parallel.spatial=[2,1]"]) == 2  # one process: too few ranks
    assert "2 partitions need at least 2 ranks, got 1" in " ".join(capsys.readouterr().err.split())
    assert not out.exists()
