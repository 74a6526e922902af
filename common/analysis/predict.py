"""Predict time to solution at another configuration from what was measured, as the paper does.

time to solution(U, B) = staging + epochs(B) x (train samples / throughput(U) + evaluation per epoch(U))

- throughput(U): a power law T = c U^b fitted (least squares, log-log) to the mean samples/s at the
  measured unit counts; with a single scale measured, linear scaling from it (b = 1), said so.
- epochs(B): the converged runs' mean epochs to converge, interpolated linearly in B between measured
  batch sizes and extended linearly beyond them from the two nearest; constant with one batch size.
- evaluation per epoch at U: that measured at the nearest unit count, scaled by the throughput ratio.
- staging: the mean over the runs that staged (none: 0).

When the configuration was also measured, its runs are left out of the fits (the prediction uses the other
configurations only) and the prediction carries their measured mean time to train and the relative error.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from common.analysis.analyses import convergence, scaling
from common.errors import BenchError


@dataclasses.dataclass(frozen=True)
class Prediction:
    benchmark: str
    units: int
    global_batch_size: int
    epochs: float
    samples_per_second: float
    eval_seconds_per_epoch: float
    staging_seconds: float
    time_to_solution: float  # seconds
    measured: float  # mean time to train of converged runs at this configuration; NaN when not measured
    relative_error: float  # (predicted - measured) / measured; NaN when not measured
    throughput_model: str
    epochs_model: str


def throughput_model(units: np.ndarray, rates: np.ndarray) -> tuple[float, float, str]:
    """(c, b, description) of T = c U^b through the measured (units, samples/s)."""
    if len(units) == 0:
        raise BenchError("no throughput measured: need runs with samples/s at some unit count")
    if len(set(units)) == 1:
        return float(rates.mean() / units[0]), 1.0, f"linear scaling from the one measured scale ({units[0]} units)"
    b, log_c = np.polyfit(np.log(units), np.log(rates), 1)
    return float(math.exp(log_c)), float(b), f"T = {math.exp(log_c):.4g} U^{b:.3f} (fit to {len(units)} unit counts)"


def epochs_at(batches: np.ndarray, epochs: np.ndarray, batch: float) -> float:
    """Linear in batch size through the measured points, extended from the nearest two outside them."""
    order = np.argsort(batches)
    b, e = batches[order], epochs[order]
    if len(b) == 1:
        return float(e[0])
    if batch < b[0]:
        i = 0
    elif batch > b[-1]:
        i = len(b) - 2
    else:
        return float(np.interp(batch, b, e))
    slope = (e[i + 1] - e[i]) / (b[i + 1] - b[i])
    return float(e[i] + slope * (batch - b[i]))


def predict(runs: pd.DataFrame, benchmark: str, units: int, global_batch_size: int) -> Prediction:
    """The predicted time to solution of `benchmark` on `units` at `global_batch_size`, from `runs`."""
    everything = runs[runs["benchmark"] == benchmark]
    if everything.empty:
        raise BenchError(f"no runs of {benchmark} to predict from (benchmarks measured: "
                         f"{sorted(runs['benchmark'].unique())})")
    target = (everything["units"] == units) & (everything["global_batch_size"] == global_batch_size)
    mine, held_out = everything[~target], everything[target & everything["converged"]]
    if mine.empty:
        raise BenchError(f"{benchmark}: only {units} units at batch {global_batch_size} was measured; a prediction "
                         f"needs other configurations to learn from")
    conv = convergence(mine)
    conv = conv[conv["converged"] > 0]
    if conv.empty:
        raise BenchError(f"no converged {benchmark} run: epochs to converge are unknown at every batch size")
    scal = scaling(mine).dropna(subset=["samples_per_second"])
    c, b, t_desc = throughput_model(scal["units"].to_numpy(float), scal["samples_per_second"].to_numpy(float))
    rate = c * units ** b
    epochs = epochs_at(conv["global_batch_size"].to_numpy(float), conv["epochs_mean"].to_numpy(float),
                       global_batch_size)
    e_desc = (f"interpolated in batch size over {sorted(conv['global_batch_size'].tolist())}" if len(conv) > 1
              else f"measured at batch size {conv['global_batch_size'].iloc[0]} only: assumed the same")
    eval_per_epoch = _eval_per_epoch(mine, units, c, b)
    staged = mine.loc[mine["staging"] > 0, "staging"]
    staging = float(staged.mean()) if len(staged) else 0.0
    samples = float(mine["train_samples"].median())
    total = staging + epochs * (samples / rate + eval_per_epoch)
    measured = float(held_out["time_to_train"].mean()) if len(held_out) else math.nan
    return Prediction(benchmark=benchmark, units=units, global_batch_size=global_batch_size, epochs=epochs,
                      samples_per_second=rate, eval_seconds_per_epoch=eval_per_epoch, staging_seconds=staging,
                      time_to_solution=total, measured=measured,
                      relative_error=(total - measured) / measured if measured == measured else math.nan,
                      throughput_model=t_desc, epochs_model=e_desc)


def _eval_per_epoch(runs: pd.DataFrame, units: int, c: float, b: float) -> float:
    """Evaluation seconds per epoch measured at the unit count nearest `units`, scaled by throughput."""
    with_epochs = runs[runs["epochs"] > 0]
    if with_epochs.empty:
        return 0.0
    nearest = min(with_epochs["units"].unique(), key=lambda u: abs(math.log(u / units)))
    at = with_epochs[with_epochs["units"] == nearest]
    return float((at["evaluation"] / at["epochs"]).mean() * (nearest / units) ** b)
