"""train.precision=auto (common/runtime/precision.py): the probe's answer decides, both ways; it is cached per
host, shape and batch; an explicit value is kept; the dry run says what a run would choose without probing."""
from __future__ import annotations

import json
import types

import pytest

from common.runtime import plan, precision, precision_measure
from common.runtime.config import load_config
from common.runtime.dist import DistEnv
from cosmoflow.train import APP

CONFIG = "cosmoflow/configs/cosmo_mini.yaml"
TINY = ["model.input_shape=[16,16,16,4]", "model.conv_filters=[4,8,16,16]", "model.dense_units=[16,8]",
        "train.local_batch_size=2"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_BENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(precision, "EPOCHS_RECORD", tmp_path / "no-record.json")
    return tmp_path


def fake_probe(monkeypatch, seconds: dict) -> list:
    calls = []

    def measure(app, config, overrides, which, threads):
        calls.append(which)
        return seconds[which]
    monkeypatch.setattr(precision_measure, "measure_in_subprocess", measure)
    return calls


def cfg_of(*overrides):
    return load_config(CONFIG, [*TINY, *overrides], APP.config)


@pytest.mark.parametrize("bf16, chosen", [(0.5, "mixed_bfloat16"), (0.8, "mixed_bfloat16"), (0.9, "float32"),
                                          (1.7, "float32")])
def test_the_probes_answer_decides_both_ways(cache, monkeypatch, capsys, bf16, chosen):
    calls = fake_probe(monkeypatch, {"float32": 1.0, "mixed_bfloat16": bf16})
    cfg, choice = precision.choose(APP, cfg_of("train.precision=auto"), DistEnv(), CONFIG, TINY)
    assert cfg.train.precision == chosen == choice["precision"]
    assert choice["step_seconds"] == {"float32": 1.0, "mixed_bfloat16": bf16} and calls == list(precision.CANDIDATES)
    assert f"train.precision=auto -> {chosen}" in capsys.readouterr().out


def test_the_answer_is_cached_per_host_shape_and_batch(cache, monkeypatch):
    calls = fake_probe(monkeypatch, {"float32": 1.0, "mixed_bfloat16": 0.5})
    precision.choose(APP, cfg_of("train.precision=auto"), DistEnv(), CONFIG, TINY)
    precision.choose(APP, cfg_of("train.precision=auto"), DistEnv(), CONFIG, TINY)
    assert len(calls) == 2  # one probe, two precisions
    precision.choose(APP, cfg_of("train.precision=auto", "train.local_batch_size=4"), DistEnv(), CONFIG, TINY)
    assert len(calls) == 4  # another batch: probed again
    records = json.loads(next(cache.glob("precision-*.json")).read_text())
    assert [r["local_batch_size"] for r in records] == [2, 4] and all(set(precision.KEY_FIELDS) <= set(r)
                                                                      for r in records)


def test_more_epochs_in_bfloat16_can_keep_float32(cache, monkeypatch):
    record = cache / "epochs.json"
    record.write_text(json.dumps({"cosmoflow": {"float32": {"epochs": [9, 9, 10]},
                                                "mixed_bfloat16": {"epochs": [11, 12, 11]}}}))
    monkeypatch.setattr(precision, "EPOCHS_RECORD", record)
    fake_probe(monkeypatch, {"float32": 1.0, "mixed_bfloat16": 0.75})
    _, choice = precision.choose(APP, cfg_of("train.precision=auto"), DistEnv(), CONFIG, TINY)
    assert choice["precision"] == "float32" and choice["epochs_ratio"] == pytest.approx(34 / 28)
    assert "epochs.json: 3 bfloat16 and 3 float32 runs" in choice["reason"]


def test_bfloat16_runs_that_missed_the_target_keep_float32_however_fast_its_step(cache, monkeypatch):
    record = cache / "epochs.json"
    record.write_text(json.dumps({"cosmoflow": {"float32": {"epochs": [9, 9, 12], "not_converged": []},
                                                "mixed_bfloat16": {"epochs": [], "not_converged": [1000, 1001]}}}))
    monkeypatch.setattr(precision, "EPOCHS_RECORD", record)
    fake_probe(monkeypatch, {"float32": 1.0, "mixed_bfloat16": 0.1})
    cfg, choice = precision.choose(APP, cfg_of("train.precision=auto"), DistEnv(), CONFIG, TINY)
    assert cfg.train.precision == "float32" and choice["epochs_ratio"] is None
    assert "mixed_bfloat16 missed the target in 2 of 2 runs (seeds [1000, 1001])" in choice["reason"]
    json.dumps(choice, allow_nan=False)  # summary.json stays plain JSON


def test_an_explicit_precision_is_kept_and_not_probed(cache, monkeypatch):
    calls = fake_probe(monkeypatch, {"float32": 1.0, "mixed_bfloat16": 0.1})
    cfg, choice = precision.choose(APP, cfg_of("train.precision=float32"), DistEnv(), CONFIG, TINY)
    assert cfg.train.precision == "float32" and not calls
    assert choice["reason"] == "train.precision=float32 as configured (not auto)"


@pytest.mark.parametrize("flags, gpu, warned", [({"avx512f"}, False, True), ({"avx512f", "avx512_bf16"}, False, False),
                                               ({"avx512f", "amx_bf16"}, False, False), ({"avx2"}, True, False)])
def test_explicit_bfloat16_on_a_cpu_without_a_bfloat16_unit_is_kept_with_a_warning(cache, monkeypatch, capsys,
                                                                                    flags, gpu, warned):
    calls = fake_probe(monkeypatch, {"float32": 1.0, "mixed_bfloat16": 2.0})
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    dist = types.SimpleNamespace(is_root=True, size=1, gpu=gpu)
    cfg, choice = precision.choose(APP, cfg_of("train.precision=mixed_bfloat16"), dist, CONFIG, TINY)
    assert cfg.train.precision == choice["precision"] == "mixed_bfloat16" and not calls
    out = capsys.readouterr().out
    if warned:
        assert "this CPU has no bfloat16 unit (neither AVX512-BF16 nor AMX-BF16)" in choice["warning"]
        assert f"warning: train.precision=mixed_bfloat16: {choice['warning']}" in out
        assert choice["reason"].startswith("train.precision=mixed_bfloat16 as configured (not auto); this CPU")
        assert plan.planned_precision(APP, cfg, dist)["reason"] == choice["reason"]  # the dry run says it too
    else:
        assert "warning" not in choice and "warning" not in out
    assert "warning" not in precision.explicit("float32")  # float32 is never warned about


def test_the_dry_run_says_what_a_run_would_choose_without_probing(cache, monkeypatch):
    calls = fake_probe(monkeypatch, {"float32": 1.0, "mixed_bfloat16": 0.5})
    cfg = cfg_of("train.precision=auto")
    assert plan.planned_precision(APP, cfg, DistEnv())["precision"] == "auto" and not calls
    precision.choose(APP, cfg, DistEnv(), CONFIG, TINY)
    assert plan.planned_precision(APP, cfg, DistEnv())["precision"] == "mixed_bfloat16"


def test_every_rank_takes_rank_0s_answer(cache, monkeypatch):
    calls = fake_probe(monkeypatch, {"float32": 1.0, "mixed_bfloat16": 0.5})
    sent = {"precision": "float32", "reason": "rank 0's", "step_seconds": {}, "epochs_ratio": None}
    rank1 = types.SimpleNamespace(is_root=False, size=2, threads=1, gpu=False, broadcast_object=lambda obj: sent)
    cfg, choice = precision.choose(APP, cfg_of("train.precision=auto"), rank1, CONFIG, TINY)
    assert cfg.train.precision == "float32" and choice == {**sent, "configured": "auto"} and not calls


def test_a_probe_that_fails_leaves_float32_with_the_reason(cache, monkeypatch, capsys):
    def broken(*_args):
        raise precision.BenchError("the precision probe (...) failed with exit 4: boom")
    monkeypatch.setattr(precision_measure, "measure_in_subprocess", broken)
    cfg, choice = precision.choose(APP, cfg_of("train.precision=auto"), DistEnv(), CONFIG, TINY)
    assert cfg.train.precision == "float32" and "probe failed" in choice["reason"]
    assert "warning: the precision probe (...) failed with exit 4: boom" in capsys.readouterr().out


def test_the_probe_times_the_real_step_in_both_precisions_outside_the_runs_launch(cache, monkeypatch):
    for var in ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMIX_RANK"):  # as a rank under horovodrun has them
        monkeypatch.setenv(var, "0")
    seconds = {p: precision_measure.measure_in_subprocess("cosmoflow", CONFIG, TINY, p, 1) for p in precision.CANDIDATES}
    assert all(0 < s < 30 for s in seconds.values()), seconds
