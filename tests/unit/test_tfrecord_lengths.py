"""common.io.tfrecord: a length field whose CRC is valid but whose length runs far past the file (found by fuzzing
`data_prep validate`, tests/fuzz/test_validate_fuzz.py, docs/fuzzing.md) is a FramingError, as a short file is;
it made `read(length)` raise MemoryError (2^40) or OverflowError (2^63 and more)."""
from __future__ import annotations

import gzip

import pytest

from common.io import tfrecord
from common.io.crc import masked_crc32c


def _header(length: int) -> bytes:
    field = length.to_bytes(8, "little")
    return field + masked_crc32c(field).to_bytes(4, "little")


@pytest.mark.parametrize("compression", ["none", "gzip"])
@pytest.mark.parametrize("length", [2 ** 40, 2 ** 63, 2 ** 64 - 1])
def test_a_valid_length_far_past_the_end_is_a_framing_error(tmp_path, compression, length):
    stream = _header(5) + b"hello" + masked_crc32c(b"hello").to_bytes(4, "little") + _header(length) + b"abc"
    path = tmp_path / "x.tfrecord"
    path.write_bytes(gzip.compress(stream) if compression == "gzip" else stream)
    records = tfrecord.read_records(path, compression)
    assert next(records).payload == b"hello"
    with pytest.raises(tfrecord.FramingError, match=rf"{path}: record 1: the file ends 3 bytes after the length header "
                                                    rf"of the record at byte 21; expected {length} bytes of data"):
        next(records)


def test_a_record_longer_than_one_read_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(tfrecord, "READ_LIMIT", 7)  # the payload takes three reads
    payload = bytes(range(20))
    path = tmp_path / "x.tfrecord"
    path.write_bytes(_header(20) + payload + masked_crc32c(payload).to_bytes(4, "little"))
    assert [frame.payload for frame in tfrecord.read_records(path)] == [payload]
