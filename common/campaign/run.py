"""Benchmark campaigns: one benchmark run N times with distinct seeds (MLPerf HPC's time-to-train score), or
M instances training at once (its throughput score), then the submission layout and the score.

    python -m common.campaign run cosmoflow cosmoflow/configs/cosmo_mini.yaml --out campaigns/cosmo \\
        [--runs 10] [--instances M] [--np 2] [--seed 1000] [--system NAME] [--stage-dir DIR] \\
        [--launcher TEMPLATE] [--python PATH] [config overrides, e.g. data.dir=... train.local_batch_size=8]
    python -m common.campaign run cosmoflow CONFIG --out OUT --instances M --instance I (--barrier | --start-at T) ...
    python -m common.campaign score campaigns/cosmo
    python -m common.campaign compare campaigns/cosmo-a campaigns/cosmo-b [--confidence 0.95]
    python -m common.campaign rcp campaigns/cosmo-b8-* --out rcps_cosmoflow_mine.json [--label local]
    python -m common.campaign rcp-check campaigns/cosmo-new --rcps rcps_cosmoflow_mine.json

`run` starts `<benchmark>/train.py` once per run through the launcher (default: this environment's
horovodrun on localhost), run i with `run.seed=<seed + i>` and its own output directory
`OUT/runs/run_<i>/` (config.yaml, mlperf.log, summary.json, train.log). With --instances M the M runs
start together and share the allocation (throughput mode); else they run one after the other (default
count: the rules' 10 for CosmoFlow, 5 for DeepCAM). A run is finished when its `campaign_run.json`
exists; a campaign started again with the same arguments keeps the finished runs and continues (a run
cut off half-way is moved to `OUT/runs/aborted/` and run again with its seed; a throughput campaign
restarts its round, as the instances must train together). A larger --runs extends a sequential
campaign; any other difference from the arguments it was started with is refused. With --instance I, the
process runs instance I only, one of M separate jobs given the same arguments, after their shared start
(common/campaign/start.py); the last to end scores the campaign. When every run is done the campaign is scored (common/campaign/scoring.py). `compare` says whether one
campaign's time to train is shorter than another's given run-to-run variation (common/campaign/uncertainty.py).

SIGUSR1 (a scheduler's warning before the time limit, forwarded by a chained job script: docs/jobs.md)
stops the campaign gracefully: the signal goes on to the running trainings, which checkpoint and exit 75;
such a run is not recorded (the next start runs it again from scratch), no further run starts, and the
campaign exits 75 (EX_TEMPFAIL) while runs are left. SIGTERM still stops the trainings at once.
`--deadline T` (seconds since the epoch, a chained job's time limit less its stop margin) exits 75 too,
rather than start a run that the longest run so far says would not end by T.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from common.base import exits
from common.base.cli import guarded
from common.base.files import write_json_atomic
from common.base.errors import BenchError
from common.base.version import REPO
from common.campaign.start import StartAbandoned, StartPlan, parse_when, wait_for_start
from common.campaign.summary import SUMMARY_NAME, read_summary
from common.campaign.spec import (BENCHMARKS, DEFAULT_LAUNCHER, RUN_RECORD, CampaignSpec, RunRecord, load_record,
                                   open_campaign, run_dir)

PROGRESS_SECONDS = 60  # how often a running training's newest epoch line is shown


class CampaignStopped(Exception):
    """A stop request ended the campaign with runs left; starting it again goes on."""


class StopRequest:
    """SIGUSR1 to the campaign: the trainings get it too, and the campaign ends after them (exit 75)."""

    def __init__(self):
        self.signum = 0
        self.forwarded: set[int] = set()  # the launchers' pids whose trainings were told

    def install(self) -> "StopRequest":
        signal.signal(signal.SIGUSR1, self._handler)
        return self

    def _handler(self, signum, _frame) -> None:
        self.signum = signum  # acted on in the wait loop, not here

    def forward(self, procs: list[subprocess.Popen]) -> None:
        """Send the signal on to every running training that has not had it yet (once each)."""
        for proc in procs:
            if self.signum and proc.pid not in self.forwarded and proc.poll() is None:
                self.forwarded.add(proc.pid)
                for pid in training_pids(proc.pid):
                    try:
                        os.kill(pid, self.signum)
                    except ProcessLookupError:
                        pass


# ---------------------------------------------------------------------------- one run
def run_command(spec: CampaignSpec, out: Path, index: int) -> list[str]:
    """The launcher, the benchmark's train.py with the config, the overrides, the run's seed and directory."""
    try:
        launcher = spec.launcher.format(np=spec.ranks, run=index, python=Path(sys.executable).parent)
    except (KeyError, IndexError) as err:
        raise BenchError(f"launcher {spec.launcher!r}: unknown placeholder {err}; it may use {{np}}, {{run}} and "
                         f"{{python}}") from None
    extra = [f"data.stage_dir={stage_path(spec, out, index)}"] if spec.stage_dir else []
    fixed = fixed_precision(spec, out)
    extra += [f"train.precision={fixed}"] if fixed else []
    return [*shlex.split(launcher), spec.python or sys.executable, str(REPO / spec.benchmark / "train.py"), spec.config,
            *spec.overrides, *extra, f"run.seed={spec.seed_of(index)}", f"run.output_dir={run_dir(out, index)}"]


def fixed_precision(spec: CampaignSpec, out: Path) -> str | None:
    """The precision every later run of the campaign trains in: where the config says train.precision=auto, the
    one its first run to finish chose (probed or cached; its summary's `precision`), so that a campaign's runs
    never differ in numerics; None before any run chose (and for an explicit precision, which every run keeps)."""
    for index in range(spec.count):
        summary = run_dir(out, index) / SUMMARY_NAME
        choice = read_summary(summary).precision if summary.is_file() else None
        if choice and choice.get("configured") == "auto" and choice.get("precision") in ("float32", "mixed_bfloat16"):
            return choice["precision"]
    return None


def training_pids(launcher: int) -> list[int]:
    """Where a stop signal for a run goes: the run's Python trainings among the launcher's descendants
    (horovodrun's and mpirun's local ranks: a signal to one rank stops them all after the same step), else
    the launcher itself (srun, aprun, mpiexec and jsrun start the ranks remotely and pass the signal on).
    The launcher is spared where ranks are found: horovodrun dies of SIGUSR1."""
    import psutil
    try:
        family = psutil.Process(launcher).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    ranks = []
    for member in family:
        try:
            cmdline = member.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if cmdline and "python" in Path(cmdline[0]).name and any(a.endswith("train.py") for a in cmdline[1:]):
            ranks.append(member.pid)
    return ranks or [launcher]


def was_stopped(out: Path, index: int, code: int) -> bool:
    """Did run `index`, which ended after a stop request, end because of it? Yes unless its summary says it
    ended on its own: exit 75, a summary saying it stopped (horovodrun exits 1 when its workers exit 75), or
    none (the signal came before the trainings handled it) all count as stopped, and the run runs again."""
    summary = run_dir(out, index) / SUMMARY_NAME
    return code == exits.STOPPED or not summary.is_file() or read_summary(summary).stopped


def stage_path(spec: CampaignSpec, out: Path, index: int) -> Path:
    return Path(spec.stage_dir) / f"{out.resolve().name}-run_{index:03d}"


def start_run(spec: CampaignSpec, out: Path, index: int) -> tuple[subprocess.Popen, list[str], float]:
    """Start run `index` in its own process group, its output in train.log; a half-written directory of
    an earlier attempt is moved to runs/aborted/ first."""
    directory = run_dir(out, index)
    if directory.exists():
        aborted = out / "runs" / "aborted" / f"{directory.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        aborted.parent.mkdir(parents=True, exist_ok=True)
        directory.rename(aborted)
        print(f"  {directory.name}: an unfinished earlier attempt moved to {aborted}", flush=True)
    directory.mkdir(parents=True)
    command = run_command(spec, out, index)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
           "PYTHONUNBUFFERED": "1"}
    with open(directory / "train.log", "wb") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc, command, time.time()


def finish_run(spec: CampaignSpec, out: Path, index: int, code: int, command: list[str], started: float) -> RunRecord:
    """Record a run that ended (its summary's status), and remove its staged data."""
    directory = run_dir(out, index)
    summary = directory / SUMMARY_NAME
    status = read_summary(summary).status if summary.is_file() else "crashed"
    record = RunRecord(index=index, seed=spec.seed_of(index), exit_code=code, wall_seconds=time.time() - started,
                       started=started, command=tuple(command), status=status)
    _remove_staged(spec, out, [index])
    write_json_atomic(dataclasses.asdict(record), directory / RUN_RECORD)
    return record


def _remove_staged(spec: CampaignSpec, out: Path, indices: list[int]) -> None:
    """Free the node-local copies of runs that ended or were stopped (--stage-dir)."""
    for index in indices if spec.stage_dir else []:
        shutil.rmtree(stage_path(spec, out, index), ignore_errors=True)


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """Terminate the runs still going, and every process they started: launchers such as horovodrun put
    their workers in process groups of their own, so the launcher's group alone does not reach them.
    What ignores SIGTERM for 20 s is killed."""
    import psutil
    family = []
    for proc in procs:
        if proc.poll() is None:
            try:
                family += psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
            os.killpg(proc.pid, signal.SIGTERM)
    for member in family:
        try:
            member.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(family, timeout=20)
    for member in alive:
        member.kill()
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---------------------------------------------------------------------------- campaigns
def run_campaign(spec: CampaignSpec, out: Path, stop: StopRequest | None = None,
                 deadline: float = 0.0) -> list[RunRecord]:
    """Run what is left of the campaign; returns every run's record. `stop`: a stop request ends it early
    (CampaignStopped) once the running trainings have stopped. `deadline` (seconds since the epoch, 0: none):
    a sequential campaign starts no run that the longest run so far says cannot end before it
    (CampaignStopped)."""
    open_campaign(out, spec)
    stop = stop or StopRequest()
    if spec.mode == "throughput":
        return _run_together(spec, out, stop)
    return _run_one_by_one(spec, out, stop, deadline)


def _run_one_by_one(spec: CampaignSpec, out: Path, stop: StopRequest, deadline: float = 0.0) -> list[RunRecord]:
    records, t0, ran = [], time.time(), 0
    for index in range(spec.count):
        done = load_record(out, index)
        if done:
            print(f"run {index + 1}/{spec.count} (seed {done.seed}): done earlier, {done.status}", flush=True)
            records.append(done)
            continue
        if stop.signum:
            raise CampaignStopped(f"{len(records)} of {spec.count} runs done; run {index + 1} not started")
        _check_time_left(records, deadline, index, spec.count)
        records.append(_run_single(spec, out, index, stop, len(records)))
        ran += 1
        print(f"run {index + 1}/{spec.count}: {describe_run(out, records[-1])}; {_eta(t0, ran, spec.count - index - 1)}",
              flush=True)
    return records


def _run_single(spec: CampaignSpec, out: Path, index: int, stop: StopRequest, done: int) -> RunRecord:
    """Run `index` alone, start to end, and its record; `done`: how many of the campaign's runs are done."""
    proc, command, started = start_run(spec, out, index)
    fixed = next((a.split("=", 1)[1] for a in command if a.startswith("train.precision=")), None)
    print(f"run {index + 1}/{spec.count} (seed {spec.seed_of(index)}): started, log "
          f"{run_dir(out, index) / 'train.log'}" + (f"; train.precision={fixed}" if fixed else ""), flush=True)
    try:
        code = _wait_all([proc], out, [index], stop)[0]
    except BaseException:
        stop_processes([proc])
        _remove_staged(spec, out, [index])
        raise
    if stop.signum and was_stopped(out, index, code):
        _remove_staged(spec, out, [index])
        raise CampaignStopped(f"{done} of {spec.count} runs done; run {index + 1} stopped "
                              f"(exit {code}) and runs again from its start")
    return finish_run(spec, out, index, code, command, started)


def run_instance(spec: CampaignSpec, out: Path, index: int, plan: StartPlan, stop: StopRequest) -> RunRecord:
    """Instance `index` of a throughput campaign whose instances are separate jobs (each with the same spec):
    after the shared start (common/campaign/start.py), before its training's init_start; its record."""
    open_campaign(out, spec)
    done = load_record(out, index)
    if done:
        print(f"instance {index} (seed {done.seed}): done earlier, {done.status}", flush=True)
        return done
    try:
        wait_for_start(plan, out, index, spec.count, lambda: bool(stop.signum))
    except StartAbandoned as err:
        raise CampaignStopped(str(err)) from None
    finished = sum(load_record(out, i) is not None for i in range(spec.count))
    record = _run_single(spec, out, index, stop, finished)
    print(f"instance {index}: {describe_run(out, record)}", flush=True)
    return record


def _check_time_left(records: list[RunRecord], deadline: float, index: int, count: int) -> None:
    """Refuse to start run `index` when the time left before `deadline` (seconds since the epoch; 0: none)
    is shorter than the longest run recorded so far: it would only be stopped, and its time wasted."""
    if not deadline or not records:
        return
    longest, left = max(r.wall_seconds for r in records), deadline - time.time()
    if left < longest:
        raise CampaignStopped(f"{len(records)} of {count} runs done; run {index + 1} not started: "
                              f"{max(left, 0) / 60:.1f} min left before the deadline, and a run took up to "
                              f"{longest / 60:.1f} min")


def _run_together(spec: CampaignSpec, out: Path, stop: StopRequest) -> list[RunRecord]:
    records = [load_record(out, i) for i in range(spec.count)]
    if all(records):
        print(f"all {spec.count} instances done earlier", flush=True)
        return records
    if stop.signum:
        raise CampaignStopped(f"the {spec.count} instances not started")
    print(f"starting {spec.count} instances together, {spec.ranks} ranks each", flush=True)
    started = [start_run(spec, out, i) for i in range(spec.count)]
    procs = [p for p, _, _ in started]
    try:
        codes = _wait_all(procs, out, list(range(spec.count)), stop)
    except BaseException:
        stop_processes(procs)
        _remove_staged(spec, out, list(range(spec.count)))
        raise
    if stop.signum and any(was_stopped(out, i, code) for i, code in enumerate(codes)):
        _remove_staged(spec, out, list(range(spec.count)))
        raise CampaignStopped(f"the {spec.count} instances stopped; their round runs again from its start")
    return [finish_run(spec, out, i, code, command, t) for i, (code, (_, command, t)) in enumerate(zip(codes, started))]


def _wait_all(procs: list[subprocess.Popen], out: Path, indices: list[int], stop: StopRequest) -> list[int]:
    """Wait for the runs `indices`, saying when each ends and, every PROGRESS_SECONDS, where each stands (the
    last progress line of its train.log); a stop request goes on to them."""
    codes: list[int | None] = [None] * len(procs)
    shown: dict[int, str] = {}
    last = time.time()
    while None in codes:
        stop.forward(procs)
        for i, proc in enumerate(procs):
            if codes[i] is None and proc.poll() is not None:
                codes[i] = proc.returncode
                if len(procs) > 1:
                    print(f"  instance {i + 1}/{len(procs)} ended (exit {proc.returncode}); "
                          f"{codes.count(None)} still training", flush=True)
        if time.time() - last >= PROGRESS_SECONDS:
            last = time.time()
            for i, index in enumerate(indices):
                line = progress_line(run_dir(out, index) / "train.log")
                if codes[i] is None and line and line != shown.get(i):
                    shown[i] = line
                    print(f"  run_{index:03d}: {line}", flush=True)
        _pause(procs, codes, stop)
    return codes


def _pause(procs: list[subprocess.Popen], codes: list[int | None], stop: StopRequest, seconds: float = 1.0) -> None:
    """Wait up to `seconds` between two looks at the runs, less when a run still going ends or a stop request
    comes (its look then follows at once)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        going = [proc for proc, code in zip(procs, codes) if code is None]
        if not going or any(proc.poll() is not None for proc in going):  # a run ended
            return
        if stop.signum and any(proc.pid not in stop.forwarded for proc in going):  # a request to pass on
            return
        time.sleep(0.05)


def progress_line(log: Path) -> str:
    """The newest epoch line a training printed to `log` (launcher prefixes removed), or ""."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [re.sub(r"^(\[\d+,\d+\]<std(out|err)>:)+", "", line).strip()
             for line in re.split(r"[\r\n]+", tail)]
    return next((line for line in reversed(lines) if line.startswith("epoch")), "")


def describe_run(out: Path, record: RunRecord) -> str:
    """One line: status, time to train and final metric from the run's summary, wall time."""
    summary = run_dir(out, record.index) / SUMMARY_NAME
    wall = f"{record.wall_seconds / 60:.1f} min wall"
    if not summary.is_file():
        return f"crashed (exit {record.exit_code}, no summary.json; see train.log), {wall}"
    s = read_summary(summary)
    metric_text = f"{s.metric_name} {s.final_metric:.4f}" if s.final_metric is not None else "no metric"
    seconds = s.time_to_train_seconds if s.time_to_train_seconds is not None else float("nan")
    return f"{s.status}, time to train {seconds:.1f} s, {s.epochs} epochs, {metric_text}, {wall}"


def _eta(t0: float, ran: int, left: int) -> str:
    elapsed = time.time() - t0
    return f"campaign {elapsed / 60:.1f} min so far, about {elapsed / ran * left / 60:.0f} min left" if left else \
        f"campaign done in {elapsed / 60:.1f} min"


# ---------------------------------------------------------------------------- command line
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m common.campaign", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or resume) a campaign, then score it")
    run.add_argument("benchmark", choices=BENCHMARKS)
    run.add_argument("config", help="the benchmark's YAML config")
    run.add_argument("overrides", nargs="*", help="dotted config overrides (not run.seed / run.output_dir)")
    run.add_argument("--out", required=True, help="the campaign directory")
    run.add_argument("--runs", type=int, default=0, help="sequential runs (default: the rules' 10 / 5)")
    run.add_argument("--instances", type=int, default=0, help="throughput mode: this many runs at once")
    run.add_argument("--np", type=int, default=2, help="ranks per run (default 2)")
    run.add_argument("--seed", type=int, default=1000, help="run i uses seed + i (default 1000)")
    run.add_argument("--system", default="local", help="the system's name in the submission layout")
    run.add_argument("--system-file", help="a system description JSON whose fields replace the detected ones")
    run.add_argument("--stage-dir", default="", help="node-local directory; each run stages below it")
    run.add_argument("--python", default="", help="the trainings' interpreter, e.g. a container's python "
                                                   "(default: this one)")
    run.add_argument("--deadline", type=float, default=0.0,
                     help="seconds since the epoch: start no run that the longest run so far says would end "
                          "after it (a chained job's stop margin: docs/jobs.md); exit 75 instead")
    run.add_argument("--launcher", default=DEFAULT_LAUNCHER,
                     help="how a run is launched; {np}, {run} and {python} are filled in (default: %(default)s)")
    run.add_argument("--instance", type=int, default=None, metavar="I",
                     help="with --instances M: run instance I (0 to M-1) only, one of M separate jobs given the same "
                          "arguments, after their shared start (--start-at or --barrier)")
    run.add_argument("--start-at", default="", metavar="WHEN",
                     help="with --instance: the shared start, seconds since the epoch or ISO 8601 with a time zone")
    run.add_argument("--barrier", action="store_true",
                     help="with --instance: start once every instance's job has arrived (files in OUT/barrier/)")
    run.add_argument("--wait-limit", type=float, default=0.0, metavar="SECONDS",
                     help="with --instance: stop waiting for the shared start after this long, exit 75 "
                          "(default 0: until the job's time limit)")
    score = sub.add_parser("score", help="(re)write the submission layout and the score of a campaign")
    score.add_argument("out", help="the campaign directory")
    score.add_argument("--system-file", help="a system description JSON whose fields replace the detected ones")
    compare = sub.add_parser("compare", help="compare two scored time-to-train campaigns, with bootstrap intervals")
    compare.add_argument("a", help="campaign A's directory (holding score.json)")
    compare.add_argument("b", help="campaign B's directory")
    compare.add_argument("--confidence", type=float, default=0.95, help="the intervals' level (default %(default)s)")
    rcp = sub.add_parser("rcp", help="write an RCP file (mlperf-logging's format) from campaigns' runs")
    rcp.add_argument("campaigns", nargs="+", help="campaign directories (runs/run_*/mlperf.log)")
    rcp.add_argument("--out", required=True, help="the RCP JSON file to write")
    rcp.add_argument("--label", default="local", help="each record is named <benchmark>_<label>_<batch>")
    rcp_check = sub.add_parser("rcp-check", help="mlperf-logging's RCP checker on a scored campaign, against an "
                                                 "RCP file")
    rcp_check.add_argument("campaign")
    rcp_check.add_argument("--rcps", required=True, help="an RCP file (from `rcp`, or mlperf-logging's)")
    from common.storage import sweep
    sweep.add_arguments(sub.add_parser("storage", help="can this storage feed N accelerators? emulated epochs at "
                                                       "growing rank counts (common/storage/sweep.py)"))
    # Overrides may also follow the options (argparse alone would refuse positionals after them).
    args, extra = parser.parse_known_args(argv)
    unknown = [e for e in extra if e.startswith("-") or "=" not in e or args.command not in ("run", "storage")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra or args.command == "storage":
        args.overrides = [*getattr(args, "overrides", []), *extra]
    return args


def spec_from_args(args: argparse.Namespace) -> CampaignSpec:
    if args.runs and args.instances:
        raise BenchError(f"--runs {args.runs} and --instances {args.instances}: give one (sequential runs, or "
                         f"that many instances at once)")
    return CampaignSpec(benchmark=args.benchmark, config=args.config, overrides=tuple(args.overrides),
                        mode="throughput" if args.instances else "time_to_train",
                        runs=args.instances or args.runs, ranks=args.np, seed=args.seed, system=args.system,
                        launcher=args.launcher, stage_dir=args.stage_dir, python=args.python)


def start_plan(args: argparse.Namespace) -> StartPlan | None:
    """The shared start of an instance submitted as a separate job (--instance), or None for a whole campaign."""
    given = [flag for flag, on in (("--start-at", args.start_at), ("--barrier", args.barrier),
                                   ("--wait-limit", args.wait_limit)) if on]
    if args.instance is None:
        if given:
            raise BenchError(f"{' and '.join(given)}: the shared start of instances submitted as separate jobs; give "
                             f"--instance I too (a campaign's own instances start together)")
        return None
    if not args.instances or not 0 <= args.instance < args.instances:
        raise BenchError(f"--instance {args.instance}: expected 0 to M-1 with --instances M (given: "
                         f"--instances {args.instances})")
    if bool(args.start_at) == args.barrier:
        raise BenchError(f"--instance {args.instance}: give one shared start, --start-at WHEN or --barrier "
                         f"(given: {' and '.join(given) or 'neither'})")
    if not 0 <= args.wait_limit < float("inf"):
        raise BenchError(f"--wait-limit {args.wait_limit}: expected seconds >= 0 (0: no limit)")
    return StartPlan(at=parse_when(args.start_at) if args.start_at else None, barrier=args.barrier,
                     wait_limit=args.wait_limit)


def check_config(spec: CampaignSpec) -> None:
    """The trainings' config (the campaign's overrides and its last run's seed) checked by the application's
    dry run, before any run starts: a bad override is refused now rather than by every run."""
    from common.hpo.space import plan
    try:
        plan(spec.benchmark, Path(spec.config), [*spec.overrides, f"run.seed={spec.seed_of(spec.count - 1)}"],
             spec.ranks)
    except BenchError as err:
        raise BenchError(f"the campaign's trainings would refuse their config: {err}") from None


def _analysis_command(args: argparse.Namespace) -> int:
    """compare, rcp and rcp-check: commands on finished campaigns."""
    if args.command == "compare":
        from common.campaign.uncertainty import compare
        print(compare(Path(args.a), Path(args.b), args.confidence))
        return 0
    from common.campaign import rcps
    if args.command == "rcp":
        print("\n".join(rcps.write_rcps([Path(c) for c in args.campaigns], Path(args.out), args.label)))
        return 0
    verdict = rcps.check_campaign(Path(args.campaign), Path(args.rcps))
    print(f"RCP checker: {'passed' if verdict['passed'] else 'failed'}: {verdict['message']} ({verdict['log']})")
    return exits.SUCCESS if verdict["passed"] else exits.CHECKER_FAILED


def _exit_on_sigterm(signum, frame) -> None:
    """A scheduler's SIGTERM (time limit, scancel) unwinds like Ctrl-C: the running trainings are stopped."""
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    stop = StopRequest().install()

    def run() -> int:
        from common.campaign.scoring import score_campaign
        if args.command in ("compare", "rcp", "rcp-check"):
            return _analysis_command(args)
        if args.command == "storage":
            from common.storage.sweep import storage_command
            return storage_command(args, args.overrides)
        out = Path(args.out)
        if args.command == "run":
            left = _run_command(args, out, stop)
            if left is not None:
                return left
        result = score_campaign(out, system_file=args.system_file)
        return exits.SUCCESS if result.valid else exits.TARGET_NOT_REACHED  # no valid score: too few runs converged

    return guarded(run)


def _run_command(args: argparse.Namespace, out: Path, stop: StopRequest) -> int | None:
    """`run`: the campaign's runs (or one instance's), then None for scoring it, else the exit code: 75 when it was
    stopped; an instance's training's code while other instances are left (or another instance scores them)."""
    spec, plan = spec_from_args(args), start_plan(args)
    if not Path(spec.config).is_file():
        raise BenchError(f"config {spec.config}: no such file")
    check_config(spec)
    what = f"instance {args.instance} of {spec.count}" if plan else \
        f"{spec.count} runs {'at once' if spec.mode == 'throughput' else 'one after the other'}"
    print(f"campaign {out}: {spec.benchmark}, {what}, {spec.ranks} ranks each", flush=True)
    try:
        if plan is None:
            run_campaign(spec, out, stop, args.deadline)
            return None
        record = run_instance(spec, out, args.instance, plan, stop)
    except CampaignStopped as err:
        how = f"by {signal.Signals(stop.signum).name}" if stop.signum else "before its deadline" if plan is None \
            else "waiting for the shared start"
        print(f"campaign {out} stopped {how}: {err}; start it again with the same arguments to go on", flush=True)
        return exits.STOPPED  # as a stopped training: go on in a later job
    return _after_instance(spec, out, record, args.system_file)


def _after_instance(spec: CampaignSpec, out: Path, record: RunRecord, system_file: str | None) -> int:
    """When every instance is done, the campaign's score (by this process if it claims the scoring: OUT/.scoring,
    created once, so that two instances ending together do not score at once); else the instance's exit code."""
    done = sum(load_record(out, i) is not None for i in range(spec.count))
    own = record.exit_code if record.exit_code in exits.MEANINGS else exits.INTERNAL_ERROR
    if done < spec.count:
        print(f"{done} of {spec.count} instances done; the last to end scores the campaign (or: python -m "
              f"common.campaign score {out})", flush=True)
        return own
    claim = out / ".scoring"
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        print(f"every instance is done; another instance is scoring the campaign ({claim})", flush=True)
        return own
    from common.campaign.scoring import score_campaign
    try:
        result = score_campaign(out, system_file=system_file)
    finally:
        claim.unlink(missing_ok=True)
    return exits.SUCCESS if result.valid else exits.TARGET_NOT_REACHED


if __name__ == "__main__":
    sys.exit(main())
