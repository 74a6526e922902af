"""Predict time to solution at another configuration from what was measured, as the paper does.

time to solution(U, B) = staging + epochs(B) x (train samples / throughput(U) + evaluation per epoch(U))

- throughput(U): a power law T = c U^b fitted (least squares, log-log) to the mean samples/s at the
  measured unit counts at the configuration's local batch size (B / U; all local batch sizes when that
  one was not measured, said so); with a single scale measured, linear scaling from it (b = 1), said so.
- epochs(B): the converged runs' mean epochs to converge, interpolated as a power law between neighbouring
  measured batch sizes (straight on Fig. 2b's log-log axes) and extended the same way beyond them from the
  two nearest; constant with one batch size.
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

from common.campaign.analysis.analyses import convergence, scaling
from common.base.errors import BenchError


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
    measured_runs: str  # "2 of 3 converged", or "not run"
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
    """Piecewise power law in batch size through the measured points (straight lines on the log-log plot of
    Fig. 2b), extended from the nearest two outside them; always positive."""
    order = np.argsort(batches)
    b, e = np.log(batches[order]), np.log(epochs[order])
    if len(b) == 1:
        return float(epochs[0])
    x = math.log(batch)
    i = 0 if x < b[0] else len(b) - 2 if x > b[-1] else None
    if i is None:
        return float(math.exp(np.interp(x, b, e)))
    slope = (e[i + 1] - e[i]) / (b[i + 1] - b[i])
    return float(math.exp(e[i] + slope * (x - b[i])))


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
    local = global_batch_size / units
    same_local = scal[scal["local_batch_size"] == local]
    fitted = same_local if len(same_local) else scal
    c, b, t_desc = throughput_model(fitted["units"].to_numpy(float), fitted["samples_per_second"].to_numpy(float))
    t_desc += f" at local batch {local:g}" if len(same_local) else f"; local batch {local:g} not measured: all used"
    rate = c * units ** b
    epochs = epochs_at(conv["global_batch_size"].to_numpy(float), conv["epochs_mean"].to_numpy(float),
                       global_batch_size)
    e_desc = (f"power law in batch size through {sorted(conv['global_batch_size'].tolist())}" if len(conv) > 1
              else f"measured at batch size {conv['global_batch_size'].iloc[0]} only: assumed the same")
    eval_per_epoch = _eval_per_epoch(mine, units, c, b)
    staged = mine.loc[mine["staging"] > 0, "staging"]
    staging = float(staged.mean()) if len(staged) else 0.0
    samples = float(mine["train_samples"].median())
    total = staging + epochs * (samples / rate + eval_per_epoch)
    measured = float(held_out["time_to_train"].mean()) if len(held_out) else math.nan
    ran = int(target.sum())
    return Prediction(benchmark=benchmark, units=units, global_batch_size=global_batch_size, epochs=epochs,
                      samples_per_second=rate, eval_seconds_per_epoch=eval_per_epoch, staging_seconds=staging,
                      time_to_solution=total, measured=measured,
                      relative_error=(total - measured) / measured if measured == measured else math.nan,
                      measured_runs=f"{len(held_out)} of {ran} converged" if ran else "not run",
                      throughput_model=t_desc, epochs_model=e_desc)


def _eval_per_epoch(runs: pd.DataFrame, units: int, c: float, b: float) -> float:
    """Evaluation seconds per epoch measured at the unit count nearest `units`, scaled by throughput."""
    with_epochs = runs[runs["epochs"] > 0]
    if with_epochs.empty:
        return 0.0
    nearest = min(with_epochs["units"].unique(), key=lambda u: abs(math.log(u / units)))
    at = with_epochs[with_epochs["units"] == nearest]
    return float((at["evaluation"] / at["epochs"]).mean() * (nearest / units) ** b)
