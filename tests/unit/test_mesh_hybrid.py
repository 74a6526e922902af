"""The hybrid path's steps in one process: the same updates as the Keras data-parallel steps.

Both blocks of the mesh sit on one CPU device of a one-task TensorFlow server in this process (Mesh-TF
places each block's ops explicitly; the device may repeat), so the halo exchange and block arithmetic run,
and the weights and the input reach the mesh as on a cluster: the weights written into the slices and the
blocks put into the devices' queues, by their own sessions on the server.
Real processes and Horovod: tests/integration/test_mesh_train.py.
"""
import dataclasses

import numpy as np
import pytest

from common.base.errors import BenchError
from common.runtime.dist import DistEnv
from common.runtime.loop import Trainee
from common.runtime.strategy import data_parallel_steps
from cosmoflow.config import CosmoModelConfig
from cosmoflow.model import MeanAbsoluteError, mse_loss
from cosmoflow.mesh.groups import GroupLayout
from cosmoflow.mesh.model import keras_weights

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


def _server():
    """A one-task TensorFlow server in this process; the mesh's two blocks share its CPU device."""
    from cosmoflow.mesh.cluster import start_server
    from cosmoflow.mesh.hybrid import free_port
    return start_server(0, [f"localhost:{free_port()}"], threads=1)


@pytest.fixture(scope="module")
def cluster():
    return _server()


def _all_blocks(cluster, names=("train",)):
    """The input of both devices, put by this process (which hosts both): whole batches cut here."""
    from cosmoflow.mesh.blocks import OwnBlocks
    from cosmoflow.mesh.cluster import session_config
    from cosmoflow.mesh.groups import sample_block
    device = cluster.devices[0]
    blocks = OwnBlocks(names, {p: (device, sample_block(CFG.input_shape, (2, 1), p)) for p in (0, 1)},
                       CFG.input_shape, BATCH, cluster.target, session_config(1))
    blocks.put = blocks.put_whole
    return blocks


def _group_mesh(cluster, meshes):
    import tensorflow as tf
    from cosmoflow.mesh.cluster import session_config
    from cosmoflow.mesh.hybrid import GroupMesh
    sessions = {id(m): tf.compat.v1.Session(cluster.target, graph=m.graph, config=session_config(1)) for m in meshes}
    for m in meshes:
        sessions[id(m)].run(m.init_op)
    return GroupMesh(meshes[0], meshes[-1], sessions)


class CountingSlices:
    """OwnSlices for both blocks (both on this process's device), counting the writes."""

    def __init__(self, cluster, mesh):
        from cosmoflow.mesh.cluster import session_config
        from cosmoflow.mesh.slices import OwnSlices
        device = cluster.devices[0]
        self.inner = OwnSlices(mesh.weight_names, mesh.weight_shapes, {0: device, 1: device}, cluster.target,
                               session_config(1))
        self.writes = 0

    def write(self, weights):
        self.writes += 1
        self.inner.write(weights)

    def close(self):
        self.inner.close()


class ResendingSession:
    """A session whose first run fails as TensorFlow's worker fails a request gRPC resent (or with `message`)."""

    def __init__(self, inner, message):
        self.inner, self.message, self.failures = inner, message, 0

    def run(self, *args, **kwargs):
        import tensorflow as tf
        if not self.failures:
            self.failures += 1
            raise tf.errors.AbortedError(None, None, self.message)
        return self.inner.run(*args, **kwargs)


@pytest.mark.parametrize("message, retried", [
    ("From /job:worker/replica:0/task:2:\nThe same RunGraph (Worker) request was received twice. graph_handle", True),
    ("Cleanup 1234", False)])
def test_a_slices_write_refused_as_a_resent_request_is_written_again_and_nothing_else_is(cluster, message, retried):
    """The write assigns the same values whichever copy of the request ran, so only that refusal is retried."""
    import tensorflow as tf
    from cosmoflow.mesh.cluster import session_config
    from cosmoflow.mesh.slices import OwnSlices, slice_name
    slices = OwnSlices(["w"], [(3,)], {5: cluster.devices[0]}, cluster.target, session_config(1))
    session = slices.session
    slices.session = ResendingSession(session, message)
    value = np.array([1.0, 2.0, 3.0], np.float32)
    if not retried:
        with pytest.raises(tf.errors.AbortedError, match="Cleanup 1234"):
            slices.write([value])
        return
    slices.write([value])
    with slices.graph.as_default():
        handle = slices.graph.get_tensor_by_name(f"{slice_name('w', 5)}:0")
        read = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32)
    assert slices.session.failures == 1
    np.testing.assert_array_equal(session.run(read), value)
    session.close()


@pytest.fixture(scope="module")
def group_mesh(cluster):
    from cosmoflow.mesh.model import build_mesh_model
    mesh = build_mesh_model(CFG, [cluster.devices[0]] * 2, (2, 1), BATCH, training=True, input_queue="train")
    return _group_mesh(cluster, [mesh])


def _batches(count, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(BATCH, *CFG.input_shape)).astype(np.float32),
             rng.uniform(-1, 1, (BATCH, CFG.target_size)).astype(np.float32)) for _ in range(count)]


def test_hybrid_steps_train_and_evaluate_as_the_keras_steps(cluster, group_mesh):
    from cosmoflow.mesh.hybrid import hybrid_steps, weights_digest
    (model, optimizer), (reference, ref_optimizer) = _keras(), _keras()
    assert weights_digest(model) == weights_digest(reference)
    slices = CountingSlices(cluster, group_mesh.train)
    hybrid = hybrid_steps(Trainee(model, optimizer, mse_loss, MeanAbsoluteError(), None), DistEnv(),
                          layout=GroupLayout(0, 2, (2, 1)), mesh=group_mesh, slices=slices,
                          blocks=_all_blocks(cluster), queues=("train", "train"))
    plain = data_parallel_steps(Trainee(reference, ref_optimizer, mse_loss, MeanAbsoluteError(), None), DistEnv())
    losses = []
    for x, y in _batches(3):
        losses.append((hybrid.train(x, y), float(plain.train(x, y))))
        # The mesh holds the updated weights at the next step: evaluation sees them too. After updates, float32
        # sums in another order (the halo planes' share added apart) differ by up to 1.1e-4 relative.
        np.testing.assert_allclose(hybrid.evaluate(x, y).numpy(), plain.evaluate(x, y).numpy(), rtol=3e-4)
    np.testing.assert_allclose(*zip(*losses), rtol=1e-4)
    assert losses[0][0] != losses[-1][0]  # the weights did change
    for mine, theirs in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-6)
    assert slices.writes == 4  # the initial weights, then once after each of 3 updates, not at every call


def test_a_rank_that_does_not_drive_queues_its_block_adds_nothing_and_applies_the_sum(group_mesh):
    from cosmoflow.mesh.blocks import OwnBlocks
    from cosmoflow.mesh.cluster import session_config
    from cosmoflow.mesh.groups import sample_block
    from cosmoflow.mesh.hybrid import hybrid_steps, weights_digest
    import tensorflow as tf
    cluster = _server()  # its own: the blocks this test queues are never taken
    model, optimizer = _keras()
    before = weights_digest(model)
    block = sample_block(CFG.input_shape, (2, 1), 1)
    blocks = OwnBlocks(["train"], {1: (cluster.devices[0], block)}, CFG.input_shape, BATCH, cluster.target,
                       session_config(1))
    helper = hybrid_steps(Trainee(model, optimizer, mse_loss, MeanAbsoluteError(), None), DistEnv(),
                          layout=GroupLayout(1, 2, (2, 1)), mesh=None, slices=CountingSlices(cluster, group_mesh.train),
                          blocks=blocks, queues=("train", "train"))
    (x, y), = _batches(1)
    # Alone (one process), the sum over ranks is its own zeros: the update changes nothing.
    assert helper.train(block.cut(x), y) == 0.0 and weights_digest(model) == before
    np.testing.assert_array_equal(helper.evaluate(block.cut(x), y).numpy(), np.zeros(2 + 1 + CFG.target_size))
    # Both blocks wait on device 1's queue for the leader's steps, as they were cut.
    with tf.Graph().as_default():
        from cosmoflow.mesh.blocks import block_queue
        queue = block_queue("train", 1, cluster.devices[0], (BATCH, 8, 16, 16, 4))
        with tf.compat.v1.Session(cluster.target) as session:
            assert session.run(queue.size()) == 2
            np.testing.assert_array_equal(session.run(queue.dequeue()), block.cut(x))
    with pytest.raises(BenchError, match=r"block of shape \(2, 16, 16, 16, 4\) for device 1, expected \(2, 8, 16"):
        blocks.put("train", x)
    helper.close()


def test_with_dropout_training_masks_and_evaluation_sees_the_updated_weights_without_masks(cluster):
    from cosmoflow.mesh.hybrid import hybrid_steps
    from cosmoflow.mesh.model import build_mesh_model
    cfg = dataclasses.replace(CFG, dropout=0.5)
    meshes = [build_mesh_model(cfg, [cluster.devices[0]] * 2, (2, 1), BATCH, training=t, seed=7, input_queue=q)
              for t, q in ((True, "train"), (False, "eval"))]
    group = _group_mesh(cluster, meshes)
    slices = CountingSlices(cluster, meshes[0])
    import keras
    from cosmoflow.model import build_model
    keras.utils.set_random_seed(0)
    model = build_model(**dataclasses.asdict(cfg))
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    blocks = _all_blocks(cluster, ("train", "eval"))
    steps = hybrid_steps(Trainee(model, optimizer, mse_loss, MeanAbsoluteError(), None), DistEnv(),
                         layout=GroupLayout(0, 2, (2, 1)), mesh=group, slices=slices, blocks=blocks,
                         queues=("train", "eval"))
    (x, y), = _batches(1)
    # Training applies dropout: the same batch through the training graph gives other outputs. Checked on the
    # initial weights (what the first step writes): after two updates the outputs can saturate at the output
    # scale (1.2), where dropout changed them by only ~1e-4 in one fresh-clone run.
    slices.write(keras_weights(model))
    blocks.put("train", x)
    outputs = meshes[0].step(group.session(meshes[0]), None, y).outputs
    inference = np.asarray(model(x, training=False))
    assert np.isfinite(outputs).all() and np.abs(outputs - inference).max() > 1e-3 * np.abs(inference).max()
    masked = [steps.train(x, y) for _ in range(2)]
    assert all(np.isfinite(masked))
    # Evaluation: no masks (Keras inference mode) and the weights of both updates.
    np.testing.assert_allclose(steps.evaluate(x, y).numpy()[1], float(mse_loss(y, model(x, training=False))) * BATCH,
                               rtol=1e-4)
    # Both graphs read the same slices (one write per update serves training and evaluation).
    assert slices.writes == 1 + 3
    steps.close()


def test_the_leader_waits_for_each_peers_write_of_the_slices_and_only_for_that():
    import threading
    from cosmoflow.mesh.cluster import session_config
    from cosmoflow.mesh.slices import Handoff
    cluster = _server()  # its own: its queues start empty
    devices = [cluster.devices[0]] * 3  # a group of three whose devices share this process's CPU
    leader = Handoff(0, devices, True, cluster.target, session_config(1))
    peers = [Handoff(p, devices, False, cluster.target, session_config(1)) for p in (1, 2)]
    waited = threading.Event()
    waiting = threading.Thread(target=lambda: (leader(), waited.set()), daemon=True)
    waiting.start()
    peers[0]()
    assert not waited.wait(0.5)  # one peer has written, the other not yet
    peers[1]()
    assert waited.wait(10)
    # One token per write: the leader's wait for the next version needs both peers' next writes again.
    peers[0]()
    waiting = threading.Thread(target=leader, daemon=True)
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive()
    peers[1]()
    waiting.join(10)
    assert not waiting.is_alive()
    for handoff in (leader, *peers):
        handoff.close()


def test_a_group_whose_ranks_hold_different_samples_stops_the_run_naming_its_ranks():
    from cosmoflow.mesh.hybrid import check_group_read_alike, targets_digests
    layout = GroupLayout(0, 4, (2, 1))  # 2 groups of 2 ranks
    batch = np.arange(8, dtype=np.float32).reshape(2, 4) / 10
    swapped = batch[::-1].copy()  # the same samples in another order are other batches for the mesh
    same = sum(targets_digests(batch, rank, 4) for rank in range(4))
    check_group_read_alike(same, layout, step=3)
    assert np.count_nonzero(targets_digests(batch, 2, 4)) == 1
    mixed = sum(targets_digests(b, rank, 4) for rank, b in enumerate([batch, batch, batch, swapped]))
    with pytest.raises(BenchError, match=r"training step 3: the ranks 2\.\.3 of spatial group 1 hold different "
                                         r"samples"):
        check_group_read_alike(mixed, layout, step=3)


class _Exchange:
    """Two ranks' address exchange as Horovod's allgather gives it: rank 0's part scripted, this rank's its own."""

    def __init__(self, rank, others):
        self.rank, self.others, self.sent = rank, list(others), []

    def gather_object(self, address):
        self.sent.append(address)
        other = self.others.pop(0)
        return [other, address] if self.rank == 1 else [address, other]


def test_a_rank_handed_a_port_an_earlier_rank_holds_picks_another_and_all_exchange_again(monkeypatch):
    from cosmoflow.mesh import hybrid
    ports = iter([5000, 5001])
    monkeypatch.setattr(hybrid, "free_port", lambda: next(ports))
    later = _Exchange(1, ["vm:5000", "vm:5000"])  # rank 0 was handed 5000 too, and keeps it
    assert hybrid.distinct_addresses(later, "vm") == ["vm:5000", "vm:5001"]
    assert later.sent == ["vm:5000", "vm:5001"]
    ports = iter([5000])
    earlier = _Exchange(0, ["vm:5000", "vm:5001"])  # the earlier rank keeps its port and exchanges again
    assert hybrid.distinct_addresses(earlier, "vm") == ["vm:5000", "vm:5001"] and earlier.sent == ["vm:5000"] * 2
