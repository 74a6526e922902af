"""From the official release's layout to a 2-rank training run: data_prep cosmo-released writes the layout
(GZIP TFRecords, one sample per file), data_prep index describes it where it lies, and horovodrun -np 2 trains
on it, reading it in place with tf.data, or staged uncompressed (data.stage_decompress) with DALI."""
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from common.campaign.compliance import check_log
from tests.conftest import REPO, horovodrun, run_cmd, show
from tests.integration import cosmo_fixtures

pytestmark = pytest.mark.slow
TRAIN = REPO / "cosmoflow/train.py"


def data_prep(*args):
    proc = run_cmd([sys.executable, "-m", "data_prep", *args], timeout=300)
    assert proc.returncode == 0, show(proc)
    return proc


@pytest.fixture(scope="module")
def indexed(cosmo_dataset, tmp_path_factory):
    """The session's 12 universes of 32^3 (cosmo_fixtures: cosmo-synth's output beside the cosmo_dataset records,
    read only) -> 96 files of 16^3 samples (32 for validation) -> an index of them."""
    root, raw = tmp_path_factory.mktemp("official"), cosmo_dataset.parent / "raw"
    data_prep("cosmo-released", "--input", raw, "--out", root / "release", "--sample-size", 16,
              "--val-universes", 4, "--val-dir", "val", "--workers", 2)
    # One worker: starting two worker processes costs more than these 96 files (8 s against 4 s here);
    # tests/unit/test_index.py indexes with two
    data_prep("index", "--input", root / "release", "--out", root / "index", "--workers", 1)
    return root / "index"


def _train(tmp_path, data_dir, name, **data):
    out = tmp_path / name
    cfg = cosmo_fixtures.write_config(tmp_path / f"{name}.yaml", data_dir, out,
                                      data={"shuffle": False, "shuffle_buffer": 8, **data},
                                      train={"max_epochs": 2, "target": 1e-6})
    proc = horovodrun(2, [TRAIN, cfg])
    assert proc.returncode == 1, show(proc)  # the target is out of reach: two full epochs
    assert check_log(out / "mlperf.log").only_target_failed
    return json.loads((out / "summary.json").read_text()), json.loads((out / "io_report.json").read_text())


def test_two_ranks_train_on_the_index_in_place_and_on_its_decompressed_staged_copy(indexed, tmp_path):
    # The two trainings at once: a launch leaves a core idle for seconds (horovodrun's build check, start-up,
    # shutdown), and neither run's figures depend on its speed.
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(_train, tmp_path, indexed, "in_place", loader="auto"),
                pool.submit(_train, tmp_path, indexed, "staged", loader="dali", stage_dir=str(tmp_path / "local"),
                            stage_mode="rank", stage_decompress=True)]
    (in_place, _), (staged, report) = (run.result() for run in runs)
    assert (in_place["loader"], staged["loader"]) == ("tfdata", "dali")
    assert report["staging"]["compression"] == "gzip" and report["staging"]["compression_ratio"] > 1.2
    assert report["staging"]["files"] == 96 and report["staging"]["staging_ranks"] == 2  # 48 each
    assert len(in_place["history"]) == 2
    # The same samples in the same order through either loader: the same training.
    assert [h["mae"] for h in in_place["history"]] == [h["mae"] for h in staged["history"]]
