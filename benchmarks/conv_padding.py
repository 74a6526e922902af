"""What a block convolution costs as the mesh computes it and as it could: TensorFlow's Conv3D, its input
gradient and its filter gradient on one thread, with oneDNN on, for CosmoFlow's second layer (32 -> 64
channels, 3^3 kernel, local batch 4 at 128^3: a 64^3 input), in four forms:

- `whole SAME`: the whole 64^3 input, padding "SAME" (what Keras computes on a data-parallel rank);
- `whole VALID, pre-padded`: the same input zero-padded by one plane on each side, padding "VALID";
- `block VALID, halo + pad` (depth split in 2): a 32-deep block with its halo planes in depth and zero
  padding in height and width, padding "VALID" (what Mesh-TF's conv3d_with_blocks hands TensorFlow);
- `block SAME, depth halo`: the block with only its depth halo (34 deep), padding "SAME"; its two halo output
  planes would be sliced off, so it does 34/32 of the block's work.

    python benchmarks/conv_padding.py [--repeats 2] [--batch 4]

Writes benchmarks/results/conv_padding.json (seconds per call, median of the repeats after one warm-up call)
and the table between the markers in docs/mesh.md.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from harness import (REPO, RESULTS_DIR, check_marked_section, measured_note, replace_marked_section, run_header,
                     sgemm_gflops, timed, write_json_atomic)

DOC = REPO / "docs/mesh.md"  # its tables live beside what they measure
RESULTS = RESULTS_DIR / "conv_padding.json"
BEGIN, END = "<!-- conv-padding:begin -->", "<!-- conv-padding:end -->"
IN_CH, OUT_CH, SIDE = 32, 64, 64
# name -> (input spatial shape, padding, output spatial shape)
FORMS = {"whole SAME": ((SIDE, SIDE, SIDE), "SAME", (SIDE, SIDE, SIDE)),
         "whole VALID, pre-padded": ((SIDE + 2, SIDE + 2, SIDE + 2), "VALID", (SIDE, SIDE, SIDE)),
         "block VALID, halo + pad": ((SIDE // 2 + 2, SIDE + 2, SIDE + 2), "VALID", (SIDE // 2, SIDE, SIDE)),
         "block SAME, depth halo": ((SIDE // 2 + 2, SIDE, SIDE), "SAME", (SIDE // 2 + 2, SIDE, SIDE))}


def time_form(batch: int, spatial_in, padding: str, spatial_out, repeats: int) -> dict:
    """Median seconds of the forward convolution and of its two gradients for one form."""
    import tensorflow as tf
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((batch, *spatial_in, IN_CH), dtype=np.float32))
    dy = tf.constant(rng.random((batch, *spatial_out, OUT_CH), dtype=np.float32))
    w = tf.constant(rng.random((3, 3, 3, IN_CH, OUT_CH), dtype=np.float32))
    strides = [1] * 5
    forward = tf.function(lambda x, w: tf.nn.conv3d(x, w, strides, padding))
    grad_filter = tf.function(lambda x, dy: tf.raw_ops.Conv3DBackpropFilterV2(
        input=x, filter_sizes=tf.constant([3, 3, 3, IN_CH, OUT_CH]), out_backprop=dy, strides=strides,
        padding=padding))
    grad_input = tf.function(lambda w, dy: tf.raw_ops.Conv3DBackpropInputV2(
        input_sizes=tf.constant([batch, *spatial_in, IN_CH]), filter=w, out_backprop=dy, strides=strides,
        padding=padding))
    calls = {"forward": lambda: forward(x, w).numpy(), "grad_filter": lambda: grad_filter(x, dy).numpy(),
             "grad_input": lambda: grad_input(w, dy).numpy()}
    out = {}
    for name, call in calls.items():
        call()  # oneDNN builds its primitive on the first call
        out[name] = float(np.median([timed(call) for _ in range(repeats)]))
    return out


def table_rows(result: dict) -> list[str]:
    rows = [f"| form (batch {result['batch']}) | input | padding | forward (s) | input gradient (s) | "
            "filter gradient (s) |", "|---|---|---|---|---|---|"]
    for r in result["forms"]:
        shape = "x".join(str(s) for s in r["input"])
        rows.append(f"| {r['form']} | {shape} x {IN_CH} | {r['padding']} | {r['forward']:.3f} | "
                    f"{r['grad_input']:.3f} | {r['grad_filter']:.3f} |")
    return rows + [measured_note(result)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()
    if args.repeats < 1 or args.batch < 1:
        p.error(f"--repeats {args.repeats}, --batch {args.batch}: expected integers >= 1")
    check_marked_section(DOC, BEGIN, END)
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"  # as init_distributed sets it for training; before TensorFlow loads
    print("sgemm ...", flush=True)
    gflops, started = sgemm_gflops(), time.perf_counter()
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    forms = []
    for form, (spatial_in, padding, spatial_out) in FORMS.items():
        print(f"  {form} ...", flush=True)
        forms.append({"form": form, "input": list(spatial_in), "padding": padding, "output": list(spatial_out),
                      **time_form(args.batch, spatial_in, padding, spatial_out, args.repeats)})
    result = {**run_header(gflops), "total_seconds": time.perf_counter() - started, "batch": args.batch,
              "threads": 1, "forms": forms}
    write_json_atomic(RESULTS, result)
    replace_marked_section(DOC, BEGIN, END, "\n".join(table_rows(result)))
    print(f"wrote {RESULTS} and the table in {DOC}")


if __name__ == "__main__":
    main()
