"""Where a hybrid mesh step's time goes, per device: TensorFlow's own step statistics of one traced step.

    python benchmarks/mesh_profile.py [--spatial 2x1 2x2] [--batch 4] [--size full]

Builds the Mesh-TF CosmoFlow (`cosmoflow/mesh/model.py`, as the hybrid path does) for each partitioning over
pd x ph virtual CPU devices in one process, one intra-op thread each (the devices run in parallel on this
machine's cores, as a group's ranks do), with oneDNN on as training has it. After warm-up steps it times
steps and traces one (`RunOptions.FULL_TRACE`): per device, the seconds its ops ran, by kind (convolutions
and their two gradients, pooling and its gradient, LeakyReLU and its gradient, the halo exchange and padding
copies, everything else). Compute time per device against the step's wall time shows how long a device
waits for its neighbours (the halo exchange joins the devices at every split layer, forward and backward)
and for the leader's part. The data-parallel reference is the Keras model's forward and backward on the
group's whole batch in a process pinned to one core (TensorFlow's "one intra-op thread" still runs ops in
parallel, so an unpinned process would take more than one core), so that core-seconds compare:
the mesh's step times the cores its devices shared against the reference's step. No gRPC here: the
multi-process figures, with the transfers between ranks, are mesh_throughput.py's. Writes
benchmarks/results/mesh_profile.json.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np

from harness import RESULTS_DIR, REPO, run_header, sgemm_gflops, timed, write_json_atomic

RESULTS = RESULTS_DIR / "mesh_profile.json"
CONFIGS = {"mini": "cosmoflow/configs/cosmo_mini.yaml", "full": "cosmoflow/configs/cosmo.yaml"}
KINDS = (("conv_grad_filter", ("Conv3DBackpropFilter",)), ("conv_grad_input", ("Conv3DBackpropInput",)),
         ("conv", ("Conv3D",)), ("pool", ("MaxPool3D", "AvgPool3D")),
         ("halo_conv", ("Conv2D",)),  # the halo planes' share (cosmoflow/mesh/haloconv.py), forward and gradients
         ("leaky_relu", ("LeakyRelu",)),
         ("halo_and_padding", ("Pad", "ConcatV2", "Slice", "StridedSlice", "TensorScatterAdd")))


def kind_of(op_type: str) -> str:
    """The kind an op's time is added to: the first of KINDS one of whose names the op's type starts with (the
    convolution's gradients before the convolution; pooling and LeakyReLU gradients apart), else "other"."""
    base = op_type.replace("_MklNative", "").replace("_Mkl", "")
    for kind, names in KINDS:
        if any(base.startswith(n) for n in names):
            if kind in ("pool", "leaky_relu") and "Grad" in base:
                return f"{kind}_grad"
            return kind
    return "other"


def op_seconds(run_metadata) -> dict[str, dict[str, float]]:
    """Per device ("CPU:0" ...), the seconds its ops ran, by kind."""
    totals: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for dev in run_metadata.step_stats.dev_stats:
        device = dev.device.rsplit("/", 1)[-1].replace("device:", "")
        for node in dev.node_stats:
            label = node.timeline_label
            op_type = label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else node.node_name
            totals[device][kind_of(op_type)] += node.all_end_rel_micros / 1e6
    return {d: dict(sorted(k.items())) for d, k in sorted(totals.items())}


def profile_mesh(model_cfg, spatial: tuple[int, int], batch: int, steps: int) -> dict:
    import tensorflow as tf
    from cosmoflow.mesh.cluster import session_config
    from cosmoflow.mesh.model import build_mesh_model
    parts = spatial[0] * spatial[1]
    mesh = build_mesh_model(model_cfg, [f"/cpu:{i}" for i in range(parts)], spatial, batch, training=True)
    session = tf.compat.v1.Session(graph=mesh.graph, config=session_config(1, cpus=parts))
    mesh.initialize(session, _weights(model_cfg))
    x, y = _batch(model_cfg, batch)
    mesh.step(session, x, y)
    seconds = [timed(lambda: mesh.step(session, x, y)) for _ in range(steps)]
    metadata = tf.compat.v1.RunMetadata()
    session.run([mesh.outputs, mesh.loss, *mesh.gradients], feed_dict={mesh.images: x, mesh.targets: y},
                options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                run_metadata=metadata)
    session.close()
    per_device = op_seconds(metadata)
    step = float(np.median(seconds))
    busy = {d: sum(k.values()) for d, k in per_device.items()}
    return {"spatial": list(spatial), "batch": batch, "step_seconds": seconds, "median_step_seconds": step,
            "op_seconds_per_device": per_device, "busy_seconds_per_device": busy,
            "idle_share_per_device": {d: max(0.0, 1 - b / step) for d, b in busy.items()}}


def profile_keras(model_cfg, batch: int, steps: int) -> dict:
    """The Keras model's forward and backward on one thread: what a data-parallel rank computes per step."""
    import tensorflow as tf
    from cosmoflow.model import build_model, mse_loss
    model = build_model(**dataclasses.asdict(model_cfg))
    x, y = (tf.constant(a) for a in _batch(model_cfg, batch))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = mse_loss(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_weights)

    step()
    seconds = [timed(step) for _ in range(steps)]
    return {"batch": batch, "step_seconds": seconds, "median_step_seconds": float(np.median(seconds))}


def keras_on_one_core(args) -> dict:
    """`profile_keras` in a child process pinned to one core (its JSON on the last line of its output)."""
    proc = subprocess.run([sys.executable, __file__, "--keras-one-core", "--size", args.size, "--batch",
                           str(args.batch), "--steps", str(args.steps)], capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"the one-core Keras reference failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _weights(model_cfg) -> list[np.ndarray]:
    from cosmoflow.model import build_model
    return build_model(**dataclasses.asdict(model_cfg)).get_weights()


def _batch(model_cfg, batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = np.log1p(rng.poisson(20, (batch, *model_cfg.input_shape))).astype(np.float32)
    return x, rng.uniform(-1, 1, (batch, model_cfg.target_size)).astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=list(CONFIGS), default="full")
    p.add_argument("--spatial", nargs="+", default=["2x1", "2x2"], help="partitions DxH")
    p.add_argument("--batch", type=int, default=4, help="the group's batch (the mesh's; the Keras reference's)")
    p.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up")
    p.add_argument("--keras-one-core", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as init_distributed sets it for training
    os.environ.setdefault("ONEDNN_DEFAULT_FPMATH_MODE", "STRICT")
    if args.keras_one_core:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # before TensorFlow starts a thread
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    from common.runtime.config import load_config
    from cosmoflow.config import CosmoConfig
    model_cfg = load_config(REPO / CONFIGS[args.size], [], schema=CosmoConfig).model
    if args.keras_one_core:
        return print(json.dumps(profile_keras(model_cfg, args.batch, args.steps)))
    gflops, cases = sgemm_gflops(), []
    keras = keras_on_one_core(args)
    print(f"keras, one core, batch {args.batch}: {keras['median_step_seconds']:.2f} s/step", flush=True)
    for text in args.spatial:
        spatial = tuple(int(v) for v in text.lower().split("x"))
        cases.append(profile_mesh(model_cfg, spatial, args.batch, args.steps))
        c = cases[-1]
        print(f"mesh {text}: {c['median_step_seconds']:.2f} s/step; busy per device "
              f"{', '.join(f'{b:.2f}' for b in c['busy_seconds_per_device'].values())} s", flush=True)
    write_json_atomic(RESULTS, {**run_header(gflops), "size": args.size, "input_shape": list(model_cfg.input_shape),
                                "cores": len(os.sched_getaffinity(0)), "keras_one_core": keras, "cases": cases})
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
