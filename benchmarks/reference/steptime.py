"""What the reference-side step drivers share; standard library only (they run in the reference's venvs)."""
import hashlib
import json
import os
import time


def time_calls(step, warmup: int, steps: int) -> list:
    """Seconds of each of `steps` calls of `step` after `warmup` untimed ones."""
    for _ in range(warmup):
        step()
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return seconds


def sha256_of(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_json_atomic(path: str, obj) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)
