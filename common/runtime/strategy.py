"""How the ranks of a run share the work: one strategy object per run, chosen from the config.

A strategy says how ranks form data-parallel replicas (the global batch is the local batch times
`replicas`), which rank layout the input is sharded by and whether this rank reads at all, how a step
and an evaluation run (`make_steps`), what it adds to the MLPerf log and to summary.json, and how the
training is driven (`fit`). Three exist:
- `DataParallel` (here): every rank is a replica that reads its own shard and trains the Keras model;
- `HybridStrategy` (cosmoflow/mesh/hybrid.py): groups of ranks split every sample through Mesh-TF;
- `ElasticStrategy` (common/runtime/elastic.py): data parallel under hvd.elastic.run, ranks may die or join.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from common.io.datasets import Datasets
from common.runtime.dist import DistEnv
from common.runtime.loop import FitResult, StepsFactory, Trainee, data_parallel_steps, fit



@dataclasses.dataclass(frozen=True)
class Rebuild:
    """How a run whose rank layout changes (elastic) builds for a new layout: the trainee, and the input with
    a given seed (each from the strategy of that layout)."""

    trainee: Callable[["DataParallel"], Trainee]
    input: Callable[["DataParallel", int], Datasets]

RESEED = 7919  # a prime: the input seed of the n-th restart is seed + RESEED * n


def reseeded(seed: int, n: int) -> int:
    """The input seed of the n-th restart (0: unchanged): a new data order after a resume or an elastic reset."""
    return seed + RESEED * n


class DataParallel:
    """Every rank is one replica: it reads its own shard, and its gradients are averaged over all ranks."""

    name = "data_parallel"

    def __init__(self, dist: DistEnv):
        self.dist = dist

    @property
    def replicas(self) -> int:
        """The data-parallel replicas: the global batch is the local batch times this."""
        return self.dist.size

    @property
    def input_dist(self) -> DistEnv:
        """The rank layout the input is sharded by."""
        return self.dist

    @property
    def reads(self) -> bool:
        """Whether this rank reads input (a rank that only lends its devices to a group does not)."""
        return True

    @property
    def saves_input_position(self) -> bool:
        """Whether every rank reads its own stream, so that checkpoints can save each rank's input position."""
        return True

    def model_seed(self, seed: int) -> int:
        """The seed this rank builds its model with (rank 0's initial weights are broadcast anyway)."""
        return seed + self.dist.rank

    def prepare(self, cfg: Any) -> None:
        """In init, once the model is built: start what the steps need (nothing here)."""

    @property
    def make_steps(self) -> StepsFactory:
        return data_parallel_steps

    def mlperf_keys(self) -> dict:
        """Events this strategy adds to init (beside the hyperparameters)."""
        return {}

    def fit(self, trainee: Trainee, data: Datasets, run: Any, rebuild: Rebuild) -> FitResult:
        """Train to the end of the run (`run`: common/runtime/run.Run, which gives the loop its context);
        `rebuild` serves strategies whose rank layout changes (elastic)."""
        return fit(trainee, data, run.loop_context(self, data), self.make_steps)

    def summary(self, trainee: Trainee) -> dict:
        """After training, on every rank (collectives allowed): the fields rank 0 adds to summary.json."""
        return {}
