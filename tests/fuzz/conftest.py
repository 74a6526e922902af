"""Print how many inputs each fuzz target tried (and write them as JSON when FUZZ_REPORT is set)."""
from __future__ import annotations

import os

from tests.fuzz.harness import TALLY


def pytest_terminal_summary(terminalreporter):
    if not TALLY.counts:
        return
    terminalreporter.section("fuzz inputs tried")
    for line in TALLY.lines():
        terminalreporter.write_line(line)
    if os.environ.get("FUZZ_REPORT"):
        TALLY.write(os.environ["FUZZ_REPORT"])
