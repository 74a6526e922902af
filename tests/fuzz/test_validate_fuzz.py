"""Fuzzing `python -m data_prep validate`'s own reader (data_prep/validate.py on common/io/tfrecord.py's framing):
the record framing it checks (length, length CRC, data, data CRC; the file ending inside a record), GZIP
streams, DALI indexes, and the records it parses. test_records_fuzz.py reads the same files through the
applications' pipelines (TensorFlow's and DALI's readers); this file fuzzes the reader validate brings itself.

Inputs: tiny converted datasets (CosmoFlow and DeepCAM, uncompressed with DALI indexes, and GZIP) with
- corrupted bytes in one record file or index (the compressed stream for GZIP), the manifest unchanged;
- one record file rewritten from hand-made frames: the file's records, cut short, or random bytes, each with
  its length field right or wrong (up to 2^64 - 1, with a valid length CRC or not) and its data CRC right or
  wrong, the stream then cut anywhere or grown; the manifest's size and digests updated, so that only the
  framing tells.
validate runs in a worker process (harness.Isolated: a hang or a crash is a finding, not the end of the session).
Promise: a report, never an exception; a changed file is always reported (checksum or size); every problem
names the changed file (or its index); for the hand-made frames, exactly the framing and CRC problems, at the
records, that a reference reading of the format gives, a record count problem when the file is readable to
its end with another count, and no problem with a record that is an intact one.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.io.crc import masked_crc32c
from common.io.manifest import MANIFEST_NAME, load_manifest
from common.io.manifest_write import file_digests
from common.io.tfrecord import FRAMING_BYTES, HEADER_BYTES, index_path, read_records
from tests.fuzz import readers
from tests.conftest import copy_of
from tests.fuzz.harness import Isolated, corruptions, fuzz, timed

LIMIT_S = 60.0  # per validation in the worker (it reads a whole tiny dataset in well under a second)
DATASETS = [("cosmoflow", "none"), ("cosmoflow", "gzip"), ("deepcam", "none"), ("deepcam", "gzip")]
PROBLEM_KINDS = ("framing", "crc")  # what the framing alone decides, compared with the reference reading


# ---------------------------------------------------------------------------- run in the worker process
def build_datasets(out: str) -> dict[str, str]:
    """Converted by the real converters: CosmoFlow (3 universes of 8^3, 4^3 samples) and DeepCAM (4 + 2
    snapshots of 16x16, 2 per file), each uncompressed and GZIP; "app-compression" -> directory."""
    from tests.unit.test_cosmo_convert import convert as cosmo_convert, make_universes
    from tests.unit.test_deepcam_convert import convert as deepcam_convert, make_dataset
    root = Path(out)
    make_universes(root / "raw" / "cosmo", 3)
    make_dataset(root / "raw" / "deepcam", train=4, validation=2, shape=(16, 16))
    made = {}
    for app, compression in DATASETS:
        target = root / f"{app}-{compression}"
        if app == "cosmoflow":
            code = cosmo_convert(root / "raw" / "cosmo", target, compression=compression, val_universes=1)
        else:
            code = deepcam_convert(root / "raw" / "deepcam", target, samples_per_file=2, compression=compression)
        assert code == 0, (app, compression)
        made[f"{app}-{compression}"] = str(target)
    return made


def validate_report(root: str) -> dict:
    """validate's report of `root` as plain data, after formatting it as the command prints and writes it."""
    from data_prep import validate
    report = validate.validate(root, workers=1, progress_seconds=None)
    validate.format_report(report).encode("utf-8")  # printable
    json.dumps(report.to_dict())
    return {"records": report.records,
            "findings": [(f.kind, f.path, f.record, f.message) for f in report.findings]}


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def worker():
    isolated = Isolated(LIMIT_S, initializer=readers.quiet_tensorflow)
    yield isolated
    isolated.close()


@pytest.fixture(scope="module")
def datasets(worker, tmp_path_factory) -> dict[tuple[str, str], Path]:
    outcome, made = worker.call(build_datasets, str(tmp_path_factory.mktemp("validate")))
    assert outcome == "ok", made
    return {tuple(name.split("-")): Path(path) for name, path in made.items()}


def record_files(root: Path) -> list[str]:
    return [e.path for split in load_manifest(root).splits.values() for e in split.files]


def run_validate(worker: Isolated, root: Path, rel: str) -> list[tuple]:
    """validate's findings for `root`, after asserting the parts of the promise every input shares: a report,
    and every problem naming the changed file `rel` or its index."""
    outcome, value = worker.call(validate_report, str(root))
    assert outcome == "ok", f"{root / rel}: {outcome}\n{value}"
    names = {rel, index_path(rel).as_posix()}
    strays = [f for f in value["findings"] if f[1] not in names]
    assert not strays, f"{root / rel}: problems reported with files left intact: {strays}"
    return value["findings"]


# ---------------------------------------------------------------------------- corrupted bytes
@fuzz(examples=100, deadline_s=120)
@given(data=st.data(), dataset=st.sampled_from(DATASETS), index=st.booleans())
def test_corrupted_record_or_index_bytes(worker, datasets, tmp_path_factory, data, dataset, index):
    root = copy_of(datasets[dataset], tmp_path_factory)
    rel = data.draw(st.sampled_from(record_files(root)), label="record file")
    target = root / (index_path(rel).as_posix() if index and dataset[1] == "none" else rel)
    original = target.read_bytes()
    target.write_bytes(data.draw(corruptions(len(original)), label="corruption").apply(original))
    with timed(f"validate: corrupted bytes ({dataset[0]}, {dataset[1]})") as box:
        findings = run_validate(worker, root, rel)
        changed = target.read_bytes() != original
        box[0] = "problems reported" if findings else "no problem (bytes unchanged)"
    named = target.relative_to(root).as_posix()
    if changed:
        assert {("checksum", named), ("size", named)} & {(f[0], f[1]) for f in findings}, \
            f"{target}: changed, yet no checksum or size problem: {findings}"
    else:
        assert not findings, findings


# ---------------------------------------------------------------------------- hand-made frames
LENGTHS = [0, 1, 15, 16, 2 ** 31, 2 ** 32 + 5, 2 ** 40, 2 ** 63, 2 ** 64 - 1]


@st.composite
def frames(draw, payloads: list[bytes]) -> bytes:
    """A TFRecord stream of 0 to len(payloads) + 2 hand-made frames, then cut or grown."""
    stream = b""
    for _ in range(draw(st.integers(0, len(payloads) + 2))):
        payload = draw(st.sampled_from(payloads) | st.binary(max_size=64))
        if draw(st.integers(0, 5)) == 0:
            payload = payload[:draw(st.integers(0, max(0, len(payload) - 1)))]
        length = len(payload)
        if draw(st.integers(0, 5)) == 0:
            length = draw(st.sampled_from(LENGTHS + [length - 1, length + 1]) | st.integers(0, 2 ** 64 - 1))
        length_field = max(length, 0).to_bytes(8, "little")
        length_crc = masked_crc32c(length_field) if draw(st.integers(0, 7)) else draw(st.integers(0, 2 ** 32 - 1))
        data_crc = masked_crc32c(payload) if draw(st.integers(0, 7)) else draw(st.integers(0, 2 ** 32 - 1))
        stream += length_field + length_crc.to_bytes(4, "little") + payload + data_crc.to_bytes(4, "little")
    end = draw(st.sampled_from(["whole", "cut", "grown"]))
    if end == "cut" and stream:
        return stream[:draw(st.integers(0, len(stream) - 1))]
    return stream + draw(st.binary(min_size=1, max_size=24)) if end == "grown" else stream


def reference_reading(stream: bytes) -> tuple[list[bytes], set[tuple[str, int]], bool]:
    """What the TFRecord format says of an uncompressed stream, read independently of common/io/tfrecord.py:
    the payloads of the frames read, the (kind, record) problems, and whether the stream was read to its end."""
    payloads, problems, offset = [], set(), 0
    while offset < len(stream):
        number, header = len(payloads), stream[offset:offset + HEADER_BYTES]
        length = int.from_bytes(header[:8], "little")
        if len(header) < HEADER_BYTES or masked_crc32c(header[:8]) != int.from_bytes(header[8:], "little") \
                or offset + length + FRAMING_BYTES > len(stream):
            return payloads, problems | {("framing", number)}, False
        payload = stream[offset + HEADER_BYTES:offset + HEADER_BYTES + length]
        stored = int.from_bytes(stream[offset + HEADER_BYTES + length:offset + length + FRAMING_BYTES], "little")
        if masked_crc32c(payload) != stored:
            problems.add(("crc", number))
        payloads.append(payload)
        offset += length + FRAMING_BYTES
    return payloads, problems, True


def rewrite(root: Path, rel: str, stream: bytes, compression: str) -> None:
    """Record file `rel` holds `stream` (GZIP-compressed whole for a GZIP dataset); its manifest entry lists the
    new size and digests (the record count and the index stay those of the intact file)."""
    (root / rel).write_bytes(gzip.compress(stream, mtime=0) if compression == "gzip" else stream)
    sha256, xxh3 = file_digests(root / rel)
    obj = json.loads((root / MANIFEST_NAME).read_text())
    for split in obj["splits"].values():
        for entry in split["files"]:
            if entry["path"] == rel:
                entry.update(bytes=(root / rel).stat().st_size, sha256=sha256, xxh3_128=xxh3)
    (root / MANIFEST_NAME).write_text(json.dumps(obj))


@fuzz(examples=150, deadline_s=120)
@given(data=st.data(), dataset=st.sampled_from(DATASETS))
def test_hand_made_frames(worker, datasets, tmp_path_factory, data, dataset):
    root = copy_of(datasets[dataset], tmp_path_factory)
    rel = data.draw(st.sampled_from(record_files(root)), label="record file")
    intact = [frame.payload for frame in read_records(root / rel, dataset[1])]
    stream = data.draw(frames(intact), label="stream")
    rewrite(root, rel, stream, dataset[1])
    payloads, expected, complete = reference_reading(stream)
    with timed(f"validate: hand-made frames ({dataset[0]}, {dataset[1]})") as box:
        findings = run_validate(worker, root, rel)
        box[0] = "problems reported" if findings else "no problem"
    found = {(kind, record) for kind, path, record, _ in findings if path == rel and kind in PROBLEM_KINDS}
    assert found == expected, f"{root / rel}: validate found {sorted(found)}, the format says {sorted(expected)}: " \
                              f"{findings}"
    records = load_manifest(root).splits["train" if rel.startswith("train") else "validation"]
    listed = next(e.records for e in records.files if e.path == rel)
    assert (("records", rel, None) in {f[:3] for f in findings}) == (complete and len(payloads) != listed), findings
    for kind, path, record, message in findings:
        if kind in ("parse", "shape", "non_finite", "range"):
            assert payloads[record] not in intact, f"{root / rel}: an intact record reported: {message}"
