"""The node's attainable compute rate, measured once per host and cached: the `peak` a run's sustained FLOP/s is
set against (summary.json's `system`).

Two float32 kernels through TensorFlow on all of the process's cores, as training uses them:
- GEMM: a 2048 x 2048 matrix product;
- a representative convolution: CosmoFlow's second 3D convolution (32 -> 64 channels, 3^3 kernel) on a batch
  of 2 x 32^3 inputs, forward only.
Each is the best of `repeats` timed calls after a warm-up. `peak_gflops` is the higher of the two.

    python -m common.runtime.probe            # print the cached figures, probing first if there are none
    python -m common.runtime.probe --force    # probe again (on an idle node) and replace the cache

The cache is `$HPC_BENCH_CACHE/probe-<host>.json` (default `~/.cache/hpc-sciml-bench`), keyed by the host name,
the CPU model, the cores and the TensorFlow version: another CPU or TensorFlow probes afresh. A lock file keeps two
runs starting at once from probing together (each would measure half the node). Reading and filling the cache
(`cached`, `probe`) is common/runtime/monitor.py's, which every run calls; this module is the kernels and the CLI.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from common.base.cli import guarded
from common.runtime.monitor import probe

GEMM_N = 2048
CONV_SHAPE = (2, 32, 32, 32, 32)  # batch, depth, height, width, channels in
CONV_FILTERS, CONV_KERNEL = 64, 3


def measure(repeats: int = 10) -> dict:
    """Run both kernels in this process (TensorFlow's default threads: all cores); GFLOP/s each."""
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    os.environ.setdefault("ONEDNN_DEFAULT_FPMATH_MODE", "STRICT")
    import tensorflow as tf
    a, b = (tf.random.uniform((GEMM_N, GEMM_N)) for _ in range(2))
    x = tf.random.uniform(CONV_SHAPE)
    w = tf.random.uniform((CONV_KERNEL,) * 3 + (CONV_SHAPE[-1], CONV_FILTERS))
    gemm = tf.function(lambda: tf.reduce_sum(tf.matmul(a, b)))
    conv = tf.function(lambda: tf.reduce_sum(tf.nn.conv3d(x, w, strides=[1] * 5, padding="SAME")))
    gemm_flop = 2.0 * GEMM_N ** 3
    conv_flop = 2.0 * CONV_KERNEL ** 3 * CONV_SHAPE[-1] * CONV_FILTERS * (CONV_SHAPE[0] * CONV_SHAPE[1] ** 3)
    return {"gemm_gflops": gemm_flop / _best_seconds(gemm, repeats) / 1e9,
            "conv3d_gflops": conv_flop / _best_seconds(conv, repeats) / 1e9}


def _best_seconds(fn, repeats: int) -> float:
    float(fn())  # trace and warm up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        float(fn())
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="The node's GEMM and Conv3D rates, cached per host.")
    parser.add_argument("--force", action="store_true", help="probe again and replace the cache")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the subprocess's work
    args = parser.parse_args(argv)
    if args.measure:
        return guarded(lambda: print(json.dumps(measure()), flush=True) or 0)
    return guarded(lambda: print(json.dumps(probe(args.force), indent=2)) or 0)


if __name__ == "__main__":
    sys.exit(main())
