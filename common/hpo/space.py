"""The search space file of a hyperparameter search (docs/hpo.md): what to train, what to vary, how to score.

    benchmark: cosmoflow
    config: cosmoflow/configs/cosmo_mini.yaml      # relative to the suite's checkout, or absolute
    overrides: [data.dir=demo/data/cosmo_mini/tfrecords, train.local_batch_size=4]   # every trial
    objective: epochs                              # epochs to the target (or: time, seconds to it)
    failure_penalty: 2.0                           # a trial missing the target scores penalty x max_epochs
    seed: 1000                                     # run.seed of every trial (one seed: trials compare settings)
    sampler: {name: tpe, seed: 1, startup_trials: 4}   # tpe (random for its first trials), random
    pruner: {name: median, startup_trials: 2, warmup_epochs: 1}   # median, none
    params:
      optimizer.base_lr: {type: float, low: 0.002, high: 0.02, log: true}
      schedule.warmup_epochs: {type: int, low: 0, high: 3}
      schedule.decay_epochs: {type: categorical, choices: [[5, 7], [4, 6]]}
    enqueue:                                       # trials to run first (e.g. the config's own settings)
      - {optimizer.base_lr: 0.008, schedule.warmup_epochs: 1, schedule.decay_epochs: [5, 7]}

Every parameter is a dotted config key; the file is refused (naming the key and the value) when a
trial's settings would not make a valid config.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import yaml

from common.base import documents
from common.base.documents import check
from common.base.errors import BenchError
from common.base.version import REPO

FIXED_BY_SEARCH = ("run.seed", "run.output_dir")


@dataclasses.dataclass(frozen=True)
class Param:
    name: str  # a dotted config key
    kind: Literal["float", "int", "categorical"]
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def probe_values(self) -> list:
        """The values whose configs must be valid: both ends, or the choices."""
        return list(self.choices) if self.kind == "categorical" else [self.low, self.high]


@dataclasses.dataclass(frozen=True)
class Space:
    """A search space as the search uses it (and hpo.json records it)."""

    benchmark: Literal["cosmoflow", "deepcam"]
    config: str  # as given: relative to the checkout, or absolute
    params: tuple[Param, ...]
    overrides: tuple[str, ...] = ()
    objective: Literal["epochs", "time"] = "epochs"
    failure_penalty: float = 2.0
    seed: int = 1000
    sampler: Literal["tpe", "random"] = "tpe"
    sampler_seed: int = 1
    sampler_startup: int = 4  # TPE: random trials before it models the results
    pruner: Literal["median", "none"] = "median"
    startup_trials: int = 2
    warmup_epochs: float = 1.0  # the pruner compares no trial before this epoch
    enqueue: tuple[dict[str, Any], ...] = ()

    @property
    def config_path(self) -> Path:
        path = Path(self.config)
        return path if path.is_absolute() else REPO / path

    def as_json(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self)))


# ---------------------------------------------------------------------------- the space file
@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One parameter of the space file: {type: float|int, low, high, log} or {type: categorical, choices}."""

    type: Literal["float", "int", "categorical"]
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    choices: tuple[Any, ...] | None = None

    def __post_init__(self):
        if self.type == "categorical":
            check(bool(self.choices), "choices", self.choices, "a non-empty list (a categorical's choices)")
            return
        check(self.low is not None and self.high is not None and self.low < self.high, "high", self.high,
              f"a number above low ({self.low})")
        check(not self.log or self.low > 0, "low", self.low, "> 0 with log")
        check(self.type == "float" or (self.low == int(self.low) and self.high == int(self.high)), "low",
              self.low, f"whole numbers low and high for an int range (high {self.high})")

    def param(self, name: str) -> Param:
        if self.type == "categorical":
            return Param(name, "categorical", choices=tuple(self.choices))
        cast = int if self.type == "int" else float
        return Param(name, self.type, cast(self.low), cast(self.high), self.log)


@dataclasses.dataclass(frozen=True)
class SamplerSpec:
    name: Literal["tpe", "random"] = "tpe"
    seed: int = 1
    startup_trials: int = 4

    def __post_init__(self):
        check(self.startup_trials >= 0, "startup_trials", self.startup_trials, ">= 0")
        check(0 <= self.seed < 2 ** 32, "seed", self.seed, "an integer in [0, 2^32) (optuna's sampler seed)")


@dataclasses.dataclass(frozen=True)
class PrunerSpec:
    name: Literal["median", "none"] = "median"
    startup_trials: int = 2
    warmup_epochs: float = 1.0

    def __post_init__(self):
        check(self.startup_trials >= 0, "startup_trials", self.startup_trials, ">= 0")
        check(self.warmup_epochs >= 0, "warmup_epochs", self.warmup_epochs, ">= 0")


@dataclasses.dataclass(frozen=True)
class SpaceFile:
    """The search space file (the module's docstring shows one)."""

    benchmark: Literal["cosmoflow", "deepcam"]
    config: str
    params: dict[str, ParamSpec]
    overrides: tuple[str, ...] = ()
    objective: Literal["epochs", "time"] = "epochs"
    failure_penalty: float = 2.0
    seed: int = 1000
    sampler: SamplerSpec = SamplerSpec()
    pruner: PrunerSpec = PrunerSpec()
    enqueue: tuple[dict[str, Any], ...] = ()

    def __post_init__(self):
        check(self.failure_penalty >= 1, "failure_penalty", self.failure_penalty, ">= 1 (a miss must not beat a hit)")
        check(0 <= self.seed < 2 ** 31, "seed", self.seed, "an integer in [0, 2^31) (every trial's run.seed)")
        check(bool(self.params), "params", self.params, "a non-empty mapping of config keys to ranges")
        for name in self.params:
            check(name not in FIXED_BY_SEARCH and "." in name, f"params.{name}", name,
                  f"a dotted config key such as optimizer.base_lr (not {' or '.join(FIXED_BY_SEARCH)})")
        for item in self.overrides:
            _check_override(item, FIXED_BY_SEARCH)
        for i, trial in enumerate(self.enqueue):
            check(set(trial) == set(self.params), f"enqueue[{i}]", sorted(trial),
                  f"every parameter: {sorted(self.params)}")
            for name, spec in self.params.items():
                _check_in_range(spec.param(name), trial[name], f"enqueue[{i}].{name}")

    def space(self) -> Space:
        return Space(benchmark=self.benchmark, config=self.config, overrides=self.overrides,
                     params=tuple(spec.param(name) for name, spec in self.params.items()), objective=self.objective,
                     failure_penalty=self.failure_penalty, seed=self.seed, sampler=self.sampler.name,
                     sampler_seed=self.sampler.seed, sampler_startup=self.sampler.startup_trials,
                     pruner=self.pruner.name, startup_trials=self.pruner.startup_trials,
                     warmup_epochs=self.pruner.warmup_epochs, enqueue=self.enqueue)


def override(name: str, value: Any) -> str:
    """The `key=value` override of one setting (lists in YAML's flow style)."""
    return f"{name}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


def load_space(path: str | Path, ranks: int = 1, overrides: tuple[str, ...] = ()) -> Space:
    """Read and check a search space file (its configs planned for `ranks` ranks, with the worker's
    `overrides` after the space's own); every error names the file and the key."""
    path = Path(path)
    try:
        space = documents.read(path, SpaceFile, kind="yaml", what="a search space").space()
    except BenchError as err:
        raise BenchError(f"search space {err}") from None
    try:
        check_overrides(space, overrides)
        check_configs(space, ranks, overrides)
    except BenchError as err:
        raise BenchError(f"search space {path}: {err}") from None
    return space


def check_overrides(space: Space, overrides: tuple[str, ...]) -> None:
    """The worker's overrides (a job's data, Horovod and platform settings) may set neither a searched
    parameter nor what the search sets for every trial: the trial's own value would silently win."""
    owned = (*FIXED_BY_SEARCH, *(p.name for p in space.params))
    for item in overrides:
        _check_override(item, owned)


def _check_override(item: str, owned: tuple[str, ...]) -> None:
    if "=" not in item or item.split("=", 1)[0] in owned:  # the space's own overrides, or the worker's
        raise BenchError(f"override {item!r}: expected key=value of a key the search does not set "
                         f"({', '.join(owned)})")


def _check_in_range(p: Param, value: Any, where: str) -> None:
    """An enqueued value must be one the parameter's distribution can draw."""
    if p.kind == "categorical":
        check(value in p.choices, where, value, f"one of the choices {list(p.choices)}")
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    check(number and p.low <= value <= p.high and (p.kind != "int" or value == int(value)), where, value,
          f"{'an integer' if p.kind == 'int' else 'a number'} in [{p.low}, {p.high}]")


def plan(benchmark: str, config: Path, overrides: list[str], ranks: int) -> dict:
    """The application's own dry run of a config (`<bench>/train.py CONFIG ... --dry-run --json`: built,
    resolved and checked as a training would, nothing read or trained); its error when it refuses it."""
    proc = subprocess.run([sys.executable, str(REPO / benchmark / "train.py"), str(config), *overrides,
                           "--dry-run", "--json", "--ranks", str(ranks)], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise BenchError(" ".join(proc.stderr.replace("error:", "").split()) or f"exit {proc.returncode}")
    return json.loads(proc.stdout)


def check_configs(space: Space, ranks: int, overrides: tuple[str, ...] = ()) -> None:
    """Plan the config (with the space's overrides, then the worker's) with every parameter at the low ends,
    at the high ends, with each other choice, and each enqueued trial: a key the config does not have, or a
    value it refuses, is an error now rather than in trial 7 (the application's error names the key)."""
    if not space.config_path.is_file():
        raise BenchError(f"config {space.config}: no such file ({space.config_path})")
    ends = [{p.name: p.probe_values()[i if p.kind != "categorical" else 0] for p in space.params} for i in (0, -1)]
    choices = [{**ends[0], p.name: c} for p in space.params if p.kind == "categorical" for c in p.choices[1:]]
    settings = [*ends, *choices, *space.enqueue]  # every range's ends, every choice, every enqueued trial
    for setting in settings:
        items = [override(k, v) for k, v in setting.items()]
        try:
            plan(space.benchmark, space.config_path, [*space.overrides, *overrides, *items], ranks)
        except BenchError as err:
            raise BenchError(f"the trial setting {', '.join(items)} makes no valid config: {err}") from None
