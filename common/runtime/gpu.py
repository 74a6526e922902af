"""What the runtime reads from a GPU, and only on one (a CPU run never calls this module): the device drained before a
clock reading, TensorFlow's peak allocation, NVML's energy counter.
"""
from __future__ import annotations

import os


def sync_devices() -> None:
    """Wait until the device has done the work queued so far (the host runs ahead of it)."""
    import tensorflow as tf
    tf.test.experimental.sync_devices()


def peak_memory_mb() -> float:
    """Peak memory TensorFlow allocated on this rank's GPU (the one it sees as GPU:0)."""
    import tensorflow as tf
    return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20


def nvml_millijoules() -> tuple[float | None, str]:
    """Total energy (mJ) of the first GPU this process sees, through NVML; None and why where it cannot be read."""
    try:
        import pynvml
    except ImportError:
        return None, "GPU present but pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        index = int(visible) if visible.isdigit() else 0
        return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(index))), ""
    except pynvml.NVMLError as err:
        return None, f"NVML energy counter unavailable: {err}"
