"""Published MLPerf HPC results trees read and scored as the rules do (common/campaign/analysis/published.py,
scores.py, common/campaign/rules.py).

The fixture (tests/fixtures/mlperf_hpc_v1.0) holds three NVIDIA v1.0 submissions, unchanged. Each failure rule is
pinned on a copy of it in tmp_path with one result file edited: cut before run_stop, evaluations moved across the
target while the status says the opposite, a non-JSON line, an empty file, a repeated seed. The official scores
of NVIDIA/result_summarizer.csv are reproduced from the whole shared selection where it is present.
"""
from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from common.campaign import rules
from common.campaign.analysis import published, scores
from common.campaign.analysis.__main__ import main

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mlperf_hpc_v1.0"
SHARED = Path("/work/shared/mlperf_hpc_results_v1.0")
COSMO = "NVIDIA/results/dgxa100_n16_ngc21.09_mxnet/strong/cosmoflow"
DEEPCAM = "NVIDIA/results/dgxa100_n256_ngc21.09_pytorch/strong/deepcam"
WEAK = "NVIDIA/results/dgxa100_n512_ngc21.09_mxnet/weak/cosmoflow"
BASE_KEYS = {"submitter", "system", "benchmark", "scaling", "division", "round", "runs", "converged",
             "score_minutes", "score_minutes_rcp", "unscored_reason", "units", "accelerators", "processors",
             "global_batch_size", "epochs_mean", "epochs_std", "train_samples_per_second_per_unit",
             "eval_samples_per_second_per_unit", "staging_minutes_mean", "staging_minutes_std",
             "compute_budget_unit_hours"}


# ---------------------------------------------------------------------------- helpers
def tree(tmp_path: Path, name: str = "hpc_results_v1.0") -> Path:
    """A writable copy of the fixture below `name`."""
    root = tmp_path / name
    shutil.copytree(FIXTURE, root)
    return root


def row_of(root: Path, folder: str, round_: str | None = "1.0") -> tuple[scores.ScoreRow, list[str]]:
    result = scores.score_roots([root], round_)
    system, benchmark = folder.split("/")[2], folder.split("/")[-1]
    return next(r for r in result.rows if r.system == system and r.benchmark == benchmark), result.warnings


def edit(path: Path, change) -> None:
    """Rewrite each :::MLLOG line's event through change(event) (None drops the line)."""
    out = []
    for line in path.read_text().splitlines():
        if line.startswith(":::MLLOG "):
            event = change(json.loads(line[len(":::MLLOG "):]))
            if event is None:
                continue
            line = ":::MLLOG " + json.dumps(event)
        out.append(line)
    path.write_text("\n".join(out) + "\n")


def set_value(key: str, value):
    def change(event):
        if event["key"] == key:
            event["value"] = value
        return event
    return change


def minutes_of(folder: Path) -> dict[str, float]:
    """Each result file's run_stop - run_start, from the log reader."""
    return {p.name: (r.run_stop - r.run_start) / 60_000 for p in published.result_files(folder)
            for r in [published.read_run(p)]}


def olympic_without(folder: str, failed: set[str]) -> float:
    """The olympic mean of the fixture's runs of `folder` with the runs `failed` failed."""
    times = minutes_of(FIXTURE / folder)
    return rules.olympic([None if name in failed else m for name, m in sorted(times.items())]).minutes


# ---------------------------------------------------------------------------- the rules' tables
@pytest.mark.parametrize("ruleset", ["1.0.0", "2.0.0", "3.0.0"])
def test_the_targets_are_the_compliance_checkers(ruleset):
    import mlperf_logging
    folder = Path(mlperf_logging.__file__).parent / "compliance_checker" / f"hpc_{ruleset}"
    for name, goal in rules.TARGETS.items():
        path = folder / f"closed_{name}.yaml"
        if not path.is_file():
            continue  # openfold before 3.0
        entry = next(e["KEY"] for e in yaml.safe_load(path.read_text()) if e.get("KEY", {}).get("ATLEAST_ONE_CHECK"))
        numbers = [float(x) for x in re.findall(r"[\d.]+\d|\d", entry["ATLEAST_ONE_CHECK"])]
        assert entry["NAME"] == goal.metric
        assert sorted(numbers) == sorted([goal.threshold, goal.bound]), (path, entry)
        assert goal.met(goal.threshold) and not goal.met(goal.threshold + (0.001 if goal.lower_is_better else -0.001))


def test_run_counts_rounds_and_pruning():
    assert [rules.required_runs(b) for b in ("cosmoflow", "deepcam", "oc20", "openfold")] == [10, 5, 5, 10]
    assert rules.round_benchmarks("0.7") == ["cosmoflow", "deepcam"] and "openfold" in rules.round_benchmarks("3.0")
    assert rules.ruleset("0.7") == "1.0.0" and rules.ruleset("2.0") == "2.0.0"
    assert not rules.prunes_duplicate_seeds("1.0") and rules.prunes_duplicate_seeds("2.0")
    assert rules.duplicate_seeds([3, None, 4, 3, None, 4]) == [3, 5]
    assert rules.olympic([10.0, None, 12.0, 11.0]).minutes == pytest.approx(11.5)  # 10 goes, the failure too
    assert "2 runs failed" in rules.olympic([10.0, None, None, 11.0]).reason


# ---------------------------------------------------------------------------- official scores
def official_scores() -> list[dict]:
    """The rows of NVIDIA/result_summarizer.csv (a strong table, then a weak one) whose logs are in SHARED."""
    text = (SHARED / "NVIDIA" / "result_summarizer.csv").read_text()
    weak_at = text.index("division,", 1)
    rows = []
    for scaling, part in (("strong", text[:weak_at]), ("weak", text[weak_at:])):
        for row in csv.DictReader(part.splitlines()):
            for benchmark in ("cosmoflow", "deepcam", "oc20"):
                key = benchmark if scaling == "strong" else f"{benchmark}:time_to_train_all"
                if row.get(key) and (SHARED / "NVIDIA/results" / row["system"] / scaling / benchmark).is_dir():
                    rows.append({"system": row["system"], "benchmark": benchmark, "scaling": scaling,
                                 "minutes": float(row[key]), "models": row.get(f"{benchmark}:number_of_models"),
                                 "scale": row.get(f"{benchmark}:instance_scale"),
                                 "accelerators": int(row["accelerators_count"]),
                                 "processors": int(row["host_processors_count"])})
    return rows


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} (the shared v1.0 selection) is not on this machine")
def test_the_official_scores_of_nvidia_are_reproduced():
    expected = official_scores()
    assert sorted(e["scaling"] for e in expected) == ["strong"] * 4 + ["weak"]
    ours = {(r.system, r.benchmark, r.scaling): r for r in scores.score_roots([SHARED / "NVIDIA"], "1.0").rows}
    for e in expected:
        row = ours[(e["system"], e["benchmark"], e["scaling"])]
        assert row.score_minutes == pytest.approx(e["minutes"], rel=1e-12, abs=1e-12), e
        assert (row.accelerators, row.processors) == (e["accelerators"], e["processors"])
        if e["scaling"] == "weak":
            assert (row.models, row.instance_scale) == (int(float(e["models"])), int(float(e["scale"])))


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} (the shared v1.0 selection) is not on this machine")
def test_every_submission_of_the_shared_selection_is_scored_and_the_round_comes_from_the_folder_name():
    result = scores.score_roots([SHARED], None)
    assert len(result.rows) == 27 and all(r.round == "1.0" and r.score_minutes for r in result.rows)
    fugaku = next(r for r in result.rows if r.system == "fugaku_512xA64FX_tensorflow_closed")
    assert (fugaku.accelerators, fugaku.units) == (0, 512)  # CPU only: a unit per node
    assert all(r.converged == r.runs for r in result.rows)


# ---------------------------------------------------------------------------- the fixture, unchanged
def test_the_fixture_scores_its_published_numbers_and_rows_carry_the_documented_keys(capsys):
    assert main(["scores", str(FIXTURE), "--round", "1.0", "--json"]) == 0
    rows = {(r["benchmark"], r["scaling"]): r for r in json.loads(capsys.readouterr().out)}
    strong, deepcam, weak = rows["cosmoflow", "strong"], rows["deepcam", "strong"], rows["cosmoflow", "weak"]
    assert strong["score_minutes"] == pytest.approx(25.781025, abs=1e-12) and strong["runs"] == 10
    assert deepcam["score_minutes"] == pytest.approx(1.6677277777777777, abs=1e-12)
    assert weak["score_minutes"] == pytest.approx(43.893449999999994, abs=1e-12)
    assert (weak["models"], weak["instance_scale"], weak["units"]) == (32, 128, 4096)
    assert weak["models_per_minute"] == pytest.approx(32 / weak["score_minutes"])
    assert set(strong) == BASE_KEYS and set(weak) == BASE_KEYS | set(scores.WEAK_KEYS)
    assert (strong["units"], strong["accelerators"], strong["division"]) == (128, 128, "closed")
    assert strong["compute_budget_unit_hours"] == pytest.approx(128 * strong["score_minutes"] / 60)
    assert strong["staging_minutes_mean"] > 0 and strong["epochs_mean"] > 0 and strong["unscored_reason"] == ""


def test_the_rcp_normalisation_is_the_rcp_checkers(tmp_path):
    from mlperf_logging.rcp_checker import rcp_checker
    row, _ = row_of(FIXTURE, DEEPCAM)
    passed, _, factor = rcp_checker.check_directory(str(FIXTURE / DEEPCAM), "hpc", "1.0.0", False, False,
                                                    rcp_pass="pruned_rcps")
    assert passed and row.score_minutes_rcp == pytest.approx(row.score_minutes * factor)


# ---------------------------------------------------------------------------- rounds and ROOTs
def test_without_a_round_the_command_asks_for_one(capsys):
    assert main(["scores", str(FIXTURE)]) == 2
    assert "pass --round" in capsys.readouterr().err


def test_the_round_comes_from_a_folder_named_hpc_results_vX_Y(tmp_path):
    root = tree(tmp_path, "hpc_results_v2.0")
    assert {r.round for r in scores.score_roots([root / "NVIDIA"], None).rows} == {"2.0"}
    assert {r.round for r in scores.score_roots([root], "3.0").rows} == {"3.0"}  # --round wins


def test_a_v0_7_tree_has_no_scaling_level_and_is_scored_with_the_1_0_rules(tmp_path, capsys):
    system = tmp_path / "hpc_results_v0.7/NVIDIA/results/dgxa100_n256_ngc21.09_pytorch"
    shutil.copytree(FIXTURE / DEEPCAM, system / "deepcam")
    assert main(["scores", str(tmp_path / "hpc_results_v0.7"), "--json"]) == 0
    captured = capsys.readouterr()
    (row,) = json.loads(captured.out)
    assert (row["round"], row["scaling"], row["benchmark"]) == ("0.7", "strong", "deepcam")
    assert row["score_minutes"] == pytest.approx(1.6677277777777777, abs=1e-12)
    assert row["score_minutes_rcp"] is None and row["division"] == "closed"  # no RCPs; the division from the logs
    assert "note: round 0.7 has no ruleset in mlperf-logging: scored with the 1.0 targets" in captured.err


@pytest.mark.parametrize("make", ["missing", "file", "empty"])
def test_a_bad_root_is_exit_2(tmp_path, capsys, make):
    root = tmp_path / "root"
    if make == "file":
        root.write_text("not a tree")
    elif make == "empty":
        root.mkdir()
    assert main(["scores", str(root), "--round", "1.0"]) == 2
    assert str(root) in capsys.readouterr().err


def test_the_command_never_writes_under_root(tmp_path, capsys):
    root = tree(tmp_path)
    (root / COSMO / "result_3.txt").write_text("")  # a failure to report, not to repair

    def listing():
        return sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*"))

    before = listing()
    assert main(["scores", str(root), "--check"]) == 0
    assert main(["scores", str(root), "--json"]) == 0
    assert listing() == before
    assert "compliance checker" in capsys.readouterr().err


def test_a_campaign_is_scored_by_the_same_rules(tmp_path):
    from tests.unit.test_scoring import make_campaign
    make_campaign(tmp_path / "c", [(0, 10, True), (20, 12, True), (40, 11, True), (60, 14, False), (80, 13, True)])
    row = scores.score_roots([tmp_path / "c"], None).rows[0]
    assert (row.benchmark, row.scaling, row.round, row.runs, row.converged) == ("deepcam", "strong", "3.0", 5, 4)
    assert row.score_minutes == pytest.approx(12.0, abs=1e-6)  # as scoring.score_campaign gives it


# ---------------------------------------------------------------------------- each failure rule
def test_a_run_cut_before_run_stop_fails_and_its_half_line_is_reported(tmp_path):
    root = tree(tmp_path)
    path = root / COSMO / "result_2.txt"
    lines = path.read_text().splitlines()
    stop = next(i for i, line in enumerate(lines) if '"run_stop"' in line)
    path.write_text("\n".join(lines[:stop - 1]) + "\n" + lines[stop - 1][:40])  # a half-written last line
    row, warnings = row_of(root, COSMO)
    assert row.converged == 9 and row.score_minutes == pytest.approx(olympic_without(COSMO, {"result_2.txt"}))
    assert any(w.startswith(f"{path}:{stop}: not a JSON MLPerf event") for w in warnings), warnings


def test_convergence_is_an_evaluation_at_the_target_whatever_the_status_says(tmp_path):
    root = tree(tmp_path)
    missed, said_aborted = root / COSMO / "result_4.txt", root / COSMO / "result_5.txt"
    edit(missed, lambda e: {**e, "value": 0.2} if e["key"] == "eval_error" else e)  # status still success
    edit(said_aborted, lambda e: {**e, "metadata": {**e["metadata"], "status": "aborted"}}
         if e["key"] == "run_stop" else e)
    row, _ = row_of(root, COSMO)
    assert row.converged == 9
    assert row.score_minutes == pytest.approx(olympic_without(COSMO, {"result_4.txt"}))


def test_a_deepcam_run_below_the_target_fails(tmp_path):
    root = tree(tmp_path)
    edit(root / DEEPCAM / "result_1.txt", lambda e: {**e, "value": 0.81} if e["key"] == "eval_accuracy" else e)
    row, _ = row_of(root, DEEPCAM)
    assert row.converged == 4
    assert row.score_minutes == pytest.approx(olympic_without(DEEPCAM, {"result_1.txt"}))


def test_a_non_json_line_and_a_malformed_event_are_reported_and_skipped(tmp_path):
    root = tree(tmp_path)
    path = root / COSMO / "result_1.txt"
    lines = path.read_text().splitlines()
    lines[3:3] = [':::MLLOG {"key": "eval_error", "value": 0.01, ', ':::MLLOG {"key": "eval_error", "value": 0.01, '
                  '"time_ms": "later", "metadata": {"epoch_num": 1}}']
    path.write_text("\n".join(lines) + "\n")
    row, warnings = row_of(root, COSMO)
    assert row.score_minutes == pytest.approx(25.781025, abs=1e-9)  # the run is read as before
    assert any(w.startswith(f"{path}:4: not a JSON MLPerf event") for w in warnings), warnings
    assert any(w.startswith(f"{path}:5: an event without") for w in warnings), warnings


def test_an_empty_file_is_a_failed_run(tmp_path):
    root = tree(tmp_path)
    (root / COSMO / "result_7.txt").write_text("")
    row, warnings = row_of(root, COSMO)
    assert (row.runs, row.converged) == (10, 9)
    assert row.score_minutes == pytest.approx(olympic_without(COSMO, {"result_7.txt"}))
    assert any("result_7.txt: empty file" in w for w in warnings)


def test_more_failures_than_the_rules_allow_leave_the_submission_unscored(tmp_path, capsys):
    root = tree(tmp_path)
    (root / DEEPCAM / "result_2.txt").write_text("")
    edit(root / DEEPCAM / "result_3.txt", lambda e: None if e["key"] == "run_stop" else e)
    row, _ = row_of(root, DEEPCAM)
    assert row.score_minutes is None and row.score_minutes_rcp is None and row.compute_budget_unit_hours is None
    assert row.unscored_reason == "2 runs failed; the rules drop at most 1 (as the slowest)"
    assert main(["scores", str(root / "NVIDIA")]) == 0
    assert "2 runs failed" in capsys.readouterr().out


def test_a_repeated_seed_is_pruned_from_round_2_0(tmp_path):
    root = tree(tmp_path)
    seed = published.read_run(root / DEEPCAM / "result_1.txt").values["seed"]
    edit(root / DEEPCAM / "result_4.txt", set_value("seed", seed))
    kept, _ = row_of(root, DEEPCAM, "1.0")
    assert kept.score_minutes == pytest.approx(1.6677277777777777, abs=1e-12)
    pruned, _ = row_of(root, DEEPCAM, "2.0")
    assert pruned.score_minutes is None
    assert f"result_4.txt repeats the seed {seed} of result_1.txt" in pruned.unscored_reason
    assert "4 runs count; the rules ask for 5" in pruned.unscored_reason


def test_a_weak_instance_that_fails_is_not_counted(tmp_path):
    root = tree(tmp_path)
    (root / WEAK / "result_1.txt").write_text("")
    row, _ = row_of(root, WEAK)
    assert (row.runs, row.models, row.converged) == (32, 31, 31) and row.score_minutes is not None


def test_a_benchmark_outside_the_round_is_listed_unscored(tmp_path):
    root = tree(tmp_path)
    shutil.copytree(root / DEEPCAM, root / "NVIDIA/results/dgxa100_n256_ngc21.09_pytorch/strong/openfold")
    row, _ = row_of(root, "NVIDIA/results/dgxa100_n256_ngc21.09_pytorch/strong/openfold")
    assert row.score_minutes is None and row.unscored_reason == "openfold is not a benchmark of MLPerf HPC v1.0"


# ---------------------------------------------------------------------------- system descriptions
@pytest.mark.parametrize("value, expected", [("16", 16), (8, 8), ("4.0", 4), ("", None), ("N/A", None),
                                             (None, None), ("2x", None), (True, None), ("-1", None), (1.5, None),
                                             ("1e999", None), (float("nan"), None), (2 ** 70, 2 ** 70)])
def test_system_numbers_are_read_tolerantly(value, expected):
    assert published.tolerant_int(value) == expected


def test_an_odd_system_description_leaves_its_counts_unknown(tmp_path):
    warnings: list[str] = []
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"division": "closed", "number_of_nodes": "16", "accelerators_per_node": "N/A",
                               "host_processors_per_node": ""}))
    desc = published.read_system(odd, warnings)
    assert (desc.division, desc.nodes, desc.accelerators, desc.processors) == ("closed", 16, None, None)
    (tmp_path / "broken.json").write_text("{")
    assert published.read_system(tmp_path / "broken.json", warnings).nodes is None
    assert published.read_system(tmp_path / "absent.json", warnings).nodes is None
    assert len(warnings) == 2 and all(str(tmp_path) in w for w in warnings)
