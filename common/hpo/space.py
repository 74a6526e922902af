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
from typing import Any

import yaml

from common.base.errors import BenchError
from common.base.version import REPO
from common.campaign.spec import BENCHMARKS

OBJECTIVES = ("epochs", "time")
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "none")
FIXED_BY_SEARCH = ("run.seed", "run.output_dir")


@dataclasses.dataclass(frozen=True)
class Param:
    name: str  # a dotted config key
    kind: str  # float, int, categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple = ()

    def probe_values(self) -> list:
        """The values whose configs must be valid: both ends, or the choices."""
        return list(self.choices) if self.kind == "categorical" else [self.low, self.high]


@dataclasses.dataclass(frozen=True)
class Space:
    benchmark: str
    config: str  # as given: relative to the checkout, or absolute
    params: tuple[Param, ...]
    overrides: tuple[str, ...] = ()
    objective: str = "epochs"
    failure_penalty: float = 2.0
    seed: int = 1000
    sampler: str = "tpe"
    sampler_seed: int = 1
    sampler_startup: int = 4  # TPE: random trials before it models the results
    pruner: str = "median"
    startup_trials: int = 2
    warmup_epochs: float = 1.0  # the pruner compares no trial before this epoch
    enqueue: tuple[dict, ...] = ()

    @property
    def config_path(self) -> Path:
        path = Path(self.config)
        return path if path.is_absolute() else REPO / path

    def as_json(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self)))


def override(name: str, value: Any) -> str:
    """The `key=value` override of one setting (lists in YAML's flow style)."""
    return f"{name}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


def load_space(path: str | Path, ranks: int = 1, overrides: tuple[str, ...] = ()) -> Space:
    """Read and check a search space file (its configs planned for `ranks` ranks, with the worker's
    `overrides` after the space's own); every error names the file and the key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise BenchError(f"search space {path}: no such file") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise BenchError(f"search space {path}: not readable YAML ({err})") from None
    if not isinstance(raw, dict):
        raise BenchError(f"search space {path}: expected a mapping, found {type(raw).__name__}")
    try:
        space = _build(raw)
        check_overrides(space, overrides)
        check_configs(space, ranks, overrides)
    except BenchError as err:
        raise BenchError(f"search space {path}: {err}") from None
    return space


def _build(raw: dict) -> Space:
    known = {f.name for f in dataclasses.fields(Space)} - {"sampler_seed", "sampler_startup", "startup_trials",
                                                           "warmup_epochs"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise BenchError(f"unknown keys {unknown}; expected some of {sorted(known)}")
    for key in ("benchmark", "config", "params"):
        if key not in raw:
            raise BenchError(f"no {key!r}")
    sampler, pruner = _mapping(raw, "sampler", {"name": "tpe"}), _mapping(raw, "pruner", {"name": "median"})
    space = Space(benchmark=raw["benchmark"], config=str(raw["config"]), params=_params(raw["params"]),
                  overrides=tuple(str(o) for o in raw.get("overrides") or ()),
                  objective=raw.get("objective", "epochs"), failure_penalty=float(raw.get("failure_penalty", 2.0)),
                  seed=int(raw.get("seed", 1000)), sampler=sampler.get("name", "tpe"),
                  sampler_seed=int(sampler.get("seed", 1)), sampler_startup=int(sampler.get("startup_trials", 4)),
                  pruner=pruner.get("name", "median"),
                  startup_trials=int(pruner.get("startup_trials", 2)), warmup_epochs=float(pruner.get("warmup_epochs", 1)),
                  enqueue=tuple(_enqueued(raw.get("enqueue") or [])))
    _check_choices(space)
    return space


def _mapping(raw: dict, key: str, default: dict) -> dict:
    value = raw.get(key, default)
    if not isinstance(value, dict):
        raise BenchError(f"{key}: expected a mapping such as {default}, found {value!r}")
    return value


def _check_choices(space: Space) -> None:
    for key, value, allowed in (("benchmark", space.benchmark, BENCHMARKS), ("objective", space.objective, OBJECTIVES),
                                ("sampler.name", space.sampler, SAMPLERS), ("pruner.name", space.pruner, PRUNERS)):
        if value not in allowed:
            raise BenchError(f"{key} {value!r}: expected one of {list(allowed)}")
    if space.failure_penalty < 1:
        raise BenchError(f"failure_penalty {space.failure_penalty}: expected >= 1 (a miss must not beat a hit)")
    for item in space.overrides:
        _check_override(item, FIXED_BY_SEARCH)
    names = {p.name for p in space.params}
    for i, trial in enumerate(space.enqueue):
        if set(trial) != names:
            raise BenchError(f"enqueue[{i}]: keys {sorted(trial)}, expected every parameter: {sorted(names)}")
        for p in space.params:
            _check_in_range(p, trial[p.name], f"enqueue[{i}].{p.name}")


def check_overrides(space: Space, overrides: tuple[str, ...]) -> None:
    """The worker's overrides (a job's data, Horovod and platform settings) may set neither a searched
    parameter nor what the search sets for every trial: the trial's own value would silently win."""
    owned = (*FIXED_BY_SEARCH, *(p.name for p in space.params))
    for item in overrides:
        _check_override(item, owned)


def _check_override(item: str, owned: tuple[str, ...]) -> None:
    if "=" not in item or item.split("=", 1)[0] in owned:
        raise BenchError(f"override {item!r}: expected key=value of a key the search does not set "
                         f"({', '.join(owned)})")


def _check_in_range(p: Param, value: Any, where: str) -> None:
    """An enqueued value must be one the parameter's distribution can draw."""
    if p.kind == "categorical":
        if value not in p.choices:
            raise BenchError(f"{where} {value!r}: not one of the choices {list(p.choices)}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not p.low <= value <= p.high or \
            (p.kind == "int" and value != int(value)):
        raise BenchError(f"{where} {value!r}: expected {'an integer' if p.kind == 'int' else 'a number'} in "
                         f"[{p.low}, {p.high}]")


def _params(raw: Any) -> tuple[Param, ...]:
    if not isinstance(raw, dict) or not raw:
        raise BenchError(f"params: expected a non-empty mapping of config keys to ranges, found {raw!r}")
    return tuple(_param(str(name), spec) for name, spec in raw.items())


def _param(name: str, spec: Any) -> Param:
    if name in FIXED_BY_SEARCH or "." not in name:
        raise BenchError(f"params.{name}: expected a dotted config key such as optimizer.base_lr (not "
                         f"{' or '.join(FIXED_BY_SEARCH)})")
    if not isinstance(spec, dict) or spec.get("type") not in ("float", "int", "categorical"):
        raise BenchError(f"params.{name}: expected {{type: float|int|categorical, ...}}, found {spec!r}")
    if spec["type"] == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise BenchError(f"params.{name}: a categorical needs a non-empty list of choices, found {choices!r}")
        return Param(name, "categorical", choices=tuple(choices))
    try:
        low, high = float(spec["low"]), float(spec["high"])
    except (KeyError, TypeError, ValueError):
        raise BenchError(f"params.{name}: a {spec['type']} needs numbers low and high, found {spec!r}") from None
    log = bool(spec.get("log", False))
    if not low < high or (log and low <= 0):
        raise BenchError(f"params.{name}: low {low} and high {high}: expected low < high (and low > 0 with log)")
    if spec["type"] == "int":
        if low != int(low) or high != int(high):
            raise BenchError(f"params.{name}: an int range needs whole numbers, found {low} .. {high}")
        low, high = int(low), int(high)
    return Param(name, spec["type"], low, high, log)


def _enqueued(raw: Any) -> list[dict]:
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise BenchError(f"enqueue: expected a list of mappings (parameter: value), found {raw!r}")
    return [{str(k): v for k, v in t.items()} for t in raw]


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
