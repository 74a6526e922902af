"""Reference convergence points from this suite's own runs, in mlperf-logging's RCP format, and runs
checked against them with mlperf-logging's RCP checker (docs/campaigns.md, "Convergence points").

    python -m common.campaign rcp CAMPAIGN [CAMPAIGN ...] --out rcps_cosmoflow_mine.json [--label local]
    python -m common.campaign rcp-check CAMPAIGN --rcps rcps_cosmoflow_mine.json

`rcp` reads every finished run's MLPerf log under the campaigns (or HPO studies' trial directories, any
directory holding `runs/run_*/mlperf.log`), groups the runs by benchmark and global batch size, and
writes one record per group as `rcp_checker/hpc_3.0.0/rcps_<benchmark>.json` spells them:
`{"<benchmark>_<label>_<BS>": {"Benchmark", "BS", "Epochs to converge": [...], "Hyperparams": {...}}}`.
A run's epochs to converge are the epoch_num of its last evaluation before a successful run_stop (what
the checker itself reads from a result file); runs that did not converge are left out and counted. The
hyperparameters are the log's opt_*, scheduler_* and batch-norm keys with global_batch_size and
dropout; runs of one group must agree on every one of them. The rules ask a reference for twice a
submission's run count (20 CosmoFlow, 10 DeepCAM runs); fewer are written and said.

`rcp-check` runs mlperf-logging's RCP checker (`--custom_rcps`) on a scored campaign's result files.
"""
from __future__ import annotations

from pathlib import Path

from common.base.errors import BenchError
from common.base.files import write_json_atomic
from common.base.mlperf_log import metadata, read_events

MIN_RUNS = 3  # an olympic mean drops the fastest and the slowest
REFERENCE_RUNS = {"cosmoflow": 20, "deepcam": 10}  # twice the rules' submission runs
EXACT_KEYS = ("global_batch_size", "gradient_accumulation_frequency", "dropout")
PREFIXES = ("opt_", "scheduler_", "batchnorm_")


def read_run(log: Path) -> tuple[str, int, dict, float | None]:
    """A run's benchmark, global batch size, hyperparameters and epochs to converge (None: not converged)."""
    hyper, benchmark, epoch, converged = {}, None, None, False
    for event in read_events(log, strict=True):
        key, value = event.get("key"), event.get("value")
        if key == "submission_benchmark":
            benchmark = value
        elif key in EXACT_KEYS or (isinstance(key, str) and key.startswith(PREFIXES)):
            hyper.setdefault(key, value)
        elif key in ("eval_accuracy", "eval_error"):
            epoch = metadata(event).get("epoch_num")
        elif key == "run_stop":
            converged = metadata(event).get("status") == "success"
    if benchmark is None or "global_batch_size" not in hyper:
        raise BenchError(f"{log}: no submission_benchmark or global_batch_size; not a complete MLPerf log")
    return benchmark, int(hyper["global_batch_size"]), hyper, round(float(epoch), 3) if converged and epoch else None


def run_logs(directory: Path) -> list[Path]:
    """The MLPerf logs of the finished runs under a campaign (or search) directory: those with a campaign's
    run record or a search's trial record."""
    logs = sorted(p / "mlperf.log" for p in (directory / "runs").glob("run_*") if (p / "mlperf.log").is_file()
                  and ((p / "campaign_run.json").is_file() or (p / "trial.json").is_file()))
    if not logs:
        raise BenchError(f"{directory}: no finished run with an MLPerf log under {directory / 'runs'} "
                         f"(runs/run_*/ with mlperf.log and campaign_run.json or trial.json)")
    return logs


def build_rcps(directories: list[Path], label: str = "local") -> tuple[dict, list[str]]:
    """The RCP records of the runs under `directories`, and notes on what was left out or is short."""
    groups: dict[tuple[str, int], dict] = {}
    for log in (log for d in directories for log in run_logs(d)):
        benchmark, batch, hyper, epochs = read_run(log)
        group = groups.setdefault((benchmark, batch), {"hyper": hyper, "first": log, "epochs": [], "failed": 0})
        _same_hyperparameters(group, hyper, log)
        if epochs is None:
            group["failed"] += 1
        else:
            group["epochs"].append(epochs)
    benchmarks = {b for b, _ in groups}
    if len(benchmarks) > 1:
        raise BenchError(f"runs of several benchmarks ({', '.join(sorted(benchmarks))}): an RCP file holds one's")
    records, notes = {}, []
    for (benchmark, batch), group in sorted(groups.items()):
        name = f"{benchmark}_{label}_{batch}"
        if len(group["epochs"]) < MIN_RUNS:
            raise BenchError(f"{name}: {len(group['epochs'])} converged runs at global batch {batch} (e.g. "
                             f"{group['first']}); an RCP needs at least {MIN_RUNS}")
        records[name] = {"Benchmark": benchmark, "BS": batch, "Epochs to converge": sorted(group["epochs"]),
                         "Hyperparams": group["hyper"]}
        wanted = REFERENCE_RUNS.get(benchmark, 0)
        if group["failed"] or len(group["epochs"]) < wanted:
            notes.append(f"{name}: {len(group['epochs'])} converged runs ({group['failed']} not converged, left out)"
                         f"; the rules ask a reference for {wanted}")
    return records, notes


def _same_hyperparameters(group: dict, hyper: dict, log: Path) -> None:
    differ = sorted(k for k in set(hyper) | set(group["hyper"]) if hyper.get(k) != group["hyper"].get(k))
    if differ:
        key = differ[0]
        raise BenchError(f"{log} and {group['first']} have global batch {hyper['global_batch_size']} but differ in "
                         f"{', '.join(differ)} ({key}: {hyper.get(key)!r} against {group['hyper'].get(key)!r}); "
                         f"an RCP is one set of hyperparameters: give the campaigns of one setting")


def write_rcps(directories: list[Path], out: Path, label: str = "local") -> list[str]:
    """Write the RCP file; returns lines describing it."""
    if not label.replace("-", "").replace("_", "").isalnum():
        raise BenchError(f"--label {label!r}: expected letters, digits, - and _ (it is part of each RCP's name)")
    records, notes = build_rcps(directories, label)
    write_json_atomic(records, out)
    lines = [f"wrote {out}: {len(records)} RCP(s)"]
    lines += [f"  {name}: global batch {r['BS']}, {len(r['Epochs to converge'])} runs, epochs to converge "
              f"{r['Epochs to converge']}" for name, r in records.items()]
    return lines + [f"  note: {n}" for n in notes]


def check_campaign(campaign: Path, rcps: Path) -> dict:
    """mlperf-logging's RCP checker on a scored campaign's result files against the RCP file `rcps`."""
    from common.campaign.scoring import rcp_check
    from common.campaign.spec import load_spec
    if not rcps.is_file():
        raise BenchError(f"--rcps {rcps}: no such file")
    spec = load_spec(campaign)
    scaling = "weak" if spec.mode == "throughput" else "strong"
    folder = campaign / "submission" / "results" / spec.system / scaling / spec.benchmark
    if not folder.is_dir():
        raise BenchError(f"{folder}: no result files; score the campaign first (python -m common.campaign score "
                         f"{campaign})")
    return rcp_check(folder, campaign / "rcp_checker_custom.log", rcps)
