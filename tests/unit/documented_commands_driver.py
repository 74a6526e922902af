"""One shown command's checks for tests/unit/test_documented_commands.py, in a process of its own:

    python tests/unit/documented_commands_driver.py KIND TARGET SHOWN_JSON

takes the parser TARGET's `main()` builds (without running it), parses every shown argument list, prints
`--help` of each shown subcommand, runs a shown training command with `--dry-run`, and prints
{shown line: why it fails} as JSON, the last line of its output. It imports nothing of pytest, so a
command's process holds what the command imports and little else.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import re
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN_SCRIPTS = ("cosmoflow/train.py", "deepcam/train.py", "cosmoflow.train", "deepcam.train")
_PLAIN = argparse.ArgumentParser.error, argparse.ArgumentParser.exit  # argparse's own, for the dry runs


class _Parser(Exception):
    """Raised from parse_args: the command's parser, taken before main() does anything with its arguments."""

    def __init__(self, parser):
        super().__init__("parser captured")
        self.parser = parser


class _Refused(Exception):
    """argparse's error() or exit(), as an exception instead of the process's end."""


def _take_parser(kind: str, target: str) -> argparse.ArgumentParser:
    """The parser that `target`'s main() builds, from running it until it parses its arguments."""
    def grab(self, *args, **kwargs):
        raise _Parser(self)
    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = grab
    sys.argv = [target]
    try:
        if ":" in target:  # a console script's function
            module, function = target.split(":")
            getattr(importlib.import_module(module), function)()
        elif kind == "script":
            sys.path.insert(0, str((REPO / target).parent))
            runpy.run_path(str(REPO / target), run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except _Parser as taken:
        return taken.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
    raise AssertionError(f"{target} ran without parsing any arguments")


def _relax(parser: argparse.ArgumentParser) -> None:
    """Nothing required, in `parser` and its subcommands: a page may show part of a command, and a missing
    argument must not hide an unknown flag after it."""
    for group in parser._mutually_exclusive_groups:
        group.required = False
    for action in parser._actions:
        action.required = False
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                _relax(sub)
        elif not action.option_strings and action.nargs in (None, "+"):
            action.nargs = "?" if action.nargs is None else "*"


def _parse(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """None when `args` parse, else why not; a placeholder's value (DIR, N, <...>) is no failure."""
    try:
        _, extra = parser.parse_known_args(args)
    except _Refused as refused:
        message = str(refused)
        placeholder = re.search(r"(value|choice): '([A-Z_]+|PLACEHOLDER|[a-z])'", message)
        if message == "exit 0" or placeholder:  # exit 0: a shown --help
            return None
        return message
    unknown = [word for word in extra if re.match(r"--?[A-Za-z]", word)]
    return f"unrecognized flags {unknown}" if unknown else None


def _help(parser: argparse.ArgumentParser, subcommand: list[str]) -> str | None:
    """None when `subcommand --help` prints help and exits 0, else what happened."""
    try:
        parser.parse_known_args([*subcommand, "--help"])
    except _Refused as refused:
        return None if str(refused) == "exit 0" else str(refused)
    return "--help did not exit"


def _dry_run(target: str, args: list[str], ranks: int) -> str | None:
    """None when the shown training command with --dry-run exits 0, else its exit status."""
    sys.argv = [target, *args, "--dry-run", "--ranks", str(ranks)]
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
            if target.endswith(".py"):
                runpy.run_path(str(REPO / target), run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        return None if done.code in (0, None) else f"--dry-run exited {done.code}: {said.getvalue()[-600:]}"
    return None


def _subcommand(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """The shown subcommand (the first argument, when the parser has subcommands), for its --help."""
    has_sub = any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    return args[:1] if has_sub and args and not args[0].startswith("-") else []


def drive(kind: str, target: str, shown: list[dict]) -> dict:
    """Check one command's shown argument lists in this process; returns the problems per shown line."""
    def refuse(self, message):
        raise _Refused(message)

    def leave(self, status=0, message=None):
        raise _Refused(f"exit {status}" if not message else message)
    parser = _take_parser(kind, target)
    _relax(parser)
    argparse.ArgumentParser.error, argparse.ArgumentParser.exit = refuse, leave
    problems, seen = {}, {}
    for item in shown:
        key = json.dumps([item["args"], item["ranks"]])
        if key in seen:  # the same arguments shown again
            if seen[key]:
                problems[item["line"]] = seen[key]
            continue
        sub = _subcommand(parser, item["args"])
        why = _parse(parser, item["args"]) or _help(parser, sub)
        if why is None and _dry_runnable(target, item["args"]):
            argparse.ArgumentParser.error, argparse.ArgumentParser.exit = _PLAIN
            why = _dry_run(target, item["args"], item["ranks"])
            argparse.ArgumentParser.error, argparse.ArgumentParser.exit = refuse, leave
        seen[key] = why
        if why:
            problems[item["line"]] = why
    return problems


def _dry_runnable(target: str, args: list[str]) -> bool:
    """A shown training command with its config, not elastic (whose dry run needs the elastic launcher)."""
    return (target in TRAIN_SCRIPTS and bool(args) and args[0].endswith(".yaml")
            and "dist.elastic.enabled=true" not in args)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    import common.base.cli
    common.base.cli.exit_now = sys.exit  # the commands run in this process, which prints the verdict after them
    print(json.dumps(drive(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))))
