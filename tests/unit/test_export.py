"""common/export.py on tiny inputs: the refusals (exit code 2 with the facts) and the Keras-ONNX comparison."""
import numpy as np
import pytest

from common.base.errors import BenchError
from common.export import TOLERANCE, check, compare, export_onnx, load_weights, main


def _run(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err.replace("\n  ", " ")  # unwrapped (guarded() wraps at 110 columns)


def test_a_missing_run_directory_is_refused(tmp_path, capsys):
    code, err = _run(capsys, tmp_path / "nope", "--format", "onnx", "--out", tmp_path / "m.onnx")
    assert code == 2 and "nope: no such run directory" in err


def test_a_directory_without_config_is_not_a_run(tmp_path, capsys):
    code, err = _run(capsys, tmp_path, "--out", tmp_path / "m.onnx")
    assert code == 2 and "config.yaml: missing" in err


def test_a_run_without_checkpoint_says_how_to_train_with_one(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("run:\n  name: x\n")
    code, err = _run(capsys, tmp_path, "--format", "onnx", "--out", tmp_path / "m.onnx")
    assert code == 2 and "no checkpoint" in err and "checkpoint.every_epochs=1" in err
    assert str(tmp_path / "checkpoints") in err


def test_the_checkpoint_directory_of_the_config_is_searched(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text(f"checkpoint:\n  dir: {tmp_path / 'elsewhere'}\n")
    code, err = _run(capsys, tmp_path, "--out", tmp_path / "m.onnx")
    assert code == 2 and "elsewhere: no checkpoint" in err


def test_an_unfinished_checkpoint_is_refused(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("run:\n  name: x\n")
    (tmp_path / "checkpoints/ckpt-000000004").mkdir(parents=True)
    code, err = _run(capsys, tmp_path, "--out", tmp_path / "m.onnx")
    assert code == 2 and "meta.json: missing" in err


@pytest.mark.parametrize("argv,message", [(["--format", "tflite"], "--format 'tflite': expected one of onnx"),
                                          (["--samples", "0"], "--samples 0"),
                                          (["--tolerance", "0"], "--tolerance 0.0")])
def test_bad_options_are_refused_before_anything_is_read(tmp_path, capsys, argv, message):
    code, err = _run(capsys, tmp_path / "nope", "--out", tmp_path / "m.onnx", *argv)
    assert code == 2 and message in err


def test_identical_outputs_match():
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    result = compare(x, x.copy())
    assert result.ok and result.max_abs == 0.0 and result.relative == 0.0


def test_a_difference_within_the_tolerance_of_the_output_scale_matches():
    x = np.array([[10.0, -20.0], [5.0, 0.0]], np.float32)
    result = compare(x, x + np.float32(20.0 * TOLERANCE / 2))
    assert result.ok and result.scale == 20.0 and result.relative == pytest.approx(TOLERANCE / 2, rel=1e-3)


def test_a_difference_beyond_the_tolerance_fails_and_says_so():
    x = np.array([[1.0, -2.0], [0.5, 0.0]], np.float32)
    y = x.copy()
    y[1, 0] += 3 * 2.0 * TOLERANCE
    result = compare(x, y)
    assert not result.ok and result.relative == pytest.approx(3 * TOLERANCE, rel=1e-3)
    assert "DIFFER" in result.describe()


def test_nan_outputs_fail():
    x = np.ones((2, 2), np.float32)
    assert not compare(x, np.full_like(x, np.nan)).ok


def test_outputs_of_another_shape_are_an_error():
    with pytest.raises(BenchError, match=r"shape \[2, 3\], Keras \[3, 2\]"):
        compare(np.zeros((3, 2)), np.zeros((2, 3)))


def test_weights_of_another_shape_are_refused_naming_the_file(tmp_path):
    import keras
    path = tmp_path / "model.npz"
    np.savez(path, v00000=np.zeros((2, 3), np.float32))
    variables = [keras.Variable(np.zeros((3, 2), np.float32), name="kernel")]
    with pytest.raises(BenchError, match=r"model.npz: variable 0 \(dense/kernel\) has shape \[2, 3\]"):
        load_weights(path, variables, [["dense/kernel", [2, 3], "float32"]])


def test_weights_are_assigned_in_order(tmp_path):
    import keras
    path = tmp_path / "model.npz"
    np.savez(path, v00000=np.full((2,), 3.0, np.float32), v00001=np.zeros((1,), np.float32))  # v00001: optimizer
    variables = [keras.Variable(np.zeros((2,), np.float32))]
    load_weights(path, variables, [["a", [2], "float32"], ["opt", [1], "float32"]])
    assert np.array_equal(np.asarray(variables[0]), [3.0, 3.0])


def test_an_unreadable_archive_is_refused_naming_the_file(tmp_path):
    import keras
    path = tmp_path / "model.npz"
    path.write_bytes(b"not a zip file")
    with pytest.raises(BenchError, match="model.npz: not a readable checkpoint archive"):
        load_weights(path, [keras.Variable(np.zeros((2,), np.float32))], [["a", [2], "float32"]])


def test_export_into_a_missing_directory_is_refused(tmp_path):
    with pytest.raises(BenchError, match="does not exist"):
        export_onnx(object(), tmp_path / "no/model.onnx")


class _Model:
    def predict_on_batch(self, x):
        return x * 2


class _Session:
    def __init__(self, offset: float):
        self.offset = offset

    def get_inputs(self):
        return [type("Input", (), {"name": "x"})]

    def run(self, _names, feeds):
        return [feeds["x"] * 2 + self.offset]


@pytest.mark.parametrize("offset,ok", [(0.0, True), (1e-3, False)])
def test_check_compares_the_two_runtimes_and_reports_the_difference_and_times(capsys, offset, ok):
    x = np.ones((2, 3), np.float32)
    assert check(_Model(), _Session(offset), x, TOLERANCE, repeats=1).ok is ok
    out = capsys.readouterr().out
    assert "check on 2 validation samples [2, 3]: max abs difference" in out
    assert ("match" if ok else "DIFFER") in out and "onnxruntime" in out and "Keras" in out
