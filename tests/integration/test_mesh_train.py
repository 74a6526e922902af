"""CosmoFlow's hybrid path under real `horovodrun -np 4` with parallel.spatial=[2,1]: 2 groups of 2 ranks,
staging their data first; and one group of all 4 ranks split [2,2], each reading its block's own records,
against one rank.

The hybrid run and a data-parallel reference with one rank per group (`horovodrun -np 2`) train the same
steps on the same data from the same initial weights (rank 0's, seeded as group 0), so their losses and
validation MAE must agree to float32 rounding: the mesh splits every cube in two blocks (halo exchange)
and sums gradients over 4 ranks, the reference convolves whole cubes and averages over 2. Every rank's final
weights, saved by mesh_weights_worker.py, are compared here array by array.

The runs read `cosmo_small` (32 training and 16 validation samples in 4 and 2 files): 2 epochs of 4 steps
on 2 groups, of 8 steps on one. A height-only split ([1, 2]) trains through the same code as [2, 2] (which
splits height too); tests/unit/test_mesh_model.py compares its numbers with Keras'.
"""
import json
import sys

import numpy as np
import pytest

from common.campaign.compliance import check_log
from tests.conftest import REPO, copy_of, horovodrun, log_events, run_cmd, show
from tests.integration.cosmo_fixtures import write_config

pytestmark = pytest.mark.slow
TRAIN = REPO / "cosmoflow/train.py"
WORKER = REPO / "tests/integration/mesh_weights_worker.py"  # train.py, saving each rank's final weights
# tf.data: the same batches in the same order under both runs (seeded per data-parallel replica). With the
# reference's weight decay (L2 on the dense kernels), which the two paths add differently.
SECTIONS = {"train": {"max_epochs": 2, "target": 1e-6}, "data": {"loader": "tfdata", "shuffle_buffer": 8},
            "optimizer": {"weight_decay": 0.05}}


@pytest.fixture(scope="module")
def runs(cosmo_small, tmp_path_factory):
    """The hybrid run (4 ranks, [2, 1], its data staged first: data.stage_mode=node, local rank 0 stages, the
    other ranks wait) and the data-parallel reference (2 ranks, reading in place): their output directories."""
    root = tmp_path_factory.mktemp("runs")
    staged = {"stage_dir": str(root / "local"), "stage_mode": "node"}
    outs = {}
    for name, ranks, spatial, data in (("hybrid", 4, "[2,1]", staged), ("reference", 2, "[1,1]", {})):
        outs[name] = root / name
        cfg = write_config(root / f"{name}.yaml", cosmo_small, outs[name], train=SECTIONS["train"],
                           data={**SECTIONS["data"], **data}, optimizer=SECTIONS["optimizer"])
        outs[f"{name}_weights"] = _weights_dir(root, name)
        proc = horovodrun(ranks, [WORKER, outs[f"{name}_weights"], cfg, f"parallel.spatial={spatial}"], timeout=300)
        # The target is out of reach: every run ends with exit 1 after its 2 epochs.
        assert proc.returncode == 1, show(proc)
        outs[f"{name}_stdout"] = proc.stdout
    return outs


def _weights_dir(root, name):
    (root / f"{name}-weights").mkdir()
    return root / f"{name}-weights"


def _summary(out):
    return json.loads((out / "summary.json").read_text())


def test_hybrid_training_equals_data_parallel_training(runs):
    hybrid, reference = _summary(runs["hybrid"]), _summary(runs["reference"])
    assert hybrid["epochs"] == reference["epochs"] == 2
    for mine, theirs in zip(hybrid["history"], reference["history"]):
        assert mine["steps"] == theirs["steps"] == 4  # 32 samples / (2 replicas x batch 4)
        assert mine["val_samples_seen"] == theirs["val_samples_seen"] == 16  # the whole validation split
        for key in ("loss", "val_loss", "mae", "mae_Omega_m", "mae_H_0", "lr"):
            np.testing.assert_allclose(mine[key], theirs[key], rtol=1e-4, err_msg=key)
    # Training did something: the loss moved between the epochs.
    assert abs(hybrid["history"][1]["loss"] - hybrid["history"][0]["loss"]) > 1e-3


def assert_same_weights_on_every_rank(weights_dir, ranks: int) -> None:
    """Every rank's final weights (saved by mesh_weights_worker.py) equal rank 0's, array for array, bit for bit."""
    saved = sorted(weights_dir.glob("weights_rank_*.npz"))
    assert len(saved) == ranks, saved
    arrays = []
    for path in saved:
        with np.load(path) as npz:
            arrays.append([npz[f"arr_{i}"] for i in range(len(npz.files))])
    assert len(arrays[0]) > 0
    for rank, mine in enumerate(arrays[1:], 1):
        assert len(mine) == len(arrays[0]), rank
        for i, (a, b) in enumerate(zip(arrays[0], mine)):
            assert a.shape == b.shape and np.array_equal(a, b), f"rank {rank}, weight {i} differs from rank 0's"


def test_weights_stay_identical_on_every_rank(runs):
    parallel = _summary(runs["hybrid"])["parallel"]
    assert parallel["spatial"] == [2, 1] and parallel["data_parallel_groups"] == 2
    assert_same_weights_on_every_rank(runs["hybrid_weights"], 4)
    assert len(parallel["weights_sha256_per_rank"]) == 4 and parallel["weights_identical"]  # and it says so


def test_log_has_the_partitioning_and_passes_the_checker(runs):
    out = runs["hybrid"]
    assert check_log(out / "mlperf.log").only_target_failed
    values = {e["key"]: e["value"] for e in log_events(out / "mlperf.log")}
    assert values["spatial_partitions"] == "2x1" and values["data_parallel_groups"] == 2
    # The global batch is the local batch times the groups, not times the ranks.
    assert values["global_batch_size"] == 8 and values["train_samples"] == 32 and values["eval_samples"] == 16
    reference = {e["key"]: e["value"] for e in log_events(runs["reference"] / "mlperf.log")}
    assert "spatial_partitions" not in reference and reference["global_batch_size"] == 8
    assert [e["key"] for e in log_events(out / "mlperf.log")].count("eval_error") == 2
    summary = _summary(out)
    assert summary["ranks"] == 4 and summary["global_batch_size"] == 8 and summary["status"] == "aborted"
    assert "2 data-parallel groups of 2 ranks" in runs["hybrid_stdout"]


def test_every_rank_reads_its_groups_shard_and_decodes_only_its_half(runs):
    ranks = json.loads((runs["hybrid"] / "io_report.json").read_text())["ranks"]
    planned = {r["rank"]: r["planned"] for r in ranks}
    for rank in range(4):  # 2 epochs of 4 steps and 2 evaluations of 2 steps, batch 4
        assert planned[rank]["train_records"] == 32 and planned[rank]["eval_records"] == 16
        assert planned[rank]["bytes"] > 0 and planned[rank]["files_opened"] > 0
        assert planned[rank]["decoded_fraction"] == 0.5
    assert planned[1] == planned[0] and planned[3] == planned[2]  # a group's ranks read the same files


def test_staging_on_the_hybrid_path_is_reported_and_every_rank_reads_the_staged_copy(runs):
    out = runs["hybrid"]
    report = json.loads((out / "io_report.json").read_text())
    staging = report["staging"]
    assert staging["mode"] == "node" and staging["source_kind"] == "plain" and staging["staging_ranks"] == 1
    assert staging["files"] > 0
    keys = [e["key"] for e in log_events(out / "mlperf.log")]
    assert keys.index("staging_start") < keys.index("staging_stop") < keys.index("epoch_start")
    for r in report["ranks"]:  # 2 epochs x 4 steps x 4, each rank's block
        assert r["planned"]["train_records"] == 32 and r["planned"]["decoded_fraction"] == 0.5


@pytest.fixture(scope="module")
def one_group_runs(cosmo_small, tmp_path_factory):
    """One group holding every rank, [2,2] on 4 ranks reading each block's own records (python -m data_prep
    cosmo-blocks, written into our own copy), against one data-parallel rank (one process, no horovodrun)."""
    root = tmp_path_factory.mktemp("one-group")
    data_dir = copy_of(cosmo_small, tmp_path_factory)
    proc = run_cmd([sys.executable, "-m", "data_prep", "cosmo-blocks", "--data", str(data_dir), "--spatial", "2x2",
                    "--workers", "1"])
    assert proc.returncode == 0, show(proc)
    outs = {}
    for name, ranks, spatial, data in (("2x2", 4, "[2,2]", {"blocks": "records"}), ("reference", 1, "[1,1]", {})):
        outs[name] = root / name
        cfg = write_config(root / f"{name}.yaml", data_dir, outs[name], train=SECTIONS["train"],
                           data={**SECTIONS["data"], **data})
        outs[f"{name}_weights"] = _weights_dir(root, name)
        args = [WORKER, outs[f"{name}_weights"], cfg, f"parallel.spatial={spatial}"]
        proc = horovodrun(ranks, args, timeout=300) if ranks > 1 else run_cmd([sys.executable, *args], timeout=300)
        assert proc.returncode == 1, show(proc)
    return outs


def test_one_group_split_in_depth_and_height_trains_as_one_rank(one_group_runs):
    summary, reference = _summary(one_group_runs["2x2"]), _summary(one_group_runs["reference"])
    assert summary["epochs"] == reference["epochs"] == 2
    for mine, theirs in zip(summary["history"], reference["history"]):
        assert mine["steps"] == theirs["steps"] == 8  # 32 samples / (1 replica x batch 4)
        for key in ("loss", "val_loss", "mae", "lr"):
            np.testing.assert_allclose(mine[key], theirs[key], rtol=1e-4, err_msg=key)
    parallel = summary["parallel"]
    assert parallel["spatial"] == [2, 2] and parallel["data_parallel_groups"] == 1
    assert_same_weights_on_every_rank(one_group_runs["2x2_weights"], 4)
    assert len(parallel["weights_sha256_per_rank"]) == 4 and parallel["weights_identical"]
    assert check_log(one_group_runs["2x2"] / "mlperf.log").only_target_failed


def test_ranks_that_cannot_form_whole_groups_stop_before_any_work(tmp_path):
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tmp_path / "no-data", out)  # never looked at
    proc = horovodrun(3, [TRAIN, cfg, "parallel.spatial=[2,1]"], timeout=180)
    assert proc.returncode == 2, show(proc)  # the ranks' exit code, passed on by horovodrun
    # Every rank says why, with the numbers (horovodrun prefixes and may break the lines).
    text = " ".join(line.split(">:", 1)[-1] for line in proc.stderr.splitlines())
    assert " ".join(text.split()).count("parallel.spatial [2, 1]: 3 ranks are not divisible by 2 partitions") == 3, \
        show(proc)
    assert not out.exists()  # before any work: not even config.yaml


def test_the_ranks_of_a_group_reading_their_blocks_own_records_read_a_quarter_of_the_bytes(one_group_runs):
    """The [2,2] run above trained as one rank does while each rank read only its block's records."""
    mine = {r["rank"]: r["planned"] for r in json.loads((one_group_runs["2x2"] / "io_report.json").read_text())["ranks"]}
    whole = json.loads((one_group_runs["reference"] / "io_report.json").read_text())["ranks"][0]["planned"]
    for rank in range(4):
        assert mine[rank]["block_records"] and mine[rank]["decoded_fraction"] == 0.25
        assert mine[rank]["train_records"] == whole["train_records"]
        assert 0.24 < mine[rank]["bytes"] / whole["bytes"] < 0.27  # a quarter of each sample, plus the framing
    assert not whole["block_records"]
