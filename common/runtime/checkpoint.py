"""Checkpoints of a training run and resuming from them (docs/faults.md).

A checkpoint is a directory `CKPT_DIR/ckpt-<global step>/` holding
- `model.npz`: rank 0's model and optimizer variables (the same on every data-parallel rank),
- `rank_<r>.npz`: each rank's own non-trainable variables (batch-norm running statistics between
  evaluations, dropout seed-generator state), written by that rank,
- `input_rank_<r>.*`: each rank's tf.data iterator state (its position in the endless training stream,
  shuffle buffers included) when the loader is tf.data; DALI's iterator cannot be saved,
- `meta.json`, written last by rank 0: where the run stands (`Progress`: epoch, steps done in it, the
  history, the partial epoch's sums, time spent by earlier attempts), the variables' names and shapes,
  the size and xxh3-128 of every file, and what the training input's position depends on (`InputPosition`:
  loader, input seed, the global step its stream began at, the rank layout). A DALI stream is a function of
  these alone, so a resumed run with the same ones rebuilds it and skips the batches consumed (`plan_input`).
Every rank writes into `.tmp-ckpt-<step>/`; rank 0 adds meta.json (fsynced) and renames the directory,
so a checkpoint directory without the `.tmp-` prefix is complete. Rank 0 keeps the newest
`checkpoint.keep` and removes the rest and any stale temporary directory.

Resuming (`checkpoint.resume=true`) takes the newest checkpoint whose meta.json holds what resuming reads,
of the right types and ranges (`read_meta`), and whose files match it; a newer one that does not is skipped
with a warning naming the problem (the file, and in meta.json the key and the value).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from common.runtime.config import CheckpointConfig
from common.runtime.dist import DistEnv
from common.base.errors import BenchError
from common.io.manifest import xxh3_128_file

FORMAT = "hpc-sciml-checkpoint"
VERSION = 1
META = "meta.json"
MODEL_FILE = "model.npz"
_NAME = re.compile(r"^ckpt-(\d{9})$")


@dataclasses.dataclass
class Progress:
    """Where a run stands: `epoch` is the epoch to run next (or the one in progress when `step` > 0)."""

    epoch: int = 1
    step: int = 0  # optimizer steps of `epoch` already done
    history: list[dict] = dataclasses.field(default_factory=list)
    partial: dict = dataclasses.field(default_factory=dict)  # the epoch's running sums: loss_sum, seconds
    earlier_seconds: float = 0.0  # training time (run_start .. run_stop) of the attempts before this one
    attempt: int = 1  # 1 for a run that starts from scratch; +1 for each resume

    def global_step(self, steps_per_epoch: int) -> int:
        return (self.epoch - 1) * steps_per_epoch + self.step


@dataclasses.dataclass(frozen=True)
class InputPosition:
    """What a rank's training stream depends on, saved in meta.json as "input": rebuilt with the same loader,
    seed and layout it gives the same batches, and the run has taken `global_step - start_step` of them."""

    loader: str  # the input pipeline: "tfdata" or "dali" ("" for a rank layout whose position cannot be replayed)
    seed: int  # the input seed the datasets were built with (the run's, or a reseeded one)
    start_step: int  # the global step at which this stream began (0, or where a reseeded attempt began)
    layout: dict  # LAYOUT_KEYS: the rank layout and the settings the stream's order depends on

    def to_meta(self) -> dict:
        return dataclasses.asdict(self)

    def layout_change(self, layout: dict) -> str:
        """How `layout` differs from the saved one ("" when it does not), for the log."""
        changed = [f"{key} {self.layout.get(key)!r} -> {layout.get(key)!r}" for key in LAYOUT_KEYS
                   if self.layout.get(key) != layout.get(key)]
        return ", ".join(changed)


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
class Resume:
    """A checkpoint chosen for resuming, with its meta.json."""

    path: Path
    meta: dict

    @property
    def progress(self) -> Progress:
        return Progress(**self.meta["progress"])

    @property
    def input_state(self) -> bool:
        return bool(self.meta.get("input_state"))

    @property
    def ranks(self) -> int:
        return int(self.meta["ranks"])

    @property
    def input_position(self) -> InputPosition | None:
        """What the saved input position depends on; None for a checkpoint written before meta.json held it."""
        saved = self.meta.get("input")
        return InputPosition(**saved) if saved is not None else None


def plan_input(resume: Resume | None, seeds: tuple[int, int], loader: str, layout: dict) -> InputPlan:
    """How this run's training input starts, given the checkpoint it resumes (None: none), `seeds` (the run's, and
    the one new to this attempt), the loader it reads with and its layout (LAYOUT_KEYS). A tf.data iterator saved
    by as many ranks is restored; a DALI stream of the same seed and layout is rebuilt and its consumed batches
    skipped; otherwise the input starts afresh with the new seed, so that it does not replay the first epochs."""
    run_seed, fresh_seed = seeds
    if resume is None:
        return InputPlan(run_seed)
    saved, step = resume.input_position, resume.meta["global_step"]
    if resume.input_state and resume.ranks == layout["ranks"] and loader == "tfdata":
        return InputPlan(saved.seed if saved else run_seed, saved.start_step if saved else 0, restore="iterator")
    why = _why_not_replayed(resume, saved, loader, layout)
    if not why:
        return InputPlan(saved.seed, saved.start_step, restore="replay", skip=step - saved.start_step)
    return InputPlan(fresh_seed, start_step=step, why_afresh=why)


def _why_not_replayed(resume: Resume, saved: InputPosition | None, loader: str, layout: dict) -> str:
    """Why the checkpoint's input position cannot be reached by replaying a rebuilt DALI stream ("": it can)."""
    if resume.input_state:
        return (f"the checkpoint holds the tf.data iterators of {resume.ranks} ranks; this run has "
                f"{layout['ranks']} and reads with {loader}")
    if saved is None:
        return ("the checkpoint records no input position (DALI, or checkpoint.input_state=false, before "
                "meta.json held one)")
    if saved.loader == "tfdata":
        return "the tf.data iterator state was not saved (checkpoint.input_state=false)"
    if saved.loader == "":
        return f"the {saved.layout.get('strategy')} strategy keeps no input position"
    if loader != "dali":
        return f"the checkpoint's input was read with DALI, this run reads with {loader}"
    change = saved.layout_change(layout)
    return f"the input layout changed since the checkpoint ({change})" if change else ""


def checkpoint_dir(cfg: CheckpointConfig, output_dir: str | os.PathLike) -> Path:
    return Path(cfg.dir) if cfg.dir else Path(output_dir) / "checkpoints"


# ---------------------------------------------------------------------------- finding and checking
def list_checkpoints(directory: Path) -> list[Path]:
    """Complete-looking checkpoint directories, newest (highest global step) first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: p.name, reverse=True)


def check_checkpoint(path: Path) -> dict:
    """meta.json of checkpoint `path` after checking it and every file it lists; raises BenchError."""
    meta = read_meta(path)
    for name, entry in meta["files"].items():
        _check_file(path / name, entry)
    return meta


def _check_file(path: Path, entry: dict) -> None:
    try:
        if not path.is_file():
            raise BenchError(f"{path}: listed in the checkpoint's {META} but missing")
        size = path.stat().st_size
        digest = xxh3_128_file(path) if size == entry["bytes"] else None
    except OSError as err:
        raise BenchError(f"{path}: listed in the checkpoint's {META} but cannot be read ({err.strerror or err})") \
            from None
    if size != entry["bytes"]:
        raise BenchError(f"{path}: {size} bytes, {META} says {entry['bytes']}; truncated or changed")
    if digest != entry["xxh3_128"]:
        raise BenchError(f"{path}: xxh3_128 {digest}, {META} says {entry['xxh3_128']}; the file is corrupt")


def newest_valid(directory: Path, warn: Callable[[str], None] = print) -> Resume | None:
    """The newest checkpoint in `directory` that checks out; each newer one that does not is reported."""
    for path in list_checkpoints(directory):
        try:
            return Resume(path, check_checkpoint(path))
        except BenchError as err:
            warn(f"warning: skipping checkpoint {path.name}: {err}")
    return None


def find_resume(cfg: CheckpointConfig, output_dir: str, dist: DistEnv, benchmark: str,
                log: Callable[[str], None]) -> Resume | None:
    """The checkpoint every rank resumes from (rank 0 chooses), or None to start from scratch."""
    choice = None
    if dist.is_root and cfg.resume:
        directory = checkpoint_dir(cfg, output_dir)
        found = newest_valid(directory, warn=log)
        if found is None:
            log(f"checkpoint.resume=true: no valid checkpoint in {directory}; starting from scratch")
        elif found.meta.get("benchmark") != benchmark:
            raise BenchError(f"{found.path / META}: a {found.meta.get('benchmark')} checkpoint, this is {benchmark}")
        else:
            choice = (str(found.path), found.meta)
    choice = dist.broadcast_object(choice)
    return Resume(Path(choice[0]), choice[1]) if choice else None


# ---------------------------------------------------------------------------- reading meta.json
PROGRESS_KEYS = tuple(f.name for f in dataclasses.fields(Progress))
PARTIAL_KEYS = ("loss_sum", "seconds")
INPUT_KEYS = tuple(f.name for f in dataclasses.fields(InputPosition))
# What a DALI stream's order depends on beside its loader and seed. ranks_per_node: the ranks of a node that
# share its files under data.stage_mode=node_share (0 otherwise, where a rank's files follow from ranks alone).
LAYOUT_KEYS = ("run_seed", "ranks", "ranks_per_node", "node_share", "local_batch_size", "shuffle", "shuffle_buffer",
               "strategy")
INPUT_LOADERS = ("tfdata", "dali", "")
_COUNT_LIMIT = 2 ** 63  # counts (steps, epochs, sizes) are int64 wherever they go
_FILE_NAME = re.compile(r"(?!\.\.?$)[A-Za-z0-9_.-]{1,255}")  # as the writers name them: model.npz, rank_00000.npz
_XXH3 = re.compile(r"[0-9a-f]{32}")


def read_meta(path: Path) -> dict:
    """meta.json of checkpoint directory `path`, checked against everything resuming reads of it: the keys, their
    types and ranges, and the files a checkpoint of its rank count holds. Raises BenchError naming the file, the
    key (dotted, as `progress.history[2].epoch`) and the value."""
    meta_path = path / META
    if not meta_path.is_file():
        raise BenchError(f"{meta_path}: missing; the checkpoint was not finished")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:  # ValueError: bad JSON, an integer of > 4300 digits
        raise BenchError(f"{meta_path}: not readable JSON ({err})") from None
    except RecursionError:
        raise BenchError(f"{meta_path}: not readable JSON (nested too deeply)") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise BenchError(f"{meta_path}: not a checkpoint description (expected an object with format {FORMAT!r})")
    if type(meta.get("version")) is not int or meta["version"] != VERSION:  # not true or 1.0 either
        raise BenchError(f"{meta_path}: version {_show(meta.get('version'))}, this code reads version {VERSION}")
    _check_meta(meta, meta_path, path.name)
    return meta


def _check_meta(meta: dict, where: Path, name: str) -> None:
    """The keys resuming reads (other keys, such as `created`, are informational)."""
    _value(meta, "benchmark", str, where)
    step = _count(meta, "global_step", where)
    if _NAME.match(name) and int(name[len("ckpt-"):]) != step:
        raise BenchError(f"{where}: 'global_step' is {step}, but the checkpoint directory is {name}")
    _check_progress(_value(meta, "progress", dict, where), where)
    for key in ("model_variables", "rank_variables"):
        _check_variables(_value(meta, key, list, where), key, where)
    ranks = _count(meta, "ranks", where, minimum=1)
    _check_files(_value(meta, "files", dict, where), ranks, _value(meta, "input_state", bool, where), where)
    if "input" in meta:  # checkpoints written before meta.json held it resume with a fresh input order
        _check_input(_value(meta, "input", dict, where), step, ranks, where)


def _check_input(position: dict, step: int, ranks: int, where: Path) -> None:
    """What `InputPosition(**position)` needs, and a stream that began no later than the checkpoint's step."""
    _only(position, INPUT_KEYS, "input", where)
    loader = _value(position, "loader", str, where, "input")
    if loader not in INPUT_LOADERS:
        raise BenchError(f"{where}: 'input.loader' is {_show(loader)}, expected one of {list(INPUT_LOADERS)}")
    _integer(position, "seed", where, "input")
    start = _count(position, "start_step", where, "input")
    if start > step:
        raise BenchError(f"{where}: 'input.start_step' is {start}, after the checkpoint's 'global_step' {step}")
    layout = _value(position, "layout", dict, where, "input")
    _only(layout, LAYOUT_KEYS, "input.layout", where)
    _integer(layout, "run_seed", where, "input.layout")
    for key, minimum in (("ranks", 1), ("ranks_per_node", 0), ("local_batch_size", 1), ("shuffle_buffer", 1)):
        _count(layout, key, where, "input.layout", minimum=minimum)
    for key, kind in (("node_share", bool), ("shuffle", bool), ("strategy", str)):
        _value(layout, key, kind, where, "input.layout")
    if layout["ranks"] != ranks:
        raise BenchError(f"{where}: 'input.layout.ranks' is {layout['ranks']}, but 'ranks' is {ranks}")


def _check_progress(progress: dict, where: Path) -> None:
    """What `Progress(**progress)` needs, and what the training loop then counts and sums with."""
    _only(progress, PROGRESS_KEYS, "progress", where)
    _count(progress, "epoch", where, "progress", minimum=1)
    _count(progress, "step", where, "progress")
    _count(progress, "attempt", where, "progress", minimum=1)
    _number(progress, "earlier_seconds", where, "progress", minimum=0.0)
    partial = _value(progress, "partial", dict, where, "progress")
    _only(partial, PARTIAL_KEYS, "progress.partial", where)
    for key in partial:
        _number(partial, key, where, "progress.partial", minimum=0.0 if key == "seconds" else None)
    for i, record in enumerate(_value(progress, "history", list, where, "progress")):
        label = f"progress.history[{i}]"
        if not isinstance(record, dict):
            raise BenchError(f"{where}: {label!r} is {_show(record)}, expected an object (an epoch's figures)")
        _count(record, "epoch", where, label, minimum=1)
        for key, value in record.items():  # NaN is a figure too (an evaluation can give one)
            if not (_is_number(value) and _as_float(value) is not None):
                raise BenchError(f"{where}: {label + '.' + key!r} is {_show(value)}, expected a number")


def _check_variables(variables: list, key: str, where: Path) -> None:
    """[name, shape, dtype] of each variable, as `variable_names` writes them."""
    for i, entry in enumerate(variables):
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                and isinstance(entry[1], list) and all(_is_count(d) for d in entry[1]) and isinstance(entry[2], str)):
            raise BenchError(f"{where}: '{key}[{i}]' is {_show(entry)}, expected [name, shape (sizes >= 0), dtype]")


def _check_files(files: dict, ranks: int, input_state: bool, where: Path) -> None:
    """Each entry names a file of the checkpoint directory with its size and xxh3-128, and the files a checkpoint
    of `ranks` ranks holds are listed."""
    for name, entry in files.items():
        if not _FILE_NAME.fullmatch(name) or name == META:
            raise BenchError(f"{where}: 'files' lists {name!r}, expected the name of a file in the checkpoint "
                             f"directory (letters, digits, '_', '.', '-')")
        label = f"files[{name!r}]"
        if not isinstance(entry, dict):
            raise BenchError(f"{where}: {label!r} is {_show(entry)}, expected an object with 'bytes' and 'xxh3_128'")
        _count(entry, "bytes", where, label)
        if not _XXH3.fullmatch(_value(entry, "xxh3_128", str, where, label)):
            raise BenchError(f"{where}: {label + '.xxh3_128'!r} is {_show(entry['xxh3_128'])}, expected 32 hex "
                             f"digits")
    if ranks > len(files):
        raise BenchError(f"{where}: 'ranks' is {ranks}, but 'files' lists {len(files)} files (a checkpoint holds a "
                         f"rank_<r>.npz of every rank)")
    for needed in [MODEL_FILE] + [f"rank_{r:05d}.npz" for r in range(ranks)]:
        if needed not in files:
            raise BenchError(f"{where}: 'files' lists no {needed!r}, which a checkpoint of {ranks} rank(s) "
                             f"('ranks') holds")
    for r in range(ranks if input_state else 0):
        if not any(name.startswith(f"input_rank_{r:05d}.") for name in files):
            raise BenchError(f"{where}: 'input_state' is true, but 'files' lists no input_rank_{r:05d}.* (rank "
                             f"{r}'s input position)")


def _value(obj: dict, key: str, kind: type | None, where: Path, label: str = "") -> Any:
    """obj[key], which must be there and of type `kind` (a bool is no int; None: any); `label` is obj's place in
    meta.json."""
    name = f"{label}.{key}" if label else key
    if key not in obj:
        raise BenchError(f"{where}: no {name!r} (found {', '.join(repr(k) for k in sorted(obj)[:12]) or 'none'})")
    value = obj[key]
    if kind is not None and (not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)):
        expected = {dict: "an object", list: "a list", str: "a string", bool: "true or false"}[kind]
        raise BenchError(f"{where}: {name!r} is {_show(value)}, expected {expected}")
    return value


def _count(obj: dict, key: str, where: Path, label: str = "", minimum: int = 0) -> int:
    """obj[key], which must be an integer in [minimum, 2^63)."""
    value = obj.get(key)
    if key in obj and _is_count(value) and value >= minimum:
        return value
    _value(obj, key, None, where, label)  # a missing key
    name = f"{label}.{key}" if label else key
    raise BenchError(f"{where}: {name!r} is {_show(value)}, expected an integer in [{minimum}, 2^63)")


def _integer(obj: dict, key: str, where: Path, label: str) -> int:
    """obj[key], which must be an integer in [-2^63, 2^63) (a seed)."""
    value = _value(obj, key, None, where, label)
    if isinstance(value, int) and not isinstance(value, bool) and -_COUNT_LIMIT <= value < _COUNT_LIMIT:
        return value
    raise BenchError(f"{where}: {label + '.' + key!r} is {_show(value)}, expected an integer in [-2^63, 2^63)")


def _number(obj: dict, key: str, where: Path, label: str, minimum: float | None) -> float:
    """obj[key], which must be a finite number (>= `minimum` unless None)."""
    value = _value(obj, key, None, where, label)
    number = _as_float(value) if _is_number(value) else None
    if number is not None and math.isfinite(number) and (minimum is None or number >= minimum):
        return value
    bound = "" if minimum is None else f" >= {minimum:g}"
    raise BenchError(f"{where}: {label + '.' + key!r} is {_show(value)}, expected a finite number{bound}")


def _only(obj: dict, keys: tuple[str, ...], label: str, where: Path) -> None:
    unknown = sorted(set(obj) - set(keys))
    if unknown:
        raise BenchError(f"{where}: unknown key {label + '.' + unknown[0]!r}; {label!r} holds {', '.join(keys)}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_float(value: int | float) -> float | None:
    """The number as a float, or None for an integer beyond float's range (10^400 is valid JSON)."""
    try:
        return float(value)
    except OverflowError:
        return None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _COUNT_LIMIT


def _show(value: Any) -> str:
    """A value for a message: its repr (surrogates and control characters escaped), at most 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


# ---------------------------------------------------------------------------- variables
def variable_names(variables: list) -> list[list]:
    """[path, shape, dtype] of each variable: what a checkpoint's arrays must match."""
    return [[getattr(v, "path", getattr(v, "name", "")), list(v.shape), str(np.dtype(_dtype(v)))] for v in variables]


def _dtype(v: Any) -> str:
    dtype = getattr(v, "dtype", "float32")
    return getattr(dtype, "name", dtype)


def _save_arrays(path: Path, variables: list) -> None:
    with open(path, "wb") as f:
        np.savez(f, **{f"v{i:05d}": np.asarray(v.numpy() if hasattr(v, "numpy") else v) for i, v in
                       enumerate(variables)})
        f.flush()
        os.fsync(f.fileno())


def _load_arrays(path: Path, variables: list, listed: list[list], what: str) -> None:
    """Assign the arrays of `path` to `variables`, which must match `listed` (from meta.json) one for one."""
    ours = variable_names(variables)
    if len(ours) != len(listed):
        raise BenchError(f"{path}: {len(listed)} {what} variables, this model has {len(ours)}; the checkpoint "
                         f"was written by a different model or config")
    for i, (theirs, mine) in enumerate(zip(listed, ours)):
        if list(theirs[1]) != mine[1]:
            raise BenchError(f"{path}: {what} variable {i} ({theirs[0]}) has shape {theirs[1]} there and "
                             f"{mine[1]} here ({mine[0]}); the checkpoint was written by a different model")
    with np.load(path) as arrays:
        for i, var in enumerate(variables):
            var.assign(arrays[f"v{i:05d}"])


# ---------------------------------------------------------------------------- writing
class Checkpointer:
    """Writes a run's checkpoints on the schedule of its config; all ranks call `save` together."""

    def __init__(self, cfg: CheckpointConfig, output_dir: str, dist: DistEnv, benchmark: str,
                 log: Callable[[str], None], input_position: InputPosition | None = None):
        """`input_position`: what the training input's position depends on, saved as meta.json's "input"."""
        self.cfg, self.dist, self.benchmark, self.log = cfg, dist, benchmark, log
        self.input_position = input_position
        self.directory = checkpoint_dir(cfg, output_dir)
        self.last_time = time.monotonic()

    def due(self, epoch: int) -> bool:
        """Whether the end of `epoch` is a periodic checkpoint (every_epochs, or every_minutes since the last)."""
        by_epochs = self.cfg.every_epochs and epoch % self.cfg.every_epochs == 0
        by_time = self.cfg.every_minutes and time.monotonic() - self.last_time >= 60 * self.cfg.every_minutes
        return bool(by_epochs or by_time)

    def save(self, progress: Progress, global_step: int, model, optimizer, train_iter, input_state: bool) -> Path:
        """Write checkpoint `ckpt-<global_step>` (collective); returns its path."""
        t0 = time.perf_counter()
        final = self.directory / f"ckpt-{global_step:09d}"
        tmp = self.directory / f".tmp-ckpt-{global_step:09d}"
        if self.dist.is_root:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.dist.barrier()
        files = self._write_rank_files(tmp, model, optimizer, train_iter, input_state)
        every = self.dist.gather_object(files)
        if self.dist.is_root:
            meta = {"format": FORMAT, "version": VERSION, "benchmark": self.benchmark, "ranks": self.dist.size,
                    "global_step": global_step, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "input_state": input_state, "progress": dataclasses.asdict(progress),
                    "model_variables": variable_names(list(model.variables) + list(optimizer.variables)),
                    "rank_variables": variable_names(list(model.non_trainable_variables)),
                    "files": {name: entry for part in every for name, entry in part.items()}}
            if self.input_position is not None:
                meta["input"] = self.input_position.to_meta()
            _write_synced(tmp / META, json.dumps(meta, indent=1, default=float) + "\n")
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            _fsync_dir(self.directory)
            self._prune()
        self.dist.barrier()
        self.last_time = time.monotonic()
        self.log(f"checkpoint {final} written in {time.perf_counter() - t0:.2f} s")
        return final

    def _write_rank_files(self, tmp: Path, model, optimizer, train_iter, input_state: bool) -> dict:
        rank = self.dist.rank
        written = []
        if self.dist.is_root:
            _save_arrays(tmp / MODEL_FILE, list(model.variables) + list(optimizer.variables))
            written.append(MODEL_FILE)
        _save_arrays(tmp / f"rank_{rank:05d}.npz", list(model.non_trainable_variables))
        written.append(f"rank_{rank:05d}.npz")
        if input_state:
            import tensorflow as tf
            prefix = tmp / f"input_rank_{rank:05d}"
            tf.train.Checkpoint(iterator=train_iter).write(str(prefix))
            written += sorted(p.name for p in tmp.glob(f"input_rank_{rank:05d}.*"))
        for name in written:
            _fsync_file(tmp / name)
        return {name: {"bytes": (tmp / name).stat().st_size, "xxh3_128": xxh3_128_file(tmp / name)}
                for name in written}

    def _prune(self) -> None:
        for old in list_checkpoints(self.directory)[self.cfg.keep:]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.directory.glob(".tmp-ckpt-*"):
            shutil.rmtree(stale, ignore_errors=True)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- restoring
def restore_shared(resume: Resume, model, optimizer, dist: DistEnv) -> None:
    """Rank 0 loads the model and optimizer variables (fit() then broadcasts them to the other ranks)."""
    if dist.is_root:
        _load_arrays(resume.path / MODEL_FILE, list(model.variables) + list(optimizer.variables),
                     resume.meta["model_variables"], "model and optimizer")


def restore_rank(resume: Resume, model, train_iter, dist: DistEnv, log: Callable[[str], None],
                 plan: InputPlan | None = None) -> bool:
    """This rank's own variables and input position; True when the input continues where the checkpoint stopped.

    `plan` (plan_input) says how: tf.data's saved iterator state is read into `train_iter`; a DALI stream was
    rebuilt with the checkpoint's seed, and `train_iter` skips the batches consumed; else the input starts afresh
    (without a plan, it does unless the iterator state can be read). With another rank count than the
    checkpoint's, every rank takes rank 0's non-trainable variables."""
    same_ranks = resume.ranks == dist.size
    source = dist.rank if same_ranks else 0
    _load_arrays(resume.path / f"rank_{source:05d}.npz", list(model.non_trainable_variables),
                 resume.meta["rank_variables"], "per-rank")
    if plan is not None and plan.restore == "replay":
        log(f"resume: the DALI training input was replayed: {plan.skip} batches skipped per rank, from a stream "
            f"rebuilt with the checkpoint's seed {plan.seed}; the data order is the uninterrupted run's")
        return True
    readable = resume.input_state and same_ranks and train_iter is not None
    if not (readable and (plan is None or plan.restore == "iterator")):
        why = plan.why_afresh if plan is not None and plan.why_afresh else (
            "the loader's iterator state was not saved (DALI, or checkpoint.input_state=false)"
            if not resume.input_state else f"the checkpoint has {resume.ranks} ranks, this run {dist.size}")
        log(f"resume: the training input starts afresh: {why}; the data order differs from an uninterrupted run")
        return False
    import tensorflow as tf
    tf.train.Checkpoint(iterator=train_iter).read(str(resume.path / f"input_rank_{dist.rank:05d}")).expect_partial()
    return True
