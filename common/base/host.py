"""Facts about the machine this process runs on."""
from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or what the platform module says elsewhere."""
    return _cpuinfo("model name") or platform.processor() or platform.machine() or "unknown"


def _cpuinfo(field: str) -> str | None:
    """The first core's `field` in /proc/cpuinfo; None where there is none (or no /proc)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    """The first core's flags in /proc/cpuinfo (empty where there are none)."""
    return set((_cpuinfo("flags") or "").split())


# Widest first: the first of these the CPU's flags name is its vector instruction set.
VECTOR_ISAS = ("avx512f", "avx2", "avx", "sse4_2")


def vector_isa() -> str:
    """The widest SIMD instruction set /proc/cpuinfo's flags name (avx512f, avx2, avx, sse4_2), or "unknown".

    Convolution and GEMM rates follow it: the same VM type can land on hosts with and without AVX-512."""
    flags = cpu_flags()
    return next((isa for isa in VECTOR_ISAS if isa in flags), "unknown")


# The flags a benchmark's caption names: the vector widths and the bfloat16/AMX units that decide convolution and
# GEMM speed on the hosts this VM kind lands on.
CAPTION_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def caption_flags() -> str:
    """The flags of CAPTION_FLAGS that /proc/cpuinfo names, space-separated; "none" where it names none of them."""
    flags = cpu_flags()
    return " ".join(flag for flag in CAPTION_FLAGS if flag in flags) or "none"
