"""Whether two runs give the same metric at every evaluation (issue 46's behaviour check), saved as JSON.

    python benchmarks/same_metrics.py --label BEFORE RUN_A --label AFTER RUN_B [--out FILE]
    python benchmarks/same_metrics.py --recorded FILE.json BEFORE --label AFTER RUN_B [--out FILE]

`--recorded` takes a run from an earlier comparison's JSON (this script's output) by its label, for a commit
whose run directory is gone.

Reads each run directory's mlperf.log: the quality metric (eval_error for CosmoFlow, eval_accuracy for DeepCAM)
with its epoch_num at every evaluation, the run's status and its time to train. Exit 0 when every evaluation of
the two runs gives the same value (exactly, as float64 from the logs), 1 when not, 2 for a run without a log.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

METRICS = ("eval_error", "eval_accuracy")


def evaluations(run: Path) -> dict:
    """The run's metric at each evaluation, its status and its run_start .. run_stop seconds."""
    from common.base.errors import BenchError
    from common.base.mlperf_log import events_by_key, read_events
    log = run / "mlperf.log"
    if not log.is_file():
        raise BenchError(f"{run}: no mlperf.log (not a run directory)")
    events = read_events(log, strict=True)
    evals = [e for e in events if e.get("key") in METRICS]
    start, stop = events_by_key(events, "run_start"), events_by_key(events, "run_stop")
    seconds = (stop[-1]["time_ms"] - start[-1]["time_ms"]) / 1e3 if start and stop else None
    return {"run": str(run), "metric": evals[0]["key"] if evals else None,
            "evaluations": [[e["metadata"]["epoch_num"], e["value"]] for e in evals],
            "status": stop[-1]["metadata"].get("status") if stop else None, "run_seconds": seconds}


def recorded(path: Path, label: str) -> dict:
    """The run labelled `label` in an earlier comparison's JSON."""
    from common.base.errors import BenchError
    try:
        runs = json.loads(path.read_text())["runs"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BenchError(f"{path}: not a same_metrics.py result ({err})") from None
    if label not in runs:
        raise BenchError(f"{path}: no run labelled {label!r}; it has {sorted(runs)}")
    return runs[label] | {"recorded_in": str(path)}


def compare(runs: dict[str, Path], earlier: dict[str, dict] | None = None) -> dict:
    found = dict(earlier or {}) | {label: evaluations(path) for label, path in runs.items()}
    series = [r["evaluations"] for r in found.values()]
    return {"runs": found, "same_metric_at_every_evaluation": all(s == series[0] for s in series)}


def main(argv=None) -> int:
    from common.base.cli import guarded
    from harness import run_header, write_json_atomic
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", nargs=2, action="append", metavar=("LABEL", "RUN_DIR"), required=True,
                        help="a name for the run (e.g. the commit) and its run directory")
    parser.add_argument("--recorded", nargs=2, action="append", default=[], metavar=("JSON", "LABEL"),
                        help="a run from an earlier comparison's JSON, by its label")
    parser.add_argument("--out", type=Path, help="write the comparison here as JSON")
    args = parser.parse_args(argv)
    if len(args.label) + len(args.recorded) < 2:
        parser.error("give at least two runs (--label LABEL RUN_DIR, --recorded JSON LABEL)")

    def run() -> int:
        earlier = {label: recorded(Path(path), label) for path, label in args.recorded}
        result = run_header(0.0) | compare({label: Path(path) for label, path in args.label}, earlier)
        for label, r in result["runs"].items():
            print(f"{label}: {r['status']}, {r['run_seconds']} s, {r['metric']} at each evaluation: "
                  + ", ".join(f"epoch {e} {v}" for e, v in r["evaluations"]))
        print("same metric at every evaluation:", result["same_metric_at_every_evaluation"])
        if args.out:
            write_json_atomic(args.out, result)
            print(f"wrote {args.out}")
        return 0 if result["same_metric_at_every_evaluation"] else 1
    return guarded(run)


if __name__ == "__main__":
    sys.exit(main())
