"""The precision probe's measuring process (common/runtime/precision.py launches it with `measure_in_subprocess`, one
per precision: a Keras policy is global): the application's training step built in one precision on a number of
threads, timed on a synthetic batch of the run's sample shape and local batch. Prints one JSON line,
{"step_seconds": median}.

    python -m common.runtime.precision_measure --measure APP CONFIG PRECISION [--threads N] [OVERRIDES ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from common.base.errors import BenchError

CANDIDATES = ("float32", "mixed_bfloat16")  # what train.precision=auto chooses between
LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_", "HOROVOD_CROSS_",
                     "HOROVOD_HOSTNAME", "SLURM_PROCID", "SLURM_LOCALID")

# Timed steps: at least PROBE_STEPS and PROBE_SECONDS of them (short steps are noisy), at most PROBE_MAX_STEPS.
PROBE_WARMUP, PROBE_STEPS, PROBE_SECONDS, PROBE_MAX_STEPS = 2, 4, 3.0, 60


def measure_in_subprocess(app_name: str, config: str, overrides: list[str], precision: str, threads: int,
                          extra_env: dict | None = None, cwd: str | None = None) -> float:
    """The median training-step seconds of `app_name` in `precision`, measured by a fresh process on `threads`
    (`extra_env`: variables set for it, e.g. benchmarks/precision_probe.py's ONEDNN_DEFAULT_FPMATH_MODE=BF16;
    `cwd`: the checkout it runs in, first on its path: benchmarks/step_compare.py's worktrees)."""
    # One process, not a rank of the run's launch: none of the variables a launcher sets for its ranks.
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    env |= extra_env or {}
    cmd = [sys.executable, "-m", "common.runtime.precision_measure", "--measure", app_name, config, precision,
           "--threads", str(threads), *overrides]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, cwd=cwd)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise BenchError(f"the precision probe ({' '.join(cmd[1:6])} ...) failed with exit {proc.returncode}: "
                         f"{proc.stderr.strip()[-2000:]}; set train.precision=float32 to run without it")
    return float(json.loads(lines[-1])["step_seconds"])


def probe_step(app_name: str, config: str, precision: str, threads: int, overrides: list[str]):
    """In this process: the application's training steps built in `precision` on `threads`, and a synthetic
    batch (x, y) of the run's shape and local batch (also benchmarks/step_breakdown.py's)."""
    import importlib
    from common.runtime.config import load_config, resolve
    from common.runtime.dist import init_distributed
    from common.runtime.strategy import DataParallel, data_parallel_steps
    app = importlib.import_module(f"{app_name}.train").APP
    cfg = load_config(config, [*overrides, f"train.precision={precision}", f"dist.threads_per_rank={threads}",
                               "dist.elastic.enabled=false"], app.config)
    dist = init_distributed(cfg.dist)
    strategy = DataParallel(dist)  # one process: the data-parallel step (elastic is off, the hybrid path is float32)
    cfg = resolve(cfg, strategy.replicas, app.with_rcp, app.closed_differences)
    return data_parallel_steps(app.build(cfg, strategy), dist), *app.example_batch(cfg)


def measure(app_name: str, config: str, precision: str, threads: int, overrides: list[str]) -> float:
    """In this process: build the application's trainee in `precision` and time its training step on a
    synthetic batch of the run's shape (PROBE_WARMUP untimed, then the median of the timed ones)."""
    steps, x, y = probe_step(app_name, config, precision, threads, overrides)
    times = []
    for i in range(PROBE_WARMUP + PROBE_MAX_STEPS):
        start = time.perf_counter()
        float(steps.train(x, y))
        if i >= PROBE_WARMUP:
            times.append(time.perf_counter() - start)
        if len(times) >= PROBE_STEPS and sum(times) >= PROBE_SECONDS:
            break
    return sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.runtime.precision_measure",
                                     description="Time an application's training step in one precision (the "
                                                 "probe of train.precision=auto; prints one JSON line).")
    parser.add_argument("--measure", nargs=3, metavar=("APP", "CONFIG", "PRECISION"), required=True)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    app_name, config, precision = args.measure
    if app_name not in ("cosmoflow", "deepcam") or precision not in CANDIDATES:
        parser.error(f"--measure {app_name} ... {precision}: expected cosmoflow|deepcam and one of {CANDIDATES}")
    from common.base.cli import guarded
    return guarded(lambda: print(json.dumps({"step_seconds": measure(app_name, config, precision, args.threads,
                                                                     args.overrides)})) or 0)


if __name__ == "__main__":
    sys.exit(main())
