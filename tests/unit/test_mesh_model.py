"""Mesh-TF CosmoFlow equals the Keras model: outputs, MSE loss and every gradient, with the cube split in blocks.

The mesh runs in a subprocess (`python -m cosmoflow.mesh.check`) on 4 virtual CPU devices: this pytest
process has already initialised TensorFlow's devices, and the device count is fixed at that point.
Input 24x16x16x4 with four conv blocks makes the depth split merge before the third pooling
(blocks of 3) and be cropped at the fourth (3 -> 2, as Keras' 'valid' pooling floors), and the height
split merge before the fourth; [2, 1] and [1, 2] also split the batch over the 2 remaining devices.

Tolerances (relative to the largest magnitude of the Keras tensor): outputs and loss 1e-5, gradients
1e-4 (float32 sums in another order: halos, blocks and batch splits; seen up to 1.1e-5).
"""
import dataclasses
import json
import re
import sys

import numpy as np
import pytest

from common.base.errors import BenchError
from cosmoflow.config import CosmoModelConfig
from cosmoflow.mesh.model import build_mesh_model, keras_weights, plan_layout, pooling_splits
from tests.conftest import run_cmd, show

SHAPE = (24, 16, 16, 4)
FILTERS = (4, 4, 8, 8)
SPATIAL = ([2, 1], [1, 2], [2, 2])
DEVICES = [f"/cpu:{i}" for i in range(4)]


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("mesh") / "diffs.json"
    proc = run_cmd([sys.executable, "-m", "cosmoflow.mesh.check", "--devices", 4,
                    "--spatial", *(f"{d}x{h}" for d, h in SPATIAL), "--pooling", "max", "avg",
                    "--input-shape", *SHAPE, "--conv-filters", *FILTERS, "--dense-units", 8, 4,
                    "--batch", 4, "--out", out], timeout=300)
    assert proc.returncode == 0, show(proc)
    return {(r["pooling"], tuple(r["spatial"])): r for r in json.loads(out.read_text())}


@pytest.mark.parametrize("pooling", ["max", "avg"])
@pytest.mark.parametrize("spatial", SPATIAL)
def test_equals_keras_model(records, pooling, spatial):
    r = records[(pooling, tuple(spatial))]
    assert r["batch_splits"] == 4 // (spatial[0] * spatial[1])
    assert r["outputs"]["rel"] <= 1e-5, r["outputs"]
    assert r["loss"]["rel"] <= 1e-5, r["loss"]
    assert len(r["gradients"]) == 2 * (len(FILTERS) + 3)  # kernel and bias of every conv and dense layer
    for name, grad in zip(r["weights"], r["gradients"]):
        assert grad["rel"] <= 1e-4, (name, grad)
    # The comparison is not vacuous: a real loss and non-zero gradients for every weight.
    assert r["reference"]["loss"] > 1e-3 and r["reference"]["outputs_std"] > 1e-3
    assert min(r["reference"]["gradient_norms"]) > 1e-4


def test_weights_in_keras_order(records):
    names = records[("max", (2, 2))]["weights"]
    layers = [f"conv{i + 1}" for i in range(len(FILTERS))] + ["dense1", "dense2", "output"]
    assert names == [f"{layer}/{kind}" for layer in layers for kind in ("kernel", "bias")]


def test_pooling_merges_splits_that_blocks_cannot_pool():
    # Depth 24 in 2 blocks: 12, 6, then 3 (merged before the 3rd pooling); height 16 in 2: 8, 4, 2, then 1.
    assert pooling_splits(SHAPE, (2, 2), 4, 2) == [(True, True), (True, True), (False, True), (False, False)]
    assert pooling_splits(SHAPE, (1, 2), 4, 2) == [(False, True)] * 3 + [(False, False)]
    assert pooling_splits((32, 32, 32, 4), (4, 1), 3, 2) == [(True, False), (True, False), (True, False)]
    assert pooling_splits((16, 16, 16, 4), (4, 1), 3, 2) == [(True, False), (True, False), (False, False)]


def test_layout_splits_the_batch_over_the_remaining_devices():
    layout = plan_layout(SHAPE, (2, 1), DEVICES, batch_size=4)
    assert layout.batch_splits == 2 and layout.mesh_shape == "b:2;pd:2;ph:1"
    assert plan_layout(SHAPE, (2, 2), DEVICES, batch_size=1).batch_splits == 1


@pytest.mark.parametrize("spatial, devices, batch, message", [
    ((5, 1), 8, 1, "depth 24 (input_shape [24, 16, 16, 4]) is not divisible by 5 partitions"),
    ((1, 3), 8, 1, "height 16 (input_shape [24, 16, 16, 4]) is not divisible by 3 partitions"),
    ((4, 2), 4, 1, "8 partitions need at least 8 devices, got 4"),
    ((2, 2), 6, 1, "6 devices are not divisible by 4 partitions"),
    ((2, 1), 4, 3, "batch size 3 is not divisible by 2 data-parallel splits"),
    ((0, 1), 4, 1, "expected two integers >= 1"),
])
def test_bad_configuration_fails_before_any_work(spatial, devices, batch, message):
    cfg = CosmoModelConfig(input_shape=SHAPE, conv_filters=FILTERS, dense_units=(8, 4), dropout=0.0)
    with pytest.raises(BenchError, match=re.escape(message)):
        build_mesh_model(cfg, [f"/cpu:{i}" for i in range(devices)], spatial, batch)


def test_even_kernel_is_refused():
    cfg = CosmoModelConfig(input_shape=SHAPE, conv_filters=FILTERS, kernel_size=4, dropout=0.0)
    with pytest.raises(BenchError, match="model.kernel_size 4: the mesh model needs an odd kernel size"):
        build_mesh_model(cfg, DEVICES, (2, 2), 1)


def test_weights_must_match_the_mesh_model():
    from cosmoflow.model import build_model
    cfg = CosmoModelConfig(input_shape=(16, 16, 16, 4), conv_filters=(4, 8), dense_units=(8,), dropout=0.0)
    mesh = build_mesh_model(cfg, DEVICES[:2], (2, 1), batch_size=1)
    keras_model = build_model(**dataclasses.asdict(cfg))
    values = keras_weights(keras_model)
    assert [v.shape for v in values] == mesh.weight_shapes
    # The checks run before the session is used, so no session is needed to see them fail.
    with pytest.raises(BenchError, match=r"weight conv2/kernel: shape \(3, 3, 3, 4, 16\) given, expected "
                                         r"\(3, 3, 3, 4, 8\)"):
        other = build_model(**dataclasses.asdict(dataclasses.replace(cfg, conv_filters=(4, 16))))
        mesh.initialize(None, other)
    with pytest.raises(BenchError, match="5 weight arrays given, the mesh model has 8"):
        mesh.initialize(None, values[:5])
    assert all(v.dtype == np.float32 for v in values)


def test_dropout_only_when_training():
    """training=False: dropout is the identity (Keras' inference); training=True: a new random mask per step.

    Runs in this process: both blocks on this process's one CPU device (Mesh-TF places each block's
    ops explicitly, the device may repeat), which is enough to see dropout, not halos.
    """
    import tensorflow as tf
    from cosmoflow.mesh.cluster import session_config
    from cosmoflow.model import build_model
    cfg = CosmoModelConfig(input_shape=(16, 16, 16, 4), conv_filters=(4, 8), dense_units=(16, 8), dropout=0.5)
    keras_model = build_model(**dataclasses.asdict(cfg))
    rng = np.random.default_rng(1)
    images = rng.normal(size=(2, *cfg.input_shape)).astype(np.float32)
    targets = rng.uniform(-1, 1, (2, cfg.target_size)).astype(np.float32)
    expected = keras_model(images, training=False).numpy()
    outputs = {}
    for training in (False, True):
        mesh = build_mesh_model(cfg, ["/cpu:0", "/cpu:0"], (2, 1), batch_size=2, training=training)
        with tf.compat.v1.Session(graph=mesh.graph, config=session_config(1)) as session:
            mesh.initialize(session, keras_model)
            outputs[training] = [mesh.step(session, images, targets).outputs for _ in range(2)]
    np.testing.assert_allclose(outputs[False][0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(outputs[False][0], outputs[False][1])
    assert not np.allclose(outputs[True][0], outputs[True][1])
    assert not np.allclose(outputs[True][0], expected)
