"""CRC32C (Castagnoli) and TFRecord's masked form of it, on the `google-crc32c` package.

google-crc32c wraps Google's C library, which uses the CPU's CRC32C instructions (SSE 4.2 on x86-64,
the CRC extension on ARMv8) where there are any; its pure-Python fallback, used only when the C extension
cannot load, is far slower (`google_crc32c.implementation` says which is in use).
"""
from __future__ import annotations

import google_crc32c

MASK_DELTA = 0xA282EAD8  # TFRecord's mask: rotate right by 15 bits, then add this (mod 2^32)


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC32C of `data` (the check value of b"123456789" is 0xE3069283)."""
    return google_crc32c.value(data if isinstance(data, bytes) else bytes(data))  # it takes bytes only


def mask(crc: int) -> int:
    """TFRecord's masked CRC: rotate right by 15 bits and add MASK_DELTA (mod 2^32)."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + MASK_DELTA) & 0xFFFFFFFF


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """The 4-byte CRC stored after a TFRecord's length and after its payload (little-endian uint32)."""
    return mask(crc32c(data))
