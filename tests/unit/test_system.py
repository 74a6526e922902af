"""The system figures' parts on tiny inputs: the step window, collective shares, energy counters, the probe's cache,
FLOPs from layer shapes."""
import json
import os

import pytest

from common.base import host
from common.runtime import monitor, probe
from common.runtime.exchange import collective_figures
from common.runtime.monitor import training_gflop_per_sample
from common.runtime.strategy import PhaseClock


class _Clock:
    """A phase clock whose readings the test sets."""

    def __init__(self):
        self.seconds, self.sync = {"compute": 0.0, "allreduce": 0.0, "update": 0.0}, False

    def snapshot(self):
        return dict(self.seconds)


def test_step_window_reads_the_phases_of_its_steps_only_and_syncs_inside_it():
    window, clock = monitor.StepWindow(warmup=2, length=3), _Clock()
    window.attach(clock)
    totals = {"step_seconds": 0.0, "input_wait_seconds": 0.0}
    for done in range(1, 8):
        clock.seconds["allreduce"] += 0.5 if done > 2 else 5.0  # warm-up steps' figures stay out
        totals["step_seconds"] += 1.0
        window.tick(done, boundary=False, totals=totals)
        assert clock.sync == (2 <= done < 5)  # on from the opening (after step 2) to the closing (after step 5)
    w = window
    assert window.closed and (w.first_step, w.steps) == (2, 3)
    assert w.phases["allreduce"] == pytest.approx(1.5) and w.totals["step_seconds"] == pytest.approx(3.0)


def test_step_window_does_not_open_before_a_boundary_and_closes_at_one():
    window = monitor.StepWindow(warmup=1, length=10)
    window.tick(1, boundary=True, totals={})
    assert not window.opened
    window.tick(2, boundary=False, totals={})
    window.tick(4, boundary=True, totals={})
    assert window.closed and window.steps == 2 and window.phases == {}  # no clock attached


def test_collective_figures_split_the_blocked_time_into_waiting_and_the_exchange():
    # Two ranks over 10 steps: rank 0 blocked 0.3 s of 1 s, rank 1 0.1 s of 1 s; the allreduce on its own
    # takes 8 ms (2 ms of it Horovod's coordination) for 3 MB.
    exchange = {"seconds": 0.008, "latency_seconds": 0.002, "bytes": 3_000_000, "repeats": 10}
    figures = collective_figures([(0.3, 1.0), (0.1, 1.0)], 10, exchange)
    assert figures["allreduce_share"] == pytest.approx(0.2)
    assert figures["allreduce_share_per_rank"] == pytest.approx([0.3, 0.1])
    assert figures["allreduce_wait_share"] == pytest.approx(((0.3 - 0.06) + (0.1 - 0.06)) / 2)  # less 10 transfers
    assert figures["allreduce_gb_per_s"] == pytest.approx(3e6 / 0.006 / 1e9)
    assert figures["allreduce_bytes_per_step"] == 3_000_000
    unseen = collective_figures([(0.05, 1.0)], 10, exchange | {"latency_seconds": 0.009})
    assert unseen["allreduce_wait_share"] == pytest.approx(0.05) and unseen["allreduce_gb_per_s"] is None


def test_phase_clock_adds_each_lap_to_its_phase_and_drains_the_device_only_when_asked(monkeypatch):
    now, drained = iter([1.0, 1.5, 4.0, 10.0, 10.25]), []
    monkeypatch.setattr("time.perf_counter", lambda: next(now))
    clock = PhaseClock(("compute", "allreduce"), device_sync=lambda: drained.append(1))
    clock.start()
    clock.lap("compute")
    clock.lap("allreduce")
    assert clock.snapshot() == {"compute": 0.5, "allreduce": 2.5} and not drained
    clock.sync = True
    clock.start()
    clock.lap("compute")
    assert clock.snapshot()["compute"] == 0.75 and len(drained) == 2


def test_mean_shares_average_the_ranks_breakdowns():
    shares = monitor.mean_shares([{"compute": 0.8, "allreduce": 0.2}, {"compute": 0.6, "allreduce": 0.4}])
    assert shares == pytest.approx({"compute": 0.7, "allreduce": 0.3})


def test_step_breakdown_splits_the_window_into_shares_that_sum_to_one():
    shares = monitor.step_breakdown({"step_seconds": 0.8, "input_wait_seconds": 0.1}, 1.0, 0.3)
    assert shares == pytest.approx({"compute": 0.5, "allreduce": 0.3, "input_wait": 0.1, "other": 0.1})


def test_input_wait_share_leaves_out_the_first_epoch():
    history = [{"train_seconds": 10, "input_wait_seconds": 9}, {"train_seconds": 4, "input_wait_seconds": 1},
               {"train_seconds": 6, "input_wait_seconds": 0}]
    assert monitor.input_wait_share(history) == pytest.approx(0.1)
    assert monitor.input_wait_share([]) is None


def test_flops_figures_against_the_nodes_peak():
    peak = {"peak_gflops": 100.0, "peak_bf16_gflops": 400.0}
    figures = monitor.flops_figures(2.0, 10.0, peak, nodes=2)
    assert figures == {"gflop_per_sample": 2.0, "sustained_gflops": 20.0, "fraction_of_peak": 0.1,
                       "peak_precision": "float32"}
    bf16 = monitor.flops_figures(2.0, 10.0, peak, nodes=2, precision="mixed_bfloat16")
    assert bf16["fraction_of_peak"] == 0.025 and bf16["peak_precision"] == "bfloat16"  # against bfloat16's peak
    assert monitor.flops_figures(2.0, 10.0, None, 1)["fraction_of_peak"] is None


def _powercap(root, domains):
    for name, (now, wrap) in domains.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "energy_uj").write_text(f"{now}\n")
        (d / "max_energy_range_uj").write_text(f"{wrap}\n")


def test_rapl_energy_of_the_packages_with_a_counter_wrapping(tmp_path):
    _powercap(tmp_path, {"intel-rapl:0": (1_000_000, 10_000_000), "intel-rapl:1": (9_500_000, 10_000_000),
                         "intel-rapl:0:0": (5, 10)})  # a sub-domain (core): not counted again
    before, reason = monitor.read_rapl(tmp_path)
    assert reason == "" and sorted(before) == ["intel-rapl:0", "intel-rapl:1"]
    _powercap(tmp_path, {"intel-rapl:0": (4_000_000, 10_000_000), "intel-rapl:1": (500_000, 10_000_000)})
    after, _ = monitor.read_rapl(tmp_path)
    assert monitor.rapl_joules(before, after) == pytest.approx(3.0 + 1.0)


def test_no_rapl_gives_a_reason_not_a_number(tmp_path):
    assert monitor.read_rapl(tmp_path) == (None, f"no RAPL package domains under {tmp_path}")
    assert monitor.job_energy([(12.0, "RAPL", ""), (None, None, "RAPL counters unreadable")]) == (
        None, "", "RAPL counters unreadable")
    assert monitor.job_energy([(12.0, "RAPL", ""), (0.0, None, "")]) == (12.0, "RAPL", "")


def test_the_probe_cache_is_used_only_for_the_same_host_cpu_and_tensorflow(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_BENCH_CACHE", str(tmp_path))
    record = {**host.host_key(), "gemm_gflops": 50.0, "conv3d_gflops": 60.0, "peak_gflops": 60.0,
              "bf16_gemm_gflops": 150.0, "bf16_conv3d_gflops": 90.0, "peak_bf16_gflops": 150.0}
    host.cache_path().write_text(json.dumps(record))
    assert host.cached() == record
    assert probe.probe() == record  # no new measurement
    host.cache_path().write_text(json.dumps(record | {"tensorflow": "0.0.1"}))
    assert host.cached() is None
    float32_only = {k: v for k, v in record.items() if "bf16" not in k}  # a probe without bfloat16's peak
    host.cache_path().write_text(json.dumps(float32_only))
    assert host.cached() is None


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
    assert 10 < monitor.peak_rss_mb() < (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / 2**20
