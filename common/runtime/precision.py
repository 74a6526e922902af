"""`train.precision: auto`: the numerics this host trains the application fastest in (docs/fidelity.md says why
the closed division allows it).

    cfg, choice = choose(app, cfg, dist, config, overrides)   # before Run.open; rank 0 decides, all ranks agree

`auto` resolves to `mixed_bfloat16` where a probe of this host measured the application's training step
(forward, backward, update, on one rank's threads, at the run's sample shape and local batch) in bfloat16 at most
THRESHOLD x its float32 step, after weighing the epochs bfloat16 needs against float32's (the committed record
benchmarks/results/precision_epochs.json; 1 where it has no figures); else `float32`. An explicit
`train.precision` is kept and not probed. The probe runs each precision in a fresh process
(`python -m common.runtime.precision_measure ...`: a Keras policy is global) and is cached per host in
`$HPC_BENCH_CACHE/precision-<host>.json`, keyed by KEY_FIELDS, so a host probes an application's shape and batch
once. The choice is a dict: `precision`, `reason`, `step_seconds` ({precision: median seconds}, empty where
nothing was measured), `epochs_ratio`, and (a run's) `configured`: auto or the explicit value. A campaign fixes
the choice once: its later runs train in the precision its first run chose (common/campaign/run.py).
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import socket
import time
from pathlib import Path
from typing import Any

from common.base.errors import BenchError
from common.base.files import write_json_atomic
from common.base.host import cpu_flags, cpu_model
from common.base.host import cache_root, tf_version
from common.runtime import precision_measure
from common.runtime.precision_measure import CANDIDATES

THRESHOLD = 0.8  # bfloat16 must take at most this share of float32's time to train
KEY_FIELDS = ("cpu", "amx_bf16", "avx512_bf16", "threads", "tensorflow", "app", "input_shape", "local_batch_size",
              "gpu")
EPOCHS_RECORD = Path(__file__).resolve().parents[2] / "benchmarks/results/precision_epochs.json"


def choose(app: Any, cfg: Any, dist: Any, config: str, overrides: list[str]) -> tuple[Any, dict]:
    """`cfg` with train.precision resolved, and the choice; collective (rank 0 probes, every rank takes its
    answer) where train.precision is auto."""
    if cfg.train.precision != "auto":
        choice = explicit(cfg.train.precision, dist.gpu)
        if dist.is_root and choice.get("warning"):
            print(f"warning: train.precision={cfg.train.precision}: {choice['warning']}", flush=True)
        return cfg, choice
    choice = decide_auto(app, cfg, dist, config, overrides) if dist.is_root else None
    if dist.size > 1:
        choice = dist.broadcast_object(choice)
    return with_precision(cfg, choice["precision"]), {**choice, "configured": "auto"}


def explicit(precision: str, gpu: bool = False) -> dict:
    """An explicit train.precision's choice; with `warning` where it is mixed_bfloat16 on a CPU that emulates it."""
    choice = {"precision": precision, "reason": f"train.precision={precision} as configured (not auto)",
              "step_seconds": {}, "epochs_ratio": None, "configured": precision}
    warning = emulated_bfloat16(precision, gpu, cpu_flags())
    return {**choice, "reason": f"{choice['reason']}; {warning}", "warning": warning} if warning else choice


def emulated_bfloat16(precision: str, gpu: bool, flags: set[str]) -> str:
    """Why `precision` trains slowly here, where it is mixed_bfloat16 on a CPU without a bfloat16 unit; else ''."""
    if precision != "mixed_bfloat16" or gpu or flags & {"avx512_bf16", "amx_bf16"}:
        return ""
    return ("this CPU has no bfloat16 unit (neither AVX512-BF16 nor AMX-BF16): oneDNN emulates bfloat16 with "
            "float32 instructions and conversions, so a step is slower than in float32 (1.35-3.3x on an Intel "
            "Xeon with AVX-512, docs/stack.md); train.precision=auto measures both and chooses")


def with_precision(cfg: Any, precision: str) -> Any:
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=precision))


def decide_auto(app: Any, cfg: Any, dist: Any, config: str, overrides: list[str]) -> dict:
    """The auto choice on this rank: a path that runs float32 only, else the cached or freshly probed steps."""
    if getattr(getattr(cfg, "parallel", None), "hybrid", False) or cfg.train.emulated:
        path = "an emulated accelerator's run" if cfg.train.emulated else "the hybrid Mesh-TF path"
        return {"precision": "float32", "reason": f"{path} trains in float32 only",
                "step_seconds": {}, "epochs_ratio": None}
    key = probe_key(app.name, cfg, dist.threads, dist.gpu)
    seconds = cached_steps(key)
    fresh = seconds is None
    if fresh:
        print(f"train.precision=auto: probing this host's {app.name} training step in float32 and "
              f"mixed_bfloat16 (once per host, shape and batch; cached)", flush=True)
        try:
            seconds = probe_steps(key, lambda precision: precision_measure.measure_in_subprocess(
                app.name, config, overrides, precision, dist.threads))
        except BenchError as err:  # a probe that cannot run leaves the run in float32, said so
            print(f"warning: {err}", flush=True)
            return {"precision": "float32", "reason": "the precision probe failed (above): float32",
                    "step_seconds": {}, "epochs_ratio": None}
    choice = decide(seconds, epochs_ratio(app.name))
    print(f"train.precision=auto -> {choice['precision']}: {choice['reason']}" + ("" if fresh else " (cached)"),
          flush=True)
    return choice


def decide(step_seconds: dict, ratio: tuple[float, str]) -> dict:
    """mixed_bfloat16 when its step time x the epochs ratio is at most THRESHOLD x float32's, else float32
    (always where the record has bfloat16 runs that missed the target: an infinite ratio)."""
    f32, bf16 = step_seconds["float32"], step_seconds["mixed_bfloat16"]
    factor, source = ratio
    steps = f"a step takes {f32:.3g} s in float32 and {bf16:.3g} s in mixed_bfloat16 ({bf16 / f32:.2f}x)"
    if not math.isfinite(factor):
        return {"precision": "float32", "reason": f"{steps}; {source}", "step_seconds": dict(step_seconds),
                "epochs_ratio": None}
    relative = bf16 * factor / f32
    precision = "mixed_bfloat16" if relative <= THRESHOLD else "float32"
    reason = (f"{steps}; x {factor:.2f} the epochs ({source}) gives {relative:.2f}x float32's time to train, "
              f"{'at most' if precision != 'float32' else 'over'} {THRESHOLD}")
    return {"precision": precision, "reason": reason, "step_seconds": dict(step_seconds), "epochs_ratio": factor}


def epochs_ratio(app_name: str, record: Path | None = None) -> tuple[float, str]:
    """bfloat16's mean epochs to the target over float32's, from the committed record, and where it came from."""
    path = record or EPOCHS_RECORD
    try:
        runs = json.loads(path.read_text())[app_name]
        missed = runs["mixed_bfloat16"].get("not_converged", [])
        if missed:
            return math.inf, (f"{path.name}: mixed_bfloat16 missed the target in {len(missed)} of "
                              f"{len(missed) + len(runs['mixed_bfloat16']['epochs'])} runs (seeds {missed})")
        f32, bf16 = runs["float32"]["epochs"], runs["mixed_bfloat16"]["epochs"]
        ratio = (sum(bf16) / len(bf16)) / (sum(f32) / len(f32))
        return ratio, f"{path.name}: {len(bf16)} bfloat16 and {len(f32)} float32 runs"
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return 1.0, f"no epochs record for {app_name}: taken as equal"


# ---------------------------------------------------------------------------- the cache
def probe_key(app_name: str, cfg: Any, threads: int, gpu: bool) -> dict:
    """What a cached probe must match."""
    flags = cpu_flags()
    return {"cpu": cpu_model(), "amx_bf16": "amx_bf16" in flags, "avx512_bf16": "avx512_bf16" in flags,
            "threads": threads, "tensorflow": tf_version(), "app": app_name,
            "input_shape": list(cfg.model.input_shape), "local_batch_size": cfg.train.local_batch_size, "gpu": gpu}


def cache_path() -> Path:
    return cache_root() / f"precision-{socket.gethostname()}.json"  # beside the peak probe's


def cached_steps(key: dict) -> dict | None:
    """The step seconds a probe with this key measured, else None."""
    for record in _records():
        if all(record.get(k) == key[k] for k in KEY_FIELDS):
            return record["step_seconds"]
    return None


def probe_steps(key: dict, measure) -> dict:
    """Measure each candidate (`measure(precision)` -> median seconds), under a lock so that two runs starting
    at once do not probe together, and cache the answer."""
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        seconds = cached_steps(key)
        if seconds is not None:
            return seconds
        seconds = {precision: measure(precision) for precision in CANDIDATES}
        others = [r for r in _records() if not all(r.get(k) == key[k] for k in KEY_FIELDS)]
        record = {**key, "step_seconds": seconds, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_json_atomic(others + [record], path)
        return seconds


def _records() -> list[dict]:
    try:
        records = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return []  # absent or unreadable: probe again
    return [r for r in records if isinstance(r, dict) and isinstance(r.get("step_seconds"), dict)] \
        if isinstance(records, list) else []
