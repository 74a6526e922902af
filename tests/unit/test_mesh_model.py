"""Mesh-TF CosmoFlow equals the Keras model: outputs, MSE loss and every gradient, with the cube split in blocks.

The mesh runs through `cosmoflow.mesh.check`'s cases on 4 virtual CPU devices, in this process: each case's
session makes its own devices (`session_config(cpus=4)`); the 16-device case with oneDNN's ops runs the command
in a process of its own.
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
from cosmoflow.mesh import check
from cosmoflow.mesh.model import (build_mesh_model, keras_weights, lowered_convolutions, lowered_faces, plan_layout,
                                  planned_conv_inputs, pooling_splits)
from tests.conftest import run_cmd, show

SHAPE = (24, 16, 16, 4)
FILTERS = (4, 4, 8, 8)
SPATIAL = ([2, 1], [1, 2], [2, 2])
DEVICES = [f"/cpu:{i}" for i in range(4)]


def mesh_check(*argv) -> list[dict]:
    """The records `python -m cosmoflow.mesh.check --devices N ARGV` writes, computed in this process: each
    case's session splits this process's CPU into N devices of its own (`session_config(cpus=N)`)."""
    args = check.parse_args([str(a) for a in argv])
    records = check.run_cases(args, check.local_devices(args.devices), "", cpus=args.devices)
    return json.loads(json.dumps(records))  # as the command writes them: tuples become lists


# Average pooling where its blocks differ from max pooling's: where the depth split is cropped ([2, 1], [2, 2]);
# its height-only split pools each block as [2, 2] does and splits the batch as max pooling's [1, 2] does.
CASES = [("max", s) for s in SPATIAL] + [("avg", [2, 1]), ("avg", [2, 2])]


@pytest.fixture(scope="module")
def records() -> dict:
    found = []
    for pooling in ("max", "avg"):
        found += mesh_check("--devices", 4, "--spatial", *(f"{d}x{h}" for p, (d, h) in CASES if p == pooling),
                            "--pooling", pooling, "--input-shape", *SHAPE, "--conv-filters", *FILTERS,
                            "--dense-units", 8, 4, "--batch", 4)
    return {(r["pooling"], tuple(r["spatial"])): r for r in found}


@pytest.mark.parametrize("pooling, spatial", CASES)
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


def test_negative_leaky_slope_is_refused():
    cfg = CosmoModelConfig(input_shape=SHAPE, conv_filters=FILTERS, leaky_slope=-0.1, dropout=0.0)
    with pytest.raises(BenchError, match=r"model.leaky_slope -0.1: the mesh model needs a slope >= 0"):
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


# ---------------------------------------------------------------------------- the split, read from the graph
def split_problems(convolutions: list[dict], planned: list[list[int]], devices: int) -> list[str]:
    """What is wrong with the lowered convolutions against the plan: each conv layer must run once on
    every device, each with exactly its planned block (batch share, depth and height blocks plus halos)."""
    problems = []
    for i, shape in enumerate(planned):
        ops = [c for c in convolutions if c["layer"] == f"conv{i + 1}"]
        if len({c["device"] for c in ops}) != devices or len(ops) != devices:
            problems.append(f"conv{i + 1}: {len(ops)} ops on {len({c['device'] for c in ops})} devices, "
                            f"expected one on each of {devices}")
        problems += [f"conv{i + 1} on {c['device']}: input {c['input_shape']}, planned {shape}"
                     for c in ops if c["input_shape"] != shape]
    return problems


SPLIT_SHAPE = (32, 32, 16, 4)  # 4 and 4 blocks of 8, halved by each pooling: merges before conv4
SPLIT_CFG = CosmoModelConfig(input_shape=SPLIT_SHAPE, conv_filters=(4, 4, 8, 8), dense_units=(8, 4), dropout=0.0)


def worker_devices(spatial) -> list[str]:
    """One cluster device per block: the group of a hybrid run with this partitioning."""
    return [f"/job:worker/task:{i}/cpu:0" for i in range(spatial[0] * spatial[1])]


@pytest.fixture(scope="module")
def training_graphs():
    """`training_graphs(spatial)`: the graph the hybrid path trains with (SPLIT_CFG, max pooling, batch 2, each
    device's block from its queue), lowered once per partitioning for every test below that reads it."""
    built = {}

    def graph(spatial):
        if spatial not in built:
            built[spatial] = build_mesh_model(SPLIT_CFG, worker_devices(spatial), spatial, batch_size=2,
                                              training=True, input_queue="train")
        return built[spatial]
    return graph


@pytest.mark.parametrize("spatial", [(2, 1), (1, 2), (2, 2), (4, 1), (4, 4)])
def test_every_split_convolution_runs_on_its_own_device_with_its_block(training_graphs, spatial):
    """Read from the lowered graph itself: each conv layer has one Conv3D per device, on distinct devices,
    whose input is that device's bare block, e.g. [2, 2] on 32^2 x 16: (batch, 16, 16, 16, 4) (the convolution
    pads it itself, 'SAME'); and one Conv2D per neighbouring block on the same device, whose input is that
    neighbour's boundary plane (see the next test). (The graphs fed whole images split the same way: the
    equivalence records below are checked alike.)"""
    cfg, devices, mesh = SPLIT_CFG, worker_devices(spatial), training_graphs(spatial)
    planned = planned_conv_inputs(cfg, spatial, mesh.layout.batch_splits, 2)
    assert planned[0] == [2, 32 // spatial[0], 32 // spatial[1], 16, 4]
    convolutions = lowered_convolutions(mesh.graph)
    import tensorflow as tf
    assert {c["device"] for c in convolutions} == {tf.DeviceSpec.from_string(d).to_string() for d in devices}
    assert split_problems(convolutions, planned, len(devices)) == []


@pytest.mark.parametrize("spatial", [(2, 1), (2, 2), (4, 1), (4, 4)])
def test_each_device_convolves_its_neighbours_boundary_planes_and_nothing_more(training_graphs, spatial):
    """conv1's halo share on each device: one Conv2D per neighbouring block (none beyond the cube's faces), whose
    input is one plane: (batch, height block [+ 2 corner rows when height is split too], width, channels) from a
    depth neighbour, (batch, depth block, width, channels) from a height neighbour."""
    pd, ph = spatial
    devices, mesh = worker_devices(spatial), training_graphs(spatial)
    faces = [f for f in lowered_faces(mesh.graph) if f["layer"] == "conv1"]
    d, h = 32 // pd, 32 // ph
    import tensorflow as tf
    for i, device in enumerate(devices):
        shapes = sorted(f["input_shape"] for f in faces if f["device"] == tf.DeviceSpec.from_string(device).to_string())
        cd, ch = divmod(i, ph)
        expected = ([[2, h + 2 * (ph > 1), 16, 4]] * ((cd > 0) + (cd < pd - 1)) +
                    [[2, d, 16, 4]] * ((ch > 0) + (ch < ph - 1)))
        assert shapes == sorted(expected), (device, shapes, expected)


def test_no_block_op_is_left_to_the_sessions_default_device(training_graphs):
    """An op without a device runs on the session's default task: a reshape of a block left unplaced sent every
    block to the leader and back (382 MB per 128^3 step under [2,1]). Every op that touches blocks, planes or
    their gradients is placed."""
    mesh = training_graphs((2, 2))
    kinds = {"Reshape", "StridedSlice", "ConcatV2", "TensorScatterAdd", "Conv2D", "Conv3D", "Conv2DBackpropInput",
             "Conv2DBackpropFilter", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2"}
    ops = [op for op in mesh.graph.get_operations() if op.type in kinds]
    assert {op.type for op in ops} >= {"TensorScatterAdd", "Conv2D", "Conv2DBackpropInput", "Reshape"}
    assert [op.name for op in ops if not op.device] == []


def test_kernel_5_convolves_whole_halo_planes_and_equals_keras():
    """Another kernel than 3 takes the block-plus-halos convolution (two halo planes each side)."""
    found = mesh_check("--devices", 4, "--spatial", "2x1", "2x2", "--pooling", "avg", "--input-shape", *SPLIT_SHAPE,
                       "--conv-filters", 4, 8, "--dense-units", 8, "--kernel-size", 5, "--batch", 4)
    assert [r["spatial"] for r in found] == [[2, 1], [2, 2]]
    for r in found:
        assert r["outputs"]["rel"] <= 1e-5 and max(g["rel"] for g in r["gradients"]) <= 1e-4, r
        assert split_problems(r["convolutions"], r["planned_conv_inputs"], 4) == []
        assert r["planned_conv_inputs"][0][1] == 32 // r["spatial"][0] + 4 * (r["spatial"][0] > 1)


@pytest.mark.parametrize("rules", ["batch:b", ""])
def test_a_layout_that_splits_nothing_fails_the_split_check(rules):
    """The mutation the equivalence tests cannot see (every device computing the whole cube gives the same
    numbers) is caught here."""
    mesh = build_mesh_model(SPLIT_CFG, worker_devices((2, 2)), (2, 2), batch_size=2, layout_rules=rules)
    planned = planned_conv_inputs(SPLIT_CFG, (2, 2), mesh.layout.batch_splits, 2)
    problems = split_problems(lowered_convolutions(mesh.graph), planned, 4)
    assert any(p.startswith("conv1") for p in problems), problems


def test_a_4x4_split_over_16_devices_equals_keras_and_runs_split(tmp_path):
    """Fugaku's partition: 16 virtual devices, depth and height each in 4 blocks of 8. Seed 0 holds near-ties
    in max-pooling windows, where TensorFlow's MaxPool3DGrad gives the gradient to several values (test
    below); the mesh pools each block with the same op, so it agrees with Keras there too. With oneDNN's ops, as
    training runs (init_distributed sets TF_ENABLE_ONEDNN_OPTS=1, which must be set before TensorFlow is
    imported: hence a process of its own): its max-pooling gradient is rewritten in both graphs alike (the
    other cases run with this machine's default). Max pooling only: average pooling's blocks are the [2, 2]
    cases' (`records`), and the merges of 4 blocks per axis are the same for either kind."""
    out = tmp_path / "diffs.json"
    proc = run_cmd([sys.executable, "-m", "cosmoflow.mesh.check", "--devices", 16, "--spatial", "4x4",
                    "--pooling", "max", "--input-shape", *SPLIT_SHAPE, "--conv-filters", 4, 4, 8, 8,
                    "--dense-units", 8, 4, "--batch", 2, "--seed", 0, "--out", out], timeout=300,
                   env={"TF_ENABLE_ONEDNN_OPTS": "1"})
    assert proc.returncode == 0, show(proc)
    (r,) = json.loads(out.read_text())
    assert r["pooling"] == "max" and r["spatial"] == [4, 4] and r["batch_splits"] == 1 and len(r["devices"]) == 16
    assert r["outputs"]["rel"] <= 1e-5 and r["loss"]["rel"] <= 1e-5, r
    assert max(g["rel"] for g in r["gradients"]) <= 1e-4, r["gradients"]
    assert r["reference"]["loss"] > 1e-3 and min(r["reference"]["gradient_norms"]) > 1e-4
    assert split_problems(r["convolutions"], r["planned_conv_inputs"], 16) == []
    assert r["planned_conv_inputs"][0] == [2, 8, 8, 16, 4]  # the bare block; width whole


def test_tensorflow_max_pool_3d_gradient_reaches_near_ties():
    """TensorFlow 2.18's CPU MaxPool3DGrad gives a window's gradient to both of two values 3e-6 apart (and to
    one only 1e-4 apart). The mesh must pool with this op, as Keras does, or their gradients differ by up to
    5e-2 on data with such near-ties (seed 0 of the 4x4 case); Mesh-TF's own max pooling gives it to the
    maximum alone."""
    import tensorflow as tf
    x = np.full((1, 2, 2, 2, 1), -5.0, np.float32)
    grads = []
    for low in (0.62475574, 0.6246):
        x[0, 0, 0, 0, 0], x[0, 1, 1, 1, 0] = 0.6247587, low
        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            y = tf.nn.max_pool3d(xt, 2, 2, "VALID")
        grads.append(tape.gradient(y, xt).numpy().ravel()[[0, 7]].tolist())
    assert grads == [[1.0, 1.0], [1.0, 0.0]]


@pytest.mark.parametrize("pooling", ["max", "avg"])
def test_the_backward_pass_uses_tensorflows_fused_gradients_on_every_block(training_graphs, pooling):
    """LeakyReLU, the conv layers' bias and pooling get their gradients from TensorFlow's one-tensor ops
    (LeakyReluGrad, BiasAddGrad, MaxPool3DGrad / AvgPool3DGrad) on each device, not from element-wise ops as
    large as the activation or a Sum over four axes."""
    cfg = dataclasses.replace(SPLIT_CFG, pooling=pooling)
    mesh = (training_graphs((2, 2)) if pooling == SPLIT_CFG.pooling else
            build_mesh_model(cfg, worker_devices((2, 2)), (2, 2), batch_size=2, training=True, input_queue="train"))
    ops = mesh.graph.get_operations()
    grad_op = "MaxPool3DGrad" if pooling == "max" else "AvgPool3DGrad"
    pools = [op for op in ops if op.type == grad_op]
    # Every device pools: its blocks (conv1, conv2) and its replica of the merged activation (conv3, conv4).
    assert len(pools) == 4 * len(cfg.conv_filters) and len({op.device for op in pools}) == 4
    relus = [op for op in ops if op.type == "LeakyReluGrad"]
    assert len(relus) >= 4 * len(cfg.conv_filters) and len({op.device for op in relus}) == 4
    assert not [op for op in ops if op.type in ("Equal", "Greater", "LessEqual")]
    # Every conv layer's bias: one BiasAddGrad per batch entry on every device (batch 2).
    bias_sums = [op for op in ops if op.type == "BiasAddGrad"]
    assert len(bias_sums) == 4 * 2 * len(cfg.conv_filters) and len({op.device for op in bias_sums}) == 4


def test_the_equivalence_cases_ran_split(records):
    """The cases whose numbers equal Keras' ran with the blocks planned (outputs and gradients above)."""
    for (pooling, spatial), r in records.items():
        problems = split_problems(r["convolutions"], r["planned_conv_inputs"], len(r["devices"]))
        assert problems == [], (pooling, spatial, problems)


# ---------------------------------------------------------------------------- the input as blocks from queues
@pytest.mark.parametrize("spatial", [(2, 1), (2, 2), (4, 4)])
def test_the_training_graph_takes_each_block_from_its_own_devices_queue(training_graphs, spatial):
    """The graph the hybrid path runs: no whole batch enters it (no placeholder of the images); each
    device dequeues its own block, and every convolution runs split as planned."""
    import tensorflow as tf
    cfg, devices, mesh = SPLIT_CFG, worker_devices(spatial), training_graphs(spatial)
    ops = mesh.graph.get_operations()
    assert mesh.images is None and "targets" in [op.name for op in ops if op.type == "Placeholder"]
    assert not [op for op in ops if op.type == "Placeholder" and op.outputs[0].shape.as_list() == [2, *SPLIT_SHAPE]]
    dequeues = [op for op in ops if op.type == "QueueDequeueV2"]
    block = [2, 32 // spatial[0], 32 // spatial[1], 16, 4]
    assert sorted(op.device for op in dequeues) == sorted(tf.DeviceSpec.from_string(d).to_string() for d in devices)
    assert all(op.outputs[0].shape.as_list() == block for op in dequeues)
    planned = planned_conv_inputs(cfg, spatial, 1, 2)
    assert split_problems(lowered_convolutions(mesh.graph), planned, len(devices)) == []


@pytest.mark.parametrize("spatial", [(2, 1), (2, 2)])
def test_queued_blocks_give_what_whole_images_give(spatial):
    """Fed as blocks through the devices' queues (on an in-process server, as a cluster's ranks do) or as whole
    images split in the graph, the mesh computes the same outputs, loss and gradients, step after step."""
    import tensorflow as tf
    from cosmoflow.mesh.blocks import OwnBlocks
    from cosmoflow.mesh.cluster import session_config, start_server
    from cosmoflow.mesh.groups import sample_block
    from cosmoflow.mesh.hybrid import free_port
    from cosmoflow.model import build_model
    cfg = CosmoModelConfig(input_shape=(16, 16, 16, 4), conv_filters=(4, 8), dense_units=(8,), dropout=0.0,
                           pooling="avg")
    cluster = start_server(0, [f"localhost:{free_port()}"], threads=1)
    parts = spatial[0] * spatial[1]
    devices = [cluster.devices[0]] * parts
    weights = build_model(**dataclasses.asdict(cfg)).get_weights()
    meshes = {q: build_mesh_model(cfg, devices, spatial, 2, input_queue=q) for q in (None, "train")}
    sessions = {q: tf.compat.v1.Session(cluster.target, graph=m.graph, config=session_config(1))
                for q, m in meshes.items()}
    for q, mesh in meshes.items():
        mesh.initialize(sessions[q], weights)
    blocks = OwnBlocks(["train"], {p: (devices[p], sample_block(cfg.input_shape, spatial, p)) for p in range(parts)},
                       cfg.input_shape, 2, cluster.target, session_config(1))
    rng = np.random.default_rng(5)
    for _ in range(2):
        x, y = rng.normal(size=(2, *cfg.input_shape)).astype(np.float32), rng.uniform(-1, 1, (2, 4)).astype(np.float32)
        whole = meshes[None].step(sessions[None], x, y)
        blocks.put_whole("train", x)
        queued = meshes["train"].step(sessions["train"], None, y)
        np.testing.assert_array_equal(queued.outputs, whole.outputs)
        assert queued.loss == whole.loss
        for a, b in zip(queued.gradients, whole.gradients):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(BenchError, match="takes its blocks from the ranks' queues"):
        meshes["train"].predict(sessions["train"], x)
    blocks.close()


def test_queued_blocks_need_one_device_per_block():
    cfg = CosmoModelConfig(input_shape=(16, 16, 16, 4), conv_filters=(4, 8), dense_units=(8,), dropout=0.0)
    with pytest.raises(BenchError, match="queued blocks need one device per block"):
        build_mesh_model(cfg, DEVICES, (2, 1), 2, input_queue="train")
