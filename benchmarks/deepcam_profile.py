"""Where a DeepCAM training step's convolution time goes, per layer: TensorFlow's profiler on one traced step.

    python benchmarks/deepcam_profile.py [--case reference] [--height 384 --width 576] [--warmup 2]

Builds the case's network and training step as benchmarks/deepcam_throughput.py does (its config's model,
LAMB, weighted cross-entropy, one process, the threads and oneDNN setting `init_distributed` gives), runs
warm-up steps, then traces one step with TensorFlow's profiler and sums, per layer, the seconds its
convolution ops ran: forward, weight gradient and input gradient, for the dense and the depthwise
convolutions apart. TensorFlow runs one op at a time here (inter-op parallelism 1, each op on all the
intra-op threads), so that an op's duration is its own cost and not shared with ops running beside it; the
step is then somewhat slower than in training. Writes benchmarks/results/deepcam_profile.json and prints
the layers with the most time.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import tempfile
import time

from deepcam_throughput import CASES, build_train_step, load_case, random_batch
from harness import RESULTS_DIR, run_header, sgemm_gflops, write_json_atomic

RESULTS = RESULTS_DIR / "deepcam_profile.json"
KINDS = ("forward", "weight_gradient", "input_gradient")


def kind_of(op_type: str) -> str | None:
    """'forward', 'weight_gradient' or 'input_gradient' for a convolution op type (oneDNN's names included),
    prefixed 'depthwise_' for depthwise ones; None for other ops."""
    if "Conv" not in op_type:
        return None
    kind = ("weight_gradient" if "BackpropFilter" in op_type else
            "input_gradient" if "BackpropInput" in op_type else "forward")
    return f"depthwise_{kind}" if "Depthwise" in op_type else kind


def layer_of(op_name: str) -> str:
    """The Keras layer an op belongs to: 'gradient_tape/deepcam_1/aspp1_1/convolution/...' -> 'aspp1'."""
    parts = op_name.removeprefix("gradient_tape/").split("/")
    layer = parts[1] if len(parts) > 1 else parts[0]
    return layer.rsplit("_", 1)[0] if layer.rsplit("_", 1)[-1].isdigit() else layer


def conv_seconds(xspace) -> dict[str, dict[str, float]]:
    """Per layer, the seconds of each kind of convolution op on TensorFlow's op threads (`tf_Compute` lines)
    in a profiler XSpace."""
    table: dict = collections.defaultdict(collections.Counter)
    for plane in xspace.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                op, _, op_type = name.rpartition(":")
                kind = kind_of(op_type) if op else None
                if kind:
                    table[layer_of(op)][kind] += event.duration_ps / 1e12
    return {layer: dict(kinds) for layer, kinds in table.items()}


def traced_step(step, x, y, logdir: str):
    """Run `step(x, y)` once under TensorFlow's profiler; its wall seconds and the XSpace it wrote."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    tf.profiler.experimental.start(logdir)
    started = time.perf_counter()
    float(step(x, y))
    seconds = time.perf_counter() - started
    tf.profiler.experimental.stop()
    files = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
    if len(files) != 1:
        raise RuntimeError(f"{logdir}: expected one *.xplane.pb from the profiler, found {files}")
    xspace = xplane_pb2.XSpace()
    with open(files[0], "rb") as f:
        xspace.ParseFromString(f.read())
    return seconds, xspace


def profile(case: str, height: int, width: int, warmup: int) -> dict:
    """Build the case at height x width, warm up, trace one step: the figures of the results file."""
    from common.runtime.dist import init_distributed
    cfg, batch = load_case(case)
    shape = [height, width, cfg.model.input_shape[-1]]
    # One op at a time (inter-op parallelism 1): an op's duration is then its own cost, not shared with others.
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, input_shape=shape),
                              dist=dataclasses.replace(cfg.dist, inter_op_threads=1))
    dist = init_distributed(cfg.dist)
    import tensorflow as tf
    _, step = build_train_step(cfg, dist)
    x, y = (tf.convert_to_tensor(a) for a in random_batch(batch, shape, cfg.model.num_classes, seed=0))
    for _ in range(warmup):
        float(step(x, y))
    with tempfile.TemporaryDirectory() as logdir:
        seconds, xspace = traced_step(step, x, y, logdir)
    return {"case": case, "input_shape": shape, "local_batch": batch, "threads": dist.threads,
            "onednn": cfg.dist.onednn, "step_seconds": seconds, "layers": conv_seconds(xspace)}


def table(result: dict, top: int) -> str:
    """The `top` layers by convolution seconds, and the totals by kind."""
    kinds = (*KINDS, *(f"depthwise_{k}" for k in KINDS))
    labels = ("forward", "weight grad", "input grad", "dw forward", "dw weight grad", "dw input grad")
    rows = [f"{'layer (seconds)':28s} " + " ".join(f"{label:>14s}" for label in labels)]
    layers = sorted(result["layers"].items(), key=lambda kv: -sum(kv[1].values()))
    for layer, secs in layers[:top]:
        rows.append(f"{layer[:28]:28s} " + " ".join(f"{secs.get(k, 0.0):14.3f}" for k in kinds))
    totals = {k: sum(s.get(k, 0.0) for _, s in layers) for k in kinds}
    rows.append(f"{'all layers':28s} " + " ".join(f"{totals[k]:14.3f}" for k in kinds))
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=list(CASES), default="reference")
    p.add_argument("--height", type=int, default=384)
    p.add_argument("--width", type=int, default=576)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--top", type=int, default=15, help="layers printed (all are in the JSON)")
    args = p.parse_args()
    if args.warmup < 1:
        p.error(f"--warmup {args.warmup}: expected at least 1 (the first step traces the step function)")
    result = {**run_header(sgemm_gflops()), **profile(args.case, args.height, args.width, args.warmup)}
    write_json_atomic(RESULTS, result)
    print(f"traced step: {result['step_seconds']:.2f} s; seconds per layer on TensorFlow's op threads:")
    print(table(result, args.top))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
