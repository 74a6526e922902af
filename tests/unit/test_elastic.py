"""The elastic state on tiny shapes: snapshots round-trip through commit and rollback, the learning rate stays
out, progress converts between rank layouts, and the settings elastic runs cannot work with are refused."""
import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

from common.runtime.checkpoint import Progress
from common.runtime.config import load_config
from common.runtime.dist import DistEnv
from common.runtime.hvd_settings import from_config as horovod_environment
from common.io.input import Datasets
from common.runtime.loop import Loop, Trainee
from common.runtime.elastic import (ElasticCommits, assign, check_elastic, convert_progress, new_state, snapshot,
                                    start_of, state_variables)
from common.runtime.elastic_procs import read_hosts
from common.base.errors import BenchError
from tests.conftest import REPO
from cosmoflow.config import CosmoConfig


def _model_and_optimizer():
    import keras
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.BatchNormalization()])
    optimizer = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def _train_once(model, optimizer, lr=0.1):
    import tensorflow as tf
    optimizer.learning_rate.assign(lr)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(tf.ones((4, 3)), training=True) ** 2)
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


def _local_state():
    """The state as one process sees it: broadcast_object is the identity there."""
    return new_state(bcast_object=lambda obj: obj, get_rank=lambda: 0)


def test_the_learning_rate_is_left_out_and_the_iteration_kept():
    model, optimizer = _model_and_optimizer()
    names = [v.name for v in state_variables(model, optimizer)]
    assert "learning_rate" not in names and "iteration" in names
    assert len(names) == len(model.variables) + len(optimizer.variables) - 1


def _loop(model, optimizer, steps_per_epoch: int) -> Loop:
    """A loop of `steps_per_epoch` steps an epoch over `model` (ElasticCommits reads the trainee and position)."""
    data = Datasets(None, None, steps_per_epoch, 1, 4 * steps_per_epoch, 4, 4)
    trainee = Trainee(model, optimizer, None, None, None)
    return Loop(trainee=trainee, data=data, steps=None, dist=DistEnv(), mlperf=None, options=None)


def _after_step(commits, loop, epoch, step, loss, history):
    loop.epoch, loop.step, loop.history = epoch, step, history
    loop.running = {"loss": loss, "train_seconds": 0.25 * step}
    commits.after_step(loop)


def test_a_commit_then_a_rollback_restores_the_committed_weights_and_progress():
    model, optimizer = _model_and_optimizer()
    _train_once(model, optimizer)
    state = _local_state()
    commits, loop = ElasticCommits(state, every=2, on_first_step=None), _loop(model, optimizer, 8)
    commits.start(loop)  # nothing committed yet: leaves the variables alone, starts at the beginning
    assert loop.start == Progress()
    committed = snapshot(state_variables(model, optimizer))
    _after_step(commits, loop, epoch=2, step=4, loss=0.5, history=[{"epoch": 1, "loss": 0.7}])
    for _ in range(3):
        _train_once(model, optimizer, lr=0.05)
    state.progress = None  # what a failure leaves behind, rolled back below
    state.restore()
    assert start_of(state, 8) == Progress(2, 4, [{"epoch": 1, "loss": 0.7}], {"loss_sum": 2.0, "seconds": 1.0})
    model2, optimizer2 = _model_and_optimizer()  # what a restart builds
    optimizer2.learning_rate.assign(0.123)
    restarted = _loop(model2, optimizer2, 8)
    ElasticCommits(state, 2, None).start(restarted)
    assert (restarted.start.epoch, restarted.start.step) == (2, 4)
    for before, after in zip(committed, snapshot(state_variables(model2, optimizer2))):
        np.testing.assert_array_equal(before, after)
    assert int(optimizer2.iterations.numpy()) == 1
    assert float(optimizer2.learning_rate.numpy()) == pytest.approx(0.123)  # set by the schedule, not the state


def test_commits_come_every_n_steps_but_not_at_the_epoch_end_which_after_epoch_commits():
    model, optimizer = _model_and_optimizer()
    state = _local_state()
    commits, loop = ElasticCommits(state, every=2, on_first_step=None), _loop(model, optimizer, 4)
    commits.start(loop)
    _after_step(commits, loop, 1, 1, 1.0, [])
    assert state.progress is None
    _after_step(commits, loop, 1, 2, 1.0, [])
    assert state.progress["step"] == 2
    _after_step(commits, loop, 1, 4, 1.0, [])
    assert state.progress["step"] == 2
    loop.history = [{"epoch": 1}]
    commits.after_epoch(loop)
    assert (state.progress["epoch"], state.progress["step"]) == (2, 0)


def test_the_first_step_of_a_restart_is_noted_once_with_where_it_began():
    model, optimizer = _model_and_optimizer()
    noted = []
    commits, loop = ElasticCommits(_local_state(), every=2, on_first_step=noted.append), _loop(model, optimizer, 4)
    commits.start(loop)
    _after_step(commits, loop, 1, 1, 1.0, [])
    _after_step(commits, loop, 1, 2, 1.0, [])
    assert noted == [Progress()]


def test_progress_keeps_the_fraction_of_the_epoch_done_in_steps_of_the_new_layout():
    done = Progress(3, 6, [{"epoch": 1}, {"epoch": 2}], {"loss_sum": 3.0, "seconds": 1.5})
    at_two_ranks = convert_progress(done, old_steps=8, new_steps=12)  # 3 ranks -> 2: more steps per epoch
    assert (at_two_ranks.epoch, at_two_ranks.step) == (3, 9)
    assert at_two_ranks.partial == {"loss_sum": 4.5, "seconds": 1.5} and at_two_ranks.history == done.history
    assert convert_progress(done, 8, 8) == done
    assert convert_progress(Progress(4, 0), 8, 12) == Progress(4, 0)
    assert convert_progress(Progress(1, 7), 8, 2).step == 2  # never beyond the new epoch's end


def test_a_snapshot_of_another_model_is_refused_naming_the_shapes():
    model, optimizer = _model_and_optimizer()
    arrays = snapshot(state_variables(model, optimizer))
    with pytest.raises(BenchError, match="arrays in the snapshot"):
        assign(state_variables(model, optimizer), arrays[:-1])
    arrays[0] = np.zeros((5, 2), np.float32)
    with pytest.raises(BenchError, match=r"array 0 has shape \(5, 2\)"):
        assign(state_variables(model, optimizer), arrays)


def _cfg(*overrides):
    from tests.conftest import REPO
    return load_config(REPO / "cosmoflow/configs/cosmo_mini.yaml", ["dist.elastic.enabled=true", *overrides],
                       CosmoConfig)


def test_settings_elastic_runs_cannot_work_with_are_refused_by_name():
    hvd = DistEnv(size=3, horovod=True)
    check_elastic(_cfg(), hvd)
    with pytest.raises(BenchError, match="needs Horovod's elastic launcher"):
        check_elastic(_cfg(), DistEnv())
    with pytest.raises(BenchError, match="data.stage_mode='rank'"):
        check_elastic(_cfg("data.stage_dir=/tmp/x", "data.stage_mode=rank"), hvd)
    with pytest.raises(BenchError, match="data.stage_dir='/tmp/x'"):
        check_elastic(_cfg("data.stage_dir=/tmp/x"), hvd)
    with pytest.raises(BenchError, match="checkpoint.every_epochs=2"):
        check_elastic(_cfg("checkpoint.every_epochs=2"), hvd)
    with pytest.raises(BenchError, match="dist.elastic.commit_every_steps = 0"):
        _cfg("dist.elastic.commit_every_steps=0")


def test_the_hybrid_path_refuses_elastic():
    from cosmoflow.train import strategy_for
    with pytest.raises(BenchError, match=r"parallel.spatial=\[2, 1\]"):
        strategy_for(_cfg("parallel.spatial=[2,1]"), DistEnv(size=2, horovod=True))


def test_elastic_runs_leave_the_cycle_time_at_horovods_default():
    cfg = _cfg().dist
    assert "HOROVOD_CYCLE_TIME" not in horovod_environment(cfg)
    assert "HOROVOD_CYCLE_TIME" in horovod_environment(dataclasses.replace(cfg, elastic=type(cfg.elastic)()))


def test_the_hosts_file_gives_the_discovery_lines_and_bad_lines_are_named(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("localhost:1\n# a comment\n\n127.0.0.1:1  # loopback\n")
    assert read_hosts(path) == ["localhost:1", "127.0.0.1:1"]
    path.write_text("localhost\n")
    with pytest.raises(BenchError, match="line 1 is 'localhost', expected host:slots"):
        read_hosts(path)


def test_the_discovery_script_and_the_watchdog_import_only_the_standard_library(tmp_path):
    """Horovod runs the discovery script about once a second: it must not import NumPy or the runtime."""
    path = tmp_path / "hosts"
    path.write_text("localhost:1\n")
    probe = ("import runpy, sys; sys.argv = ['elastic_procs', 'hosts', sys.argv[1]]\n"
             "try:\n    runpy.run_module('common.runtime.elastic_procs', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'yaml', 'horovod', 'tensorflow')"
             " or m.startswith('common.runtime.') and m != 'common.runtime.elastic_procs'))")
    proc = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and proc.stdout.splitlines() == ["localhost:1", "[]"], proc.stdout + proc.stderr
