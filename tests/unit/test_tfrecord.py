"""common/io/tfrecord.py: the framing reader, on files written by TensorFlow's writer (data_prep/tfrecords.py)."""
from __future__ import annotations

import gzip

import pytest

from common.base.errors import BenchError
from common.io import tfrecord
from data_prep import tfrecords

PAYLOADS = [b"a" * 10, b"", b"\x00\xff" * 300, b"xyz"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain") / "f.tfrecord"
    tfrecords.write_record_file(path, PAYLOADS)
    return path


def test_records_offsets_and_sizes_agree_with_the_index(plain):
    frames = list(tfrecord.read_records(plain))
    assert [f.payload for f in frames] == PAYLOADS
    assert [f.number for f in frames] == [0, 1, 2, 3]
    assert tfrecord.read_framing(plain) == tfrecord.read_index(tfrecord.index_path(plain))
    assert tfrecord.index_entries(len(p) for p in PAYLOADS) == [(f.offset, f.size) for f in frames]
    assert frames[-1].offset + frames[-1].size == plain.stat().st_size


def test_gzip_records(tmp_path):
    path = tmp_path / "f.tfrecord.gz"
    written = tfrecords.write_record_file(path, PAYLOADS, compression="gzip")
    assert written.index is None and not tfrecord.index_path(path).exists()
    assert [f.payload for f in tfrecord.read_records(path, "gzip")] == PAYLOADS
    assert gzip.decompress(path.read_bytes())[:8] == (10).to_bytes(8, "little")


def damaged(plain, tmp_path, change) -> tuple:
    raw = bytearray(plain.read_bytes())
    change(raw)
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(bytes(raw))
    return path, tfrecord.read_index(tfrecord.index_path(plain))


def test_a_changed_payload_byte_names_file_record_and_offset(plain, tmp_path):
    path, index = damaged(plain, tmp_path, lambda raw: raw.__setitem__(index_of(plain, 2) + 12 + 5, 0x41))
    with pytest.raises(tfrecord.DataCRCError) as err:
        list(tfrecord.read_records(path))
    assert isinstance(err.value, BenchError)
    assert (err.value.record, err.value.offset) == (2, index[2][0])
    assert str(err.value).startswith(f"{path}: record 2: its 600 bytes at byte {index[2][0] + 12} have masked CRC32C")
    # The framing is intact: iterating the frames alone reads every record.
    with open(path, "rb") as f:
        assert len(list(tfrecord.iter_frames(f, path))) == 4


def test_a_changed_length_byte_stops_the_reading(plain, tmp_path):
    path, index = damaged(plain, tmp_path, lambda raw: raw.__setitem__(index_of(plain, 1), 0x07))
    with pytest.raises(tfrecord.FramingError, match=f"{path}: record 1: the length field at byte {index[1][0]} "
                                                    r"\(reading 7\) fails its CRC"):
        list(tfrecord.read_records(path))


@pytest.mark.parametrize("cut, words", [(5, "the file ends 5 bytes into the length header at byte"),
                                        (30, "the file ends 18 bytes after the length header of the record at")])
def test_a_truncated_file(plain, tmp_path, cut, words):
    start = index_of(plain, 2)  # 600 bytes of payload
    path = tmp_path / "short.tfrecord"
    path.write_bytes(plain.read_bytes()[:start + cut])
    with pytest.raises(tfrecord.FramingError, match=f"{path}: record 2: {words}") as err:
        list(tfrecord.read_records(path))
    assert err.value.offset == start


def test_errors_pickle(tmp_path):
    import pickle
    error = pickle.loads(pickle.dumps(tfrecord.FramingError(tmp_path, 3, 48, "found", "expected")))
    assert (error.record, error.offset, str(error)) == (3, 48, f"{tmp_path}: record 3: found; expected expected")


def index_of(plain, record: int) -> int:
    return tfrecord.read_index(tfrecord.index_path(plain))[record][0]
