"""The one reader of MLPerf logs: `:::MLLOG {json}` lines, as the suite writes them and as published results hold.

A log may hold other lines (a launcher's output, a site's banners, "Total time taken = ..."), and a log still
being written may end in half a line: the tolerant reading skips both. The strict reading (for logs a report
or a record is built from) refuses a `:::MLLOG` line whose JSON does not parse, naming the file and the line.
"""
from __future__ import annotations

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


def parse_lines(lines: Iterable[str], source: str = "", strict: bool = False) -> list[dict]:
    """The events of `lines`, in order. strict: a `:::MLLOG` line that is no JSON object is a BenchError
    naming `source` and the line number; otherwise it is skipped."""
    events = []
    for number, line in enumerate(lines, 1):
        event = parse_line(line)
        if event is not None:
            events.append(event)
        elif strict and PREFIX in line:
            raise BenchError(f"{source}:{number}: not a JSON MLPerf event: {line.strip()[:120]!r}")
    return events


def read_events(log: str | Path, strict: bool = False) -> list[dict]:
    """The events of the log file `log`, in order (see `parse_lines`); an unreadable file is a BenchError."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError as err:
        raise BenchError(f"{log}: cannot read the MLPerf log ({err})") from None
    return parse_lines(text.splitlines(), str(log), strict)


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
