"""The distributed runtime: the rank layout and the collectives the suite needs, as one frozen `DistEnv`.

`init_distributed(cfg.dist)` makes it. Under horovodrun (or mpirun/srun with an MPI launcher) it sets Horovod's
tensor-fusion, cycle-time and hierarchical-allreduce environment before `hvd.init()` (common/runtime/hvd_settings.py;
a variable the user set wins) and the collectives are Horovod's (common/runtime/horovod_env.py); otherwise the env is
one process's, whose collectives are identities, so every tool also runs plainly. It also pins one GPU per local
rank when GPUs exist and sets TensorFlow's CPU thread pools from the cores and ranks per node.

The ranks also agree here on stopping (the last section): `StopRequests` turns a scheduler's stop signal into a
request that every rank honours after the same step.
"""
from __future__ import annotations

import dataclasses
import os
import signal
from typing import Any, Sequence

from common.runtime import hvd_settings
from common.runtime.config import DistConfig

# Launchers set one of these in every rank's environment.
_LAUNCHER_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


def launched_distributed() -> bool:
    """True when this process was started by horovodrun, mpirun or srun with MPI."""
    return any(v in os.environ for v in _LAUNCHER_RANK_VARS)


@dataclasses.dataclass(frozen=True)
class DistEnv:
    """Rank layout plus the few collectives the training loop needs."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node: int = 0  # this rank's node (Horovod's cross rank)
    threads: int = 1
    gpu: bool = False
    # The GPU TensorFlow computes on, as an index into this process's visible devices (CUDA_VISIBLE_DEVICES):
    # what DALI's device_id must be. 0 on every rank when each rank sees one GPU (the shipped job scripts).
    gpu_index: int | None = None
    horovod: bool = False
    # The HOROVOD_* variables hvd.init() read and which of them the environment set over the config
    # (common/runtime/hvd_settings.py), and what Horovod uses of them in this layout and build.
    settings: hvd_settings.HorovodSettings = dataclasses.field(default_factory=hvd_settings.HorovodSettings)
    horovod_used: dict = dataclasses.field(default_factory=dict)
    # Elastic mode (common/runtime/elastic.py): hvd.elastic.run recognises only the failures of per-tensor
    # allreduce, allgather and broadcast, so grouped allreduces become one allreduce per tensor.
    elastic: bool = False

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def num_nodes(self) -> int:
        return max(1, self.size // max(1, self.local_size))

    @property
    def several(self) -> bool:
        """Whether collectives cross ranks: Horovod started with more than one rank (else they are identities)."""
        return self.horovod and self.size > 1

    def allreduce_gradients(self, grads: Sequence[Any]) -> list:
        """Average gradients over ranks in one grouped (fused) allreduce; call inside tf.function."""
        return _hvd().allreduce(grads, "Average", self.elastic) if self.several else list(grads)

    def average(self, value: Any, name: str | None = None) -> Any:
        """Average a tensor over ranks."""
        return _hvd().allreduce_one(value, "Average", name) if self.several else value

    def sum(self, value: Any, name: str | None = None) -> Any:
        """Sum a tensor over ranks."""
        return _hvd().allreduce_one(value, "Sum", name) if self.several else value

    def sum_grouped(self, values: Sequence[Any]) -> list:
        """Sum each tensor over ranks in one grouped (fused) allreduce."""
        return _hvd().allreduce(values, "Sum", self.elastic) if self.several else list(values)

    def average_variables(self, variables: Sequence[Any]) -> None:
        """Replace each variable (e.g. batch-norm running statistics) by its mean over ranks."""
        if self.several and variables:
            for var, mean in zip(variables, _hvd().allreduce([v.value for v in variables], "Average", self.elastic)):
                var.assign(mean)

    def broadcast_variables(self, variables: Sequence[Any], root_rank: int = 0) -> None:
        """Overwrite `variables` (Keras 3 or tf.Variables) with rank 0's values."""
        if self.several:
            _hvd().broadcast_variables(variables, root_rank)

    def gather_object(self, obj: Any) -> list:
        """Every rank's picklable `obj`, in rank order, on every rank."""
        return _hvd().gather_object(obj) if self.several else [obj]

    def broadcast_object(self, obj: Any, root_rank: int = 0) -> Any:
        """Rank 0's picklable object on every rank."""
        return _hvd().broadcast_object(obj, root_rank) if self.several else obj

    def barrier(self) -> None:
        """Return when every rank has called it."""
        if self.several:
            _hvd().barrier()


def _hvd():
    """common/runtime/horovod_env.py: imported only where Horovod runs."""
    from common.runtime import horovod_env
    return horovod_env


def available_cores() -> int:
    """CPU cores this process may run on (respects affinity masks set by the launcher)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(cfg: DistConfig, local_size: int) -> int:
    """Intra-op threads for one rank: configured, or the node's cores shared by its ranks."""
    if cfg.threads_per_rank > 0:
        return cfg.threads_per_rank
    return max(1, available_cores() // max(1, local_size))


def init_distributed(cfg: DistConfig) -> DistEnv:
    """Start Horovod when launched by a parallel launcher, configure TF devices and threads."""
    # Must precede the first TensorFlow import (Horovod's included) to take effect.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1" if cfg.onednn else "0")
    # float32 means float32: oneDNN may otherwise compute fp32 convolutions in bf16 on CPUs
    # with AMX. A site that wants that trade sets ONEDNN_DEFAULT_FPMATH_MODE=BF16 itself.
    os.environ.setdefault("ONEDNN_DEFAULT_FPMATH_MODE", "STRICT")
    layout = _hvd().start(cfg) if launched_distributed() else dict(rank=0, size=1, local_rank=0, local_size=1,
                                                                    horovod=False)
    threads = threads_per_rank(cfg, layout["local_size"])
    gpu_index = _configure_tensorflow(threads, cfg.inter_op_threads, layout["local_rank"])
    return DistEnv(threads=threads, gpu=gpu_index is not None, gpu_index=gpu_index, **layout)


def pick_gpu(local_rank: int, visible: int) -> int | None:
    """The visible GPU a rank uses: local rank modulo the GPUs it sees, so 0 when the launcher gives each
    rank its own GPU (CUDA_VISIBLE_DEVICES) and the local rank when every rank sees all of the node's."""
    return local_rank % visible if visible else None


def _configure_tensorflow(threads: int, inter_op: int, local_rank: int) -> int | None:
    """Pin one GPU per local rank if any; set CPU thread pools. Returns the visible GPU's index, None on CPU."""
    import tensorflow as tf
    gpus = tf.config.list_physical_devices("GPU")
    index = pick_gpu(local_rank, len(gpus))
    if index is not None:
        tf.config.set_visible_devices(gpus[index], "GPU")
        tf.config.experimental.set_memory_growth(gpus[index], True)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError:  # TF already initialised (e.g. a second run in one test process)
        pass
    return index


def describe(env: DistEnv) -> str:
    """One line for the log: layout, threads and Horovod settings."""
    if not env.horovod:
        return f"single process, {env.threads} CPU threads, {'GPU' if env.gpu else 'CPU'}"
    used = hvd_settings.describe(env.settings, env.horovod_used)
    return (f"horovod: {env.size} ranks on {env.num_nodes} node(s), {env.local_size} per node, "
            f"{env.threads} CPU threads per rank, {'GPU per rank' if env.gpu else 'CPU'}; {used}")


# ---------------------------------------------------------------------------- stop requests
# The signals batch schedulers send before the wall-time limit become a request that every rank honours after the same
# step, even when only some ranks were signalled: it rides in the training step's gradient allreduce (or, in steps
# that do not carry it, `agreed_now`'s one-scalar allreduce). Before run_start the run ends at the first point its
# ranks meet (`StoppedBeforeStart`). What a stop then does, and why: docs/faults.md, "Stop signals".
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StoppedBeforeStart(Exception):
    """A stop signal arrived before run_start: the run ends untimed, with nothing trained and no checkpoint."""


class StopRequests:
    """The stop signals this process received, and the TensorFlow variables a training step carries the request
    in: `local` is this rank's request (0 or 1); the step averages it over the ranks with its gradients and stores
    the result in `agreed`, which is > 0 on every rank after the same step when any rank asked."""

    def __init__(self):
        self.signum = 0
        self._previous: dict = {}
        self.local = self.agreed = None  # tf.Variables, made by `flag()`
        self.raised = False  # this rank's request is in `local`

    def install(self) -> "StopRequests":
        """Handle the stop signals (main thread only) until `uninstall`."""
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handler(self, signum, _frame) -> None:
        self.signum = signum

    def agreed_now(self, dist: DistEnv) -> int:
        """Collective: how many ranks have been asked to stop (0: keep going)."""
        if not dist.several:
            return int(bool(self.signum))
        import tensorflow as tf
        return int(dist.sum(tf.constant(float(bool(self.signum))), name="stop_request"))

    def flag(self) -> "StopRequests":
        """These requests with the variables a training step allreduces them in (made on first use)."""
        if self.local is None:
            import tensorflow as tf
            self.local = tf.Variable(0.0, trainable=False, name="stop_request_local")
            self.agreed = tf.Variable(0.0, trainable=False, name="stop_request_agreed")
        return self

    def arm(self) -> None:
        """Before a step: put this rank's request into the variable the step allreduces (once, when it arrives)."""
        if self.signum and self.local is not None and not self.raised:
            self.local.assign(1.0)
            self.raised = True

    def stop_agreed(self) -> bool:
        """After a step: did any rank ask to stop (read from the step's allreduce, no collective)."""
        return float(self.agreed.numpy()) > 0

    def describe(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "another rank's stop signal"
