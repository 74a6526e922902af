"""`python -m common.export` on real runs: a short CosmoFlow and DeepCAM training with a checkpoint at every epoch's
end, exported to ONNX; the test runs the ONNX file through onnxruntime itself and compares its outputs with those
of the run's model rebuilt here with the checkpoint's weights; a damaged checkpoint is refused."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.campaign.compliance import check_log
from tests.conftest import REPO, run_cmd, show
from tests.integration import cosmo_fixtures
from tests.integration.deepcam_fixtures import checkpointed_run

pytestmark = pytest.mark.slow
CHECKPOINTED = {"every_epochs": 1}  # runs write no checkpoint unless told to
CHECK_LINE = re.compile(r"max abs difference (\S+), relative (\S+) .*: match")


def _train(script: str, config: Path, out: Path) -> None:
    proc = run_cmd([sys.executable, REPO / script, config], timeout=900)
    assert proc.returncode == 1, show(proc)  # the tiny runs cannot reach their targets: exit 1, as planned
    assert check_log(out / "mlperf.log").only_target_failed  # the checker's verdict: the target, nothing else


@pytest.fixture(scope="module")
def cosmo_run(cosmo_dataset, tmp_path_factory) -> Path:
    root, data = tmp_path_factory.mktemp("export-cosmo"), cosmo_dataset
    out = root / "run"
    _train("cosmoflow/train.py", cosmo_fixtures.write_config(root / "c.yaml", data, out, checkpoint=CHECKPOINTED), out)
    return out


@pytest.fixture(scope="module")
def deepcam_run(tmp_path_factory) -> Path:
    """The 3-epoch DeepCAM run test_deepcam_e2e.py resumes (deepcam_fixtures.checkpointed_run): read only."""
    return checkpointed_run(tmp_path_factory)[0]


def export(run: Path, out: Path, *extra) -> subprocess.CompletedProcess:
    return run_cmd([sys.executable, "-m", "common.export", run, "--format", "onnx", "--out", out, *extra])


def newest_checkpoint(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("ckpt-*"))[-1]


def checkpoint_model(run: Path, checkpoint: Path):
    """The run's model (its application's builder, the run's saved config) with the checkpoint's model.npz
    arrays assigned by the variable paths meta.json lists, float32, in inference mode."""
    import json
    import keras
    from common.export import app_for
    from common.runtime.config import load_config
    meta = json.loads((checkpoint / "meta.json").read_text())
    app = app_for(meta["benchmark"])
    keras.mixed_precision.set_global_policy("float32")
    model = app.build_model(load_config(run / "config.yaml", (), app.config_schema()))
    index = {name: i for i, (name, _, _) in reversed(list(enumerate(meta["model_variables"])))}  # first wins
    with np.load(checkpoint / "model.npz") as arrays:
        for var in model.variables:
            var.assign(arrays[f"v{index[var.path]:05d}"])
    return model


def assert_onnx_gives_the_checkpoint_models_outputs(onnx_path: Path, run: Path, checkpoint: Path) -> None:
    """Seeded inputs of the model's shape through onnxruntime and through the checkpoint's Keras model: the same
    outputs to float32 rounding (and not trivially: the outputs differ between inputs)."""
    import onnxruntime
    model = checkpoint_model(run, checkpoint)
    x = np.random.default_rng(3).normal(size=(3, *model.input_shape[1:])).astype(np.float32)
    expected = np.asarray(model(x, training=False), dtype=np.float32)
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    assert got.shape == expected.shape and not np.allclose(expected[0], expected[1])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(expected).max())))


def assert_carries_the_checkpoint_weights(onnx_path: Path, checkpoint: Path, variable: str) -> None:
    """The ONNX file holds `variable` (a model variable's path in meta.json) with the checkpoint's values, in
    whatever layout ONNX wants (a transposed convolution's kernel is (in, out, kh, kw) there)."""
    import json
    import onnx
    from onnx import numpy_helper
    listed = [v[0] for v in json.loads((checkpoint / "meta.json").read_text())["model_variables"]]
    with np.load(checkpoint / "model.npz") as arrays:
        expected = np.sort(arrays[f"v{listed.index(variable):05d}"], axis=None)
    initializers = [numpy_helper.to_array(t) for t in onnx.load(str(onnx_path)).graph.initializer]
    assert any(a.size == expected.size and np.array_equal(np.sort(a, axis=None), expected) for a in initializers), \
        variable


@pytest.mark.parametrize("benchmark,variable", [("cosmoflow", "output/kernel"),
                                                ("deepcam", "logits/kernel")])
def test_a_trained_run_exports_to_onnx_that_matches_keras(benchmark, variable, request, tmp_path):
    run = request.getfixturevalue("cosmo_run" if benchmark == "cosmoflow" else "deepcam_run")
    out = tmp_path / "model.onnx"
    proc = export(run, out, "--check", "--samples", "4")
    assert proc.returncode == 0, show(proc)
    assert out.is_file() and out.stat().st_size > 0 and not list(tmp_path.glob(".*tmp*"))
    checkpoint = newest_checkpoint(run)
    assert f"{benchmark}: checkpoint {checkpoint}" in proc.stdout and "MiB" in proc.stdout
    assert CHECK_LINE.search(proc.stdout) and "check on 4 validation samples" in proc.stdout, proc.stdout
    assert_onnx_gives_the_checkpoint_models_outputs(out, run, checkpoint)
    assert_carries_the_checkpoint_weights(out, checkpoint, variable)


def test_a_damaged_model_npz_is_refused_naming_the_file(cosmo_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(cosmo_run, run)
    damaged = newest_checkpoint(run) / "model.npz"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    out = tmp_path / "model.onnx"
    proc = export(run, out)
    message = proc.stderr.replace("\n  ", " ")
    assert proc.returncode == 2, show(proc)
    assert f"{damaged}: xxh3_128" in message and "the file is corrupt" in message
    assert "--checkpoint" in message and not out.exists()  # an older checkpoint is offered; nothing written
