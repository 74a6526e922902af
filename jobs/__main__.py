"""Command line of the job renderer (see jobs/__init__.py)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from common.base.cli import guarded
from common.base.files import check_target
from common.base.errors import BenchError
from jobs import __doc__ as DOC
from jobs.chain import DEFAULT_MARGIN


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m jobs", description=DOC,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    render = sub.add_parser("render", help="write the batch script of a benchmark on a site")
    render.add_argument("--site", required=True, help="an example's name (python -m jobs sites) or a YAML path")
    render.add_argument("--bench", required=True, choices=["cosmoflow", "deepcam"])
    render.add_argument("--nodes", type=int, required=True)
    render.add_argument("--runs", type=int, default=0, help="a campaign of this many runs, one after the other")
    render.add_argument("--instances", type=int, default=0, help="a throughput campaign of this many at once")
    render.add_argument("--config", default="", help="the benchmark config: relative to the suite's checkout, or absolute")
    render.add_argument("--time", default="", help="time limit hh:mm:ss (default: the site's)")
    render.add_argument("--chain", type=int, default=0, metavar="K",
                        help="with --runs: a chain of K jobs, each resuming the campaign after the one before; "
                             "--out then names the job script, and <out>-submit.sh submits the chain")
    render.add_argument("--stop-margin", type=int, default=DEFAULT_MARGIN, metavar="SECONDS",
                        help="a chain's jobs stop the campaign this long before their time limit (default %(default)s)")
    render.add_argument("--hpo", default="", metavar="SPACE.yaml",
                        help="a worker of this hyperparameter search (the space file: relative to the suite's "
                             "checkout, or absolute); each submission of the script is one more worker of the study "
                             "(docs/hpo.md)")
    render.add_argument("--trials", type=int, default=0, help="with --hpo: the finished trials the study should hold")
    render.add_argument("--study-dir", default="",
                        help="with --hpo: the study's directory, absolute or below the output root "
                             "(default: hpo-<space file's name>-<site>-n<nodes>)")
    render.add_argument("--out", help="write the script here (default: print it)")
    render.add_argument("overrides", nargs="*", help="config overrides for every training, section.key=value")
    sub.add_parser("sites", help="list the example site descriptions")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)

    def run() -> int:
        from jobs.render import Job, init_estimate, render
        from jobs.site import example_sites, load_site
        if args.command == "sites":
            for name in example_sites():
                print(f"{name:12s} {load_site(name).description}")
            return 0
        job = Job(bench=args.bench, nodes=args.nodes, config=args.config, overrides=tuple(args.overrides),
                  runs=args.runs, instances=args.instances, time_limit=args.time, chain=args.chain,
                  stop_margin=args.stop_margin, hpo=args.hpo, trials=args.trials, study_dir=args.study_dir)
        site = load_site(args.site)
        script = render(site, job)
        line, late = init_estimate(site, job)
        if line:  # on stderr: the script may be on stdout
            print(("warning: " if late else "") + line, file=sys.stderr)
        if job.chain and not args.out:
            raise BenchError("--chain writes two scripts (the job and its submission): give --out")
        if not args.out:
            sys.stdout.write(script)
            return 0
        out = Path(args.out)
        _write(out, script)
        if job.chain:
            from jobs.chain import submit_script
            _write(submit_path(out), submit_script(site, job, out.name))
        return 0

    return guarded(run)


def submit_path(out: Path) -> Path:
    """Where a chain's submit script goes: beside the job script, `<stem>-submit.sh`."""
    return out.with_name(f"{out.stem}-submit.sh")


def _write(out: Path, text: str) -> None:
    """An executable script, written whole under a temporary name first."""
    out = check_target(out)
    if out.is_dir():
        raise BenchError(f"--out {out}: a directory; expected the script's file name")
    if not out.parent.is_dir():
        raise BenchError(f"--out {out}: directory {out.parent} does not exist")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(0o755)
    tmp.replace(out)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
