"""Facts about the machine this process runs on."""
from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or what the platform module says elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


# Widest first: the first of these the CPU's flags name is its vector instruction set.
VECTOR_ISAS = ("avx512f", "avx2", "avx", "sse4_2")


def vector_isa() -> str:
    """The widest SIMD instruction set /proc/cpuinfo's flags name (avx512f, avx2, avx, sse4_2), or "unknown".

    Convolution and GEMM rates follow it: the same VM type can land on hosts with and without AVX-512."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return next((isa for isa in VECTOR_ISAS if isa in flags), "unknown")
    except OSError:
        pass
    return "unknown"
