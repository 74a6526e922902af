"""benchmarks/threadcpu.py: which thread's CPU goes where, measured on real threads of this process; corun's CPU
table; the CPU facts every benchmark's results now carry."""
import os
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import corun  # noqa: E402  (scripts beside harness.py, not a package)
import harness  # noqa: E402
import threadcpu  # noqa: E402

from common.base import host  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")


def _burn(seconds: float, go: threading.Event, done: threading.Event, finish: threading.Event) -> None:
    """Wait for `go`, use `seconds` of this thread's CPU, set `done`, live on until `finish` (an ended thread
    leaves /proc, and its figures with it)."""
    go.wait()
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    done.set()
    finish.wait()


def test_a_thread_started_inside_the_call_is_a_runtime_thread_and_its_cpu_is_counted_as_such():
    go, done, finish = threading.Event(), threading.Event(), threading.Event()
    thread = threading.Thread(target=_burn, args=(0.3, go, done, finish), daemon=True)
    _, runtime = threadcpu.started_threads(lambda: None)
    assert runtime == set()
    _, runtime = threadcpu.started_threads(thread.start)
    assert len(runtime) == 1
    before = threadcpu.snapshot()
    go.set()
    assert done.wait(timeout=60)  # the main thread blocks meanwhile
    after = threadcpu.snapshot()
    finish.set()
    thread.join()
    roles = threadcpu.account(before, after, runtime, steps=2)
    assert set(roles) == {"compute", "runtime", "main"}
    burnt = roles["runtime"]["user_s"] + roles["runtime"]["system_s"]
    assert 0.13 <= burnt <= 0.17, roles  # 0.3 s over 2 steps, within the clock tick
    assert roles["main"]["user_s"] + roles["main"]["system_s"] < 0.05


def test_account_splits_snapshots_by_role_per_step_and_skips_threads_that_ended():
    main = os.getpid()
    before = {main: (1.0, 0.5, 10), 11: (2.0, 0.0, 100), 12: (0.0, 0.0, 0), 13: (5.0, 5.0, 5)}
    after = {main: (1.4, 0.5, 10), 11: (6.0, 1.0, 500), 12: (0.2, 0.2, 0), 14: (1.0, 0.0, 40)}
    roles = threadcpu.account(before, after, runtime={12}, steps=2)
    assert roles["main"] == pytest.approx({"user_s": 0.2, "system_s": 0.0, "minor_faults": 0})
    assert roles["runtime"] == pytest.approx({"user_s": 0.1, "system_s": 0.1, "minor_faults": 0})
    # thread 11 and thread 14 (born after the first snapshot); thread 13 ended and is left out
    assert roles["compute"] == pytest.approx({"user_s": 2.5, "system_s": 0.5, "minor_faults": 220})


def _layout(step, compute, runtime, main, faults):
    role = lambda s: {"user_s": s, "system_s": 0.0, "minor_faults": 0}  # noqa: E731
    cpu = {"compute": {"user_s": compute, "system_s": 1.0, "minor_faults": faults}, "runtime": role(runtime),
           "main": role(main)}
    return {"median_step_seconds": [step], "thread_cpu": [cpu, cpu]}


def test_corun_cpu_table_has_a_row_per_layout_with_each_roles_seconds():
    result = {"runs": [{"app": "cosmoflow", "layouts": {"pair": _layout(15.0, 14.0, 0.0, 0.1, 1200),
                                                         "2 ranks": _layout(17.5, 14.5, 1.3, 0.2, 65000)}}]}
    table = corun.cpu_table(result).splitlines()
    assert table[2] == "| cosmoflow | pair | 15.00 | 14.00 + 1.00 | 0.00 | 0.10 | 1,200 |"
    assert table[3] == "| cosmoflow | 2 ranks | 17.50 | 14.50 + 1.00 | 1.30 | 0.20 | 65,000 |"


def test_results_name_the_cpu_and_its_vector_instruction_set():
    assert harness.vector_isa() in (*harness.VECTOR_ISAS, "unknown")
    header = harness.run_header(100.0)
    assert header["cpu"] == f"{host.cpu_model()}, {harness.vector_isa()}"
    assert f"({header['cpu']})." in harness.measured_note(header)
    assert f"ISA flags: {header['isa_flags']}; commit {header['commit']}." in harness.measured_note(header)
    older = harness.measured_note({"sgemm_gflops": 1.0, "date": "d", "machine": "m"})
    assert older.endswith("on m. Not recorded: CPU model, ISA flags, commit.")
