"""benchmarks/jax_step.py under Keras' JAX backend, in an environment that has no TensorFlow (.venv-jax, built from
benchmarks/requirements-jax.txt on first use): the model files train there, as issue 49's GPU run needs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import jax_step  # noqa: E402  (scripts beside the benchmarks, not a package)
from harness import pinned_venv, read_pins  # noqa: E402


@pytest.fixture(scope="module")
def jax_python():
    return pinned_venv(REPO / ".venv-jax", read_pins(REPO / "benchmarks/requirements-jax.txt"), "the JAX environment")


def test_both_models_train_under_jax_without_tensorflow_and_match_the_tensorflow_parameter_counts(jax_python,
                                                                                                 tmp_path):
    probe = subprocess.run([str(jax_python), "-c", "import importlib.util as u; print(u.find_spec('tensorflow'))"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "None"
    out = tmp_path / "jax_step.json"
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([str(jax_python), str(REPO / "benchmarks/jax_step.py"), "--tiny", "--steps", "2",
                           "--warmup", "0", "--out", str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"]["platform"] == "cpu" and result["tiny"] is True
    got = [(c["app"], c["batch"], c["precision"]) for c in result["cases"]]
    assert got == [(c.app, c.batch, c.precision) for c in jax_step.cases()]
    for case in result["cases"]:
        assert len(case["step_seconds"]) == 2 and case["median_step_s"] > 0, case
        assert case["last_loss"] == case["last_loss"] and case["last_loss"] >= 0, case
    assert {c["parameters"] for c in result["cases"] if c["app"] == "cosmoflow"} == {tensorflow_count("cosmoflow")}
    assert {c["parameters"] for c in result["cases"] if c["app"] == "deepcam"} == {tensorflow_count("deepcam")}
    assert "| deepcam | mixed_bfloat16 | 8 |" in proc.stdout


def tensorflow_count(app: str) -> int:
    """The same tiny network's parameter count built by this (TensorFlow) environment's Keras."""
    model, _, _ = jax_step.build(app, tiny=True)
    return model.count_params()
