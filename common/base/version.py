"""The code version a result was measured with: the suite's commit and the files that differ from it."""
from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def code_version(paths: tuple[str, ...] = ()) -> dict:
    """The suite's commit and the tracked files (below `paths`, default all) that differ from it (the
    submission's or a benchmark's code version)."""
    def git(*args) -> str:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return proc.stdout if proc.returncode == 0 else ""
    # "XY path" lines, X a space for a change not staged: the line must not be stripped before slicing
    status = git("status", "--porcelain", "--untracked-files=no", "--", *paths)
    return {"commit": git("rev-parse", "HEAD").strip() or "unknown (not a git checkout)",
            "modified": [line[3:] for line in status.splitlines()]}
