"""Command line of common.campaign.analysis (see its docstring)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common.campaign.analysis import __doc__ as DOC
from common.base.cli import guarded
from common.base.errors import BenchError
from common.campaign.rules import ROUNDS


def target(text: str) -> tuple[str, int, int]:
    """BENCH:UNITS:BATCH, e.g. cosmoflow:4:16."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit() or int(parts[1]) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected BENCHMARK:UNITS:GLOBAL_BATCH, e.g. cosmoflow:4:16")
    return parts[0], int(parts[1]), int(parts[2])


def searches(paths: list[str]) -> list:
    """A report section for each hyperparameter search among `paths` (a directory with hpo.json, docs/hpo.md)."""
    found = [Path(p) for p in paths if (Path(p) / "hpo.json").is_file()]
    if not found:
        return []
    from common.hpo.report import analysis_section
    return [analysis_section(p) for p in found]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m common.campaign.analysis", description=DOC,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("report", "write the HTML report, Markdown summary, figures and CSV tables"),
                       ("runs", "print (or save) the table of runs"),
                       ("predict", "predict time to solution at the given configurations")):
        p = sub.add_parser(name, help=text)
        p.add_argument("paths", nargs="+", help="run or campaign directories" + (
            "; for report also published submission trees (a round's or a submitter's folder)" if name == "report"
            else ""))
        p.add_argument("--predict", type=target, action="append", default=[], metavar="BENCH:UNITS:BATCH")
        if name == "report":
            p.add_argument("--out", required=True, help="the report directory (replaced)")
            p.add_argument("--round", choices=ROUNDS, help="the round of published trees among the paths (else a "
                                                           "folder named hpc_results_vX.Y in their path)")
        if name == "runs":
            p.add_argument("--csv", help="write the table to this CSV file instead of printing it")
    p = sub.add_parser("scores", help="score published MLPerf HPC results trees (or campaigns) as the rules do")
    p.add_argument("paths", nargs="+", metavar="ROOT",
                   help="a results round's folder (submitters below it), one submitter's folder, or a campaign")
    p.add_argument("--round", choices=ROUNDS, help="the round of the logs (else a folder named hpc_results_vX.Y "
                                                   "in ROOT's path)")
    p.add_argument("--json", action="store_true", help="print a JSON list of rows instead of the table")
    p.add_argument("--check", action="store_true", help="also run mlperf-logging's compliance checker on every "
                                                        "result file (timed apart)")
    return parser.parse_args(argv)


def scores(args: argparse.Namespace) -> int:
    """The scores subcommand: rows on stdout, warnings and timings on stderr; writes nothing."""
    import json
    from common.campaign.analysis import scores as scoring
    result = scoring.score_roots([Path(p) for p in args.paths], args.round, args.check)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    print(json.dumps([r.as_json() for r in result.rows], indent=1) if args.json else scoring.table(result.rows))
    rate = result.megabytes / result.read_seconds if result.read_seconds > 0 else float("inf")
    print(f"{len(result.rows)} submissions, {result.megabytes:.1f} MB of logs read and scored in "
          f"{result.read_seconds:.2f} s ({rate:.1f} MB/s), {len(result.warnings)} warnings"
          + (f"; compliance checker {result.check_seconds:.1f} s" if result.check_seconds is not None else ""),
          file=sys.stderr, flush=True)
    return 0


def write_report(args: argparse.Namespace) -> int:
    """The report subcommand: the runs' analyses of run and campaign directories, and the published submissions
    and the campaigns scored together on the paper's axes (common/campaign/analysis/standing.py)."""
    import pandas as pd
    from common.campaign.analysis import report, standing
    from common.campaign.analysis.logs import load_runs
    from common.campaign.analysis.published import is_tree
    from common.campaign.analysis.scores import score_roots
    paths = [Path(p) for p in args.paths]
    trees = [p for p in paths if is_tree(p)]
    own = [p for p in paths if p not in trees]
    runs, epochs = load_runs(own) if own else (pd.DataFrame(), pd.DataFrame())
    print(f"{len(runs)} runs, {len(epochs)} epochs read from {', '.join(map(str, own)) or 'no run directory'}",
          flush=True)
    built = report.build(runs, args.predict) if own else report.Report([], [])
    built.sections += searches(args.paths)
    scored = [p for p in trees + own if p in trees or (p / "campaign.json").is_file()]
    result = score_roots(scored, args.round) if scored else None
    for kind, lines in (("warning", result.warnings), ("note", result.notes)) if result else ():
        for line in lines:
            print(f"{kind}: {line}", file=sys.stderr)
    table = standing.submissions(result) if result else pd.DataFrame()
    built.sections = standing.sections(table) + built.sections  # where this machine stands comes first
    out = report.write(built, runs, epochs, Path(args.out), args.paths, table)
    print(f"wrote {out / 'report.html'}, {out / 'summary.md'} and {len(list((out / 'figures').iterdir()))} figures"
          + (f" ({len(table)} submissions scored)" if len(table) else ""))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.command == "scores":
        return guarded(lambda: scores(args))
    if args.command == "report":
        return guarded(lambda: write_report(args))

    def run() -> int:
        from common.campaign.analysis import report
        from common.campaign.analysis.logs import load_runs
        from common.campaign.analysis.predict import predict
        runs, epochs = load_runs(args.paths)
        print(f"{len(runs)} runs, {len(epochs)} epochs read from {', '.join(args.paths)}", flush=True)
        if args.command == "runs":
            if args.csv:
                runs.to_csv(args.csv, index=False)
                print(f"wrote {args.csv}")
            else:
                print(runs.drop(columns=["run"]).to_string(index=False))
        elif args.command == "predict":
            if not args.predict:
                raise BenchError("predict: give at least one --predict BENCH:UNITS:BATCH")
            print(report.prediction_table([predict(runs, *t) for t in args.predict]).to_string(index=False))
        return 0

    return guarded(run)


if __name__ == "__main__":
    sys.exit(main())
