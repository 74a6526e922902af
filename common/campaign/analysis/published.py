"""Submission trees as MLPerf HPC publishes them (github.com/mlcommons/hpc_results_v<round>), read tolerantly.

Layout: `<submitter>/results/<system>/<strong|weak>/<benchmark>/result_<i>.txt` (round 0.7 has no strong/weak
level: `<submitter>/results/<system>/<benchmark>/result_<i>.txt`, all strong scaling) and
`<submitter>/systems/<system>.json`. One result file is one run (strong) or one instance (weak). These are
documents the suite does not write, so nothing in them stops the reading: a non-JSON record, an event without a
key or a numeric time, a value of the wrong type, an empty or truncated file, a missing or odd system JSON
become warnings naming the file (and line) and are skipped. A suite campaign (OUT/campaign.json) is read the same
way: its runs' mlperf.log files are its result files (round 3.0, the suite's ruleset).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

from common.base import mlperf_log
from common.base.errors import BenchError
from common.campaign import rules
from common.campaign.analysis.logs import intervals

RESULTS, SYSTEMS = "results", "systems"
SCALINGS = ("strong", "weak")
ROUND_FOLDER = re.compile(r"hpc_results_v(\d+\.\d+)$")
RESULT_FILE = re.compile(r"result_(\d+)\.txt$")
CAMPAIGN_ROUND = "3.0"  # the suite's campaigns are scored with ruleset 3.0.0 (common/campaign/scoring.py)


def tolerant_int(value: Any) -> int | None:
    """A count as a system JSON or a log spells it: 16, "16", "16.0" -> 16; "", "N/A", "2x", -1, inf, None -> None."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value == int(value)):
        return None
    return int(value) if value >= 0 else None


@dataclasses.dataclass(frozen=True)
class SystemDesc:
    """The fields of `<submitter>/systems/<system>.json` the scores use (None: absent or not a number)."""

    name: str
    division: str | None = None
    nodes: int | None = None
    accelerators_per_node: int | None = None
    processors_per_node: int | None = None

    @property
    def accelerators(self) -> int | None:
        return None if self.nodes is None or self.accelerators_per_node is None \
            else self.nodes * self.accelerators_per_node

    @property
    def processors(self) -> int | None:
        return None if self.nodes is None or self.processors_per_node is None \
            else self.nodes * self.processors_per_node


def read_system(path: Path, warnings: list[str]) -> SystemDesc:
    """The system description at `path`; what is missing or unreadable is None, with a warning."""
    name = path.stem
    try:
        desc = json.loads(path.read_bytes().decode("utf-8", errors="replace"))
    except (OSError, ValueError) as err:
        warnings.append(f"{path}: no readable system description ({err}); its counts are unknown")
        return SystemDesc(name)
    if not isinstance(desc, dict):
        warnings.append(f"{path}: a JSON {type(desc).__name__}, expected an object; its counts are unknown")
        return SystemDesc(name)
    division = desc.get("division")
    return SystemDesc(name, division if division in ("closed", "open") else None, tolerant_int(desc.get(
        "number_of_nodes")), tolerant_int(desc.get("accelerators_per_node")),
        tolerant_int(desc.get("host_processors_per_node")))


@dataclasses.dataclass
class Submission:
    """One (submitter, system, benchmark, scaling): its result files in index order."""

    submitter: str
    system: SystemDesc
    benchmark: str
    scaling: str  # strong | weak
    round: str
    folder: Path
    results: list[Path]


def infer_round(root: Path, given: str | None) -> str:
    """--round, else a folder of ROOT's path named like hpc_results_vX.Y; else a BenchError asking for it."""
    if given is not None:
        rules.ruleset(given)  # a BenchError for a round it does not know
        return given
    for part in reversed(root.resolve().parts):
        found = ROUND_FOLDER.search(part)
        if found and found.group(1) in rules.ROUNDS:
            return found.group(1)
    raise BenchError(f"{root}: the logs do not name their round and no folder of this path is named "
                     f"hpc_results_vX.Y; pass --round (one of {', '.join(rules.ROUNDS)})")


def result_files(folder: Path) -> list[Path]:
    """The result_<i>.txt files of a benchmark folder, by index."""
    found = [p for p in folder.iterdir() if RESULT_FILE.fullmatch(p.name) and p.is_file()]
    return sorted(found, key=lambda p: int(RESULT_FILE.fullmatch(p.name).group(1)))


def _benchmark_folders(system_dir: Path) -> list[tuple[str, Path]]:
    """(scaling, folder) of each benchmark of a system: below strong/ and weak/, or directly (round 0.7)."""
    scaled = [(s, d) for s in SCALINGS if (system_dir / s).is_dir() for d in sorted((system_dir / s).iterdir())]
    if scaled:
        return [(s, d) for s, d in scaled if d.is_dir()]
    return [("strong", d) for d in sorted(system_dir.iterdir()) if d.is_dir()]


def submitter_submissions(folder: Path, round_: str, warnings: list[str]) -> list[Submission]:
    """The submissions of one submitter's folder (holding results/ and systems/)."""
    found = []
    for system_dir in sorted(d for d in (folder / RESULTS).iterdir() if d.is_dir()):
        system = read_system(folder / SYSTEMS / f"{system_dir.name}.json", warnings)
        for scaling, bench_dir in _benchmark_folders(system_dir):
            files = result_files(bench_dir)
            if files:
                found.append(Submission(folder.name, system, bench_dir.name, scaling, round_, bench_dir, files))
            else:
                warnings.append(f"{bench_dir}: no result_<i>.txt files; left out")
    return found


def campaign_submission(folder: Path) -> Submission:
    """A suite campaign as one submission: its runs' mlperf.log files, the spec's benchmark, mode and system."""
    from common.campaign.spec import load_spec, run_dir
    spec = load_spec(folder)
    files = [run_dir(folder, i) / "mlperf.log" for i in range(spec.count)]
    return Submission(folder.name, SystemDesc(spec.system), spec.benchmark,
                      "weak" if spec.mode == "throughput" else "strong", CAMPAIGN_ROUND, folder, files)


def is_tree(root: Path) -> bool:
    """Whether ROOT is a submission tree: a submitter's folder (results/ in it) or a round's (submitters below);
    a campaign of the suite's own (campaign.json) is not, although it holds its submission/ layout."""
    if not root.is_dir() or (root / "campaign.json").is_file():
        return False
    return (root / RESULTS).is_dir() or any((d / RESULTS).is_dir() for d in root.iterdir() if d.is_dir())


def find_submissions(root: Path, round_: str | None, warnings: list[str]) -> list[Submission]:
    """Every submission under ROOT: a round's folder (submitters below it), one submitter's folder, or a suite
    campaign. A ROOT that is none of them is a BenchError."""
    if not root.is_dir():
        raise BenchError(f"{root}: not a directory (expected a results round's folder, a submitter's folder or a "
                         f"campaign)")
    if (root / "campaign.json").is_file():
        return [campaign_submission(root)]
    if (root / RESULTS).is_dir():
        return submitter_submissions(root, infer_round(root, round_), warnings)
    submitters = sorted(d for d in root.iterdir() if (d / RESULTS).is_dir())
    if not submitters:
        raise BenchError(f"{root}: holds no <submitter>/results/ folder, no results/ folder and no campaign.json "
                         f"(expected a results round's folder, a submitter's folder or a campaign)")
    round_ = infer_round(root, round_)
    return [s for d in submitters for s in submitter_submissions(d, round_, warnings)]


# ---------------------------------------------------------------------------- one result file
@dataclasses.dataclass
class RunLog:
    """What one result file says, as far as it says it (None: not logged)."""

    path: Path
    size: int
    warnings: list[str]
    values: dict[str, Any]  # the first value of each key that is not a timed event
    run_start: float | None = None  # ms
    run_stop: float | None = None
    status: str | None = None
    evals: dict[str, list[tuple[float | None, float]]] = dataclasses.field(default_factory=dict)  # key: (epoch, v)
    epochs: list[tuple[Any, float, float]] = dataclasses.field(default_factory=list)  # (epoch_num, ms, ms)
    eval_spans: list[tuple[Any, float, float]] = dataclasses.field(default_factory=list)
    staging_ms: float | None = None
    staging_start: float | None = None  # ms: before run_start where staging is in init (untimed), after it where timed

    def count(self, key: str) -> int | None:
        """A logged count (number_of_nodes, train_samples, ...) as an int, None when absent or not a number."""
        return tolerant_int(self.values.get(key))


TIMED = ("run_start", "run_stop", "staging_start", "staging_stop", "epoch_start", "epoch_stop", "eval_start",
         "eval_stop")
METRICS = ("eval_error", "eval_accuracy")


def _is_number(value: Any) -> bool:
    """A finite JSON number (not a bool, NaN or infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _clean_events(read: mlperf_log.LogRead, path: Path, warnings: list[str]) -> list[dict]:
    """The events with a string key and a numeric time_ms (metadata made a dict); the others are warned of."""
    clean = []
    for event, number in zip(read.events, read.numbers):
        if not isinstance(event.get("key"), str) or not _is_number(event.get("time_ms")):
            warnings.append(f"{path}:{number}: an event without a string key and a numeric time_ms, skipped: "
                            f"key {event.get('key')!r}, time_ms {event.get('time_ms')!r}")
            continue
        if not isinstance(event.get("metadata"), dict):
            event["metadata"] = {}
        epoch = event["metadata"].get("epoch_num")
        if epoch is not None and not _is_number(epoch):
            warnings.append(f"{path}:{number}: epoch_num {epoch!r} is not a number, ignored")
            del event["metadata"]["epoch_num"]
        clean.append(event)
    return clean


def _add_event(run: RunLog, event: dict, starts: dict) -> None:
    key, value, meta = event["key"], event.get("value"), event["metadata"]
    if key in METRICS:
        if _is_number(value):
            epoch = meta.get("epoch_num")
            run.evals.setdefault(key, []).append((epoch if _is_number(epoch) else None, float(value)))
        else:
            run.warnings.append(f"{run.path}: {key} {value!r} at {event['time_ms']} ms is not a number, skipped")
    elif key == "run_stop":
        if run.run_stop is None:
            run.run_stop, run.status = float(event["time_ms"]), str(meta.get("status", ""))
    elif key in ("run_start", "staging_start"):
        starts.setdefault(key, float(event["time_ms"]))
    elif key == "staging_stop" and "staging_start" in starts and run.staging_ms is None:
        run.staging_ms = float(event["time_ms"]) - starts["staging_start"]
        run.staging_start = starts["staging_start"]
    elif key not in TIMED:
        run.values.setdefault(key, value)


def read_run(path: Path) -> RunLog:
    """One result file, tolerantly: an empty, unreadable or truncated file gives a RunLog with warnings."""
    warnings: list[str] = []
    try:
        size = path.stat().st_size
        read = mlperf_log.read_log(path) if size else mlperf_log.LogRead([], [], [])
    except (OSError, BenchError) as err:
        return RunLog(path, 0, [f"{path}: cannot read it ({err})"], {})
    run = RunLog(path, size, warnings, {})
    warnings += [str(s) for s in read.skipped]
    if not size:
        warnings.append(f"{path}: empty file")
        return run
    events, starts = _clean_events(read, path, warnings), {}
    for event in events:
        _add_event(run, event, starts)
    run.run_start = starts.get("run_start")
    run.epochs = intervals(events, "epoch_start", "epoch_stop")
    run.eval_spans = intervals(events, "eval_start", "eval_stop")
    if not events:
        warnings.append(f"{path}: no :::MLLOG events")
    return run
