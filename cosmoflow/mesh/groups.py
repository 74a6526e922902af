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

from common.base.errors import BenchError
from common.io.formats.cosmoflow import block_rows
from cosmoflow.data import SampleBlock


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
