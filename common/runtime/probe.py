"""The node's attainable compute rate, measured once per host and cached: the `peak` a run's sustained FLOP/s is
set against (summary.json's `system`).

Two kernels through TensorFlow on all of the process's cores, as training uses them, each in float32 and in
bfloat16 (the two numerics train.precision chooses between):
- GEMM: a 2048 x 2048 matrix product;
- a representative convolution: CosmoFlow's second 3D convolution (32 -> 64 channels, 3^3 kernel) on a batch
  of 2 x 32^3 inputs, forward only.
Each is the best of `repeats` timed calls after a warm-up. `peak_gflops` is the higher float32 rate,
`peak_bf16_gflops` the higher bfloat16 one: a run's fraction_of_peak is against the one of the precision it
trains in (a mixed_bfloat16 run's matrix products and convolutions run in bfloat16).

    python -m common.runtime.probe            # print the cached figures, probing first if there are none
    python -m common.runtime.probe --force    # probe again (on an idle node) and replace the cache

The cache is `$HPC_BENCH_CACHE/probe-<host>.json` (default `~/.cache/hpc-sciml-bench`), keyed by the host name,
the CPU model, the cores and the TensorFlow version: another CPU or TensorFlow probes afresh. A lock file keeps two
runs starting at once from probing together (each would measure half the node). Reading the cache
(`cached`) is common/runtime/monitor.py's, which every run calls; filling it (`probe`), the kernels and the CLI
are this module's.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time

from common.base.cli import guarded
from common.base.errors import BenchError
from common.base.files import write_json_atomic
from common.base.host import cache_path, cached, host_key

GEMM_N = 2048
CONV_SHAPE = (2, 32, 32, 32, 32)  # batch, depth, height, width, channels in
CONV_FILTERS, CONV_KERNEL = 64, 3
GEMM_FLOP = 2.0 * GEMM_N ** 3
CONV_FLOP = 2.0 * CONV_KERNEL ** 3 * CONV_SHAPE[-1] * CONV_FILTERS * (CONV_SHAPE[0] * CONV_SHAPE[1] ** 3)


def measure(repeats: int = 10) -> dict:
    """Run both kernels in float32 and bfloat16 in this process (TensorFlow's default threads: all cores); GFLOP/s
    each: gemm_gflops, conv3d_gflops, bf16_gemm_gflops, bf16_conv3d_gflops."""
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    os.environ.setdefault("ONEDNN_DEFAULT_FPMATH_MODE", "STRICT")
    import tensorflow as tf
    figures = {}
    for prefix, dtype in (("", tf.float32), ("bf16_", tf.bfloat16)):
        a, b = (tf.cast(tf.random.uniform((GEMM_N, GEMM_N)), dtype) for _ in range(2))
        x = tf.cast(tf.random.uniform(CONV_SHAPE), dtype)
        w = tf.cast(tf.random.uniform((CONV_KERNEL,) * 3 + (CONV_SHAPE[-1], CONV_FILTERS)), dtype)
        gemm = tf.function(lambda a=a, b=b: tf.reduce_sum(tf.cast(tf.matmul(a, b), tf.float32)))
        conv = tf.function(lambda x=x, w=w: tf.reduce_sum(tf.cast(tf.nn.conv3d(x, w, strides=[1] * 5, padding="SAME"),
                                                                  tf.float32)))
        figures[f"{prefix}gemm_gflops"] = GEMM_FLOP / _best_seconds(gemm, repeats) / 1e9
        figures[f"{prefix}conv3d_gflops"] = CONV_FLOP / _best_seconds(conv, repeats) / 1e9
    return figures


def _best_seconds(fn, repeats: int) -> float:
    float(fn())  # trace and warm up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        float(fn())
        best = min(best, time.perf_counter() - t)
    return best


def probe(force: bool = False) -> dict:
    """The cached figures for this host, probing (in a fresh process, on all cores) when there are none, they
    were taken with another CPU or TensorFlow, or `force`."""
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = cached()
        if record and not force:
            return record
        figures = _measure_in_subprocess()
        record = {**host_key(), **figures, "peak_gflops": max(figures["gemm_gflops"], figures["conv3d_gflops"]),
                  "peak_bf16_gflops": max(figures["bf16_gemm_gflops"], figures["bf16_conv3d_gflops"]),
                  "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cache": str(path)}
        write_json_atomic(record, path)
        return record


def _measure_in_subprocess() -> dict:
    """common/runtime/probe.py's measure() in a new Python process: this one's TensorFlow may already be limited to
    a rank's threads."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    for var in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-m", "common.runtime.probe", "--measure"], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise BenchError(f"the peak probe (python -m common.runtime.probe --measure) failed with exit "
                         f"{proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="The node's GEMM and Conv3D rates in float32 and bfloat16, "
                                                 "cached per host.")
    parser.add_argument("--force", action="store_true", help="probe again and replace the cache")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the subprocess's work
    args = parser.parse_args(argv)
    if args.measure:
        return guarded(lambda: print(json.dumps(measure()), flush=True) or 0)
    return guarded(lambda: print(json.dumps(probe(args.force), indent=2)) or 0)


if __name__ == "__main__":
    sys.exit(main())
