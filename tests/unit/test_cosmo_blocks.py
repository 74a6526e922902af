"""data_prep cosmo-blocks and the loader's per-block records: each rank of a spatial group reads only its block's
bytes, in its group's sample order, and blocks that are not the dataset's are refused."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from common.base.errors import BenchError
from common.io.manifest import load_manifest
from data_prep import validate
from data_prep.__main__ import main as data_prep_main
from tests.unit.test_cosmo_convert import convert, make_universes
from tests.unit.test_index import snapshot

SHAPE = (4, 4, 4, 4)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("blocks")
    out = root / "tfrecords"
    assert convert(make_universes(root / "universes", 5), out, sample_size=4, val_universes=1) == 0
    return out


@pytest.fixture(scope="module")
def blocked(dataset):
    before = snapshot(dataset)
    assert data_prep_main(["cosmo-blocks", "--data", str(dataset), "--spatial", "2x2", "--workers", "1"]) == 0
    after = snapshot(dataset)
    assert {k: v for k, v in after.items() if not k.startswith("blocks_2x2")} == before  # the input is untouched
    return dataset


def _datasets(data_dir, loader, block=None, blocks="auto", seed=3):
    from common.runtime.dist import DistEnv
    from cosmoflow.config import CosmoDataConfig
    from cosmoflow.data import build_datasets
    cfg = CosmoDataConfig(dir=str(data_dir), loader=loader, shuffle=True, blocks=blocks)
    return build_datasets(cfg, SHAPE, 4, DistEnv(), seed=seed, block=block)


@pytest.mark.parametrize("loader", ["tfdata", "dali"])
def test_each_rank_reads_its_blocks_records_in_the_groups_order_and_a_quarter_of_the_bytes(blocked, loader):
    from cosmoflow.mesh.groups import sample_block
    whole = _datasets(blocked, loader)
    expected = [tuple(np.asarray(t) for t in b) for _, b in zip(range(6), whole.train)]
    for task in range(4):
        block = sample_block(SHAPE, (2, 2), task)
        mine = _datasets(blocked, loader, block, blocks="records")
        assert mine.block_records and mine.decoded_fraction == pytest.approx(0.25)
        framing = whole.record_bytes - np.prod(SHAPE) * 2  # the Example's keys, the target and the TFRecord frame
        assert mine.record_bytes == pytest.approx(np.prod(SHAPE) * 2 / 4 + framing, abs=2)  # a quarter of the sample
        for _, (x, y), (x_whole, y_whole) in zip(range(6), mine.train, expected):
            assert x.shape == (4, 2, 2, 4, 4)
            np.testing.assert_array_equal(np.asarray(x), block.cut(x_whole))
            np.testing.assert_array_equal(np.asarray(y), y_whole)


def test_the_blocks_are_valid_datasets_with_the_whole_datasets_files_and_statistics(blocked):
    whole = load_manifest(blocked)
    for name in ("0_0", "0_1", "1_0", "1_1"):
        own = load_manifest(blocked / "blocks_2x2" / name)
        assert own.sample_shape == (2, 2, 4, 4) and own.input_stats == whole.input_stats
        assert [f.path for f in own.splits["train"].files] == [f.path for f in whole.splits["train"].files]
        assert own.source["block"] == [int(name[0]), int(name[2])]
        assert not validate.validate(own.root, progress_seconds=None).findings
    assert not validate.validate(blocked, progress_seconds=None).findings  # the blocks below it are no stray files


def test_auto_cuts_blocks_from_the_whole_records_where_none_were_written_for_the_partitioning(blocked):
    from cosmoflow.mesh.groups import sample_block
    datasets = _datasets(blocked, "tfdata", sample_block(SHAPE, (2, 1), 0))  # blocks_2x1 does not exist
    assert not datasets.block_records and datasets.decoded_fraction == pytest.approx(0.5)
    with pytest.raises(BenchError, match=r"data.blocks=records: no .*blocks_2x1/0_0/manifest.json; write the "
                                         r"per-block records with `python -m data_prep cosmo-blocks --data .* "
                                         r"--spatial 2x1`"):
        _datasets(blocked, "tfdata", sample_block(SHAPE, (2, 1), 0), blocks="records")


def test_blocks_of_another_version_of_the_dataset_are_refused(blocked, tmp_path):
    import shutil
    from cosmoflow.mesh.groups import sample_block
    copy = tmp_path / "copy"
    shutil.copytree(blocked, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["seed"] = 12345  # another conversion: the blocks no longer name this manifest
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BenchError, match=r"blocks_2x2/0_1/manifest.json: source.manifest_sha256 is '[0-9a-f]+', "
                                         r"expected '[0-9a-f]+' for this rank's block"):
        _datasets(copy, "tfdata", sample_block(SHAPE, (2, 2), 1))


@pytest.mark.parametrize("spatial, message", [
    ("3x1", r"sample depth 4 \(sample shape \[4, 4, 4, 4\]\) is not divisible by 3 partitions"),
    ("1x1", r"--spatial '1x1': expected DxH with positive integers and at least 2 blocks"),
    ("2by2", r"--spatial '2by2': expected DxH with two positive integers"),
])
def test_a_partitioning_the_samples_cannot_take_exits_2_naming_it(dataset, spatial, message, capsys):
    assert data_prep_main(["cosmo-blocks", "--data", str(dataset), "--spatial", spatial]) == 2
    assert re.search(message, " ".join(capsys.readouterr().err.split()))
    assert not (dataset / f"blocks_{spatial}").exists()


@pytest.mark.parametrize("mode, shape, records", [("data", [4, 4, 4, 4], False), ("records", [2, 2, 4, 4], True)])
def test_the_block_io_benchmark_worker_reads_as_a_rank_of_the_group_does(blocked, mode, shape, records):
    import subprocess
    import sys
    from tests.conftest import REPO
    proc = subprocess.run([sys.executable, "benchmarks/block_io.py", "--data", str(blocked), "--batch", "4",
                           "--batches", "2", "--warmup", "1", "--worker", "2x2", mode, "tfdata"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    case = json.loads(proc.stdout.strip().splitlines()[-1])
    assert case["block_shape"] == shape and case["block_records"] is records
    assert case["bytes_per_sample"] > 0 and case["samples_per_second"] > 0
    assert case["record_bytes"] == pytest.approx((189.0 if records else 573.0), abs=2)  # the records' own sizes


def test_the_block_io_table_gives_each_cases_share_of_the_whole_samples_bytes_and_rates():
    import sys
    from tests.conftest import REPO
    sys.path.insert(0, str(REPO / "benchmarks"))
    import block_io

    def case(spatial, mode, loader, shape, record_bytes, rate):
        return {"spatial": spatial, "mode": mode, "loader": loader, "block_shape": shape, "bytes_per_sample": 1e3 *
                record_bytes / 1e3, "record_bytes": record_bytes, "samples_per_second": rate}
    result = {"loaders": ["tfdata", "dali"], "batch": 8, "batches": 4, "data": "/d", "blocks_written": [],
              "sgemm_gflops": 1.0, "date": "2026-11-27", "machine": "m", "code": {"commit": "abcdef0123", "modified": []},
              "cases": [{l: case("1x1", "data", l, [32, 32, 32, 4], 4000.0, 100.0) for l in ("tfdata", "dali")},
                        {l: case("2x2", "records", l, [16, 16, 32, 4], 1000.0, 300.0) for l in ("tfdata", "dali")}]}
    lines = block_io.table(result).splitlines()
    assert lines[2] == "| data | whole records, whole sample | 32 x 32 x 32 x 4 | 4.0 | 1.00 | 4.0 | 100 (1.00x) | 100 (1.00x) |"
    assert lines[3] == ("| 2x2 | the block's own records | 16 x 16 x 32 x 4 | 1.0 | 0.25 | 1.0 | 300 (3.00x) | "
                        "300 (3.00x) |")
    assert "Commit abcdef0." in lines[-1] and "Not recorded: CPU model, ISA flags." in lines[-1]
