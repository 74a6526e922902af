"""A throughput result's instances as separate jobs (docs/jobs.md, "Throughput instances as separate jobs").

`python -m jobs render ... --instances M --separate-jobs --out STEM.sh` writes M job scripts,
STEM-instance_<i>.sh, each allocating the nodes of one instance, and STEM-submit.sh, which submits them
all. The renderer assigns every instance its seed (FIRST_SEED + i, as a campaign's instance i draws, so no
two instances of the result repeat one: the rules prune duplicate seeds) and records them in each script's
header and in STEM-instances.json. Every job runs `common.campaign run --instances M --instance i` on one
campaign directory under the output root, which waits for the instances' shared start (`--start-at`, or a
barrier on the shared file system: common/campaign/start.py) before the training starts, so before its
init_start: the scheduler's queueing is neither in the span the throughput score uses nor in init's 30
minutes. The last instance to end scores the campaign.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Protocol

from common.base.errors import BenchError
from jobs.site import Site

FIRST_SEED = 1000  # instance i trains with seed FIRST_SEED + i (the campaign's default seed)
SUBMIT = {"slurm": 'sbatch "$s"', "lsf": 'bsub <"$s"', "pbs": 'qsub "$s"', "pjsub": 'pjsub "$s"',
          "sge": 'qsub{group} "$s"', "cobalt": 'qsub "$s"',
          "local": 'bash "$s" >"${s%.sh}.out" 2>&1 &\n    echo "started $s (output: ${s%.sh}.out)"'}


class Job(Protocol):
    """What of jobs.render.Job this module reads."""

    bench: str
    nodes: int
    instances: int
    chain: int
    separate: bool
    start_at: str
    instance: int


def check_flags(job: Job) -> None:
    """Refuse what does not go with separate instance jobs."""
    if (job.separate or job.start_at) and not job.instances:
        raise BenchError("--separate-jobs and --start-at go with --instances M (a throughput result's instances, "
                         "each in a job of its own)")
    if job.start_at and not job.separate:
        raise BenchError(f"--start-at {job.start_at}: the shared start of separate instance jobs; give "
                         f"--separate-jobs too (a campaign's own instances start together)")
    if job.start_at:
        from common.campaign.start import parse_when
        parse_when(job.start_at)
    if job.separate and job.chain:
        raise BenchError("--separate-jobs with --chain: a chain goes on with a sequential campaign (--runs)")


def seed_of(index: int) -> int:
    return FIRST_SEED + index


def campaign_name(site: Site, job: Job) -> str:
    """The directory every instance job writes its run into (and the barrier's), under the output root."""
    return f"throughput-{job.bench}-{site.name}-n{job.nodes}x{job.instances}"


def note(job: Job) -> str:
    """The header's words on which instance the script runs."""
    return f"; instance {job.instance} of {job.instances} (seed {seed_of(job.instance)}), each in a job of its own"


def driver_flags(job: Job) -> str:
    """The campaign driver's flags for instance `job.instance`: its index, the seeds' base, the shared start."""
    start = f"--start-at {shlex.quote(job.start_at)}" if job.start_at else "--barrier"
    return f" --instance {job.instance} --seed {FIRST_SEED} {start}"


def driver_comment(job: Job) -> list[str]:
    start = f"at {job.start_at}" if job.start_at else "once every instance's job has arrived (the barrier)"
    return [f"# ---- instance {job.instance} of {job.instances} of one throughput result, seed {seed_of(job.instance)}: its",
            f"# training starts {start},",
            "# before its init_start; the last instance to end scores the campaign"]


def render_all(site: Site, job: Job, render) -> list[tuple[int, str]]:
    """Every instance's (index, script) through `render` (jobs.render.render)."""
    return [(i, render(site, dataclasses.replace(job, instance=i))) for i in range(job.instances)]


def script_name(stem: str, index: int) -> str:
    return f"{stem}-instance_{index:03d}.sh"


def manifest(site: Site, job: Job, stem: str) -> str:
    """STEM-instances.json: the campaign directory, the shared start and every instance's script and seed."""
    return json.dumps({"site": site.name, "benchmark": job.bench, "nodes_per_instance": job.nodes,
                       "instances": job.instances, "campaign_dir": f"$OUTPUT_ROOT/{campaign_name(site, job)}",
                       "start": job.start_at or "barrier",
                       "jobs": [{"index": i, "seed": seed_of(i), "script": script_name(stem, i)}
                                for i in range(job.instances)]}, indent=2) + "\n"


def submit_script(site: Site, job: Job, stem: str) -> str:
    """STEM-submit.sh: submits every instance's script (beside it) at once."""
    group = f" -g {shlex.quote(site.account)}" if site.account else ""
    submit = SUBMIT[site.scheduler].replace("{group}", group)
    start = f"at {job.start_at}" if job.start_at else "when the last of them has started (a barrier)"
    return "\n".join([
        "#!/bin/bash",
        f"# Submits the {job.instances} instance jobs of one throughput result on {site.name} ({site.scheduler}), "
        f"beside this",
        f"# script: {script_name(stem, 0)} ... {script_name(stem, job.instances - 1)}. Their trainings start {start};",
        f"# they write into $OUTPUT_ROOT/{campaign_name(site, job)}. Seeds: {stem}-instances.json.",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f"for i in $(seq 0 {job.instances - 1}); do",
        f'    s="$HERE/{stem}-instance_$(printf %03d "$i").sh"',
        '    [ -f "$s" ] || { echo "error: $s does not exist" >&2; exit 2; }',
        f"    {submit}",
        "done",
        *(["wait"] if site.scheduler == "local" else []),
        ""])
