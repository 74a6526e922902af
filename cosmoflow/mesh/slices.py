"""Each rank's own copy of the weights inside its group's mesh: written where it lives, never sent.

Mesh-TF keeps a replicated weight as one variable per device, `<weight name>_slice_<pnum>`, placed on that
device (`PlacementMeshImpl`). A variable lives in the TensorFlow server that hosts its device, and every
session on that server sees it by name. So after each update every rank writes its Keras weights into the
slices on its own device, through a session on its own server (in-process: nothing crosses a socket), and
the leader's next mesh step reads them there. Before, the leader copied every weight to every device at every
step (35.6 MB per device at the reference size).

`Handoff` tells the leader when its peers' writes are done: a token per write in a queue on each peer's device,
which the leader takes before its next step, so the wait stays inside the group's own cluster (a Horovod barrier
over all ranks costs at least one Horovod cycle per step).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from common.base.errors import BenchError


# TensorFlow's worker refuses a request id it has already seen (AbortedError) with this message.
RESENT = "request was received twice"


def slice_name(weight: str, pnum: int) -> str:
    """The variable Mesh-TF lowers weight `weight` (e.g. "conv1/kernel") to on device number `pnum`."""
    return f"{weight}_slice_{pnum}"


class OwnSlices:
    """Assign ops for the slices of every weight on the devices this process hosts, and their session."""

    def __init__(self, names: Sequence[str], shapes: Sequence[tuple[int, ...]], devices: Mapping[int, str],
                 target: str, config: Any):
        """
        Args:
            names, shapes: the mesh model's weights (`MeshCosmoFlow.weight_names`, `.weight_shapes`).
            devices: device number (the position in the mesh's device list) -> device string, for the devices
                of this process: its own task's on a cluster; every one in an in-process mesh.
            target: the session target of this process's server (`MeshCluster.target`).
        """
        import tensorflow as tf
        self.names, self.shapes = list(names), [tuple(s) for s in shapes]
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.feeds = [tf.compat.v1.placeholder(tf.float32, s, name=f"feed{i}") for i, s in enumerate(self.shapes)]
            assigns = []
            for pnum, device in devices.items():
                with tf.device(device):
                    for name, shape, feed in zip(names, self.shapes, self.feeds):
                        var = tf.compat.v1.get_variable(slice_name(name, pnum), shape, tf.float32, collections=[],
                                                        use_resource=True)
                        assigns.append(var.assign(feed, read_value=False))
            self.assign = tf.group(assigns)
        self.session = tf.compat.v1.Session(target, graph=self.graph, config=config)

    def write(self, weights: Sequence[np.ndarray]) -> None:
        """Set this process's slices of every weight (float32 arrays in the mesh's weight order)."""
        if [tuple(np.shape(w)) for w in weights] != self.shapes:
            raise BenchError(f"weights of shapes {[tuple(np.shape(w)) for w in weights]} given, the mesh's are "
                             f"{self.shapes}")
        import tensorflow as tf
        feed = dict(zip(self.feeds, weights))
        try:
            self.session.run(self.assign, feed_dict=feed)
        except tf.errors.AbortedError as err:
            if RESENT not in str(err.message):
                raise
            # gRPC resent the request after its first copy had reached this rank's server, which refuses a
            # request id it has seen (seen once in a 4-rank run on 2 cores, after 9 epochs). The assign writes
            # the same values whichever copy ran, so it runs again.
            print(f"slices write refused as a resent request ({' '.join(str(err.message).split()[:8])} ...); "
                  f"writing again", flush=True)
            self.session.run(self.assign, feed_dict=feed)

    def close(self) -> None:
        self.session.close()


def written_queue(pnum: int, device: str) -> Any:
    """The queue on `device` where device number `pnum`'s rank puts a token after each write of its slices."""
    import tensorflow as tf
    with tf.device(device):
        return tf.compat.v1.FIFOQueue(2, [tf.int32], shapes=[[]], shared_name=f"cosmoflow_slices_written_{pnum}",
                                      name=f"slices_written_{pnum}")


class Handoff:
    """After each write of the slices (`OwnSlices.write`): a rank that does not drive the mesh says it is done,
    the leader waits until each of its peers has said so; its next mesh step then reads the new weights."""

    def __init__(self, own: int, devices: Sequence[str], leader: bool, target: str, config: Any):
        """
        Args:
            own: this rank's device number in its group's mesh; devices: the group's devices, by number.
            leader: this rank drives the mesh (it waits); otherwise it signals.
            target, config: a session on this rank's server; the leader's must reach its peers' devices.
        """
        import tensorflow as tf
        self.graph = tf.Graph()
        with self.graph.as_default():
            if leader:
                self.ops = [written_queue(p, d).dequeue() for p, d in enumerate(devices) if p != own]
            else:
                self.ops = [written_queue(own, devices[own]).enqueue([0])]
        self.session = tf.compat.v1.Session(target, graph=self.graph, config=config)

    def __call__(self) -> None:
        if self.ops:
            self.session.run(self.ops)

    def close(self) -> None:
        self.session.close()
