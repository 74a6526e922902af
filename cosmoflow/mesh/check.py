"""Check the mesh CosmoFlow against the Keras model: same weights and batch, compare outputs, loss, gradients.

In one process over virtual CPU devices:
    python -m cosmoflow.mesh.check --devices 4 --spatial 2x1 1x2 2x2 --pooling max avg --out diffs.json
Across processes (run once per rank; rank 0 drives, the others serve its devices):
    python -m cosmoflow.mesh.check --rank R --addresses host0:port0 host1:port1 ... --spatial 2x2
Writes (rank 0) a JSON list with one record per case: the layout and the maximum absolute and relative
differences. Exit status 0 when every relative difference is within --rtol, 1 otherwise, 2 on bad input.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from common.base.errors import BenchError
from cosmoflow.config import CosmoModelConfig


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spatial", nargs="+", default=["2x1"], help="partitions DxH, e.g. 2x1 1x2 2x2")
    p.add_argument("--pooling", nargs="+", default=["max"], choices=["max", "avg"])
    p.add_argument("--devices", type=int, default=0, help="virtual CPU devices in this process (0: the largest DxH)")
    p.add_argument("--rank", type=int, default=None, help="this process's rank (cluster mode)")
    p.add_argument("--addresses", nargs="+", default=None, help="host:port of every rank (cluster mode)")
    p.add_argument("--input-shape", type=int, nargs=4, default=[16, 16, 16, 4], metavar=("D", "H", "W", "C"))
    p.add_argument("--conv-filters", type=int, nargs="+", default=[4, 8, 8])
    p.add_argument("--dense-units", type=int, nargs="+", default=[8, 4])
    p.add_argument("--kernel-size", type=int, default=3,
                   help="3 convolves halo planes as 2-D faces (haloconv); others as whole halo planes")
    p.add_argument("--batch", type=int, default=4, help="global batch size")
    p.add_argument("--threads", type=int, default=1, help="TensorFlow intra/inter-op threads per process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rtol", type=float, default=1e-4, help="largest relative difference accepted")
    p.add_argument("--out", type=Path, default=None, help="write the differences here as JSON")
    p.add_argument("--layout-rules", default=None,
                   help="Mesh-TF layout rules instead of the model's (tests: one that splits nothing must be caught)")
    return p.parse_args(argv)


def parse_spatial(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(s.isdigit() for s in parts):
        raise BenchError(f"--spatial {text!r}: expected DxH, e.g. 2x1")
    return int(parts[0]), int(parts[1])


# ---------------------------------------------------------------------------- the reference
@dataclasses.dataclass
class Reference:
    weights: list[np.ndarray]
    images: np.ndarray
    targets: np.ndarray
    outputs: np.ndarray
    loss: float
    gradients: list[np.ndarray]


def keras_reference(cfg: CosmoModelConfig, batch: int, seed: int) -> Reference:
    """The Keras model (random kernels and biases) on a random batch: outputs, MSE loss and gradients."""
    import keras
    import tensorflow as tf
    from cosmoflow.model import build_model, mse_loss
    keras.utils.set_random_seed(seed)
    model = build_model(**dataclasses.asdict(cfg))
    rng = np.random.default_rng(seed)
    # Non-zero biases, so that the bias paths are compared too.
    model.set_weights([w if w.ndim > 1 else rng.normal(0, 0.1, w.shape).astype(np.float32)
                       for w in model.get_weights()])
    images = rng.normal(0, 1, (batch, *cfg.input_shape)).astype(np.float32)
    targets = rng.uniform(-1, 1, (batch, cfg.target_size)).astype(np.float32)
    @tf.function  # a graph, as the data-parallel path computes its gradients (oneDNN rewrites graphs' ops)
    def forward_backward(x, y):
        with tf.GradientTape() as tape:
            out = model(x, training=False)
            mse = mse_loss(y, out)
        return out, mse, tape.gradient(mse, model.trainable_weights)

    outputs, loss, grads = forward_backward(tf.constant(images), tf.constant(targets))
    return Reference([w.numpy() for w in model.trainable_weights], images, targets, outputs.numpy(),
                     float(loss), [g.numpy() for g in grads])


def differences(ref: Reference, got) -> dict:
    """Max absolute and relative (to the reference's largest magnitude) differences."""
    def diff(a, b) -> dict:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            raise BenchError(f"mesh result shape {a.shape}, Keras {b.shape}")
        err = float(np.max(np.abs(a - b)))
        return {"abs": err, "rel": err / max(float(np.max(np.abs(b))), 1e-30)}
    return {"outputs": diff(got.outputs, ref.outputs), "loss": diff(got.loss, ref.loss),
            "gradients": [diff(g, r) for g, r in zip(got.gradients, ref.gradients)]}


# ---------------------------------------------------------------------------- running the cases
def run_cases(args: argparse.Namespace, devices: list[str], target: str, cpus: int = 0) -> list[dict]:
    """Every (pooling, spatial) case on `devices` through a session on `target`.

    target "" runs in this process, split into `cpus` virtual CPU devices.
    """
    import tensorflow as tf
    from cosmoflow.mesh.cluster import session_config
    from cosmoflow.mesh.model import LAYOUT, build_mesh_model, lowered_convolutions, planned_conv_inputs
    records = []
    for pooling in args.pooling:
        cfg = CosmoModelConfig(input_shape=tuple(args.input_shape), conv_filters=tuple(args.conv_filters),
                               dense_units=tuple(args.dense_units), pooling=pooling, dropout=0.0,
                               kernel_size=args.kernel_size)
        ref = keras_reference(cfg, args.batch, args.seed)
        for spatial in map(parse_spatial, args.spatial):
            mesh = build_mesh_model(cfg, devices, spatial, args.batch, training=False,
                                    layout_rules=args.layout_rules or LAYOUT)
            config = session_config(args.threads, cpus)
            with tf.compat.v1.Session(target, graph=mesh.graph, config=config) as session:
                mesh.initialize(session, ref.weights)
                got = mesh.step(session, ref.images, ref.targets)
            records.append({"pooling": pooling, "spatial": list(spatial), "batch_splits": mesh.layout.batch_splits,
                            "devices": list(mesh.layout.devices), "weights": mesh.weight_names,
                            "convolutions": lowered_convolutions(mesh.graph),
                            "planned_conv_inputs": planned_conv_inputs(cfg, spatial, mesh.layout.batch_splits,
                                                                       args.batch),
                            "reference": {"loss": ref.loss, "outputs_std": float(np.std(ref.outputs)),
                                          "gradient_norms": [float(np.linalg.norm(g)) for g in ref.gradients]},
                            **differences(ref, got)})
            print(_describe(records[-1]), flush=True)
    return records


def _describe(record: dict) -> str:
    grads = max(g["rel"] for g in record["gradients"])
    return (f"pooling {record['pooling']} spatial {record['spatial']} batch splits {record['batch_splits']}: "
            f"outputs {record['outputs']['rel']:.2e}  loss {record['loss']['rel']:.2e}  "
            f"gradients {grads:.2e} (max relative differences)")


def worst(records: list[dict]) -> float:
    return max(max(r["outputs"]["rel"], r["loss"]["rel"], *(g["rel"] for g in r["gradients"])) for r in records)


def local_devices(count: int) -> list[str]:
    """Names of `count` CPU devices in this process (`session_config(cpus=count)` makes them)."""
    return [f"/cpu:{i}" for i in range(count)]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        spatial = [parse_spatial(s) for s in args.spatial]
        if args.addresses is None:
            count = args.devices or max(d * h for d, h in spatial)
            records = run_cases(args, local_devices(count), "", cpus=count)
        else:
            records = _run_cluster(args)
            if records is None:
                return 0
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_text(json.dumps(records, indent=1))
        print(f"wrote {args.out}")
    return 0 if worst(records) <= args.rtol else 1


def _run_cluster(args: argparse.Namespace) -> list[dict] | None:
    """Rank 0 runs the cases on every rank's device and then releases the others; they return None."""
    from cosmoflow.mesh.cluster import release_workers, serve_until_released, start_server
    if args.rank is None:
        raise BenchError("--addresses needs --rank")
    cluster = start_server(args.rank, args.addresses, args.threads)
    if not cluster.is_driver:
        serve_until_released(cluster)
        return None
    try:
        return run_cases(args, cluster.devices, cluster.target)
    finally:
        release_workers(cluster)


if __name__ == "__main__":
    sys.exit(main())
