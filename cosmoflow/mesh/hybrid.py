"""Training CosmoFlow with the hybrid (data x spatial) Mesh-TF path: parallel.spatial = [pd, ph], pd * ph > 1.

P = pd * ph consecutive ranks form a group (cosmoflow/mesh/groups.py). Each group starts its own
TensorFlow cluster, one `tf.distribute.Server` per rank, from "host:port" addresses exchanged over
Horovod. Every rank of a group reads the group's shard of the data in the same order but decodes only its
own block of every sample, which it queues on its own device (cosmoflow/mesh/blocks.py); the group's
leader runs the Mesh-TF CosmoFlow over the group's P devices in a `tf.compat.v1.Session`, each device
taking its block from its queue, and feeds only the targets; the other ranks' servers do their blocks'
work. Every rank keeps the Keras model and optimizer: after each step the
leaders' gradients (zeros from the other ranks) are summed over all ranks in one Horovod allreduce and
divided by the number of groups, and every rank applies the same SGD update, so the weights stay
identical everywhere; each rank then writes them into the mesh's copy on its own device
(cosmoflow/mesh/slices.py) and tells the leader so through the group's cluster (`Handoff`), which the leader
waits for before its next step reads them. Evaluation runs the
mesh's forward pass on the leaders' validation shards; the metric is summed over ranks as usual.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import socket
from pathlib import Path
from typing import Any, Callable

import numpy as np

from common.base.errors import BenchError
from common.runtime.dist import DistEnv, StopRequests
from common.runtime.loop import Steps, Trainee
from common.runtime.strategy import DataParallel, PhaseClock, StepsFactory, batch_sums
from cosmoflow.mesh.groups import SampleBlock
from cosmoflow.mesh.blocks import OwnBlocks
from cosmoflow.mesh.cluster import MeshCluster, exchange_addresses, session_config, start_server
from cosmoflow.mesh.groups import GroupLayout, data_view, group_layout, sample_block
from cosmoflow.mesh.slices import Handoff, OwnSlices


class HybridStrategy(DataParallel):
    """parallel.spatial = [pd, ph], pd * ph > 1: groups of pd * ph ranks each train one replica through Mesh-TF."""

    name = "hybrid"

    def __init__(self, cfg: Any, dist: DistEnv):
        check_hybrid(cfg, dist.size)
        super().__init__(dist)
        self.layout = group_layout(dist.rank, dist.size, cfg.parallel.spatial)
        self.block = sample_block(cfg.model.input_shape, self.layout.spatial, self.layout.task)
        self.queues = queue_names(cfg.model.dropout)
        self.sample_shape, self.batch = tuple(cfg.model.input_shape), cfg.train.local_batch_size
        self.mesh: GroupMesh | None = None
        self.cluster: MeshCluster | None = None

    @property
    def replicas(self) -> int:
        return self.layout.groups

    @property
    def input_dist(self) -> DistEnv:
        """A group's ranks read as one: rank = group, size = groups (each then decodes its `block`)."""
        return data_view(self.dist, self.layout)

    @property
    def input_block(self) -> SampleBlock:
        """The block of every sample this rank decodes and hands to the mesh."""
        return self.block

    @property
    def saves_input_position(self) -> bool:
        return False  # the mesh path's steps do not save the input position: a resume reseeds the input

    def model_seed(self, seed: int) -> int:
        return seed + self.layout.group

    def prepare(self, cfg: Any) -> None:
        """The group's TensorFlow cluster and, on its leader, the Mesh-TF graphs (collective)."""
        self.cluster = cluster = start_group_cluster(self.dist, self.layout)
        self.mesh = GroupMesh.build(cfg, self.layout, cluster, self.dist.threads) if self.layout.is_leader else None
        layout = self.layout
        if self.dist.is_root:
            print(f"hybrid data x spatial: {layout.groups} data-parallel groups of {layout.group_size} ranks, each "
                  f"sample split {layout.name} (depth x height); rank r is task r % {layout.group_size} of group "
                  f"r // {layout.group_size}, whose first rank reads and drives the mesh", flush=True)

    @property
    def make_steps(self) -> StepsFactory:
        def make(trainee: Trainee, dist: DistEnv, stop: StopRequests | None = None) -> Steps:
            slices = own_slices(trainee.model, self.cluster, dist.threads)
            if self.mesh is not None and self.mesh.train.weight_names != slices.names:
                raise BenchError(f"the Keras model's weights {slices.names} are not the mesh's "
                                 f"{self.mesh.train.weight_names}: the slices every rank writes would not be the "
                                 f"ones the mesh reads")
            blocks = OwnBlocks(sorted(set(self.queues)), {self.cluster.rank: (self.cluster.own_device, self.block)},
                               self.sample_shape, self.batch, self.cluster.target, self.cluster.own_config(dist.threads))
            return hybrid_steps(trainee, dist, stop, layout=self.layout, mesh=self.mesh, slices=slices,
                                blocks=blocks, queues=self.queues, handoff=handoff(self.cluster, self.layout))
        return make

    def mlperf_keys(self) -> dict:
        """The partitioning, logged beside the usual hyperparameters."""
        return {"spatial_partitions": self.layout.name, "data_parallel_groups": self.layout.groups}

    def summary(self, trainee: Trainee) -> dict:
        return hybrid_summary(trainee.model, self.layout, self.dist)


def queue_names(dropout: float) -> tuple[str, str]:
    """The input queues of the training and the evaluation graph (without dropout one graph serves both)."""
    return ("train", "eval") if dropout > 0 else ("train", "train")


def check_hybrid(cfg: Any, size: int) -> None:
    """Every check of a hybrid run that needs no data: the cube's split (the mesh planner's own checks),
    whole groups of ranks, and the data options the path supports. Raises BenchError."""
    from cosmoflow.mesh.model import check_partitioning  # imports TensorFlow and Mesh-TF
    check_partitioning(cfg.model, cfg.parallel.spatial)
    group_layout(0, size, cfg.parallel.spatial)
    if cfg.data.stage_dir and cfg.data.stage_mode == "node_share":
        raise BenchError(f"data.stage_mode node_share with parallel.spatial {list(cfg.parallel.spatial)}: a "
                         f"group's ranks read the group's files in the same order, which node_share's division "
                         f"between a node's ranks does not give; use data.stage_mode node or rank")
    check_block_records(cfg.data, tuple(cfg.parallel.spatial))
    if cfg.train.precision not in ("float32", "auto") or cfg.train.jit_compile:  # auto: float32 here
        raise BenchError(f"train.precision={cfg.train.precision}, train.jit_compile={cfg.train.jit_compile} with "
                         f"parallel.spatial {list(cfg.parallel.spatial)}: the Mesh-TF path computes in float32 "
                         f"graphs of its own; use train.precision=float32 and train.jit_compile=false")


def check_block_records(data: Any, spatial: tuple[int, int]) -> None:
    """data.blocks=records: every block's records must be there (python -m data_prep cosmo-blocks), and read in
    place (staging copies the whole records only). Raises BenchError."""
    if data.blocks != "records":
        return
    from common.io.formats.cosmoflow_blocks import block_dir, blocks_dir_name
    from common.io.manifest import MANIFEST_NAME
    if data.stage_dir:
        raise BenchError(f"data.blocks=records with data.stage_dir {data.stage_dir!r}: staging copies the whole "
                         f"records, not the per-block ones; read the blocks in place (no data.stage_dir) or set "
                         f"data.blocks=auto to cut blocks from the staged whole records")
    root = Path(data.dir) / blocks_dir_name(spatial)
    missing = [f"{i}_{j}" for i in range(spatial[0]) for j in range(spatial[1])
               if not (block_dir(data.dir, spatial, i, j) / MANIFEST_NAME).is_file()]
    if missing:
        raise BenchError(f"data.blocks=records: {root} lacks the blocks {missing} of parallel.spatial "
                         f"{list(spatial)}; write them with `python -m data_prep cosmo-blocks --data {data.dir} "
                         f"--spatial {spatial[0]}x{spatial[1]}`")


# ---------------------------------------------------------------------------- the group's cluster and mesh
def start_group_cluster(dist: DistEnv, layout: GroupLayout) -> MeshCluster:
    """This rank's TensorFlow server in its group's cluster (collective: addresses go through Horovod)."""
    # horovodrun tells each rank the host name it launched it on; other launchers: this host's name.
    host = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
    addresses = distinct_addresses(dist, host)
    return start_server(layout.task, addresses[layout.leader:layout.leader + layout.group_size], dist.threads)


def own_slices(model: Any, cluster: MeshCluster, threads: int) -> OwnSlices:
    """This rank's slices of the Keras model's weights (Mesh-TF names them by the Keras layer and weight:
    "conv1/kernel"), on its own device, written through its own server."""
    weights = model.trainable_weights
    return OwnSlices([w.path for w in weights], [tuple(w.shape) for w in weights],
                     {cluster.rank: cluster.own_device}, cluster.target, cluster.own_config(threads))


def handoff(cluster: MeshCluster, layout: GroupLayout) -> Handoff:
    """The wait after each write of the slices: the leader's session reaches its peers' devices, the others' only
    their own."""
    config = session_config(1) if layout.is_leader else cluster.own_config(1)
    return Handoff(cluster.rank, cluster.devices, layout.is_leader, cluster.target, config)


def distinct_addresses(dist: Any, host: str, tries: int = 5) -> list[str]:
    """Every rank's "host:port" in rank order (collective), each rank's port one the OS handed it. Two ranks of a
    node can be handed the same port, as each releases its own for its server: then the later rank picks again,
    and all exchange again, up to `tries` times (a clash left is named by `start_server`)."""
    port = free_port()
    addresses = exchange_addresses(dist, host, port)
    for _ in range(tries - 1):
        if len(set(addresses)) == len(addresses):
            break
        if addresses[dist.rank] in addresses[:dist.rank]:
            port = free_port()
        addresses = exchange_addresses(dist, host, port)
    return addresses


def free_port() -> int:
    """A port the OS has just handed out (released again for the TensorFlow server to bind)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class GroupMesh:
    """The leader's Mesh-TF CosmoFlow on its group's devices: graphs, sessions and which weights they hold."""

    train: Any  # MeshCosmoFlow with dropout
    evaluate: Any  # MeshCosmoFlow without dropout (the training one when there is no dropout)
    sessions: dict  # id(mesh) -> tf.compat.v1.Session on the group's cluster

    @classmethod
    def build(cls, cfg: Any, layout: GroupLayout, cluster: MeshCluster, threads: int) -> "GroupMesh":
        import tensorflow as tf
        from cosmoflow.mesh.model import build_mesh_model
        make = functools.partial(build_mesh_model, cfg.model, cluster.devices, layout.spatial,
                                 cfg.train.local_batch_size, seed=cfg.run.seed + layout.group)
        train_queue, eval_queue = queue_names(cfg.model.dropout)
        train = make(training=True, input_queue=train_queue)
        evaluate = make(training=False, input_queue=eval_queue) if eval_queue != train_queue else train
        sessions = {}
        for mesh in {id(train): train, id(evaluate): evaluate}.values():
            sessions[id(mesh)] = tf.compat.v1.Session(cluster.target, graph=mesh.graph, config=session_config(threads))
            sessions[id(mesh)].run(mesh.init_op)
        return cls(train, evaluate, sessions)

    def session(self, mesh: Any) -> Any:
        """`mesh`'s session (the weights it reads are the slices every rank writes: `OwnSlices`)."""
        return self.sessions[id(mesh)]

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()


# ---------------------------------------------------------------------------- steps
def hybrid_steps(trainee: Trainee, dist: DistEnv, stop: StopRequests | None = None, *, layout: GroupLayout,
                 mesh: GroupMesh | None, slices: OwnSlices, blocks: OwnBlocks, queues: tuple[str, str],
                 handoff: Handoff | None = None) -> Steps:
    """The loop's steps on the hybrid path (`mesh` on the leaders, None on the other ranks; `slices` this
    rank's copy of the weights in the mesh, `blocks` its input's way there through the training and
    evaluation `queues`, `handoff` the wait for the group's writes of the slices, None in a one-process
    mesh); the stop request rides in the gradients' sum."""
    runner = _HybridSteps(trainee.model, trainee.optimizer, trainee.loss, trainee.metric, dist, layout, mesh)
    runner.stop, runner.slices, runner.blocks, runner.queues, runner.handoff = stop, slices, blocks, queues, handoff
    return Steps(train=runner.train, evaluate=runner.evaluate, close=runner.close, stop=stop, clock=runner.clock)


class _HybridSteps:
    def __init__(self, model, optimizer, loss_fn, metric: Any, dist: DistEnv, layout: GroupLayout,
                 mesh: GroupMesh | None):
        import tensorflow as tf
        self.model, self.loss_fn, self.metric, self.dist, self.layout, self.mesh = (
            model, loss_fn, metric, dist, layout, mesh)
        self.version = 0  # bumped by every update: the slices are written again when they are behind
        self.written = -1  # the version the slices hold
        self.stop: StopRequests | None = None
        self.slices: OwnSlices | None = None
        self.blocks: OwnBlocks | None = None
        self.handoff: Handoff | None = None
        self.queues = ("train", "train")
        variables = model.trainable_variables
        self.apply = tf.function(lambda grads: optimizer.apply_gradients(zip(grads, variables)))
        self.penalty = tf.function(lambda: _penalty_gradients(model)) if model.losses else None
        # What a rank that does not drive the mesh contributes: no gradient, and an empty batch to evaluate.
        self.no_gradients = [np.zeros(v.shape, np.float32) for v in variables]
        self.no_targets = np.zeros((0, model.output_shape[-1]), np.float32)
        # Training steps' seconds by phase: the slices' write and handoff, queueing the block, the mesh step
        # (the leader; the others' wait is in the allreduce), the allreduce, the update.
        self.clock = PhaseClock(("sync", "put", "mesh", "allreduce", "update"))

    def train(self, x, y) -> float:
        """One step: the group's gradients through the mesh, their mean over the groups, the same update everywhere."""
        import tensorflow as tf
        self.clock.start()
        self.sync()
        self.clock.lap("sync")
        self.blocks.put(self.queues[0], x)  # this rank's block, on its own device for the leader's step
        self.clock.lap("put")
        if self.mesh is not None:
            session = self.mesh.session(self.mesh.train)
            result = self.mesh.train.step(session, None, np.asarray(y))
            grads, loss = result.gradients, result.loss
        else:
            grads, loss = self.no_gradients, 0.0
        self.clock.lap("mesh")
        # Summed over every rank = summed over the groups (the other ranks add zeros); the stop requests too.
        # When the layout's ranks are the job's processes, each one's digest of its batch's targets rides along:
        # a group whose ranks read different samples would train on blocks of different cubes, so it stops the
        # run (`check_group_read_alike`). (A one-process mesh has one reader: nothing to compare.)
        flags = [self.stop.local.read_value()] if self.stop is not None else []
        checked = self.dist.size == self.layout.size > 1
        digests = [tf.constant(targets_digests(y, self.layout.rank, self.layout.size))] if checked else []
        summed = self.dist.sum_grouped([tf.constant(g) for g in grads] + [tf.constant(loss, tf.float32)] + digests
                                       + flags)
        self.clock.lap("allreduce")
        sums, loss_sum = summed[:len(grads)], summed[len(grads)]
        if checked:
            check_group_read_alike(np.asarray(summed[len(grads) + 1]), self.layout, self.version)
        if flags:
            self.stop.agreed.assign(summed[-1])
        groups = float(self.layout.groups)
        grads, loss = [g / groups for g in sums], float(loss_sum) / groups
        if self.penalty is not None:  # the L2 weight decay: the same on every rank, so added after the mean
            penalty, penalty_grads = self.penalty()
            grads, loss = [g + p for g, p in zip(grads, penalty_grads)], loss + float(penalty)
        self.apply(grads)
        self.version += 1
        self.clock.lap("update")
        return loss

    def evaluate(self, x, y):
        """This rank's [count, loss sum, metric sums ...] of one validation batch (zeros off the leaders)."""
        self.sync()
        self.blocks.put(self.queues[1], x)
        if self.mesh is None:
            return batch_sums(self.loss_fn, self.metric, self.no_targets, self.no_targets)
        session = self.mesh.session(self.mesh.evaluate)
        return batch_sums(self.loss_fn, self.metric, np.asarray(y), self.mesh.evaluate.predict(session, None))

    def sync(self) -> None:
        """After an update (every rank of a group calls it at the same steps): write this rank's slices of the
        new weights; the leader then waits for its peers' writes, which its next mesh step reads. (Their next
        writes wait for the gradients' allreduce, which waits for the leader's step: no write under a read.)"""
        if self.written == self.version:
            return
        from cosmoflow.mesh.model import keras_weights
        self.slices.write(keras_weights(self.model))
        self.written = self.version
        if self.handoff is not None:
            self.handoff()

    def close(self) -> None:
        if self.mesh is not None:
            self.mesh.close()
        for own in (self.slices, self.blocks, self.handoff):
            if own is not None:
                own.close()


def targets_digests(targets, rank: int, size: int) -> np.ndarray:
    """(size,) float32 (the dtype of the allreduce it rides in): zeros but at `rank`, this rank's digest of its
    batch's targets (a weighted sum that equal batches give bit for bit and different ones almost never do).
    Summed over the ranks, it holds every rank's digest exactly."""
    y = np.asarray(targets, np.float64).ravel()
    digests = np.zeros(size, np.float32)
    digests[rank] = np.float32(np.dot(y, 1.0 + np.sqrt(np.arange(y.size, dtype=np.float64) + 2.0)))
    return digests


def check_group_read_alike(digests: np.ndarray, layout: GroupLayout, step: int) -> None:
    """Raise BenchError unless every group's ranks held the same targets (`targets_digests` summed over the
    job's ranks; rank r is task r % group_size of group r // group_size)."""
    per_group = np.asarray(digests).reshape(layout.groups, layout.group_size)
    for group, row in enumerate(per_group):
        if np.any(row != row[0]):
            first = group * layout.group_size
            raise BenchError(
                f"training step {step}: the ranks {first}..{first + layout.group_size - 1} of spatial group "
                f"{group} hold different samples (their batches' target digests {row.tolist()}); a group's "
                f"ranks must read the group's shard in the same order, each decoding its block of the same "
                f"samples")


def _penalty_gradients(model):
    """The model's regularization loss (the L2 on the dense kernels) and its gradients, zeros where none."""
    import tensorflow as tf
    with tf.GradientTape() as tape:
        penalty = tf.add_n(model.losses)
    grads = tape.gradient(penalty, model.trainable_variables)
    return penalty, [tf.zeros_like(v) if g is None else g for g, v in zip(grads, model.trainable_variables)]


# ---------------------------------------------------------------------------- after training
def hybrid_summary(model: Any, layout: GroupLayout, dist: DistEnv) -> dict:
    """The partitioning and every rank's weights digest for summary.json (collective)."""
    digests = dist.gather_object(weights_digest(model))
    return {"parallel": {"spatial": list(layout.spatial), "spatial_partitions": layout.name,
                         "data_parallel_groups": layout.groups, "ranks_per_group": layout.group_size,
                         "weights_sha256_per_rank": digests, "weights_identical": len(set(digests)) == 1}}


def weights_digest(model: Any) -> str:
    """sha256 of the model's weights (float32 bytes in weight order): equal digests, equal weights."""
    digest = hashlib.sha256()
    for w in model.get_weights():
        digest.update(np.ascontiguousarray(w, dtype=np.float32).tobytes())
    return digest.hexdigest()
