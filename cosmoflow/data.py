"""CosmoFlow input pipeline: TFRecords (docs/formats.md) through NVIDIA DALI, or tf.data (cosmoflow/tfdata.py).

`build_datasets` checks the dataset against its manifest up front (sample shape, the files this rank reads, sizes,
counts that divide across ranks and batches), shards files by rank (rank r reads files r, r+size, ...; with
data.stage_mode=node_share the node's share, divided between its ranks afresh every epoch, see common/io/input.py),
and returns repeated batched datasets of (B, D, H, W, 4) float32 log(1 + counts) and (B, 4) float32 targets. Both
loaders give the same tensors. A rank of a spatial group (the hybrid Mesh-TF path) passes its `SampleBlock`
(cosmoflow/mesh/groups.py): it then decodes and hands on only its block (B, D/pd, H/ph, W, 4) of every sample, cut
from the raw bytes, or reads the block's own records (`block_records`).
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from common.base.errors import BenchError
from common.io.formats import TRAIN, VALIDATION
from common.io.formats import cosmoflow as record_format, cosmoflow_blocks
from common.io.formats.cosmoflow import FORMAT
from common.io.input import Datasets, Shard, dali_reader_sharding, open_input
from common.io.manifest import Manifest, check_split_counts
from common.runtime.dist import DistEnv
from cosmoflow import tfdata
from cosmoflow.config import CosmoDataConfig
from cosmoflow.mesh.groups import SampleBlock, block_records


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
    make = _dali_dataset if rank_input.loader == "dali" else tfdata.tfdata_dataset
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
            initial_fill=cfg.shuffle_buffer, name="reader", dont_use_mmap=not cfg.dali_mmap,
            **dali_reader_sharding(shard.local, pipe.seed, shuffle))
        if block is None:
            x, y = record_format.dali_decode(record, manifest.sample_shape)  # (D, H, W, C) int16, (target,) float32
        else:  # (d, h, W, C) int16: only this rank's block is decoded
            x, y = cosmoflow_blocks.dali_decode_block(record, manifest.sample_shape, block.depth, block.height)
        if device_id is not None:
            x, y = x.gpu(), y.gpu()
        return x, y

    return pipeline()
