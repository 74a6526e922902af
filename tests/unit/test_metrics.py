"""CosmoFlow loss and metric: MSE, and MAE from sums that add across ranks (per parameter too)."""
import numpy as np
import pytest

from cosmoflow.model import MeanAbsoluteError, mse_loss


def test_mse():
    y, p = np.zeros((2, 4), np.float32), np.full((2, 4), 0.5, np.float32)
    assert float(mse_loss(y, p)) == pytest.approx(0.25)


def test_mae_from_sums_of_two_shards_equals_mae_of_the_union():
    rng = np.random.default_rng(0)
    y, p = rng.uniform(-1, 1, (10, 4)).astype(np.float32), rng.uniform(-1, 1, (10, 4)).astype(np.float32)
    metric = MeanAbsoluteError()
    sums = np.asarray(metric.batch_sums(y[:3], p[:3])) + np.asarray(metric.batch_sums(y[3:], p[3:]))
    assert metric.result(sums) == pytest.approx(np.abs(p - y).mean(), rel=1e-6)
    details = metric.details(sums)
    assert list(details) == ["mae_Omega_m", "mae_sigma_8", "mae_n_s", "mae_H_0"]
    np.testing.assert_allclose(list(details.values()), np.abs(p - y).mean(axis=0), rtol=1e-6)
