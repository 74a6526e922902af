"""DeepCAM input pipeline: TFRecords (see docs/formats.md) through tf.data or NVIDIA DALI.

`build_datasets` checks the dataset against its manifest up front (image shape, files, sizes, the
statistics file, enough samples for the ranks and the batch). Each split is cut into contiguous
blocks of records, one per rank. Training: rank r reads records [r*m, (r+1)*m) of the split in file
order, where m is N // ranks rounded down to a multiple of the local batch (so fewer than ranks x batch
samples are left out of an epoch); an epoch is exactly a rank's m records, reshuffled every epoch when
shuffling. Validation covers every sample: the first N mod ranks ranks read one sample more than the
others, and a rank's last batch is partial when its block is not a whole number of batches, so every
evaluation reads each of the N samples once (the `eval_samples` logged). With data.stage_mode=node_share
a rank reads instead its part of its node's share of the files, divided afresh every epoch
(common/io/input.py). The datasets repeat and yield
(B, H, W, 16) float32 fields normalised per channel from the dataset's stats.h5, and (B, H, W)
int32 labels. Both loaders give the same tensors when shuffling is off.
"""
from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Sequence

import numpy as np

from common.base.errors import BenchError
from common.io.formats import TRAIN, VALIDATION
from common.io.formats import deepcam as record_format
from common.io.formats.deepcam import CHANNELS, FORMAT, STATS_AUX, STATS_NAME, read_stats
from common.io.input import Datasets, RankInput, Shard, dali_reader_sharding, open_input, rank_shards
from common.io.manifest import MANIFEST_NAME, Manifest, check_aux_file, check_split_counts, load_manifest
from common.runtime.dist import DistEnv
from deepcam.config import DeepCamDataConfig


def build_datasets(cfg: DeepCamDataConfig, image_shape: Sequence[int], local_batch: int, dist: DistEnv,
                   seed: int) -> Datasets:
    """Datasets for training and validation on this rank, checked against the manifest.

    Args:
        image_shape: (H, W, 16), the model's channels-last input shape.
    Returns:
        Datasets whose train_samples and val_samples are the sizes of the splits (what the
        reference logs); an epoch reads ranks x train_steps x local_batch of them.
    """
    rank_input = open_input(cfg, FORMAT, dist, local_batch, whole_dataset=True,
                            check=lambda manifest: _check_manifest(manifest, image_shape),
                            shard=lambda manifest: split_between_ranks(manifest, dist, local_batch))
    stats_path = check_aux_file(rank_input.manifest, STATS_AUX)
    shift, divisor = normalization_constants(read_stats(stats_path), cfg.normalization, stats_path)
    make = _dali_dataset if rank_input.loader == "dali" else _tfdata_dataset
    preprocess = _preprocess(shift, divisor)
    train = make(rank_input.train, rank_input, cfg, dist, preprocess, cfg.shuffle, seed + dist.rank, seed)
    val = make(rank_input.val, rank_input, cfg, dist, preprocess, False, seed, seed)
    return rank_input.datasets(train, val)


def split_between_ranks(manifest: Manifest, dist: DistEnv, local_batch: int) -> tuple[Shard, Shard]:
    """This rank's blocks of the train split (`shard_split`) and of the validation split (`validation_block`)."""
    return (shard_split(manifest, TRAIN, dist.rank, dist.size, local_batch),
            validation_block(manifest, dist.rank, dist.size))


def validation_block(manifest: Manifest, rank: int, size: int) -> Shard:
    """Rank `rank`'s contiguous block of the validation split, the N samples split as evenly as possible
    (N // size each, one more on the first N % size ranks), so the ranks together evaluate all N."""
    total = manifest.splits[VALIDATION].samples
    if total < size:
        raise BenchError(f"{manifest.root / MANIFEST_NAME}: the {VALIDATION} split has {total} samples for {size} "
                         f"ranks; every rank needs at least one: use fewer ranks or a larger dataset")
    base, extra = divmod(total, size)
    first, count = rank * base + min(rank, extra), base + (rank < extra)
    return _records(manifest, VALIDATION, first, count)


def files_read(manifest: Manifest, rank: int, size: int, local_batch: int) -> list[str]:
    """The dataset paths (records and indexes) rank `rank` of `size` reads: what data.stage_mode=rank stages."""
    shards = [shard_split(manifest, split, rank, size, local_batch) for split in (TRAIN, VALIDATION)]
    paths = [q for shard in shards for pair in zip(shard.files, shard.index_files) for q in pair if q]
    return list(dict.fromkeys(str(Path(q).relative_to(manifest.root)) for q in paths))


def _check_manifest(manifest: Manifest, image_shape: Sequence[int]) -> Manifest:
    """`manifest`, checked against the model's input shape (H, W, 16)."""
    where = manifest.root / MANIFEST_NAME
    if len(image_shape) != 3 or image_shape[2] != CHANNELS:
        raise BenchError(f"image shape {list(image_shape)}: expected [H, W, {CHANNELS}] (channels last)")
    if tuple(manifest.sample_shape) != tuple(image_shape):
        raise BenchError(f"{where}: samples have shape {list(manifest.sample_shape)} (H, W, C), but the config "
                         f"expects {list(image_shape)}; convert data of that size or change the config")
    problem = record_format.layout_problem(manifest)
    if problem:
        raise BenchError(f"{where}: {problem[0]}, expected {problem[1]}; reconvert with deepcam-convert")
    return manifest


def shard_split(manifest: Manifest, split: str, rank: int, size: int, local_batch: int) -> Shard:
    """Rank `rank`'s block of records [rank*m, (rank+1)*m) of a split, m = (N // size) rounded down to batches."""
    check_split_counts(manifest, {split: 0}, str(manifest.root / MANIFEST_NAME))
    total = manifest.splits[split].samples
    per_rank = total // size
    if per_rank < local_batch:
        raise BenchError(f"{manifest.root / MANIFEST_NAME}: the {split} split has {total} samples, fewer than "
                         f"ranks x local batch = {size} x {local_batch} = {size * local_batch}; every rank needs "
                         f"at least one full batch: use fewer ranks, a smaller batch or a larger dataset")
    samples = per_rank - per_rank % local_batch
    return _records(manifest, split, rank * samples, samples)


def _records(manifest: Manifest, split: str, first: int, count: int) -> Shard:
    """The shard of records [first, first + count) of a split: a run of records of each file it reaches."""
    files, offset, end = [], 0, first + count
    for entry in manifest.splits[split].files:
        lo, hi = max(first, offset), min(end, offset + entry.records)
        if lo < hi:
            index = str(manifest.root / entry.index) if entry.index else None
            files.append((str(manifest.root / entry.path), index, (lo - offset, hi - lo)))
        offset += entry.records
    paths, indexes, runs = (tuple(column) for column in zip(*files)) if files else ((), (), ())
    return Shard(split=split, files=paths, index_files=indexes, runs=runs, samples=count,
                 global_samples=manifest.splits[split].samples)


# ---------------------------------------------------------------------------- normalisation
def normalization_constants(stats: dict[str, np.ndarray], kind: str,
                            where: str | Path = STATS_NAME) -> tuple[np.ndarray, np.ndarray]:
    """(shift, divisor), each (16,) float32, for x -> (x - shift) / divisor per channel.

    "minmax" (the reference's): shift minval, divisor maxval - minval.
    "meanstd": shift mean, divisor sqrt(sqmean - mean^2).
    """
    if kind == "minmax":
        shift, divisor, what = stats["minval"], stats["maxval"] - stats["minval"], "maxval - minval"
    elif kind == "meanstd":
        shift, what = stats["mean"], "sqrt(sqmean - mean^2)"
        divisor = np.sqrt(np.maximum(stats["sqmean"] - stats["mean"] ** 2, 0.0))
    else:
        raise BenchError(f"normalization {kind!r}: expected 'minmax' or 'meanstd'")
    shift, divisor = shift.astype(np.float32), divisor.astype(np.float32)
    if not np.all(divisor > 0):
        channel = int(np.argmin(divisor > 0))
        raise BenchError(f"{where}: channel {channel} has {what} = {divisor[channel]}, so {kind} normalisation "
                         f"would divide by zero; expected a positive spread in every channel")
    return shift, divisor


def _preprocess(shift: np.ndarray, divisor: np.ndarray):
    """Normalise fields, widen labels; applied after either loader, so both agree bit for bit."""
    import tensorflow as tf
    shift_t, divisor_t = tf.constant(shift), tf.constant(divisor)

    def preprocess(x, y):
        return (x - shift_t) / divisor_t, tf.cast(y, tf.int32)  # (B, H, W, C) float32, (B, H, W) int32

    return preprocess


# ---------------------------------------------------------------------------- tf.data
def _tfdata_dataset(shard: Shard, rank_input: RankInput, cfg: DeepCamDataConfig, dist: DistEnv, preprocess,
                    shuffle: bool, seed: int, run_seed: int):
    """run_seed: what the ranks of a node draw their division of its files from (data.stage_mode=node_share)."""
    import tensorflow as tf
    from common.io.tfdata import Records, epoch_batches
    manifest, batch = rank_input.manifest, rank_input.local_batch
    compression = "GZIP" if manifest.compression == "gzip" else ""
    # (path, first record, records) of every file the shard reads
    columns = (list(shard.files), np.int64([start for start, _ in shard.runs]), np.int64([n for _, n in shard.runs]))

    def read(path, start, count):
        return tf.data.TFRecordDataset(path, compression_type=compression).skip(start).take(count)

    # A pass is shard.samples records, batched on its own: no batch spans two passes, and a validation block
    # that is not a whole number of batches ends with a partial one.
    records = Records(read=read, parse=_record_parser(manifest.sample_shape), batch=batch,
                      drop_remainder=shard.local is not None, read_threads=cfg.read_threads,
                      shuffle_buffer=cfg.shuffle_buffer)
    batches = epoch_batches(columns, shard.local, (run_seed, seed), shuffle, records)
    return batches.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(cfg.prefetch)


def _record_parser(sample_shape: Sequence[int]):
    import tensorflow as tf
    features = record_format.tf_features()

    def parse(record):
        # (H, W, C) float32, (H, W) uint8; fails on a record of the wrong size
        return record_format.tf_decode(tf.io.parse_single_example(record, features), sample_shape)

    return parse


# ---------------------------------------------------------------------------- DALI
def _dali_dataset(shard: Shard, rank_input: RankInput, cfg: DeepCamDataConfig, dist: DistEnv, preprocess,
                  shuffle: bool, seed: int, run_seed: int):
    """A DALIDataset on the CPU, or on this rank's GPU when one is present."""
    import tensorflow as tf
    manifest, batch = rank_input.manifest, rank_input.local_batch
    dali_tf = _dali_plugin()
    index_dir, index_files = _block_indexes(shard)
    device_id = dist.gpu_index  # the GPU TensorFlow uses (0 with one visible GPU per rank), None on CPU
    sharding = dali_reader_sharding(shard.local, run_seed, shuffle)
    pipe = _dali_pipeline(shard, index_files, manifest.sample_shape, cfg, batch, sharding, seed, device_id)
    height, width, channels = manifest.sample_shape
    with tf.device("/gpu:0" if dist.gpu else "/cpu:0"):
        dataset = dali_tf.DALIDataset(pipeline=pipe, batch_size=batch, device_id=device_id,
                                      output_shapes=((batch, height, width, channels), (batch, height, width)),
                                      output_dtypes=(tf.float32, tf.uint8))
        weakref.finalize(dataset, shutil.rmtree, index_dir, True)  # the indexes live as long as the reader
        if shard.local is None and shard.samples % batch:
            dataset = _trim_last_batch(dataset, shard.samples, batch)
        # Preprocessing overlaps with the next DALI batch and the training step, as on the tf.data path.
        return dataset.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(cfg.prefetch)


def _trim_last_batch(dataset, samples: int, batch: int):
    """Cut the padding off the last batch of every pass: DALI's reader (pad_last_batch) fills it up with
    copies of the last sample; the pass has `samples` samples."""
    import tensorflow as tf
    steps, last = -(-samples // batch), samples % batch

    def trim(i, xy):
        size = tf.where(i % steps == steps - 1, last, batch)
        return xy[0][:size], xy[1][:size]

    return dataset.enumerate().map(trim)


def _dali_plugin():
    try:
        import nvidia.dali.plugin.tf as plugin
    except ImportError as err:
        raise BenchError(f"{err}: DeepCAM's data.loader=dali reads through NVIDIA DALI and its TensorFlow "
                         f"plugin; install nvidia-dali-cuda120 and nvidia-dali-tf-plugin-cuda120 (make setup "
                         f"does), or set data.loader=tfdata") from None
    return plugin


def _block_indexes(shard: Shard) -> tuple[str, list[str]]:
    """Index files listing only the records of each file the shard reads, so that DALI reads exactly this
    rank's block.

    They go to a temporary directory (the dataset may be read-only); returns it and the files.
    """
    directory = tempfile.mkdtemp(prefix=f"deepcam-{shard.split}-index-")
    files = []
    for i, (index, (start, count)) in enumerate(zip(shard.index_files, shard.runs)):
        lines = Path(index).read_text().splitlines()[start:start + count]
        path = Path(directory) / f"{i:06d}.idx"
        path.write_text("".join(line + "\n" for line in lines))
        files.append(str(path))
    return directory, files


def _dali_pipeline(shard: Shard, index_files: list[str], sample_shape: Sequence[int], cfg: DeepCamDataConfig,
                   batch: int, sharding: dict, seed: int, device_id: int | None):
    """sharding: the reader's shuffling and division arguments (`dali_reader_sharding`)."""
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch, num_threads=cfg.read_threads, device_id=device_id, seed=seed,
                  prefetch_queue_depth=cfg.prefetch)
    def pipeline():
        record = fn.readers.tfrecord(
            path=list(shard.files), index_path=index_files, features=record_format.dali_features(),
            initial_fill=cfg.shuffle_buffer, name="reader", dont_use_mmap=not cfg.dali_mmap,
            pad_last_batch=shard.local is None,
            **sharding)
        x, y = record_format.dali_decode(record, sample_shape)  # (H, W, C) float32, (H, W) uint8
        if device_id is not None:
            x, y = x.gpu(), y.gpu()
        return x, y

    return pipeline()


# ---------------------------------------------------------------------------- diagnosis
def read_error(cfg: DeepCamDataConfig, local_batch: int, dist: DistEnv, err: Exception) -> BenchError:
    """A BenchError naming the file and record behind a tf.data or DALI read failure on this rank."""
    from common.io.bad_record import read_failure
    manifest = load_manifest(cfg.dir, expected_format=FORMAT)
    shards = rank_shards(manifest, cfg, dist, local_batch, lambda m: split_between_ranks(m, dist, local_batch))
    paths = list(dict.fromkeys(path for shard in shards.values() for path in shard.files))
    return read_failure("DeepCAM", err, paths, dist.rank, find_bad_record(paths, manifest))


def find_bad_record(paths: Sequence[str], manifest: Manifest) -> str | None:
    """The first problem in the record files `paths`: a bad frame or CRC, a foreign record, a wrong size."""
    from common.io.bad_record import first_bad_record
    expected = record_format.feature_bytes(manifest.sample_shape)

    def wrong_size(example: dict) -> str | None:
        for key, size in expected.items():
            if (found := len(example[key].numpy())) != size:
                return (f"has {found} bytes of {key!r}, expected {size} for samples of shape "
                        f"{list(manifest.sample_shape)}; reconvert the dataset")
        return None
    return first_bad_record(paths, manifest.compression, record_format.tf_features(),
                            record_format.describe(), wrong_size)
