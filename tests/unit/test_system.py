"""The system figures' parts on tiny inputs: Horovod timeline parsing, shares, energy counters, the probe's cache,
FLOPs from layer shapes."""
import json
import os

import pytest

from common.runtime import energy, probe, system
from common.runtime.flops import training_gflop_per_sample

# A Horovod timeline as rank 0 writes it (two fused tensors of one step; the file cut before its closing bracket):
# tensor 1 negotiates 100-400 µs and is exchanged 400-900 µs; tensor 2 negotiates 150-400 and is exchanged 450-950.
TIMELINE = [
    {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad_a"}},
    {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 100, "pid": 1},
    {"ph": "X", "name": "0", "ts": 100, "pid": 1, "dur": 0},
    {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 150, "pid": 2},
    {"ph": "E", "ts": 400, "pid": 1}, {"ph": "E", "ts": 400, "pid": 2},
    {"ph": "B", "name": "ALLREDUCE", "ts": 400, "pid": 1},
    {"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": 410, "pid": 1}, {"ph": "E", "ts": 420, "pid": 1},
    {"ph": "B", "name": "ALLREDUCE", "ts": 450, "pid": 2},
    {"ph": "E", "ts": 900, "pid": 1, "args": {"dtype": "float32", "shape": "[10, 25]"}},
    {"ph": "E", "ts": 950, "pid": 2, "args": {"dtype": "float64", "shape": "[125]"}},
]


def _write_timeline(path, events, closed=False):
    text = "[\n" + ",\n".join(json.dumps(e) for e in events) + (",\n]" if closed else ",")
    path.write_text(text)
    return path


@pytest.mark.parametrize("closed", [False, True])
def test_timeline_spans_are_the_top_level_activities_with_their_sizes(tmp_path, closed):
    spans = system.timeline_spans(_write_timeline(tmp_path / "t.json", TIMELINE, closed))
    names = sorted((name, round(s * 1e6), round(e * 1e6)) for name, s, e, _ in spans)
    assert names == [("ALLREDUCE", 400, 900), ("ALLREDUCE", 450, 950), ("NEGOTIATE_ALLREDUCE", 100, 400),
                     ("NEGOTIATE_ALLREDUCE", 150, 400)]  # the memory copy is inside its allreduce


def test_collective_figures_union_the_spans_and_count_the_bytes(tmp_path):
    path = _write_timeline(tmp_path / "t.json", TIMELINE)
    window = system.Window(first_step=5, steps=1, seconds=0.002)
    figures = system.collective_figures(path, window)
    # Blocked 100-950 µs (0.85 ms of 2 ms); waiting 100-400 (0.3 ms); exchanging 400-950 (0.55 ms) for
    # 250 float32 + 125 float64 = 2000 bytes.
    assert figures["allreduce_share"] == pytest.approx(0.425)
    assert figures["allreduce_wait_share"] == pytest.approx(0.15)
    assert figures["allreduce_bytes_per_step"] == 2000
    assert figures["allreduce_gb_per_s"] == pytest.approx(2000 / 0.00055 / 1e9)


def test_union_of_intervals():
    assert system.union_seconds([]) == 0
    assert system.union_seconds([(0, 1), (0.5, 2), (3, 4), (3.5, 3.7)]) == pytest.approx(3.0)


def test_step_breakdown_splits_the_window_into_shares_that_sum_to_one():
    shares = system.step_breakdown({"step_seconds": 0.8, "input_wait_seconds": 0.1}, 1.0, 0.3)
    assert shares == pytest.approx({"compute": 0.5, "allreduce": 0.3, "input_wait": 0.1, "other": 0.1})


def test_input_wait_share_leaves_out_the_first_epoch():
    history = [{"train_seconds": 10, "input_wait_seconds": 9}, {"train_seconds": 4, "input_wait_seconds": 1},
               {"train_seconds": 6, "input_wait_seconds": 0}]
    assert system.input_wait_share(history) == pytest.approx(0.1)
    assert system.input_wait_share([]) is None


def test_flops_figures_against_the_nodes_peak():
    figures = system.flops_figures(2.0, 10.0, {"peak_gflops": 100.0}, nodes=2)
    assert figures == {"gflop_per_sample": 2.0, "sustained_gflops": 20.0, "fraction_of_peak": 0.1}
    assert system.flops_figures(2.0, 10.0, None, 1)["fraction_of_peak"] is None


def _powercap(root, domains):
    for name, (now, wrap) in domains.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "energy_uj").write_text(f"{now}\n")
        (d / "max_energy_range_uj").write_text(f"{wrap}\n")


def test_rapl_energy_of_the_packages_with_a_counter_wrapping(tmp_path):
    _powercap(tmp_path, {"intel-rapl:0": (1_000_000, 10_000_000), "intel-rapl:1": (9_500_000, 10_000_000),
                         "intel-rapl:0:0": (5, 10)})  # a sub-domain (core): not counted again
    before, reason = energy.read_rapl(tmp_path)
    assert reason == "" and sorted(before) == ["intel-rapl:0", "intel-rapl:1"]
    _powercap(tmp_path, {"intel-rapl:0": (4_000_000, 10_000_000), "intel-rapl:1": (500_000, 10_000_000)})
    after, _ = energy.read_rapl(tmp_path)
    assert energy.rapl_joules(before, after) == pytest.approx(3.0 + 1.0)


def test_no_rapl_gives_a_reason_not_a_number(tmp_path):
    assert energy.read_rapl(tmp_path) == (None, f"no RAPL package domains under {tmp_path}")
    assert energy.job_energy([(12.0, "RAPL", ""), (None, None, "RAPL counters unreadable")]) == (
        None, "", "RAPL counters unreadable")
    assert energy.job_energy([(12.0, "RAPL", ""), (0.0, None, "")]) == (12.0, "RAPL", "")


def test_the_probe_cache_is_used_only_for_the_same_host_cpu_and_tensorflow(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_BENCH_CACHE", str(tmp_path))
    record = {**probe.host_key(), "gemm_gflops": 50.0, "conv3d_gflops": 60.0, "peak_gflops": 60.0}
    probe.cache_path().write_text(json.dumps(record))
    assert probe.cached() == record
    assert probe.probe() == record  # no new measurement
    probe.cache_path().write_text(json.dumps(record | {"tensorflow": "0.0.1"}))
    assert probe.cached() is None


def test_flops_of_a_small_conv3d_network_from_its_layer_shapes():
    import keras
    model = keras.Sequential([keras.Input((8, 8, 8, 2)), keras.layers.Conv3D(4, 3, padding="same"),
                              keras.layers.MaxPooling3D(2), keras.layers.Conv3D(6, 3, padding="same"),
                              keras.layers.Flatten(), keras.layers.Dense(5)])
    first = 8 ** 3 * 2 * 4 * 27  # multiply-adds: output positions x in x out x kernel
    second = 4 ** 3 * 4 * 6 * 27
    dense = 4 ** 3 * 6 * 5
    assert training_gflop_per_sample(model) == pytest.approx(2 * (2 * first + 3 * (second + dense)) / 1e9)


def test_peak_rss_is_this_processes_resident_set():
    assert 10 < system.peak_rss_mb() < (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / 2**20
