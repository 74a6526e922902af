"""A train.py's command line: `python <benchmark>/train.py CONFIG [key=value ...] [--dry-run [--json] [--ranks N]]`.

`main` parses it and runs `train(config, overrides, stop)` under `guarded_run` (the stop signals handled from
the first moment, a BenchError turned into exit code 2, a stop before run_start into exit code 75), or with
--dry-run prints the plan of the run (common/runtime/plan.py). The run itself: common/runtime/run.py.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from common.base import exits
from common.base.cli import guarded
from common.runtime.dist import StopRequests, StoppedBeforeStart
from common.runtime.run import App, choose_strategy


def parse_args(description: str, argv=None) -> argparse.Namespace:
    """`train.py CONFIG [key=value ...] [--dry-run [--json] [--ranks N]]`."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="YAML config, e.g. <benchmark>/configs/*.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides such as train.max_epochs=4")
    parser.add_argument("--dry-run", action="store_true",
                        help="resolve the run (config, RCP, ranks, global batch, division, learning rates), print "
                             "it and exit 0 without reading data or training")
    parser.add_argument("--json", action="store_true", help="with --dry-run: print one JSON object")
    parser.add_argument("--ranks", type=int, default=None,
                        help="with --dry-run: plan this many ranks (default: the launched ones)")
    args = parser.parse_args(argv)
    if (args.json or args.ranks is not None) and not args.dry_run:
        parser.error("--json and --ranks go with --dry-run")
    return args


def main(app: App, description: str, train: Callable[[str, list, StopRequests], int], argv=None) -> int:
    """A train.py's command line: `train(config, overrides, stop)`, or with --dry-run the plan of the run."""
    args = parse_args(description, argv)
    if args.dry_run:
        from common.runtime.plan import dry_run  # only a dry run loads it
        strategy = app.strategy or choose_strategy
        return guarded(lambda: dry_run(app, strategy, args.config, args.overrides, args.ranks, args.json))
    return guarded_run(lambda stop: train(args.config, args.overrides, stop))  # stop signals handled first


def guarded_run(train: Callable[[StopRequests], int]) -> int:
    """A train entry point's run: `train(stop)` with the stop signals handled from the first moment (a signal
    during start-up is remembered, not fatal); returns its exit code, 2 for a BenchError, 75 for a
    stop before run_start, 4 for any other exception (each with a message on stderr)."""
    stop = StopRequests().install()
    try:
        return guarded(lambda: _until_stopped(train, stop))
    finally:
        stop.uninstall()


def _until_stopped(train: Callable[[StopRequests], int], stop: StopRequests) -> int:
    try:
        return train(stop)
    except StoppedBeforeStart as err:
        print(f"stopped: {err}", file=sys.stderr, flush=True)
        return exits.STOPPED
