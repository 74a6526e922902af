"""How real training processes end outside the training loop: bad data met after run_start ends the MLPerf
log with run_stop (aborted) and leaves summary.json with the error, which is still printed, with exit code 2;
a SIGTERM during start-up ends the run cleanly with exit code 75, not 143, and no run_start."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.campaign.compliance import check_log
from tests.conftest import REPO, checkout_first_on_path, log_events, run_cmd, show
from tests.integration.cosmo_fixtures import write_config

pytestmark = pytest.mark.slow
STOPPED = 75


def _first_train_file(data_dir: Path) -> Path:
    manifest = json.loads((data_dir / "manifest.json").read_text())
    return data_dir / manifest["splits"]["train"]["files"][0]["path"]


def _flip_a_byte(path: Path) -> None:
    """Same size, one payload byte flipped: the record's CRC no longer matches (tf.data checks it in epoch 1)."""
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", ["corrupt record", "missing file"])
def test_bad_data_met_after_run_start_ends_the_log_with_run_stop_and_leaves_the_summary(cosmo_small, writable_copy, tmp_path, damage):
    data, out = writable_copy(cosmo_small), tmp_path / "run"
    victim = _first_train_file(data)
    _flip_a_byte(victim) if damage == "corrupt record" else victim.unlink()
    cfg = write_config(tmp_path / "c.yaml", data, out)
    # tf.data (DALI's reader checks no CRC); the file checksums unchecked, so that epoch 1 meets the record.
    proc = run_cmd([sys.executable, REPO / "cosmoflow/train.py", cfg, "data.loader=tfdata", "data.shuffle=false",
                    "data.verify_checksums=false"])
    error = " ".join(proc.stderr.split())
    assert proc.returncode == 2, show(proc)
    printed = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]  # (TF logs "error:" too)
    assert victim.name in error and "Traceback" not in proc.stderr and len(printed) == 1, show(proc)
    events = log_events(out / "mlperf.log")
    keys = [e["key"] for e in events]
    assert keys.count("run_start") == 1 and keys.count("run_stop") == 1, keys
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "aborted"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "aborted" and summary["error"] == "BenchError"
    assert summary["reason"] in error and victim.name in summary["reason"]  # the message printed, unwrapped
    # The checker misses what the run never reached (the dataset sizes, an epoch's end, an evaluation) and
    # finds nothing else: init, one run_start, one run_stop.
    problems = check_log(out / "mlperf.log").messages
    assert problems and all(m.startswith("Required") and "run_st" not in m for m in problems), problems


def _handles_sigterm(pid: int) -> bool:
    """Whether process `pid` has a handler for SIGTERM now (the kernel's SigCgt mask in /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def _sigterm_once_handled(args: list) -> tuple[subprocess.Popen, str, str]:
    """Start `python ARGS`, send SIGTERM as soon as the process handles it (before the train entry point has
    done anything but parse its arguments: the handler is its first act), return the process and its output."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "PYTHONPATH": checkout_first_on_path()}
    proc = subprocess.Popen([sys.executable, *map(str, args)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _handles_sigterm(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline, "the process never handled SIGTERM"
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    return proc, stdout, stderr


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc/PID/status (Linux)")
@pytest.mark.parametrize("app, config", [("cosmoflow", "cosmo_mini.yaml"), ("deepcam", "deepcam_mini.yaml")])
def test_a_sigterm_during_start_up_stops_the_run_before_run_start_with_exit_75(tmp_path, app, config):
    out = tmp_path / "run"
    (tmp_path / "data").mkdir()  # never read: the run stops before run_start
    proc, stdout, stderr = _sigterm_once_handled([REPO / app / "train.py", REPO / app / "configs" / config,
                                                  f"run.output_dir={out}", f"data.dir={tmp_path / 'data'}",
                                                  "mlperf.platform=test", "train.precision=float32"])
    message = " ".join(stderr.split())
    assert proc.returncode == STOPPED, f"exit {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
    assert "stopped: SIGTERM during start-up, before init_start: no run_start logged" in message, message
    assert "Traceback" not in stderr
    keys = [e["key"] for e in log_events(out / "mlperf.log")] if (out / "mlperf.log").is_file() else []
    assert "run_start" not in keys and not (out / "summary.json").exists()
