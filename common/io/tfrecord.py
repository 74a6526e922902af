"""TFRecord framing and DALI index files: the one reader of the framing, used by the converters' checks, `validate`
and the tests.

A TFRecord file is a sequence of framed records: an 8-byte little-endian length, a 4-byte masked CRC32C of the
length, the payload, and a 4-byte masked CRC32C of the payload, so a record of `len` payload bytes occupies
`len + 16` bytes. A GZIP-compressed file is the same stream, compressed whole. A DALI index (the format of DALI's
`tfrecord2idx`) has one line "offset size" per record of an uncompressed file: where its length header starts and
its framed size. DALI cannot index compressed files, so GZIP files get no index.
The CRCs are computed by common/io/crc.py (google-crc32c, the CPU's CRC32C instructions).
"""
from __future__ import annotations

import dataclasses
import gzip
import os
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from common.base.errors import BenchError
from common.io.crc import masked_crc32c

LENGTH_BYTES = 8  # uint64 little-endian payload length
CRC_BYTES = 4  # uint32 little-endian masked CRC32C
HEADER_BYTES = LENGTH_BYTES + CRC_BYTES
FRAMING_BYTES = HEADER_BYTES + CRC_BYTES  # 16 bytes around every payload
INDEX_SUFFIX = ".idx"
READ_LIMIT = 64 << 20  # bytes per read of `read_fully`: more than a record of either application holds


class RecordError(BenchError):
    """A record of a TFRecord file that cannot be read: the file, the record (from 0), the byte offset of its
    length header in the uncompressed stream, what was found (naming the offset) and what was expected."""

    def __init__(self, path: str | os.PathLike, record: int, offset: int, found: str, expected: str):
        self.path, self.record, self.offset, self.found, self.expected = str(path), record, offset, found, expected
        super().__init__(f"{path}: record {record}: {found}; expected {expected}")

    def __reduce__(self):  # picklable across worker processes
        return type(self), (self.path, self.record, self.offset, self.found, self.expected)


class FramingError(RecordError):
    """A length header that is cut short or fails its CRC, or a file that ends inside a record: the records
    from here on cannot be located."""


class DataCRCError(RecordError):
    """A payload that does not match the CRC stored after it (the record's bytes changed); the framing is
    intact, so the following records can still be read."""


@dataclasses.dataclass(frozen=True)
class Frame:
    """One framed record."""

    number: int  # from 0
    offset: int  # of its length header, in the uncompressed stream
    payload: bytes
    stored_crc: int  # the masked CRC32C stored after the payload

    @property
    def size(self) -> int:
        """Bytes the record occupies in the file: its payload and the framing (a DALI index line's size)."""
        return len(self.payload) + FRAMING_BYTES


# ---------------------------------------------------------------------------- reading
def iter_frames(stream: BinaryIO, path: str | os.PathLike) -> Iterator[Frame]:
    """Every record of a TFRecord stream with its length checked against the length CRC; the payload's CRC is
    left to `data_crc_error` (a bad payload does not stop the reading).

    Raises:
        FramingError: a length header cut short or failing its CRC, or a stream ending inside a record.
    """
    number, offset = 0, 0
    while header := read_fully(stream, HEADER_BYTES):
        if len(header) < HEADER_BYTES:
            raise FramingError(path, number, offset,
                               f"the file ends {len(header)} bytes into the length header at byte {offset}",
                               f"{HEADER_BYTES} bytes of length and length CRC")
        length = int.from_bytes(header[:LENGTH_BYTES], "little")
        stored, found = int.from_bytes(header[LENGTH_BYTES:], "little"), masked_crc32c(header[:LENGTH_BYTES])
        if found != stored:
            raise FramingError(path, number, offset, f"the length field at byte {offset} (reading {length}) fails "
                               f"its CRC ({found:#010x}, stored {stored:#010x})",
                               "an intact length; the records after it cannot be located")
        payload = read_fully(stream, length)
        crc = read_fully(stream, CRC_BYTES) if len(payload) == length else b""
        if len(crc) < CRC_BYTES:
            raise FramingError(path, number, offset, f"the file ends {len(payload) + len(crc)} bytes after the "
                               f"length header of the record at byte {offset}",
                               f"{length} bytes of data and {CRC_BYTES} of CRC, as its length field says")
        yield Frame(number, offset, payload, int.from_bytes(crc, "little"))
        number, offset = number + 1, offset + length + FRAMING_BYTES


def data_crc_error(frame: Frame, path: str | os.PathLike) -> DataCRCError | None:
    """The error of a record whose payload does not match its stored CRC, or None when it does."""
    found = masked_crc32c(frame.payload)
    if found == frame.stored_crc:
        return None
    return DataCRCError(path, frame.number, frame.offset,
                        f"its {len(frame.payload)} bytes at byte {frame.offset + HEADER_BYTES} have masked "
                        f"CRC32C {found:#010x}",
                        f"{frame.stored_crc:#010x}, the CRC stored after them (the record's bytes changed)")


def read_records(path: str | os.PathLike, compression: str = "none") -> Iterator[Frame]:
    """Every record of a TFRecord file ("none" or "gzip" compression), both CRCs checked.

    Raises:
        FramingError, DataCRCError: the first bad record.
    """
    with open(path, "rb") as raw, (gzip.GzipFile(fileobj=raw, mode="rb") if compression == "gzip" else raw) as f:
        for frame in iter_frames(f, path):
            error = data_crc_error(frame, path)
            if error is not None:
                raise error
            yield frame


def read_framing(path: str | os.PathLike) -> list[tuple[int, int]]:
    """(offset, framed size) of each record of an uncompressed file, both CRCs checked: its DALI index."""
    return [(frame.offset, frame.size) for frame in read_records(path)]


def read_fully(stream: BinaryIO, n: int) -> bytes:
    """Up to n bytes of a stream: fewer only at its end (a compressed stream may return less per read).

    Read READ_LIMIT bytes at a time at most: `read(n)` allocates n bytes first, and n comes from a record's length
    field, whose CRC is no bound (a length of 2^40 with a valid CRC made it raise MemoryError, one of 2^63
    OverflowError)."""
    parts, missing = [], n
    while missing > 0:
        part = stream.read(min(missing, READ_LIMIT))
        if not part:
            break
        parts.append(part)
        missing -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


# ---------------------------------------------------------------------------- DALI index
def index_path(path: str | os.PathLike) -> Path:
    """Where the DALI index of a record file lives: beside it, with `.idx` appended."""
    path = Path(path)
    return path.with_name(path.name + INDEX_SUFFIX)


def index_entries(lengths: Iterable[int]) -> list[tuple[int, int]]:
    """(offset, framed size) of each record in an uncompressed file, from the payload lengths."""
    entries, offset = [], 0
    for length in lengths:
        entries.append((offset, length + FRAMING_BYTES))
        offset += length + FRAMING_BYTES
    return entries


def index_text(lengths: Iterable[int]) -> str:
    """The DALI index of records of these payload lengths: one "offset size" line each."""
    return "".join(f"{offset} {size}\n" for offset, size in index_entries(lengths))


def read_index(path: str | os.PathLike) -> list[tuple[int, int]]:
    """The (offset, size) pairs of a DALI index file.

    Raises:
        ValueError: a line that is not two integers.
    """
    entries = []
    for line in Path(path).read_text().splitlines():
        offset, size = line.split()
        entries.append((int(offset), int(size)))
    return entries
