"""Worker for test_dali_ranks: each Horovod rank builds the applications' own DALI datasets with its real
DistEnv and writes the sample numbers it reads, epoch by epoch, to rank<r>.json in OUT.

    python dali_ranks_worker.py COSMO_RECORDS DEEPCAM_RECORDS OUT

Cases: CosmoFlow and DeepCAM, each with per-rank sharding and with data.stage_mode=node_share.
"""
import json
import sys
from pathlib import Path

from common.runtime.config import DistConfig
from common.runtime.dist import init_distributed
from tests.unit import test_dali_ranks as cases


def main(cosmo_dir: str, deepcam_dir: str, out: str) -> None:
    dist = init_distributed(DistConfig())
    read = {}
    for app, records in (("cosmoflow", cosmo_dir), ("deepcam", deepcam_dir)):
        build, ids, _ = cases.BUILDERS[app]
        for node_share in (False, True):
            data = build(Path(records), dist, node_share)
            read[f"{app}-{'node_share' if node_share else 'rank'}"] = {
                "train_steps": data.train_steps, "epochs": cases.epochs(data, ids)}
    Path(out, f"rank{dist.rank}.json").write_text(json.dumps({"size": dist.size, "read": read}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
