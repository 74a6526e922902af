"""common.io.manifest: load, validate and check a dataset directory against its manifest.json."""
from __future__ import annotations

import hashlib
import json

import pytest

from common.io import manifest as manifest_module
from common.base.errors import BenchError
from common.io.manifest import FileEntry, Manifest, SplitEntry, check_split_files, load_manifest, xxh3_128_file
from common.io.manifest_write import file_digests, sha256_file, write_manifest


def _record_file(root, rel, lengths, with_index=True) -> FileEntry:
    """A stand-in record file: framed sizes as in a TFRecord file (payload + 16), arbitrary bytes."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    sizes = [n + 16 for n in lengths]
    path.write_bytes(bytes(range(256)) * (sum(sizes) // 256) + bytes(sum(sizes) % 256))
    index = index_sha = index_xxh3 = None
    if with_index:
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        (root / f"{rel}.idx").write_text("".join(f"{o} {s}\n" for o, s in zip(offsets, sizes)))
        index, index_sha = f"{rel}.idx", sha256_file(root / f"{rel}.idx")
        index_xxh3 = xxh3_128_file(root / index)
    return FileEntry(path=rel, records=len(lengths), bytes=sum(sizes), sha256=sha256_file(path), index=index,
                     index_sha256=index_sha, xxh3_128=xxh3_128_file(path), index_xxh3_128=index_xxh3)


def _manifest(root, compression="none") -> Manifest:
    with_index = compression == "none"
    train = (_record_file(root, "train/a.tfrecord", [100, 100, 100], with_index),
             _record_file(root, "train/b.tfrecord", [100, 100, 100], with_index))
    val = (_record_file(root, "validation/c.tfrecord", [100, 100, 100], with_index),)
    return Manifest(root=root, format="cosmoflow-tfrecord", version=1, sample_shape=(4, 4, 4, 4),
                    sample_dtype="int16", target_size=4, compression=compression,
                    splits={"train": SplitEntry(samples=6, files=train),
                            "validation": SplitEntry(samples=3, files=val)},
                    source={"kind": "test"}, seed=7)


@pytest.fixture
def dataset(tmp_path):
    manifest = _manifest(tmp_path)
    write_manifest(manifest, tmp_path)
    return tmp_path


def _edit_json(root, edit) -> None:
    obj = json.loads((root / "manifest.json").read_text())
    edit(obj)
    (root / "manifest.json").write_text(json.dumps(obj))


def test_round_trip_and_checks_pass(tmp_path):
    written = _manifest(tmp_path)
    path = write_manifest(written, tmp_path)
    assert path == tmp_path / "manifest.json"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left
    loaded = load_manifest(tmp_path, expected_format="cosmoflow-tfrecord")
    assert loaded == written
    for split in ("train", "validation"):
        check_split_files(loaded, split, verify_checksums=True)


def test_write_accepts_a_dict_and_rejects_an_invalid_one(tmp_path):
    obj = _manifest(tmp_path, compression="gzip").to_dict()
    write_manifest(obj, tmp_path)
    assert load_manifest(tmp_path).compression == "gzip"
    obj["splits"]["train"]["samples"] = 99
    with pytest.raises(BenchError, match="key splits.train.samples = 99: expected the 6 records"):
        write_manifest(obj, tmp_path)
    assert load_manifest(tmp_path).splits["train"].samples == 6  # the earlier manifest is untouched


def test_sha256_file_streams(tmp_path):
    data = bytes(range(256)) * 5000
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f", chunk_bytes=1000) == hashlib.sha256(data).hexdigest()


def test_missing_directory(tmp_path):
    with pytest.raises(BenchError, match="dataset directory not found") as err:
        load_manifest(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(err.value)


def test_directory_without_manifest_says_unfinished(tmp_path):
    with pytest.raises(BenchError, match="exists but has no manifest.json.*unfinished") as err:
        load_manifest(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_bad_json(dataset):
    (dataset / "manifest.json").write_text("{not json")
    with pytest.raises(BenchError, match="manifest.json: not readable JSON"):
        load_manifest(dataset)


@pytest.mark.parametrize("key", ["format", "sample_shape", "compression", "splits", "source"])
def test_missing_key(dataset, key):
    _edit_json(dataset, lambda obj: obj.pop(key))
    with pytest.raises(BenchError, match=f"missing key {key}: expected"):
        load_manifest(dataset)


def test_missing_file_key_names_the_split(dataset):
    _edit_json(dataset, lambda obj: obj["splits"]["validation"]["files"][0].pop("sha256"))
    with pytest.raises(BenchError, match=r"missing key splits.validation.files\[0\].sha256: expected a string"):
        load_manifest(dataset)


def test_mistyped_value(dataset):
    _edit_json(dataset, lambda obj: obj.update(target_size="4"))
    with pytest.raises(BenchError, match="key target_size = '4': expected an integer"):
        load_manifest(dataset)


def test_unknown_format_and_version(dataset):
    _edit_json(dataset, lambda obj: obj.update(format="imagenet-jpeg"))
    with pytest.raises(BenchError, match=r"key format = 'imagenet-jpeg': expected one of \['cosmoflow-tfrecord', 'deepcam-tfrecord'\]"):
        load_manifest(dataset)
    _edit_json(dataset, lambda obj: obj.update(format="cosmoflow-tfrecord", version=2))
    with pytest.raises(BenchError, match="key version = 2: expected 1 to 1"):
        load_manifest(dataset)


def test_expected_format(dataset, monkeypatch):
    monkeypatch.setitem(manifest_module.FORMATS, "deepcam-tfrecord", 1)
    with pytest.raises(BenchError, match="format 'cosmoflow-tfrecord', expected 'deepcam-tfrecord'"):
        load_manifest(dataset, expected_format="deepcam-tfrecord")


def test_sample_count_must_equal_records(dataset):
    _edit_json(dataset, lambda obj: obj["splits"]["train"].update(samples=5))
    with pytest.raises(BenchError, match="key splits.train.samples = 5: expected the 6 records its 2 files hold"):
        load_manifest(dataset)


def test_paths_must_stay_inside_the_directory(dataset):
    _edit_json(dataset, lambda obj: obj["splits"]["train"]["files"][0].update(path="../elsewhere.tfrecord"))
    with pytest.raises(BenchError, match="expected a path relative to the dataset directory"):
        load_manifest(dataset)


def test_missing_split(dataset):
    with pytest.raises(BenchError, match="no 'test' split"):
        check_split_files(load_manifest(dataset), "test")


def test_missing_file(dataset):
    (dataset / "train/b.tfrecord").unlink()
    with pytest.raises(BenchError, match="train/b.tfrecord: listed in the manifest .* but missing"):
        check_split_files(load_manifest(dataset), "train")


def test_size_mismatch(dataset):
    with open(dataset / "train/a.tfrecord", "ab") as f:
        f.write(b"x")
    with pytest.raises(BenchError, match=r"train/a.tfrecord: 349 bytes, the manifest says 348"):
        check_split_files(load_manifest(dataset), "train")


def test_checksum_mismatch_only_with_verify(dataset):
    path = dataset / "validation/c.tfrecord"
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF  # same size, different content
    path.write_bytes(bytes(data))
    manifest = load_manifest(dataset)
    check_split_files(manifest, "validation")
    with pytest.raises(BenchError, match="validation/c.tfrecord: xxh3_128 [0-9a-f]{32}, the manifest says"):
        check_split_files(manifest, "validation", verify_checksums=True)


def test_index_checksum_mismatch(dataset):
    index = dataset / "train/a.tfrecord.idx"
    index.write_text(index.read_text().replace("\n", " \n"))  # same numbers, different bytes
    check_split_files(load_manifest(dataset), "train")
    with pytest.raises(BenchError, match="a.tfrecord.idx: xxh3_128"):
        check_split_files(load_manifest(dataset), "train", verify_checksums=True)


def test_index_missing(dataset):
    (dataset / "train/a.tfrecord.idx").unlink()
    with pytest.raises(BenchError, match="a.tfrecord.idx: DALI index of train/a.tfrecord .* missing"):
        check_split_files(load_manifest(dataset), "train")


def test_index_line_count_mismatch(dataset):
    index = dataset / "train/b.tfrecord.idx"
    index.write_text("".join(index.read_text().splitlines(keepends=True)[:2]))
    with pytest.raises(BenchError, match="b.tfrecord.idx: 2 index lines, expected 3"):
        check_split_files(load_manifest(dataset), "train")


def test_index_must_cover_the_file(dataset):
    (dataset / "train/a.tfrecord.idx").write_text("0 116\n116 116\n240 116\n")
    with pytest.raises(BenchError, match=r"line 3 is '240 116', expected \"232 <size>\""):
        check_split_files(load_manifest(dataset), "train")


def test_compressed_files_have_no_index(tmp_path):
    write_manifest(_manifest(tmp_path, compression="gzip"), tmp_path)
    manifest = load_manifest(tmp_path)
    assert all(f.index is None and f.index_sha256 is None for f in manifest.splits["train"].files)
    check_split_files(manifest, "train", verify_checksums=True)


def test_xxh3_digests_are_kept_and_used_for_verification(dataset):
    manifest = load_manifest(dataset)
    assert manifest.splits["train"].files[0].xxh3_128 == manifest_module.xxh3_128_file(dataset / "train/a.tfrecord")
    assert manifest.to_dict()["splits"]["train"]["files"][0]["index_xxh3_128"] is not None
    check_split_files(manifest, "train", verify_checksums=True)
    path = dataset / "train/b.tfrecord"
    data = bytearray(path.read_bytes())
    data[5] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(BenchError, match="train/b.tfrecord: xxh3_128 [0-9a-f]{32}, the manifest says [0-9a-f]{32}"):
        check_split_files(manifest, "train", verify_checksums=True)


@pytest.mark.parametrize("key", ["xxh3_128", "index_xxh3_128"])
def test_a_manifest_without_xxh3_digests_is_refused(dataset, key):
    _edit_json(dataset, lambda obj: obj["splits"]["train"]["files"][0].pop(key))
    with pytest.raises(BenchError, match=rf"splits.train.files\[0\].{key}"):
        load_manifest(dataset)


def test_file_digests_match_hashlib_and_xxhash(tmp_path):
    import xxhash
    data = bytes(range(256)) * 5000
    (tmp_path / "f").write_bytes(data)
    assert file_digests(tmp_path / "f", chunk_bytes=999) == (
        hashlib.sha256(data).hexdigest(), xxhash.xxh3_128(data).hexdigest())


def test_malformed_xxh3_is_refused(dataset):
    _edit_json(dataset, lambda obj: obj["splits"]["train"]["files"][0].update(xxh3_128="abc"))
    with pytest.raises(BenchError, match=r"key splits.train.files\[0\].xxh3_128 = 'abc': expected 32 lower-case hex"):
        load_manifest(dataset)


# ---------------------------------------------------------------------------- regressions found by fuzzing
# (tests/fuzz/test_manifest_fuzz.py, docs/fuzzing.md)
def test_json_nested_too_deeply(dataset):
    (dataset / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BenchError, match="manifest.json: not readable JSON \\(nested too deeply\\)"):
        load_manifest(dataset)


def test_negative_counts_and_sizes_are_refused(dataset):
    def negative_records(obj):  # consistent with its split's samples, as a buggy converter would write it
        obj["splits"]["train"]["files"][0]["records"] = -3
        obj["splits"]["train"]["samples"] = 0
    _edit_json(dataset, negative_records)
    with pytest.raises(BenchError, match=r"key splits.train.files\[0\].records = -3: expected an integer >= 0"):
        load_manifest(dataset)
    _edit_json(dataset, lambda obj: obj["splits"].update(train={"samples": 0, "files": []}, validation={
        "samples": -1, "files": []}))
    with pytest.raises(BenchError, match="key splits.validation.samples = -1: expected the 0 records"):
        load_manifest(dataset)


@pytest.mark.parametrize("size", [0, -4])
def test_target_size_must_be_positive(dataset, size):
    _edit_json(dataset, lambda obj: obj.update(target_size=size))
    with pytest.raises(BenchError, match=f"manifest.json: key target_size = {size}: expected an integer >= 1"):
        load_manifest(dataset)


@pytest.mark.parametrize("text, words", [(b"0 116\n\xff16 116\n232 116\n", "not readable text"),
                                         ("0 116\n116 116\n23\u00b2 116\n".encode(), "line 3 is '23\u00b2 116'")])
def test_index_that_is_not_ascii_numbers(dataset, text, words):
    (dataset / "train/a.tfrecord.idx").write_bytes(text)
    with pytest.raises(BenchError) as err:
        check_split_files(load_manifest(dataset), "train")
    assert str(dataset / "train/a.tfrecord.idx") in str(err.value) and words in str(err.value)


def test_a_file_name_too_long_for_the_file_system(dataset):
    _edit_json(dataset, lambda obj: obj["splits"]["train"]["files"][1].update(path="x" * 300))
    with pytest.raises(BenchError, match=f"{dataset / ('x' * 300)}: listed in the manifest but cannot be read"):
        check_split_files(load_manifest(dataset), "train")


def test_json_with_an_integer_python_will_not_convert(dataset):
    # Python refuses to convert integers of more than 4,300 digits with a ValueError that is no JSONDecodeError.
    (dataset / "manifest.json").write_text('{"version": ' + "9" * 5000 + "}")
    with pytest.raises(BenchError, match="manifest.json: not readable JSON"):
        load_manifest(dataset)
