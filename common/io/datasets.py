"""What an application's input pipeline hands the training loop: the two endless batched datasets and the
step and sample counts of one epoch on this rank (plus what the I/O report needs)."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any


@dataclasses.dataclass(frozen=True)
class Datasets:
    """Infinite (repeated) batched datasets and how many steps make one epoch on each rank."""

    train: Any
    val: Any
    train_steps: int
    val_steps: int
    train_samples: int  # over all ranks, per epoch
    val_samples: int
    local_batch_size: int
    # For the I/O report: the dataset's mean on-disk bytes per record, and the record files one pass
    # over this rank's training and validation shards opens.
    record_bytes: float = 0.0
    train_files: int = 0
    val_files: int = 0
    loader: str = ""  # the input pipeline that reads them: tfdata or dali
    val_rank_samples: int = 0  # this rank's samples per evaluation (its last batch may be partial)
    decoded_fraction: float = 1.0  # the share of every sample this rank decodes (its block on a spatial group)
    block_records: bool = False  # its block's own records (data_prep cosmo-blocks): bytes read fall with the split

    @classmethod
    def from_shards(cls, train, val, train_shard, val_shard, local_batch: int, record_bytes: float = 0.0,
                    loader: str = "") -> "Datasets":
        """From the two datasets and the shards they read (`samples` on this rank, `global_samples` in all,
        `files` the record files of one pass)."""
        return cls(train=train, val=val, train_steps=train_shard.samples // local_batch,
                   val_steps=-(-val_shard.samples // local_batch),  # a partial last batch counts
                   train_samples=train_shard.global_samples,
                   val_samples=val_shard.global_samples, local_batch_size=local_batch, record_bytes=record_bytes,
                   train_files=len(train_shard.files), val_files=len(val_shard.files), loader=loader,
                   val_rank_samples=val_shard.samples)

    def without_input(self) -> "Datasets":
        """The same step counts for a rank that reads no data: endless (None, None) batches, no files."""
        nothing = itertools.repeat((None, None))
        return dataclasses.replace(self, train=nothing, val=nothing, record_bytes=0.0, train_files=0,
                                   val_files=0, loader="", decoded_fraction=0.0)
