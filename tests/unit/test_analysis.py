"""The analysis tools: tidy tables from logs, the paper's analyses, prediction with a known answer, report."""
import json
import math
import struct

import numpy as np
import pandas as pd
import pytest

from common.base import mlperf_log
from common.campaign.analysis import analyses, logs, predict, report
from common.campaign.analysis.__main__ import main as analysis_main
from common.base.errors import BenchError
from tests.unit.test_scoring import T0, write_log


def make_run(root, name, minutes, seed=1, success=True, ranks=2):
    run = root / "runs" / name
    write_log(run / "mlperf.log", T0, minutes, seed, success)
    (run / "summary.json").write_text(json.dumps({"ranks": ranks}))
    return run


def test_a_run_splits_into_staging_training_evaluation_and_other(tmp_path):
    run = make_run(tmp_path / "camp", "run_000", minutes=10)
    row, epochs = logs.parse_run(run)
    assert row["benchmark"] == "deepcam" and row["campaign"] == "camp" and row["status"] == "success"
    assert row["time_to_train"] == pytest.approx(600, abs=0.01)
    assert row["staging"] + row["training"] + row["evaluation"] + row["other"] == pytest.approx(600, abs=0.01)
    assert row["training"] > row["evaluation"] > 0 and row["staging"] > 0
    # The fixture run reached IoU 0.8269 in epoch 7, evaluating twice per epoch (once per half epoch).
    assert row["epochs"] == 7 and row["epochs_to_converge"] == 7 and row["final_metric"] == pytest.approx(0.8269, 1e-3)
    assert row["units"] == 2 and row["global_batch_size"] == 8 and row["local_batch_size"] == 4
    assert row["samples_per_second"] == pytest.approx(row["train_samples"] * 7 / row["training"])
    assert row["staging_ratio"] == pytest.approx(row["staging"] / (row["training"] / 7))
    assert row["unit_hours"] == pytest.approx(2 * 600 / 3600)
    assert [e["epoch"] for e in epochs] == list(range(1, 8))
    assert sum(e["epoch_seconds"] for e in epochs) == pytest.approx(row["training"])
    failed, _ = logs.parse_run(make_run(tmp_path / "camp", "run_001", minutes=10, success=False))
    assert failed["status"] == "aborted" and not failed["converged"] and math.isnan(failed["epochs_to_converge"])


def test_staging_in_init_is_its_own_column_and_not_part_of_the_time_to_train(tmp_path):
    """The staging events moved before run_start (data.stage_timing=in_init): the timed parts still add up."""
    run = make_run(tmp_path / "camp", "run_000", minutes=10)
    events = mlperf_log.read_events(run / "mlperf.log", strict=True)
    start = next(e["time_ms"] for e in events if e["key"] == "run_start")
    for e in events:
        if e["key"] in ("staging_start", "staging_stop"):
            e["time_ms"] = start - 20_000 + (5_000 if e["key"] == "staging_stop" else 0)
    (run / "mlperf.log").write_text("".join(":::MLLOG " + json.dumps(e) + "\n" for e in events))
    row, _ = logs.parse_run(run)
    assert row["staging"] == 0 and row["init_staging"] == pytest.approx(5)
    assert row["training"] + row["evaluation"] + row["other"] == pytest.approx(row["time_to_train"], abs=0.01)
    assert row["staging_ratio"] == pytest.approx(5 / (row["training"] / 7))



def test_runs_are_found_below_campaigns_but_not_in_aborted_or_submission(tmp_path):
    make_run(tmp_path / "camp", "run_000", 10)
    make_run(tmp_path / "camp", "run_001", 11)
    write_log(tmp_path / "camp/runs/aborted/run_001-x/mlperf.log", T0, 3, 1)
    write_log(tmp_path / "camp/submission/results/s/strong/deepcam/mlperf.log", T0, 3, 1)
    assert [p.name for p in logs.find_runs([tmp_path / "camp"])] == ["run_000", "run_001"]
    with pytest.raises(BenchError, match=r"empty: holds no mlperf.log"):
        (tmp_path / "empty").mkdir()
        logs.find_runs([tmp_path / "empty"])


def test_bad_logs_are_named(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a/mlperf.log").write_text("hello\n")
    with pytest.raises(BenchError, match=r"a/mlperf.log: no :::MLLOG events"):
        logs.parse_run(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b/mlperf.log").write_text(':::MLLOG {"key": "run_start", "time_ms": 1}\n:::MLLOG {broken\n')
    with pytest.raises(BenchError, match=r"b/mlperf.log:2: not a JSON MLPerf event"):
        logs.parse_run(tmp_path / "b")


def constructed_runs() -> pd.DataFrame:
    """Runs with throughput 100 U^0.9 samples/s and epochs to converge 2 B^0.5, local batch 4, no staging
    or evaluation, 8,000 training samples: time to train = epochs x 8000 / throughput."""
    rows = []
    for units in (1, 2, 4):
        for seed in range(3):
            batch = 4 * units
            epochs, rate = 2 * batch ** 0.5, 100 * units ** 0.9
            rows.append({"benchmark": "cosmoflow", "units": units, "global_batch_size": batch, "local_batch_size": 4,
                         "converged": True, "epochs_to_converge": epochs, "epochs": epochs, "samples_per_second": rate,
                         "train_samples": 8000, "staging": 0.0, "evaluation": 0.0, "training": epochs * 8000 / rate,
                         "time_to_train": epochs * 8000 / rate, "seed": seed})
    return pd.DataFrame(rows)


def test_prediction_recovers_the_constructed_laws():
    runs = constructed_runs()
    far = predict.predict(runs, "cosmoflow", units=16, global_batch_size=64)
    epochs, rate = 2 * 64 ** 0.5, 100 * 16 ** 0.9
    assert far.samples_per_second == pytest.approx(rate, rel=1e-9)
    assert far.epochs == pytest.approx(epochs, rel=1e-9)  # extended as a power law beyond the measured batches
    assert far.time_to_solution == pytest.approx(epochs * 8000 / rate, rel=1e-9)
    assert math.isnan(far.measured) and far.measured_runs == "not run" and "U^0.900" in far.throughput_model
    inside = predict.predict(runs, "cosmoflow", units=2, global_batch_size=8)
    assert inside.measured == pytest.approx(2 * 8 ** 0.5 * 8000 / (100 * 2 ** 0.9))
    assert inside.measured_runs == "3 of 3 converged" and "at local batch 4" in inside.throughput_model
    assert abs(inside.relative_error) < 1e-9


def test_epochs_beyond_the_measured_batches_stay_positive():
    # Falling with batch size (as the study's batch 4 and 8 did): a straight line would go below zero at 16.
    value = predict.epochs_at(np.array([4.0, 8.0]), np.array([14.0, 9.0]), 16)
    assert value == pytest.approx(9 * (9 / 14)) and value > 0


def test_prediction_holds_out_the_measured_configuration_and_reports_its_error():
    runs = constructed_runs()
    runs.loc[runs["units"] == 4, "time_to_train"] *= 1.25  # measured 25% slower than the laws say
    p = predict.predict(runs, "cosmoflow", units=4, global_batch_size=16)
    assert p.relative_error == pytest.approx(1 / 1.25 - 1, rel=1e-6)
    with pytest.raises(BenchError, match=r"no runs of deepcam to predict from"):
        predict.predict(runs, "deepcam", 2, 8)
    # The configuration predicted is left out of the fits: with nothing else measured there is nothing to learn.
    with pytest.raises(BenchError, match=r"only 2 units at batch 8 was measured; a prediction needs other"):
        predict.predict(runs[runs["units"] == 2], "cosmoflow", 2, 8)


def test_analyses_of_the_constructed_runs():
    runs = constructed_runs()
    conv = analyses.convergence(runs)
    assert conv["epochs_mean"].tolist() == pytest.approx([4, 2 * 8 ** 0.5, 8]) and conv["failed"].tolist() == [0, 0, 0]
    scal = analyses.scaling(runs)
    assert scal["per_unit"].tolist() == pytest.approx([100 * u ** -0.1 for u in (1, 2, 4)])
    join = analyses.compute_time(runs)
    assert join["compute_seconds"].tolist() == pytest.approx(join["measured_training_and_eval_seconds"].tolist())
    var = analyses.variability(runs)
    assert var["time_to_train_cv"].fillna(0).tolist() == pytest.approx([0, 0, 0], abs=1e-12)
    # identical runs: the olympic mean is their time, and its bootstrap interval has no width
    for column in ("time_to_train_olympic", "olympic_ci95_low", "olympic_ci95_high"):
        assert var[column].tolist() == pytest.approx(var["time_to_train_mean"].tolist())
    # Weak scaling at local batch 4: per-unit throughput 100 U^-0.1 against U=1's.
    assert scal["efficiency"].tolist() == pytest.approx([u ** -0.1 for u in (1, 2, 4)])
    assert analyses.strong_scaling(runs).empty  # each global batch ran on one unit count only


def test_strong_scaling_and_the_system_figures_per_configuration():
    runs = constructed_runs()
    same_batch = runs[runs["units"] == 2].assign(units=4, samples_per_second=300.0)  # B=8 on 4 units too
    runs = pd.concat([runs, same_batch], ignore_index=True)
    strong = analyses.strong_scaling(runs)
    row = strong[(strong["global_batch_size"] == 8) & (strong["units"] == 4)].iloc[0]
    assert row["speedup"] == pytest.approx(300 / (100 * 2 ** 0.9)) and row["efficiency"] == pytest.approx(
        row["speedup"] / 2)
    system = {"sustained_gflops": 50.0, "fraction_of_peak": 0.4, "input_wait_share": 0.05, "allreduce_share": 0.2,
              "allreduce_wait_share": 0.1, "allreduce_gb_per_s": 1.5, "energy_j_per_sample": None,
              "peak_rss_mb": [900.0, 1000.0],
              "step_breakdown": {"compute": 0.7, "allreduce": 0.2, "input_wait": 0.05, "other": 0.05}}
    columns = logs.system_columns(system)
    assert columns["peak_rss_mb"] == 1000.0 and math.isnan(columns["energy_j_per_sample"])
    assert columns["step_allreduce"] == 0.2 and math.isnan(logs.system_columns(None)["fraction_of_peak"])
    with_system = runs.assign(**columns)
    table = analyses.system(with_system)
    assert len(table) == 4 and table["fraction_of_peak"].tolist() == pytest.approx([0.4] * 4)
    assert (table["step_compute"] + table["step_allreduce"] + table["step_input_wait"] + table["step_other"]).tolist() \
        == pytest.approx([1.0] * 4)
    both = pd.concat([with_system.assign(precision="float32"),
                      with_system.assign(precision="mixed_bfloat16", fraction_of_peak=0.1)], ignore_index=True)
    split = analyses.system(both)  # each precision's fraction is against its own peak: never averaged together
    assert len(split) == 8 and split.groupby("precision")["fraction_of_peak"].mean().to_dict() == pytest.approx(
        {"float32": 0.4, "mixed_bfloat16": 0.1})
    assert logs.trained_precision({"precision": {"precision": "mixed_bfloat16"}}) == "mixed_bfloat16"
    assert logs.trained_precision({"config": {"train": {"precision": "float32"}}}) == "float32"
    assert logs.trained_precision({}) == "unknown"
    png = report.figures.step_breakdown(table)
    assert 300 < png_size(png)[0] < 1500
    assert analyses.system(runs.assign(**logs.system_columns(None))).empty  # runs without the object: no table


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_report_writes_html_with_embedded_figures_markdown_and_csv(tmp_path, capsys):
    for i, minutes in enumerate([10, 11, 12]):
        make_run(tmp_path / "camp", f"run_{i:03d}", minutes, seed=i)
    make_run(tmp_path / "camp", "run_003", 12, seed=3, success=False)
    out = tmp_path / "report"
    assert analysis_main(["report", str(tmp_path / "camp"), "--out", str(out), "--predict", "deepcam:4:16"]) == 0
    html = (out / "report.html").read_text()
    figures = sorted(p.name for p in (out / "figures").iterdir())
    assert figures == ["breakdown.png", "compute_time_deepcam.png", "convergence_deepcam.png", "efficiency_deepcam.png",
                       "throughput_deepcam.png", "variability.png"]
    assert html.count("data:image/png;base64,") == len(figures)
    for name in figures:
        width, height = png_size((out / "figures" / name).read_bytes())
        assert 300 < width < 1500 and 150 < height < 1500, (name, width, height)
    md = (out / "summary.md").read_text()
    assert "## Epochs to converge against batch size" in md and "![breakdown.png](figures/breakdown.png)" in md
    assert "## Predicted time to solution" in md and "linear scaling from the one measured scale" in md
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 4 and runs["converged"].sum() == 3
    assert "4 runs, 28 epochs read" in capsys.readouterr().out
    assert not list(tmp_path.glob(".report.tmp*"))


def test_the_runs_command_and_a_bad_target(tmp_path, capsys):
    make_run(tmp_path / "camp", "run_000", 10)
    assert analysis_main(["runs", str(tmp_path / "camp"), "--csv", str(tmp_path / "runs.csv")]) == 0
    assert pd.read_csv(tmp_path / "runs.csv")["time_to_train"].iloc[0] == pytest.approx(600, abs=0.01)
    with pytest.raises(SystemExit):
        analysis_main(["predict", str(tmp_path / "camp"), "--predict", "deepcam:x:8"])
    assert "expected BENCHMARK:UNITS:GLOBAL_BATCH" in capsys.readouterr().err
    assert np.isfinite(pd.read_csv(tmp_path / "runs.csv")["samples_per_second"].iloc[0])


def _split_at_epoch(log, run, epoch_cut: int) -> None:
    """`log` cut into two attempts the way a stop inside epoch `epoch_cut` and a resume leave them: attempt 1
    ends with that epoch's epoch_stop and run_stop aborted; attempt 2 repeats init, logs run_start and
    resumed_from_checkpoint, and goes on from epoch_start of `epoch_cut`."""
    events = mlperf_log.read_events(log, strict=True)
    starts = [i for i, e in enumerate(events) if e["key"] == "epoch_start"]
    cut = starts[epoch_cut - 1]
    run_start = next(i for i, e in enumerate(events) if e["key"] == "run_start")
    middle = (events[cut]["time_ms"] + events[cut + 1]["time_ms"]) // 2
    stop = [{**events[cut], "key": "epoch_stop", "event_type": "INTERVAL_END", "time_ms": middle},
            {**events[-1], "time_ms": middle + 100, "metadata": {**events[-1]["metadata"], "status": "aborted"}}]
    first = events[:cut + 1] + stop
    shift = middle + 5000 - events[0]["time_ms"]  # attempt 2 starts 5 s after attempt 1 stopped
    head = [{**e, "time_ms": e["time_ms"] + shift} for e in events[:run_start + 1]]
    resumed = {**head[-1], "key": "resumed_from_checkpoint", "event_type": "POINT_IN_TIME",
               "value": {"epoch": epoch_cut, "step": 3, "attempt": 2}}
    offset = head[-1]["time_ms"] + 100 - events[cut]["time_ms"]
    second = head + [resumed] + [{**e, "time_ms": e["time_ms"] + offset} for e in events[cut:]]
    for path, part in ((run / "attempts" / "1" / "mlperf.log", first), (run / "mlperf.log", second)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(":::MLLOG " + json.dumps(e) + "\n" for e in part))


def test_a_resumed_run_is_one_row_with_its_attempts_added_up(tmp_path):
    whole = make_run(tmp_path / "camp", "run_000", minutes=10)
    split = tmp_path / "camp" / "runs" / "run_001"
    split.mkdir()
    (split / "summary.json").write_text(json.dumps({"ranks": 2}))
    _split_at_epoch(whole / "mlperf.log", split, epoch_cut=4)
    assert logs.find_runs([tmp_path / "camp"]) == [whole, split]  # attempts/ is not a run of its own
    a, epochs_a = logs.parse_run(whole)
    b, epochs_b = logs.parse_run(split)
    assert b["attempts"] == 2 and a["attempts"] == 1
    assert b["status"] == "success" and b["epochs"] == 7 and b["epochs_to_converge"] == 7
    # Both attempts' run_start .. run_stop count (init, repeated by the second, does not); the piece of
    # epoch 4 done before the stop is training time too.
    spans = []
    for log in (split / "attempts" / "1" / "mlperf.log", split / "mlperf.log"):
        times = {e["key"]: e["time_ms"] for e in logs.read_events(log) if e["key"] in ("run_start", "run_stop")}
        spans.append((times["run_stop"] - times["run_start"]) / 1000)
    assert b["time_to_train"] == pytest.approx(sum(spans), abs=1e-3)
    piece = [e for e in epochs_b if e["epoch"] == 4 and e["attempt"] == 1][0]["epoch_seconds"]
    assert b["training"] == pytest.approx(a["training"] + piece, abs=1e-3)
    # Throughput from the six whole epochs only: about the uninterrupted run's.
    assert b["samples_per_second"] == pytest.approx(a["samples_per_second"], rel=0.1)
    cut = [e for e in epochs_b if e["epoch"] == 4]
    assert [e["attempt"] for e in cut] == [1, 2] and all(math.isnan(e["samples_per_second"]) for e in cut)
    assert [e["attempt"] for e in epochs_b].count(2) == 4 and epochs_b[-1]["start"] > epochs_a[-1]["start"]
