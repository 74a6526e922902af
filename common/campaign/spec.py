"""A campaign's contract on disk: its spec (OUT/campaign.json) and each run's record
(OUT/runs/run_<i>/campaign_run.json), read by the runner and by the scoring."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Literal

from common.base import documents
from common.base.documents import check
from common.base.errors import BenchError
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

    benchmark: Literal["cosmoflow", "deepcam"]  # BENCHMARKS
    config: str
    overrides: tuple[str, ...] = ()
    mode: Literal["time_to_train", "throughput"] = "time_to_train"  # MODES
    runs: int = 0  # 0: the rules' count for the benchmark
    ranks: int = 2
    seed: int = 1000  # run i trains with run.seed = seed + i
    system: str = "local"
    launcher: str = DEFAULT_LAUNCHER
    stage_dir: str = ""  # each run stages into stage_dir/<campaign>-run_<i>, removed after the run
    python: str = ""  # the interpreter the launcher starts the trainings with ("": the one running the campaign)

    def __post_init__(self):
        # the choices again: the command line builds a spec without a document's reader
        check(self.benchmark in BENCHMARKS, "benchmark", self.benchmark, f"one of {list(BENCHMARKS)}")
        check(self.mode in MODES, "mode", self.mode, f"one of {list(MODES)}")
        check(self.runs >= 0, "runs", self.runs, ">= 0 (0: the rules' count)")
        check(self.ranks >= 1, "ranks", self.ranks, ">= 1")
        check(bool(self.system) and "/" not in self.system and not self.system.startswith("."), "system",
              self.system, "a non-empty file name (no '/')")
        for override in self.overrides:
            check(override.split("=", 1)[0] not in ("run.seed", "run.output_dir"), "overrides", override,
                  "no run.seed or run.output_dir: the campaign sets them itself")
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
    from common.campaign import rules
    return rules.required_runs(benchmark)


def run_dir(out: Path, index: int) -> Path:
    return out / "runs" / f"run_{index:03d}"


# ---------------------------------------------------------------------------- the spec on disk
@dataclasses.dataclass(frozen=True)
class CodeVersion:
    """common.base.version.code_version(): the suite's commit and the files that differed from it."""

    commit: str
    modified: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class CampaignFile:
    """OUT/campaign.json: the spec, the code it started with, and when."""

    spec: CampaignSpec
    code: CodeVersion
    started: str


def open_campaign(out: Path, spec: CampaignSpec) -> None:
    """Create OUT with its campaign.json, or check that an existing one asked for the same."""
    path = out / SPEC_NAME
    if path.is_file():
        stored = documents.read(path, CampaignFile)
        saved, ours = documents.to_dict(stored.spec), documents.to_dict(spec)
        diff = {k: (saved[k], v) for k, v in ours.items() if saved[k] != v}
        if set(diff) == {"runs"} and spec.mode == "time_to_train" and spec.count > stored.spec.count:
            print(f"campaign {out}: extended from {stored.spec.runs} to {spec.runs} runs", flush=True)
            documents.write(path, dataclasses.replace(stored, spec=spec))
            return
        if diff:
            listed = "; ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
            raise BenchError(f"{path}: this campaign was started with other arguments ({listed}); resume it with "
                             f"the same ones or choose another --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    documents.write(path, {"spec": spec, "code": code_version(), "started": time.strftime("%Y-%m-%d %H:%M:%S")})


def load_spec(out: Path) -> CampaignSpec:
    path = out / SPEC_NAME
    if not path.is_file():
        raise BenchError(f"{out}: no {SPEC_NAME}; not a campaign directory (start one with `run`)")
    return documents.read(path, CampaignFile).spec


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
    return documents.read(path, RunRecord)
