"""Checkpoints of a training run and resuming from them (docs/faults.md).

A checkpoint is a directory `CKPT_DIR/ckpt-<global step>/` holding
- `model.npz`: rank 0's model and optimizer variables (the same on every data-parallel rank),
- `rank_<r>.npz`: each rank's own non-trainable variables (batch-norm running statistics between
  evaluations, dropout seed-generator state), written by that rank,
- `input_rank_<r>.*`: each rank's tf.data iterator state (its position in the endless training stream,
  its record window included) when the loader is tf.data; DALI's iterator cannot be saved,
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
with a warning naming the problem (the file, and in meta.json the key and the value). What the attempt it ends left
in the output directory (its MLPerf log and summaries) moves to `attempts/<n>/` (`archive_attempt`).
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import numpy as np

from common.runtime.config import CheckpointConfig
from common.runtime.dist import DistEnv
from common.base import documents
from common.base.documents import check
from common.base.errors import BenchError
from common.io.input import InputPlan, dali_plugin_available
from common.io.position import InputPosition, Layout
from common.io.manifest import xxh3_128_file
from common.runtime.loop import Loop, shared_variables
from common.runtime.summary import Progress

FORMAT = "hpc-sciml-checkpoint"
VERSION = 1
META = "meta.json"
MODEL_FILE = "model.npz"
_NAME = re.compile(r"^ckpt-(\d{9})$")


def resume_loader(requested: str, resume: Meta) -> str:
    """The loader a resumed run reads with: data.loader, except that `auto` reads with the checkpoint's loader when
    that one is installed, so that it continues the checkpoint's input stream."""
    saved = resume.input
    if requested != "auto" or saved is None or saved.loader not in ("tfdata", "dali"):
        return requested
    return saved.loader if saved.loader == "tfdata" or dali_plugin_available() else "tfdata"


def log_resumed(resume: Meta, mlperf: Any, log: Callable[[str], None]) -> None:
    """At run_start of a resumed run: the MLPerf log's `resumed_from_checkpoint` event, and a line for the user."""
    progress = resume.progress
    mlperf.event("resumed_from_checkpoint", {
        "checkpoint": resume.path.name, "epoch": progress.epoch, "step": progress.step,
        "attempt": progress.attempt + 1, "earlier_seconds": round(progress.earlier_seconds, 3)})
    log(f"resuming from {resume.path}: epoch {progress.epoch}, {progress.step} steps done in it")


def plan_input(resume: Meta | None, seeds: tuple[int, int], loader: str, layout: Layout) -> InputPlan:
    """How this run's training input starts, given the checkpoint it resumes (None: none), `seeds` (the run's, and
    the one new to this attempt), the loader it reads with and its layout (LAYOUT_KEYS). A tf.data iterator saved
    by as many ranks is restored; a DALI stream of the same seed and layout is rebuilt and its consumed batches
    skipped; otherwise the input starts afresh with the new seed, so that it does not replay the first epochs."""
    run_seed, fresh_seed = seeds
    if resume is None:
        return InputPlan(run_seed)
    saved, step = resume.input, resume.global_step
    if resume.input_state and resume.ranks == layout.ranks and loader == "tfdata":
        return InputPlan(saved.seed if saved else run_seed, saved.start_step if saved else 0, restore="iterator")
    why = _why_not_replayed(resume, saved, loader, layout)
    if not why:
        return InputPlan(saved.seed, saved.start_step, restore="replay", skip=step - saved.start_step)
    return InputPlan(fresh_seed, start_step=step, why_afresh=why)


def _why_not_replayed(resume: Meta, saved: InputPosition | None, loader: str, layout: Layout) -> str:
    """Why the checkpoint's input position cannot be reached by replaying a rebuilt DALI stream ("": it can)."""
    if resume.input_state:
        return (f"the checkpoint holds the tf.data iterators of {resume.ranks} ranks; this run has "
                f"{layout.ranks} and reads with {loader}")
    if saved is None:
        return "the checkpoint records no input position (its writer gave none)"
    if saved.loader == "tfdata":
        return "the tf.data iterator state was not saved (checkpoint.input_state=false)"
    if saved.loader == "":
        return f"the {saved.layout.strategy} strategy keeps no input position"
    if loader != "dali":
        return f"the checkpoint's input was read with DALI, this run reads with {loader}"
    change = saved.layout_change(layout)
    return f"the input layout changed since the checkpoint ({change})" if change else ""


# What an earlier attempt leaves in the output directory, moved to attempts/<n>/ when a run resumes.
ATTEMPT_FILES = ("summary.json", "io_report.json")


def archive_attempt(out: Path, log_file: str, attempt: int) -> None:
    """Move what attempt `attempt` left in `out` (its MLPerf log and summaries) to out/attempts/<attempt>/."""
    names = [n for n in (log_file, *ATTEMPT_FILES) if (out / n).is_file()]
    if not names:
        return
    dest = out / "attempts" / str(attempt)
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        os.replace(out / name, dest / name)


def checkpoint_dir(cfg: CheckpointConfig, output_dir: str | os.PathLike) -> Path:
    return Path(cfg.dir) if cfg.dir else Path(output_dir) / "checkpoints"


# ---------------------------------------------------------------------------- finding and checking
def list_checkpoints(directory: Path) -> list[Path]:
    """Complete-looking checkpoint directories, newest (highest global step) first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: p.name, reverse=True)


def read_checkpoint(path: Path) -> Meta:
    """meta.json of checkpoint `path` (with its `path`) after checking it and every file it lists: what a run
    resumes from; raises BenchError."""
    meta = read_meta(path)
    for name, entry in meta.files.items():
        _check_file(path / name, entry)
    return meta


def check_checkpoint(path: Path) -> dict:
    """read_checkpoint's meta.json as a dict (as written)."""
    return documents.to_dict(read_checkpoint(path))


def _check_file(path: Path, entry: FileDigest) -> None:
    try:
        if not path.is_file():
            raise BenchError(f"{path}: listed in the checkpoint's {META} but missing")
        size = path.stat().st_size
        digest = xxh3_128_file(path) if size == entry.bytes else None
    except OSError as err:
        raise BenchError(f"{path}: listed in the checkpoint's {META} but cannot be read ({err.strerror or err})") \
            from None
    if size != entry.bytes:
        raise BenchError(f"{path}: {size} bytes, {META} says {entry.bytes}; truncated or changed")
    if digest != entry.xxh3_128:
        raise BenchError(f"{path}: xxh3_128 {digest}, {META} says {entry.xxh3_128}; the file is corrupt")


def newest_valid(directory: Path, warn: Callable[[str], None] = print) -> Meta | None:
    """The newest checkpoint in `directory` that checks out; each newer one that does not is reported."""
    for path in list_checkpoints(directory):
        try:
            return read_checkpoint(path)
        except BenchError as err:
            warn(f"warning: skipping checkpoint {path.name}: {err}")
    return None


def find_resume(cfg: CheckpointConfig, output_dir: str, dist: DistEnv, benchmark: str,
                log: Callable[[str], None]) -> Meta | None:
    """The checkpoint every rank resumes from (rank 0 chooses), or None to start from scratch."""
    choice = None
    if dist.is_root and cfg.resume:
        directory = checkpoint_dir(cfg, output_dir)
        found = newest_valid(directory, warn=log)
        if found is None:
            log(f"checkpoint.resume=true: no valid checkpoint in {directory}; starting from scratch")
        elif found.benchmark != benchmark:
            raise BenchError(f"{found.path / META}: a {found.benchmark} checkpoint, this is {benchmark}")
        else:
            choice = found
    return dist.broadcast_object(choice)


# ---------------------------------------------------------------------------- meta.json
INPUT_LOADERS = ("tfdata", "dali", "")
_FILE_NAME = re.compile(r"(?!\.\.?$)[A-Za-z0-9_.-]{1,255}")  # as the writers name them: model.npz, rank_00000.npz
_XXH3 = re.compile(r"[0-9a-f]{32}")
Variable = tuple[str, tuple[int, ...], str]  # [path, shape, dtype], as `variable_names` writes them


@dataclasses.dataclass(frozen=True)
class FileDigest:
    """A file of the checkpoint directory: its size and xxh3-128."""

    bytes: int
    xxh3_128: str

    def __post_init__(self):
        check(self.bytes >= 0, "bytes", self.bytes, "an integer >= 0")
        check(bool(_XXH3.fullmatch(self.xxh3_128)), "xxh3_128", self.xxh3_128, "32 lower-case hex digits")


@dataclasses.dataclass(frozen=True)
class Meta:
    """A checkpoint's meta.json: what resuming reads of it; `path`, the checkpoint directory, is the reader's."""

    format: Literal["hpc-sciml-checkpoint"]
    version: Literal[1]
    benchmark: str
    ranks: int
    global_step: int
    created: str  # when it was written (informational)
    input_state: bool  # each rank's tf.data iterator is saved (input_rank_<r>.*)
    progress: Progress
    model_variables: tuple[Variable, ...]
    rank_variables: tuple[Variable, ...]
    files: dict[str, FileDigest]
    input: InputPosition | None  # None: the writer gave no input position (the input then starts afresh)
    path: Path | None = dataclasses.field(default=None, kw_only=True, metadata=documents.NOT_STORED)

    def __post_init__(self):
        check(self.ranks >= 1, "ranks", self.ranks, "an integer >= 1")
        check(self.global_step >= 0, "global_step", self.global_step, "an integer >= 0")
        for key in ("model_variables", "rank_variables"):
            for i, (_name, shape, _dtype) in enumerate(getattr(self, key)):
                check(all(d >= 0 for d in shape), f"{key}[{i}]", list(shape), "[name, shape (sizes >= 0), dtype]")
        if self.input is not None:
            self._check_input(self.input)
        self._check_files()

    def _check_input(self, position: InputPosition) -> None:
        check(position.start_step <= self.global_step, "input.start_step", position.start_step,
              f"a step no later than global_step {self.global_step}")
        check(position.layout.ranks == self.ranks, "input.layout.ranks", position.layout.ranks,
              f"ranks ({self.ranks})")

    def _check_files(self) -> None:
        """Each entry names a file of the checkpoint directory, and the files a checkpoint of `ranks` ranks holds
        are listed."""
        for name in self.files:
            check(bool(_FILE_NAME.fullmatch(name)) and name != META, "files", name,
                  "the names of files in the checkpoint directory (letters, digits, '_', '.', '-')")
        check(self.ranks <= len(self.files), "ranks", self.ranks, f"at most the {len(self.files)} files listed "
              f"(a checkpoint holds a rank_<r>.npz of every rank)")
        for needed in [MODEL_FILE] + [f"rank_{r:05d}.npz" for r in range(self.ranks)]:
            check(needed in self.files, "files", sorted(self.files)[:4], f"{needed}, which a checkpoint of "
                  f"{self.ranks} rank(s) holds")
        for r in range(self.ranks if self.input_state else 0):
            check(any(name.startswith(f"input_rank_{r:05d}.") for name in self.files), "input_state", True,
                  f"false, as 'files' lists no input_rank_{r:05d}.* (rank {r}'s input position)")


def read_meta(path: Path) -> Meta:
    """meta.json of checkpoint directory `path`, read through `Meta`: its keys, types and ranges, and
    the files a checkpoint of its rank count holds. Raises BenchError naming the file, the key (dotted, as
    `progress.history[2].epoch`), the value and what was expected."""
    meta_path = path / META
    if not meta_path.is_file():
        raise BenchError(f"{meta_path}: missing; the checkpoint was not finished")
    meta = documents.read(meta_path, Meta, kind="json")
    if _NAME.match(path.name) and int(path.name[len("ckpt-"):]) != meta.global_step:
        raise BenchError(f"{meta_path}: key global_step = {meta.global_step}: expected the step of the checkpoint "
                         f"directory {path.name}")
    return dataclasses.replace(meta, path=path)


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


def _load_arrays(path: Path, variables: list, listed: Sequence[Variable], what: str) -> None:
    """Assign the arrays of `path` to `variables`, which must match `listed` (from meta.json) one for one."""
    ours = variable_names(variables)
    if len(ours) != len(listed):
        raise BenchError(f"{path}: {len(listed)} {what} variables, this model has {len(ours)}; the checkpoint "
                         f"was written by a different model or config")
    for i, (theirs, mine) in enumerate(zip(listed, ours)):
        if list(theirs[1]) != mine[1]:
            raise BenchError(f"{path}: {what} variable {i} ({theirs[0]}) has shape {list(theirs[1])} there and "
                             f"{mine[1]} here ({mine[0]}); the checkpoint was written by a different model")
    with np.load(path) as arrays:
        for i, var in enumerate(variables):
            var.assign(arrays[f"v{i:05d}"])


# ---------------------------------------------------------------------------- writing
class Checkpointer:
    """Writes a run's checkpoints (when: common/runtime/callbacks.py `Checkpoints`); all ranks call `save`
    together."""

    def __init__(self, cfg: CheckpointConfig, output_dir: str, dist: DistEnv, benchmark: str,
                 log: Callable[[str], None], input_position: InputPosition | None = None):
        """`input_position`: what the training input's position depends on, saved as meta.json's "input"."""
        self.cfg, self.dist, self.benchmark, self.log = cfg, dist, benchmark, log
        self.input_position = input_position
        self.directory = checkpoint_dir(cfg, output_dir)

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
                    "files": {name: entry for part in every for name, entry in part.items()},
                    "input": self.input_position.to_meta() if self.input_position is not None else None}
            _write_synced(tmp / META, documents.dumps(meta, indent=1))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            _fsync_dir(self.directory)
            self._prune()
        self.dist.barrier()
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
def resume_loop(loop: Loop, resume: Meta, plan: InputPlan | None) -> None:
    """Continue `loop` from the checkpoint `resume` (callbacks.py `Checkpoints`, at the loop's start): rank 0 reads
    the shared variables and every rank takes them, each rank its own; the input from the checkpoint's position
    (`plan`); the loop from its progress."""
    model, optimizer, dist = loop.trainee.model, loop.trainee.optimizer, loop.dist
    restore_shared(resume, model, optimizer, dist)
    dist.broadcast_variables(shared_variables(model) + optimizer.variables)
    loop.train_iter = iter(replayed(loop.data.train, plan))
    restore_rank(resume, model, loop.train_iter, dist, loop.log, plan)
    saved = resume.progress
    loop.start_at(dataclasses.replace(saved, attempt=saved.attempt + 1))


def replayed(train, plan: InputPlan | None):
    """The training dataset from the checkpoint's position when `plan` replays it: a DALI stream rebuilt with the
    checkpoint's seed gives the same batches, and the consumed ones are read and dropped inside tf.data."""
    return train.skip(plan.skip) if plan is not None and plan.restore == "replay" and plan.skip else train


def restore_shared(resume: Meta, model, optimizer, dist: DistEnv) -> None:
    """Rank 0 loads the model and optimizer variables (fit() then broadcasts them to the other ranks)."""
    if dist.is_root:
        _load_arrays(resume.path / MODEL_FILE, list(model.variables) + list(optimizer.variables),
                     resume.model_variables, "model and optimizer")


def restore_rank(resume: Meta, model, train_iter, dist: DistEnv, log: Callable[[str], None],
                 plan: InputPlan | None = None) -> bool:
    """This rank's own variables and input position; True when the input continues where the checkpoint stopped.

    `plan` (plan_input) says how: tf.data's saved iterator state is read into `train_iter`; a DALI stream was
    rebuilt with the checkpoint's seed, and `train_iter` skips the batches consumed; else the input starts afresh
    (without a plan, it does unless the iterator state can be read). With another rank count than the
    checkpoint's, every rank takes rank 0's non-trainable variables."""
    same_ranks = resume.ranks == dist.size
    source = dist.rank if same_ranks else 0
    _load_arrays(resume.path / f"rank_{source:05d}.npz", list(model.non_trainable_variables),
                 resume.rank_variables, "per-rank")
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
