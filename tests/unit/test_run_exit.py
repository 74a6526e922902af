"""How a run ends when it does not end in the training loop (common/runtime/run.py): an exception after run_start
still ends the MLPerf log with one run_stop (aborted) and leaves summary.json with the reason; one before
run_start leaves neither; a stop signal during start-up ends the run before run_start with exit code 75.
Real processes: tests/integration/test_run_exit.py."""
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import pytest

from common.base import exits
from common.base.errors import BenchError
from common.io.input import Datasets
from common.runtime.config import load_config
from common.runtime.dist import DistEnv, StopRequests, StoppedBeforeStart
from common.runtime.loop import FitResult
from common.runtime.command import guarded_run
from common.runtime.run import Run, reading_as
from common.runtime.strategy import DataParallel
from common.runtime.summary import exit_code
from cosmoflow.config import CosmoConfig
from tests.conftest import REPO, run_cmd


def _cfg(out):
    return load_config(REPO / "cosmoflow/configs/cosmo_mini.yaml",
                       [f"run.output_dir={out}", f"data.dir={out}/data", "system.enabled=false",
                        "tensorboard.enabled=false", "mlperf.platform=test"], CosmoConfig)


def _events(out):
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in (out / "mlperf.log").read_text().splitlines()]


def _keys(out):
    return [e["key"] for e in _events(out)]


def _until_started(run):
    run.init_start()
    run.init_stop(DataParallel(run.dist), {"seed": 1})
    run.start()


def _fit(run, result=None, error=None):
    """What run_benchmark does from the input on, with a training that returns `result` or raises `error`."""
    run.stage(None, "in_run")  # starts the I/O counters run.stopped() stops
    run.data = Datasets(train=None, val=None, train_steps=8, val_steps=2, train_samples=32, val_samples=8,
                        local_batch_size=4)
    with reading_as(lambda err: BenchError(f"cannot read the data ({err.message})"), run):
        if error is not None:
            raise error
    run.stopped(result, DataParallel(run.dist))
    return result


@pytest.mark.parametrize("error, reason", [
    (BenchError("/data/train_000.tfrecord: corrupt record at offset 4096"),
     "/data/train_000.tfrecord: corrupt record at offset 4096"),
    (RuntimeError("out of memory"), "RuntimeError: out of memory"),
    (KeyboardInterrupt(), "KeyboardInterrupt")])
def test_an_exception_after_run_start_ends_the_log_with_run_stop_and_leaves_the_summary(tmp_path, error, reason):
    with pytest.raises(type(error)) as raised:
        with Run.open("cosmoflow", _cfg(tmp_path), DistEnv(), StopRequests()) as run:
            _until_started(run)
            raise error
    assert raised.value is error  # goes on unchanged: train.py prints it and exits non-zero
    events = _events(tmp_path)
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "aborted"
    assert [e["key"] for e in events].count("run_stop") == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "aborted" and summary["reason"] == reason
    assert summary["error"] == type(error).__name__ and summary["epochs"] is None
    assert summary["benchmark"] == "cosmoflow" and summary["ranks"] == 1 and summary["time_to_train_seconds"] >= 0


def test_an_exception_before_run_start_leaves_no_run_stop_and_no_summary(tmp_path):
    with pytest.raises(BenchError):
        with Run.open("cosmoflow", _cfg(tmp_path), DistEnv(), StopRequests()) as run:
            run.init_start()
            raise BenchError("model.input_shape [32, 32, 32, 4] differs from the manifest's [16, 16, 16, 4]")
    assert "run_start" not in _keys(tmp_path) and "run_stop" not in _keys(tmp_path)
    assert not (tmp_path / "summary.json").exists()


def test_a_read_error_in_training_logs_run_stop_once(tmp_path):
    import tensorflow as tf
    corrupt = tf.errors.DataLossError(None, None, "corrupted record at 12")
    with pytest.raises(BenchError, match="cannot read the data"):
        with Run.open("cosmoflow", _cfg(tmp_path), DistEnv(), StopRequests()) as run:
            _until_started(run)
            _fit(run, error=corrupt)
    assert _keys(tmp_path).count("run_stop") == 1 and _keys(tmp_path)[-1] == "run_stop"
    assert "cannot read the data (corrupted record at 12)" in json.loads((tmp_path / "summary.json").read_text())[
        "reason"]


def test_an_exception_after_run_stop_logs_no_second_one_and_still_leaves_the_summary(tmp_path):
    result = FitResult("success", "mae 0.1 reached target 0.124", 3, 0.1, [], 1.0)
    with pytest.raises(OSError, match="disk full"):
        with Run.open("cosmoflow", _cfg(tmp_path), DistEnv(), StopRequests()) as run:
            _until_started(run)
            _fit(run, result=result)
            raise OSError("disk full")  # as if finish() failed
    events = _events(tmp_path)
    assert [e["key"] for e in events].count("run_stop") == 1 and events[-1]["metadata"]["status"] == "success"
    assert json.loads((tmp_path / "summary.json").read_text())["reason"] == "OSError: disk full"
    assert "OSError: disk full" in (tmp_path / "traceback.txt").read_text()  # an internal error's traceback


def _signalled(stop):
    """What a SIGTERM does to this process once `stop` is installed."""
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.signum == signal.SIGTERM  # the handler ran (Python runs it before the next bytecode)


@pytest.mark.parametrize("signalled_in_init", [False, True])
def test_a_stop_signal_in_start_up_ends_the_run_before_run_start(tmp_path, signalled_in_init):
    stop = StopRequests().install()
    try:
        with pytest.raises(StoppedBeforeStart, match="SIGTERM during start-up, before (init_start|run_start)"):
            with Run.open("cosmoflow", _cfg(tmp_path), DistEnv(), stop) as run:
                if signalled_in_init:
                    run.init_start()
                    run.init_stop(DataParallel(run.dist), {"seed": 1})
                    _signalled(stop)
                    run.start()
                else:
                    _signalled(stop)
                    _until_started(run)
    finally:
        stop.uninstall()
    assert "run_start" not in _keys(tmp_path) and not (tmp_path / "summary.json").exists()
    assert ("init_stop" in _keys(tmp_path)) == signalled_in_init


def test_guarded_run_handles_the_stop_signals_from_the_start_and_restores_them(tmp_path, capsys):
    before = signal.getsignal(signal.SIGTERM)

    def train(stop):
        _signalled(stop)
        with Run.open("cosmoflow", _cfg(tmp_path), DistEnv(), stop) as run:
            _until_started(run)
        return 0

    assert guarded_run(train) == exits.STOPPED
    assert "stopped: SIGTERM during start-up, before init_start" in " ".join(capsys.readouterr().err.split())
    assert signal.getsignal(signal.SIGTERM) == before
    assert guarded_run(lambda stop: 3) == 3


def test_guarded_run_turns_a_bench_error_into_exit_code_2(capsys):
    def train(_stop):
        raise BenchError("data.dir /x not found")

    assert guarded_run(train) == 2 and "error: data.dir /x not found" in capsys.readouterr().err


def test_any_other_exception_exits_4_with_one_line_and_its_traceback_in_a_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def train(_stop):
        raise KeyError("cosmoflow")

    assert guarded_run(train) == exits.INTERNAL_ERROR == 4
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("internal error: KeyError: 'cosmoflow' (raised at ")
    assert f"{__file__}:" in err and "in train)" in err
    path = Path(err.rsplit("traceback in ", 1)[1])
    assert path.parent == tmp_path and path.name.endswith("-traceback.txt")
    assert 'raise KeyError("cosmoflow")' in path.read_text() and "KeyError: 'cosmoflow'" in path.read_text()


def test_a_run_in_its_directory_names_its_traceback_there(tmp_path, capsys):
    def train(stop):
        with Run.open("cosmoflow", _cfg(tmp_path), DistEnv(), stop) as run:
            _until_started(run)
            raise ZeroDivisionError("division by zero")

    assert guarded_run(train) == 4
    assert capsys.readouterr().err.strip().endswith(f"traceback in {tmp_path / 'traceback.txt'}")
    assert "ZeroDivisionError: division by zero" in (tmp_path / "traceback.txt").read_text()
    assert json.loads((tmp_path / "summary.json").read_text())["reason"] == "ZeroDivisionError: division by zero"


def test_the_exit_code_comes_from_how_the_run_ended_not_from_its_reason():
    ended = dict(epochs=2, metric=None, history=[], train_seconds=1.0)
    assert exit_code(FitResult("aborted", "non-finite training loss nan in epoch 2", non_finite=True, **ended)) == 3
    assert exit_code(FitResult("aborted", "a reason that says non-finite", **ended)) == 1
    assert exit_code(FitResult("aborted", "stopped by SIGTERM", stopped=True, **ended)) == 75
    assert exit_code(FitResult("success", "non-finite", **ended)) == 0
    assert {exits.SUCCESS, exits.TARGET_NOT_REACHED, exits.BAD_INPUT, exits.NON_FINITE_LOSS, exits.INTERNAL_ERROR,
            exits.CHECKER_FAILED, exits.STOPPED} == set(exits.MEANINGS) == {0, 1, 2, 3, 4, 5, 75}


def test_exit_now_runs_the_exit_handlers_and_flushes_before_it_ends_the_process(tmp_path):
    # A logging file handler (as mlperf-logging's), an atexit handler (as Horovod's shutdown) and unflushed
    # stdout: exit_now must leave all three written and end with the code it was given.
    script = tmp_path / "ends.py"
    script.write_text(
        "import atexit, logging, sys\n"
        "from common.base.cli import exit_now\n"
        f"handler = logging.FileHandler({str(tmp_path / 'log.txt')!r})\n"
        "logging.getLogger('t').addHandler(handler)\n"
        "logging.getLogger('t').warning('last line')\n"
        f"atexit.register(lambda: open({str(tmp_path / 'atexit.txt')!r}, 'w').write('ran'))\n"
        "sys.stdout.write('unflushed')\n"
        "exit_now(3)\n")
    proc = run_cmd([sys.executable, script], timeout=60, env={"PYTHONUNBUFFERED": ""})  # stdout buffered
    assert proc.returncode == 3 and proc.stdout == "unflushed", proc.stderr
    assert (tmp_path / "atexit.txt").read_text() == "ran" and (tmp_path / "log.txt").read_text() == "last line\n"
