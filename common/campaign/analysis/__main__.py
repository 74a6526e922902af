"""Command line of common.campaign.analysis (see its docstring)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common.campaign.analysis import __doc__ as DOC
from common.base.cli import guarded
from common.base.errors import BenchError


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
        p.add_argument("paths", nargs="+", help="run or campaign directories")
        p.add_argument("--predict", type=target, action="append", default=[], metavar="BENCH:UNITS:BATCH")
        if name == "report":
            p.add_argument("--out", required=True, help="the report directory (replaced)")
        if name == "runs":
            p.add_argument("--csv", help="write the table to this CSV file instead of printing it")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)

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
        else:
            built = report.build(runs, args.predict)
            built.sections += searches(args.paths)
            out = report.write(built, runs, epochs, Path(args.out), args.paths)
            print(f"wrote {out / 'report.html'}, {out / 'summary.md'} and {len(list((out / 'figures').iterdir()))} "
                  f"figures")
        return 0

    return guarded(run)


if __name__ == "__main__":
    sys.exit(main())
