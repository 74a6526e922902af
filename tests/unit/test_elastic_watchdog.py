"""The elastic worker's hang watchdog (common/runtime/elastic.py, start_watchdog and watch) on a stand-in worker: a
stopped worker is killed after the timeout with a message naming it; a live one is left alone, and the
watchdog leaves when its worker does."""
import signal
import subprocess
import sys
import textwrap
import time

from tests.conftest import REPO, checkout_first_on_path

WORKER = textwrap.dedent("""\
    import sys, time
    from common.runtime.elastic import start_watchdog
    watchdog, close = start_watchdog(5.0, "nodeA", lambda: 3)
    print(watchdog.pid, flush=True)
    time.sleep(float(sys.argv[1]))
    close()
""")


def start_worker(seconds: float) -> tuple[subprocess.Popen, int]:
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(seconds)], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={"PYTHONPATH": checkout_first_on_path(), "PATH": "/usr/bin:/bin"})
    return worker, int(worker.stdout.readline())


def test_a_stopped_worker_is_killed_after_the_timeout_and_named():
    worker, _ = start_worker(60)
    worker.send_signal(signal.SIGSTOP)
    stopped = time.time()
    try:
        worker.wait(timeout=20)
    finally:
        worker.kill()
    waited = time.time() - stopped
    assert worker.returncode == -signal.SIGKILL and 4.5 <= waited < 9, waited
    said = worker.stderr.read()
    assert "elastic watchdog: the worker on host nodeA (pid" in said and "rank 3) sent no heartbeat for 5." in said
    assert "dist.elastic.hang_timeout_s=5" in said


def test_a_live_worker_is_left_alone_and_the_watchdog_leaves_with_it():
    worker, watchdog = start_worker(7)  # longer than the timeout, beating all along
    worker.wait(timeout=30)
    assert worker.returncode == 0, worker.stderr.read()
    time.sleep(0.5)
    assert subprocess.run(["kill", "-0", str(watchdog)], capture_output=True).returncode != 0  # gone
