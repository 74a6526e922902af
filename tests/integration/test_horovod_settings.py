"""The Horovod settings a run logs are the ones Horovod used: a user's HOROVOD_* variable wins over the config.

Two real ranks under horovodrun (MPI controller) run init_distributed with a config (fusion threshold 1 MiB,
cycle time 10 ms, hierarchical allreduce off) while the environment sets HOROVOD_CYCLE_TIME=30 and
HOROVOD_HIERARCHICAL_ALLREDUCE=1. What Horovod used is read from Horovod itself, two ways:
- its autotuner's log (HOROVOD_AUTOTUNE_LOG), which records the parameter manager's values; a variable set in
  the environment is fixed there, so the autotuner leaves it as Horovod read it;
- its timeline (HOROVOD_TIMELINE, HOROVOD_TIMELINE_MARK_CYCLES): the background thread's cycles are at least
  the cycle time apart, and tensors pass through the fusion buffer only when the threshold lets them fuse.
"""
import csv
import json
import statistics

import pytest

from tests.conftest import REPO, horovodrun, show

pytestmark = pytest.mark.slow


def _cycle_starts_ms(timeline) -> list[float]:
    text = timeline.read_text().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    return [e["ts"] / 1000 for e in events if e.get("name") == "CYCLE_START"]


def test_the_settings_a_run_logs_are_the_ones_horovod_used_and_the_users_environment_wins(tmp_path):
    autotune, timeline, out = tmp_path / "autotune.csv", tmp_path / "timeline.json", tmp_path / "settings.json"
    # 100 steps of at least one 30 ms cycle each; the autotuner logs a sample every 2 steps from the first.
    proc = horovodrun(2, [REPO / "tests/integration/hvd_settings_worker.py", out, 100], timeout=300, env={
        "HOROVOD_CYCLE_TIME": "30", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
        "HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(autotune),
        "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2",
        "HOROVOD_TIMELINE": str(timeline), "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    assert proc.returncode == 0, show(proc)
    run = json.loads(out.read_text())
    # The environment's values won and are named; the config gave the rest.
    assert run["from_environment"] == ["HOROVOD_CYCLE_TIME", "HOROVOD_HIERARCHICAL_ALLREDUCE"]
    assert run["settings"]["HOROVOD_CYCLE_TIME"] == "30" and run["settings"]["HOROVOD_FUSION_THRESHOLD"] == "1048576"
    assert "HOROVOD_CYCLE_TIME=30" in run["log"] and "cycle time 30 ms" in run["log"]
    # On one node (and without NCCL) Horovod ignores hierarchical allreduce: the run says so.
    assert run["used"] == {"fusion_threshold_bytes": 1048576, "cycle_time_ms": 30.0,
                           "hierarchical_allreduce": False, "hierarchical_allgather": False,
                           "mpi_yield_when_idle": True}
    assert "hierarchical allreduce off (asked for" in run["log"] and "Open MPI yields when idle" in run["log"]
    rows = list(csv.DictReader(autotune.read_text().replace(", ", ",").splitlines()))
    assert rows, autotune.read_text()
    for row in rows:  # Horovod's parameter manager, sample after sample
        assert float(row["cycle_time_ms"]) == run["used"]["cycle_time_ms"]
        assert float(row["tensor_fusion_threshold"]) * 2**20 == pytest.approx(run["used"]["fusion_threshold_bytes"])
        assert bool(int(row["hierarchical_allreduce"])) == run["used"]["hierarchical_allreduce"]
        assert bool(int(row["hierarchical_allgather"])) == run["used"]["hierarchical_allgather"]
    starts = _cycle_starts_ms(timeline)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(gaps) > 50 and statistics.median(gaps) >= 0.95 * 30, statistics.median(gaps)
    assert "MEMCPY_IN_FUSION_BUFFER" in timeline.read_text()  # 8 x 4 kB fused under a 1 MiB threshold
