"""Checkpoints of a training run and resuming from them (docs/faults.md).

A checkpoint is a directory `CKPT_DIR/ckpt-<global step>/` holding
- `model.npz`: rank 0's model and optimizer variables (the same on every data-parallel rank),
- `rank_<r>.npz`: each rank's own non-trainable variables (batch-norm running statistics between
  evaluations, dropout seed-generator state), written by that rank,
- `input_rank_<r>.*`: each rank's tf.data iterator state (its position in the endless training stream,
  shuffle buffers included) when the loader is tf.data; DALI's iterator cannot be saved,
- `meta.json`, written last by rank 0: where the run stands (`Progress`: epoch, steps done in it, the
  history, the partial epoch's sums, time spent by earlier attempts), the variables' names and shapes,
  and the size and xxh3-128 of every file.
Every rank writes into `.tmp-ckpt-<step>/`; rank 0 adds meta.json (fsynced) and renames the directory,
so a checkpoint directory without the `.tmp-` prefix is complete. Rank 0 keeps the newest
`checkpoint.keep` and removes the rest and any stale temporary directory.

Resuming (`checkpoint.resume=true`) takes the newest checkpoint whose files match meta.json; a newer one
that does not is skipped with a warning naming the problem.
"""
from __future__ import annotations

import dataclasses
import json
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
    meta_path = path / META
    if not meta_path.is_file():
        raise BenchError(f"{meta_path}: missing; the checkpoint was not finished")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BenchError(f"{meta_path}: not readable JSON ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("files"), dict):
        raise BenchError(f"{meta_path}: not a checkpoint description (expected format {FORMAT!r} and a files map)")
    if meta.get("version") != VERSION:
        raise BenchError(f"{meta_path}: version {meta.get('version')!r}, this code reads version {VERSION}")
    for name, entry in meta["files"].items():
        _check_file(path / name, entry)
    return meta


def _check_file(path: Path, entry: dict) -> None:
    if not path.is_file():
        raise BenchError(f"{path}: listed in the checkpoint's {META} but missing")
    size = path.stat().st_size
    if size != entry.get("bytes"):
        raise BenchError(f"{path}: {size} bytes, {META} says {entry.get('bytes')}; truncated or changed")
    digest = xxh3_128_file(path)
    if digest != entry.get("xxh3_128"):
        raise BenchError(f"{path}: xxh3_128 {digest}, {META} says {entry.get('xxh3_128')}; the file is corrupt")


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
                 log: Callable[[str], None]):
        self.cfg, self.dist, self.benchmark, self.log = cfg, dist, benchmark, log
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


def restore_rank(resume: Resume, model, train_iter, dist: DistEnv, log: Callable[[str], None]) -> bool:
    """This rank's own variables and input position; True when the input position was restored.

    With another rank count than the checkpoint's, every rank takes rank 0's non-trainable variables and
    the input stream starts afresh (the data order differs from an uninterrupted run)."""
    same_ranks = resume.ranks == dist.size
    source = dist.rank if same_ranks else 0
    _load_arrays(resume.path / f"rank_{source:05d}.npz", list(model.non_trainable_variables),
                 resume.meta["rank_variables"], "per-rank")
    if not (resume.input_state and same_ranks and train_iter is not None):
        why = ("the loader's iterator state was not saved (DALI, or checkpoint.input_state=false)"
               if not resume.input_state else f"the checkpoint has {resume.ranks} ranks, this run {dist.size}")
        log(f"resume: the training input starts afresh: {why}; the data order differs from an uninterrupted run")
        return False
    import tensorflow as tf
    tf.train.Checkpoint(iterator=train_iter).read(str(resume.path / f"input_rank_{dist.rank:05d}")).expect_partial()
    return True
