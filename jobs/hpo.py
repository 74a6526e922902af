"""A worker of a hyperparameter search as a batch job (docs/hpo.md, "As scheduler jobs").

`python -m jobs render ... --hpo SPACE.yaml --trials T` renders a job that runs one worker of the search
(`python -m common.hpo run`), which starts its trials through the site's launcher as a campaign starts its
runs, with the site's settings as overrides of every trial. The study's directory does not depend on the
job, so each submission of the script (K submissions, or a Slurm array) is one more worker of the same
study: the workers share it through its journal on the shared file system.

The scheduler's TERM (the time limit, a cancelled job) is passed on to the worker, which stops its trial's
training, marks the trial failed and queues its settings again for the next worker. With a stage
directory, each trial stages into a directory of its own below the job's ($STAGE_DIR/<bench>-<job id>/
run_<n>: trial numbers are unique in a study, and a worker's is removed when its trial ends), and the
job's EXIT trap removes the job's directory on every node.
"""
from __future__ import annotations

from pathlib import Path, PurePath
from typing import Protocol

import yaml

from common.base.errors import BenchError
from common.base.version import REPO
from jobs.chain import in_background
from jobs.site import Site


class Job(Protocol):
    """What of jobs.render.Job a search's worker reads."""

    bench: str
    nodes: int
    config: str
    runs: int
    instances: int
    chain: int
    hpo: str  # the search space file: relative to the suite's checkout, or absolute
    trials: int
    study_dir: str


def check_flags(job: Job) -> None:
    """Refuse what a worker cannot be given with the flags that do not go together."""
    if not job.hpo:
        if job.trials or job.study_dir:
            raise BenchError("--trials and --study-dir go with --hpo SPACE.yaml (a search's worker)")
        return
    given = [flag for flag, value in (("--runs", job.runs), ("--instances", job.instances), ("--chain", job.chain),
                                      ("--config", job.config)) if value]
    if given:
        raise BenchError(f"--hpo with {', '.join(given)}: a search's worker trains the trials of its space file "
                         f"(which names the config); leave out {', '.join(given)}")
    if job.trials < 1:
        raise BenchError(f"--hpo needs --trials T (the finished trials the study should hold, >= 1), found "
                         f"{job.trials}")


def check_space(job: Job) -> None:
    """When the space file is at hand here (absolute, or in this checkout), its benchmark must be the job's:
    the job gives the trials that benchmark's dataset."""
    path = Path(job.hpo) if Path(job.hpo).is_absolute() else REPO / job.hpo
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # the worker reads it in the job, and names what is wrong there
    bench = raw.get("benchmark") if isinstance(raw, dict) else None
    if bench and bench != job.bench:
        raise BenchError(f"--hpo {job.hpo}: the space searches {bench}, but --bench is {job.bench}")


def study_dir(site: Site, job: Job) -> str:
    """The study's directory, the same for every worker: --study-dir (absolute, or below the output root),
    else one named by the space file, the site and the nodes."""
    name = job.study_dir or f"hpo-{PurePath(job.hpo).stem}-{site.name}-n{job.nodes}"
    return name if name.startswith(("/", "$")) else f"$OUTPUT_ROOT/{name}"


def worker_lines(site: Site, job: Job, place: list[str], launcher: str) -> list[str]:
    """Shell lines that run the worker (`launcher`: the campaigns' template of the site's launcher; `place`:
    the lines writing the files it names) so that the scheduler's TERM reaches it, and exit with its code."""
    stage = ' --stage-dir "$STAGE_DIR/$STAGE_NAME"' if site.stage_dir else ""
    return ["# ---- a worker of the search: it trains trials one after the other until the study holds its trials;",
            "# the study's directory does not depend on the job, so each submission of this script is one more worker",
            f'STUDY_DIR="{study_dir(site, job)}"',
            'echo "search worker of $STUDY_DIR"',
            *place,
            "cd \"$SUITE_DIR\"",
            "# the scheduler's TERM (the time limit, a cancelled job) must reach the worker, which then stops its",
            "# trial and queues it again: run it in the background, pass TERM on and wait again after each signal",
            "# (bash runs a trap only between commands, not during a foreground one)",
            *in_background("WORKER_PID", [
                "stop_worker() {",
                '    echo "TERM: passed on to the search worker; it queues its running trial again"',
                '    [ -z "$WORKER_PID" ] || kill -TERM "$WORKER_PID" 2>/dev/null || true',
                "}",
                "trap stop_worker TERM"], [
                f'"$DRIVER_PYTHON" -m common.hpo run "$SPACE" --out "$STUDY_DIR" --trials {job.trials} \\',
                f'    --np {job.nodes * site.ranks_per_node} --python "$PYTHON"{stage} \\',
                f"    --launcher {launcher} \\",
                '    "${SETTINGS[@]}"'],
                "search worker exit $rc (0: the study holds its trials; 143: stopped, its trial queued again; "
                "2: bad input)")]
