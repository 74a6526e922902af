"""common.io.input's loader choice: data.loader=auto picks DALI only where DALI can read the records."""
import dataclasses

import pytest

from common.base.errors import BenchError
from common.io.input import resolve_loader
from tests.unit.test_sharding import manifest


def test_auto_reads_uncompressed_indexed_records_with_dali():
    assert resolve_loader("auto", manifest(files=4), ("train", "validation")) == "dali"  # DALI is installed here


def test_auto_falls_back_to_tf_data_for_gzip_or_unindexed_records():
    gzip = dataclasses.replace(manifest(files=4), compression="gzip")
    assert resolve_loader("auto", gzip, ("train",)) == "tfdata"
    m = manifest(files=4)
    split = m.splits["train"]
    unindexed = dataclasses.replace(split, files=(dataclasses.replace(split.files[0], index=None, index_sha256=None),
                                                  *split.files[1:]))
    m = dataclasses.replace(m, splits={**m.splits, "train": unindexed})
    assert resolve_loader("auto", m, ("train",)) == "tfdata"
    with pytest.raises(BenchError, match=r"1 record file\(s\) have no DALI index \(first: train/f000.tfrecord\)"):
        resolve_loader("dali", m, ("train",))
    assert resolve_loader("tfdata", gzip, ("train",)) == "tfdata"


def test_checksums_are_checked_for_dali_unless_the_config_says_otherwise():
    from common.io.input import checksums_wanted
    assert checksums_wanted(None, "dali") and not checksums_wanted(None, "tfdata")
    assert checksums_wanted(True, "tfdata") and not checksums_wanted(False, "dali")


def test_a_staged_copy_is_not_checked_again_unless_asked():
    from common.runtime.run import staged_data_config
    from common.io.staging import StageResult
    from cosmoflow.config import CosmoDataConfig
    staged = StageResult(dir="/stage/x", mode="node", scope="node", source="/pfs/x", source_kind="plain",
                         compression="none", copied=True, checksum="xxh3_128")
    assert staged_data_config(CosmoDataConfig(dir="/pfs/x"), None).verify_checksums is None
    cfg = staged_data_config(CosmoDataConfig(dir="/pfs/x"), staged)
    assert cfg.dir == "/stage/x" and cfg.verify_checksums is False
    assert staged_data_config(CosmoDataConfig(dir="/pfs/x", verify_checksums=True), staged).verify_checksums is True
