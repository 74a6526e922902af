"""common.io.packing.load_pack: regressions found by fuzzing pack.json and staging (tests/fuzz/test_pack_fuzz.py,
docs/fuzzing.md)."""
import json

import pytest

from common.base.errors import BenchError
from common.io.packing import PACK_NAME, load_pack
from tests.unit.test_staging import make_dataset, pack


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    dataset = make_dataset(tmp_path_factory.mktemp("ds") / "data", file_bytes=600, xxh3=True)
    return pack(dataset, tmp_path_factory.mktemp("packed") / "packed", "none", 1)


def _edit(packed, tmp_path, edit):
    """A copy of the pack whose pack.json is edit(its JSON text)."""
    root = tmp_path / "packed"
    root.mkdir()
    (root / PACK_NAME).write_text(edit((packed / PACK_NAME).read_text()))
    return root


def test_an_integer_too_long_to_convert_is_unreadable_json(packed, tmp_path):
    # json.loads raises ValueError (not JSONDecodeError) for an integer of more than 4300 digits.
    root = _edit(packed, tmp_path, lambda text: text.replace('"version": 1', '"version": 1' + "0" * 5000, 1))
    with pytest.raises(BenchError, match=rf"{root / PACK_NAME}: not readable JSON \(Exceeds "
                                         rf"the limit \(4300 digits\)"):
        load_pack(root)


@pytest.mark.parametrize("key, value", [("xxh3_128", "0" * 32), ("bytes", 601)])
def test_a_member_whose_size_or_xxh3_differs_from_the_dataset_manifest_is_refused(packed, tmp_path, key, value):
    # Staging verifies each file with the member's digest and writes the dataset manifest beside it: the two must
    # agree, or the staged directory would list a size or digest its file does not have.
    def edit(text):
        obj = json.loads(text)
        entry = obj["dataset_manifest"]["splits"]["train"]["files"][0]
        entry[key] = value
        return json.dumps(obj)

    root = _edit(packed, tmp_path, edit)
    rel = json.loads((root / PACK_NAME).read_text())["dataset_manifest"]["splits"]["train"]["files"][0]["path"]
    with pytest.raises(BenchError, match=rf"{root / PACK_NAME}: member {rel} has {key} \S+, the dataset manifest "
                                         rf"says {value}"):
        load_pack(root)


def test_a_member_the_dataset_manifest_does_not_list_is_refused(packed, tmp_path):
    # Staging would write it into the staged directory beside a manifest that does not list it.
    def edit(text):
        obj = json.loads(text)
        split = obj["dataset_manifest"]["splits"]["train"]
        dropped = split["files"].pop()
        split["samples"] -= dropped["records"]
        return json.dumps(obj)

    root = _edit(packed, tmp_path, edit)
    with pytest.raises(BenchError, match=rf"{root / PACK_NAME}: 2 archive member\(s\) are no file of the dataset "
                                         rf"manifest, the first train/part_007.tfrecord$"):
        load_pack(root)


def test_an_index_path_holding_nul_is_in_no_archive(packed, tmp_path):
    # os.stat raises ValueError (not OSError) for a path holding NUL.
    def edit(text):
        obj = json.loads(text)
        obj["dataset_manifest"]["splits"]["train"]["files"][0]["index"] = "a\x00b"
        return json.dumps(obj)

    root = _edit(packed, tmp_path, edit)
    with pytest.raises(BenchError, match=rf"{root / PACK_NAME}: 1 file\(s\) of the dataset are in no archive, the "
                                         rf"first a\x00b"):
        load_pack(root)
