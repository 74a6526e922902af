"""DistEnv without a launcher, thread derivation and Horovod settings from config."""
import pytest

from common.runtime import dist as dist_mod
from common.runtime.config import DistConfig


def test_single_process_env(monkeypatch):
    for var in dist_mod._LAUNCHER_RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    env = dist_mod.init_distributed(DistConfig())
    assert (env.rank, env.size, env.local_rank, env.local_size, env.is_root, env.horovod) == (0, 1, 0, 1, True, False)
    assert env.allreduce_gradients([1.0, 2.0]) == [1.0, 2.0] and env.sum(3.0) == 3.0
    assert env.threads == dist_mod.available_cores()
    assert "single process" in dist_mod.describe(env)


@pytest.mark.parametrize("cores, local_size, configured, expected", [
    (2, 2, 0, 1), (2, 1, 0, 2), (48, 4, 0, 12), (3, 4, 0, 1), (48, 4, 6, 6)])
def test_threads_per_rank(monkeypatch, cores, local_size, configured, expected):
    monkeypatch.setattr(dist_mod, "available_cores", lambda: cores)
    assert dist_mod.threads_per_rank(DistConfig(threads_per_rank=configured), local_size) == expected


def test_horovod_environment_from_config():
    env = dist_mod.horovod_environment(DistConfig(fusion_threshold_mb=32, cycle_time_ms=2.5,
                                                  hierarchical_allreduce=True))
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)
    assert env["HOROVOD_CYCLE_TIME"] == "2.5" and env["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "1"
    assert env["HOROVOD_HIERARCHICAL_ALLGATHER"] == "1"  # unset: as the allreduce
    apart = dist_mod.horovod_environment(DistConfig(hierarchical_allreduce=True, hierarchical_allgather=False))
    assert (apart["HOROVOD_HIERARCHICAL_ALLREDUCE"], apart["HOROVOD_HIERARCHICAL_ALLGATHER"]) == ("1", "0")


def test_launcher_detection(monkeypatch):
    for var in dist_mod._LAUNCHER_RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    assert not dist_mod.launched_distributed()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert dist_mod.launched_distributed()
