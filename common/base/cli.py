"""Entry-point helpers: turn a BenchError into a one-paragraph message and exit 2, any other exception into one
line and exit 4 with its traceback in a file (common/base/exits.py); end a process that has loaded TensorFlow
without the interpreter's teardown."""
from __future__ import annotations

import atexit
import os
import sys
import tempfile
import textwrap
import time
import traceback
from pathlib import Path
from typing import Callable, NoReturn

from common.base import exits
from common.base.errors import BenchError
from common.base.files import write_text_atomic


# Set on an exception whose traceback is already written (a training writes it into its run directory).
TRACEBACK_FILE = "bench_traceback_file"
TRACEBACK_NAME = "traceback.txt"


def guarded(run: Callable[[], int], prefix: str = "") -> int:
    """Call `run`; a BenchError becomes `error: <message>` on stderr and exit code 2 (or the error's `exit_code`:
    another rank's failure carries that rank's); any other exception one line naming it and where it was raised,
    its traceback written to a file that line names, and exit code 4."""
    try:
        return int(run() or 0)
    except BenchError as err:
        message = textwrap.fill(f"{prefix}error: {err}", width=110, subsequent_indent="  ",
                                break_long_words=False, break_on_hyphens=False)
        print(message, file=sys.stderr, flush=True)
        return getattr(err, "exit_code", exits.BAD_INPUT)
    except Exception as err:  # noqa: BLE001 - every other failure is an internal error, exit 4
        path = getattr(err, TRACEBACK_FILE, None) or write_traceback(err, Path(tempfile.gettempdir()), unique=True)
        print(f"{prefix}internal error: {type(err).__name__}: {err} (raised at {raised_at(err)}); traceback in "
              f"{path}", file=sys.stderr, flush=True)
        return exits.INTERNAL_ERROR


def write_traceback(err: BaseException, directory: Path, unique: bool = False) -> Path:
    """Write `err`'s traceback to DIRECTORY/traceback.txt (with `unique`, a name of its own there:
    hpc-bench-<time>-<pid>-traceback.txt)
    and mark `err` with the path; returns it."""
    text = "".join(traceback.format_exception(err))
    name = f"hpc-bench-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{TRACEBACK_NAME}" if unique else TRACEBACK_NAME
    path = directory / name
    write_text_atomic(text, path)
    setattr(err, TRACEBACK_FILE, path)
    return path


def raised_at(err: BaseException) -> str:
    """`file:line in function` of the frame that raised `err`."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return "an unknown place"
    last = frames[-1]
    return f"{last.filename}:{last.lineno} in {last.name}"


def exit_now(code: int) -> NoReturn:
    """End the process with `code` once its exit handlers have run (Horovod's shutdown, logging's flush and
    close), skipping the interpreter's teardown: TensorFlow's destructors and module cleanup write nothing and
    add 1.5 s (one process) to 2.3 s (2 ranks) to a launch on 2 cores. For `__main__` only, after every file
    the run writes is closed."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
