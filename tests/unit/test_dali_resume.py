"""Exact resume with DALI (common/runtime/checkpoint.py plan_input, replayed): meta.json
records what a rank's input position depends on; a resumed run with the same loader, seed and layout keeps the
checkpoint's seed and skips the batches consumed, else starts afresh with a new seed and says why; and a DALI
stream rebuilt with the same seed and skipped gives what the uninterrupted stream gives next (the premise)."""
from __future__ import annotations

import json
import re

import pytest

from common.base.errors import BenchError
from common.io.position import InputPosition, Layout
from common.runtime.checkpoint import (META, InputPlan, Meta, check_checkpoint, plan_input,
                                       read_checkpoint, replayed, restore_rank)
from common.runtime.dist import DistEnv
from tests.conftest import require_dali
from tests.unit.test_checkpoint_meta import LAYOUT, SAVED, STEPS, model_and_optimizer, write_checkpoint

SEEDS = (5, 5 + 7919 * 2)  # the run's, and the new one of attempt 3 (SAVED is attempt 2's)
STEP = SAVED.global_step(STEPS)  # 10


def _resume(path) -> Meta:
    return read_checkpoint(path)


def _dali_checkpoint(tmp_path, **position):
    """A one-rank DALI checkpoint at global step 10 whose stream began at step 4 with seed 12."""
    fields = dict(loader="dali", seed=12, start_step=4, layout=LAYOUT) | position
    return write_checkpoint(tmp_path, position=InputPosition(**fields | {"layout": Layout(**fields["layout"])}))


def test_meta_json_records_the_input_position(tmp_path):
    meta = json.loads((_dali_checkpoint(tmp_path) / META).read_text())
    assert meta["input"] == {"loader": "dali", "seed": 12, "start_step": 4, "layout": LAYOUT}


def test_the_same_dali_layout_keeps_the_seed_and_skips_the_consumed_batches(tmp_path):
    plan = plan_input(_resume(_dali_checkpoint(tmp_path)), SEEDS, "dali", Layout(**LAYOUT))
    assert plan == InputPlan(seed=12, start_step=4, restore="replay", skip=STEP - 4)


@pytest.mark.parametrize("change, why", [
    ({"ranks_per_node": 2, "node_share": True}, r"the input layout changed since the checkpoint \(ranks_per_node 0 "
                                                r"-> 2, node_share False -> True\)"),
    ({"local_batch_size": 8}, r"local_batch_size 4 -> 8"),
    ({"run_seed": 6}, r"run_seed 5 -> 6"),
])
def test_another_layout_starts_afresh_with_a_new_seed_and_says_why(tmp_path, change, why):
    plan = plan_input(_resume(_dali_checkpoint(tmp_path)), SEEDS, "dali", Layout(**LAYOUT | change))
    assert (plan.seed, plan.start_step, plan.restore) == (SEEDS[1], STEP, "")
    assert re.search(why, plan.why_afresh), plan.why_afresh


@pytest.mark.parametrize("saved, loader, why", [
    ({"loader": "dali"}, "tfdata", "the checkpoint's input was read with DALI, this run reads with tfdata"),
    ({"loader": "tfdata"}, "tfdata", "the tf.data iterator state was not saved (checkpoint.input_state=false)"),
    ({"loader": "", "layout": LAYOUT | {"strategy": "hybrid"}}, "dali",
     "the hybrid strategy keeps no input position"),
])
def test_a_position_that_cannot_be_replayed_starts_afresh(tmp_path, saved, loader, why):
    plan = plan_input(_resume(_dali_checkpoint(tmp_path, **saved)), SEEDS, loader, Layout(**LAYOUT))
    assert (plan.seed, plan.restore, plan.why_afresh) == (SEEDS[1], "", why)


@pytest.mark.parametrize("edit, message", [
    (lambda i: i.pop("seed"), r"section input: missing key input.seed: expected an integer"),
    (lambda i: i.__setitem__("loader", "pytorch"), r"key input.loader = 'pytorch': expected one of \['tfdata', "
                                                   r"'dali', ''\]"),
    (lambda i: i.__setitem__("start_step", 11), r"key input.start_step = 11: expected a step no later than "
                                                r"global_step 10"),
    (lambda i: i["layout"].pop("shuffle_buffer"), r"section input.layout: missing key input.layout.shuffle_buffer"),
    (lambda i: i["layout"].__setitem__("nodes", 1), r"section input.layout: unknown key\(s\) input.layout.nodes; "
                                                    r"valid keys: run_seed, ranks"),
    (lambda i: i["layout"].__setitem__("ranks", 2), r"key input.layout.ranks = 2: expected ranks \(1\)"),
    (lambda i: i["layout"].__setitem__("run_seed", 2 ** 63), r"key input.layout.run_seed = 9223372036854775808: "
                                                             r"expected an integer in \[-2\^63, 2\^63\)"),
])
def test_a_damaged_input_position_is_named_with_its_key(tmp_path, edit, message):
    path = _dali_checkpoint(tmp_path)
    meta = json.loads((path / META).read_text())
    edit(meta["input"])
    (path / META).write_text(json.dumps(meta))
    with pytest.raises(BenchError, match=rf"^{path / META}: {message}"):
        check_checkpoint(path)


def test_restore_rank_says_the_dali_input_was_replayed(tmp_path):
    resume = _resume(_dali_checkpoint(tmp_path))
    lines = []
    assert restore_rank(resume, model_and_optimizer(0.0)[0], None, DistEnv(), lines.append,
                        plan_input(resume, SEEDS, "dali", Layout(**LAYOUT)))
    assert lines == ["resume: the DALI training input was replayed: 6 batches skipped per rank, from a stream "
                     "rebuilt with the checkpoint's seed 12; the data order is the uninterrupted run's"]


@pytest.fixture(scope="module")
def dali_records(tmp_path_factory) -> dict:
    """{app: tiny records whose samples carry their numbers} (tests/unit/test_dali_ranks.py)."""
    require_dali()
    from tests.unit.test_dali_ranks import write_cosmo_records, write_deepcam_records
    root = tmp_path_factory.mktemp("records")
    return {"cosmoflow": write_cosmo_records(root / "cosmo"), "deepcam": write_deepcam_records(root / "deepcam")}


@pytest.mark.parametrize("app", ["cosmoflow", "deepcam"])
@pytest.mark.parametrize("node_share", [False, True])
def test_a_rebuilt_dali_stream_skipped_to_the_position_continues_the_straight_one(app, node_share, dali_records):
    """Two epochs and three batches into rank 1's stream, a stream built again with the same seed and skipped by
    as many batches gives the next epoch and a half as the straight one (with DALI's per-epoch reshuffles)."""
    from tests.unit.test_dali_ranks import BUILDERS, ranks
    build, ids, _fixture = BUILDERS[app]
    records, dist = dali_records[app], ranks(1, 2)[1]
    straight = build(records, dist, node_share=node_share)
    consumed, following = 2 * straight.train_steps + 3, 3 * straight.train_steps // 2
    stream = iter(straight.train)
    for _ in range(consumed):
        next(stream)
    expected = [ids(next(stream)) for _ in range(following)]
    plan = InputPlan(5, restore="replay", skip=consumed)
    resumed = iter(replayed(build(records, dist, node_share=node_share).train, plan))
    assert [ids(next(resumed)) for _ in range(following)] == expected


def _run(tmp_path, *overrides):
    """A Run resuming the DALI checkpoint of `_dali_checkpoint(tmp_path)`, after init_stop."""
    from common.runtime.config import load_config
    from common.runtime.run import Run
    from common.runtime.dist import StopRequests
    from common.runtime.strategy import DataParallel
    from cosmoflow.config import CosmoConfig
    from tests.conftest import REPO
    cfg = load_config(REPO / "cosmoflow/configs/cosmo_mini.yaml", [
        f"run.output_dir={tmp_path}/out", f"data.dir={tmp_path}/data", "system.enabled=false",
        "tensorboard.enabled=false", "mlperf.platform=test", f"checkpoint.dir={tmp_path}/ckpt",
        "checkpoint.resume=true", "run.seed=5", "train.local_batch_size=4", "data.shuffle=true",
        "data.shuffle_buffer=8", "data.loader=auto", *overrides], CosmoConfig)
    run = Run.open("cosmoflow", cfg, DistEnv(), StopRequests())
    run.init_stop(DataParallel(run.dist), {"seed": 5})
    return run


def _plan(run):
    from common.runtime.strategy import DataParallel
    return run.plan_input(DataParallel(run.dist), run.cfg.data)[1]


def test_a_resumed_run_keeps_the_checkpoints_seed_only_for_the_same_layout(tmp_path, monkeypatch):
    monkeypatch.setattr("common.runtime.checkpoint.dali_plugin_available", lambda: True)
    _dali_checkpoint(tmp_path)
    with _run(tmp_path) as run:
        plan = _plan(run)
        assert plan.seed == 12 and plan.restore == "replay" and plan.skip == STEP - 4
    with _run(tmp_path, "train.local_batch_size=8") as run:
        plan = _plan(run)
        assert plan.seed == 5 + 7919 * SAVED.attempt and plan.restore == ""


@pytest.mark.parametrize("installed, loader", [(True, "dali"), (False, "tfdata")])
def test_auto_resumes_with_the_checkpoints_loader_when_installed_else_afresh(tmp_path, monkeypatch, installed,
                                                                             loader):
    """data.loader=auto on a resumed run reads with the checkpoint's loader (DALI when its plugin imports), so the
    input is built once, for the position planned; without DALI it reads tf.data and starts afresh."""
    from common.runtime.checkpoint import resume_loader
    monkeypatch.setattr("common.runtime.checkpoint.dali_plugin_available", lambda: installed)
    _dali_checkpoint(tmp_path)
    with _run(tmp_path) as run:
        assert resume_loader("auto", run.resume) == loader and resume_loader("tfdata", run.resume) == "tfdata"
        plan = _plan(run)
    assert plan.restore == ("replay" if installed else "")
    assert plan.seed == (12 if installed else 5 + 7919 * SAVED.attempt)
