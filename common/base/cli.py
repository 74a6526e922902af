"""Entry-point helper: turn BenchError into a one-paragraph message and a non-zero exit."""
from __future__ import annotations

import sys
import textwrap
from typing import Callable

from common.base.errors import BenchError

EXIT_BAD_INPUT = 2


def guarded(run: Callable[[], int], prefix: str = "") -> int:
    """Call `run`; a BenchError becomes `error: <message>` on stderr and exit code 2."""
    try:
        return int(run() or 0)
    except BenchError as err:
        message = textwrap.fill(f"{prefix}error: {err}", width=110, subsequent_indent="  ",
                                break_long_words=False, break_on_hyphens=False)
        print(message, file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
