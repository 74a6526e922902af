"""Fuzzing the record parsers: CosmoFlow's and DeepCAM's TFRecord input pipelines (cosmoflow/data.py,
deepcam/data.py) read as training reads them, through tf.data and through DALI, with a read failure turned into
the application's error naming the file and record (`read_error`, as common/runtime/run.py does).

Inputs: tiny converted datasets (uncompressed with DALI indexes, and GZIP) with corrupted bytes in a record file
(length, CRCs, payload; truncated or grown, which the manifest's sizes catch first), and record files rewritten
with correct framing, index and manifest entry but one record that is not what the loader expects: a payload
that is no Example, a feature missing or of the wrong size or type, extra features, or values no converter
writes. Each read runs in a worker process (harness.Isolated). Promise: a BenchError naming the file, or exactly
the intact batches; never another exception, a crash, a hang, or other batches, with one exception that the
project documents: DALI checks no record CRC, so a changed payload byte in an uncompressed dataset reaches
training when data.verify_checksums=false (by default DALI reads only verified files; README.md; counted here,
not failed). DALI's own failures on
well-framed wrong records are open findings, counted and not failed (docs/fuzzing.md).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.io.manifest import load_manifest
from tests.fuzz import readers
from tests.conftest import copy_of
from tests.fuzz.harness import Isolated, corrupt_file, corruptions, fuzz, timed
from tests.unit.test_cosmo_convert import convert as cosmo_convert, make_universes
from tests.unit.test_deepcam_convert import convert as deepcam_convert, make_dataset

LIMIT_S = 120.0  # per read in the worker (building a DALI pipeline is the slow part)
LOADERS = ("tfdata", "dali")
SHAPES = {"cosmoflow": (4, 4, 4, 4), "deepcam": (16, 16, 16)}


@pytest.fixture(scope="module")
def worker():
    isolated = Isolated(LIMIT_S, initializer=readers.quiet_tensorflow)
    yield isolated
    isolated.close()


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(app, compression) -> a converted dataset: CosmoFlow 16 training and 8 validation samples in 3 files,
    DeepCAM 4 and 2 samples of 16x16 in 3 files."""
    raw = tmp_path_factory.mktemp("raw")
    make_universes(raw / "cosmo", 3)
    make_dataset(raw / "deepcam", train=4, validation=2, shape=(16, 16))
    out = {}
    for compression in ("none", "gzip"):
        cosmo = tmp_path_factory.mktemp(f"cosmo-{compression}")
        assert cosmo_convert(raw / "cosmo", cosmo, compression=compression, val_universes=1) == 0
        deepcam = tmp_path_factory.mktemp(f"deepcam-{compression}")
        assert deepcam_convert(raw / "deepcam", deepcam, samples_per_file=2, compression=compression) == 0
        out["cosmoflow", compression], out["deepcam", compression] = cosmo, deepcam
    return out


_INTACT: dict = {}


def intact(worker: Isolated, app: str, root: Path, compression: str, loader: str) -> dict:
    key = (app, compression, loader)
    if key not in _INTACT:
        outcome, value = worker.call(readers.app_records, app, str(root), SHAPES[app], loader, False)
        assert outcome == "ok", value
        _INTACT[key] = value
    return _INTACT[key]


def record_files(root: Path) -> list[str]:
    manifest = load_manifest(root)
    return [f.path for split in manifest.splits.values() for f in split.files]


def check(outcome: str, value, expected: dict, culprit: Path, loader: str, verify: bool, values_only: bool = False
          ) -> str:
    """Assert the promise for one read; returns the outcome for the tally."""
    assert outcome not in ("crash", "died", "hang"), f"{culprit} ({loader}): {outcome}\n{value}"
    if outcome in ("BenchError", "UnicodeDecodeError"):
        assert str(culprit) in value, value
        return outcome if outcome == "BenchError" else "UnicodeDecodeError (open finding), diagnosed"
    if value["digest"] == expected["digest"]:
        return "read as intact"
    if value["loader"] == "dali" and not verify:
        return "DALI read changed bytes (no CRC check, documented)"
    if values_only:  # right sizes, values no converter writes: the parsers check sizes, not values (documented)
        return "bad values read as such (documented)"
    raise AssertionError(f"{culprit} ({value['loader']}): other batches read without an error: {value}")


# ---------------------------------------------------------------------------- corrupted bytes
@fuzz(examples=15, deadline_s=300)
@given(data=st.data(), app=st.sampled_from(sorted(SHAPES)), compression=st.sampled_from(["none", "gzip"]),
       loader=st.sampled_from(LOADERS), verify=st.booleans())
def test_corrupted_record_bytes(worker, datasets, tmp_path_factory, data, app, compression, loader, verify):
    loader = "tfdata" if compression == "gzip" else loader  # DALI reads uncompressed records only
    root = copy_of(datasets[app, compression], tmp_path_factory)
    rel = data.draw(st.sampled_from(record_files(root)), label="record file")
    size = (root / rel).stat().st_size
    corrupt_file(root / rel, data.draw(corruptions(size), label="corruption"))
    expected = intact(worker, app, datasets[app, compression], compression, loader)
    with timed(f"records: corrupted bytes ({app}, {loader})") as box:
        outcome, value = worker.call(readers.app_records, app, str(root), SHAPES[app], loader, verify)
        if loader == "dali" and not verify and outcome == "died":
            # docs/fuzzing.md: DALI, checking no CRC, parses the changed bytes and can die of them, which is why
            # data.verify_checksums is on for DALI unless set to false (as here).
            box[0] = "DALI crashed on a changed byte (verify_checksums=false)"
            return
        box[0] = check(outcome, value, expected, root / rel, loader, verify)


# ---------------------------------------------------------------------------- well-framed records that are wrong
FEATURES = {"cosmoflow": ("x", "y"), "deepcam": ("data", "label")}
RIGHT_BYTES = {"x": 4 * 4 * 4 * 4 * 2, "data": 16 * 16 * 16 * 4, "label": 16 * 16}  # a feature's size in SHAPES
feature_specs = st.sampled_from(["keep", "drop", "values"]) | st.tuples(
    st.sampled_from(["bytes", "floats", "ints"]), st.sampled_from([0, 1, 3, 4, 255, 256, 511, 512, 513, 1024, 16383,
                                                                    16384, 16385]))


@st.composite
def record_specs(draw, app: str):
    if draw(st.integers(0, 5)) == 0:
        return {"raw": draw(st.binary(max_size=64))}
    spec = {name: draw(feature_specs, label=name) for name in FEATURES[app]}
    if draw(st.booleans()):
        spec[draw(st.sampled_from(["z", "extra"]), label="extra feature")] = ("floats", 2)
    return spec


def bad_values(spec: dict) -> bool:
    """Whether a record spec keeps every size right but writes values no converter writes."""
    return any(choice == "values" or choice == ("bytes", RIGHT_BYTES.get(name)) for name, choice in spec.items())


@fuzz(examples=15, deadline_s=300)
@given(data=st.data(), app=st.sampled_from(sorted(SHAPES)), compression=st.sampled_from(["none", "gzip"]),
       loader=st.sampled_from(LOADERS))
def test_wrong_records_in_good_frames(worker, datasets, tmp_path_factory, data, app, compression, loader):
    loader = "tfdata" if compression == "gzip" else loader
    root = copy_of(datasets[app, compression], tmp_path_factory)
    files = record_files(root)
    rel = data.draw(st.sampled_from(files), label="record file")
    number = data.draw(st.integers(0, load_manifest(root).splits["train" if "train" in rel else "validation"]
                                   .files[0].records - 1), label="record")
    spec = data.draw(record_specs(app), label="record")
    outcome, value = worker.call(readers.replace_record, app, str(root), rel, number, spec)
    assert outcome == "ok", value
    expected = intact(worker, app, datasets[app, compression], compression, loader)
    with timed(f"records: wrong record in a good frame ({app}, {loader})") as box:
        outcome, value = worker.call(readers.app_records, app, str(root), SHAPES[app], loader, True)
        if loader == "dali" and (outcome == "died" or outcome == "ok" and value["digest"] != expected["digest"]
                                 and not bad_values(spec)):
            # Open findings in DALI 2.4.0's reader (docs/fuzzing.md): a number list where bytes belong kills the
            # process (SIGSEGV); a target of the wrong size or type is read without an error.
            box[0] = f"DALI {'crashed' if outcome == 'died' else 'read a wrong record'} (open finding)"
            return
        box[0] = check(outcome, value, expected, root / rel, loader, True, bad_values(spec))
    if outcome in ("BenchError", "UnicodeDecodeError") and str(root / rel) in value:
        assert f"record {number} " in value, f"the diagnosis names another record than {number}: {value}"
