"""Datasets shared by the integration modules: made once per test session by the real data_prep tools."""
import pytest

from tests.integration.cosmo_fixtures import make_learnable_dataset


@pytest.fixture(scope="session")
def cosmo_learnable(tmp_path_factory):
    """The CosmoFlow dataset a small model learns from in a few epochs (cosmo_fixtures.LEARNED_MAE)."""
    return make_learnable_dataset(tmp_path_factory.mktemp("cosmo-learnable"))
