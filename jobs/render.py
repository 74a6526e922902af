"""Render a batch script for one benchmark on one site (docs/jobs.md).

The script has the scheduler's directives (jobs/templates/<scheduler>.sh), then one body for every
scheduler: `set -euo pipefail`, the site's settings as shell variables with early checks (the suite's
checkout, the config, the dataset, the output directory), the environment (modules, setup lines,
threads, Horovod tuning), where the launcher needs them the files that place the ranks (host files,
per-instance launch scripts), and either one training through the site's launcher or a campaign
(`python -m common.campaign run ... --launcher "<launcher>"`) when runs or instances are asked for.
With a stage directory, an EXIT trap removes what the job's runs staged on every node, one task per node
through the scheduler's launcher; a job whose share of the dataset per node exceeds the site's
stage_capacity_gb is refused before anything is written (`check_stage_capacity`).
With `chain`, the campaign is one the scheduler drives through a chain of jobs (jobs/chain.py); with `hpo`,
the job is a worker of a hyperparameter search, its trials through the same launcher (jobs/hpo.py).
"""
from __future__ import annotations

import dataclasses
import math
import re
import shlex
from pathlib import Path

from common.base.errors import BenchError
from common.io import stage_rate
from jobs import chain as chains
from jobs import hpo as searches
from jobs import instances as instance_jobs
from jobs.site import Site

TEMPLATES = Path(__file__).resolve().parent / "templates"
BENCH_CONFIGS = {"cosmoflow": "cosmoflow/configs/cosmo.yaml", "deepcam": "deepcam/configs/deepcam.yaml"}
JOB_ID_VARS = {"slurm": "SLURM_JOB_ID", "lsf": "LSB_JOBID", "pbs": "PBS_JOBID", "pjsub": "PJM_JOBID", "sge": "JOB_ID",
               "cobalt": "COBALT_JOBID", "local": ""}
PREFIXES = {"slurm": "#SBATCH", "lsf": "#BSUB", "pbs": "#PBS", "pjsub": "#PJM", "sge": "#$", "cobalt": "#COBALT",
            "local": ""}
# The placement file a campaign's launcher names per instance (the campaign fills in {run}).
INSTANCE_FILE = "instance_{run:03d}"
PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
# GB (10^9 bytes) the official datasets take once staged, by benchmark (docs/staging.md, "Staging at full
# scale"). CosmoFlow: the release's 589,824 GZIP files of about 2.9 MB (its 1.7 TB tar, docs/datasets.md);
# with data.stage_decompress each is written as its 16 MiB record (the (128, 128, 128, 4) int16 cube) with
# its framing and a DALI index line. DeepCAM: 136,424 converted records of 768 x 1152 x 16 float32 fields and
# a uint8 label map (57,507,840 bytes each, deepcam-convert's uncompressed default). A site's dataset_gb wins.
DATASET_GB = {"cosmoflow": 1710.0, "deepcam": 7846.0}
DECOMPRESSED_GB = {"cosmoflow": 9896.0}
LLIO_LOCALTMP_MIB = 87 * 1024  # Fugaku: the largest LLIO node temporary area per node


@dataclasses.dataclass(frozen=True)
class Job:
    """What to render: benchmark, nodes, config (relative to the suite's checkout), overrides, and
    runs (a sequential campaign), instances (a throughput campaign) or hpo (a search's worker); none of
    them: one training."""

    bench: str
    nodes: int
    config: str = ""
    overrides: tuple[str, ...] = ()
    runs: int = 0
    instances: int = 0
    time_limit: str = ""  # "": the site's
    chain: int = 0  # with runs: this many jobs, each after the one before, resume the campaign (jobs/chain.py)
    stop_margin: int = chains.DEFAULT_MARGIN  # a chain's jobs: seconds before the time limit to stop at
    hpo: str = ""  # a search space file (relative to the suite's checkout): the job is a worker of the search
    trials: int = 0  # with hpo: the finished trials the study should hold
    study_dir: str = ""  # with hpo: the study's directory ("": jobs/hpo.py's name under the output root)
    separate: bool = False  # with instances: one job per instance (jobs/instances.py), started together
    start_at: str = ""  # with separate: the instances' shared start ("": a barrier on the shared file system)
    instance: int = -1  # the instance a separate job runs (jobs/instances.py sets it)

    @property
    def allocated_nodes(self) -> int:
        """A throughput campaign's instances train at once, each on `nodes` nodes of their own (in one job, or
        each in a separate job)."""
        return self.nodes * max(self.together, 1)

    @property
    def together(self) -> int:
        """The instances this job's allocation holds (0: a job without instances, or one of separate jobs)."""
        return 0 if self.separate else self.instances

    def __post_init__(self):
        if self.bench not in BENCH_CONFIGS:
            raise BenchError(f"benchmark {self.bench!r}: expected one of {sorted(BENCH_CONFIGS)}")
        if self.nodes < 1:
            raise BenchError(f"--nodes {self.nodes}: expected >= 1")
        for flag, value in (("--runs", self.runs), ("--instances", self.instances), ("--trials", self.trials),
                            ("--stop-margin", self.stop_margin)):
            if value < 0:
                raise BenchError(f"{flag} {value}: expected an integer >= 0")
        if self.runs and self.instances:
            raise BenchError(f"--runs {self.runs} and --instances {self.instances}: give one")
        if self.chain < 0:
            raise BenchError(f"--chain {self.chain}: expected a number of jobs >= 1 (0: one job)")
        for o in self.overrides:
            if "=" not in o or o.startswith("-"):
                raise BenchError(f"override {o!r}: expected section.key=value")
        searches.check_flags(self)
        instance_jobs.check_flags(self)


def fill(template: str, values: dict[str, str], where: str) -> str:
    """Replace {{ name }} placeholders; an unknown one is an error naming the template."""
    def one(match: re.Match) -> str:
        if match.group(1) not in values:
            raise BenchError(f"{where}: unknown placeholder {{{{ {match.group(1)} }}}}")
        return values[match.group(1)]
    return PLACEHOLDER.sub(one, template)


def directives(site: Site, job: Job, name: str) -> str:
    """The scheduler's header (template) with the optional lines the site sets."""
    nodes = job.allocated_nodes
    values = {"name": name, "nodes": str(nodes), "ranks_per_node": str(site.ranks_per_node),
              "cpus_per_rank": str(site.cpus_per_rank), "time": job.time_limit or site.time_limit,
              "time_minutes": str(_minutes(job.time_limit or site.time_limit)),
              "cores_per_node": str(site.ranks_per_node * site.cpus_per_rank),
              "accelerators": str(nodes * site.accelerators_per_node), "node_type": site.constraint}
    path = TEMPLATES / f"{site.scheduler}.sh"
    lines = fill(path.read_text(), values, str(path)).rstrip("\n").split("\n")
    prefix, sep = PREFIXES[site.scheduler], "=" if site.scheduler == "slurm" else " "
    queue = fill(site.queue, values, f"site {site.name}: queue {site.queue!r}")
    lines += [f"{prefix} {flag}{sep}{value}" for flag, value in _options(site, job, queue) if value]
    lines += [f"{prefix} {arg}" for arg in site.scheduler_args] if prefix else []
    lines += chains.signal_directives(site, job) if job.chain else []
    lines += _llio_directives(site)
    if site.scheduler == "sge" and site.account:  # ABCI takes the group on qsub's command line only
        lines.append(f"# submit with: qsub -g {site.account} <this script>")
    return "\n".join(lines) + "\n"


def _llio_directives(site: Site) -> list[str]:
    """Fugaku: staging into $PJM_LOCALTMP asks LLIO for the node temporary area, stage_capacity_gb in MiB or
    else the most a node has (87 GiB, RIKEN's I/O guide)."""
    if site.scheduler != "pjsub" or not site.stage_dir.startswith("$PJM_LOCALTMP"):
        return []
    mib = int(site.stage_capacity_gb * 1e9) // 2 ** 20 if site.stage_capacity_gb else LLIO_LOCALTMP_MIB
    return [f"#PJM --llio localtmp-size={mib}Mi"]


def _options(site: Site, job: Job, queue: str) -> list[tuple[str, str]]:
    """The scheduler's optional flags and their values ("": left out)."""
    gpus = str(site.accelerators_per_node) if site.accelerators_per_node else ""
    # ibrun starts as many tasks as the allocation has, so the job asks for them all.
    tasks = str(job.allocated_nodes * site.ranks_per_node) if site.launcher_kind == "ibrun" else ""
    return {"slurm": [("--account", site.account), ("--partition", queue), ("--qos", site.qos),
                      ("--constraint", site.constraint), ("--gpus-per-node", gpus), ("--ntasks", tasks)],
            "lsf": [("-P", site.account), ("-q", queue)],
            "pbs": [("-A", site.account), ("-q", queue)],
            "pjsub": [("-g", site.account), ("-L", f'"rscgrp={queue}"' if queue else "")],
            "sge": [("-q", queue)],
            "cobalt": [("-A", site.account), ("-q", queue)],
            "local": []}[site.scheduler]


def _minutes(time_limit: str) -> int:
    return -(-_seconds(time_limit) // 60)


def _seconds(time_limit: str) -> int:
    parts = time_limit.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise BenchError(f"time limit {time_limit!r}: expected hh:mm:ss, hh:mm or minutes")
    h, m, s = ([0] * (3 - len(parts)) + [int(p) for p in parts]) if len(parts) > 1 else (0, int(parts[0]), 0)
    return (h * 60 + m) * 60 + s


def launcher(site: Site, nodes: int, hostfile: str = "") -> list[str]:
    """The command that starts the ranks (then the container runtime, if any); `hostfile` names the
    nodes for mpiexec and mpirun where the scheduler does not tell them."""
    ranks, rpn, cpr = nodes * site.ranks_per_node, site.ranks_per_node, site.cpus_per_rank
    kind, extra = site.launcher_kind, shlex.split(site.launcher_args)
    hosts = [("--vcoordfile" if site.scheduler == "pjsub" else "--hostfile"), hostfile] if hostfile else []
    if kind == "srun":
        cmd = ["srun", f"--nodes={nodes}", f"--ntasks={ranks}", f"--ntasks-per-node={rpn}", f"--cpus-per-task={cpr}"]
        cmd += [f"--cpu-bind={site.cpu_bind}"] if site.cpu_bind else []
        cmd += [f"--gpus-per-task={site.accelerators_per_node // rpn}"] if site.accelerators_per_node >= rpn > 0 \
            and site.accelerators_per_node else []
    elif kind == "jsrun":
        per_rs = site.accelerators_per_node // rpn if site.accelerators_per_node >= rpn else 0
        cmd = ["jsrun", f"--nrs={ranks}", "--tasks_per_rs=1", f"--cpu_per_rs={cpr}", f"--gpu_per_rs={per_rs}",
               f"--rs_per_host={rpn}"] + ([f"--bind={site.cpu_bind}"] if site.cpu_bind else [])
    elif kind == "mpiexec":
        cmd = ["mpiexec", *hosts, "-n", str(ranks)]
        if site.scheduler != "pjsub":  # Cray PALS / MPICH Hydra: ranks per node and cores per rank
            cmd += ["--ppn", str(rpn), "--depth", str(cpr)] + (["--cpu-bind", site.cpu_bind] if site.cpu_bind else [])
    elif kind == "mpirun":
        cmd = ["mpirun", *hosts, "-np", str(ranks), "--map-by", f"ppr:{rpn}:node:PE={cpr}"]
        cmd += ["--bind-to", site.cpu_bind] if site.cpu_bind else []
    elif kind == "aprun":  # Cray ALPS: -d hardware threads per rank, -cc how they are bound
        cmd = ["aprun", "-n", str(ranks), "-N", str(rpn), "-d", str(cpr)]
        cmd += ["-cc", site.cpu_bind] if site.cpu_bind else []
    elif kind == "ibrun":  # TACC: the tasks and their placement come from the Slurm allocation
        cmd = ["ibrun"]
    else:
        if nodes != 1:
            raise BenchError(f"launcher horovodrun on {nodes} nodes: this site launches on its own host only; "
                             f"use --nodes 1 or a scheduler's launcher")
        cmd = ["horovodrun", "-np", str(ranks), "-H", f"localhost:{ranks}"]
    return cmd + extra + container(site)


def container(site: Site) -> list[str]:
    c, options = site.container, shlex.split(site.container.options)
    return {"none": [], "shifter": ["shifter", f"--image={c.image}", *options],
            "sarus": ["sarus", "run", *options, c.image], "apptainer": ["apptainer", "exec", *options, c.image],
            "podman-hpc": ["podman-hpc", "run", "--rm", *options, c.image]}[c.kind]


def settings(site: Site, job: Job, driven: bool) -> list[str]:
    """The config overrides every training of the job gets: data, staging, threads, Horovod, platform (the
    job's own overrides follow them, quoted). `driven`: a driver (a campaign, a search) starts the trainings
    and gives each its own stage directory."""
    h = site.horovod
    out = [f"data.dir=$DATA_DIR", f"dist.threads_per_rank={site.threads}",
           f"dist.fusion_threshold_mb={h.fusion_threshold_mb:g}", f"dist.cycle_time_ms={h.cycle_time_ms:g}",
           f"dist.hierarchical_allreduce={str(h.hierarchical_allreduce).lower()}",
           f"dist.hierarchical_allgather={str(h.hierarchical_allgather).lower()}", f"mlperf.platform={site.name}"]
    if site.stage_rate_gb_s:
        out += [f"data.stage_rate_gb_s={site.stage_rate_gb_s:g}"]
    if site.stage_dir and not driven:  # a driver gives every run its own directory (--stage-dir)
        out += ["data.stage_dir=${STAGE_DIR:+$STAGE_DIR/$STAGE_NAME}", f"data.stage_mode={site.stage_mode}"]
    elif site.stage_dir:
        out += [f"data.stage_mode={site.stage_mode}"]
    return out


def render(site: Site, job: Job) -> str:
    """The batch script's text."""
    name = f"{'hpo-' if job.hpo else ''}{job.bench}-{site.name}-n{job.nodes}" + \
        (f"-i{job.instance:03d}" if job.separate else "")
    data = site.data.get(job.bench, "")
    if not site.suite_dir or not data or not site.output_root:
        missing = [k for k, v in (("suite_dir", site.suite_dir), (f"data.{job.bench}", data),
                                  ("output_root", site.output_root)) if not v]
        raise BenchError(f"site {site.name}: {', '.join(missing)} not set; a job needs the suite's checkout, the "
                         f"dataset and an output directory")
    campaign = bool(job.runs or job.instances)
    chains.check_chain(site, job, _seconds(job.time_limit or site.time_limit))
    if job.hpo:
        searches.check_space(job)
    check_stage_capacity(site, job)
    # the space file, with --hpo (it names the config); else the config
    inputs, what = ("SPACE", "search space") if job.hpo else ("CONFIG", "config")
    body = [
        "set -euo pipefail",
        "",
        "# ---- settings (from the site file; each may be overridden from the environment)",
        f'SUITE_DIR="${{SUITE_DIR:-{site.suite_dir}}}"',
        f'DATA_DIR="${{DATA_DIR:-{data}}}"',
        f'OUTPUT_ROOT="${{OUTPUT_ROOT:-{site.output_root}}}"',
        f'STAGE_DIR="${{STAGE_DIR:-{site.stage_dir}}}"',
        f'PYTHON="${{PYTHON:-{site.python}}}"  # runs the trainings',
        f'DRIVER_PYTHON="${{DRIVER_PYTHON:-{site.driver_python or site.python}}}"  # checks logs, drives campaigns',
        f'{inputs}="{_in_suite(job.hpo or job.config or BENCH_CONFIGS[job.bench])}"',
        *([] if campaign else [_job_id_line(site)]),
        "",
        "fail() { echo \"error: $*\" >&2; exit 2; }",
        f'[ -f "$SUITE_DIR/{job.bench}/train.py" ] || fail "SUITE_DIR=$SUITE_DIR is not the suite\'s checkout '
        f'(no {job.bench}/train.py)"',
        f'[ -f "${inputs}" ] || fail "{what} ${inputs} does not exist"',
        '[ -f "$DATA_DIR/manifest.json" ] || [ -f "$DATA_DIR/pack.json" ] || '
        'fail "DATA_DIR=$DATA_DIR holds no manifest.json or pack.json (convert or pack the dataset first)"',
        'mkdir -p "$OUTPUT_ROOT" || fail "cannot create OUTPUT_ROOT=$OUTPUT_ROOT"',
        "",
        *(chains.done_check(site, job) if job.chain else []),
        "# ---- environment",
        *_environment_setup(site),
        f"export OMP_NUM_THREADS={site.threads}",
        f"export HOROVOD_FUSION_THRESHOLD={int(site.horovod.fusion_threshold_mb * 2 ** 20)}",
        f"export HOROVOD_CYCLE_TIME={site.horovod.cycle_time_ms:g}",
        f"export HOROVOD_HIERARCHICAL_ALLREDUCE={int(site.horovod.hierarchical_allreduce)}",
        f"export HOROVOD_HIERARCHICAL_ALLGATHER={int(site.horovod.hierarchical_allgather)}",
        *[f"export {k}={shlex.quote(v)}" for k, v in sorted(site.env.items())],
        "export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}",
        "",
        *_stage_cleanup(site, job, campaign),
        "# ---- the same settings for the run's config (it applies them; the exports are for other tools)",
        "SETTINGS=(",
        *[f'    "{s}"' for s in settings(site, job, campaign or bool(job.hpo))],
        *[f"    {shlex.quote(o)}" for o in (*site.overrides.get(job.bench, ()), *job.overrides)],
        ")",
        "",
        *(_campaign(site, job) if campaign else _search(site, job) if job.hpo else _single(site, job)),
    ]
    return directives(site, job, name) + _note(site, job) + "\n".join(body) + "\n"


def _note(site: Site, job: Job) -> str:
    """The comment under the directives: the command that rendered the script, the site, the ranks."""
    words = ["python -m jobs render", f"--site {site.name}", f"--bench {job.bench}", f"--nodes {job.nodes}",
             f"--runs {job.runs}" if job.runs else "", f"--instances {job.instances}" if job.instances else "",
             f"--config {job.config}" if job.config else "", f"--time {job.time_limit}" if job.time_limit else "",
             f"--chain {job.chain}" if job.chain else "",
             f"--stop-margin {job.stop_margin}" if job.chain and job.stop_margin != chains.DEFAULT_MARGIN else "",
             f"--hpo {job.hpo} --trials {job.trials}" if job.hpo else "",
             f"--study-dir {job.study_dir}" if job.study_dir else "",
             "--separate-jobs" if job.separate else "", f"--start-at {job.start_at}" if job.start_at else "",
             *map(shlex.quote, job.overrides)]
    return (f"# Rendered by `{' '.join(w for w in words if w)}`\n"
            f"# from the site description of {site.name}: {site.description}\n"
            f"# {job.nodes} node(s) x {site.ranks_per_node} rank(s) = {job.nodes * site.ranks_per_node} ranks"
            f"{f' per instance, {job.instances} instances on {job.allocated_nodes} nodes' if job.together else ''}"
            f"{instance_jobs.note(job) if job.separate else ''}.\n")


def _in_suite(path: str) -> str:
    """A file the job reads (a config, a search space): an absolute path as given, else relative to the suite's
    checkout."""
    return path if path.startswith("/") else f"$SUITE_DIR/{path}"


def _setup_lines(line: str) -> list[str]:
    """A site's setup line, verbatim; a sourced file is the site's, which shellcheck cannot follow."""
    return ["# shellcheck source=/dev/null", line] if line.split()[:1] in (["source"], ["."]) else [line]


def _job_id_line(site: Site) -> str:
    var = JOB_ID_VARS[site.scheduler]
    stamp = "$(date +%Y%m%d-%H%M%S)"
    return f'JOB_ID="${{{var}:-{stamp}}}"' if var else f'JOB_ID="{stamp}"'


def _single(site: Site, job: Job) -> list[str]:
    place, words = _placement(site, job)
    return ["# ---- one training",
            f'RUN_DIR="$OUTPUT_ROOT/{job.bench}-$JOB_ID"',
            'echo "training: $RUN_DIR"',
            *place,
            "cd \"$SUITE_DIR\"",
            "rc=0",
            _command(words) + f' "$PYTHON" "$SUITE_DIR/{job.bench}/train.py" "$CONFIG" \\',
            '    "${SETTINGS[@]}" "run.output_dir=$RUN_DIR" || rc=$?',
            "# exit 0: target reached, 1: not reached, 2: bad input, 3: non-finite loss; the log is checked in any case",
            '"$DRIVER_PYTHON" -m common.campaign.compliance "$RUN_DIR" || true',
            'exit "$rc"']


def _campaign(site: Site, job: Job) -> list[str]:
    place, words = _placement(site, job)
    count = f"--runs {job.runs}" if job.runs else f"--instances {job.instances}"
    count += instance_jobs.driver_flags(job) if job.separate else ""
    stage = ' --stage-dir "$STAGE_DIR"' if site.stage_dir else ""
    ranks = job.nodes * site.ranks_per_node
    driver = [f'"$DRIVER_PYTHON" -m common.campaign run {job.bench} "$CONFIG" --out "$CAMPAIGN_DIR" {count} \\',
              f'    --np {ranks} --system {shlex.quote(site.name)}{stage} --python "$PYTHON" \\',
              f"    --launcher {_template(words)} \\",
              '    "${SETTINGS[@]}"']
    if job.chain:  # CAMPAIGN_DIR is set where the script checks whether anything is left (chains.done_check)
        limit = _seconds(job.time_limit or site.time_limit)
        return ["# ---- the campaign, resumed where the job before stopped", *place, "cd \"$SUITE_DIR\"",
                *chains.run_driver(site, job, limit, driver)]
    if job.separate:
        return [*instance_jobs.driver_comment(job), f'CAMPAIGN_DIR="$OUTPUT_ROOT/{campaign_dir(site, job)}"', *place,
                "cd \"$SUITE_DIR\"", *driver]
    return ["# ---- a campaign: the driver runs here, each training through the launcher; the directory does not",
            "# depend on the job, so submitting the same script again resumes the campaign",
            f'CAMPAIGN_DIR="$OUTPUT_ROOT/{campaign_dir(site, job)}"',
            *place,
            "cd \"$SUITE_DIR\"",
            *driver]


def campaign_dir(site: Site, job: Job) -> str:
    """The campaign's directory under the output root: a chain's (jobs/chain.py), or the separate instance jobs'
    shared one (jobs/instances.py)."""
    return instance_jobs.campaign_name(site, job) if job.separate else chains.campaign_name(site, job)


def _search(site: Site, job: Job) -> list[str]:
    place, words = _placement(site, job)
    return searches.worker_lines(site, job, place, _template(words))


def _placement(site: Site, job: Job) -> tuple[list[str], list[str]]:
    """The shell lines that write the files placing the ranks, and the launcher that reads them: a host
    file for mpirun under Grid Engine; for a throughput campaign under PBS or with ibrun, one file per
    instance (named by the campaign's {run}), so that every instance gets nodes of its own."""
    kind, instances = site.launcher_kind, job.together
    if site.scheduler == "sge" and kind == "mpirun":
        hostfile = f"$HOSTS_DIR/{INSTANCE_FILE if instances else 'all'}"
        split = [f'split -d -a 3 -l {job.nodes} "$HOSTS_DIR/all" "$HOSTS_DIR/instance_"'] if instances else []
        slots = f'{{print $1 " slots={site.ranks_per_node}"}}'
        return ['HOSTS_DIR="$OUTPUT_ROOT/hosts-$JOB_ID"', 'mkdir -p "$HOSTS_DIR"',
                "# the job's nodes (Grid Engine's PE_HOSTFILE), one line each with the ranks mpirun may start there",
                f"awk '!seen[$1]++ {slots}' \"$PE_HOSTFILE\" >\"$HOSTS_DIR/all\"",
                *split], launcher(site, job.nodes, hostfile)
    if site.scheduler == "pbs" and kind == "mpiexec" and instances:  # PALS' mpiexec: each instance's nodes named
        return ['HOSTS_DIR="$OUTPUT_ROOT/hosts-$PBS_JOBID"', 'mkdir -p "$HOSTS_DIR"',
                f'sort -u "$PBS_NODEFILE" | split -d -a 3 -l {job.nodes} - "$HOSTS_DIR/instance_"'], \
            launcher(site, job.nodes, f"$HOSTS_DIR/{INSTANCE_FILE}")
    if site.scheduler == "pjsub" and kind == "mpiexec" and instances:  # Fujitsu MPI: a vcoordfile per instance
        return _vcoord_instances(site, job), launcher(site, job.nodes, f"$VCOORD_DIR/{INSTANCE_FILE}")
    if kind == "ibrun" and instances:
        return _ibrun_instances(site, job), [f"$LAUNCH_DIR/{INSTANCE_FILE}", *container(site)]
    return [], launcher(site, job.nodes)


def _ibrun_instances(site: Site, job: Job) -> list[str]:
    """One launch script per instance: ibrun's -n tasks from entry -o of the job's host list (TACC's way
    to run MPI programs side by side; task_affinity places them)."""
    ranks = job.nodes * site.ranks_per_node
    extra = f" {site.launcher_args}" if site.launcher_args else ""
    return ['LAUNCH_DIR="$OUTPUT_ROOT/launch-$SLURM_JOB_ID"', 'mkdir -p "$LAUNCH_DIR"',
            f"for i in $(seq 0 {job.instances - 1}); do",
            '    cat >"$LAUNCH_DIR/instance_$(printf %03d "$i")" <<EOF',
            "#!/bin/bash",
            f'exec ibrun -n {ranks} -o $((i * {ranks})){extra} task_affinity "\\$@"',
            "EOF",
            "done",
            'chmod +x "$LAUNCH_DIR"/instance_*']


def _command(words: list[str]) -> str:
    """The launcher on the script's command line; a word that starts with a shell variable (a placement
    file) in double quotes, for the shell to fill in."""
    return " ".join(f'"{w}"' if w.startswith("$") else shlex.quote(w) for w in words)


def _template(words: list[str]) -> str:
    """The launcher as the campaign's --launcher template: braces doubled for str.format, but not in a
    placement file's name, whose {run} the campaign fills in; in double quotes when a word starts with a
    shell variable, for the shell to fill that in."""
    text = " ".join(f"'{w}'" if w.startswith("$") else shlex.quote(w.replace("{", "{{").replace("}", "}}"))
                    for w in words)
    return f'"{text}"' if any(w.startswith("$") for w in words) else shlex.quote(text)


def _vcoord_dir() -> list[str]:
    return ['VCOORD_DIR="$OUTPUT_ROOT/vcoord-$PJM_JOBID"', 'mkdir -p "$VCOORD_DIR"']


def _vcoord_instances(site: Site, job: Job) -> list[str]:
    """One vcoordfile per instance: a line per rank naming its node's coordinate in the job's one-dimensional
    node shape (node=N), instance i on nodes i*n ... i*n+n-1, ranks_per_node consecutive ranks per node."""
    n, rpn = job.nodes, site.ranks_per_node
    return [*_vcoord_dir(),
            "# each instance's ranks on nodes of its own: one line per rank, its node's coordinate",
            f"for i in $(seq 0 {job.instances - 1}); do",
            f"    seq -f '(%.0f)' $((i * {n})) $((i * {n} + {n - 1})) | awk '{{for (r = 0; r < {rpn}; r++) print}}' \\",
            '        >"$VCOORD_DIR/instance_$(printf %03d "$i")"',
            "done"]


def _environment_setup(site: Site) -> list[str]:
    """The site's module loads and setup lines, with `set -u` lifted around them: modules' and conda's
    activate scripts read variables that may be unset."""
    lines = [*(f"module load {shlex.quote(m)}" for m in site.modules),
             *(line for setup in site.setup for line in _setup_lines(setup))]
    if not lines:
        return []
    return ["set +u  # module and conda's activate scripts read unset variables", *lines, "set -u"]


# ---------------------------------------------------------------------------- node-local staging
def staging_of(site: Site, job: Job) -> tuple[str, bool, int]:
    """(stage mode, decompress, ranks per spatial group) the job's trainings stage with: the site's mode,
    then the last data.stage_mode, data.stage_decompress and parallel.spatial among the site's and the
    job's overrides (which the trainings apply after the site's settings)."""
    last = _last_overrides(site, job)
    mode = last.get("data.stage_mode", site.stage_mode)
    decompress = last.get("data.stage_decompress", "false").strip().lower() in ("true", "1", "yes")
    group = math.prod(int(part) for part in re.findall(r"\d+", last.get("parallel.spatial", "")))
    return mode, decompress, group


def _last_overrides(site: Site, job: Job) -> dict[str, str]:
    """Each key's last value among the site's and the job's overrides, in the order the trainings apply them."""
    return dict(o.partition("=")[::2] for o in (*site.overrides.get(job.bench, ()), *job.overrides))


def dataset_gb(site: Site, job: Job) -> float:
    """The GB the job's dataset takes once staged: the site's figure, else the official dataset's."""
    if job.bench in site.dataset_gb:
        return site.dataset_gb[job.bench]
    _, decompress, _ = staging_of(site, job)
    return DECOMPRESSED_GB.get(job.bench, DATASET_GB[job.bench]) if decompress else DATASET_GB[job.bench]


def stage_share_gb(site: Site, job: Job) -> float:
    """The GB one node stages: node, the whole dataset; node_share, files n, n+N, ... of every split (1/N
    of it, common/io/staging.py); rank, each rank its shard, a spatial group's ranks the group's (the
    node's ranks together: group size / N of it)."""
    mode, _, group = staging_of(site, job)
    size = dataset_gb(site, job)
    if mode == "node":
        return size
    if mode == "node_share":
        return size / job.nodes
    return size * min(group, job.nodes * site.ranks_per_node) / job.nodes


def check_stage_capacity(site: Site, job: Job) -> None:
    """Refuse a job whose share of the dataset per node exceeds what the site says its stage_dir holds."""
    if not site.stage_dir or not site.stage_capacity_gb:
        return
    share, capacity = stage_share_gb(site, job), site.stage_capacity_gb
    if share <= capacity:
        return
    mode, _, _ = staging_of(site, job)
    size = dataset_gb(site, job)
    more = (f"at least {math.ceil(share * job.nodes / capacity)} nodes" if mode != "node" else
            "data.stage_mode node_share (node copies the whole dataset to every node, whatever the node count)")
    raise BenchError(f"site file {site.source or site.name}: stage_dir {site.stage_dir} holds {capacity:g} GB per "
                     f"node (stage_capacity_gb), less than the {share:.0f} GB per node that {mode} staging of the "
                     f"{job.bench} dataset ({size:g} GB) on {job.nodes} nodes needs; use {more}, or another "
                     f"stage_dir (a larger node-local file system, or none to read data.dir in place)")


def init_estimate(site: Site, job: Job) -> tuple[str, bool]:
    """(the line, whether it warns) estimating how long the job's staging keeps init busy: the node's share of
    the dataset (`stage_share_gb`) at the site's stage_rate_gb_s or the staging benchmark's rate; ("", False)
    for a job that does not stage, or stages in the timed run."""
    timing = _last_overrides(site, job).get("data.stage_timing", "in_init").strip()
    if not site.stage_dir or timing != "in_init":
        return "", False
    mode, _, _ = staging_of(site, job)
    at = stage_rate.rate(site.stage_rate_gb_s, "plain", mode, key=f"site file {site.source or site.name}: "
                                                                   f"stage_rate_gb_s")
    return stage_rate.estimate(stage_share_gb(site, job) * 1e9, at, timing)


def _stage_cleanup(site: Site, job: Job, campaign: bool) -> list[str]:
    """Shell lines: the name of what the job's runs stage below STAGE_DIR, and an EXIT trap that removes it on
    every node of the job (one task per node through the scheduler's launcher)."""
    if not site.stage_dir:
        return []
    run = f"{job.instance:03d}" if job.separate else "*"  # a separate instance job: its own run's only
    name = (f"'{campaign_dir(site, job)}-run_{run}'" if campaign else f'"{job.bench}-$JOB_ID"')
    prep, launch = _per_node(site, job.allocated_nodes)
    return ["# ---- node-local staging: the job's runs stage into $STAGE_DIR/$STAGE_NAME (a campaign's run i into",
            "# <campaign>-run_<i>); when the script exits, however it exits (bash runs the EXIT trap after an",
            "# error or a TERM too), that is removed on every node, and nothing else of $STAGE_DIR",
            f"STAGE_NAME={name}",
            *prep,
            "# shellcheck disable=SC2317  # called by the trap",
            "clean_stage() {",
            '    [ -n "$STAGE_DIR" ] || return 0',
            '    echo "removing $STAGE_DIR/$STAGE_NAME on every node"',
            f'    {launch}find "$STAGE_DIR" -mindepth 1 -maxdepth 1 -name "$STAGE_NAME" -exec rm -rf {{}} + ||',
            '        echo "warning: removing $STAGE_DIR/$STAGE_NAME through the launcher failed (see above): removed on" \\',
            '             "this node only, other nodes of the job may keep it" >&2',
            "    # and here, on the node running this script, also when the launcher cannot start (a cancelled job)",
            '    find "$STAGE_DIR" -mindepth 1 -maxdepth 1 -name "$STAGE_NAME" -exec rm -rf {} + 2>/dev/null || true',
            "}",
            "trap clean_stage EXIT",
            ""]


def _per_node(site: Site, nodes: int) -> tuple[list[str], str]:
    """(shell lines that prepare it, the command prefix) starting one task on each of the job's nodes."""
    kind = site.launcher_kind
    if site.scheduler == "slurm":  # ibrun too: it runs in a Slurm allocation
        return [], f"srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 "
    if kind == "jsrun":
        return [], f"jsrun --nrs={nodes} --rs_per_host=1 --tasks_per_rs=1 --cpu_per_rs=1 "
    if site.scheduler == "pjsub":
        return [*_vcoord_dir(), "# one line per node: the clean-up's one rank on each",
                f"seq -f '(%.0f)' 0 {nodes - 1} >\"$VCOORD_DIR/nodes\""], \
            f'mpiexec --vcoordfile "$VCOORD_DIR/nodes" -n {nodes} '
    if site.scheduler == "pbs" and kind == "mpiexec":
        return [], f"mpiexec -n {nodes} --ppn 1 "
    if site.scheduler == "sge":
        return ['STAGE_HOSTS="$OUTPUT_ROOT/stage-nodes-$JOB_ID"',
                "# the job's nodes (Grid Engine's PE_HOSTFILE), one slot each",
                "awk '!seen[$1]++ {print $1 \" slots=1\"}' \"$PE_HOSTFILE\" >\"$STAGE_HOSTS\""], \
            f'mpirun --hostfile "$STAGE_HOSTS" -np {nodes} --map-by ppr:1:node '
    if kind == "aprun":
        return [], f"aprun -n {nodes} -N 1 "
    if kind == "mpirun":
        return [], f"mpirun -np {nodes} --map-by ppr:1:node "
    return [], ""  # local: this host
