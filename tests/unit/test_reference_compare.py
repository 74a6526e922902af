"""benchmarks/reference_compare.py: what it asks of a checkout, the pins it installs, the table it writes, and the
reference-side CosmoFlow driver's contract (run for real on a stand-in checkout: the reference itself is not
part of this repository; docs/performance.md holds the figures of a run against it)."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import reference_compare as rc  # noqa: E402  (a script beside harness.py, not a package)


def test_a_missing_or_incomplete_checkout_is_refused_with_what_it_lacks(tmp_path):
    with pytest.raises(SystemExit, match=f"--reference {tmp_path / 'nope'}: not a directory; expected a checkout "
                                         "of https://github.com/mlcommons/hpc"):
        rc.check_checkout(tmp_path / "nope", ["cosmoflow"])
    for f in rc.APPS["cosmoflow"].files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    rc.check_checkout(tmp_path, ["cosmoflow"])
    with pytest.raises(SystemExit, match="missing deepcam/src/deepCam/architecture/deeplab_xception.py"):
        rc.check_checkout(tmp_path, ["cosmoflow", "deepcam"])


def test_every_reference_package_is_pinned_and_tf_package_picks_the_tensorflow_build(monkeypatch):
    monkeypatch.delenv("TF_PACKAGE", raising=False)
    for app in rc.APPS:
        pins = rc.requirements(app)
        assert pins and all("==" in p and "#" not in p for p in pins), pins
    assert "tensorflow-cpu==2.15.1" in rc.requirements("cosmoflow")
    monkeypatch.setenv("TF_PACKAGE", "tensorflow")
    assert "tensorflow==2.15.1" in rc.requirements("cosmoflow")
    assert "torch==2.13.0" in rc.requirements("deepcam")


def test_the_table_gives_each_hosts_ratios_with_the_sgemm_rates_and_the_reference_commit():
    result = {"date": "2026-11-27", "machine": "host 2 cores", "sgemm_gflops": 143.0, "sgemm_gflops_after": 141.0,
              "cpu": "AMD EPYC 9B14, avx512f", "isa_flags": "avx2 fma avx512f avx512_bf16 avx512_vnni",
              "reference_commit": "abc123", "runs": [
                  {"app": "cosmoflow", "sample": "128^3 x 4", "local_batch": 4, "suite_over_reference": 1.1,
                   "suite": {"samples_per_second": 0.44}, "reference": {"samples_per_second": 0.4,
                                                                        "framework": "tensorflow 2.15.1"}}]}
    text = rc.table([result])
    amd = "| AMD EPYC, AVX-512 with AVX512-BF16 |"
    assert f"{amd} cosmoflow | float32 | 128^3 x 4, 4 | 0.44 | 0.4 (tensorflow 2.15.1) | 1.10 |" in text
    assert "143.0 GFLOP/s before, 141.0 after" in text and "checkout's HEAD: abc123" in text
    assert "not a mode of the references" not in text  # the bfloat16 note only where a row is bfloat16
    bf16 = {**result["runs"][0], "precision": "mixed_bfloat16", "suite_over_reference": 1.5}
    intel = {**result, "cpu": "Intel(R) Xeon(R) Processor @ 2.80GHz, avx512f", "isa_flags": "avx2 fma avx512f",
             "sgemm_gflops": 260.0, "runs": [result["runs"][0] | {"precision": "float32"}, bf16]}
    text = rc.table([result, intel])
    assert ("| Intel Xeon, AVX-512 | cosmoflow | mixed_bfloat16 | 128^3 x 4, 4 | 0.44 | 0.4 (tensorflow 2.15.1) "
            "| 1.50 |") in text and f"{amd} cosmoflow | float32" in text
    assert "Intel Xeon, AVX-512: sgemm (numpy, 2048^2, float32, all cores) 260.0 GFLOP/s" in text
    assert 'torch.autocast("cpu", dtype=torch.bfloat16)' in text and "mixed_float16" in text


@pytest.mark.parametrize("cpu,flags,slug", [
    ("AMD EPYC 7B13, avx2", "avx2 fma", "amd-epyc-avx2"),
    ("AMD EPYC 9B14, avx512f", "avx2 fma avx512f avx512_bf16", "amd-epyc-avx512_bf16"),
    ("Intel(R) Xeon(R) Processor @ 2.80GHz, avx512f", "avx2 fma avx512f avx512_vnni", "intel-xeon-avx512f"),
    ("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz, avx512f", "avx512f avx512_bf16 amx_bf16 amx_tile",
     "intel-xeon-amx_bf16"),
])
def test_each_host_kind_keeps_its_own_results_file(cpu, flags, slug):
    assert rc.results_path({"cpu": cpu, "isa_flags": flags}).name == f"reference_compare_{slug}.json"


def test_the_reference_cosmoflow_driver_builds_the_checkouts_model_from_its_config_and_times_it(tmp_path):
    # A stand-in checkout with the reference's layout and build_model signature (a small Keras model).
    models = tmp_path / "cosmoflow/models"
    models.mkdir(parents=True)
    (models / "__init__.py").write_text("")
    (models / "cosmoflow.py").write_text(textwrap.dedent("""\
        import tensorflow as tf
        def build_model(input_shape, target_size, conv_size=32, dropout=0.5):
            return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Conv3D(conv_size, 3),
                                        tf.keras.layers.Flatten(), tf.keras.layers.Dropout(dropout),
                                        tf.keras.layers.Dense(target_size)])
        """))
    (tmp_path / "cosmoflow/configs").mkdir()
    (tmp_path / "cosmoflow/configs/cosmo.yaml").write_text(
        "model:\n  name: cosmoflow\n  input_shape: [128, 128, 128, 4]\n  target_size: 4\n  conv_size: 2\n")
    for precision, output in (("float32", "float32"), ("mixed_bfloat16", "bfloat16")):
        out = tmp_path / f"step-{precision}.json"
        proc = subprocess.run([sys.executable, str(REPO / "benchmarks/reference/cosmoflow_step.py"), "--checkout",
                               str(tmp_path), "--size", "8", "--batch", "2", "--steps", "3", "--warmup", "1",
                               "--precision", precision, "--out", str(out)], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        res = json.loads(out.read_text())
        assert res["model_args"] == {"input_shape": [8, 8, 8, 4], "target_size": 4, "conv_size": 2}
        assert len(res["step_seconds"]) == 3 and all(s > 0 for s in res["step_seconds"])
        assert res["parameters"] == (27 * 4 + 1) * 2 + (6 ** 3 * 2 + 1) * 4
        assert res["framework"].startswith("tensorflow ") and len(res["model_file_sha256"]) == 64
        assert res["precision"] == precision and res["output_dtype"] == output  # the policy reached the model
        assert not out.with_name(out.name + ".tmp").exists()


def test_the_reference_runs_with_onednn_on_unless_the_user_says_otherwise(monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    assert rc.reference_env()["TF_ENABLE_ONEDNN_OPTS"] == "1"
    monkeypatch.delenv("ONEDNN_DEFAULT_FPMATH_MODE", raising=False)
    assert rc.reference_env()["ONEDNN_DEFAULT_FPMATH_MODE"] == "STRICT"
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    assert rc.reference_env()["TF_ENABLE_ONEDNN_OPTS"] == "0"


def test_rounds_alternate_the_two_sides_pool_their_steps_and_keep_each_rounds_ratio(monkeypatch, tmp_path):
    import harness
    order, speeds = [], {"suite": iter([2.0, 4.0, 3.0]), "reference": iter([4.0, 4.0, 5.0])}

    def fake(side):
        def run(*args):
            order.append(side)
            seconds = next(speeds[side])
            return {"step_seconds": [seconds], **rc.step_figures([seconds], 1, 1), "local_batch": 1, "ranks": 1,
                    "framework": "torch 2.13.0+cpu"}
        return run
    monkeypatch.setattr(rc, "run_suite", fake("suite"))
    monkeypatch.setattr(rc, "run_reference", fake("reference"))
    monkeypatch.setattr(rc, "reference_python", lambda app: Path(sys.executable))
    monkeypatch.setattr(harness, "sgemm_gflops", lambda: 100.0)
    run = rc.compare("deepcam", tmp_path, None, None, "float32", rounds=3)
    assert order == ["suite", "reference", "reference", "suite", "suite", "reference"]
    assert run["rounds"] == 3 and run["suite"]["step_seconds"] == [2.0, 4.0, 3.0]
    assert run["suite"]["median_step_seconds"] == 3.0 and run["reference"]["median_step_seconds"] == 4.0
    assert run["suite_over_reference"] == pytest.approx(4 / 3)  # pooled medians: 1/3 against 1/4 samples/s
    assert run["suite_over_reference_per_round"] == pytest.approx([2.0, 1.0, 5 / 3])
    assert rc.ratio_cell(run) == "1.33 (rounds 1.00-2.00)"
    with pytest.raises(ValueError, match="rounds 0: expected at least 1"):
        rc.compare("deepcam", tmp_path, None, None, "float32", rounds=0)


def test_each_side_at_its_own_fastest_precision_gets_a_row_of_its_own():
    def run(precision, suite, reference):
        return {"app": "deepcam", "precision": precision, "sample": "768 x 1152 x 16", "local_batch": 1,
                "suite": {"samples_per_second": suite}, "rounds": 2, "suite_over_reference": suite / reference,
                "reference": {"samples_per_second": reference, "framework": "torch 2.13.0+cpu"}}
    # A host without a bfloat16 unit: the suite is behind in (emulated) bfloat16, ahead at each side's best.
    runs = [run("float32", 0.0616, 0.0528), run("mixed_bfloat16", 0.0277, 0.0303),
            {**run("float32", 1.14, 1.03), "app": "cosmoflow", "sample": "128^3 x 4", "local_batch": 4}]
    best = rc.best_precisions(runs)
    assert len(best) == 1  # CosmoFlow was measured in one precision only
    assert best[0]["suite_precision"] == best[0]["reference_precision"] == "float32"
    assert best[0]["suite_over_reference"] == pytest.approx(0.0616 / 0.0528)
    runs[1] = run("mixed_bfloat16", 0.09, 0.0303)  # an AMX host: the suite's best is bfloat16, the reference's not
    best = rc.best_precisions(runs)[0]
    assert (best["suite_precision"], best["reference_precision"]) == ("mixed_bfloat16", "float32")
    assert best["suite_over_reference"] == pytest.approx(0.09 / 0.0528)
    result = {"date": "2026-12-06", "machine": "vm 2 cores", "sgemm_gflops": 250.0, "sgemm_gflops_after": 240.0,
              "cpu": "Intel(R) Xeon(R) Processor @ 2.80GHz, avx512f", "isa_flags": "avx2 fma avx512f",
              "reference_commit": "2c627d4", "runs": runs}
    text = rc.table([result])
    assert ("| Intel Xeon, AVX-512 | deepcam | each side's fastest: suite mixed_bfloat16, reference float32 "
            "| 768 x 1152 x 16, 1 | 0.09 | 0.0528 (torch 2.13.0+cpu) | 1.70 |") in text
    assert "250.0 GFLOP/s before, 240.0 after; 2 round(s) per row" in text
