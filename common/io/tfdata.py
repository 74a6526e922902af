"""The tf.data loader's stream of a rank's batches, epoch after epoch, for both applications.

Each epoch is built on its own from the epoch number, so no record or batch crosses an epoch's end (every
sample of the rank's share once per epoch, as the MLCommons reference's shuffle-then-repeat pipeline gives):
  files     this rank's files (its part of a new division of its node's files with data.stage_mode=node_share),
            in an order drawn from (file_seed, epoch) by common/io/node_share.py, the same in numpy and here;
  records   read `read_threads` files at a time, then shuffled inside windows of `shuffle_buffer` records, each
            window's order drawn from (record_seed, epoch, window) by a stateless shuffle;
  batches   parsed, batched.
Unshuffled (validation), the files are read one after another in the order given, as DALI reads them.

Why windows and not Dataset.shuffle: the suite saves the tf.data iterator in its checkpoints, and TensorFlow
2.18 restores neither a seeded shuffle built inside a per-epoch function (its seed generator cannot be
serialised) nor, exactly, two reshuffling shuffles inside one repeat() (a resumed run then reads other records
from the next epoch on). A window of B records keeps a record within B places of where it was read, about what
a B-record shuffle buffer does.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from common.io.node_share import local_files_dataset


@dataclasses.dataclass(frozen=True)
class Records:
    """How an application's record files become its batches."""

    read: Callable  # one file's element (its path, or its columns) -> a dataset of its serialised records
    parse: Callable  # a serialised record -> one sample
    batch: int
    drop_remainder: bool
    read_threads: int  # files read at once (data.read_threads)
    shuffle_buffer: int  # the records shuffled together (data.shuffle_buffer)


def epoch_batches(items: Sequence, local: tuple[int, int] | None, seeds: tuple[int, int], shuffle: bool,
                  records: Records):
    """Endless batches of `items` (paths, or a tuple of per-file columns) epoch after epoch; `local` =
    (local_rank, local_size) divides them as a node share. `seeds` = (run seed, rank seed): a node's ranks divide
    its files from the run seed (the same on all of them); a rank alone orders its own files, and every rank
    shuffles its records, from its rank seed."""
    import tensorflow as tf
    count = len(items[0]) if isinstance(items, tuple) else len(items)
    run_seed, record_seed = seeds
    file_seed = run_seed if local else record_seed

    def epoch(files, number):
        if shuffle:
            read = files.interleave(records.read, cycle_length=min(records.read_threads, count), block_length=1,
                                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            read = window_shuffled(read, records.shuffle_buffer, record_seed, number)
        else:
            read = files.flat_map(records.read)
        samples = read.map(records.parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return samples.batch(records.batch, drop_remainder=records.drop_remainder)

    return local_files_dataset(items, *(local or (0, 1)), file_seed, shuffle=shuffle, per_epoch=epoch)


def window_shuffled(records, window: int, seed: int, epoch):
    """`records` with each run of `window` of them in an order drawn from (seed, epoch, the run's number)."""
    import tensorflow as tf
    base = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])

    def shuffle(number, run):
        return tf.random.experimental.stateless_shuffle(run, tf.random.experimental.stateless_fold_in(base, number))

    return records.batch(window).enumerate().map(shuffle).unbatch()
