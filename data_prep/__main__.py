"""Command line for the data tools: `python -m data_prep <command> [--help]`.

Each command lives in its own module, which exposes `add_arguments(parser)` and
`run(args) -> int`; the module docstring's first line is the command's summary. Command
modules import heavy packages (TensorFlow) inside their functions, so `--help` stays fast.
"""
import argparse
import importlib
import sys

from common.base.cli import guarded

COMMANDS = {
    "cosmo-synth": "data_prep.cosmo_synth",
    "cosmo-convert": "data_prep.cosmo_convert",
    "cosmo-released": "data_prep.released",
    "cosmo-blocks": "data_prep.cosmo_blocks",
    "deepcam-synth": "data_prep.climate_synth",
    "deepcam-stats": "data_prep.climate_stats",
    "deepcam-convert": "data_prep.deepcam_convert",
    "download": "data_prep.download",
    "index": "data_prep.index",
    "pack": "data_prep.pack",
    "stage": "data_prep.stage",
    "validate": "data_prep.validate",
}


def _summary(module_name: str) -> str:
    doc = importlib.import_module(module_name).__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m data_prep", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        summary = _summary(module_name)
        cmd = sub.add_parser(name, help=summary, description=module.__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return guarded(lambda: args._run(args))
    except KeyboardInterrupt:
        print("interrupted: completed outputs are kept; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
