"""Tiny DeepCAM data and runs for the integration tests, each made once per test session by the real tools.

`tiny_dataset` (16 training and 8 validation snapshots of 32 x 48) serves test_deepcam_e2e.py, test_staging_e2e.py
and test_export.py; `checkpointed_run` (one process, 3 epochs, a checkpoint after each) is the resume test's
uninterrupted run and the export test's trained run; `staged_two_rank_run` (2 ranks staging a gzip pack per
rank, evaluating every 2 steps) is the two-rank log test's run and the DeepCAM staging test's. The session's
`tmp_path_factory` holds them; tests read them only and copy what they change.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable, TypeVar

import yaml

from tests.conftest import REPO, horovodrun, run_cmd, show

TRAIN = REPO / "deepcam/train.py"
# Two middle-flow blocks, not the reference's 16: these tests check training, logging and state, not the
# architecture (tests/unit/test_deepcam_model.py), and each process traces the steps in about half the time.
TINY = {"model": {"input_shape": [32, 48, 16], "width": 0.125, "middle_blocks": 2},
        "train": {"max_epochs": 2, "local_batch_size": 2, "eval_every_steps": 0, "precision": "float32"},
        "schedule": {"warmup_steps": 2, "t_max": 16},
        "data": {"shuffle_buffer": 8}, "mlperf": {"platform": "test"}}
# The uninterrupted run of the resume test: 3 epochs of 8 steps on one process, reading with tf.data (whose
# iterator state a checkpoint holds), a checkpoint after every epoch, an IoU target out of reach.
CHECKPOINTED = TINY | {"train": {**TINY["train"], "max_epochs": 3, "target": 0.999},
                       "data": {**TINY["data"], "loader": "tfdata"}, "checkpoint": {"every_epochs": 1}}

T = TypeVar("T")
_MADE: dict[str, object] = {}


def make_dataset(root: Path, height: int, width: int, train: int, validation: int) -> Path:
    """deepcam-synth (seed 5) then deepcam-convert into ROOT/tfrecords."""
    raw, records = root / "raw", root / "tfrecords"
    for args in (["deepcam-synth", "--out", raw, "--train", train, "--validation", validation,
                  "--height", height, "--width", width, "--seed", 5, "--workers", 2],
                 ["deepcam-convert", "--input", raw, "--out", records, "--workers", 1]):
        proc = run_cmd([sys.executable, "-m", "data_prep", *args], timeout=600)
        assert proc.returncode == 0, show(proc)
    return records


def write_config(path: Path, base: str, data_dir: Path, out_dir: Path, sections: dict) -> Path:
    """deepcam/configs/BASE with `sections` merged over it (key by key within a section)."""
    cfg = yaml.safe_load((REPO / "deepcam/configs" / base).read_text())
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    cfg["data"]["dir"], cfg["run"]["output_dir"] = str(data_dir), str(out_dir)
    path.write_text(yaml.safe_dump(cfg))
    return path


def pack(src: Path, out: Path, *args) -> Path:
    """data_prep pack SRC into OUT (one worker)."""
    proc = run_cmd([sys.executable, "-m", "data_prep", "pack", "--input", src, "--out", out, "--workers", 1, *args])
    assert proc.returncode == 0, show(proc)
    return out


def _once(name: str, make: Callable[[], T]) -> T:
    """`make()` the first time `name` is asked for in this session, its result after that."""
    if name not in _MADE:
        _MADE[name] = make()
    return _MADE[name]  # type: ignore[return-value]


def tiny_dataset(tmp_path_factory) -> Path:
    """16 training and 8 validation snapshots of 32 x 48: with 2 ranks of 2, 4 steps an epoch."""
    return _once("tiny", lambda: make_dataset(tmp_path_factory.mktemp("deepcam"), 32, 48, train=16, validation=8))


def checkpointed_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The output directory and process of a `CHECKPOINTED` run on `tiny_dataset` (exit 1: target not reached)."""
    def make():
        root, data = tmp_path_factory.mktemp("deepcam-checkpointed"), tiny_dataset(tmp_path_factory)
        out = root / "run"
        proc = run_cmd([sys.executable, TRAIN, write_config(root / "c.yaml", "deepcam_mini.yaml", data, out,
                                                            CHECKPOINTED)])
        assert proc.returncode == 1, show(proc)  # the target is out of reach
        return out, proc
    return _once("checkpointed", make)


def staged_two_rank_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The output directory and process of a 2-rank TINY run (2 epochs, an evaluation every 2 steps, an IoU
    target of 1.0 out of reach) on a gzip pack of `tiny_dataset` (2 archives, contiguous layout), which each
    rank stages its own share of (data.stage_mode=rank)."""
    def make():
        root, data = tmp_path_factory.mktemp("deepcam-staged"), tiny_dataset(tmp_path_factory)
        packed = pack(data, root / "packed", "--compression", "gzip", "--archives", 2, "--layout", "contiguous")
        out = root / "run"
        cfg = write_config(root / "c.yaml", "deepcam_mini.yaml", packed, out, TINY | {
            "train": {**TINY["train"], "target": 1.0, "eval_every_steps": 2},
            "data": {**TINY["data"], "stage_dir": str(root / "local"), "stage_mode": "rank"}})
        proc = horovodrun(2, [TRAIN, cfg])
        assert proc.returncode == 1, show(proc)  # IoU 1.0 is not reached: exit 1, run aborted
        return out, proc
    return _once("staged", make)
