"""Fixtures shared by the integration modules: the CosmoFlow datasets, made once per test session by the real
data_prep tools (a test that writes into one takes `writable_copy` of it), and one local Slurm cluster."""
from pathlib import Path

import pytest

from jobs.localslurm import local_slurm
from tests.integration.cosmo_fixtures import make_dataset, make_learnable_dataset, two_rank_run

# `make test` runs the integration tests not marked serial on 2 pytest-xdist processes (--dist loadgroup): each
# module's tests in one process, so that its module fixtures run once, and these modules in one process together,
# as they read the same session-scoped runs (cosmo_two_rank_run and deepcam_fixtures', each a real training).
SHARED_RUNS = ("test_cosmoflow_e2e", "test_deepcam_e2e", "test_export", "test_staging_e2e")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    """Put each test in its xdist group: its module's name, or "shared-runs" for the SHARED_RUNS modules."""
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        item.add_marker(pytest.mark.xdist_group("shared-runs" if module in SHARED_RUNS else module))


@pytest.fixture(scope="session")
def cosmo_dataset(tmp_path_factory):
    """12 universes cut into 64 training and 32 validation samples of 16^3 (cosmo_fixtures.make_dataset): for
    tests of mechanics. Shared: read it only (checked when the session ends)."""
    yield from _unchanged(make_dataset(tmp_path_factory.mktemp("cosmo")))


@pytest.fixture(scope="session")
def cosmo_small(tmp_path_factory):
    """6 universes, 2 of them for validation: for the bad-input and exit tests, which copy it to damage it."""
    yield from _unchanged(make_dataset(tmp_path_factory.mktemp("cosmo-small"), universes=6, val_universes=2))


@pytest.fixture(scope="session")
def cosmo_learnable(tmp_path_factory):
    """The CosmoFlow dataset a small model learns from in a few epochs (cosmo_fixtures.LEARNED_MAE)."""
    yield from _unchanged(make_learnable_dataset(tmp_path_factory.mktemp("cosmo-learnable")))


@pytest.fixture(scope="session")
def cosmo_two_rank_run(cosmo_dataset, tmp_path_factory):
    """(output directory, process) of one plain 2-rank CosmoFlow run on `cosmo_dataset` (the tiny model, 2
    epochs, a target out of reach: exit 1): test_cosmoflow_e2e.py checks its log and summary, and
    test_staging_e2e.py compares staged runs with it. Read it only."""
    return two_rank_run(tmp_path_factory.mktemp("cosmo-two-rank"), cosmo_dataset, "run")


@pytest.fixture(scope="session")
def slurm():
    """The environment (SLURM_CONF) of one running single-node cluster for every Slurm test; its daemons are
    stopped when the session ends."""
    with local_slurm() as env:
        yield env


def _unchanged(records: Path):
    """Yield the dataset, then check that no test wrote into it (each file's path, size and mtime)."""
    before = _listing(records)
    yield records
    assert _listing(records) == before, f"{records}: a test changed the shared dataset (take writable_copy of it)"


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}
