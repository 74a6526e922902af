"""data_prep validate: a clean dataset passes; each kind of damage is found with its file and record; all
problems are reported at once; the JSON report; exit codes; the CRC32C it checks records with."""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from common.base import exits
from common.io import tfrecord
from common.io.manifest import MANIFEST_NAME
from data_prep import tfrecords, validate
from data_prep.__main__ import main as data_prep_main
from tests.unit import test_cosmo_convert as cosmo
from tests.unit import test_deepcam_convert as deepcam


# ---------------------------------------------------------------------------- tiny datasets
@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    """Converted by the real converters: CosmoFlow (5 universes of 8^3, 4^3 samples: 3 train files and 2
    validation files of 8 records) and DeepCAM (5 + 3 snapshots of 32x48, 2 per file), each plain and gzip."""
    root = tmp_path_factory.mktemp("validate")
    universes = cosmo.make_universes(root / "universes", 5)
    snapshots = deepcam.make_dataset(root / "snapshots")
    made = {}
    for compression in ("none", "gzip"):
        suffix = "" if compression == "none" else "_gz"
        assert cosmo.convert(universes, root / f"cosmo{suffix}", compression=compression, val_universes=2) == 0
        assert deepcam.convert(snapshots, root / f"deepcam{suffix}", compression=compression) == 0
        made.update({f"cosmo{suffix}": root / f"cosmo{suffix}", f"deepcam{suffix}": root / f"deepcam{suffix}"})
    return made


@pytest.fixture
def copy(pristine, tmp_path):
    """copy(name): a private copy of a pristine dataset that the test may damage."""
    return lambda name: shutil.copytree(pristine[name], tmp_path / name)


def manifest_of(data_dir: Path) -> dict:
    return json.loads((data_dir / MANIFEST_NAME).read_text())


def files_of(data_dir: Path, split: str) -> list[str]:
    return [entry["path"] for entry in manifest_of(data_dir)["splits"][split]["files"]]


def found(report: validate.Report) -> set[tuple[str, str, int | None]]:
    """(kind, path, record) of every finding."""
    return {(f.kind, f.path, f.record) for f in report.findings}


def first(report: validate.Report, kind: str) -> validate.Finding:
    return next(f for f in report.findings if f.kind == kind)


def check(data_dir: Path) -> validate.Report:
    return validate.validate(data_dir, workers=2, progress_seconds=None)


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = data_prep_main(["validate", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, " ".join(captured.err.split())


def flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x5A
    path.write_bytes(bytes(raw))


def record_offset(data_dir: Path, rel: str, record: int) -> int:
    """Where record `record` of an uncompressed file starts (its length header), from the DALI index."""
    return tfrecord.read_index(data_dir / (rel + ".idx"))[record][0]


def rewrite_records(data_dir: Path, rel: str, change) -> None:
    """Rewrite record file `rel` with change(list of serialized records) -> records, written by TensorFlow's
    writer (correct CRCs), its index and manifest entry updated: only the content checks can tell."""
    import tensorflow as tf
    manifest = manifest_of(data_dir)
    compression = manifest["compression"]
    records = list(tf.data.TFRecordDataset(str(data_dir / rel), compression_type="GZIP" if compression == "gzip"
                                           else "").as_numpy_iterator())
    written = tfrecords.write_record_file(data_dir / rel, change(records), compression=compression)
    entry = tfrecords.file_entry(written, data_dir)
    for split in manifest["splits"].values():
        split["files"] = [dataclasses.asdict(entry) if f["path"] == rel else f for f in split["files"]]
    (data_dir / MANIFEST_NAME).write_text(json.dumps(manifest))


def edit_example(record: bytes, key: str, edit) -> bytes:
    """The record with feature `key` replaced: edit(numpy array of its values) -> new values (same dtype)."""
    import tensorflow as tf
    example = tf.train.Example.FromString(record)
    feature = example.features.feature[key]
    if feature.HasField("float_list"):
        values = edit(np.array(feature.float_list.value, dtype=np.float32))
        del feature.float_list.value[:]
        feature.float_list.value.extend(values.tolist())
    else:
        dtype = {"x": "<i2", "data": "<f4", "label": "u1"}[key]
        values = edit(np.frombuffer(feature.bytes_list.value[0], dtype=dtype).copy())
        feature.bytes_list.value[0] = values.astype(dtype).tobytes()
    return example.SerializeToString()


def replace(records: list[bytes], index: int, record: bytes) -> list[bytes]:
    return [record if i == index else r for i, r in enumerate(records)]


# ---------------------------------------------------------------------------- clean datasets
@pytest.mark.parametrize("name", ["cosmo", "cosmo_gz", "deepcam", "deepcam_gz"])
def test_a_clean_dataset_passes(pristine, name, capsys):
    code, out, _ = cli(capsys, pristine[name], "--workers", 2)
    assert code == 0, out
    assert "no problems found" in out
    total = sum(split["samples"] for split in manifest_of(pristine[name])["splits"].values())
    assert f"{total} records" in out


def test_the_input_is_not_modified(pristine, capsys):
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in pristine["deepcam"].rglob("*") if p.is_file()}
    cli(capsys, pristine["deepcam"])
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in pristine["deepcam"].rglob("*") if p.is_file()}
    assert before == after


# ---------------------------------------------------------------------------- one kind of damage each
def test_a_flipped_byte_in_record_data_fails_its_crc(copy):
    data = copy("cosmo")
    rel = files_of(data, "train")[1]
    flip(data / rel, record_offset(data, rel, 3) + 12 + 500)  # inside record 3's payload
    report = check(data)
    assert found(report) == {("crc", rel, 3), ("checksum", rel, None)}
    assert "the record's bytes changed" in first(report, "crc").expected


def test_a_flipped_byte_in_a_length_field(copy):
    data = copy("cosmo")
    rel = files_of(data, "validation")[0]
    flip(data / rel, record_offset(data, rel, 2) + 1)  # record 2's length header
    report = check(data)
    assert found(report) == {("framing", rel, 2), ("checksum", rel, None)}
    assert "fails its CRC" in first(report, "framing").found


def test_a_truncated_file(copy):
    data = copy("deepcam")
    rel = files_of(data, "train")[0]  # 2 records
    (data / rel).write_bytes((data / rel).read_bytes()[:-100])
    report = check(data)
    assert found(report) == {("size", rel, None), ("framing", rel, 1)}
    size = first(report, "size")
    assert size.found == f"{(data / rel).stat().st_size} bytes" and str(size.expected).startswith(
        f"{(data / rel).stat().st_size + 100} bytes")


def test_a_truncated_gzip_file(copy):
    data = copy("cosmo_gz")
    rel = files_of(data, "train")[2]
    (data / rel).write_bytes((data / rel).read_bytes()[:-50])
    report = check(data)
    kinds = {(kind, path) for kind, path, _ in found(report)}
    assert kinds == {("size", rel), ("framing", rel)}


def test_a_flipped_byte_in_a_gzip_file(copy):
    data = copy("cosmo_gz")
    rel = files_of(data, "validation")[1]
    flip(data / rel, (data / rel).stat().st_size // 2)
    report = check(data)
    assert {(kind, path) for kind, path, _ in found(report)} <= {("checksum", rel), ("framing", rel), ("crc", rel)}
    assert ("checksum", rel, None) in found(report)
    damage = [f for f in report.findings if f.kind in ("framing", "crc")]
    assert damage  # the GZIP stream's CRC or the records' CRCs catch it
    assert all(0 <= f.record < 8 for f in damage if f.kind == "crc")


def test_a_missing_file(copy):
    data = copy("cosmo")
    rel = files_of(data, "validation")[1]
    (data / rel).unlink()
    report = check(data)
    assert found(report) == {("missing", rel, None)}
    assert report.findings[0].found == "no such file"


def test_a_missing_index_and_auxiliary_file(copy):
    data = copy("deepcam")
    rel = files_of(data, "validation")[0]
    (data / (rel + ".idx")).unlink()
    (data / "stats.h5").unlink()
    assert found(check(data)) == {("missing", rel + ".idx", None), ("missing", "stats.h5", None)}


def test_a_changed_auxiliary_file(copy):
    data = copy("deepcam")
    flip(data / "stats.h5", 1000)
    report = check(data)
    assert found(report) == {("checksum", "stats.h5", None)}
    assert first(report, "checksum").found.startswith("xxh3_128 ")


def test_an_unlisted_extra_file(copy):
    data = copy("cosmo")
    shutil.copy(data / files_of(data, "train")[0], data / "train/extra.tfrecord")
    report = check(data)
    assert found(report) == {("unlisted", "train/extra.tfrecord", None)}


def test_an_index_line_that_does_not_point_at_its_record(copy):
    data = copy("cosmo")
    rel = files_of(data, "train")[0]
    index = data / (rel + ".idx")
    lines = index.read_text().splitlines()
    offset, size = lines[4].split()
    lines[4] = f"{int(offset) + 16} {size}"
    index.write_text("\n".join(lines) + "\n")
    report = check(data)
    assert found(report) == {("index", rel + ".idx", 4), ("checksum", rel + ".idx", None)}


def test_a_record_count_that_differs_from_the_manifest(copy):
    data = copy("deepcam")
    manifest = manifest_of(data)
    entry = manifest["splits"]["train"]["files"][2]  # the last train file: 1 record
    entry["records"] += 1
    manifest["splits"]["train"]["samples"] += 1
    (data / MANIFEST_NAME).write_text(json.dumps(manifest))
    report = check(data)
    assert found(report) == {("records", entry["path"], None)}  # the index agrees with the file
    assert first(report, "records").found == "1 records"


@pytest.mark.parametrize("name", ["deepcam", "deepcam_gz"])
def test_nan_in_a_sample_with_correct_crcs_and_checksums(copy, name):
    data = copy(name)
    rel = files_of(data, "train")[1]

    def with_nan(values):
        values[5] = np.nan
        return values

    rewrite_records(data, rel, lambda records: replace(records, 1, edit_example(records[1], "data", with_nan)))
    report = check(data)
    assert found(report) == {("non_finite", rel, 1)}
    assert "1 NaN and 0 infinite" in report.findings[0].found


def test_infinite_or_out_of_range_cosmoflow_targets(copy):
    data = copy("cosmo")
    rel = files_of(data, "validation")[0]

    def change(records):
        records = replace(records, 2, edit_example(records[2], "y", lambda y: np.array([0, np.inf, 0, 0])))
        return replace(records, 6, edit_example(records[6], "y", lambda y: np.array([0.5, 1.5, 0, 0])))

    rewrite_records(data, rel, change)
    report = check(data)
    assert found(report) == {("non_finite", rel, 2), ("range", rel, 6)}
    assert "1.5" in first(report, "range").found


def test_an_out_of_range_deepcam_label(copy):
    data = copy("deepcam")
    rel = files_of(data, "validation")[0]

    def bad_label(labels):
        labels[7 * 48 + 11] = 3
        return labels

    rewrite_records(data, rel, lambda records: replace(records, 1, edit_example(records[1], "label", bad_label)))
    report = check(data)
    assert found(report) == {("range", rel, 1)}
    assert "first 3 at (h, w) = (7, 11)" in report.findings[0].found


def test_a_record_of_the_wrong_size(copy):
    data = copy("cosmo_gz")
    rel = files_of(data, "train")[0]
    rewrite_records(data, rel, lambda records: replace(records, 4, edit_example(records[4], "x", lambda x: x[:-4])))
    report = check(data)
    assert found(report) == {("shape", rel, 4)}
    assert report.findings[0].found == f"x holds {4 ** 3 * 4 * 2 - 8} bytes"


def test_a_record_that_is_not_an_example(copy):
    data = copy("deepcam")
    rel = files_of(data, "train")[0]
    rewrite_records(data, rel, lambda records: replace(records, 1, b"\xff\xff not a protocol buffer"))
    report = check(data)
    assert found(report) == {("parse", rel, 1)}
    assert "not a tf.train.Example" in first(report, "parse").found


def test_a_train_record_duplicated_into_validation(copy):
    data = copy("deepcam")
    train, val = files_of(data, "train")[1], files_of(data, "validation")[1]
    import tensorflow as tf
    duplicate = list(tf.data.TFRecordDataset(str(data / train)).as_numpy_iterator())[0]
    rewrite_records(data, val, lambda records: replace(records, 0, duplicate))
    report = check(data)
    assert found(report) == {("overlap", val, 0)}
    assert f"the same sample as {train} record 0 (train split)" in report.findings[0].found


def test_a_file_listed_in_both_splits(copy):
    data = copy("cosmo")
    manifest = manifest_of(data)
    shared = manifest["splits"]["train"]["files"][0]
    manifest["splits"]["validation"]["files"].append(dict(shared))
    manifest["splits"]["validation"]["samples"] += shared["records"]
    (data / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert found(check(data)) == {("overlap", shared["path"], None)}


def test_a_manifest_that_describes_other_samples_or_lists_a_file_twice(copy):
    data = copy("deepcam")
    manifest = manifest_of(data)
    manifest["target_dtype"] = "float32"
    twice = manifest["splits"]["validation"]["files"][0]
    manifest["splits"]["validation"]["files"].append(dict(twice))
    manifest["splits"]["validation"]["samples"] += twice["records"]
    (data / MANIFEST_NAME).write_text(json.dumps(manifest))
    report = check(data)
    assert found(report) == {("manifest", MANIFEST_NAME, None)} and len(report.findings) == 2
    assert {f.found for f in report.findings} == {
        "sample_dtype 'float32', sample_shape [32, 48, 16], target float32 (32, 48)",
        f"{twice['path']} listed twice in the validation split"}
    assert report.records == 8  # the records were still read and their CRCs checked


# ---------------------------------------------------------------------------- all at once, output, exit codes
def test_several_problems_are_all_reported(copy, capsys):
    data = copy("cosmo")
    train, val = files_of(data, "train"), files_of(data, "validation")
    flip(data / train[0], record_offset(data, train[0], 1) + 40)
    flip(data / train[0], record_offset(data, train[0], 6) + 40)
    (data / train[1]).write_bytes((data / train[1]).read_bytes()[:-10])
    (data / val[0]).unlink()
    (data / "validation/stray.tmp").write_bytes(b"x")
    expected = {("crc", train[0], 1), ("crc", train[0], 6), ("checksum", train[0], None),
                ("size", train[1], None), ("framing", train[1], 7), ("missing", val[0], None),
                ("unlisted", "validation/stray.tmp", None)}
    assert found(check(data)) == expected
    code, out, _ = cli(capsys, data, "--max-per-kind", 1)
    assert code == exits.BAD_INPUT == 2  # a dataset with findings is bad input
    assert "7 problems: missing 1, size 1, checksum 1, unlisted 1, framing 1, crc 2\n" in out
    assert f"  {train[0]} record 1: " in out and f"  {train[0]} record 6: " not in out  # one crc line shown
    assert "  ... and 1 more (--json writes them all)" in out
    for path in (train[1], val[0], "validation/stray.tmp"):
        assert f"  {path}" in out


def test_json_report(copy, capsys):
    data = copy("deepcam")
    rel = files_of(data, "train")[0]
    flip(data / rel, record_offset(data, rel, 1) + 100)
    out_path = data.parent / "reports" / "validate.json"
    code, _, _ = cli(capsys, data, "--json", out_path)
    assert code == exits.BAD_INPUT
    report = json.loads(out_path.read_text())
    assert report["dataset"] == str(data) and report["format"] == "deepcam-tfrecord"
    assert report["clean"] is False and report["problems"] == 2
    assert report["counts"] == {"checksum": 1, "crc": 1}
    assert report["splits"] == {"train": {"files": 3, "records": 5}, "validation": {"files": 2, "records": 3}}
    crc = next(f for f in report["findings"] if f["kind"] == "crc")
    assert (crc["path"], crc["record"]) == (rel, 1)
    assert crc["found"].startswith("its ") and crc["expected"].startswith("0x")
    assert crc["message"] == f"{rel} record 1: {crc['found']}; expected {crc['expected']}"
    assert [p.name for p in out_path.parent.iterdir()] == ["validate.json"]  # no temporary left


def test_json_report_of_a_clean_dataset(pristine, tmp_path, capsys):
    code, _, _ = cli(capsys, pristine["cosmo_gz"], "--json", tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and report["clean"] is True and report["findings"] == [] and report["records_read"] == 40


def test_missing_directory_or_manifest_is_bad_usage(pristine, tmp_path, capsys):
    code, _, err = cli(capsys, tmp_path / "nowhere")
    assert code == 2 and "nowhere: dataset directory not found" in err
    (tmp_path / "empty").mkdir()
    code, _, err = cli(capsys, tmp_path / "empty")
    assert code == 2 and "has no manifest.json" in err


def test_progress_lines_name_files_done_and_the_rate(capsys):
    def slow(job):
        time.sleep(0.2)
        return job

    counter = validate._Counter()
    jobs = [("train", type("E", (), {"bytes": 10})()) for _ in range(4)]
    assert validate._run(jobs, slow, 1, counter, progress_seconds=0.0) == jobs
    err = capsys.readouterr().err
    assert "validate: 1/4 files, 0.0 of 0.0 MB" in err and "MB/s" in err
