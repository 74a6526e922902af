"""Every command README.md and docs/*.md show, in code blocks or backticks, still exists with the flags shown.

A shown command is `python -m MODULE ...`, `python SCRIPT.py ...`, a console script of setup.py (`sciml-...`),
`data_prep ...`, `jobs render ...` or `make TARGET`, after any environment assignments, `time`, `nice` and
launcher (`horovodrun ... python ...`). For each module or script one subprocess (documented_commands_driver.py)
takes the parser its `main()` builds, without running it: it parses every shown argument list of that command
(an unknown flag or a renamed subcommand fails), prints `--help` of each shown subcommand, and for the training
scripts runs the shown command with `--dry-run`. `make TARGET` must be a target of the Makefile.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("documented_commands_driver.py")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
TICKS = re.compile(r"`([^`\n]+)`")
START = re.compile(r"(?<![\w/.-])(?:\S*python3? (?:-m \S+|\S+\.py)|make [\w-]+|sciml-[\w-]+|data_prep [\w-]+|"
                   r"jobs render)(?=\s|$)")
# Modules the docs show that belong to other projects: their flags are not this suite's to keep.
FOREIGN = ("pytest", "mlperf_logging.compliance_checker")
# Shown modules whose main() takes no arguments (running it is the command: it is only checked to exist).
NO_ARGUMENTS = ("jobs.docs",)


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


def run_driver(kind: str, target: str, shown: list[dict]) -> dict:
    """The checks of one command in a fresh process (documented_commands_driver.py), so that each command
    imports what it imports: {shown line: why it fails}."""
    proc = subprocess.run([sys.executable, str(DRIVER), kind, target, json.dumps(shown)], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"": f"the driver failed (exit {proc.returncode}): {proc.stderr[-2000:]}"}
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------------------------------- tests
def test_the_pages_show_the_suites_commands():
    kinds = {kind for kind, _ in COMMANDS}
    assert kinds == {"make", "module", "script"}
    for target in ("data_prep", "common.campaign", "jobs", "cosmoflow/train.py", "demo", "test"):
        assert any(t == target for _, t in COMMANDS), f"no page shows {target}"


@pytest.mark.parametrize("target", sorted(t for k, t in COMMANDS if k == "make"))
def test_each_shown_make_target_exists(target):
    assert target in make_targets(), f"{COMMANDS['make', target][0]['page']} shows `make {target}`: no such target"


# Each test runs its command's driver: a module fixture checking every command would run once in each
# pytest-xdist worker that gets a test of this module.
@pytest.mark.parametrize("key", sorted(k for k in COMMANDS if k[0] != "make"), ids=lambda k: k[1])
def test_each_shown_command_accepts_its_shown_flags(key):
    if key[1] in NO_ARGUMENTS:
        assert importlib.util.find_spec(key[1]) is not None, f"{key[1]} is shown but does not exist"
        return
    found = run_driver(*key, COMMANDS[key])
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
