"""Two real Horovod ranks read the applications' own DALI pipelines with shuffling: in every epoch their samples
are disjoint and cover the training split, and each rank's order changes from epoch to epoch; per-rank sharding
and data.stage_mode=node_share, CosmoFlow and DeepCAM (the same checks as tests/unit/test_dali_ranks.py, with
the ranks' layout from horovodrun)."""
import json

import pytest

from tests.conftest import REPO, horovodrun, show
from tests.unit.test_dali_ranks import BATCH, check_epochs, write_cosmo_records, write_deepcam_records

pytestmark = pytest.mark.slow


def test_two_horovod_ranks_read_the_split_once_per_epoch_in_new_orders(tmp_path):
    cosmo = write_cosmo_records(tmp_path / "cosmo")
    deepcam = write_deepcam_records(tmp_path / "deepcam")
    out = tmp_path / "out"
    out.mkdir()
    proc = horovodrun(2, [REPO / "tests/integration/dali_ranks_worker.py", cosmo, deepcam, out], timeout=600)
    assert proc.returncode == 0, show(proc)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["size"] for r in ranks] == [2, 2]
    for case in ("cosmoflow-rank", "cosmoflow-node_share", "deepcam-rank", "deepcam-node_share"):
        assert all(r["read"][case]["train_steps"] * BATCH == 16 for r in ranks), case
        check_epochs([r["read"][case]["epochs"] for r in ranks], list(range(32)))
