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
    render.add_argument("--separate-jobs", action="store_true",
                        help="with --instances M: one job per instance, each with its own seed, started together; "
                             "--out then names the scripts' stem: <stem>-instance_<i>.sh, <stem>-submit.sh submits "
                             "them, <stem>-instances.json records the seeds")
    render.add_argument("--start-at", default="", metavar="WHEN",
                        help="with --separate-jobs: the instances' shared start (seconds since the epoch or ISO 8601 "
                             "with a time zone; default: a barrier, once every instance's job has started)")
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
                  stop_margin=args.stop_margin, hpo=args.hpo, trials=args.trials, study_dir=args.study_dir,
                  separate=args.separate_jobs, start_at=args.start_at)
        site = load_site(args.site)
        if job.separate:
            return _write_instances(site, job, args.out)
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


def _write_instances(site, job, out: str | None) -> int:
    """--separate-jobs: every instance's script, the submit script and the seeds' record (jobs/instances.py)."""
    from jobs import instances
    from jobs.render import init_estimate, render
    if not out:
        raise BenchError(f"--separate-jobs writes {job.instances + 2} files (a script per instance, the submit "
                         f"script, the seeds' record): give --out STEM.sh")
    scripts = instances.render_all(site, job, render)
    line, late = init_estimate(site, job)
    if line:
        print(("warning: " if late else "") + line, file=sys.stderr)
    path = Path(out)
    stem = path.stem
    files = [(path.with_name(instances.script_name(stem, i)), script, 0o755) for i, script in scripts]
    files += [(submit_path(path), instances.submit_script(site, job, stem), 0o755),
              (path.with_name(f"{stem}-instances.json"), instances.manifest(site, job, stem), 0o644)]
    for target, text, mode in files:  # every text made before the first file is written
        _write(target, text, mode)
    return 0


def submit_path(out: Path) -> Path:
    """Where a chain's submit script goes: beside the job script, `<stem>-submit.sh`."""
    return out.with_name(f"{out.stem}-submit.sh")


def _write(out: Path, text: str, mode: int = 0o755) -> None:
    """An executable script (or a file of `mode`), written whole under a temporary name first."""
    out = check_target(out)
    if out.is_dir():
        raise BenchError(f"--out {out}: a directory; expected the script's file name")
    if not out.parent.is_dir():
        raise BenchError(f"--out {out}: directory {out.parent} does not exist")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(out)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
