"""Reading a checkpoint's meta.json on resume (common/runtime/checkpoint.py: read_meta through check_checkpoint):
every damage found by fuzzing it (tests/fuzz/test_checkpoint_fuzz.py, docs/fuzzing.md) is a BenchError naming
the file, the key and the value; no TensorFlow (a stand-in model of numpy variables)."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from common.base.errors import BenchError
from common.io.position import InputPosition, Layout
from common.runtime.checkpoint import META, Checkpointer, Progress, check_checkpoint, newest_valid
from common.runtime.config import CheckpointConfig
from common.runtime.dist import DistEnv

STEPS = 4  # per epoch
SAVED = Progress(epoch=3, step=2, attempt=2, earlier_seconds=12.5, partial={"loss_sum": 1.25, "seconds": 3.5},
                 history=[{"epoch": e, "loss": 0.5 / e, "lr": 0.01, "steps": STEPS, "train_seconds": 2.0,
                           "samples_per_second": 40.0, "val_loss": 0.4 / e, "mae": 0.3 / e, "step": STEPS * e}
                          for e in (1, 2)])
LAYOUT = {"run_seed": 5, "ranks": 1, "ranks_per_node": 0, "node_share": False, "local_batch_size": 4, "shuffle": True,
          "shuffle_buffer": 8, "strategy": "data_parallel"}  # a one-rank run's, as meta.json's input.layout


class Variable:
    """What checkpoint.py uses of a Keras variable: path, shape, dtype, numpy() and assign()."""

    def __init__(self, path: str, value):
        self.path, self.value = path, np.asarray(value, np.float32)
        self.shape, self.dtype = self.value.shape, "float32"

    def numpy(self) -> np.ndarray:
        return self.value

    def assign(self, value) -> None:
        value = np.asarray(value)
        assert value.shape == self.shape, (self.path, value.shape, self.shape)  # Keras would raise ValueError
        self.value = value.astype(np.float32)


@dataclasses.dataclass
class Model:
    variables: list
    non_trainable_variables: list


def model_and_optimizer(fill: float | None = None) -> tuple[Model, Model]:
    """The stand-in model (a kernel, a bias, a batch-norm mean) and optimizer (a momentum); `fill`: all values."""
    def value(shape, seed):
        return np.full(shape, fill) if fill is not None else np.random.default_rng(seed).normal(size=shape)

    kernel, bias = Variable("dense/kernel", value((3, 2), 0)), Variable("dense/bias", value((2,), 1))
    mean = Variable("batch_norm/moving_mean", value((2,), 2))
    momentum = Variable("sgd/momentum", value((3, 2), 3))
    return Model([kernel, bias, mean], [mean]), Model([momentum], [])


def write_checkpoint(out, progress: Progress = SAVED, position: InputPosition | None = None):
    """A checkpoint as a one-rank run writes it (no input state; meta.json's "input" from `position`, null when
    None), under out/ckpt; its path."""
    model, optimizer = model_and_optimizer()
    checkpointer = Checkpointer(CheckpointConfig(dir=str(out / "ckpt")), str(out), DistEnv(), "cosmoflow",
                                lambda _m: None, position)
    return checkpointer.save(progress, progress.global_step(STEPS), model, optimizer, None, False)


@pytest.fixture
def checkpoint(tmp_path):
    return write_checkpoint(tmp_path)


def _rewrite(path, edit) -> None:
    meta = json.loads((path / META).read_text())
    edit(meta)
    (path / META).write_text(json.dumps(meta))


def test_the_written_meta_is_read_back(checkpoint):
    meta = check_checkpoint(checkpoint)
    assert Progress(**meta["progress"]) == SAVED and meta["ranks"] == 1 and meta["global_step"] == 10
    assert meta["input"] is None  # the writer gave no input position


def test_the_written_input_position_is_read_back(tmp_path):
    position = InputPosition(loader="dali", seed=5, start_step=4, layout=Layout(**LAYOUT))
    meta = check_checkpoint(write_checkpoint(tmp_path, position=position))
    assert InputPosition(**meta["input"] | {"layout": Layout(**meta["input"]["layout"])}) == position


def test_a_nan_figure_in_the_history_is_a_figure(tmp_path):
    # An evaluation can give NaN; the checkpoint after it must still be read.
    history = [dict(SAVED.history[0], val_loss=math.nan)]
    path = write_checkpoint(tmp_path, dataclasses.replace(SAVED, history=history))
    assert math.isnan(check_checkpoint(path)["progress"]["history"][0]["val_loss"])


EDITS = {  # what was done to meta.json -> (the edit, what the message must say after "<path>/meta.json: ")
    "a files entry that is a list": (lambda m: m["files"].__setitem__("model.npz", [1]),
                                     r"section files.model.npz: expected a mapping for FileDigest, found \[1\]"),
    "an unknown progress key": (lambda m: m["progress"].__setitem__("x", 1),
                                r"section progress: unknown key\(s\) progress.x; valid keys: epoch, step, history"),
    "progress that is a list": (lambda m: m.__setitem__("progress", [1]),
                                r"section progress: expected a mapping for Progress, found \[1\]"),
    "no ranks": (lambda m: m.pop("ranks"), r"the top level: missing key ranks: expected an integer"),
    "ranks that is text": (lambda m: m.__setitem__("ranks", "x"),
                           r"key ranks = 'x': expected an integer in \[-2\^63, 2\^63\)"),
    "a NaN epoch": (lambda m: m["progress"].__setitem__("epoch", math.nan),
                    r"key progress.epoch = nan: expected an integer"),
    "a negative step": (lambda m: m["progress"].__setitem__("step", -1),
                        r"key progress.step = -1: expected an integer >= 0"),
    "an epoch of 2^63": (lambda m: m["progress"].__setitem__("epoch", 2 ** 63),
                         r"key progress.epoch = 9223372036854775808: expected an integer in \[-2\^63, 2\^63\)"),
    "earlier seconds beyond float's range": (
        lambda m: m["progress"].__setitem__("earlier_seconds", 10 ** 400),
        r"key progress.earlier_seconds = 1000.*\.\.\.: expected a finite number"),
    "an infinite partial loss sum": (lambda m: m["progress"]["partial"].__setitem__("loss_sum", math.inf),
                                     r"key progress.partial.loss_sum = inf: expected a finite number$"),
    "a history record without its epoch": (lambda m: m["progress"]["history"][1].pop("epoch"),
                                           r"key progress.history\[1\].epoch = None: expected an integer >= 1"),
    "a history figure that is text": (lambda m: m["progress"]["history"][0].__setitem__("loss", "0.5"),
                                      r"key progress.history\[0\].loss = '0.5': expected an integer .* or a number"),
    "a file outside the directory": (lambda m: m["files"].__setitem__("../../x", {"bytes": 1, "xxh3_128": "0" * 32}),
                                     r"key files = '../../x': expected the names of files in the checkpoint "
                                     r"directory"),
    "a file name too long for the file system": (lambda m: m["files"].__setitem__("x" * 300, {}),
                                                 r"section files.x{77}\.\.\.: missing key"),
    "a file name with a lone surrogate": (lambda m: m["files"].__setitem__("\ud800", {}),
                                          r"section files.'\\ud800': missing key files.'\\ud800'.bytes"),
    "an xxh3 that is no digest": (lambda m: m["files"]["model.npz"].__setitem__("xxh3_128", None),
                                  r"key files.model.npz.xxh3_128 = None: expected a string"),
    "model.npz not listed": (lambda m: m["files"].pop("model.npz"),
                             r"key files = \['rank_00000.npz'\]: expected model.npz, which a checkpoint of 1 "
                             r"rank\(s\) holds"),
    "more ranks than files": (lambda m: m.__setitem__("ranks", 2 ** 62),
                              r"key ranks = 4611686018427387904: expected at most the 2 files listed"),
    "a rank without its variables": (lambda m: m.__setitem__("ranks", 2),
                                     r"key files = .*: expected rank_00001.npz, which a checkpoint of 2 rank\(s\)"),
    "an input state without its files": (lambda m: m.__setitem__("input_state", True),
                                         r"key input_state = True: expected false, as 'files' lists no "
                                         r"input_rank_00000\.\*"),
    "a global step of another directory": (lambda m: m.__setitem__("global_step", 11),
                                           r"key global_step = 11: expected the step of the checkpoint directory "
                                           r"ckpt-000000010"),
    "a variable entry that is a number": (lambda m: m["rank_variables"].__setitem__(0, 5),
                                          r"key rank_variables\[0\] = 5: expected a list of 3"),
    "a negative variable size": (lambda m: m["model_variables"][0][1].__setitem__(0, -3),
                                 r"key model_variables\[0\] = \[-3, 2\]: expected \[name, shape \(sizes >= 0\), "
                                 r"dtype\]"),
    "no input key": (lambda m: m.pop("input"), r"the top level: missing key input"),
    "an unknown loader": (lambda m: m.__setitem__("input", {"loader": "torch", "seed": 1, "start_step": 0,
                                                            "layout": LAYOUT}),
                          r"key input.loader = 'torch': expected one of \['tfdata', 'dali', ''\]"),
}


@pytest.mark.parametrize("damage", sorted(EDITS))
def test_a_damaged_value_is_named_with_its_key(checkpoint, damage):
    edit, message = EDITS[damage]
    _rewrite(checkpoint, edit)
    with pytest.raises(BenchError, match=rf"^{checkpoint / META}: {message}"):
        check_checkpoint(checkpoint)


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000, r"not readable JSON \(nested too deeply\)"),
    ('{"format": "hpc-sciml-checkpoint", "version": 1' + "0" * 5000 + "}", r"not readable JSON \(Exceeds the limit"),
    (b'{"format": "hpc-sciml-checkpoint", "\xff": 1}', r"not readable UTF-8 text \('utf-8' codec can't decode byte 0xff"),
    ("[]", r"the top level: expected a mapping for Meta, found \[\]"),
])
def test_unreadable_json_is_named(checkpoint, text, message):
    (checkpoint / META).write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(BenchError, match=rf"^{checkpoint / META}: {message}"):
        check_checkpoint(checkpoint)


def test_resuming_skips_a_damaged_newest_checkpoint_naming_the_key(tmp_path):
    older = write_checkpoint(tmp_path, dataclasses.replace(SAVED, epoch=2, step=0))
    newest = write_checkpoint(tmp_path)
    _rewrite(newest, lambda m: m["progress"].__setitem__("attempt", 0))
    warnings = []
    assert newest_valid(tmp_path / "ckpt", warn=warnings.append).path == older
    assert warnings == [f"warning: skipping checkpoint {newest.name}: {newest / META}: key progress.attempt = 0: "
                        f"expected an integer >= 1"]


@pytest.mark.parametrize("version", [True, 1.0, "1", None])
def test_a_version_that_only_compares_equal_is_refused(checkpoint, version):
    _rewrite(checkpoint, lambda m: m.__setitem__("version", version))
    with pytest.raises(BenchError, match=rf"^{checkpoint / META}: key version = {version!r}: expected one of \[1\]"):
        check_checkpoint(checkpoint)
