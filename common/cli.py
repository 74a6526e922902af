"""Entry-point helpers: turn BenchError into a one-paragraph message and a non-zero exit."""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Callable

from common.errors import BenchError

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


def write_json_atomic(obj: dict, path: str | os.PathLike, indent: int | None = 2) -> Path:
    """Write JSON to a temporary name beside `path`, then rename it into place (`indent` None: compact, and
    written by the C encoder, several times faster for large objects)."""
    return write_text_atomic(json.dumps(obj, indent=indent, default=float) + "\n", path)


def write_text_atomic(text: str, path: str | os.PathLike) -> Path:
    """Write `text` to a temporary name beside `path`, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
