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
runs starting at once from probing together (each would measure half the node). Reading the cache (`cached`) is
common/runtime/monitor.py's, which every run calls; filling it (`probe`), the kernels and the CLI are this module's.
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
from common.runtime.monitor import cache_path, cached, host_key

GEMM_N = 2048
CONV_SHAPE = (2, 32, 32, 32, 32)  # batch, depth, height, width, channels in
CONV_FILTERS, CONV_KERNEL = 64, 3


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
        record = {**host_key(), **figures, "peak_gflops": max(figures.values()),
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
