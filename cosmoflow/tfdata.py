"""CosmoFlow's records read by TensorFlow, beside the DALI pipeline of cosmoflow/data.py: the tf.data loader
(data.loader=tfdata), and the check of a record's sample size with which `read_error` finds the record behind a failed
read under either loader.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from common.io.formats import cosmoflow as record_format, cosmoflow_blocks
from common.base.errors import BenchError
from common.io.input import Shard, rank_shards
from common.io.manifest import load_manifest
from cosmoflow.mesh.groups import SampleBlock


def tfdata_dataset(pipe: Any, shard: Shard, shuffle: bool, seed: int):
    """The tf.data loader of `shard`, built from `pipe` (cosmoflow/data.py's `Pipe`), as DALI's is."""
    import tensorflow as tf
    from common.io.tfdata import Records, epoch_batches
    manifest, cfg = pipe.manifest, pipe.cfg
    compression = "GZIP" if manifest.compression == "gzip" else ""
    records = Records(read=lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
                      parse=record_parser(manifest.sample_shape, manifest.target_size, pipe.block),
                      batch=pipe.batch, drop_remainder=True, read_threads=cfg.read_threads,
                      shuffle_buffer=cfg.shuffle_buffer)
    batches = epoch_batches(list(shard.files), shard.local, (pipe.seed, seed), shuffle, records)
    return batches.map(pipe.preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(cfg.prefetch)


def record_parser(sample_shape: Sequence[int], target_size: int, block: SampleBlock | None = None):
    import tensorflow as tf
    features = record_format.tf_features(target_size)

    def parse(record):
        # (D, H, W, C) int16 (or the block's (d, h, W, C)), (target_size,) float32; fails on a wrong-size record
        example = tf.io.parse_single_example(record, features)
        if block is None:
            return record_format.tf_decode(example, sample_shape)
        return cosmoflow_blocks.tf_decode_block(example, sample_shape, block.depth, block.height)

    return parse


def wrong_size(sample_shape: Sequence[int]):
    """What is wrong with a parsed record's sample size for `sample_shape`, or None."""
    expected = int(np.prod(sample_shape))

    def check(example: dict) -> str | None:
        found = len(example[record_format.SAMPLE_KEY].numpy()) // record_format.STORED_SAMPLE_DTYPE.itemsize
        return None if found == expected else (f"holds {found} int16 values, expected {expected} for the sample "
                                               f"shape {list(sample_shape)}")
    return check


def read_error(split: Callable, cfg: Any, local_batch: int, dist: Any, err: Exception) -> BenchError:
    """A BenchError naming the file and record behind a tf.data or DALI read failure on this rank; `split`:
    cosmoflow/data.py's `split_between_ranks` (the run's App binds it)."""
    from common.io.bad_record import first_bad_record, read_failure
    manifest = load_manifest(cfg.dir, expected_format=record_format.FORMAT)
    drop = cfg.uneven_files == "drop"
    shards = rank_shards(manifest, cfg, dist, local_batch, lambda m: split(m, dist, local_batch, drop))
    files = [f for shard in shards.values() for f in shard.files]
    problem = first_bad_record(files, manifest.compression, record_format.tf_features(manifest.target_size),
                               record_format.describe(manifest.target_size), wrong_size(manifest.sample_shape))
    return read_failure("CosmoFlow", err, files, dist.rank, problem)
