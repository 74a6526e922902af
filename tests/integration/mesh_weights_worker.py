"""cosmoflow/train.py under horovodrun on the hybrid path, each rank also saving its model's final weights as
DIR/weights_rank_<r>.npz, so that test_mesh_train compares the ranks' weights itself.

    mesh_weights_worker.py DIR CONFIG [key=value ...]

The weights are saved where the hybrid strategy sums up the run (`hybrid_summary`, after the last step).
"""
import sys
from pathlib import Path

import numpy as np

from cosmoflow import train
from cosmoflow.mesh import hybrid


def main() -> int:
    out, summary = Path(sys.argv[1]), hybrid.hybrid_summary

    def saving_summary(model, layout, dist):
        np.savez(out / f"weights_rank_{dist.rank:05d}.npz", *model.get_weights())
        return summary(model, layout, dist)

    hybrid.hybrid_summary = saving_summary
    return train.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
