"""RCPs from mlperf-logging set CosmoFlow's hyperparameters; the division is closed only for the reference's run."""
import json

import pytest

from common.base.errors import BenchError
from common.runtime.config import load_config, resolve_division
from common.base.rcp import load_rcp, rcp_file, rcp_names
from cosmoflow.config import CosmoConfig
from cosmoflow.config import closed_differences
from cosmoflow.rcp import with_rcp
from cosmoflow.train import LRSchedule
from cosmoflow.train import main
from tests.conftest import REPO

REFERENCE = REPO / "cosmoflow/configs/cosmo.yaml"
MINI = REPO / "cosmoflow/configs/cosmo_mini.yaml"


def test_every_shipped_cosmoflow_rcp_maps_onto_the_config_and_back():
    """Each RCP's logged hyperparameters are what a run configured from it logs (with the reference's meanings)."""
    for name in rcp_names("cosmoflow"):
        rcp = load_rcp("cosmoflow", name)
        mine = with_rcp(load_config(REFERENCE, [f"optimizer.rcp={name}"], CosmoConfig), rcp.global_batch_size)
        schedule = LRSchedule.from_config(mine.optimizer, mine.schedule, rcp.global_batch_size)
        assert schedule.peak_lr == pytest.approx(rcp.value("opt_base_learning_rate")), name
        assert schedule.warmup_factor == pytest.approx(rcp.value("opt_learning_rate_warmup_factor")), name
        assert mine.schedule.warmup_epochs == rcp.value("opt_learning_rate_warmup_epochs")
        assert list(mine.schedule.decay_epochs) == rcp.value("opt_learning_rate_decay_boundary_epochs")
        factors = rcp.value("opt_learning_rate_decay_factor")
        assert mine.schedule.decay_factors[0] == pytest.approx(factors[0] if isinstance(factors, list) else factors)
        assert (mine.model.dropout, mine.optimizer.weight_decay) == (rcp.value("dropout"), rcp.value("opt_weight_decay"))
        assert closed_differences(mine) == [], name


def test_a_single_decay_factor_is_raised_to_the_boundary_index():
    cfg = load_config(REFERENCE, ["optimizer.rcp=cosmoflow_ref_64"], CosmoConfig)
    assert with_rcp(cfg, 64).schedule.decay_factors == (0.25, 0.0625)


def test_an_rcp_refuses_another_global_batch_and_unknown_names_list_the_valid_ones():
    cfg = load_config(REFERENCE, ["optimizer.rcp=cosmoflow_ref_128"], CosmoConfig)
    with pytest.raises(BenchError, match=r"cosmoflow_ref_128 is for global batch 128, this run's is 32"):
        with_rcp(cfg, 32)
    bad = load_config(REFERENCE, ["optimizer.rcp=cosmoflow_ref_7"], CosmoConfig)
    with pytest.raises(BenchError, match=r"no such RCP.*cosmoflow_ref_32, cosmoflow_ref_64"):
        with_rcp(bad, 7)
    assert rcp_file("cosmoflow").name == "rcps_cosmoflow.json"


def test_the_reference_config_is_closed_and_the_mini_config_says_why_it_is_not():
    assert closed_differences(load_config(REFERENCE, [], CosmoConfig)) == []
    mini = closed_differences(load_config(MINI, [], CosmoConfig))
    joined = "; ".join(mini)
    for key in ("model.input_shape", "model.conv_filters", "model.pooling", "data.train_samples",
                "data.normalize", "model.dropout"):
        assert key in joined
    stepped = load_config(REFERENCE, ["schedule.granularity=step"], CosmoConfig)
    assert closed_differences(stepped) == ["schedule.granularity step (reference epoch)"]


def test_the_division_is_settled_from_the_differences():
    cfg = load_config(REFERENCE, [], CosmoConfig)
    assert resolve_division(cfg, []).mlperf.division == "closed"
    assert resolve_division(cfg, ["model.pooling avg (reference max)"]).mlperf.division == "open"
    opened = load_config(REFERENCE, ["mlperf.division=open"], CosmoConfig)
    assert resolve_division(opened, []).mlperf.division == "open"
    closed = load_config(REFERENCE, ["mlperf.division=closed"], CosmoConfig)
    with pytest.raises(BenchError, match=r"mlperf.division=closed, but .*model.pooling avg \(reference max\)"):
        resolve_division(closed, ["model.pooling avg (reference max)"])


def test_dry_run_json_gives_the_resolved_run_and_the_rate_of_every_epoch(capsys):
    code = main([str(REFERENCE), "optimizer.rcp=cosmoflow_ref_512", "train.max_epochs=8", "--dry-run",
                 "--json", "--ranks", "128"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["global_batch_size"] == 512 and plan["division"] == "closed"
    # RCP 512: peak 0.006 with factor 4 over 6 warm-up epochs from 0.0015
    assert plan["learning_rate_by_epoch"] == pytest.approx([0.0015 + e * 0.0045 / 6 for e in range(6)] + [0.006] * 2)
    assert plan["hyperparameters"]["opt_base_learning_rate"] == pytest.approx(0.006)
    assert plan["config"]["optimizer"]["rcp"] == "cosmoflow_ref_512"


def test_dry_run_of_a_mismatched_batch_fails_with_the_reason(capsys):
    assert main([str(REFERENCE), "optimizer.rcp=cosmoflow_ref_512", "--dry-run", "--ranks", "2"]) == 2
    assert "is for global batch 512, this run's is 8" in capsys.readouterr().err


def test_deepcam_rcps_set_optimizer_and_schedule_and_the_mini_config_is_open():
    from deepcam.config import DeepCamConfig
    from deepcam.config import closed_differences as deepcam_differences
    from deepcam.rcp import with_rcp as deepcam_rcp
    reference = REPO / "deepcam/configs/deepcam.yaml"
    for name in rcp_names("deepcam"):
        rcp = load_rcp("deepcam", name)
        cfg = deepcam_rcp(load_config(reference, [f"optimizer.rcp={name}"], DeepCamConfig), rcp.global_batch_size)
        assert cfg.optimizer.lr == pytest.approx(float(rcp.value("opt_lr")))
        assert cfg.schedule.type == rcp.value("scheduler_type")
        assert cfg.schedule.warmup_steps == rcp.value("scheduler_lr_warmup_steps")
        if cfg.schedule.type == "multistep":
            assert list(cfg.schedule.milestones) == rcp.value("scheduler_milestones")
        else:
            assert cfg.schedule.t_max == int(rcp.value("scheduler_t_max"))  # "9000" in the file
        assert deepcam_differences(cfg) == [], name
    mini = deepcam_differences(load_config(REPO / "deepcam/configs/deepcam_mini.yaml", [], DeepCamConfig))
    assert any(d.startswith("model.width 0.125") for d in mini)


def test_deepcam_dry_run_json_gives_the_rate_at_each_epoch_start(capsys):
    from deepcam.optim import StepSchedule
    from deepcam.train import main as deepcam_main
    code = deepcam_main([str(REPO / "deepcam/configs/deepcam.yaml"), "optimizer.rcp=deepcam_ref_1024",
                         "train.max_epochs=6", "--dry-run", "--json", "--ranks", "512"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["global_batch_size"] == 1024 and plan["division"] == "closed"
    steps = 121266 // 512 // 2  # each rank's block in whole batches of 2
    cfg = plan["config"]
    schedule = StepSchedule(cfg["optimizer"]["lr"], 200, 1.0, "multistep", (1100, 4096), 0.1)
    assert plan["learning_rate_by_epoch"] == pytest.approx([schedule.at_step(e * steps) for e in range(6)])
    assert plan["hyperparameters"]["scheduler_milestones"] == [1100, 4096]
