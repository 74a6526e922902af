"""Each rank's block of the input, handed to its group's mesh where it lives: never a whole batch on one rank.

Task k of a group of pd x ph ranks owns block (k // ph, k % ph) of every sample (`sample_block`); its input
pipeline decodes only that block (cosmoflow/data.py). Before each step every rank puts its block into a FIFO
queue on its own device, through a session on its own server (in-process: nothing crosses a socket), and the
leader's mesh graph takes device k's block from device k's queue (`mtf.import_laid_out_tensor`): the blocks
enter the mesh where Mesh-TF lays them, and the leader feeds only the targets. The queue is found by its
shared name on the device's server, so the leader's graph and the rank's own graph define it identically
(`block_queue`). A queue holds at most `QUEUE_CAPACITY` blocks: a rank that runs ahead (evaluation has no
collective per batch) waits for the leader's step to take one.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from common.base.errors import BenchError
from cosmoflow.mesh.groups import SampleBlock

QUEUE_CAPACITY = 2


def block_queue(name: str, pnum: int, device: str, shape: Sequence[int]) -> Any:
    """The queue of device number `pnum`'s blocks (float32, `shape` = (batch, d, h, W, C)) of the graph `name`
    ("train" or "eval"), on `device`; defined the same by the leader's mesh graph and the rank's own feeder."""
    import tensorflow as tf
    with tf.device(device):
        return tf.compat.v1.FIFOQueue(QUEUE_CAPACITY, [tf.float32], shapes=[list(shape)],
                                      shared_name=f"cosmoflow_{name}_blocks_{pnum}", name=f"{name}_blocks_{pnum}")


class OwnBlocks:
    """Enqueue ops for the blocks of the devices this process hosts, and their session on its own server."""

    def __init__(self, names: Sequence[str], blocks: Mapping[int, tuple[str, SampleBlock]],
                 sample_shape: Sequence[int], batch: int, target: str, config: Any):
        """
        Args:
            names: the queues' graph names (`block_queue`): "train", and "eval" when evaluation has its graph.
            blocks: device number -> (device string, the block it holds), for the devices of this process: its
                own task's on a cluster; every device in an in-process mesh.
            sample_shape: (D, H, W, C) of a whole sample; batch: the samples of one step.
            target: the session target of this process's server.
        """
        import tensorflow as tf
        self.blocks = dict(blocks)
        self.shapes = {pnum: (batch, *block.shape(sample_shape)) for pnum, (_, block) in self.blocks.items()}
        self.graph = tf.Graph()
        self.feeds, self.enqueue = {}, {}
        with self.graph.as_default():
            for pnum, (device, _) in self.blocks.items():
                self.feeds[pnum] = tf.compat.v1.placeholder(tf.float32, self.shapes[pnum], name=f"block_{pnum}")
                for name in names:
                    queue = block_queue(name, pnum, device, self.shapes[pnum])
                    self.enqueue[name, pnum] = queue.enqueue([self.feeds[pnum]])
        self.session = tf.compat.v1.Session(target, graph=self.graph, config=config)

    def put(self, name: str, x: Any) -> None:
        """Queue this process's block `x` (batch, d, h, W, C) for the next step of graph `name` (one device)."""
        (pnum,) = self.blocks
        self._put(name, {pnum: np.asarray(x, np.float32)})

    def put_whole(self, name: str, x: Any) -> None:
        """Cut whole samples `x` (batch, D, H, W, C) into the blocks of every device hosted here and queue them."""
        x = np.asarray(x, np.float32)
        self._put(name, {pnum: block.cut(x) for pnum, (_, block) in self.blocks.items()})

    def _put(self, name: str, values: dict[int, np.ndarray]) -> None:
        for pnum, value in values.items():
            if tuple(value.shape) != self.shapes[pnum]:
                raise BenchError(f"block of shape {tuple(value.shape)} for device {pnum}, expected "
                                 f"{self.shapes[pnum]} (batch, depth, height, width, channels)")
        ops = [self.enqueue[name, pnum] for pnum in values]
        self.session.run(ops, feed_dict={self.feeds[pnum]: value for pnum, value in values.items()})

    def close(self) -> None:
        self.session.close()
