"""Where a rank's training stream stands, as a checkpoint saves it (meta.json's "input", common/runtime/checkpoint.py):
what the stream's order depends on (`InputPosition`: loader, seed, the global step it began at, the rank `Layout`).
Rebuilt with the same ones, a DALI stream gives the same batches, so a resumed run replays it. Where a run's stream
starts is common/io/input.py's `InputPlan`; a run builds a position only when it writes or reads a checkpoint.
"""
from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from common.base.documents import AtLeast, check


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a DALI stream's order depends on beside its loader and seed (LAYOUT_KEYS)."""

    run_seed: int
    ranks: Annotated[int, AtLeast(1)]
    # the ranks of a node that share its files under data.stage_mode=node_share (0 otherwise, where a rank's files
    # follow from ranks alone)
    ranks_per_node: Annotated[int, AtLeast(0)]
    node_share: bool
    local_batch_size: Annotated[int, AtLeast(1)]
    shuffle: bool
    shuffle_buffer: Annotated[int, AtLeast(1)]
    strategy: str


@dataclasses.dataclass(frozen=True)
class InputPosition:
    """What a rank's training stream depends on, saved in meta.json as "input": rebuilt with the same loader, seed and
    layout it gives the same batches, and the run has taken `global_step - start_step` of them."""

    loader: Literal["tfdata", "dali", ""]  # the input pipeline ("" for a rank layout whose position cannot be replayed)
    seed: int  # the input seed the datasets were built with (the run's, or a reseeded one)
    start_step: int  # the global step at which this stream began (0, or where a reseeded attempt began)
    layout: Layout  # LAYOUT_KEYS: the rank layout and the settings the stream's order depends on

    def __post_init__(self):
        check(self.start_step >= 0, "start_step", self.start_step, "an integer >= 0")

    def to_meta(self) -> dict:
        return dataclasses.asdict(self)

    def layout_change(self, layout: Layout) -> str:
        """How `layout` differs from the saved one ("" when it does not), for the log."""
        changed = [f"{key} {getattr(self.layout, key)!r} -> {getattr(layout, key)!r}" for key in LAYOUT_KEYS
                   if getattr(self.layout, key) != getattr(layout, key)]
        return ", ".join(changed)


RESEED = 7919  # a prime: the input seed of the n-th restart is seed + RESEED * n


def reseeded(seed: int, n: int) -> int:
    """The input seed of the n-th restart (0: unchanged): a new data order after a resume or an elastic reset."""
    return seed + RESEED * n


LAYOUT_KEYS = tuple(f.name for f in dataclasses.fields(Layout))


def input_layout(cfg: Any, dist: Any, strategy: Any) -> Layout:
    """What the order of a rank's training stream depends on beside its loader and seed (LAYOUT_KEYS), from a run's
    config, DistEnv and strategy."""
    data = cfg.data
    node_share = bool(data.stage_dir) and data.stage_mode == "node_share"
    return Layout(run_seed=cfg.run.seed, ranks=dist.size, ranks_per_node=dist.local_size if node_share else 0,
                  node_share=node_share, local_batch_size=cfg.train.local_batch_size, shuffle=data.shuffle,
                  shuffle_buffer=data.shuffle_buffer, strategy=strategy.name)
