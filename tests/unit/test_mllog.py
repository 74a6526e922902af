"""MLPerf log: rank 0 writes parseable :::MLLOG lines with the caller's location; others write nothing."""

from common.base.mlperf_log import read_events
from common.runtime.config import MlperfConfig
from common.runtime.summary import MLPerfLog, dataset_keys, scale_keys
from cosmoflow.config import OptimizerConfig, ScheduleConfig
from cosmoflow.train import LRSchedule, sgd_keys

SCHEDULE = ScheduleConfig(decay_epochs=(2,), decay_factors=(0.5,))


def _events(path):
    return read_events(path, strict=True)


def test_root_writes_events(tmp_path):
    log = MLPerfLog(tmp_path / "mlperf.log")
    log.start("init_start")
    log.submission("cosmoflow", MlperfConfig(), cache_cleared=False)
    log.events(scale_keys(nodes=1, accelerators_per_node=0, global_batch_size=8)
               | dataset_keys(train_samples=64, eval_samples=16)
               | sgd_keys(OptimizerConfig(), SCHEDULE, LRSchedule.from_config(OptimizerConfig(), SCHEDULE, 64))
               | {"dropout": 0.5})
    log.end("epoch_stop", epoch_num=3)
    log.close()
    events = _events(tmp_path / "mlperf.log")
    keys = [e["key"] for e in events]
    assert keys[0] == "init_start" and "submission_benchmark" in keys and "opt_learning_rate_decay_factor" in keys
    by_key = {e["key"]: e for e in events}
    assert by_key["submission_benchmark"]["value"] == "cosmoflow"
    assert by_key["opt_learning_rate_decay_boundary_epochs"]["value"] == [2]
    assert by_key["epoch_stop"]["metadata"]["epoch_num"] == 3
    assert by_key["init_start"]["metadata"]["file"].endswith("test_mllog.py")  # the caller, not common/runtime/summary.py


def test_other_ranks_write_nothing(tmp_path):
    log = MLPerfLog(tmp_path / "mlperf.log", enabled=False)
    log.start("init_start")
    log.close()
    assert not (tmp_path / "mlperf.log").exists()
