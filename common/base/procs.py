"""Finding a launched rank's process: what fault tests and the elastic fault benchmark send their signals to."""
from __future__ import annotations

import time

from common.base.errors import BenchError

RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def rank_process(launcher_pid: int, rank: int, script: str = "train.py", timeout: float = 120):
    """The psutil.Process of the worker of `rank` (running `script`) under the launcher `launcher_pid`.

    Found by the rank variable its launcher sets (horovodrun runs mpirun when Open MPI is installed, Gloo
    otherwise, and Gloo's elastic mode keeps a worker's first rank in HOROVOD_RANK); waits up to `timeout` s.
    """
    import psutil
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(launcher_pid).children(recursive=True):
            try:
                if str(rank) in {child.environ().get(v) for v in RANK_VARIABLES} \
                        and script in " ".join(child.cmdline()):
                    return child
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise BenchError(f"no rank {rank} process running {script} under launcher pid {launcher_pid} after {timeout} s")
