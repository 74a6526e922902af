"""CosmoFlow input pipeline: TFRecords (see docs/formats.md) through tf.data or NVIDIA DALI.

`build_datasets` checks the dataset against its manifest up front (sample shape, the files
this rank reads, sizes, counts that divide across ranks and batches), shards files by rank
(rank r reads files r, r+size, ...; with data.stage_mode=node_share the node's share, divided
between its ranks afresh every epoch, see common/io/input.py), and returns repeated batched
datasets of (B, D, H, W, 4) float32 log(1 + counts) and (B, 4) float32 targets. Both loaders
give the same tensors. A rank of a spatial group (the hybrid Mesh-TF path) passes its `SampleBlock`: it then
decodes and hands on only its block (B, D/pd, H/ph, W, 4) of every sample, cut from the raw bytes.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from common.base.errors import BenchError
from common.io.formats import TRAIN, VALIDATION
from common.io.formats import cosmoflow as record_format
from common.io.formats.cosmoflow import FORMAT
from common.io.input import (Datasets, Shard, dali_reader_sharding, local_files_dataset, open_input,
                             rank_shards)
from common.io.manifest import MANIFEST_NAME, Manifest, check_split_counts, load_manifest, sha256_file
from common.runtime.dist import DistEnv
from cosmoflow.config import CosmoDataConfig


@dataclasses.dataclass(frozen=True)
class SampleBlock:
    """The part of every sample one rank of a spatial group decodes: depth rows depth[0]:depth[1] and height rows
    height[0]:height[1], the whole width and every channel."""

    depth: tuple[int, int]
    height: tuple[int, int]

    def shape(self, sample_shape: Sequence[int]) -> tuple[int, ...]:
        """(d, h, W, C) of the block of a sample of `sample_shape` (D, H, W, C)."""
        return (self.depth[1] - self.depth[0], self.height[1] - self.height[0], *sample_shape[2:])

    def fraction(self, sample_shape: Sequence[int]) -> float:
        """The share of each sample the block holds (1 / (pd * ph) for a group's equal blocks)."""
        return float(np.prod(self.shape(sample_shape)) / np.prod(sample_shape))

    def cut(self, batch: np.ndarray) -> np.ndarray:
        """The block of every sample of a batch (B, D, H, W, C)."""
        return batch[:, self.depth[0]:self.depth[1], self.height[0]:self.height[1]]

    def check(self, sample_shape: Sequence[int], where: str) -> None:
        for name, (start, stop), size in (("depth", self.depth, sample_shape[0]), ("height", self.height,
                                                                                   sample_shape[1])):
            if not 0 <= start < stop <= size:
                raise BenchError(f"{where}: the block's {name} rows {start}:{stop} do not lie in the samples' "
                                 f"{name} {size} (shape {list(sample_shape)})")


def build_datasets(cfg: CosmoDataConfig, sample_shape: Sequence[int], local_batch: int,
                   dist: DistEnv, seed: int, block: SampleBlock | None = None) -> Datasets:
    """Datasets for training and validation on this rank, checked against the manifest.

    block: decode and give only this block of every sample (a rank of a spatial group).
    """
    drop = cfg.uneven_files == "drop"

    def split(manifest: Manifest) -> tuple[Shard, Shard]:
        shards = split_between_ranks(manifest, dist, local_batch, drop)
        if dist.rank == 0:
            _report_dropped(manifest, shards, dist.size)
        return shards

    rank_input = open_input(cfg, FORMAT, dist, local_batch, shard=split,
                            check=lambda manifest: _records_read(manifest, cfg, sample_shape, block))
    # The block's own records (data_prep cosmo-blocks) are a dataset of their own, read whole.
    own = rank_input.manifest.root != Path(cfg.dir)
    make = _dali_dataset if rank_input.loader == "dali" else _tfdata_dataset
    preprocess = _preprocess(cfg, rank_input.manifest)
    pipe = Pipe(rank_input.manifest, cfg, local_batch, dist, seed, preprocess, None if own else block)
    train = make(pipe, rank_input.train, cfg.shuffle, seed + dist.rank)
    val = make(pipe, rank_input.val, False, seed)
    datasets = rank_input.datasets(train, val)
    if block is None:
        return datasets
    # the samples' shape is the model's (checked)
    return dataclasses.replace(datasets, decoded_fraction=block.fraction(tuple(sample_shape)), block_records=own)


def _records_read(manifest: Manifest, cfg: CosmoDataConfig, sample_shape: Sequence[int],
                  block: SampleBlock | None) -> Manifest:
    """Check the dataset's manifest against the model; the manifest of the records this rank reads: the dataset's,
    or on a spatial group its block's own records when data.blocks finds them."""
    _check_manifest(manifest, sample_shape)
    if block is None:
        return manifest
    block.check(manifest.sample_shape, str(manifest.root / "manifest.json"))
    return block_records(cfg.blocks, manifest, block) or manifest


def block_records(mode: str, manifest: Manifest, block: SampleBlock) -> Manifest | None:
    """The manifest of `block`'s own records (python -m data_prep cosmo-blocks), checked against the whole
    dataset's `manifest`; None when `mode` (data.blocks) is "whole", or "auto" and they were not written."""
    if mode == "whole":
        return None
    shape = manifest.sample_shape
    d, h = block.shape(shape)[:2]
    spatial, (i, j) = (shape[0] // d, shape[1] // h), (block.depth[0] // d, block.height[0] // h)
    root = record_format.block_dir(manifest.root, spatial, i, j)
    if not (root / MANIFEST_NAME).is_file():
        if mode == "records":
            raise BenchError(f"data.blocks=records: no {root / MANIFEST_NAME}; write the per-block records with "
                             f"`python -m data_prep cosmo-blocks --data {manifest.root} --spatial "
                             f"{spatial[0]}x{spatial[1]}`, or set data.blocks=auto to cut blocks from the whole records")
        return None
    own = load_manifest(root, expected_format=FORMAT)
    check_block_manifest(own, manifest, block)
    return own


def check_block_manifest(own: Manifest, whole: Manifest, block: SampleBlock) -> None:
    """Refuse block records that are not `block` of the samples of `whole` in the same files and order."""
    where, src = own.root / MANIFEST_NAME, own.source or {}
    digest = sha256_file(whole.root / MANIFEST_NAME)
    facts = [("source.kind", src.get("kind"), record_format.BLOCKS_KIND),
             ("source.manifest_sha256", src.get("manifest_sha256"), digest),
             ("source.depth", src.get("depth"), list(block.depth)),
             ("source.height", src.get("height"), list(block.height)),
             ("sample_shape", list(own.sample_shape), list(block.shape(whole.sample_shape)))]
    for key, found, expected in facts:
        if found != expected:
            raise BenchError(f"{where}: {key} is {found!r}, expected {expected!r} for this rank's block of "
                             f"{whole.root} (the blocks of another dataset, version or partitioning: rerun "
                             f"python -m data_prep cosmo-blocks, or set data.blocks=whole)")
    for name, split in whole.splits.items():
        mine = own.splits.get(name)
        layout = [(f.path, f.records) for f in split.files]
        if mine is None or [(f.path, f.records) for f in mine.files] != layout:
            raise BenchError(f"{where}: split {name!r} does not list {whole.root}'s {len(layout)} files with their "
                             f"record counts in the same order; rerun python -m data_prep cosmo-blocks")


@dataclasses.dataclass(frozen=True)
class Pipe:
    """What both loaders' pipelines are built from, beside the shard, its shuffling and its seed."""

    manifest: Manifest
    cfg: CosmoDataConfig
    batch: int
    dist: DistEnv
    seed: int  # the run seed, from which the ranks of a node draw their division of its files (node_share)
    preprocess: object  # (x, y) -> (x, y): int16 counts to the model's float32 input
    block: SampleBlock | None = None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """What each sample the pipeline gives holds: the whole cube, or this rank's block."""
        shape = tuple(self.manifest.sample_shape)
        return self.block.shape(shape) if self.block else shape


def split_between_ranks(manifest: Manifest, dist: DistEnv, local_batch: int, drop: bool) -> tuple[Shard, Shard]:
    """This rank's files of the train and validation splits (`shard_split`)."""
    return tuple(shard_split(manifest, split, dist.rank, dist.size, local_batch, drop=drop)
                 for split in (TRAIN, VALIDATION))


def _report_dropped(manifest: Manifest, shards: tuple[Shard, Shard], size: int) -> None:
    """Say which files data.uneven_files=drop leaves out (nothing when it leaves out none)."""
    for shard in shards:
        split, files = shard.split, len(manifest.splits[shard.split].files)
        left = files - len(shard.files) * size
        if left > 0:
            print(f"note: data.uneven_files=drop: the {split} split's last {left} of {files} files are not read "
                  f"at {size} ranks ({shard.global_samples} of {manifest.splits[split].samples} samples)",
                  flush=True)


def files_read(manifest: Manifest, rank: int, size: int, local_batch: int, drop: bool = False) -> list[str]:
    """The dataset paths (records and indexes) rank `rank` of `size` reads: what data.stage_mode=rank stages."""
    for split in (TRAIN, VALIDATION):
        shard_split(manifest, split, rank, size, local_batch, drop=drop)  # the same checks as training
    entries = [e for split in (TRAIN, VALIDATION) for e in _rank_entries(manifest, split, rank, size, drop)]
    return [p for e in entries for p in (e.path, e.index) if p]


def _check_manifest(manifest: Manifest, sample_shape: Sequence[int]) -> None:
    where = manifest.root / "manifest.json"
    if tuple(manifest.sample_shape) != tuple(sample_shape):
        raise BenchError(f"{where}: samples have shape {list(manifest.sample_shape)}, but the model expects "
                         f"{list(sample_shape)} (model.input_shape); convert with a matching --sample-size "
                         f"or change the config")
    problem = record_format.layout_problem(manifest)
    if problem:
        raise BenchError(f"{where}: {problem[0]}, expected {problem[1]}; reconvert with cosmo-convert")


def shard_split(manifest: Manifest, split: str, rank: int, size: int, local_batch: int,
                drop: bool = False) -> Shard:
    """Files r, r+size, ... of a split for rank r; every rank must get the same whole number of batches.

    drop: leave out the split's last (files mod size) files, so that every rank has as many files.
    """
    where = manifest.root / "manifest.json"
    check_split_counts(manifest, {split: 0}, str(where))
    files = len(manifest.splits[split].files)
    if files < size:
        raise BenchError(f"{where}: the {split} split has {files} files for {size} ranks; "
                         f"each rank needs at least one file")
    counts = [sum(e.records for e in _rank_entries(manifest, split, r, size, drop)) for r in range(size)]
    total = sum(counts)
    if len(set(counts)) != 1:
        hint = ("its files hold unequal record counts" if drop else
                "use a rank count that divides the files evenly, or data.uneven_files=drop")
        raise BenchError(f"{where}: the {split} split's {files} files give the {size} ranks unequal "
                         f"sample counts {counts}; {hint}")
    if counts[0] % local_batch:
        raise BenchError(f"{where}: each of the {size} ranks has {counts[0]} {split} samples, which is not a "
                         f"multiple of the local batch size {local_batch} ({total} samples in all)")
    mine = _rank_entries(manifest, split, rank, size, drop)
    root = str(manifest.root)  # joined as strings: a Path per file cost 12 ms of a 1,000-file split
    return Shard(split=split, files=tuple(os.path.join(root, e.path) for e in mine),
                 index_files=tuple(os.path.join(root, e.index) if e.index else None for e in mine),
                 runs=tuple((0, e.records) for e in mine), samples=counts[rank], global_samples=total)


def _rank_entries(manifest: Manifest, split: str, rank: int, size: int, drop: bool) -> list:
    """The manifest entries of rank `rank`: files rank, rank + size, ... (of the first size * (N // size))."""
    entries = manifest.splits[split].files
    if drop:
        entries = entries[:len(entries) - len(entries) % size]
    return entries[rank::size]


# ---------------------------------------------------------------------------- tf.data
def _tfdata_dataset(pipe: Pipe, shard: Shard, shuffle: bool, seed: int):
    import tensorflow as tf
    manifest, cfg = pipe.manifest, pipe.cfg
    compression = "GZIP" if manifest.compression == "gzip" else ""
    parse = _record_parser(manifest.sample_shape, manifest.target_size, pipe.block)
    files = tf.data.Dataset.from_tensor_slices(list(shard.files))
    if shard.local:
        # Every epoch, this rank's part of a new division of the node's files (already endless).
        records = local_files_dataset(list(shard.files), *shard.local, pipe.seed, shuffle=shuffle).interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
            cycle_length=min(cfg.read_threads, len(shard.files)), block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if shuffle:
            records = records.shuffle(cfg.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    elif shuffle:
        # Reshuffled every epoch (repeat after shuffle); the seed makes it reproducible.
        files = files.shuffle(len(shard.files), seed=seed, reshuffle_each_iteration=True)
        records = files.repeat().interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
            cycle_length=min(cfg.read_threads, len(shard.files)), block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        records = records.shuffle(cfg.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    else:
        # Files in manifest order, records in file order: the order DALI reads them unshuffled.
        records = tf.data.TFRecordDataset(files, compression_type=compression).repeat()
    samples = records.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    batches = samples.batch(pipe.batch, drop_remainder=True)
    return batches.map(pipe.preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(cfg.prefetch)


def _preprocess(cfg: CosmoDataConfig, manifest: Manifest):
    """int16 counts -> float32 log(1 + counts), standardised per channel when data.normalize is set.

    Applied after either loader, so both agree bit for bit.
    """
    import tensorflow as tf
    mean, std = channel_stats(manifest) if cfg.normalize else (None, None)

    def preprocess(x, y):
        x = tf.cast(x, tf.float32)  # (B, D, H, W, C)
        if cfg.apply_log:
            x = tf.math.log1p(x)
        if mean is not None:
            x = (x - mean) / std  # (C,) broadcast over the channels-last axis
        return x, y

    return preprocess


def channel_stats(manifest: Manifest) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std), each (C,) float32, of log(1 + counts) from the manifest's input_stats, checked."""
    where = manifest.root / "manifest.json"
    stats, channels = manifest.input_stats, manifest.sample_shape[-1]
    if not stats:
        raise BenchError(f"{where}: no input_stats, which data.normalize=true needs; reconvert the dataset "
                         f"with this version of cosmo-convert (or index it without --stats-files 0), or set "
                         f"data.normalize=false")
    if stats.get("transform") != record_format.LOG1P:
        raise BenchError(f"{where}: input_stats.transform is {stats.get('transform')!r}, expected "
                         f"{record_format.LOG1P!r}")
    arrays = []
    for key in ("mean", "std"):
        value = np.asarray(stats.get(key, []), dtype=np.float64)
        if value.shape != (channels,) or not np.all(np.isfinite(value)):
            raise BenchError(f"{where}: input_stats.{key} is {stats.get(key)!r}, expected {channels} finite numbers")
        arrays.append(value.astype(np.float32))
    if np.any(arrays[1] <= 0):
        raise BenchError(f"{where}: input_stats.std is {stats['std']}, expected positive values")
    return arrays[0], arrays[1]


def _record_parser(sample_shape: Sequence[int], target_size: int, block: SampleBlock | None = None):
    import tensorflow as tf
    features = record_format.tf_features(target_size)

    def parse(record):
        # (D, H, W, C) int16 (or the block's (d, h, W, C)), (target_size,) float32; fails on a wrong-size record
        example = tf.io.parse_single_example(record, features)
        if block is None:
            return record_format.tf_decode(example, sample_shape)
        return record_format.tf_decode_block(example, sample_shape, block.depth, block.height)

    return parse


# ---------------------------------------------------------------------------- DALI
def _dali_dataset(pipe: Pipe, shard: Shard, shuffle: bool, seed: int):
    """A DALIDataset on the CPU, or on this rank's GPU when one is present."""
    try:
        import nvidia.dali.plugin.tf as dali_tf
    except ImportError as err:
        raise BenchError(f"data.loader=dali needs nvidia-dali-cuda120 and nvidia-dali-tf-plugin-cuda120 "
                         f"(make setup installs both): {err}") from None
    import tensorflow as tf
    batch, dist = pipe.batch, pipe.dist
    device_id = dist.gpu_index  # the GPU TensorFlow uses (0 with one visible GPU per rank), None on CPU
    pipeline = _dali_pipeline(pipe, shard, shuffle, seed, device_id)
    shapes = ((batch, *pipe.sample_shape), (batch, pipe.manifest.target_size))
    with tf.device("/gpu:0" if dist.gpu else "/cpu:0"):
        dataset = dali_tf.DALIDataset(pipeline=pipeline, batch_size=batch, output_shapes=shapes,
                                      output_dtypes=(tf.int16, tf.float32), device_id=device_id)
        # Preprocessing overlaps with the next DALI batch and the training step, as on the tf.data path.
        return dataset.map(pipe.preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(pipe.cfg.prefetch)


def _dali_pipeline(pipe: Pipe, shard: Shard, shuffle: bool, seed: int, device_id: int | None):
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def
    manifest, cfg, block = pipe.manifest, pipe.cfg, pipe.block

    @pipeline_def(batch_size=pipe.batch, num_threads=cfg.read_threads, device_id=device_id, seed=seed,
                  prefetch_queue_depth=cfg.prefetch)
    def pipeline():
        record = fn.readers.tfrecord(
            path=list(shard.files), index_path=list(shard.index_files),
            features=record_format.dali_features(manifest.target_size),
            initial_fill=cfg.shuffle_buffer, name="reader",
            **dali_reader_sharding(shard.local, pipe.seed, shuffle))
        if block is None:
            x, y = record_format.dali_decode(record, manifest.sample_shape)  # (D, H, W, C) int16, (target,) float32
        else:  # (d, h, W, C) int16: only this rank's block is decoded
            x, y = record_format.dali_decode_block(record, manifest.sample_shape, block.depth, block.height)
        if device_id is not None:
            x, y = x.gpu(), y.gpu()
        return x, y

    return pipeline()


# ---------------------------------------------------------------------------- diagnosis
def diagnose_read_error(files: Sequence[str], compression: str, sample_shape: Sequence[int],
                        target_size: int, err: Exception) -> str:
    """Find the first bad file and record behind a read error and describe it with the facts."""
    import tensorflow as tf
    expected = int(np.prod(sample_shape))
    features = record_format.tf_features(target_size)
    for path in files:
        good = 0  # records read intact so far; the next one is the culprit
        try:
            for record in tf.data.TFRecordDataset(path, compression_type=compression):
                example = tf.io.parse_single_example(record, features)
                found = len(example[record_format.SAMPLE_KEY].numpy()) // record_format.STORED_SAMPLE_DTYPE.itemsize
                if found != expected:
                    return (f"{path}: record {good} holds {found} int16 values, expected {expected} for the "
                            f"sample shape {list(sample_shape)}")
                good += 1
        except tf.errors.DataLossError as loss:
            return (f"{path}: corrupt or truncated TFRecord at record {good} (bad length or CRC: "
                    f"{loss.message.splitlines()[0]}); regenerate or reconvert this file")
        except tf.errors.InvalidArgumentError as bad:
            return f"{path}: record {good} is not {record_format.describe(target_size)}: {bad.message.splitlines()[0]}"
        except UnicodeDecodeError:  # TensorFlow quotes a payload that is no Example in its error, undecodable
            return (f"{path}: record {good} is not a tf.train.Example (its bytes do not parse as one); "
                    f"expected {record_format.describe(target_size)}")
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"reading the CosmoFlow records failed ({first}); no bad record was found in {len(files)} files"


def read_error(cfg: CosmoDataConfig, local_batch: int, dist: DistEnv, err: Exception) -> BenchError:
    """A BenchError naming the file and record behind a tf.data or DALI read failure on this rank."""
    manifest = load_manifest(cfg.dir, expected_format=FORMAT)
    drop = cfg.uneven_files == "drop"
    shards = rank_shards(manifest, cfg, dist, local_batch, lambda m: split_between_ranks(m, dist, local_batch, drop))
    files = [f for shard in shards.values() for f in shard.files]
    compression = "GZIP" if manifest.compression == "gzip" else ""
    return BenchError(diagnose_read_error(files, compression, manifest.sample_shape, manifest.target_size, err))
