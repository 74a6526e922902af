"""Every command README.md and docs/*.md show, in code blocks or backticks, still exists with the flags shown.

A shown command is `python -m MODULE ...`, `python SCRIPT.py ...`, a console script of setup.py (`sciml-...`),
`data_prep ...`, `jobs render ...` or `make TARGET`, after any environment assignments, `time`, `nice` and
launcher (`horovodrun ... python ...`). For each module or script one subprocess (this file run as a script)
takes the parser its `main()` builds, without running it: it parses every shown argument list of that command
(an unknown flag or a renamed subcommand fails), prints `--help` of each shown subcommand, and for the training
scripts runs the shown command with `--dry-run`. `make TARGET` must be a target of the Makefile.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import re
import runpy
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
TICKS = re.compile(r"`([^`\n]+)`")
START = re.compile(r"(?<![\w/.-])(?:\S*python3? (?:-m \S+|\S+\.py)|make [\w-]+|sciml-[\w-]+|data_prep [\w-]+|"
                   r"jobs render)(?=\s|$)")
# Modules the docs show that belong to other projects: their flags are not this suite's to keep.
FOREIGN = ("pytest", "mlperf_logging.compliance_checker")
# Shown modules whose main() takes no arguments (running it is the command: it is only checked to exist).
NO_ARGUMENTS = ("jobs.docs",)
TRAIN_SCRIPTS = ("cosmoflow/train.py", "deepcam/train.py", "cosmoflow.train", "deepcam.train")


def entry_points() -> dict[str, str]:
    """setup.py's console scripts: name -> "module:function"."""
    return dict(re.findall(r'"(sciml-[\w-]+)=([\w.]+:\w+)"', (REPO / "setup.py").read_text()))


def shown_lines() -> list[tuple[str, str]]:
    """(page, text) of every code-block line and backticked span of the pages that holds a command."""
    found = []
    for page in PAGES:
        text = page.read_text()
        spans = [line for block in FENCE.findall(text) for line in re.sub(r"\\\n\s*", " ", block).splitlines()]
        spans += TICKS.findall(FENCE.sub("", text))
        for span in spans:
            if START.search(span):
                found.append((page.name, span.split(" #")[0].strip()))
    return found


def tokens_of(line: str) -> list[str]:
    """The line's words, placeholders (<...>) as one word, optional groups ([--flag X]) opened, '...' dropped."""
    text = re.sub(r"<[^>]*>", "PLACEHOLDER", line).replace("|", " ")
    try:
        words = shlex.split(text)
    except ValueError:  # an apostrophe in prose beside a command (a diagram's line)
        words = text.split()
    out = []
    for word in words:
        if word.startswith("[") and "=[" not in word:
            word = word[1:]
        if word.endswith("]") and "=[" not in word:
            word = word.rstrip("]")
        if word == "...":  # a flag's elided value stands for a value; elided arguments go
            word = "PLACEHOLDER" if out and out[-1].startswith("--") else ""
        if word and not word.startswith("#"):
            out.append(word)
    return out


def command_of(line: str, scripts: dict[str, str]) -> tuple[str, str, list[str], int] | None:
    """(kind, target, arguments, ranks) of a shown command line: kind "make", "module" or "script"; ranks from
    a launcher's -np (1 without one). None for a command of another project."""
    words, ranks = tokens_of(line), 1
    while words and not re.match(r"(\S*python3?|make|sciml-[\w-]+|data_prep|jobs)$", words[0]):
        if words[0] == "-np" and words[1:2] and words[1].isdigit():  # a launcher's rank count
            ranks = int(words[1])
        words = words[1:]
    if not words:
        return None
    head, rest = words[0], words[1:]
    if head == "make":
        return "make", rest[0], [], 1
    if head in scripts:
        return "module", scripts[head], rest, ranks
    if head in ("data_prep", "jobs"):
        return "module", head, rest, ranks
    if rest[:1] == ["-m"]:
        return (None if rest[1].startswith(FOREIGN) else ("module", rest[1], rest[2:], ranks))
    return "script", rest[0], rest[1:], ranks


def documented() -> dict[tuple[str, str], list[dict]]:
    """Every shown command, grouped by (kind, target): the pages and arguments each shows."""
    scripts, groups = entry_points(), {}
    for page, line in shown_lines():
        command = command_of(line, scripts)
        if command:
            kind, target, args, ranks = command
            groups.setdefault((kind, target), []).append({"page": page, "line": line, "args": args, "ranks": ranks})
    return groups


COMMANDS = documented()


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))


# ----------------------------------------------------------------------------------------- the driver process
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


def run_driver(kind: str, target: str, shown: list[dict]) -> dict:
    """`drive` in a fresh process (this file as a script), so that each command imports what it imports."""
    proc = subprocess.run([sys.executable, __file__, kind, target, json.dumps(shown)], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"": f"the driver failed (exit {proc.returncode}): {proc.stderr[-2000:]}"}
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def problems() -> dict:
    """Every non-make command checked, two at a time: (kind, target) -> {shown line: why it fails}."""
    checked = [key for key in COMMANDS if key[0] != "make" and key[1] not in NO_ARGUMENTS]
    with ThreadPoolExecutor(2) as pool:
        results = pool.map(lambda key: run_driver(*key, COMMANDS[key]), checked)
    return dict(zip(checked, results))


def test_the_pages_show_the_suites_commands():
    kinds = {kind for kind, _ in COMMANDS}
    assert kinds == {"make", "module", "script"}
    for target in ("data_prep", "common.campaign", "jobs", "cosmoflow/train.py", "demo", "test"):
        assert any(t == target for _, t in COMMANDS), f"no page shows {target}"


@pytest.mark.parametrize("target", sorted(t for k, t in COMMANDS if k == "make"))
def test_each_shown_make_target_exists(target):
    assert target in make_targets(), f"{COMMANDS['make', target][0]['page']} shows `make {target}`: no such target"


@pytest.mark.parametrize("key", sorted(k for k in COMMANDS if k[0] != "make"), ids=lambda k: k[1])
def test_each_shown_command_accepts_its_shown_flags(key, problems):
    if key[1] in NO_ARGUMENTS:
        assert importlib.util.find_spec(key[1]) is not None, f"{key[1]} is shown but does not exist"
        return
    found = problems[key]
    assert not found, "\n".join(f"{line!r}: {why}" for line, why in found.items())


def test_a_renamed_flag_or_subcommand_is_caught():
    shown = [{"page": "x", "line": "a", "args": ["index", "--no-such-flag", "1"], "ranks": 1},
             {"page": "x", "line": "b", "args": ["no-such-command"], "ranks": 1},
             {"page": "x", "line": "c", "args": ["validate", "DIR", "--workers", "K"], "ranks": 1}]
    found = run_driver("module", "data_prep", shown)
    assert set(found) == {"a", "b"}, found
    assert "--no-such-flag" in found["a"] and "invalid choice" in found["b"]


def test_a_command_line_is_read_past_its_environment_and_launcher():
    scripts = entry_points()
    line = "HOROVOD_X=5 .venv/bin/horovodrun -np 4 -H localhost:4 .venv/bin/python cosmoflow/train.py c.yaml " \
           "'parallel.spatial=[2,1]' [--json]"
    assert command_of(line, scripts) == ("script", "cosmoflow/train.py", ["c.yaml", "parallel.spatial=[2,1]",
                                                                        "--json"], 4)
    assert command_of("sciml-export RUN_DIR --check", scripts) == ("module", "common.export:main",
                                                                   ["RUN_DIR", "--check"], 1)
    assert command_of("python -m pytest -q tests", scripts) is None


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    import common.base.cli
    common.base.cli.exit_now = sys.exit  # the commands run in this process, which prints the verdict after them
    print(json.dumps(drive(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))))
