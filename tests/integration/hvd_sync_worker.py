"""Worker for test_horovod_sync: a few training steps on rank-specific data, for each kind named after the
output directory (cosmoflow, deepcam; both when none is named), one after the other in one Horovod job.

Each rank starts from different weights (seed + rank) and different data, so the test can
tell that the initial broadcast and the gradient allreduce both happened. Rank 0 then also
trains a second copy of the initial model as ONE process on the union of both ranks' batches,
in this same process, as the reference. TensorFlow's own (Eigen) kernels are used, not oneDNN's,
so that every CPU computes in strict float32: what is compared is the data-parallel arithmetic,
not a CPU generation's choice of convolution kernel or of implicit bfloat16. Writes
rank<r>.npz with the initial (post-broadcast) weights, its data, the final weights and, on
rank 0, the reference weights.

For `deepcam` it trains a narrow DeepLabv3+ with the suite's LAMB (deepcam/optim.py's
`build_optimizer` for optimizer.name=LAMB: deepcam/lamb.py's ApexLamb, as DeepCAM runs train) and the weighted
cross-entropy instead, and writes deepcam_rank<r>.npz without a reference: batch normalisation normalises
each rank's local batch, so the union's gradient is not the average of the ranks' (as in the reference code,
whose batchnorm_group_size is 1); what must still hold is that the ranks' weights stay identical.
"""
import os
import sys
from pathlib import Path

# Before anything imports TensorFlow (Keras does, through cosmoflow.model).
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

import numpy as np

from common.runtime.config import DistConfig
from common.runtime.dist import DistEnv, init_distributed
from common.runtime.strategy import make_train_step
from cosmoflow.model import build_model, mse_loss

MODEL = dict(input_shape=(16, 16, 16, 4), conv_filters=(4, 8, 8, 16), dense_units=(16, 8), dropout=0.0)
DEEPCAM = dict(input_shape=(32, 48, 16), width=0.0625, middle_blocks=2)
STEPS, BATCH, LR, MOMENTUM = 3, 2, 0.05, 0.9


def rank_data(rank: int, kind: str = "cosmoflow") -> tuple[np.ndarray, np.ndarray]:
    """STEPS batches of BATCH (inputs, targets) of one rank: (16, 16, 16, 4) universes with 4 targets,
    or (32, 48, 16) DeepCAM images with (32, 48) labels."""
    rng = np.random.default_rng(rank)
    if kind == "deepcam":
        xs = rng.standard_normal((STEPS, BATCH, *DEEPCAM["input_shape"]), dtype=np.float32)
        ys = rng.choice(3, size=(STEPS, BATCH, *DEEPCAM["input_shape"][:2]), p=(0.9, 0.03, 0.07)).astype(np.int32)
        return xs, ys
    xs = rng.random((STEPS, BATCH, *MODEL["input_shape"]), dtype=np.float32)
    ys = rng.uniform(-1, 1, (STEPS, BATCH, 4)).astype(np.float32)
    return xs, ys


def build(kind: str):
    """(model, optimizer, loss) of one of the two benchmarks, small."""
    import keras
    if kind == "deepcam":
        from deepcam import model as deepcam_model
        from deepcam.config import DeepCamOptimizerConfig
        from deepcam.lamb import ApexLamb
        from deepcam.model import WeightedCrossEntropy, class_weights
        from deepcam.optim import build_optimizer
        optimizer = build_optimizer(DeepCamOptimizerConfig(name="LAMB"), initial_lr=0.01)
        assert isinstance(optimizer, ApexLamb), type(optimizer)
        return deepcam_model.build_model(**DEEPCAM), optimizer, WeightedCrossEntropy(class_weights())
    return build_model(**MODEL), keras.optimizers.SGD(learning_rate=LR, momentum=MOMENTUM), mse_loss


def train(initial: list | None, xs, ys, dist: DistEnv, kind: str = "cosmoflow") -> tuple[list, list]:
    """(initial, final) trainable weights after one step per batch; rank 0's state broadcast first."""
    model, optimizer, loss = build(kind)
    optimizer.build(model.trainable_variables)
    if initial is not None:
        for var, value in zip(model.trainable_variables, initial):
            var.assign(value)
    dist.broadcast_variables(model.variables + optimizer.variables)
    start = [v.numpy() for v in model.trainable_variables]
    step = make_train_step(model, optimizer, loss, dist)
    for x, y in zip(xs, ys):
        step(x, y)
    return start, [v.numpy() for v in model.trainable_variables]


OUTPUT = {"cosmoflow": "rank{rank}.npz", "deepcam": "deepcam_rank{rank}.npz"}


def run(out_dir: str, dist: DistEnv, kind: str) -> None:
    """Train `kind` on this rank's data and write its arrays (initial, final, rank 0's reference) to out_dir."""
    import keras
    keras.utils.set_random_seed(100 + dist.rank)
    xs, ys = rank_data(dist.rank, kind)
    initial, final = train(None, xs, ys, dist, kind)
    arrays = {f"initial{i}": w for i, w in enumerate(initial)} | {f"final{i}": w for i, w in enumerate(final)}
    if dist.is_root and kind == "cosmoflow":
        union = [np.concatenate(parts, axis=1) for parts in zip(*(rank_data(r) for r in range(dist.size)))]
        _, reference = train(initial, *union, DistEnv())
        arrays |= {f"reference{i}": w for i, w in enumerate(reference)}
    np.savez(Path(out_dir) / OUTPUT[kind].format(rank=dist.rank), xs=xs, ys=ys, **arrays)


def main(out_dir: str, *kinds: str) -> None:
    dist = init_distributed(DistConfig(threads_per_rank=1, onednn=False))
    for kind in kinds or tuple(OUTPUT):
        run(out_dir, dist, kind)


if __name__ == "__main__":
    main(*sys.argv[1:])
