"""common.base.procs: finding a launched rank's process."""
import os
import subprocess
import sys

import pytest

from common.base.errors import BenchError
from common.base.procs import rank_process


def test_finds_the_child_whose_rank_variable_matches():
    env = {**os.environ, "HOROVOD_RANK": "1"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "train.py"], env=env)
    try:
        found = rank_process(os.getpid(), 1, timeout=10)
        assert found.pid == child.pid
    finally:
        child.kill()
        child.wait()


def test_no_such_rank_is_an_error_naming_it():
    with pytest.raises(BenchError, match=rf"no rank 7 process running train.py under launcher pid {os.getpid()}"):
        rank_process(os.getpid(), 7, timeout=0.3)
