"""Decompressing record files: the record stream of a GZIP file (`record_stream`, which data_prep index reads
too), and staging with data.stage_decompress: a record file without a DALI index (GZIP-compressed, as the
official CosmoFlow release's) written uncompressed with its index, so that DALI can read the staged copy.

Each file is read once: its bytes are digested and checked against the manifest (xxh3-128, or sha256), the
GZIP stream is inflated (Python's zlib binding, which releases the interpreter lock, so files go in parallel
on staging's threads), every record's framing and both CRCs are checked, and the stream is written as it is,
an uncompressed TFRecord file, under a temporary name. The DALI index is made from the records' offsets and
sizes. The record file is renamed first, then its index: a staged file with its index is complete. The
manifest entry of the staged file (size, sha256 and xxh3-128 of it and of its index) is returned for the
staged manifest, which describes the files this staging wrote as they are now, and for staging's stamp, by
which a later staging with reuse proves the copy unchanged; see docs/staging.md. A failed write (a full disk)
is a BenchError naming the file written, the errno and the free space (common/io/pycopy.py's `write_error`);
a source that cannot be read is one naming the source.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import gzip
import hashlib
import io
import os
import zlib
from pathlib import Path

from common.base.errors import BenchError
from common.io import pycopy
from common.io.manifest import FileEntry, Manifest, SplitEntry
from common.io.tfrecord import RecordError, data_crc_error, index_path, index_text, iter_frames

CHUNK = 8 << 20
WHOLE_MAX_BYTES = 64 << 20  # GZIP files up to this size are inflated in one call (the release's are ~3 MB)


def record_stream(reader, compression: str, nbytes: int):
    """A readable stream of the records of a file of `nbytes` bytes read through `reader` ("gzip" or "none").

    A GZIP file of at most WHOLE_MAX_BYTES is read whole and inflated in one call, during which the interpreter
    lock is released, so threads inflate in parallel (a 128^3 CosmoFlow file: 58 ms instead of 72 on one core,
    1.6x on two threads instead of 1.3x); a larger one, or one of several GZIP members or a broken one, is read
    through GzipFile, which reads every member, or raises where the stream breaks.
    """
    if compression != "gzip":
        return reader
    if nbytes > WHOLE_MAX_BYTES:
        return gzip.GzipFile(fileobj=reader, mode="rb")
    data = reader.read()
    try:
        inflater = zlib.decompressobj(wbits=31)  # 31: a GZIP wrapper, whose CRC and size zlib checks
        stream = inflater.decompress(data)
        if inflater.eof and not inflater.unused_data:
            return io.BytesIO(stream)
    except zlib.error:
        pass
    return gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb")


def needs_decompression(entry: FileEntry) -> bool:
    """Whether staging with decompression rewrites this record file (it has no DALI index)."""
    return entry.index is None


def staged_size(entry: FileEntry) -> int:
    """The bytes the file takes once staged uncompressed: its stream's size when the manifest knows it (data_prep
    index records it), else its compressed size (a lower bound, for the free-space check)."""
    return entry.uncompressed_bytes or entry.bytes


class DigestingReader:
    """A binary file whose bytes read are digested by each of `digests` and counted."""

    def __init__(self, file, *digests):
        self.file, self.digests, self.count = file, digests, 0

    def read(self, n: int = -1) -> bytes:
        data = self.file.read(n)
        for digest in self.digests:
            digest.update(data)
        self.count += len(data)
        return data

    def drain(self) -> None:
        """Read (and digest) the rest of the file."""
        while self.read(CHUNK):
            pass


class _Tee:
    """A stream whose bytes read are also written to `out` (the file `path`), digested (sha256, xxh3-128) and
    counted. A failed write raises BenchError (`context` leads its message)."""

    def __init__(self, stream, out, path: Path, context: str):
        import xxhash
        self.stream, self.out, self.path, self.context, self.count = stream, out, path, context, 0
        self.digests = (hashlib.sha256(), xxhash.xxh3_128())

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n)
        try:
            self.out.write(data)
        except OSError as err:
            raise BenchError(pycopy.write_error(self.path, err.errno or errno.EIO, self.context)) from None
        for digest in self.digests:
            digest.update(data)
        self.count += len(data)
        return data


def decompress_file(src: Path, entry: FileEntry, compression: str, dest: Path, expected: tuple[str, str],
                    hasher, tag: str) -> FileEntry:
    """Write `src` (the dataset file `entry`) uncompressed to dest/entry.path with its DALI index; its new entry.

    `expected`: (checksum kind, hex digest) of the source file; `hasher`: a new digest object of that kind;
    `tag`: the suffix of the temporary names (staging's, per process and thread).
    Raises BenchError naming the file: a digest or size that differs from the manifest's, a broken GZIP
    stream, a record whose framing or CRC fails, another record count than the manifest's, a source that cannot
    be read; or naming the file written, the errno and the free space, for a write that failed (a full disk).
    """
    final = dest / entry.path
    tmp = final.with_name(f".{final.name}{tag}")
    index_final = index_path(final)
    index_tmp = index_final.with_name(f".{index_final.name}{tag}")
    context = f"{src}: decompressing"
    try:
        lengths, written, digests = _inflate(src, entry, compression, tmp, expected, hasher)
        text = index_text(lengths).encode()
        with pycopy.writing(index_tmp, context):
            index_tmp.write_bytes(text)
        with pycopy.writing(final, context):
            os.replace(tmp, final)
        with pycopy.writing(index_final, context):
            os.replace(index_tmp, index_final)  # last: a staged file with its index is complete
    finally:
        tmp.unlink(missing_ok=True)
        index_tmp.unlink(missing_ok=True)
    return _staged_entry(entry, written, digests, text)


def _inflate(src: Path, entry: FileEntry, compression: str, tmp: Path, expected: tuple[str, str],
             hasher) -> tuple[list[int], int, tuple]:
    """Inflate `src` into `tmp`, checking it; the records' payload lengths, the bytes written, their digests."""
    kind, digest = expected
    lengths, context = [], f"{src}: decompressing"
    try:
        with open(src, "rb") as raw, _output(tmp, context) as out:
            source = DigestingReader(raw, hasher)
            tee = _Tee(record_stream(source, compression, entry.bytes), out, tmp, context)
            for frame in iter_frames(tee, src):
                error = data_crc_error(frame, src)
                if error is not None:
                    raise error
                lengths.append(len(frame.payload))
            source.drain()  # the rest of the file, for its digest (nothing, for a valid stream)
    except RecordError as err:
        raise BenchError(f"{err}; the source is corrupt, nothing was staged for it") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise BenchError(f"{src}: the {compression} stream breaks after {len(lengths)} whole records ({err}); "
                         f"the source is corrupt or truncated") from None
    except OSError as err:  # reading the source: a failed write is a BenchError already
        name = errno.errorcode.get(err.errno, f"errno {err.errno}")
        raise BenchError(f"{src}: cannot read it: {err.strerror} [{name}]") from None
    if source.count != entry.bytes or hasher.hexdigest() != digest:
        raise BenchError(f"{src}: {source.count} bytes with {kind} {hasher.hexdigest()}, the manifest says "
                         f"{entry.bytes} bytes with {digest}; the source is corrupt or was changed")
    if len(lengths) != entry.records:
        raise BenchError(f"{src}: {len(lengths)} records, the manifest says {entry.records}")
    return lengths, tee.count, tee.digests


@contextlib.contextmanager
def _output(path: Path, context: str):
    """`path` opened for buffered writing and closed; an OSError creating or closing (flushing) it is a
    BenchError worded by `pycopy.write_error`."""
    with pycopy.writing(path, context):
        out = open(path, "wb")
    try:
        yield out
    finally:
        with pycopy.writing(path, context):
            out.close()


def _staged_entry(entry: FileEntry, written: int, digests: tuple, index_bytes: bytes) -> FileEntry:
    import xxhash
    return dataclasses.replace(entry, bytes=written, sha256=digests[0].hexdigest(), xxh3_128=digests[1].hexdigest(),
                               index=index_path(Path(entry.path)).as_posix(),
                               index_sha256=hashlib.sha256(index_bytes).hexdigest(),
                               index_xxh3_128=xxhash.xxh3_128_hexdigest(index_bytes), uncompressed_bytes=None)


def staged_manifest(manifest: Manifest, staged: dict[str, FileEntry], source_dir: str) -> Manifest:
    """The manifest of a copy staged with decompression: the files it decompressed described as they are there
    (the other files a rank or node does not stage stay as at the source), and compression none."""
    splits = {name: SplitEntry(split.samples, tuple(staged.get(e.path, e) for e in split.files))
              for name, split in manifest.splits.items()}
    note = {"from": source_dir, "compression": manifest.compression, "files": len(staged)}
    return dataclasses.replace(manifest, compression="none", splits=splits,
                               source={**manifest.source, "staged_decompressed": note})

