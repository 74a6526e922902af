"""Fuzzing the HDF5 readers: CosmoFlow universes (data_prep/cosmo_convert.py), DeepCAM snapshots
(data_prep/deepcam_convert.py) and DeepCAM's stats.h5 (deepcam/data.py read_stats).

Inputs: tiny valid files with corrupted bytes (anywhere, or in the first 2 KiB where HDF5 keeps its
superblock and object headers), and files rewritten with datasets missing or of other shapes, dtypes and
values (negative counts, NaN, labels outside the classes), contiguous or chunked and compressed. Each read
runs in a worker process, so that a crash or a hang of the HDF5 library is a finding, not the end of the
session. Promise: a BenchError naming the file, or what the intact file gives, or (for bytes of raw data,
which HDF5 stores without checksums) a sample that passes every check the converter makes: never another
exception, a crash, a hang, or a sample that breaks those checks (negative counts, non-finite values,
labels outside 0-2).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import readers
from tests.fuzz.harness import Isolated, corrupt_file, corruptions, fuzz, timed
from tests.unit.test_deepcam_convert import make_snapshot, write_stats

LIMIT_S = 60.0  # per read, in the worker; a tiny file takes milliseconds
SAMPLE_SIZE = 4  # universes of 8^3: 8 sub-cubes


@pytest.fixture(scope="module")
def worker():
    isolated = Isolated(LIMIT_S)
    yield isolated
    isolated.close()


def make_universe(path: Path, chunked: bool, full=None, unit=None) -> Path:
    """An 8^3 x 4 int16 universe (random counts 0-49) with 4 unitPar floats; `full` / `unit` replace them."""
    rng = np.random.default_rng(0)
    full = rng.integers(0, 50, size=(8, 8, 8, 4)).astype(np.int16) if full is None else full
    unit = rng.uniform(-1, 1, size=4).astype(np.float32) if unit is None else unit
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        options = {"chunks": True, "compression": "gzip"} if chunked and np.ndim(full) > 0 and np.size(full) > 0 else {}
        f.create_dataset("full", data=full, **options)
        f["unitPar"] = unit
    return path


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hdf5")
    snapshot = make_snapshot(root / "snapshot.h5", shape=(16, 24))
    return {"universe": make_universe(root / "universe.h5", chunked=False),
            "universe (chunked, gzip)": make_universe(root / "universe_chunked.h5", chunked=True),
            "snapshot": snapshot, "stats": write_stats(root / "stats.h5", [snapshot])}


READERS = {"universe": readers.cosmo_universe, "universe (chunked, gzip)": readers.cosmo_universe,
           "snapshot": readers.deepcam_snapshot, "stats": readers.deepcam_stats}


def read(worker: Isolated, kind: str, path: Path, training: bool = True):
    args = (str(path), SAMPLE_SIZE, training) if kind.startswith("universe") else (str(path),)
    return worker.call(READERS[kind], *args)


# ---------------------------------------------------------------------------- the promise
def check(kind: str, path: Path, outcome: str, value, intact) -> str:
    """Assert the promise for one read; returns the outcome for the tally."""
    assert outcome not in ("crash", "died", "hang"), f"{kind} {path}: {outcome}\n{value}"
    if outcome == "BenchError":
        assert str(path) in value, value
        return "BenchError"
    if intact is not None and value == intact:
        return "read as intact"
    plausible(kind, value, path)
    return "changed, passes the checks"


def plausible(kind: str, summary: dict, path: Path) -> None:
    """What a sample that is read without an error must satisfy."""
    if kind.startswith("universe"):
        n = SAMPLE_SIZE
        assert summary["cubes"] == (summary["size"] // n) ** 3 and summary["cubes"] > 0, summary
        assert summary["shapes"] == [(n, n, n, 4)] and summary["dtypes"] == ["<i2"], summary
        assert summary["min"] >= 0, f"{path}: negative particle counts converted silently: {summary}"
        assert np.all(np.isfinite(summary["target"])), summary
    elif kind == "snapshot":
        height, width = summary["shape"]
        assert summary["fields"] == ((height, width, 16), "<f4") and summary["labels"] == ((height, width), "|u1")
        assert summary["finite"] and set(summary["classes"]) <= {0, 1, 2}, summary
    else:
        for norm in ("minmax", "meanstd"):
            result = summary[norm]
            if isinstance(result, str):
                assert str(path) in result, result
            else:
                assert result == {"finite": True, "positive": True}, summary


# ---------------------------------------------------------------------------- corrupted bytes
KINDS = ("universe", "universe (chunked, gzip)", "snapshot", "stats")


@fuzz(examples=40, deadline_s=60)
@given(data=st.data(), kind=st.sampled_from(KINDS), training=st.booleans())
def test_corrupted_hdf5_bytes(worker, originals, tmp_path_factory, data, kind, training):
    path = tmp_path_factory.mktemp("corrupt") / originals[kind].name
    shutil.copyfile(originals[kind], path)
    size = path.stat().st_size
    metadata = data.draw(st.booleans(), label="in the first 2 KiB")
    corrupt_file(path, data.draw(corruptions(size, last=2048 if metadata else None), label="corruption"))
    intact = _intact(worker, kind, originals[kind], training)
    with timed(f"hdf5: corrupted {kind}") as box:
        outcome, value = read(worker, kind, path, training)
        box[0] = check(kind, path, outcome, value, intact)


_INTACT: dict = {}


def _intact(worker: Isolated, kind: str, path: Path, training: bool):
    key = (kind, training)
    if key not in _INTACT:
        outcome, value = read(worker, kind, path, training)
        assert outcome == "ok", value
        _INTACT[key] = value
    return _INTACT[key]


# ---------------------------------------------------------------------------- rewritten datasets
shapes = st.lists(st.sampled_from([0, 1, 2, 3, 4, 8, 16]), min_size=0, max_size=5).map(tuple)
dtypes = st.sampled_from(["int16", "int32", "int64", "uint8", "uint16", "float32", "float64", "bool", "S4"])
fills = st.sampled_from(["counts", "negative", "huge", "nan", "zeros"])


def array(shape, dtype: str, fill: str, rng) -> np.ndarray:
    values = {"counts": lambda: rng.integers(0, 50, size=shape), "negative": lambda: rng.integers(-5, 5, size=shape),
              "huge": lambda: rng.integers(2 ** 15, 2 ** 31, size=shape).astype(np.float64) * 1e3,
              "nan": lambda: np.where(rng.random(shape) < 0.1, np.nan, 1.0), "zeros": lambda: np.zeros(shape)}[fill]
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(values()).astype(dtype)


@fuzz(examples=40, deadline_s=60)
@given(data=st.data(), training=st.booleans(), chunked=st.booleans())
def test_rewritten_universe(worker, tmp_path_factory, data, training, chunked):
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1), label="seed"))
    valid_full = data.draw(st.booleans(), label="keep a valid 'full'")
    full = None if valid_full else array(data.draw(shapes | st.just((8, 8, 8, 4)), label="full shape"),
                                         data.draw(dtypes, label="full dtype"), data.draw(fills, label="full fill"),
                                         rng)
    unit = None if data.draw(st.booleans(), label="keep a valid 'unitPar'") else array(
        data.draw(shapes | st.just((4,)), label="unitPar shape"), data.draw(dtypes, label="unitPar dtype"),
        data.draw(fills, label="unitPar fill"), rng)
    path = make_universe(tmp_path_factory.mktemp("universe") / "universe.h5", chunked, full, unit)
    drop = data.draw(st.sampled_from([None, "full", "unitPar"]), label="delete dataset")
    if drop:
        with h5py.File(path, "r+") as f:
            del f[drop]
            if data.draw(st.booleans(), label="a group in its place"):
                f.create_group(drop)
    with timed("hdf5: rewritten universe") as box:
        outcome, value = read(worker, "universe", path, training)
        box[0] = check("universe", path, outcome, value, None)


@fuzz(examples=40, deadline_s=60)
@given(data=st.data())
def test_rewritten_snapshot(worker, tmp_path_factory, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1), label="seed"))
    path = make_snapshot(tmp_path_factory.mktemp("snapshot") / "snapshot.h5", shape=(16, 24))
    with h5py.File(path, "r+") as f:
        for key, good_shape in (("climate/data", (16, 24, 16)), ("climate/labels_0", (16, 24))):
            change = data.draw(st.sampled_from(["keep", "replace", "delete", "group"]), label=f"{key}")
            if change == "keep":
                continue
            del f[key]
            if change == "replace":
                f[key] = array(data.draw(shapes | st.just(good_shape), label=f"{key} shape"),
                               data.draw(dtypes, label=f"{key} dtype"), data.draw(fills, label=f"{key} fill"), rng)
            elif change == "group":
                f.create_group(key)
    with timed("hdf5: rewritten snapshot") as box:
        outcome, value = read(worker, "snapshot", path)
        box[0] = check("snapshot", path, outcome, value, None)


@fuzz(examples=40, deadline_s=60)
@given(data=st.data())
def test_rewritten_stats(worker, originals, tmp_path_factory, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1), label="seed"))
    path = tmp_path_factory.mktemp("stats") / "stats.h5"
    shutil.copyfile(originals["stats"], path)
    with h5py.File(path, "r+") as f:
        key = "climate/" + data.draw(st.sampled_from(["count", "mean", "sqmean", "minval", "maxval"]), label="key")
        change = data.draw(st.sampled_from(["replace", "delete", "group", "equal min and max"]), label="change")
        if change == "equal min and max":
            f["climate/maxval"][...] = f["climate/minval"][()]
        else:
            del f[key]
            if change == "replace":
                f[key] = array(data.draw(shapes | st.just((16,)), label="shape"), data.draw(dtypes, label="dtype"),
                               data.draw(fills, label="fill"), rng)
            elif change == "group":
                f.create_group(key)
    with timed("hdf5: rewritten stats.h5") as box:
        outcome, value = read(worker, "stats", path)
        box[0] = check("stats", path, outcome, value, None)
