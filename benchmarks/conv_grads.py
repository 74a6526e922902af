"""DeepCAM's slowest convolutions alone: forward, weight gradient and input gradient, TensorFlow beside PyTorch.

    python benchmarks/conv_grads.py [--height 384 --width 576] [--repeats 10] [--torch PYTHON]
        [--variants nhwc xla phases]

The layers whose weight gradients took 2-4x their forward in benchmarks/deepcam_profile.py, at their shapes in
the DeepLabv3+ decoder for an input of --height x --width (batch 1, float32):
    decoder_conv1     3x3 conv, 304 -> 256 channels, at H/4 x W/4
    decoder_up_final  3x3 transposed conv, stride 2, 256 -> 256, H/4 -> H/2
    logits            3x3 transposed conv, stride 2, 256 -> 3, H/2 -> H
Each is timed three ways in one compiled function per way: forward; forward and the weight gradient (the
gradient of sum(output * g) with respect to the kernel alone, so no input gradient is computed); forward and
both gradients. The weight gradient's cost is then (w - f) and the input gradient's (all - w). TensorFlow
variants (--variants): `nhwc` (what Keras builds), `nchw` (channels first; opt-in: TensorFlow 2.18.1's CPU build
took 3-80 s a call for it on 2026-12-04, its NCHW kernels not being oneDNN's), `xla` (jit_compile), and for the transposed convolutions `phases`: the same transposed convolution written as four
stride-1 convolutions on the input (one per output pixel parity, with the kernel's taps of that parity) and a
depth-to-space interleave, which gives the same output from the same 3x3 kernel. PyTorch (--torch: the
interpreter of an environment with torch, e.g. .venv-reference/deepcam/bin/python from make bench-reference)
times the same layers with the reference's ops, NCHW and channels_last, in the same run. One process each,
TensorFlow's and PyTorch's default threads (all cores). Writes benchmarks/results/conv_grads.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results/conv_grads.json"
# name: (kind, input channels, output channels, input scale of H and W)
LAYERS = {"decoder_conv1": ("conv", 304, 256, 4), "decoder_up_final": ("deconv", 256, 256, 4),
          "logits": ("deconv", 256, 3, 2)}
WAYS = ("forward", "weight", "all")


def best_seconds(fn, repeats: int) -> float:
    """The median of `repeats` timed calls after two untimed ones (tracing, warm-up): the gradients' seconds are
    differences of two such figures, and the median moves less than the best under other load."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def split(times: dict) -> dict:
    """Forward, weight-gradient and input-gradient seconds from the three ways' times."""
    return {"forward": times["forward"], "weight_gradient": max(times["weight"] - times["forward"], 0.0),
            "input_gradient": max(times["all"] - times["weight"], 0.0), "ways": times}


# ----------------------------------------------------------------------------- TensorFlow
def tf_layer(kind: str, variant: str):
    """(op(x, w), input layout) of a TensorFlow variant; x NHWC unless the layout says NCHW."""
    import tensorflow as tf
    if kind == "conv":
        fmt = "NCHW" if variant == "nchw" else "NHWC"
        return (lambda x, w: tf.nn.conv2d(x, w, 1, "SAME", data_format=fmt)), fmt
    if variant == "phases":
        return deconv_phases, "NHWC"
    fmt = "NCHW" if variant == "nchw" else "NHWC"

    def deconv(x, w):  # Keras' Conv2DTranspose(3, strides=2, "valid") then the crop of the suite's _deconv
        n, h, wd = (x.shape[0], x.shape[2], x.shape[3]) if fmt == "NCHW" else x.shape[:3]
        shape = (n, w.shape[2], 2 * h + 1, 2 * wd + 1) if fmt == "NCHW" else (n, 2 * h + 1, 2 * wd + 1, w.shape[2])
        y = tf.nn.conv2d_transpose(x, w, shape, 2, "VALID", data_format=fmt)
        return y[:, :, 1:, 1:] if fmt == "NCHW" else y[:, 1:, 1:, :]
    return deconv, fmt


def deconv_phases(x, w):
    """The stride-2, 3x3 transposed convolution cropped as PyTorch's padding=1, output_padding=1, written as four
    stride-1 convolutions of the input, one per output parity (w: (3, 3, out, in) as conv2d_transpose takes it).
    Output pixel (2i + a, 2j + b) sums x[i + di, j + dj] * w[ky, kx] over the taps with ky = 1 + a - 2 di in
    [0, 3), and the same for the columns: parity 0 takes tap 1 at offset 0; parity 1 takes tap 2 at 0 and tap 0
    at +1."""
    import tensorflow as tf
    k = tf.transpose(w, (0, 1, 3, 2))  # (3, 3, in, out): a conv2d kernel
    rows = {0: [1], 1: [2, 0]}  # taps of each parity, at offsets 0 and +1
    xp = tf.pad(x, ((0, 0), (0, 1), (0, 1), (0, 0)))
    phases = []
    for a in (0, 1):
        for b in (0, 1):
            kernel = tf.stack([tf.stack([k[ky, kx] for kx in rows[b]]) for ky in rows[a]])
            src = xp[:, :x.shape[1] + len(rows[a]) - 1, :x.shape[2] + len(rows[b]) - 1, :]
            phases.append(tf.nn.conv2d(src, kernel, 1, "VALID"))
    top = tf.stack([phases[0], phases[1]], axis=3)  # (n, h, w, 2, out): columns interleaved
    bottom = tf.stack([phases[2], phases[3]], axis=3)
    n, h, wd, out = phases[0].shape[0], x.shape[1], x.shape[2], w.shape[2]
    both = tf.stack([tf.reshape(top, (n, h, 2 * wd, out)), tf.reshape(bottom, (n, h, 2 * wd, out))], axis=2)
    return tf.reshape(both, (n, 2 * h, 2 * wd, out))


def tf_tensors(kind: str, cin: int, cout: int, h: int, w: int, fmt: str):
    import numpy as np
    import tensorflow as tf
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, h, w, cin), dtype=np.float32)
    kernel = rng.standard_normal((3, 3, cin, cout) if kind == "conv" else (3, 3, cout, cin), dtype=np.float32) * 0.05
    if fmt == "NCHW":
        x = x.transpose(0, 3, 1, 2)
    return tf.constant(x), tf.Variable(kernel)


def tf_times(name: str, variant: str, height: int, width: int, repeats: int) -> dict:
    import tensorflow as tf
    kind, cin, cout, scale = LAYERS[name]
    op, fmt = tf_layer(kind, variant)
    x, w = tf_tensors(kind, cin, cout, height // scale, width // scale, fmt)
    g = tf.constant(tf.random.stateless_normal(op(x, w).shape, (1, 2)))
    jit = variant == "xla"

    @tf.function(jit_compile=jit)
    def forward():
        return tf.reduce_sum(op(x, w) * g)

    @tf.function(jit_compile=jit)
    def weight():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(op(x, w) * g)
        return tf.reduce_sum(tape.gradient(loss, w))

    @tf.function(jit_compile=jit)
    def both():
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(op(x, w) * g)
        dx, dw = tape.gradient(loss, [x, w])
        return tf.reduce_sum(dx) + tf.reduce_sum(dw)

    fns = {"forward": forward, "weight": weight, "all": both}
    return split({way: best_seconds(lambda f=fns[way]: float(f()), repeats) for way in WAYS})


def check_phases(height: int = 16, width: int = 24) -> float:
    """The largest difference between the phase formulation and the suite's transposed convolution."""
    import tensorflow as tf
    op, _ = tf_layer("deconv", "nhwc")
    x, w = tf_tensors("deconv", 8, 5, height, width, "NHWC")
    return float(tf.reduce_max(tf.abs(op(x, w) - deconv_phases(x, w))))


# ----------------------------------------------------------------------------- PyTorch (run with --torch-worker)
def torch_times(name: str, variant: str, height: int, width: int, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F
    kind, cin, cout, scale = LAYERS[name]
    torch.manual_seed(0)
    x = torch.randn(1, cin, height // scale, width // scale)
    w = (torch.randn(cout, cin, 3, 3) if kind == "conv" else torch.randn(cin, cout, 3, 3)) * 0.05
    if variant == "channels_last":
        x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    w.requires_grad_(True)

    def op(inp):
        return F.conv2d(inp, w, padding=1) if kind == "conv" else \
            F.conv_transpose2d(inp, w, stride=2, padding=1, output_padding=1)
    with torch.no_grad():
        g = torch.randn_like(op(x))

    def forward():
        with torch.no_grad():
            float((op(x) * g).sum())

    def weight():
        (grad,) = torch.autograd.grad((op(x) * g).sum(), [w])
        float(grad.sum())

    def both():
        xi = x.detach().requires_grad_(True)
        dx, dw = torch.autograd.grad((op(xi) * g).sum(), [xi, w])
        float(dx.sum() + dw.sum())
    fns = {"forward": forward, "weight": weight, "all": both}
    return split({way: best_seconds(fns[way], repeats) for way in WAYS})


def torch_worker(args) -> None:
    import torch
    rows = [{"framework": f"torch {torch.__version__}", "variant": v, "layer": name,
             **torch_times(name, v, args.height, args.width, args.repeats)}
            for name in LAYERS for v in ("nchw", "channels_last")]
    print(json.dumps({"rows": rows, "threads": torch.get_num_threads()}))


def run_torch(python: str, args) -> dict:
    cmd = [python, __file__, "--torch-worker", "--height", str(args.height), "--width", str(args.width),
           "--repeats", str(args.repeats)]
    print("  PyTorch ...", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(cmd)} failed with exit {proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------- driver
TF_VARIANTS = ("nhwc", "nchw", "xla", "phases")


def variants_of(name: str, chosen) -> tuple[str, ...]:
    """The chosen TensorFlow variants that apply to layer `name` (`phases`: transposed convolutions only)."""
    return tuple(v for v in chosen if v != "phases" or LAYERS[name][0] == "deconv")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--height", type=int, default=384)
    p.add_argument("--width", type=int, default=576)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--variants", nargs="+", choices=TF_VARIANTS, default=["nhwc", "xla", "phases"])
    p.add_argument("--torch", help="an interpreter with torch, for the PyTorch rows")
    p.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.torch_worker:  # in the PyTorch environment: nothing of the suite imported
        return torch_worker(args)
    sys.path.insert(0, str(HERE))
    from harness import run_header, sgemm_gflops, write_json_atomic
    if args.height % 8 or args.width % 8:
        p.error(f"--height {args.height} --width {args.width}: expected multiples of 8 (the decoder's H/4, H/2)")
    result = {**run_header(sgemm_gflops()), "height": args.height, "width": args.width, "batch": 1,
              "repeats": args.repeats, "statistic": "median",
              "phases_max_difference": check_phases(), "rows": []}
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")  # each variant traces its own functions: no retracing warnings
    for name in LAYERS:
        for variant in variants_of(name, args.variants):
            print(f"  TensorFlow {name} {variant} ...", flush=True)
            row = {"framework": f"tensorflow {tf.__version__}", "variant": variant, "layer": name}
            try:
                row |= tf_times(name, variant, args.height, args.width, args.repeats)
            except (tf.errors.OpError, ValueError, TypeError) as err:  # a layout this build has no kernel for
                row |= {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
            result["rows"].append(row)
    if args.torch:
        torch_rows = run_torch(args.torch, args)
        result["rows"] += torch_rows["rows"]
        result["torch_threads"] = torch_rows["threads"]
    result["sgemm_gflops_after"] = sgemm_gflops()
    write_json_atomic(args.out, result)
    for r in result["rows"]:
        print(f"{r['framework']:<22} {r['layer']:<17} {r['variant']:<13} " + (r.get("error") or (
            f"forward {r['forward']:.4f} s  weight grad {r['weight_gradient']:.4f} s  input grad "
            f"{r['input_gradient']:.4f} s")))
    print(f"wrote {args.out} ({result['cpu']}; {result['isa_flags']})")


if __name__ == "__main__":
    main()
