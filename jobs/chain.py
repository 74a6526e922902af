"""A campaign that the scheduler drives through a chain of jobs (docs/jobs.md, "Chains of jobs").

`python -m jobs render ... --runs N --chain K` writes two scripts: the job script, whose every job
resumes the one campaign (its directory does not depend on the job), and a submit script that submits
it K times, each job depending on the end of the one before, whatever its exit code (Slurm
`afterany`, LSF `ended()`, PBS `depend=afterany`, pjsub's step jobs). Each job has the campaign
driver receive SIGUSR1 `stop_margin` seconds before the time limit; the driver passes it on to the
running training, which checkpoints and exits 75, and the driver then exits 75 too (the stopped run
runs again from its start in the next job). A job that finds the campaign done and scored exits 0 at once.

How the signal reaches the driver:
- Slurm: `#SBATCH --signal=B:USR1@<margin>` signals the batch shell only; the script runs the driver in
  the background, traps USR1 and forwards it (a shell waiting for a foreground command would run its
  trap only after the command ended).
- LSF: `#BSUB -wa USR1` with `-wt <minutes>` signals the job's processes (shell and driver; the shell's
  forward then repeats it, which changes nothing).
- PBS and pjsub have no signal before the limit: the driver runs under coreutils `timeout`, which sends
  USR1 once the limit less the margin less the script's set-up time has passed, and exits with the
  driver's code (`--foreground`: to the driver only, once; the driver passes it on).
"""
from __future__ import annotations

from typing import Protocol

from common.base.errors import BenchError
from jobs.site import Site


class Job(Protocol):
    """What of jobs.render.Job a chain reads."""

    bench: str
    nodes: int
    runs: int
    chain: int  # the number of jobs
    stop_margin: int  # seconds before the time limit

SCHEDULERS = ("slurm", "lsf", "pbs", "pjsub")
DEFAULT_MARGIN = 600  # seconds: a training step, a checkpoint at the reference scale and the teardown


def check_chain(site: Site, job: Job, limit_seconds: int) -> None:
    """Refuse a chain the scheduler or the job cannot make."""
    if not job.chain:
        return
    if site.scheduler not in SCHEDULERS:
        raise BenchError(f"--chain with scheduler {site.scheduler} (site {site.name}): chains are rendered for "
                         f"{', '.join(SCHEDULERS)}")
    if not job.runs:
        raise BenchError("--chain needs --runs N: the jobs of a chain go on with a sequential campaign (a throughput "
                         "campaign's instances must train together in one job)")
    if not 0 < job.stop_margin < limit_seconds:
        raise BenchError(f"--stop-margin {job.stop_margin} s: expected more than 0 and less than the time limit "
                         f"({limit_seconds} s)")


def signal_directives(site: Site, job: Job) -> list[str]:
    """The directive lines that ask for the stop signal before the limit (none where the script arranges it)."""
    if site.scheduler == "slurm":
        return [f"#SBATCH --signal=B:USR1@{job.stop_margin}"]
    if site.scheduler == "lsf":
        return ["#BSUB -wa USR1", f"#BSUB -wt {-(-job.stop_margin // 60)}"]
    return []


def done_check(site: Site, job: Job) -> list[str]:
    """Shell lines: exit 0 at once when every run has its record and the campaign was scored."""
    return ["# ---- a job of a chain: nothing to do when an earlier job finished the campaign",
            f'CAMPAIGN_DIR="$OUTPUT_ROOT/{campaign_name(site, job)}"',
            "done_runs=0",
            'if [ -d "$CAMPAIGN_DIR/runs" ]; then',
            '    done_runs=$(find "$CAMPAIGN_DIR/runs" -mindepth 2 -maxdepth 2 -name campaign_run.json | wc -l)',
            "fi",
            f'if [ "$done_runs" -ge {job.runs} ] && [ -f "$CAMPAIGN_DIR/score.json" ]; then',
            f'    echo "campaign $CAMPAIGN_DIR: all {job.runs} runs done and scored; nothing left for this job"',
            "    exit 0",
            "fi",
            ""]


def campaign_name(site: Site, job: Job) -> str:
    """The campaign's directory under the output root: the same for every job (and for an unchained job)."""
    return f"campaign-{job.bench}-{site.name}-n{job.nodes}"


def run_driver(site: Site, job: Job, limit_seconds: int, driver: list[str]) -> list[str]:
    """Shell lines that run the campaign driver (`driver`: its command, continued lines) so that the stop
    signal reaches it, and exit with its code (75: stopped with runs left). The driver is told the moment
    the stop margin begins (--deadline), so that it starts no run that would not end before it."""
    deadline = ["# the moment the stop margin begins (SECONDS: the time this script has run so far)",
                f"DEADLINE=$(($(date +%s) + {limit_seconds - job.stop_margin} - SECONDS))"]
    driver = [*driver[:-1], '    --deadline "$DEADLINE" \\', driver[-1]]
    return [*deadline, *_driver_lines(site, job, limit_seconds, driver)]


def _driver_lines(site: Site, job: Job, limit_seconds: int, driver: list[str]) -> list[str]:
    if site.scheduler in ("pbs", "pjsub"):
        stop_after = limit_seconds - job.stop_margin
        return [f"# {site.scheduler} sends no signal before the limit: timeout sends USR1 {job.stop_margin} s before",
                "# it (SECONDS: the time this script has run so far)",
                f'STOP_AFTER=$(({stop_after} - SECONDS))',
                '[ "$STOP_AFTER" -gt 0 ] || fail "no time left before the stop margin ($STOP_AFTER s)"',
                "rc=0",
                f'timeout --foreground --preserve-status --signal=USR1 "$STOP_AFTER" {driver[0]}',
                *driver[1:-1], f"{driver[-1]} || rc=$?",
                "echo \"campaign driver exit $rc (75: stopped; the next job of the chain goes on)\"",
                'exit "$rc"']
    return ["# the scheduler signals this shell: run the driver in the background, pass USR1 on to it and wait",
            "# again after each signal (bash runs a trap only between commands, not during a foreground one)",
            *in_background("DRIVER_PID", [
                "forward() {",
                '    echo "$1: passed on to the campaign driver"',
                '    [ -z "$DRIVER_PID" ] || kill "-$1" "$DRIVER_PID" 2>/dev/null || true',
                "}",
                "trap 'forward USR1' USR1",
                "# at the limit the scheduler sends TERM to every process of the job, the driver too: keep waiting for it",
                "trap 'echo \"TERM: the campaign driver stops its trainings\"' TERM"],
                driver, "campaign driver exit $rc (75: stopped; the next job of the chain goes on)")]


def in_background(pid_var: str, traps: list[str], command: list[str], ending: str) -> list[str]:
    """Shell lines that set the signal `traps` (their functions may signal $`pid_var`), run `command` (its
    continued lines) in the background as $`pid_var`, wait for it again after each signal the shell takes,
    then echo `ending` (which may name $rc) and exit with the command's code."""
    return [f"{pid_var}=",
            "# shellcheck disable=SC2317  # called by the traps",
            *traps,
            *command[:-1], f"{command[-1]} &",
            f"{pid_var}=$!",
            f'while kill -0 "${pid_var}" 2>/dev/null; do wait "${pid_var}" || true; done',
            f'rc=0; wait "${pid_var}" || rc=$?',
            f'echo "{ending}"',
            'exit "$rc"']


def submit_script(site: Site, job: Job, script_name: str) -> str:
    """The script that submits `script_name` (beside it) `job.chain` times, each job after the one before."""
    submit = {"slurm": ['    if [ -z "$1" ]; then out=$(sbatch --parsable "$SCRIPT")',
                        '    else out=$(sbatch --parsable --dependency="afterany:$1" "$SCRIPT"); fi',
                        '    echo "${out%%;*}"'],
              "lsf": ['    if [ -z "$1" ]; then out=$(bsub <"$SCRIPT")',
                      '    else out=$(bsub -w "ended($1)" <"$SCRIPT"); fi',
                      "    echo \"$out\" | sed -n 's/^Job <\\([0-9]*\\)>.*/\\1/p'"],
              "pbs": ['    if [ -z "$1" ]; then qsub "$SCRIPT"',
                      '    else qsub -W "depend=afterany:$1" "$SCRIPT"; fi'],
              "pjsub": ['    # sub jobs of one step job run one after the other, whatever the exit codes',
                        '    if [ -z "$1" ]; then out=$(pjsub --step "$SCRIPT")',
                        '    else out=$(pjsub --step --sparam "jid=$1" "$SCRIPT"); fi',
                        "    echo \"$out\" | sed -n 's/.*Job \\([0-9]*\\)_[0-9]*.*/\\1/p'"]}[site.scheduler]
    # pjsub: every later sub job names the step job (the first's id); elsewhere each names the job before.
    follow = 'prev="$id"' if site.scheduler != "pjsub" else '[ -n "$prev" ] || prev="$id"'
    return "\n".join([
        "#!/bin/bash",
        f"# Submits {script_name} (beside this script) as a chain of jobs on {site.name} ({site.scheduler}): each",
        f"# job resumes the campaign {campaign_name(site, job)} under the output root, after the one before it ends.",
        "# Run it from the directory the jobs should start in. JOBS=<n> submits another number of jobs.",
        "set -euo pipefail",
        f'SCRIPT="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)/{script_name}"',
        f'JOBS="${{JOBS:-{job.chain}}}"',
        '[ -f "$SCRIPT" ] || { echo "error: $SCRIPT does not exist" >&2; exit 2; }',
        "",
        "# $1: the job to follow (empty for the first); prints the new job's id",
        "submit_one() {",
        *submit,
        "}",
        "",
        'prev=""',
        'for i in $(seq 1 "$JOBS"); do',
        '    id=$(submit_one "$prev")',
        '    [ -n "$id" ] || { echo "error: submitting job $i of $JOBS gave no job id" >&2; exit 1; }',
        '    echo "job $i/$JOBS: $id"',
        f"    {follow}",
        "done",
        ""])
