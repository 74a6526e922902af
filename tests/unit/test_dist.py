"""DistEnv without a launcher, thread derivation and Horovod settings from config."""
import dataclasses

import pytest

from common.base.errors import BenchError
from common.runtime import dist as dist_mod
from common.runtime import hvd_settings
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
    env = hvd_settings.from_config(DistConfig(fusion_threshold_mb=32, cycle_time_ms=2.5, hierarchical_allreduce=True))
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)
    assert env["HOROVOD_CYCLE_TIME"] == "2.5" and env["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "1"
    assert env["HOROVOD_HIERARCHICAL_ALLGATHER"] == "1"  # unset: as the allreduce
    apart = hvd_settings.from_config(DistConfig(hierarchical_allreduce=True, hierarchical_allgather=False))
    assert (apart["HOROVOD_HIERARCHICAL_ALLREDUCE"], apart["HOROVOD_HIERARCHICAL_ALLGATHER"]) == ("1", "0")


def test_a_variable_the_environment_sets_wins_over_the_config_and_is_named():
    cfg = DistConfig(fusion_threshold_mb=32, cycle_time_ms=10)
    settings = hvd_settings.resolve(cfg, {"HOROVOD_CYCLE_TIME": " 2.5", "HOROVOD_FUSION_THRESHOLD": "0",
                                          "HOROVOD_TIMELINE": "/tmp/t.json"})
    assert settings.values["HOROVOD_CYCLE_TIME"] == "2.5" and settings.values["HOROVOD_FUSION_THRESHOLD"] == "0"
    assert settings.values["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "0"  # not in the environment: the config's
    assert settings.from_environment == ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME")
    used = settings.effective(size=2, local_size=2, gpu_hierarchy_built=False)
    assert used == {"fusion_threshold_bytes": 0, "cycle_time_ms": 2.5, "hierarchical_allreduce": False,
                    "hierarchical_allgather": False, "mpi_yield_when_idle": True}
    words = hvd_settings.describe(settings, used)
    assert "cycle time 2.5 ms" in words and "HOROVOD_CYCLE_TIME=2.5" in words and "HOROVOD_FUSION_THRESHOLD=0" in words


@pytest.mark.parametrize("name, raw", [("HOROVOD_FUSION_THRESHOLD", "64MB"), ("HOROVOD_FUSION_THRESHOLD", "-1"),
                                       ("HOROVOD_CYCLE_TIME", "0"), ("HOROVOD_CYCLE_TIME", "fast"),
                                       ("HOROVOD_HIERARCHICAL_ALLREDUCE", "yes"),
                                       ("OMPI_MCA_mpi_yield_when_idle", "sometimes")])
def test_a_bad_value_in_the_environment_is_refused_with_its_name(name, raw):
    with pytest.raises(BenchError, match=f"{name}='{raw}': expected"):
        hvd_settings.resolve(DistConfig(), {name: raw})


@pytest.mark.parametrize("size, local_size, built, expected", [
    (4, 4, True, (False, False)),   # one node: Horovod ignores both
    (8, 4, False, (False, True)),   # two nodes, no NCCL/DDL: allgather only
    (8, 4, True, (True, True))])
def test_what_horovod_uses_of_hierarchical_settings(size, local_size, built, expected):
    settings = hvd_settings.resolve(DistConfig(hierarchical_allreduce=True), {})
    used = settings.effective(size, local_size, built)
    assert (used["hierarchical_allreduce"], used["hierarchical_allgather"]) == expected
    if not expected[0]:
        assert "hierarchical allreduce off (asked for, but Horovod ignores it" in hvd_settings.describe(settings, used)


def test_open_mpi_yields_when_idle_unless_the_config_or_the_environment_says_otherwise():
    assert hvd_settings.from_config(DistConfig())["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert hvd_settings.from_config(DistConfig(mpi_yield_when_idle=False))["OMPI_MCA_mpi_yield_when_idle"] == "0"
    for raw, expected in (("false", False), ("No", False), ("enabled", True), ("1", True)):
        settings = hvd_settings.resolve(DistConfig(), {"OMPI_MCA_mpi_yield_when_idle": raw})
        used = settings.effective(2, 2, False)
        assert used["mpi_yield_when_idle"] is expected
        assert settings.from_environment == ("OMPI_MCA_mpi_yield_when_idle",)
        assert ("Open MPI yields when idle" if expected else "Open MPI busy-polls when idle") in \
            hvd_settings.describe(settings, used)


def test_elastic_leaves_the_cycle_time_to_horovod_unless_the_environment_sets_it():
    cfg = DistConfig(elastic=dataclasses.replace(DistConfig().elastic, enabled=True))
    assert hvd_settings.resolve(cfg, {}).effective(2, 2, False)["cycle_time_ms"] == hvd_settings.HOROVOD_DEFAULT_CYCLE_MS
    assert hvd_settings.resolve(cfg, {"HOROVOD_CYCLE_TIME": "7"}).values["HOROVOD_CYCLE_TIME"] == "7"


def test_launcher_detection(monkeypatch):
    for var in dist_mod._LAUNCHER_RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    assert not dist_mod.launched_distributed()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert dist_mod.launched_distributed()
