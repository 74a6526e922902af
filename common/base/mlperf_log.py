"""The one reader of MLPerf logs: `:::MLLOG {json}` lines, as the suite writes them and as published results hold.

A log may hold other lines (a launcher's output, a site's banners, "Total time taken = ..."), and a log still
being written may end in half a line: the tolerant reading skips both. The strict reading (for logs a report
or a record is built from) refuses a `:::MLLOG` line whose JSON does not parse, naming the file and the line.
`read_log` is the tolerant reading that also says what it skipped (file, line number, text) and on which line
each event stands, for readers of logs the suite did not write (published results, common/campaign/analysis).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterable

from common.base.errors import BenchError

PREFIX = ":::MLLOG "


def parse_line(line: str) -> dict | None:
    """The event of one log line; None for a line without `:::MLLOG ` or whose JSON is not an object."""
    event = _decode(line)
    return event if isinstance(event, dict) else None


def _decode(line: str) -> Any:
    """The JSON after the prefix (which a launcher may have put a rank tag before); None without one."""
    at = line.find(PREFIX)
    if at < 0:
        return None
    try:
        return json.loads(line[at + len(PREFIX):])
    except json.JSONDecodeError:
        return None


@dataclasses.dataclass(frozen=True)
class SkippedLine:
    """A `:::MLLOG` line that is no JSON object (a broken record, a half-written last line)."""

    source: str
    number: int  # 1-based line number
    text: str

    def __str__(self) -> str:
        return f"{self.source}:{self.number}: not a JSON MLPerf event, skipped: {self.text.strip()[:120]!r}"


@dataclasses.dataclass(frozen=True)
class LogRead:
    """A tolerant reading: the events in order, the line number of each, and the lines skipped."""

    events: list[dict]
    numbers: list[int]  # numbers[i]: the line events[i] stands on
    skipped: list[SkippedLine]


def scan_lines(lines: Iterable[str], source: str = "") -> LogRead:
    """The events of `lines` with their line numbers, and the `:::MLLOG` lines that are no JSON object."""
    events, numbers, skipped = [], [], []
    for number, line in enumerate(lines, 1):
        if PREFIX not in line:
            continue
        event = parse_line(line)
        if event is None:
            skipped.append(SkippedLine(source, number, line))
        else:
            events.append(event)
            numbers.append(number)
    return LogRead(events, numbers, skipped)


def parse_lines(lines: Iterable[str], source: str = "", strict: bool = False) -> list[dict]:
    """The events of `lines`, in order. strict: a `:::MLLOG` line that is no JSON object is a BenchError
    naming `source` and the line number; otherwise it is skipped."""
    read = scan_lines(lines, source)
    if strict and read.skipped:
        bad = read.skipped[0]
        raise BenchError(f"{source}:{bad.number}: not a JSON MLPerf event: {bad.text.strip()[:120]!r}")
    return read.events


def _text(log: str | Path) -> str:
    try:
        return Path(log).read_bytes().decode("utf-8", errors="replace")
    except OSError as err:
        raise BenchError(f"{log}: cannot read the MLPerf log ({err})") from None


def read_events(log: str | Path, strict: bool = False) -> list[dict]:
    """The events of the log file `log`, in order (see `parse_lines`); an unreadable file is a BenchError."""
    return parse_lines(_text(log).splitlines(), str(log), strict)


def read_log(log: str | Path) -> LogRead:
    """The tolerant reading of the log file `log` (see `scan_lines`); an unreadable file is a BenchError."""
    return scan_lines(_text(log).splitlines(), str(log))


def events_by_key(events: Iterable[dict], key: str) -> list[dict]:
    """The events with this key, in order."""
    return [e for e in events if e.get("key") == key]


def first_value(events: Iterable[dict], key: str, default: Any = None) -> Any:
    """The value of the first event with this key; `default` when there is none."""
    return next((e.get("value") for e in events if e.get("key") == key), default)


def metadata(event: dict) -> dict:
    """The event's metadata (an empty dict where it has none, or one that is not an object)."""
    meta = event.get("metadata")
    return meta if isinstance(meta, dict) else {}
