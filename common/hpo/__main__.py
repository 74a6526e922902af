"""Command line of the hyperparameter search (see common/hpo/__init__.py)."""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from common.base.cli import guarded
from common.base.errors import BenchError
from common.campaign.spec import DEFAULT_LAUNCHER
from common.hpo import __doc__ as DOC


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m common.hpo", description=DOC,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or go on with) a search, then write its report")
    run.add_argument("space", help="the search space YAML (docs/hpo.md)")
    run.add_argument("overrides", nargs="*", help="config overrides for every trial, after the space's own (a job's "
                                                  "data and Horovod settings); not a searched key, run.seed or "
                                                  "run.output_dir")
    run.add_argument("--out", required=True, help="the study's directory")
    run.add_argument("--trials", type=int, default=10, help="finished trials the study should hold (default 10)")
    run.add_argument("--np", type=int, default=2, help="ranks per trial (default 2)")
    run.add_argument("--launcher", default=DEFAULT_LAUNCHER,
                     help="how a trial is launched; {np}, {run} and {python} are filled in (default: %(default)s)")
    run.add_argument("--python", default="", help="the trainings' interpreter (default: this one)")
    run.add_argument("--storage", default="", help="an Optuna storage URL (default: OUT/journal.log)")
    run.add_argument("--stale-minutes", type=float, default=10.0,
                     help="a running trial whose worker has been silent this long is run again (default 10)")
    run.add_argument("--stage-dir", default="",
                     help="node-local directory; each trial of this worker stages below it (DIR/run_<n>)")
    report = sub.add_parser("report", help="(re)write trials.csv, best/*.yaml, report.md and figures")
    report.add_argument("out", help="the study's directory")
    # Overrides may also follow the options (argparse alone would refuse positionals after them).
    args, extra = parser.parse_known_args(argv)
    if extra and (args.command != "run" or any(e.startswith("-") or "=" not in e for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "run":
        args.overrides = (*args.overrides, *extra)
    return args


def _exit_on_sigterm(signum, frame) -> None:
    # Once: a job's shell may pass on the TERM the scheduler also sends here, and a second one must not cut
    # short the unwinding (the running training stopped, its trial failed and queued again).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)

    def run() -> int:
        from common.hpo.report import write_report
        from common.hpo.space import load_space
        from common.hpo.study import StudySettings, open_study, read_study, run_study, saved_settings
        if args.command == "report":
            space, settings = saved_settings(Path(args.out))
            study = read_study(Path(args.out), settings)
            launch = settings.launch
            print(f"wrote {write_report(study, space, Path(args.out), launch.ranks, launch.overrides)}")
            return 0
        if args.trials < 1 or args.np < 1 or args.stale_minutes <= 0:
            raise BenchError(f"--trials {args.trials}, --np {args.np}, --stale-minutes {args.stale_minutes}: "
                             f"expected positive numbers")
        from common.hpo.trial import Launch
        space, out = load_space(args.space, args.np, args.overrides), Path(args.out)
        launch = Launch(args.np, args.launcher, args.python, args.overrides, args.stage_dir)
        settings = StudySettings(trials=args.trials, launch=launch, storage=args.storage,
                                 stale_minutes=args.stale_minutes)
        print(f"study {out}: {space.benchmark}, {len(space.params)} parameters, {args.trials} trials of "
              f"{args.np} ranks, objective {space.objective} to the target", flush=True)
        run_study(space, out, settings)
        print(f"wrote {write_report(open_study(space, out, settings), space, out, args.np, args.overrides)}")
        return 0

    return guarded(run)


if __name__ == "__main__":
    sys.exit(main())
