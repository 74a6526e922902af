"""The hybrid path's steps in one process: the same updates as the Keras data-parallel steps.

Both blocks of the mesh sit on this process's one CPU device (Mesh-TF places each block's ops
explicitly; the device may repeat), so the halo exchange and block arithmetic run, without a cluster.
Real processes and Horovod: tests/integration/test_mesh_train.py.
"""
import dataclasses

import numpy as np
import pytest

from common.runtime.dist import DistEnv
from common.runtime.loop import Trainee, data_parallel_steps
from cosmoflow.config import CosmoModelConfig
from cosmoflow.metrics import MeanAbsoluteError, mse_loss
from cosmoflow.mesh.groups import GroupLayout

CFG = CosmoModelConfig(input_shape=(16, 16, 16, 4), conv_filters=(4, 8), dense_units=(8,), dropout=0.0)
BATCH = 2


def _keras(seed=0):
    import keras
    from cosmoflow.model import build_model
    keras.utils.set_random_seed(seed)
    model = build_model(**dataclasses.asdict(CFG))
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    optimizer.build(model.trainable_variables)
    return model, optimizer


@pytest.fixture(scope="module")
def group_mesh():
    import tensorflow as tf
    from cosmoflow.mesh.cluster import session_config
    from cosmoflow.mesh.hybrid import GroupMesh
    from cosmoflow.mesh.model import build_mesh_model
    mesh = build_mesh_model(CFG, ["/cpu:0", "/cpu:0"], (2, 1), BATCH, training=True)
    session = tf.compat.v1.Session(graph=mesh.graph, config=session_config(1))
    session.run(mesh.init_op)
    return GroupMesh(mesh, mesh, {id(mesh): session}, {id(mesh): -1})


def _batches(count, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(BATCH, *CFG.input_shape)).astype(np.float32),
             rng.uniform(-1, 1, (BATCH, CFG.target_size)).astype(np.float32)) for _ in range(count)]


def test_hybrid_steps_train_and_evaluate_as_the_keras_steps(group_mesh):
    from cosmoflow.mesh.hybrid import hybrid_steps, weights_digest
    (model, optimizer), (reference, ref_optimizer) = _keras(), _keras()
    assert weights_digest(model) == weights_digest(reference)
    hybrid = hybrid_steps(Trainee(model, optimizer, mse_loss, MeanAbsoluteError(), None), DistEnv(),
                          layout=GroupLayout(0, 2, (2, 1)), mesh=group_mesh)
    plain = data_parallel_steps(Trainee(reference, ref_optimizer, mse_loss, MeanAbsoluteError(), None), DistEnv())
    losses = []
    for x, y in _batches(3):
        losses.append((hybrid.train(x, y), float(plain.train(x, y))))
        # The mesh holds the updated weights at the next step: evaluation sees them too.
        np.testing.assert_allclose(hybrid.evaluate(x, y).numpy(), plain.evaluate(x, y).numpy(), rtol=1e-4)
    np.testing.assert_allclose(*zip(*losses), rtol=1e-4)
    assert losses[0][0] != losses[-1][0]  # the weights did change
    for mine, theirs in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-6)
    assert group_mesh.loaded[id(group_mesh.train)] == 3  # reloaded after every update, not more


def test_a_rank_without_data_adds_nothing_and_applies_the_sum():
    from cosmoflow.mesh.hybrid import hybrid_steps, weights_digest
    model, optimizer = _keras()
    before = weights_digest(model)
    helper = hybrid_steps(Trainee(model, optimizer, mse_loss, MeanAbsoluteError(), None), DistEnv(),
                          layout=GroupLayout(1, 2, (2, 1)), mesh=None)
    # Alone (one process), the sum over ranks is its own zeros: the update changes nothing.
    assert helper.train(None, None) == 0.0 and weights_digest(model) == before
    np.testing.assert_array_equal(helper.evaluate(None, None).numpy(), np.zeros(2 + 1 + CFG.target_size))
    helper.close()


def test_with_dropout_training_masks_and_evaluation_sees_the_updated_weights_without_masks():
    import tensorflow as tf
    from cosmoflow.mesh.cluster import session_config
    from cosmoflow.mesh.hybrid import GroupMesh, hybrid_steps
    from cosmoflow.mesh.model import build_mesh_model
    cfg = dataclasses.replace(CFG, dropout=0.5)
    meshes = [build_mesh_model(cfg, ["/cpu:0", "/cpu:0"], (2, 1), BATCH, training=t, seed=7) for t in (True, False)]
    sessions = {id(m): tf.compat.v1.Session(graph=m.graph, config=session_config(1)) for m in meshes}
    for m in meshes:
        sessions[id(m)].run(m.init_op)
    group = GroupMesh(meshes[0], meshes[1], sessions, {key: -1 for key in sessions})
    import keras
    from cosmoflow.model import build_model
    keras.utils.set_random_seed(0)
    model = build_model(**dataclasses.asdict(cfg))
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    steps = hybrid_steps(Trainee(model, optimizer, mse_loss, MeanAbsoluteError(), None), DistEnv(), layout=GroupLayout(0, 2, (2, 1)),
                         mesh=group)
    (x, y), = _batches(1)
    # Training applies dropout: the same batch through the training graph gives other outputs. Checked on the
    # initial weights (version 0, what the first step loads): after two updates the outputs can saturate at
    # the output scale (1.2), where dropout changed them by only ~1e-4 in one fresh-clone run.
    outputs = meshes[0].step(group.session(meshes[0], model, 0), x, y).outputs
    inference = np.asarray(model(x, training=False))
    assert np.isfinite(outputs).all() and np.abs(outputs - inference).max() > 1e-3 * np.abs(inference).max()
    masked = [steps.train(x, y) for _ in range(2)]
    assert all(np.isfinite(masked))
    # Evaluation: no masks (Keras inference mode) and the weights of both updates.
    np.testing.assert_allclose(steps.evaluate(x, y).numpy()[1], float(mse_loss(y, model(x, training=False))) * BATCH,
                               rtol=1e-4)
    assert group.loaded == {id(meshes[0]): 1, id(meshes[1]): 2}
    steps.close()
