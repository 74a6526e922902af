"""Fuzzing every command line (issue 47 §3): hypothesis builds argument lists from each command's own flags,
with values of every kind (numbers out of range, words, paths that are missing, files of garbage, empty
directories, directories holding a corrupt manifest, config or log), and calls the command's `main(argv)` in
this process. Promise: exit 0 or 2 (argparse's usage errors included), a message on stderr with every 2, and
never a traceback or another exit code (an internal error's 4 is a failure here).

No input names a real dataset, search space or campaign config, so no example starts a training: a training's
command line is fuzzed with `--dry-run`, which resolves the config and stops. 50 examples per command in
`make test`; `make fuzz` runs the same tests with 1,000 (FUZZ_EXAMPLES, docs/fuzzing.md). The commands run in a
scratch directory, so relative outputs land there; inputs are made once per process in a temporary directory.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import json
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.base import exits
from tests.fuzz.harness import TALLY, fuzz

pytestmark = pytest.mark.fuzz
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = 50  # FUZZ_EXAMPLES overrides it: `make fuzz` sets 1,000
WORK = Path(tempfile.mkdtemp(prefix="fuzz-commands-"))  # the inputs below, made once per process


def _inputs() -> dict[str, str]:
    """Paths of every kind a command may be given, none of them valid input."""
    garbage = WORK / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 4)
    empty = WORK / "empty"
    empty.mkdir(exist_ok=True)
    corrupt = WORK / "corrupt"
    corrupt.mkdir(exist_ok=True)
    for name in ("manifest.json", "pack.json", "summary.json", "campaign.json", "hpo.json"):
        (corrupt / name).write_text('{"format": "cosmoflow-tfrecord", "splits": [1, 2')
    (corrupt / "config.yaml").write_text("run: [unclosed\n")
    (corrupt / "mlperf.log").write_text(':::MLLOG {"key": "run_start", "time_ms": "soon"\n\xff\n')
    (WORK / "latin1.yaml").write_bytes("site: caf\xe9\n".encode("latin-1"))
    return {"missing": str(WORK / "missing"), "garbage": str(garbage), "empty": str(empty),
            "corrupt": str(corrupt), "latin1": str(WORK / "latin1.yaml"), "proc": "/proc/no-such-dir/out",
            "devnull": "/dev/null"}  # (not "/": a command that wrote there would write into this machine's root)


PATHS = _inputs()
words = st.sampled_from(["-3", "-1", "0", "1", "2", "7", str(2 ** 70), "1e999", "nan", "-inf", "abc", "", " ",
                         "x=y", "a.b=1", "--", "\u2603", "null", "[1, 2]", "{}", "true"])
paths = st.sampled_from(sorted(PATHS.values()))
values = words | paths
# config overrides a training's dry run applies: real keys with values of every kind, and keys it does not have
config_keys = st.sampled_from(["train.local_batch_size", "train.max_epochs", "train.target", "model.kernel_size",
                               "model.pool_size", "model.dense_units", "model.input_shape", "model.width",
                               "run.seed", "run.output_dir", "data.dir", "data.stage_timing", "data.stage_mode",
                               "data.stage_rate_gb_s", "optimizer.rcp", "mlperf.division", "dist.threads_per_rank",
                               "schedule.decay_epochs", "checkpoint.keep", "nosuch.key", "train"])
overrides = st.builds(lambda k, v: f"{k}={v}", config_keys, words)
numbers = st.sampled_from(["-3", "-1", "0", "1", "2", "3", "16", str(2 ** 31), str(2 ** 70), "0.5", "1e999", "nan"])

# command -> the module whose main(argv) it is
COMMANDS = {"data_prep": "data_prep.__main__", "cosmoflow": "cosmoflow.train", "deepcam": "deepcam.train",
            "campaign": "common.campaign.run", "jobs": "jobs.__main__", "hpo": "common.hpo.__main__",
            "export": "common.export", "report": "common.campaign.analysis.__main__"}
TRAININGS = {"cosmoflow": "cosmoflow/configs/cosmo_mini.yaml", "deepcam": "deepcam/configs/deepcam_mini.yaml"}
# cosmo-synth and deepcam-synth would generate a dataset into any writable --out; download would fetch one
SKIPPED = {"cosmo-synth", "deepcam-synth", "download"}
# a site `jobs render` may name: examples, a file of garbage, Latin-1 text, a missing file, an unknown name
SITE_VALUES = st.sampled_from(["localhost", "perlmutter", "fugaku", PATHS["garbage"], PATHS["latin1"],
                               PATHS["missing"], "nosuchsite"])



class _Parsed(Exception):  # carries the parser out of the command's main()
    def __init__(self, parser):
        self.parser = parser


@functools.lru_cache(maxsize=None)
def parser_of(module: str) -> argparse.ArgumentParser:
    """The command's own argument parser: its main() called with parse_args intercepted."""
    main = importlib.import_module(module).main
    real = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args

    def intercept(self, *args, **kwargs):
        raise _Parsed(self)
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = intercept
    try:
        main([])
    except _Parsed as parsed:
        return parsed.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = real
    raise AssertionError(f"{module}.main parsed no arguments")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subs[0].choices) if subs else {"": parser}


def _value(draw, action: argparse.Action) -> str:
    """A value for `action`: one of its choices or a word; a number of every kind for int and float options;
    a path or a word otherwise."""
    if action.choices:
        return draw(st.sampled_from(sorted(map(str, action.choices))) | words)
    if action.type in (int, float) or getattr(action.type, "__name__", "") in ("positive_int", "non_negative_int"):
        return draw(numbers | words)
    if action.dest == "site":
        return draw(SITE_VALUES)
    return draw(paths | words)


@st.composite
def argv_of(draw, command: str) -> list[str]:
    """An argument list for `command` from its own parser: a subcommand (not one in SKIPPED), a value for each
    positional, every required option and some others with values, and config overrides where it takes them."""
    subs = {k: v for k, v in _subcommands(parser_of(COMMANDS[command])).items() if k not in SKIPPED}
    sub = draw(st.sampled_from(sorted(subs)))
    parser, argv = subs[sub], [sub] if sub else []
    for action in parser._actions:
        if action.option_strings or isinstance(action, argparse._SubParsersAction):
            continue
        if action.dest == "overrides":
            argv += draw(st.lists(overrides, max_size=3))
        elif action.dest == "config" and command in TRAININGS:  # a training's own config (with --dry-run)
            argv.append(draw(st.sampled_from([str(REPO / TRAININGS[command]), *PATHS.values()])))
        else:
            argv += [_value(draw, action) for _ in range(1 if action.nargs in (None, 1) else draw(st.integers(1, 2)))]
    options = [a for a in parser._actions if a.option_strings and a.dest not in ("help", "dry_run")]
    chosen = [a for a in options if a.required] + draw(st.lists(st.sampled_from(options), max_size=4, unique=True)
                                                       if options else st.just([]))
    for action in dict.fromkeys(chosen):
        argv.append(action.option_strings[0])
        if action.nargs != 0:
            argv.append(_value(draw, action))
    return argv + (["--dry-run"] if command in TRAININGS else [])


def _call(module: str, argv: list[str]) -> tuple[int, str]:
    """The exit code of `module`.main(argv) run here (SystemExit too), and what it wrote on stderr."""
    main = importlib.import_module(module).main
    err = io.StringIO()
    scratch = WORK / "cwd"  # relative outputs (jobs render --out 2) land here, not in the checkout
    scratch.mkdir(exist_ok=True)
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), contextlib.chdir(scratch):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    return code, err.getvalue()


def _check(command: str, argv: list[str]) -> None:
    t0 = time.perf_counter()
    code, err = _call(COMMANDS[command], argv)
    TALLY.record(f"command {command}", f"exit {code}", time.perf_counter() - t0)
    shown = json.dumps(argv)
    assert code in (exits.SUCCESS, exits.BAD_INPUT), f"{command} {shown}: exit {code}\n{err}"
    assert "Traceback" not in err and "internal error" not in err, f"{command} {shown}:\n{err}"
    assert code == 0 or err.strip(), f"{command} {shown}: exit 2 with nothing on stderr"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_line_is_refused_with_exit_2_and_a_message_never_a_traceback(command):
    @fuzz(EXAMPLES, deadline_s=60)
    @given(argv=argv_of(command))
    def one(argv):
        _check(command, argv)

    one()
