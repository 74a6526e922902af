"""One Mesh-TF mesh across processes: a TensorFlow server per rank, rank 0 drives the graph.

Every rank starts a `tf.distribute.Server` from the same `ClusterSpec` (job "worker", one
"host:port" per rank). Rank 0 builds the mesh graph on the devices `/job:worker/task:<i>/cpu:0`
and runs it in `tf.compat.v1.Session(cluster.target)`; the other ranks serve until rank 0
releases them (`serve_until_released` / `release_workers`), so every process exits cleanly.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from common.base.errors import BenchError

JOB = "worker"


@dataclasses.dataclass(frozen=True)
class MeshCluster:
    """This rank's server and what the driving rank needs to open a session over all ranks."""

    rank: int
    addresses: tuple[str, ...]
    server: Any  # tf.distribute.Server

    @property
    def size(self) -> int:
        return len(self.addresses)

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    @property
    def target(self) -> str:
        """The session target: `tf.compat.v1.Session(cluster.target, ...)`."""
        return self.server.target

    @property
    def devices(self) -> list[str]:
        """One CPU device per rank, in rank order: the mesh's device list."""
        return worker_devices(self.size)

    @property
    def own_device(self) -> str:
        """This rank's device, where its weights' slices and its input blocks live."""
        return self.devices[self.rank]

    def own_config(self, threads: int = 0) -> Any:
        """The session config of a session on this rank's server that touches only its own device."""
        return session_config(threads, only_task=self.rank)


def worker_devices(size: int) -> list[str]:
    return [f"/job:{JOB}/task:{i}/cpu:0" for i in range(size)]


def start_server(rank: int, addresses: Sequence[str], threads: int = 0) -> MeshCluster:
    """Start this rank's TensorFlow server in the cluster of `addresses` ("host:port", one per rank).

    Args:
        threads: intra- and inter-op threads of the server (0: TensorFlow's default).
    """
    _check_addresses(rank, addresses)
    import tensorflow as tf
    spec = tf.train.ClusterSpec({JOB: list(addresses)})
    server = tf.distribute.Server(spec, job_name=JOB, task_index=rank, config=session_config(threads),
                                  start=True)
    return MeshCluster(rank, tuple(addresses), server)


def session_config(threads: int = 0, cpus: int = 0, only_task: int | None = None) -> Any:
    """A ConfigProto for mesh sessions and servers.

    Args:
        threads: intra-op threads (inter-op: at least 2, so that the devices' ops can overlap); 0: default.
        cpus: split this process into that many CPU devices (in-process meshes, "/cpu:<i>"); 0: one.
        only_task: keep the session to that task's devices (a worker's own session).
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                      inter_op_parallelism_threads=max(2, threads) if threads else 0)
    if cpus:
        config.device_count["CPU"] = cpus
    if only_task is not None:
        config.device_filters.append(f"/job:{JOB}/task:{only_task}")
    # Grappler's remapper fails on Mesh-TF's lowered gradient graph ("Mutation::Apply error ...
    # missing node") and logs an error each time; it then leaves the graph as it was, so skip it.
    config.graph_options.rewrite_options.remapping = rewriter_config_pb2.RewriterConfig.OFF
    return config


def exchange_addresses(dist: Any, host: str, port: int) -> list[str]:
    """Every rank's "host:port" in rank order, gathered over the job's `DistEnv` (Horovod under horovodrun)."""
    return list(dist.gather_object(f"{host}:{port}"))


def serve_until_released(cluster: MeshCluster) -> None:
    """Block a non-driving rank while rank 0 uses its device, until `release_workers` is called."""
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        released = _release_queue(cluster.rank).dequeue()
    with tf.compat.v1.Session(cluster.target, graph=graph, config=session_config(1, only_task=cluster.rank)) as session:
        session.run(released)


def release_workers(cluster: MeshCluster) -> None:
    """From rank 0: let every `serve_until_released` return."""
    import tensorflow as tf
    if cluster.size == 1:
        return
    graph = tf.Graph()
    with graph.as_default():
        ops = [_release_queue(task).enqueue(1) for task in range(1, cluster.size)]
    with tf.compat.v1.Session(cluster.target, graph=graph) as session:
        session.run(ops)


def _release_queue(task: int) -> Any:
    # A queue resource on the task's own device; shared_name makes the driver's and the task's
    # sessions use the same queue.
    import tensorflow as tf
    with tf.device(worker_devices(task + 1)[task]):
        return tf.compat.v1.FIFOQueue(1, tf.int32, shared_name=f"mesh_release_{task}", name=f"release_{task}")


def _check_addresses(rank: int, addresses: Sequence[str]) -> None:
    if not 0 <= rank < len(addresses):
        raise BenchError(f"rank {rank}: expected 0 <= rank < {len(addresses)} (one address per rank: "
                         f"{list(addresses)})")
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise BenchError(f"cluster address {address!r}: expected host:port")
    if len(set(addresses)) != len(addresses):
        raise BenchError(f"cluster addresses {list(addresses)}: each rank needs its own host:port")
