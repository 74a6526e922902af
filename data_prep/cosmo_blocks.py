"""Write a CosmoFlow dataset's records again as per-block records, for the spatial (Mesh-TF) path.

    python -m data_prep cosmo-blocks --data DIR --spatial 2x2 [--workers N]

Under parallel.spatial = [pd, ph] every rank of a group decodes only its block of each sample (depth rows
i*D/pd .. (i+1)*D/pd, height rows j*H/ph .. (j+1)*H/ph), but a TFRecord holds a whole sample, framed by its
length and checksum (and, in the released GZIP files, inside a stream that inflates only from its start):
no reader can take a block's share of its bytes. This tool cuts every record of DIR into its pd x ph blocks
and writes block (i, j) of every sample to DIR/blocks_<pd>x<ph>/<i>_<j>/, a dataset of its own
(format cosmoflow-tfrecord, sample shape (D/pd, H/ph, W, 4)) with the same file names, the same records per
file in the same order, the same splits and the whole dataset's input statistics. A rank that reads its
block's dataset then reads 1/(pd*ph) of the bytes, in the same sample order as its group's other ranks
(cosmoflow/data.py finds the blocks when data.blocks is auto or records).

The records of DIR are read, never changed; each output file is written under a temporary name and
renamed when complete, and each block's manifest.json last. A rerun reuses finished files. The block
manifests name DIR's manifest by its sha256: blocks of another version of DIR are refused by the loader.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np

from common.base.errors import BenchError
from common.io.formats import cosmoflow as cosmo_format
from common.io.formats.cosmoflow_blocks import BLOCKS_KIND, block_dir, block_rows, blocks_dir_name
from common.io.formats.cosmoflow_prep import parse_record
from common.io.manifest import MANIFEST_NAME, Manifest, SplitEntry, load_manifest
from common.io.manifest_write import sha256_file, write_manifest
from common.io.tfrecord import read_records
from data_prep import tfrecords


@dataclasses.dataclass(frozen=True)
class FileJob:
    """Cut one record file of the dataset into its blocks' files."""

    source: Path
    outputs: tuple[Path, ...]  # one per block, in block order (i major)
    rows: tuple[tuple[tuple[int, int], tuple[int, int]], ...]
    records: int
    sample_shape: tuple[int, ...]
    compression: str
    gzip_level: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, required=True, help="a cosmoflow-tfrecord dataset (its manifest.json)")
    parser.add_argument("--spatial", required=True, help="the partitioning DxH, e.g. 2x2 (parallel.spatial [2, 2])")
    parser.add_argument("--workers", type=tfrecords.positive_int, default=tfrecords.available_cpus(),
                        help="processes cutting files in parallel (default: the CPUs available)")


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    manifest = load_manifest(args.data, expected_format=cosmo_format.FORMAT)
    problem = cosmo_format.layout_problem(manifest)
    if problem:
        raise BenchError(f"{manifest.root / MANIFEST_NAME}: {problem[0]}, expected {problem[1]}")
    spatial = parse_spatial(args.spatial)
    check_divides(manifest, spatial)
    out = manifest.root / blocks_dir_name(spatial)
    blocks = [(i, j) for i in range(spatial[0]) for j in range(spatial[1])]
    jobs = plan_jobs(manifest, spatial, blocks)
    results = tfrecords.run_in_pool(cut_file, jobs, args.workers, "cosmo-blocks", "file")
    written = dict(zip((o for job in jobs for o in job.outputs), (r for result in results for r in result)))
    parent_sha = sha256_file(manifest.root / MANIFEST_NAME)
    for i, j in blocks:
        block_manifest(manifest, spatial, (i, j), block_dir(manifest.root, spatial, i, j), written, parent_sha)
    share = sum(r.bytes for r in written.values()) / len(blocks) / max(1, sum(
        f.bytes for s in manifest.splits.values() for f in s.files))
    print(f"cosmo-blocks: {len(jobs)} files cut into {len(blocks)} blocks of {list(block_shape(manifest, spatial))} "
          f"-> {out} (each block's records {share:.3f} of the whole's bytes) in {time.perf_counter() - t0:.1f} s")
    return 0


def parse_spatial(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    try:
        pd, ph = (int(p) for p in parts)
    except ValueError:
        raise BenchError(f"--spatial {text!r}: expected DxH with two positive integers, e.g. 2x2") from None
    if pd < 1 or ph < 1 or pd * ph < 2:
        raise BenchError(f"--spatial {text!r}: expected DxH with positive integers and at least 2 blocks")
    return pd, ph


def check_divides(manifest: Manifest, spatial: tuple[int, int]) -> None:
    shape = manifest.sample_shape
    for name, size, parts in (("depth", shape[0], spatial[0]), ("height", shape[1], spatial[1])):
        if size % parts:
            raise BenchError(f"{manifest.root / MANIFEST_NAME}: sample {name} {size} (sample shape {list(shape)}) "
                             f"is not divisible by {parts} partitions (--spatial {spatial[0]}x{spatial[1]})")


def block_shape(manifest: Manifest, spatial: tuple[int, int]) -> tuple[int, ...]:
    shape = manifest.sample_shape
    return (shape[0] // spatial[0], shape[1] // spatial[1], *shape[2:])


def plan_jobs(manifest: Manifest, spatial: tuple[int, int], blocks: list) -> list[FileJob]:
    rows = tuple(block_rows(manifest.sample_shape, spatial, i, j) for i, j in blocks)
    level = (manifest.source or {}).get("gzip_level") or 6
    jobs = []
    for split in manifest.splits.values():
        for entry in split.files:
            outputs = tuple(block_dir(manifest.root, spatial, i, j) / entry.path for i, j in blocks)
            jobs.append(FileJob(manifest.root / entry.path, outputs, rows, entry.records,
                                tuple(manifest.sample_shape), manifest.compression, level))
    return jobs


def cut_file(job: FileJob) -> list[tfrecords.RecordFile]:
    """Write (or reuse, when an earlier run finished them) the blocks' files of one record file."""
    done = [tfrecords.existing_record_file(o, job.records, job.compression) for o in job.outputs]
    if all(d is not None for d in done):
        return done
    cut: list[list[bytes]] = [[] for _ in job.outputs]
    count = 0
    for frame in read_records(job.source, job.compression):
        x, y = decode_record(frame.payload, job.sample_shape, job.source, frame.number)
        for records, (depth, height) in zip(cut, job.rows):
            block = x[depth[0]:depth[1], height[0]:height[1]]
            records.append(tfrecords.serialize_example(cosmo_format.record_features(block, y)))
        count += 1
    if count != job.records:
        raise BenchError(f"{job.source}: {count} records, expected {job.records} as the manifest lists")
    results = []
    for output, records in zip(job.outputs, cut):
        output.parent.mkdir(parents=True, exist_ok=True)
        results.append(tfrecords.write_record_file(output, records, job.compression, job.gzip_level))
    return results


def decode_record(payload: bytes, sample_shape: tuple[int, ...], path: Path, number: int):
    """(sample (D, H, W, C) int16, target float32) of one record, or BenchError naming the record."""
    try:
        raw, target = parse_record(payload)
    except ValueError as err:
        raise BenchError(f"{path}: record {number} is not {cosmo_format.describe()}: {err}") from None
    expected = int(np.prod(sample_shape)) * cosmo_format.STORED_SAMPLE_DTYPE.itemsize
    if len(raw) != expected:
        raise BenchError(f"{path}: record {number} holds {len(raw)} bytes of sample, expected {expected} for the "
                         f"sample shape {list(sample_shape)}")
    return np.frombuffer(raw, cosmo_format.STORED_SAMPLE_DTYPE).reshape(sample_shape), target


def block_manifest(manifest: Manifest, spatial: tuple[int, int], block: tuple[int, int], root: Path,
                   written: dict, parent_sha: str) -> Path:
    """Write block `block`'s manifest.json (after all its files): the whole dataset's, with the block's shape."""
    splits = {}
    for name, split in manifest.splits.items():
        files = tuple(tfrecords.file_entry(written[root / f.path], root) for f in split.files)
        splits[name] = SplitEntry(samples=split.samples, files=files)
    depth, height = block_rows(manifest.sample_shape, spatial, *block)
    source = {"kind": BLOCKS_KIND, "dataset": str(manifest.root), "manifest_sha256": parent_sha,
              "sample_shape": list(manifest.sample_shape), "spatial": list(spatial), "block": list(block),
              "depth": list(depth), "height": list(height)}
    own = dataclasses.replace(manifest, root=root, sample_shape=block_shape(manifest, spatial), splits=splits,
                              source=source, aux_files={})
    return write_manifest(own, root)
