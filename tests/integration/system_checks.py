"""What every run's summary.json `system` object must hold (issue 24), checked on real runs' summaries; and the
TensorBoard scalars rank 0 wrote (common/runtime/monitor.py's RunMonitor), read back."""
from __future__ import annotations

import math
from pathlib import Path

from common.runtime.monitor import SUBDIR


def assert_plausible_system(summary: dict, ranks: int) -> dict:
    """Each field present and plausible: shares in [0, 1], FLOP/s below the probe's peak, memory per rank; a
    null figure comes with its reason. Returns the object."""
    system = summary["system"]
    peak = system["peak"]
    assert peak["peak_gflops"] >= max(peak["gemm_gflops"], peak["conv3d_gflops"]) > 0, peak
    assert peak["peak_bf16_gflops"] >= max(peak["bf16_gemm_gflops"], peak["bf16_conv3d_gflops"]) > 0, peak
    bf16 = summary["precision"]["precision"] == "mixed_bfloat16"
    assert system["peak_precision"] == ("bfloat16" if bf16 else "float32"), system
    used = peak["peak_bf16_gflops" if bf16 else "peak_gflops"]  # the peak of the precision the run trained in
    assert system["gflop_per_sample"] > 0
    assert 0 < system["sustained_gflops"] < used * summary["nodes"], system
    assert 0 < system["fraction_of_peak"] < 1 and math.isclose(
        system["fraction_of_peak"], system["sustained_gflops"] / used / summary["nodes"])
    assert 0 <= system["input_wait_share"] <= 1
    assert len(system["peak_rss_mb"]) == ranks and all(100 < mb < 24 * 1024 for mb in system["peak_rss_mb"])
    for name in ("energy_j_per_sample", "allreduce_gb_per_s", "gpu_peak_memory_mb"):
        assert system[name] is not None or system["reasons"].get(name), (name, system["reasons"])
    if ranks == 1:  # the window timed, nothing exchanged
        assert system["allreduce_share"] == 0.0 and system["reasons"]["allreduce_gb_per_s"] == "one rank: no allreduce"
        assert system["step_breakdown"]["allreduce"] == 0.0 and system["window"]["exchange"] is None
        assert math.isclose(sum(system["step_breakdown"].values()), 1.0)
        return system
    if system["window"] is None:  # a run shorter than the window's warm-up
        assert system["allreduce_share"] is None and system["reasons"]["allreduce_share"], system
        return system
    assert 0 <= system["allreduce_wait_share"] <= system["allreduce_share"] <= 1
    breakdown = system["step_breakdown"]
    assert set(breakdown) == {"compute", "allreduce", "input_wait", "other"}
    assert all(0 <= v <= 1 for v in breakdown.values()) and math.isclose(sum(breakdown.values()), 1.0)
    assert system["allreduce_gb_per_s"] is None or system["allreduce_gb_per_s"] > 0
    assert system["allreduce_bytes_per_step"] > 0 and len(system["allreduce_share_per_rank"]) == ranks
    assert system["window"]["steps"] >= 1 and system["window"]["seconds"] > 0
    exchange = system["window"]["exchange"]  # the gradients' allreduce on its own, after the run
    assert exchange["seconds"] > 0 and exchange["latency_seconds"] > 0 and exchange["bytes"] == \
        system["allreduce_bytes_per_step"]
    return system


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of every scalar in a run's event files."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2
    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted((Path(run_dir) / SUBDIR).glob("events.out.tfevents.*")):
        for raw in tf.data.TFRecordDataset(str(path)):
            event = event_pb2.Event.FromString(raw.numpy())
            for value in event.summary.value:
                number = tf.make_ndarray(value.tensor) if value.HasField("tensor") else value.simple_value
                found.setdefault(value.tag, []).append((event.step, float(number)))
    return found
