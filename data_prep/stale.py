"""Shared by the generators: HDF5 attributes as plain values, and clean-up of dead runs' temporaries.

A generator writes `.name.tmp-<pid>` and renames it when complete; a temporary whose process is
gone belongs to an interrupted run and is removed before a rerun.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np


def plain(value):
    """An HDF5 attribute as a Python value (numpy scalars, bytes)."""
    if isinstance(value, bytes):
        return value.decode()
    return value.item() if isinstance(value, np.generic) else value


def remove_stale_temporaries(directory: Path, pattern: re.Pattern) -> int:
    """Delete temporaries (`pattern` captures the writer's pid) of runs no longer alive; return the count."""
    removed = 0
    for path in directory.iterdir():
        match = pattern.match(path.name)
        if match and not pid_alive(int(match.group(1))):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return pid != os.getpid()  # our own temporaries are never in flight between runs
