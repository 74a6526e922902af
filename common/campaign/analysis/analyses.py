"""The paper's analyses of a set of runs, as tables (pandas), from `logs.load_runs`.

- `breakdown`: time to solution split into staging, training, evaluation and other, per configuration.
- `convergence`: epochs to converge against global batch size (converged runs; failures counted).
- `scaling`: training sample throughput against compute units, per local batch size, with the weak-scaling
  efficiency (throughput per unit against the smallest unit count's, at the same local batch).
- `strong_scaling`: the same global batch on different unit counts: speed-up and efficiency against the smallest.
- `system`: where a step's time and the machine go per configuration (summary.json's `system` figures).
- `compute_time`: their join: epochs(B) x train samples / throughput(units) for every measured pairing
  of a batch size with the units that run it at the campaign's local batch size.
- `budget`: compute budget in unit-hours (units x time to train).
- `staging_ratios`: staging time over the mean epoch time (the paper's Table 5).
- `variability`: run-to-run spread of time to train and of throughput.

A configuration is (benchmark, units, global batch size); `runs` may mix campaigns and benchmarks.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from common.campaign.uncertainty import olympic_interval, olympic_means

CONFIG = ["benchmark", "units", "global_batch_size"]
PARTS = ["staging", "training", "evaluation", "other"]


def breakdown(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean seconds of each part of time to solution per configuration, and the parts' shares (over every
    run, converged or not: `converged` says how many reached the target)."""
    table = runs.groupby(CONFIG)[PARTS + ["time_to_train"]].mean()
    for part in PARTS:
        table[f"{part}_share"] = table[part] / table["time_to_train"]
    table["runs"] = runs.groupby(CONFIG).size()
    table["converged"] = runs.groupby(CONFIG)["converged"].sum().astype(int)
    return table.reset_index()


def convergence(runs: pd.DataFrame) -> pd.DataFrame:
    """Epochs to converge per (benchmark, global batch size): mean, std, min, max over converged runs."""
    grouped = runs.groupby(["benchmark", "global_batch_size"])
    table = grouped["epochs_to_converge"].agg(["mean", "std", "min", "max", "count"])
    table.columns = ["epochs_mean", "epochs_std", "epochs_min", "epochs_max", "converged"]
    table["runs"] = grouped.size()
    table["failed"] = table["runs"] - table["converged"]
    return table.reset_index()


def scaling(runs: pd.DataFrame) -> pd.DataFrame:
    """Training samples/s per (benchmark, local batch size, units): mean, std, runs; and per unit. The local
    batch is kept apart: throughput per unit depends on it as much as on the unit count."""
    grouped = runs.groupby(["benchmark", "local_batch_size", "units"])
    table = grouped["samples_per_second"].agg(["mean", "std", "count"])
    table.columns = ["samples_per_second", "samples_per_second_std", "runs"]
    table = table.reset_index()
    table["per_unit"] = table["samples_per_second"] / table["units"]
    smallest = table.groupby(["benchmark", "local_batch_size"])["units"].transform("min")
    base = table.loc[table["units"] == smallest].set_index(["benchmark", "local_batch_size"])["per_unit"]
    table["efficiency"] = table["per_unit"] / [base.get((b, lb), float("nan"))
                                               for b, lb in zip(table["benchmark"], table["local_batch_size"])]
    return table


def strong_scaling(runs: pd.DataFrame) -> pd.DataFrame:
    """Training samples/s of one global batch size on different unit counts: speed-up over the smallest count
    and efficiency (speed-up over the units' ratio); configurations run at one unit count only are left out."""
    table = runs.groupby(["benchmark", "global_batch_size", "units"])["samples_per_second"].mean().reset_index()
    rows = []
    for (bench, batch), group in table.groupby(["benchmark", "global_batch_size"]):
        if len(group) < 2:
            continue
        first = group.loc[group["units"].idxmin()]
        for r in group.itertuples():
            speedup = r.samples_per_second / first["samples_per_second"]
            rows.append({"benchmark": bench, "global_batch_size": batch, "units": r.units,
                         "samples_per_second": r.samples_per_second, "speedup": speedup,
                         "efficiency": speedup / (r.units / first["units"])})
    return pd.DataFrame(rows, columns=["benchmark", "global_batch_size", "units", "samples_per_second", "speedup",
                                       "efficiency"])


SYSTEM = ["fraction_of_peak", "sustained_gflops", "allreduce_share", "allreduce_wait_share", "allreduce_gb_per_s",
          "input_wait_share", "peak_rss_mb", "energy_j_per_sample"]
STEP = ["step_compute", "step_allreduce", "step_input_wait", "step_other"]


def system(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean system figures and step shares per configuration and precision (fraction_of_peak is against the
    peak of the precision a run trained in), over the runs that recorded them."""
    columns = [c for c in SYSTEM + STEP if c in runs]
    measured = runs.dropna(subset=["sustained_gflops"]) if "sustained_gflops" in runs else runs.iloc[0:0]
    keys = CONFIG + ["precision"] if "precision" in measured else CONFIG
    table = measured.groupby(keys)[columns].mean()
    table["runs"] = measured.groupby(keys).size()
    table["time_to_train"] = measured.groupby(keys)["time_to_train"].mean()
    return table.reset_index()


def compute_time(runs: pd.DataFrame) -> pd.DataFrame:
    """Compute time of a configuration predicted from the two measurements: epochs to converge at its batch
    size times the training samples over the throughput at its units (plus evaluation per epoch), for every
    measured batch size B and measured units U with B = U x local batch (the runs' local batch size);
    with the measured time to train where that configuration was run."""
    conv, scal = convergence(runs), scaling(runs)
    rows = []
    for bench, group in runs.groupby("benchmark"):
        local = group["local_batch_size"].dropna().mode()
        samples = group["train_samples"].median()
        eval_per_epoch = (group["evaluation"] / group["epochs"].clip(lower=1)).mean()
        for _, c in conv[(conv["benchmark"] == bench) & (conv["converged"] > 0)].iterrows():
            for _, s in scal[(scal["benchmark"] == bench) & (scal["local_batch_size"] == (
                    local.iloc[0] if len(local) else None))].iterrows():
                if c["global_batch_size"] != s["units"] * s["local_batch_size"]:
                    continue
                predicted = c["epochs_mean"] * (samples / s["samples_per_second"] + eval_per_epoch)
                measured = group[(group["units"] == s["units"]) & (group["global_batch_size"] == c["global_batch_size"])
                                 & group["converged"]]
                rows.append({"benchmark": bench, "units": s["units"], "global_batch_size": c["global_batch_size"],
                             "epochs": c["epochs_mean"], "samples_per_second": s["samples_per_second"],
                             "compute_seconds": predicted,
                             "measured_training_and_eval_seconds": (measured["training"] + measured["evaluation"]).mean()
                             if len(measured) else float("nan")})
    return pd.DataFrame(rows)


def budget(runs: pd.DataFrame) -> pd.DataFrame:
    """Unit-hours per configuration (mean over runs, and all runs together)."""
    table = runs.groupby(CONFIG)["unit_hours"].agg(["mean", "sum", "count"])
    table.columns = ["unit_hours_per_run", "unit_hours_total", "runs"]
    return table.reset_index()


def staging_ratios(runs: pd.DataFrame) -> pd.DataFrame:
    """Staging seconds (timed, and in init), mean epoch seconds and the ratio of all staging to an epoch per
    configuration (runs that staged)."""
    staged = runs[(runs["staging"] > 0) | (runs["init_staging"] > 0)]
    table = staged.groupby(CONFIG)[["staging", "init_staging", "epoch_seconds_mean", "staging_ratio"]].mean()
    return table.reset_index()


def variability(runs: pd.DataFrame) -> pd.DataFrame:
    """Spread of time to train (converged runs) and throughput per configuration: mean, std, coefficient of
    variation, min, max; the olympic mean of time to train (failed runs counted as the scoring does) and its
    95% bootstrap interval (common/campaign/uncertainty.py)."""
    rows = []
    for key, group in runs.groupby(CONFIG):
        ttt = group.loc[group["converged"], "time_to_train"]
        rate = group["samples_per_second"]
        failed = len(group) - len(ttt)
        olympic = olympic_means(np.asarray([ttt.tolist()]), failed) if len(ttt) else None
        interval = olympic_interval(ttt.tolist(), failed)
        rows.append({**dict(zip(CONFIG, key)), "runs": len(group), "converged": len(ttt),
                     "time_to_train_olympic": float("nan") if olympic is None else float(olympic[0]),
                     "olympic_ci95_low": _or_nan(interval.low), "olympic_ci95_high": _or_nan(interval.high),
                     "time_to_train_mean": ttt.mean(), "time_to_train_std": ttt.std(),
                     "time_to_train_cv": ttt.std() / ttt.mean() if len(ttt) > 1 else float("nan"),
                     "time_to_train_min": ttt.min(), "time_to_train_max": ttt.max(),
                     "samples_per_second_cv": rate.std() / rate.mean() if len(rate) > 1 else float("nan")})
    return pd.DataFrame(rows)


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value
