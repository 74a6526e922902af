"""CosmoFlow's loss (mean squared error) and validation metric (mean absolute error)."""
from __future__ import annotations

import keras
import numpy as np


def mse_loss(y_true, y_pred):
    """Mean squared error over the batch and the 4 parameters (a scalar)."""
    return keras.ops.mean(keras.ops.square(y_pred - y_true))


PARAMETERS = ("Omega_m", "sigma_8", "n_s", "H_0")


class MeanAbsoluteError:
    """MAE over all validation samples and parameters, from sums that add across ranks.

    The sums are [count of values, sum of |error| per parameter ...], so the per-parameter
    MAE is reported too.
    """

    name = "mae"
    mlperf_key = "eval_error"
    higher_is_better = False

    def batch_sums(self, y_true, y_pred):
        per_param = keras.ops.sum(keras.ops.abs(y_pred - y_true), axis=0)  # (P,)
        count = keras.ops.cast(keras.ops.size(y_true), "float32")
        return keras.ops.concatenate([keras.ops.reshape(count, (1,)), per_param])

    def result(self, sums) -> float:
        sums = np.asarray(sums, dtype=np.float64)
        return float(sums[1:].sum() / sums[0])

    def details(self, sums) -> dict:
        """MAE of each parameter."""
        sums = np.asarray(sums, dtype=np.float64)
        per_sample = sums[0] / len(sums[1:])
        names = PARAMETERS if len(sums) - 1 == len(PARAMETERS) else range(len(sums) - 1)
        return {f"mae_{n}": float(v / per_sample) for n, v in zip(names, sums[1:])}
