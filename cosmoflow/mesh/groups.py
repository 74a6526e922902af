"""Rank groups of the hybrid (data x spatial) path: which ranks share a sample, and the checks before any work.

With parallel.spatial = [pd, ph], P = pd * ph consecutive ranks form one group (group g holds ranks
g*P .. g*P + P-1): the group's mesh splits each sample's cube into P blocks, one per rank. The groups are
the data-parallel replicas: group g reads shard g of len(groups) of the data, every rank of it in the same
order, each decoding only its block of every sample (`sample_block`); the group's first rank (the leader)
drives the group's Mesh-TF graph.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from common.base.errors import BenchError
from common.io.formats.cosmoflow_blocks import BLOCKS_KIND, block_dir, block_rows
from common.io.formats.cosmoflow import FORMAT
from common.io.manifest import MANIFEST_NAME, Manifest, load_manifest
from common.io.manifest_write import sha256_file


@dataclasses.dataclass(frozen=True)
class GroupLayout:
    """Where one rank sits among `size` ranks grouped by `spatial` = (pd, ph) partitions."""

    rank: int
    size: int
    spatial: tuple[int, int]

    @property
    def group_size(self) -> int:
        """Ranks per group, P = pd * ph."""
        return self.spatial[0] * self.spatial[1]

    @property
    def groups(self) -> int:
        """Data-parallel replicas: size / P."""
        return self.size // self.group_size

    @property
    def group(self) -> int:
        return self.rank // self.group_size

    @property
    def task(self) -> int:
        """This rank's index inside its group (its TensorFlow task and mesh block)."""
        return self.rank % self.group_size

    @property
    def leader(self) -> int:
        """The group's first rank: drives its mesh."""
        return self.group * self.group_size

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader

    @property
    def ranks(self) -> range:
        """The ranks of this rank's group, in task order."""
        return range(self.leader, self.leader + self.group_size)

    @property
    def name(self) -> str:
        """The partitioning as logged: "DxH", e.g. "2x1"."""
        return f"{self.spatial[0]}x{self.spatial[1]}"


def group_layout(rank: int, size: int, spatial: Sequence[int]) -> GroupLayout:
    """The layout of `rank`; raises BenchError naming the numbers when `size` ranks cannot form whole groups."""
    pd, ph = (int(p) for p in spatial)
    whole_groups((pd, ph), size, "ranks", f"parallel.spatial [{pd}, {ph}]")
    if not 0 <= rank < size:
        raise BenchError(f"rank {rank}: expected 0 <= rank < {size}")
    return GroupLayout(rank, size, (pd, ph))


def whole_groups(spatial: tuple[int, int], count: int, units: str, where: str) -> int:
    """How many groups of pd * ph partitions `count` devices or ranks form; BenchError unless a whole number >= 1.

    Args:
        units: what is counted, for the message ("devices", "ranks").
        where: what the message is about, e.g. "parallel.spatial [2, 1]".
    """
    parts = spatial[0] * spatial[1]
    if parts > count:
        raise BenchError(f"{where}: {parts} partitions need at least {parts} {units}, got {count}")
    if count % parts:
        raise BenchError(f"{where}: {count} {units} are not divisible by {parts} partitions (each group of "
                         f"{parts} holds one sample's blocks)")
    return count // parts


def data_view(dist: Any, layout: GroupLayout) -> Any:
    """`dist` as the data pipeline sees it: one reader per group, so rank = group and size = groups."""
    return dataclasses.replace(dist, rank=layout.group, size=layout.groups)


def sample_block(input_shape: Sequence[int], spatial: Sequence[int], task: int) -> SampleBlock:
    """The block task `task` of a group holds of every sample: block (task // ph, task % ph) of the cube's
    pd x ph blocks in depth and height, the order in which Mesh-TF numbers the devices of the group's mesh
    ("b:1;pd;ph") and lays the blocks on them."""
    pd, ph = (int(p) for p in spatial)
    if not 0 <= task < pd * ph:
        raise BenchError(f"task {task}: expected 0 <= task < {pd * ph} (pd x ph = {pd} x {ph})")
    return SampleBlock(*block_rows(input_shape, (pd, ph), *divmod(task, ph)))


# ---------------------------------------------------------------------------- a rank's block of every sample
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


def block_records(mode: str, manifest: Manifest, block: SampleBlock) -> Manifest | None:
    """The manifest of `block`'s own records (python -m data_prep cosmo-blocks), checked against the whole
    dataset's `manifest`; None when `mode` (data.blocks) is "whole", or "auto" and they were not written."""
    if mode == "whole":
        return None
    shape = manifest.sample_shape
    d, h = block.shape(shape)[:2]
    spatial, (i, j) = (shape[0] // d, shape[1] // h), (block.depth[0] // d, block.height[0] // h)
    root = block_dir(manifest.root, spatial, i, j)
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
    facts = [("source.kind", src.get("kind"), BLOCKS_KIND),
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
