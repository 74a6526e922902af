"""data_prep index over the official release's layout (fixtures by data_prep cosmo-released): the manifest, the
links, the statistics, resuming, bad files, and reading the indexed files with tf.data."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from common.base.errors import BenchError
from common.io.formats import cosmoflow as record_format, cosmoflow_prep
from common.io.manifest import check_split_files, load_manifest, xxh3_128_file
from data_prep.__main__ import main as data_prep_main
from tests.unit.test_cosmo_convert import convert, make_universes

UNIVERSES, VAL_UNIVERSES, SIZE, SAMPLE = 5, 1, 8, 4  # 8 files of 4^3 samples per universe


def release(universes: Path, out: Path, val_dir: str = "validation") -> Path:
    assert data_prep_main(["cosmo-released", "--input", str(universes), "--out", str(out), "--sample-size",
                           str(SAMPLE), "--val-universes", str(VAL_UNIVERSES), "--val-dir", val_dir,
                           "--workers", "1"]) == 0
    return out


def index(release_dir: Path, out: Path, *extra: str) -> int:
    """`data_prep index` in this process (one worker; `extra` may say --workers N)."""
    return data_prep_main(["index", "--input", str(release_dir), "--out", str(out), "--workers", "1", *extra])


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under root with its size and modification time."""
    return {p.relative_to(root).as_posix(): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def universes(tmp_path_factory) -> Path:
    return make_universes(tmp_path_factory.mktemp("universes"), UNIVERSES, size=SIZE)


@pytest.fixture(scope="module")
def released(universes, tmp_path_factory) -> Path:
    return release(universes, tmp_path_factory.mktemp("release") / "cosmoUniverse_tf_v2")


@pytest.fixture(scope="module")
def indexed(released, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("indexed") / "index"
    assert index(released, out) == 0
    return out


# ---------------------------------------------------------------------------- the manifest
def test_the_writer_gives_the_released_layout(released, universes):
    names = sorted(p.name for p in (released / "train").iterdir())
    assert len(names) == (UNIVERSES - VAL_UNIVERSES) * 8 and len(list((released / "validation").iterdir())) == 8
    assert names[0] == f"{universes.name}_universe_000000_000.tfrecord"  # prepare.py's <parent>_<universe>_<iii>
    assert all((released / "train" / n).read_bytes()[:2] == b"\x1f\x8b" for n in names)  # GZIP, no index beside
    assert sorted(p.name for p in released.iterdir()) == ["train", "validation"]


def test_index_describes_the_files_where_they_are_and_writes_nothing_into_the_input(released, tmp_path):
    before = snapshot(released)
    assert index(released, tmp_path / "out") == 0
    assert snapshot(released) == before
    manifest = load_manifest(tmp_path / "out", expected_format=record_format.FORMAT)
    assert manifest.compression == "gzip" and manifest.sample_shape == (SAMPLE, SAMPLE, SAMPLE, 4)
    assert manifest.source["kind"] == cosmoflow_prep.RELEASED_SOURCE_KIND
    assert manifest.source["dir"] == str(released.resolve())
    assert os.readlink(tmp_path / "out/train") == str(released.resolve() / "train")
    train = manifest.splits["train"]
    assert [e.path for e in train.files] == sorted(f"train/{p.name}" for p in (released / "train").iterdir())
    assert train.samples == len(train.files) and all(e.records == 1 and e.index is None for e in train.files)
    first = train.files[0]
    assert first.xxh3_128 == xxh3_128_file(released / first.path)
    assert first.uncompressed_bytes > first.bytes == (released / first.path).stat().st_size
    check_split_files(manifest, "train", verify_checksums=True)


def test_statistics_equal_those_cosmo_convert_gives_for_the_same_universes(indexed, universes, tmp_path):
    convert(universes, tmp_path / "converted", sample_size=SAMPLE, val_universes=VAL_UNIVERSES)
    converted = load_manifest(tmp_path / "converted").input_stats
    stats = load_manifest(indexed).input_stats
    assert stats["cells_per_channel"] == converted["cells_per_channel"] and stats["sampling"] == "all"
    np.testing.assert_allclose(stats["mean"], converted["mean"], atol=2e-6)
    np.testing.assert_allclose(stats["std"], converted["std"], atol=2e-6)


def test_stats_files_samples_evenly_and_says_so(released, tmp_path, capsys):
    assert index(released, tmp_path / "out", "--stats-files", "3", "--verify", "quick") == 0
    stats = load_manifest(tmp_path / "out").input_stats
    assert (stats["files"], stats["files_in_split"]) == (3, 32)
    assert stats["sampling"] == "evenly spaced in name order" and stats["cells_per_channel"] == 3 * SAMPLE ** 3
    assert index(released, tmp_path / "none", "--stats-files", "0") == 0
    assert load_manifest(tmp_path / "none").input_stats == {}


def test_quick_and_full_and_two_worker_processes_give_the_same_manifest(indexed, released, tmp_path):
    assert index(released, tmp_path / "quick", "--verify", "quick") == 0
    full, quick = load_manifest(indexed), load_manifest(tmp_path / "quick")
    assert quick.splits == full.splits and quick.source["verified"]["quick"] > 0
    assert index(released, tmp_path / "two", "--workers", "2") == 0
    assert (tmp_path / "two/manifest.json").read_text() == (indexed / "manifest.json").read_text()


def test_a_val_directory_is_the_validation_split(universes, tmp_path):
    released = release(universes, tmp_path / "rel", val_dir="val")
    assert index(released, tmp_path / "out") == 0
    manifest = load_manifest(tmp_path / "out")
    assert manifest.splits["validation"].files[0].path.startswith("validation/")
    assert os.readlink(tmp_path / "out/validation") == str(released.resolve() / "val")
    (released / "validation").mkdir()
    with pytest.raises(BenchError, match=r"both validation/ and val/"):
        data_prep_main_raising(["index", "--input", str(released), "--out", str(tmp_path / "out2")])


def data_prep_main_raising(argv):
    """Run a command's `run` directly, so that its BenchError reaches the test."""
    from data_prep.__main__ import build_parser
    args = build_parser().parse_args(argv)
    return args._run(args)


# ---------------------------------------------------------------------------- refusals
def test_missing_splits_and_outputs_inside_the_input_are_refused(released, tmp_path):
    with pytest.raises(BenchError, match=r"no train/ \(subdirectories: \[\]\)"):
        data_prep_main_raising(["index", "--input", str(tmp_path), "--out", str(tmp_path / "o")])
    with pytest.raises(BenchError, match="inside the input"):
        data_prep_main_raising(["index", "--input", str(released), "--out", str(released / "index")])
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign/manifest.json").write_text("{}")
    with pytest.raises(BenchError, match="not an index made by data_prep index"):
        data_prep_main_raising(["index", "--input", str(released), "--out", str(tmp_path / "foreign")])


def test_bad_files_are_all_named_and_the_good_ones_kept_for_the_rerun(released, tmp_path, capsys):
    copy = shutil.copytree(released, tmp_path / "rel", symlinks=True)
    names = sorted((copy / "train").iterdir())
    truncated, flipped = names[3], names[5]
    good_bytes = flipped.read_bytes()
    truncated.write_bytes(truncated.read_bytes()[:-9])
    data = bytearray(good_bytes)
    data[len(data) // 2] ^= 0x10
    flipped.write_bytes(bytes(data))
    with pytest.raises(BenchError) as err:
        data_prep_main_raising(["index", "--input", str(copy), "--out", str(tmp_path / "out")])
    assert str(truncated) in str(err.value) and str(flipped) in str(err.value)
    assert not (tmp_path / "out/manifest.json").exists()
    flipped.write_bytes(good_bytes)
    truncated.unlink()
    assert index(copy, tmp_path / "out", "--json") == 0
    figures = json.loads(capsys.readouterr().out)
    assert (figures["files"], figures["files_reused"]) == (1, 38)  # only the restored file is read again


def test_a_rerun_reads_only_changed_files_and_survives_a_torn_journal(indexed, released, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(indexed, out, symlinks=True)
    journal = out / ".index-journal.jsonl"
    journal.write_text(journal.read_text() + '{"split": "train", "na')  # a killed run's half line
    changed = sorted((released / "train").iterdir())[0]
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 1000))
    assert index(released, out, "--json") == 0
    figures = json.loads(capsys.readouterr().out)
    assert (figures["files"], figures["files_reused"]) == (1, 39)
    assert load_manifest(out).splits == load_manifest(indexed).splits


def test_a_journal_of_another_input_is_refused(indexed, universes, tmp_path):
    other = release(universes, tmp_path / "other")
    out = tmp_path / "out"
    shutil.copytree(indexed, out, symlinks=True)
    with pytest.raises(BenchError, match="an index of another input"):
        data_prep_main_raising(["index", "--input", str(other), "--out", str(out)])
    assert (out / "manifest.json").is_file()  # refused before anything was changed


def test_a_moved_input_is_named_by_its_link(indexed, released, tmp_path):
    moved_from = tmp_path / "rel"
    shutil.copytree(released, moved_from)
    assert index(moved_from, tmp_path / "out") == 0
    moved_from.rename(tmp_path / "elsewhere")
    with pytest.raises(BenchError, match=r"out/train: links to .*rel/train, which does not exist"):
        check_split_files(load_manifest(tmp_path / "out"), "train")


# ---------------------------------------------------------------------------- training reads it
def test_the_loaders_read_the_indexed_samples_in_manifest_order(indexed, universes):
    from common.runtime.dist import DistEnv
    from cosmoflow.config import CosmoDataConfig
    from cosmoflow.data import build_datasets
    manifest = load_manifest(indexed)
    datasets = build_datasets(CosmoDataConfig(dir=str(indexed), shuffle=False), manifest.sample_shape, 4,
                              DistEnv(), seed=0)
    assert datasets.loader == "tfdata"  # auto: DALI cannot read GZIP
    x, y = next(iter(datasets.train))
    for i, entry in enumerate(manifest.splits["train"].files[:4]):
        universe, cube = entry.path.split("_universe_")[1].removesuffix(".tfrecord").split("_")
        with h5py.File(universes / f"universe_{universe}.h5") as f:
            full, unit = f["full"][...], f["unitPar"][...]
        a, b, c = np.unravel_index(int(cube), (SIZE // SAMPLE,) * 3)
        cells = full[a * SAMPLE:(a + 1) * SAMPLE, b * SAMPLE:(b + 1) * SAMPLE, c * SAMPLE:(c + 1) * SAMPLE]
        np.testing.assert_allclose(np.asarray(x[i]), np.log1p(cells.astype(np.float32)), rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(y[i]), unit)


def test_dali_on_gzip_data_says_how_to_stage_it_uncompressed(indexed):
    from common.runtime.dist import DistEnv
    from cosmoflow.config import CosmoDataConfig
    from cosmoflow.data import build_datasets
    with pytest.raises(BenchError, match=r"gzip-compressed, but DALI.*data.stage_decompress=true"):
        build_datasets(CosmoDataConfig(dir=str(indexed), loader="dali"), (SAMPLE, SAMPLE, SAMPLE, 4), 4, DistEnv(),
                       seed=0)


def test_an_uncompressed_release_is_indexed_too(released, tmp_path):
    """The v0.7 release's records were not compressed: the same index, compression none, no DALI indexes."""
    import gzip
    copy = shutil.copytree(released, tmp_path / "rel")
    for path in copy.rglob("*.tfrecord"):
        path.write_bytes(gzip.decompress(path.read_bytes()))
    for verify in ("full", "quick"):
        assert index(copy, tmp_path / verify, "--verify", verify) == 0
        manifest = load_manifest(tmp_path / verify)
        assert manifest.compression == "none" and manifest.splits["train"].samples == 32
        assert all(e.index is None and e.uncompressed_bytes is None for e in manifest.splits["train"].files)
    assert load_manifest(tmp_path / "full").splits == load_manifest(tmp_path / "quick").splits
