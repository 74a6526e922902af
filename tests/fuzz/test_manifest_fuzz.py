"""Fuzzing the manifest reader (common/io/manifest.py: load_manifest and the file checks that follow it) and the
pack.json reader (common/io/packing.py: load_pack).

Inputs: valid manifest.json / pack.json files with corrupted bytes, with one JSON value deleted, replaced by a
random one (absurd numbers, other types, paths that leave the directory) or given another type, JSON nested
absurdly deep; and DALI index files with corrupted bytes. Promise: a BenchError naming the file, or a manifest
that is consistent (paths inside the directory, counts and sizes >= 0, sample counts equal to the records,
unchanged by writing and reading it again) whose file checks pass or raise a BenchError; never another
exception or a hang.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.io.manifest import (MANIFEST_NAME, AuxFile, Manifest, SplitEntry, check_aux_file, check_split_files,
                                load_manifest, xxh3_128_file)
from common.io.manifest_write import write_manifest
from common.io.packing import PACK_NAME, load_pack
from tests.conftest import copy_of
from tests.fuzz.harness import corrupt_file, corruptions, fuzz, outcome_of, time_limit, timed
from tests.unit.test_manifest import _record_file

LIMIT_S = 10.0  # per input; reading a manifest takes milliseconds

numbers = st.sampled_from([0, -1, 1, 2, 3, 6, 2 ** 31, 2 ** 63, 10 ** 30, -10 ** 30, 1.5, 1e308, math.nan, math.inf,
                           -math.inf, True, False]) | st.integers() | st.floats()
paths = st.sampled_from(["../x", "/etc/passwd", "train/../../x", "a/../b", "", ".", "..", "train", "x" * 300,
                         "a\x00b", "manifest.json", "train/a.tfrecord/", "\\..\\x", "~/x", "./train/a.tfrecord",
                         "train//a.tfrecord", "\ud800", "train/a.tfrecord.idx"]) | st.text(max_size=20)
json_values = st.recursive(st.none() | numbers | paths,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=3), max_leaves=6)


def dataset(root: Path, kind: str) -> Path:
    """A dataset directory with stand-in record files, DALI indexes, xxh3 digests and (deepcam) an aux file."""
    with_index = kind != "gzip"
    entries = [_record_file(root, rel, lengths, with_index) for rel, lengths in
               (("train/a.tfrecord", [100, 100, 100]), ("train/b.tfrecord", [60, 60, 60]),
                ("validation/c.tfrecord", [100, 100, 100]))]
    entries = [dataclasses.replace(e, xxh3_128=xxh3_128_file(root / e.path),
                                   index_xxh3_128=xxh3_128_file(root / e.index) if e.index else None)
               for e in entries]
    splits = {"train": SplitEntry(samples=6, files=tuple(entries[:2])),
              "validation": SplitEntry(samples=3, files=(entries[2],))}
    if kind == "deepcam":
        (root / "stats.h5").write_bytes(bytes(range(200)))
        from common.io.manifest_write import file_digests
        sha, xxh = file_digests(root / "stats.h5")
        manifest = Manifest(root=root, format="deepcam-tfrecord", version=1, sample_shape=(2, 3, 16),
                            sample_dtype="float32", target_size=6, target_shape=(2, 3), target_dtype="uint8",
                            compression="none", splits=splits, source={"kind": "test"},
                            aux_files={"stats": AuxFile("stats.h5", 200, sha, xxh)})
    else:
        manifest = Manifest(root=root, format="cosmoflow-tfrecord", version=1, sample_shape=(4, 4, 4, 4),
                            sample_dtype="int16", target_size=4, compression="gzip" if kind == "gzip" else "none",
                            splits=splits, source={"kind": "test"}, seed=7,
                            input_stats={"transform": "log1p", "mean": [0.1] * 4, "std": [1.0] * 4})
    write_manifest(manifest, root)
    return root


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    return {kind: dataset(tmp_path_factory.mktemp(kind), kind) for kind in ("cosmoflow", "deepcam", "gzip")}


@pytest.fixture(scope="module")
def packed(datasets, tmp_path_factory) -> Path:
    from data_prep import pack
    out = tmp_path_factory.mktemp("packed")
    args = argparse.Namespace(input=datasets["deepcam"], out=out, compression="none", level=None, archive_mb=256.0,
                              archives=2, align_ranks=1, layout="interleaved", workers=1)
    assert pack.run(args) == 0
    return out


# ---------------------------------------------------------------------------- JSON mutations
def json_paths(obj, prefix=()) -> list[tuple]:
    """Every path (tuple of keys and indexes) to a value inside a JSON object."""
    found = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        found.append((*prefix, key))
        found += json_paths(value, (*prefix, key))
    return found


def drawn_location(draw, obj) -> tuple:
    """A copy of `obj`, a drawn path (keys and indexes) to one of its values, and that value's parent and key."""
    obj = json.loads(json.dumps(obj))
    where = draw(st.sampled_from(json_paths(obj)))
    parent = obj
    for key in where[:-1]:
        parent = parent[key]
    return obj, where, parent, where[-1]


@st.composite
def json_mutation(draw, obj):
    """A copy of `obj` with one value deleted, replaced, or of another type."""
    obj, where, parent, key = drawn_location(draw, obj)
    old = parent[key]
    op = draw(st.sampled_from(["delete", "replace", "retype", "nudge", "recount", "repath"]))
    if op == "repath":  # a path that leaves the directory, cannot exist, or names something else
        node = draw(st.sampled_from([p for p in json_paths(obj) if p[-1] in ("path", "index")] or [where]))
        parent = obj
        for step in node[:-1]:
            parent = parent[step]
        parent[node[-1]] = draw(paths)
    elif op == "delete":
        del parent[key]
    elif op == "replace":
        parent[key] = draw(json_values)
    elif op == "nudge" and isinstance(old, int) and not isinstance(old, bool):  # a nearby or absurd number
        parent[key] = draw(st.sampled_from([0, -1, -old, old - 1, old + 1, 2 ** 63, -2 ** 63, 10 ** 400]))
    elif op == "recount" and "splits" in obj and isinstance(obj["splits"], dict) and obj["splits"]:
        recount(obj, draw)
    elif op in ("nudge", "recount"):
        parent[key] = draw(json_values)
    else:
        parent[key] = (str(old) if not isinstance(old, str) else draw(st.sampled_from([[old], {"x": old}, None])))
    return obj


def recount(obj: dict, draw) -> None:
    """Give one file entry another record count, and its split the matching sample count (as a buggy converter
    would write them: consistent with each other, not with the file)."""
    split = draw(st.sampled_from(sorted(obj["splits"])))
    files = obj["splits"][split].get("files") if isinstance(obj["splits"][split], dict) else None
    if not files or not all(isinstance(f, dict) and type(f.get("records")) is int for f in files):
        return
    entry = draw(st.sampled_from(files))
    entry["records"] = draw(st.sampled_from([-3, -1, 0, 1, 2 ** 40]))
    obj["splits"][split]["samples"] = sum(f["records"] for f in files)


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj))  # NaN and Infinity as Python writes them: json.loads reads them back


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


# ---------------------------------------------------------------------------- the promise
def check_manifest(root: Path, verify: bool) -> str:
    """Load `root`'s manifest and check its files; returns the outcome for the tally."""
    where = root / MANIFEST_NAME
    with time_limit(LIMIT_S):
        outcome, value = outcome_of(lambda: load_manifest(root))
    assert outcome != "crash", f"{where}:\n{value}\n{where.read_bytes()[:3000]!r}"
    if outcome == "BenchError":
        assert str(where) in value or str(root) in value, value
        return "BenchError (load)"
    consistent(value)
    with time_limit(LIMIT_S):
        outcome, message = outcome_of(lambda: check_files(value, verify))
    assert outcome != "crash", f"{where}:\n{message}\n{where.read_bytes()[:3000]!r}"
    if outcome == "BenchError":
        assert str(root) in message, message
        return "BenchError (files)"
    return "valid manifest"


def inside(root: Path, rel: str) -> bool:
    """Whether `rel` names something inside `root` (by the name alone: it may hold bytes no file name can)."""
    return os.path.normpath(os.path.join(root, rel)).startswith(os.path.normpath(root))


def consistent(manifest: Manifest) -> None:
    """What a loaded manifest must satisfy for a loader to trust it."""
    root = manifest.root
    for split in manifest.splits.values():
        assert split.samples == sum(f.records for f in split.files) and split.samples >= 0
        for entry in split.files:
            assert entry.records >= 0 and entry.bytes >= 0, entry
            for rel in (entry.path, entry.index):
                if rel is not None:
                    assert inside(root, rel), rel
    for aux in manifest.aux_files.values():
        assert aux.bytes >= 0 and inside(root, aux.path), aux
    assert manifest.target_size >= 1 and all(s >= 1 for s in manifest.sample_shape)
    assert json.loads(json.dumps(manifest.to_dict())) == manifest.to_dict() or _has_nan(manifest.to_dict())


def _has_nan(obj) -> bool:
    if isinstance(obj, float):
        return math.isnan(obj)
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else ()
    return any(_has_nan(v) for v in values)


def check_files(manifest: Manifest, verify: bool) -> None:
    for split in manifest.splits:
        check_split_files(manifest, split, verify_checksums=verify)
    for name in manifest.aux_files:
        check_aux_file(manifest, name)


# ---------------------------------------------------------------------------- the tests
KINDS = ("cosmoflow", "deepcam", "gzip")


@fuzz(examples=100, deadline_s=10)
@given(data=st.data(), kind=st.sampled_from(KINDS), verify=st.booleans())
def test_corrupted_manifest_bytes(datasets, tmp_path_factory, data, kind, verify):
    root = copy_of(datasets[kind], tmp_path_factory)
    size = (root / MANIFEST_NAME).stat().st_size
    if data.draw(st.integers(0, 9), label="deep nesting if 0") == 0:
        (root / MANIFEST_NAME).write_text(deep_json(data.draw(st.sampled_from([10, 1000, 100_000]), label="depth")))
    else:
        corrupt_file(root / MANIFEST_NAME, data.draw(corruptions(size), label="corruption"))
    with timed("manifest: corrupted bytes") as box:
        box[0] = check_manifest(root, verify)


@fuzz(examples=150, deadline_s=10)
@given(data=st.data(), kind=st.sampled_from(KINDS), verify=st.booleans())
def test_mutated_manifest_values(datasets, tmp_path_factory, data, kind, verify):
    root = copy_of(datasets[kind], tmp_path_factory)
    obj = json.loads((root / MANIFEST_NAME).read_text())
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        if not json_paths(obj):
            break
        obj = data.draw(json_mutation(obj), label="mutated manifest")
    write_json(root / MANIFEST_NAME, obj)
    with timed("manifest: mutated values") as box:
        box[0] = check_manifest(root, verify)


@fuzz(examples=80, deadline_s=10)
@given(data=st.data(), verify=st.booleans())
def test_corrupted_index_files(datasets, tmp_path_factory, data, verify):
    root = copy_of(datasets["cosmoflow"], tmp_path_factory)
    index = root / data.draw(st.sampled_from(["train/a.tfrecord.idx", "train/b.tfrecord.idx",
                                              "validation/c.tfrecord.idx"]), label="index")
    original = corrupt_file(index, data.draw(corruptions(index.stat().st_size), label="corruption"))
    with timed("manifest: corrupted DALI index") as box:
        box[0] = check_manifest(root, verify)
    if box[0] == "valid manifest":  # accepted: it must still say what the original said, for DALI
        assert parse_index(index.read_bytes()) == parse_index(original), index.read_bytes()


def parse_index(data: bytes) -> list[tuple[int, ...]]:
    return [tuple(int(field) for field in line.split()) for line in data.decode("ascii").splitlines()]


@fuzz(examples=100, deadline_s=10)
@given(data=st.data())
def test_corrupted_pack_json(packed, tmp_path_factory, data):
    root = copy_of(packed, tmp_path_factory)
    where = root / PACK_NAME
    if data.draw(st.booleans(), label="bytes, not values"):
        corrupt_file(where, data.draw(corruptions(where.stat().st_size), label="corruption"))
    else:
        write_json(where, data.draw(json_mutation(json.loads(where.read_text())), label="mutated pack.json"))
    with timed("pack.json: corrupted bytes or values") as box, time_limit(LIMIT_S):
        outcome, value = outcome_of(lambda: load_pack(root))
        assert outcome != "crash", f"{where}:\n{value}\n{where.read_bytes()[:3000]!r}"
        box[0] = outcome if outcome == "BenchError" else "valid pack"
    if outcome == "BenchError":
        assert str(root) in value, value
        return
    for archive in value.archives:
        assert archive.bytes >= 0 and inside(root, archive.path), archive
        for member in archive.members:
            assert member.bytes >= 0 and inside(root, member.path), member
    consistent(value.manifest())
