"""benchmarks/jax_step.py's planning and reporting, without JAX (tests/integration/test_jax_step.py runs it under
the JAX backend in an environment without TensorFlow)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import jax_step  # noqa: E402  (a script beside the benchmarks, not a package)


def test_cases_follow_the_issue_order_each_batch_at_both_precisions():
    got = [(c.app, c.batch, c.precision) for c in jax_step.cases()]
    assert got == [("cosmoflow", 1, "float32"), ("cosmoflow", 1, "mixed_bfloat16"),
                   ("cosmoflow", 4, "float32"), ("cosmoflow", 4, "mixed_bfloat16"),
                   ("deepcam", 1, "float32"), ("deepcam", 1, "mixed_bfloat16"),
                   ("deepcam", 8, "float32"), ("deepcam", 8, "mixed_bfloat16")]
    assert [c.batch for c in jax_step.cases(["deepcam"], ["float32"])] == [1, 8]


def test_published_rates_per_app_and_batch():
    assert jax_step.published_rate("cosmoflow", 1) == jax_step.published_rate("cosmoflow", 4) == 207.0
    assert jax_step.published_rate("deepcam", 1) == 30.0 and jax_step.published_rate("deepcam", 8) == 82.0
    assert jax_step.published_rate("deepcam", 2) is None


def test_figures_median_rate_and_ratio_to_the_published_rate():
    case = jax_step.Case("deepcam", 8, "mixed_bfloat16")
    rec = jax_step.figures(case, [0.2, 0.1, 0.1, 0.3], 30.0, 1.25, 56_454_720, tiny=False)
    assert rec["median_step_s"] == 0.15 and rec["samples_per_s"] == pytest.approx(53.333, abs=1e-3)
    assert rec["published_h100_v3_samples_per_s"] == 82.0 and rec["step_over_published"] == pytest.approx(0.65, abs=1e-3)
    assert rec["sample_shape"] == [768, 1152, 16] and rec["parameters"] == 56_454_720
    tiny = jax_step.figures(case, [0.2], 3.0, 1.0, 10, tiny=True)
    assert tiny["sample_shape"] == [96, 144, 16] and tiny["step_over_published"] is None


def test_a_nan_loss_or_no_steps_is_an_error_naming_the_case():
    case = jax_step.Case("cosmoflow", 4, "float32")
    with pytest.raises(jax_step.JaxStepError, match="cosmoflow.*loss nan"):
        jax_step.figures(case, [0.1], 1.0, float("nan"), 1, tiny=False)
    with pytest.raises(jax_step.JaxStepError, match="0 timed steps"):
        jax_step.figures(case, [], 1.0, 0.5, 1, tiny=False)


def test_cases_past_the_budget_are_recorded_as_skipped_and_the_json_is_written_after_each(monkeypatch, tmp_path):
    monkeypatch.setattr(jax_step, "run_header", lambda tiny: {"tiny": tiny, "cases": []})
    clock = iter([0.0, 5.0, 20.0, 30.0])
    monkeypatch.setattr(jax_step.time, "perf_counter", lambda: next(clock))
    timed = []

    def fake_time_case(case, steps, warmup, tiny):
        timed.append(case)
        written = json.loads((tmp_path / "r.json").read_text()) if (tmp_path / "r.json").exists() else {"cases": []}
        assert len(written["cases"]) == len(timed) - 1  # the earlier cases are on disk before this one runs
        return jax_step.figures(case, [0.5], 1.0, 0.1, 7, tiny)

    monkeypatch.setattr(jax_step, "time_case", fake_time_case)
    args = jax_step.parse_args(["--out", str(tmp_path / "r.json"), "--apps", "cosmoflow", "--budget-s", "10",
                                "--tiny"])
    result = jax_step.run(args, started=0.0)
    assert [(c.batch, c.precision) for c in timed] == [(1, "float32"), (1, "mixed_bfloat16")]
    assert [c.get("skipped", "timed")[:6] for c in result["cases"]] == ["timed", "timed", "budget", "budget"]
    assert json.loads((tmp_path / "r.json").read_text()) == result
    assert "| cosmoflow | float32 | 4 | skipped: budget (20 s of 10 s spent) |" in jax_step.table(result)
    assert not list(tmp_path.glob("*.tmp"))


def test_a_backend_other_than_jax_is_refused_before_any_case(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks/jax_step.py"), "--out", str(tmp_path / "r.json")],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "KERAS_BACKEND": "tensorflow"})
    assert proc.returncode == 2
    assert "KERAS_BACKEND is 'tensorflow': expected 'jax'" in proc.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("argv, message", [(["--steps", "0"], "--steps 0: expected > 0"),
                                           (["--warmup", "-1"], "--warmup -1: expected >= 0"),
                                           (["--budget-s", "0"], "--budget-s 0.0: expected > 0"),
                                           (["--out", "/nonexistent/dir/r.json"], "/nonexistent/dir does not exist")])
def test_bad_arguments_exit_non_zero_naming_the_value(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        jax_step.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_failing_case_is_recorded_with_its_error_the_others_run_and_the_exit_status_is_1(monkeypatch, tmp_path,
                                                                                            capsys):
    monkeypatch.setattr(jax_step, "run_header", lambda tiny: {"tiny": tiny, "cases": []})
    monkeypatch.setattr(jax_step, "check_backend", lambda: None)

    def fake_time_case(case, steps, warmup, tiny):
        if case.batch == 8 and case.precision == "float32":
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 96.00GiB")
        return jax_step.figures(case, [0.5], 1.0, 0.1, 7, tiny)

    monkeypatch.setattr(jax_step, "time_case", fake_time_case)
    out = tmp_path / "r.json"
    assert jax_step.main(["--out", str(out), "--apps", "deepcam"]) == 1
    result = json.loads(out.read_text())
    assert [c.get("failed", "timed")[:32] for c in result["cases"]] == [
        "timed", "timed", "RuntimeError: RESOURCE_EXHAUSTED", "timed"]
    captured = capsys.readouterr()
    assert "| deepcam | float32 | 8 | failed: RuntimeError: RESOURCE_EXHAUSTED" in captured.out
    assert "1 of 4 cases failed" in captured.err
