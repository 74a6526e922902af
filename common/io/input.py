"""This rank's input, in one call: `open_input` reads a dataset's manifest and checks it, cuts this rank's shards
of both splits, picks the loader that reads them and checks their files; the application builds its two datasets
from the `RankInput` it returns, and hands the training loop their `Datasets`. The application gives what is its
format's own: the checks of its manifest, how a split is divided between ranks (`shard`), its decoding and its
tf.data and DALI pipelines.

Loader: data.loader tfdata, dali, or auto. `auto` picks DALI when its TensorFlow plugin imports and the records
can be read by DALI's TFRecord reader (uncompressed, with index files); otherwise tf.data. Both loaders give the
same tensors (tested), so the choice changes speed, not results; docs/performance.md has the figures.

Node shares (data.stage_mode=node_share) are cut by common/io/node_share.py.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Collection, Sequence

from common.base.errors import BenchError
from common.io.formats import SPLITS, TRAIN, VALIDATION
from common.io.manifest import (MANIFEST_NAME, Manifest, check_shard_files, check_split_counts, load_manifest,
                                record_bytes)
from common.io.node_share import node_share, node_share_loader

LOADERS = ("auto", "tfdata", "dali")


# ---------------------------------------------------------------------------- the training stream's start
# (What its order depends on, saved in a checkpoint: common/io/position.py.)
@dataclasses.dataclass(frozen=True)
class InputPlan:
    """Where a run's training input starts: the seed its datasets are built with, the global step its stream
    begins at, and how a resumed run reaches the checkpoint's position."""

    seed: int
    start_step: int = 0
    restore: str = ""  # "iterator": tf.data's saved state; "replay": skip `skip` batches; "": starts afresh
    skip: int = 0  # batches of the rebuilt stream already consumed (restore "replay")
    why_afresh: str = ""  # a resumed run's reason for starting afresh


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


@dataclasses.dataclass(frozen=True)
class Shard:
    """What one rank reads of one split in an epoch: record files, each with its DALI index and the run of its
    records the rank reads."""

    split: str
    files: tuple[str, ...]  # paths, each file once, in the order they are read unshuffled
    index_files: tuple[str | None, ...]
    runs: tuple[tuple[int, int], ...]  # per file: (first record, records read)
    samples: int  # on this rank per epoch
    global_samples: int  # what the ranks read together per epoch (DeepCAM's training: the split's samples)
    # node_share: `files` are the node's share, divided between its ranks afresh every epoch from the run seed;
    # (local rank, ranks per node). None: the files are this rank's.
    local: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class RankInput:
    """This rank's input, checked: the manifest of the records it reads, the loader and its shards."""

    manifest: Manifest
    loader: str  # tfdata or dali
    train: Shard
    val: Shard
    local_batch: int
    record_bytes: float  # mean on-disk bytes per record (for the I/O report)

    def datasets(self, train, val) -> Datasets:
        """The training loop's `Datasets` of the two datasets built from `self.train` and `self.val`."""
        return Datasets.from_shards(train, val, self.train, self.val, self.local_batch, self.record_bytes,
                                    self.loader)


def open_input(cfg, fmt: str, dist, local_batch: int, check: Callable[[Manifest], Manifest],
               shard: Callable[[Manifest], tuple[Shard, Shard]], whole_dataset: bool = False) -> RankInput:
    """This rank's input from data section `cfg` (data.dir, data.train_samples and data.val_samples, staging,
    data.loader, data.verify_checksums), checked: the format id, the format's `check`, the sample counts, the
    shards (each split's division), the loader (before the shards with `whole_dataset`), the files the shards read
    (their sizes, indexes and, when `checksums_wanted`, their xxh3-128).

    Args:
        fmt: the format id the manifest must have.
        check: the format's own checks of the manifest (sample shape, layout), made before the sample counts;
            returns the manifest of the records this rank reads (the dataset's, or e.g. a spatial block's own).
        shard: this rank's (train, validation) shards of that manifest: the application's division between
            ranks. Not called with data.stage_mode=node_share, whose node shares are cut here.
        whole_dataset: judge the loader and the mean record size on every file of the dataset, before the
            shards are cut (DeepCAM), rather than on the files this rank reads.
    """
    dataset = load_manifest(cfg.dir, expected_format=fmt)
    manifest = check(dataset)
    check_split_counts(dataset, {TRAIN: cfg.train_samples, VALIDATION: cfg.val_samples},
                       str(dataset.root / MANIFEST_NAME))
    loader = resolve_loader(cfg.loader, manifest, SPLITS) if whole_dataset else None
    shards = rank_shards(manifest, cfg, dist, local_batch, shard)
    paths = None if whole_dataset else shard_paths(manifest, shards)
    if loader is None:
        loader = resolve_loader(cfg.loader, manifest, SPLITS, files=paths)
    if shards[VALIDATION].local is not None:
        loader = node_share_loader(manifest, loader, cfg.loader, shards, dist)
    check_shard_files(manifest, shards, verify_checksums=checksums_wanted(cfg.verify_checksums, loader))
    return RankInput(manifest=manifest, loader=loader, train=shards[TRAIN], val=shards[VALIDATION],
                     local_batch=local_batch, record_bytes=record_bytes(manifest, only=paths))


def rank_shards(manifest: Manifest, cfg, dist, local_batch: int,
                shard: Callable[[Manifest], tuple[Shard, Shard]]) -> dict[str, Shard]:
    """This rank's shards of both splits: the application's (`shard`), or with data.stage_mode=node_share its
    node's share of each, divided between the node's ranks every epoch."""
    if not (cfg.stage_dir and cfg.stage_mode == "node_share"):
        train, val = shard(manifest)
        return {TRAIN: train, VALIDATION: val}
    drop = getattr(cfg, "uneven_files", "refuse") == "drop"  # CosmoFlow's data section has it
    return {split: node_share_shard(manifest, split, dist, local_batch, drop) for split in SPLITS}


def node_share_shard(manifest: Manifest, split: str, dist, local_batch: int, drop: bool = False) -> Shard:
    """This rank's node's share of `split` (`node_share`), whole files."""
    share = node_share(manifest, split, (dist.node, dist.num_nodes), (dist.local_rank, dist.local_size), local_batch,
                       drop=drop)
    # Every rank evaluates samples_per_rank of the node's share: that is what eval_samples says.
    # With drop, training reads that many too.
    together = share.samples_per_rank * dist.size if split == VALIDATION or drop else share.global_samples
    root = manifest.root
    return Shard(split=split, files=tuple(str(root / e.path) for e in share.files),
                 index_files=tuple(str(root / e.index) if e.index else None for e in share.files),
                 runs=tuple((0, e.records) for e in share.files), samples=share.samples_per_rank,
                 global_samples=together, local=(dist.local_rank, dist.local_size))


def shard_paths(manifest: Manifest, shards: dict[str, Shard]) -> set[str]:
    """The dataset paths of the record files the shards read (a staged copy of a rank or node holds only these,
    and a copy staged with data.stage_decompress describes only these as staged)."""
    root = str(manifest.root)
    return {os.path.relpath(f, root) for shard in shards.values() for f in shard.files}


# ---------------------------------------------------------------------------- the loader
def dali_problem(manifest: Manifest, splits: Sequence[str], files: Collection[str] | None = None) -> str | None:
    """Why DALI cannot read these splits of the dataset (only the paths in `files`, when given: what one rank
    reads), or None when it can."""
    where = manifest.root / MANIFEST_NAME
    if manifest.compression != "none":
        return (f"{where}: records are {manifest.compression}-compressed, but DALI's TFRecord reader needs "
                f"uncompressed records with index files; set data.loader=tfdata, stage them uncompressed "
                f"(data.stage_dir with data.stage_decompress=true), or convert with --compression none")
    missing = [e.path for s in splits for e in manifest.splits[s].files
               if e.index is None and (files is None or e.path in files)]
    if missing:
        return (f"{where}: {len(missing)} record file(s) have no DALI index (first: {missing[0]}); reconvert the "
                f"dataset or set data.loader=tfdata")
    return None


def checksums_wanted(setting: bool | None, loader: str) -> bool:
    """Whether a rank checks the checksums of the files it reads: data.verify_checksums, or when unset, for
    DALI (its reader checks no record CRC, and one changed byte in a record can kill the process)."""
    return loader == "dali" if setting is None else setting


def resolve_loader(requested: str, manifest: Manifest, splits: Sequence[str],
                   files: Collection[str] | None = None) -> str:
    """"tfdata" or "dali" for data.loader = `requested`; raises BenchError when DALI was asked for but cannot read
    (the `files` of the splits, when given)."""
    if requested not in LOADERS:
        raise BenchError(f"data.loader {requested!r}: expected one of {list(LOADERS)}")
    problem = dali_problem(manifest, splits, files) if requested != "tfdata" else None
    if requested == "dali" and problem:
        raise BenchError(problem)
    if requested == "auto":
        return "dali" if problem is None and dali_plugin_available() else "tfdata"
    return requested


def dali_plugin_available() -> bool:
    try:
        import nvidia.dali.plugin.tf  # noqa: F401
    except ImportError:
        return False
    return True


def dali_reader_sharding(local: tuple[int, int] | None, seed: int, shuffle: bool) -> dict:
    """DALI reader arguments: this rank's files (`local` None), or (node_share, `local` = (local rank, ranks
    per node)) the node's files divided between its ranks, redrawn after every epoch; `seed` the run seed.

    Shuffling takes both of DALI's kinds: `random_shuffle` alone draws from a buffer filled in a fixed file order,
    which left CosmoFlow's mini demo (8 sub-cubes of one universe per file) short of its target; with
    `shuffle_after_epoch` too the file order changes every epoch, as on the tf.data path. DALI draws that order from
    its own fixed seed and epoch count, not from `seed` (which seeds the `random_shuffle` buffer), so a node's ranks
    get the same order and disjoint shards (docs/staging.md, node_share). Every epoch still reads each sample once
    (tests/unit/test_sharding.py, tests/unit/test_dali_ranks.py).
    """
    if local is None:
        return {"random_shuffle": shuffle, "shuffle_after_epoch": shuffle}
    local_rank, local_size = local
    return {"shard_id": local_rank, "num_shards": local_size, "shuffle_after_epoch": shuffle,
            "random_shuffle": shuffle, "seed": seed, "stick_to_shard": False}
