"""common.io.crc: CRC32C from google-crc32c (hardware CRC), and TFRecord's masked form against TensorFlow."""
import numpy as np
import google_crc32c

from common.io.crc import crc32c, masked_crc32c


def test_crc32c_check_value_and_a_plain_loop_with_the_hardware_implementation():
    assert google_crc32c.implementation == "c", "google-crc32c fell back to pure Python (no C extension)"
    assert crc32c(b"123456789") == 0xE3069283
    rng = np.random.default_rng(0)
    for size in (0, 1, 3, 4, 5, 64, 65, 100, 4095, 4096, 4097, 70001, 1_000_003):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert crc32c(data) == plain_crc32c(data), size
    assert crc32c(bytearray(b"123456789")) == crc32c(memoryview(b"123456789")) == 0xE3069283


def plain_crc32c(data: bytes) -> int:
    """The textbook bit-at-a-time CRC32C, as an independent reference."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_masked_crc32c_equals_what_tensorflow_writes(tmp_path):
    import tensorflow as tf
    rng = np.random.default_rng(1)
    payloads = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (0, 1, 100, 70001, 300_000)]
    with tf.io.TFRecordWriter(str(tmp_path / "r.tfrecord")) as writer:
        for payload in payloads:
            writer.write(payload)
    raw, offset = (tmp_path / "r.tfrecord").read_bytes(), 0
    for payload in payloads:
        length = raw[offset:offset + 8]
        assert int.from_bytes(raw[offset + 8:offset + 12], "little") == masked_crc32c(length)
        end = offset + 12 + len(payload)
        assert raw[offset + 12:end] == payload
        assert int.from_bytes(raw[end:end + 4], "little") == masked_crc32c(payload)
        offset = end + 4
    assert offset == len(raw)


def test_masked_crc32c_of_known_tfrecord_bytes():
    # A TFRecord of the payload b"hello", as TensorFlow writes it (length header, its CRC, data, its CRC).
    record = bytes.fromhex("0500000000000000" "eab2043e" "68656c6c6f" "bb1f1c19")
    assert masked_crc32c(record[:8]).to_bytes(4, "little") == record[8:12]
    assert masked_crc32c(record[12:17]).to_bytes(4, "little") == record[17:21]
