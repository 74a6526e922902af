"""cosmoflow.data: the diagnosis of a read failure (common/io/bad_record.py with CosmoFlow's record check) names
the file and the record (regressions found by fuzzing,
tests/fuzz/test_records_fuzz.py, docs/fuzzing.md)."""
from __future__ import annotations

import numpy as np
import pytest

from common.io.bad_record import first_bad_record
from common.io.formats import cosmoflow as record_format
from cosmoflow.tfdata import wrong_size
from data_prep import tfrecords

SHAPE = (4, 4, 4, 4)


def diagnose(path) -> str | None:
    return first_bad_record([str(path)], "none", record_format.tf_features(4), record_format.describe(4), wrong_size(SHAPE))


def _good() -> bytes:
    return tfrecords.serialize_example({"x": np.zeros(SHAPE, np.int16).tobytes(), "y": np.zeros(4, np.float32)})


@pytest.mark.parametrize("bad, words", [
    (tfrecords.serialize_example({"x": np.zeros(SHAPE, np.int16).tobytes(), "y": np.zeros(3, np.float32)}),
     "record 2 is not a CosmoFlow example with x (bytes) and y (4 floats)"),  # it said record 3
    (b"\x80\x81\xff", "record 2 is not a tf.train.Example (its bytes do not parse as one)"),  # UnicodeDecodeError
    (tfrecords.serialize_example({"x": np.zeros(7, np.int16).tobytes(), "y": np.zeros(4, np.float32)}),
     "record 2 holds 7 int16 values, expected 256"),
])
def test_the_diagnosis_names_the_bad_record(tmp_path, bad, words):
    path = tmp_path / "f.tfrecord"
    tfrecords.write_record_file(path, [_good(), _good(), bad, _good()])
    message = diagnose(path)
    assert message.startswith(f"{path}: {words}"), message


def test_a_corrupt_frame_is_named_at_its_record(tmp_path):
    path = tmp_path / "f.tfrecord"
    tfrecords.write_record_file(path, [_good(), _good()])
    data = bytearray(path.read_bytes())
    data[len(data) // 2 + 40] ^= 0x01  # a payload byte of record 1: its CRC no longer matches
    path.write_bytes(bytes(data))
    message = diagnose(path)
    assert message.startswith(f"{path}: corrupt or truncated TFRecord at record 1 (bad length or CRC"), message
