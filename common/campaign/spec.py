"""A campaign's contract on disk: its spec (OUT/campaign.json) and each run's record
(OUT/runs/run_<i>/campaign_run.json), read by the runner and by the scoring."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from common.base.errors import BenchError
from common.base.files import write_json_atomic
from common.base.version import code_version

BENCHMARKS = ("cosmoflow", "deepcam")
SPEC_NAME = "campaign.json"
RUN_RECORD = "campaign_run.json"
MODES = ("time_to_train", "throughput")
# Placeholders a launcher template may use: {np} ranks per run, {run} the run's index, {python} this
# interpreter's directory (where horovodrun is installed).
DEFAULT_LAUNCHER = "{python}/horovodrun -np {np} -H localhost:{np}"

@dataclasses.dataclass(frozen=True)
class CampaignSpec:
    """What a campaign runs; saved as OUT/campaign.json and compared when the campaign is resumed."""

    benchmark: str
    config: str
    overrides: tuple[str, ...] = ()
    mode: str = "time_to_train"
    runs: int = 0  # 0: the rules' count for the benchmark
    ranks: int = 2
    seed: int = 1000  # run i trains with run.seed = seed + i
    system: str = "local"
    launcher: str = DEFAULT_LAUNCHER
    stage_dir: str = ""  # each run stages into stage_dir/<campaign>-run_<i>, removed after the run
    python: str = ""  # the interpreter the launcher starts the trainings with ("": the one running the campaign)

    def __post_init__(self):
        if self.benchmark not in BENCHMARKS:
            raise BenchError(f"benchmark {self.benchmark!r}: expected one of {list(BENCHMARKS)}")
        if self.mode not in MODES:
            raise BenchError(f"campaign mode {self.mode!r}: expected one of {list(MODES)}")
        if self.runs < 0 or self.ranks < 1:
            raise BenchError(f"runs {self.runs} and ranks {self.ranks}: expected runs >= 0 (0: the rules' count) "
                             f"and ranks >= 1")
        if not self.system or "/" in self.system or self.system.startswith("."):
            raise BenchError(f"system name {self.system!r}: expected a non-empty file name (no '/')")
        for override in self.overrides:
            if override.split("=", 1)[0] in ("run.seed", "run.output_dir"):
                raise BenchError(f"override {override!r}: the campaign sets run.seed and run.output_dir itself")
        if self.mode == "throughput" and not self.stage_dir and any(o.startswith("data.stage_dir=")
                                                                     for o in self.overrides):
            raise BenchError("data.stage_dir with concurrent instances: they would stage into one directory; "
                             "give --stage-dir instead (every instance gets its own directory below it)")

    @property
    def count(self) -> int:
        return self.runs or required_runs(self.benchmark)

    def seed_of(self, index: int) -> int:
        return self.seed + index


def required_runs(benchmark: str) -> int:
    """How many runs MLPerf HPC asks of a benchmark (mlperf-logging's table: CosmoFlow 10, DeepCAM 5)."""
    from mlperf_logging.benchmark_meta import get_result_file_counts
    return get_result_file_counts("hpc")[benchmark]


def run_dir(out: Path, index: int) -> Path:
    return out / "runs" / f"run_{index:03d}"


# ---------------------------------------------------------------------------- the spec on disk
def open_campaign(out: Path, spec: CampaignSpec) -> None:
    """Create OUT with its campaign.json, or check that an existing one asked for the same."""
    path = out / SPEC_NAME
    if path.is_file():
        stored = json.loads(path.read_text())
        # Keys a campaign.json from an older version lacks have their defaults.
        defaults = {f.name: _plain(f.default) for f in dataclasses.fields(CampaignSpec)
                    if f.default is not dataclasses.MISSING}
        saved, ours = {**defaults, **stored["spec"]}, dataclasses.asdict(spec)
        diff = {k: (saved.get(k), _plain(v)) for k, v in ours.items() if _plain(saved.get(k)) != _plain(v)}
        if set(diff) == {"runs"} and spec.mode == "time_to_train" and spec.count > CampaignSpec(**{
                **saved, "overrides": tuple(saved["overrides"])}).count:
            print(f"campaign {out}: extended from {saved['runs']} to {spec.runs} runs", flush=True)
            write_json_atomic({**stored, "spec": ours}, path)
            return
        if diff:
            listed = "; ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
            raise BenchError(f"{path}: this campaign was started with other arguments ({listed}); resume it with "
                             f"the same ones or choose another --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic({"spec": dataclasses.asdict(spec), "code": code_version(),
                       "started": time.strftime("%Y-%m-%d %H:%M:%S")}, path)


def load_spec(out: Path) -> CampaignSpec:
    path = out / SPEC_NAME
    if not path.is_file():
        raise BenchError(f"{out}: no {SPEC_NAME}; not a campaign directory (start one with `run`)")
    spec = json.loads(path.read_text())["spec"]
    known = {f.name for f in dataclasses.fields(CampaignSpec)}
    return CampaignSpec(**{**{k: v for k, v in spec.items() if k in known}, "overrides": tuple(spec["overrides"])})


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """How one run of the campaign went (OUT/runs/run_<i>/campaign_run.json)."""

    index: int
    seed: int
    exit_code: int
    wall_seconds: float
    started: float  # epoch seconds
    command: tuple[str, ...]
    status: str  # the summary's status (success, aborted), or "crashed" when it wrote none


def load_record(out: Path, index: int) -> RunRecord | None:
    path = run_dir(out, index) / RUN_RECORD
    if not path.is_file():
        return None
    obj = json.loads(path.read_text())
    return RunRecord(**{**obj, "command": tuple(obj["command"])})
