"""Each rank's own copy of the weights inside its group's mesh: written where it lives, never sent.

Mesh-TF keeps a replicated weight as one variable per device, `<weight name>_slice_<pnum>`, placed on that
device (`PlacementMeshImpl`). A variable lives in the TensorFlow server that hosts its device, and every
session on that server sees it by name. So after each update every rank writes its Keras weights into the
slices on its own device, through a session on its own server (in-process: nothing crosses a socket), and
the leader's next mesh step reads them there. Before, the leader copied every weight to every device at every
step (35.6 MB per device at the reference size).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from common.base.errors import BenchError


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
        self.session.run(self.assign, feed_dict=dict(zip(self.feeds, weights)))

    def close(self) -> None:
        self.session.close()
