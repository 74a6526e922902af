"""Node shares (data.stage_mode=node_share): node n of N holds files n, n+N, n+2N, ... of each split (so each node
stages only its share, common/io/staging.py). Every epoch the ranks of a node draw one permutation of the node's
files from the run seed and the epoch number (the same on every rank of the node), cut it into L equal blocks
(L ranks per node) and local rank l reads block l. Across the job every file is read exactly once per epoch, while
the samples a rank sees change from epoch to epoch. Validation files are divided the same way, without the
permutation (so block l is the one DALI's reader gives shard l of L). common/io/input.py makes a rank's shards
of them.

With data.uneven_files=drop a file count that does not divide is cut rather than refused: every node reads as
many files as the node with the fewest (files node, node+N, ... of the split's first N * (files // N)), and each
epoch the last (files mod L) of a node's permutation are not read, so a different few are left out every epoch
(validation, unpermuted, always leaves out the same last ones, and says so).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from common.base.errors import BenchError
from common.io.formats import TRAIN, VALIDATION
from common.io.manifest import MANIFEST_NAME, FileEntry, Manifest


@dataclasses.dataclass(frozen=True)
class NodeShare:
    """One node's files of one split and what each of its ranks reads per epoch."""

    split: str
    files: tuple[FileEntry, ...]  # the node's share, in manifest order
    local_rank: int
    local_size: int
    samples_per_rank: int  # records one rank reads per epoch
    global_samples: int  # records in the split


def node_share_files(manifest: Manifest, split: str, node: int, nodes: int) -> tuple[FileEntry, ...]:
    """Files node, node+nodes, ... of a split."""
    return tuple(manifest.splits[split].files[node::nodes])


def node_share(manifest: Manifest, split: str, node: tuple[int, int], local: tuple[int, int], local_batch: int,
               drop: bool = False) -> NodeShare:
    """The node's share of `split`, checked so that every rank reads the same whole number of batches;
    `node` is (node, nodes), `local` (local rank, ranks per node).

    Raises BenchError when the split's files cannot be dealt evenly: every node must get the same number
    of files with the same records each, a multiple of local_size files (both cut instead with `drop`,
    data.uneven_files=drop), and whole batches per rank.
    """
    (node, nodes), (local_rank, local_size) = node, local
    entries = manifest.splits[split].files
    where = manifest.root / MANIFEST_NAME
    per_node = [node_share_files(manifest, split, n, nodes) for n in range(nodes)]
    counts = [len(files) for files in per_node]
    records = sorted({e.records for e in entries})
    if len(records) != 1 or (len(set(counts)) != 1 and not drop):
        raise BenchError(f"{where}: the {split} split's {len(entries)} files (records per file {records}) do not "
                         f"divide evenly between {nodes} nodes in data.stage_mode=node_share (files per node "
                         f"{counts}); it needs files of equal size and a file count that is a multiple of the "
                         f"node count (or data.uneven_files=drop)")
    if drop:
        per_node = [files[:min(counts)] for files in per_node]
    elif counts[0] % local_size:
        raise BenchError(f"{where}: each node's share of the {split} split has {counts[0]} files, not a multiple "
                         f"of the {local_size} ranks per node that divide it in data.stage_mode=node_share; "
                         f"data.uneven_files=drop leaves {counts[0] % local_size} of them out each epoch")
    if min(counts) < local_size:
        raise BenchError(f"{where}: each node's share of the {split} split has {min(counts)} files for its "
                         f"{local_size} ranks; each rank needs at least one file")
    samples = min(counts) // local_size * records[0]
    if samples % local_batch:
        raise BenchError(f"{where}: each rank reads {samples} {split} samples per epoch in "
                         f"data.stage_mode=node_share, not a multiple of the local batch size {local_batch}")
    return NodeShare(split=split, files=per_node[node], local_rank=local_rank, local_size=local_size,
                     samples_per_rank=samples, global_samples=sum(e.records for e in entries))


def epoch_file_indices(count: int, local_rank: int, local_size: int, seed: int, epoch: int,
                       shuffle: bool) -> list[int]:
    """The positions (in the node's share) of the files `local_rank` reads in `epoch` (numpy; for tests
    and the read plan; the tf.data pipeline computes the same with `local_files_dataset`)."""
    order = permutation(count, seed, epoch) if shuffle else list(range(count))
    per_rank = count // local_size
    return order[local_rank * per_rank:(local_rank + 1) * per_rank]


def permutation(count: int, seed: int, epoch: int) -> list[int]:
    """The node's file order in `epoch`, identical on every rank (and in numpy and TensorFlow)."""
    import numpy as np
    keys = np.random.default_rng([seed, epoch]).random(count)
    return [int(i) for i in np.argsort(keys, kind="stable")]


def local_files_dataset(items: Sequence, local_rank: int, local_size: int, seed: int, shuffle: bool,
                        per_epoch=None):
    """A tf.data.Dataset of this rank's items, epoch after epoch, endlessly.

    `items`: a list of file paths, or a tuple of equal-length lists (one element per file).

    Epoch e yields the items at `epoch_file_indices(len(items), local_rank, local_size, seed, e, shuffle)`;
    with `per_epoch(items_dataset, e)` (e an int64 tensor), what it makes of them instead, so that what it
    does (a shuffle buffer, batching) stays within the epoch.
    """
    import tensorflow as tf
    count = len(items[0]) if isinstance(items, tuple) else len(items)
    orders = tf.data.Dataset.counter().map(
        lambda epoch: (epoch, tf.numpy_function(
            lambda e: np_indices(count, local_rank, local_size, seed, int(e), shuffle), [epoch], tf.int64,
            stateful=False)))
    elements = tuple(tf.constant(x) for x in items) if isinstance(items, tuple) else tf.constant(items)

    def pick(epoch, indices):
        chosen = tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(lambda t: tf.gather(t, indices), elements))
        return per_epoch(chosen, epoch) if per_epoch else chosen

    return orders.flat_map(pick)


def np_indices(count: int, local_rank: int, local_size: int, seed: int, epoch: int, shuffle: bool):
    import numpy as np
    return np.asarray(epoch_file_indices(count, local_rank, local_size, seed, epoch, shuffle), dtype=np.int64)


def node_share_loader(manifest: Manifest, loader: str, requested: str, shards: dict, dist) -> str:
    """The loader node shares (`shards`: common/io/input.py's Shard of each split) read with, said on rank 0 with
    what they leave out of an epoch. Where a node's ranks do not divide its files (data.uneven_files=drop):
    tf.data, which leaves a different few files out each epoch. DALI's reader divides a node's records, not its
    files, so its shards would differ in size: refused when asked for, and data.loader=auto takes tf.data."""
    if dist.is_root:
        _report_node_share(manifest, shards)
    uneven = [s.split for s in shards.values() if s.local is not None and len(s.files) % s.local[1]]
    if loader != "dali" or not uneven:
        return loader
    why = (f"each node's share of the {uneven[0]} split has {len(shards[uneven[0]].files)} files for its "
           f"{dist.local_size} ranks (data.uneven_files=drop leaves some out each epoch), which only the tf.data "
           f"reader can do: DALI divides a node's records, not its files")
    if requested == "dali":
        raise BenchError(f"data.loader=dali: {why}; use data.loader=tfdata or auto, or a rank count per node "
                         f"that divides the files")
    if dist.is_root:
        print(f"note: data.loader=auto reads with tf.data: {why}", flush=True)
    return "tfdata"


def _report_node_share(manifest: Manifest, shards: dict) -> None:
    """Say what node shares leave out of an epoch: whole batches per rank, data.uneven_files=drop."""
    train, val = shards[TRAIN], shards[VALIDATION]
    if train.global_samples < manifest.splits[TRAIN].samples:
        print(f"note: data.uneven_files=drop: each training epoch reads {train.global_samples} of the "
              f"{manifest.splits[TRAIN].samples} samples in node shares (the files each node's permutation leaves "
              f"over change every epoch)", flush=True)
    if val.global_samples < manifest.splits[VALIDATION].samples:
        print(f"note: data.stage_mode=node_share evaluates {val.global_samples} of the "
              f"{manifest.splits[VALIDATION].samples} validation samples (whole batches per rank); the log's "
              f"eval_samples says {val.global_samples}", flush=True)
