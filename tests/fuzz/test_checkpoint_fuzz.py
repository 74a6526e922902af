"""Fuzzing the reading of a checkpoint's meta.json on resume (common/runtime/checkpoint.py): `check_checkpoint`
(read_meta and the file checks), `find_resume` (which skips a checkpoint that does not check out, with a warning),
and what a run then reads of the chosen checkpoint (its `Meta`): its progress, rank count and input state, and the variables
`restore_shared` and `restore_rank` assign, and the input plan (`plan_input`) of its input position.

Inputs: the meta.json of a real checkpoint (written by `Checkpointer.save` for a stand-in model of four
variables, one rank, mid-epoch with a history and partial sums) with corrupted bytes (truncated, bytes that are
not UTF-8, ...), JSON nested 100,000 deep, an integer of 5,000 digits, or one to three values mutated: deleted,
replaced by a random JSON value, of another type, nested in a list or object, a nearby or absurd number
(-1, 2^63, 10^400, NaN, infinities), or a key renamed (file names that leave the directory, hold NUL or a lone
surrogate, name meta.json itself). Promise: a BenchError naming the file (for meta.json, the mutated key), or a
Meta whose progress has the types and ranges the training loop counts with, whose rank count and file list
agree, and whose restore gives back the saved variables or a BenchError naming the checkpoint's file; every
message printable. Never another exception or a hang (10 s per input, SIGALRM).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.io.position import InputPosition, Layout
from common.runtime.checkpoint import (META, Meta, Progress, check_checkpoint, find_resume,
                                       plan_input, read_checkpoint, restore_rank, restore_shared)
from common.runtime.config import CheckpointConfig
from common.runtime.dist import DistEnv
from tests.conftest import copy_of
from tests.fuzz.harness import corruptions, fuzz, outcome_of, time_limit, timed
from tests.fuzz.test_manifest_fuzz import deep_json, drawn_location, json_paths, json_values
from tests.unit.test_checkpoint_meta import LAYOUT, model_and_optimizer, write_checkpoint

LIMIT_S = 10.0  # per input; checking this checkpoint takes milliseconds


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A checkpoint directory `ckpt/ckpt-000000010` as a one-rank DALI run writes it (no input state)."""
    position = InputPosition(loader="dali", seed=5, start_step=4, layout=Layout(**LAYOUT))
    return write_checkpoint(tmp_path_factory.mktemp("run"), position=position)


# ---------------------------------------------------------------------------- mutations
NAMES = ["../model.npz", "/etc/passwd", "", ".", "..", "x" * 300, "a\x00b", META, "\ud800", "model.npz ",
         "rank_00001.npz", "input_rank_00000.index", "model.NPZ", "sub/model.npz"]
numbers = st.sampled_from([0, -1, 1, 2, 3, 10, 2 ** 31, 2 ** 63 - 1, 2 ** 63, -2 ** 63, 10 ** 400, 0.5, -0.0, 1e308,
                           math.nan, math.inf, -math.inf, True, False])


@st.composite
def meta_mutation(draw, obj: dict) -> tuple[dict, tuple]:
    """A copy of meta.json's `obj` with one value changed, and where (keys and indexes from the top)."""
    obj, where, parent, key = drawn_location(draw, obj)
    old = parent[key]
    op = draw(st.sampled_from(["delete", "replace", "retype", "nudge", "nest", "rename"]))
    if op == "delete":
        del parent[key]
    elif op == "replace":
        parent[key] = draw(json_values | numbers)
    elif op == "retype":
        parent[key] = str(old) if not isinstance(old, str) else draw(st.sampled_from([None, 1, [old]]))
    elif op == "nudge" and isinstance(old, (int, float)) and not isinstance(old, bool):
        parent[key] = draw(st.sampled_from([-old, old - 1, old + 1, old * 2 ** 40]) | numbers)
    elif op == "nest":
        parent[key] = draw(st.sampled_from([[old], {"value": old}]))
    elif op == "rename" and isinstance(parent, dict):
        parent[draw(st.sampled_from(NAMES) | st.text(max_size=12))] = parent.pop(key)
    else:
        parent[key] = draw(numbers)
    return obj, where


def huge_integer(text: str) -> str:
    """meta.json with its first number (the version) given 5,000 digits: json.loads raises ValueError."""
    at = text.index('"version": ') + len('"version": ')
    return text[:at] + "1" + "0" * 5000 + text[at + 1:]


# ---------------------------------------------------------------------------- the promise
def check_resume(path: Path, mutated_keys: set[str] = frozenset()) -> str:
    """Check checkpoint `path` and resume from it as a run does; returns the outcome for the tally."""
    where = path / META
    with time_limit(LIMIT_S):
        outcome, value = outcome_of(lambda: check_checkpoint(path))
    assert outcome != "crash", f"{where}:\n{value}\n{where.read_bytes()[:3000]!r}"
    if outcome == "BenchError":
        value.encode("utf-8")  # printable: the warning newest_valid prints
        assert str(path) in value, value
        if value.startswith(f"{where}:") and mutated_keys:
            assert any(key in value for key in mutated_keys), f"{value} names none of {sorted(mutated_keys)}"
        check_find_resume(path, value)
        return "BenchError"
    resume = read_checkpoint(path)
    check_progress(resume.progress, value)
    assert isinstance(resume.ranks, int) and resume.ranks >= 1 and isinstance(resume.input_state, bool)
    with time_limit(LIMIT_S):
        outcome, restored = outcome_of(lambda: restore(resume))
    assert outcome != "crash", f"{where}:\n{restored}\n{where.read_bytes()[:3000]!r}"
    if outcome == "BenchError":
        assert str(path) in restored, restored
        return "BenchError on restore"
    expected = [v.value for v in model_and_optimizer()[0].variables + model_and_optimizer()[1].variables]
    for got, want in zip(restored, expected):
        np.testing.assert_array_equal(got, want)
    check_find_resume(path, None)
    return "resumed"


def check_progress(progress: Progress, meta: dict) -> None:
    """What the training loop counts and sums with, and the writer can write again."""
    assert all(type(n) is int for n in (progress.epoch, progress.step, progress.attempt)), progress
    assert progress.epoch >= 1 and progress.step >= 0 and progress.attempt >= 1, progress
    assert math.isfinite(progress.earlier_seconds) and progress.earlier_seconds >= 0, progress
    assert all(math.isfinite(v) for v in progress.partial.values()) and set(progress.partial) <= {"loss_sum",
                                                                                                  "seconds"}
    assert all(isinstance(h, dict) and type(h["epoch"]) is int for h in progress.history), progress.history
    assert json.loads(json.dumps(dataclasses.asdict(progress), default=float)) is not None
    assert dataclasses.asdict(progress) == meta["progress"] or math.nan in _leaves(meta["progress"])


def _leaves(obj) -> list:
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _leaves(v)]
    return [x for v in obj for x in _leaves(v)] if isinstance(obj, list) else [obj]


def restore(resume: Meta) -> list[np.ndarray]:
    """The variables of a fresh stand-in model after restoring `resume` into it."""
    model, optimizer = model_and_optimizer(fill=0.0)
    restore_shared(resume, model, optimizer, DistEnv())
    plan = plan_input(resume, (5, 6), "dali", Layout(**LAYOUT))
    assert plan.restore == "replay" and plan.skip >= 0 or plan.restore == "" and plan.why_afresh, plan
    restore_rank(resume, model, None, DistEnv(), lambda _m: None, plan)
    return [v.value for v in model.variables + optimizer.variables]


def check_find_resume(path: Path, error: str | None) -> None:
    """find_resume takes the checkpoint, or skips it with the warning `error` and starts from scratch."""
    lines = []
    cfg = CheckpointConfig(dir=str(path.parent), resume=True)
    with time_limit(LIMIT_S):
        outcome, value = outcome_of(lambda: find_resume(cfg, str(path.parent), DistEnv(), "cosmoflow", lines.append))
    assert outcome in ("ok", "BenchError"), value
    for line in lines:
        line.encode("utf-8")
    if outcome == "BenchError":  # a checkpoint that checks out, of another benchmark
        assert str(path / META) in value and "checkpoint, this is cosmoflow" in value, value
    elif error is not None:
        assert value is None and any(error in line for line in lines), lines
    else:
        assert value is not None and value.path == path


# ---------------------------------------------------------------------------- the tests
@fuzz(examples=150, deadline_s=20)
@given(data=st.data())
def test_corrupted_meta_json_bytes(checkpoint, tmp_path_factory, data):
    path = copy_of(checkpoint.parent, tmp_path_factory, "ckpt") / checkpoint.name
    where = path / META
    special = data.draw(st.integers(0, 9), label="0: deep nesting, 1: a huge integer")
    if special == 0:
        where.write_text(deep_json(data.draw(st.sampled_from([10, 1000, 100_000]), label="depth")))
    elif special == 1:
        where.write_text(huge_integer(where.read_text()))
    else:
        where.write_bytes(data.draw(corruptions(where.stat().st_size), label="corruption").apply(where.read_bytes()))
    with timed("checkpoint meta.json: corrupted bytes") as box:
        box[0] = check_resume(path)


@fuzz(examples=200, deadline_s=20)
@given(data=st.data())
def test_mutated_meta_json_values(checkpoint, tmp_path_factory, data):
    path = copy_of(checkpoint.parent, tmp_path_factory, "ckpt") / checkpoint.name
    obj, mutated = json.loads((path / META).read_text()), set()
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        obj, where = data.draw(meta_mutation(obj), label="mutated meta.json")
        mutated.add(where[0])
    (path / META).write_text(json.dumps(obj))  # NaN and Infinity as Python writes them
    with timed("checkpoint meta.json: mutated values") as box:
        box[0] = check_resume(path, mutated)
