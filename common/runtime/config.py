"""Typed configuration: frozen dataclasses per section, YAML files, dotted overrides.

A config file maps sections to dataclasses; each application declares its own root type (for example `CosmoConfig`)
whose fields are section dataclasses. `load_config` reads the YAML, applies `section.key=value` overrides from the
command line, rejects unknown keys with the list of valid ones, checks types, and returns a frozen object.
`save_config` writes the resolved config back as YAML into a run's output directory. `resolve` gives the config a run
uses: the reference convergence point (RCP) `optimizer.rcp` names applied and the MLPerf division settled.
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Callable, Literal, Sequence, TypeVar

import yaml

from common.base import documents
from common.base.files import ram_filesystem
from common.base.errors import BenchError
from common.storage.accelerators import EmulateConfig

T = TypeVar("T")


# ---------------------------------------------------------------------------- shared sections
@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Where a run writes and how it is seeded."""

    name: str = "run"
    output_dir: str = "runs/${run.name}"
    seed: int = 0  # in [0, 2^31): what TensorFlow, NumPy and DALI accept; a campaign's runs take seed + i

    def __post_init__(self):
        check(self.output_dir.strip() != "", "run.output_dir", self.output_dir, "a directory (not empty)")
        check(0 <= self.seed < 2 ** 31, "run.seed", self.seed, "an integer in [0, 2^31)")


@dataclasses.dataclass(frozen=True)
class ElasticConfig:
    """Elastic Horovod training: ranks may leave and join (common/runtime/elastic.py, docs/faults.md)."""

    enabled: bool = False  # run under hvd.elastic.run; launch with horovodrun --host-discovery-script
    commit_every_steps: int = 10  # commit the in-memory state every this many steps (and at every epoch end)
    # A worker whose process sends no heartbeat for this many seconds (stopped or frozen) is SIGKILLed by its
    # watchdog, so that Horovod drops its host and the others go on (common/runtime/elastic.py); 0: no watchdog.
    # At least 5 heartbeats (1 s apart). A live worker beats from a thread of its own, busy or not.
    hang_timeout_s: float = 60.0

    def __post_init__(self):
        check(self.commit_every_steps >= 1, "dist.elastic.commit_every_steps", self.commit_every_steps, ">= 1")
        check(self.hang_timeout_s == 0 or 5 <= self.hang_timeout_s < math.inf, "dist.elastic.hang_timeout_s",
              self.hang_timeout_s, "0 (no watchdog) or seconds >= 5")


@dataclasses.dataclass(frozen=True)
class DistConfig:
    """Distributed runtime: threads per rank and Horovod's knobs (applied before hvd.init)."""

    threads_per_rank: int = 0  # 0: cores available to this process / ranks on this node
    inter_op_threads: int = 2
    onednn: bool = True  # TF_ENABLE_ONEDNN_OPTS; TF 2.18 leaves it off on some x86 CPUs (4x slower Conv3D)
    fusion_threshold_mb: float = 64.0  # HOROVOD_FUSION_THRESHOLD
    # HOROVOD_CYCLE_TIME. Each cycle Horovod's background thread coordinates with every rank, even with nothing
    # to reduce; with Open MPI busy-polling, 1 ms took ~0.3 of a core per rank here. 10 ms adds up to 10 ms to
    # each allreduce: short steps pay that (cosmo_mini sets 2 ms; docs/metrics.md, "Horovod cycle time").
    cycle_time_ms: float = 10.0
    # OMPI_MCA_mpi_yield_when_idle (Open MPI; other MPIs ignore it). While Horovod's background thread waits in
    # MPI for the other ranks (every cycle) it otherwise busy-polls a core the compute threads need: 2 ranks on
    # 2 cores spent ~10% of each core in Horovod's and MPI's threads, a fifth of that with yielding on
    # (docs/metrics.md, "Two processes on two cores"). Yielding returns at once on an idle core.
    mpi_yield_when_idle: bool = True
    hierarchical_allreduce: bool = False  # HOROVOD_HIERARCHICAL_ALLREDUCE
    hierarchical_allgather: bool | None = None  # HOROVOD_HIERARCHICAL_ALLGATHER; None: as hierarchical_allreduce
    elastic: ElasticConfig = dataclasses.field(default_factory=ElasticConfig)

    def __post_init__(self):
        check(self.threads_per_rank >= 0, "dist.threads_per_rank", self.threads_per_rank, ">= 0")
        check(self.inter_op_threads >= 1, "dist.inter_op_threads", self.inter_op_threads, ">= 1")
        check(self.fusion_threshold_mb >= 0, "dist.fusion_threshold_mb", self.fusion_threshold_mb, ">= 0")
        check(self.cycle_time_ms > 0, "dist.cycle_time_ms", self.cycle_time_ms, "> 0")


@dataclasses.dataclass(frozen=True)
class SystemConfig:
    """summary.json's `system` figures (common/runtime/monitor.py)."""

    enabled: bool = True
    probe: bool = True  # measure the node's peak FLOP/s once per host when not cached (common/runtime/probe.py)
    warmup_steps: int = 5  # training steps before the window opens
    window_steps: int = 20  # training steps the window times by phase (0: none, no collective figures)

    def __post_init__(self):
        check(self.warmup_steps >= 1, "system.warmup_steps", self.warmup_steps, ">= 1")
        check(self.window_steps >= 0, "system.window_steps", self.window_steps, ">= 0")


@dataclasses.dataclass(frozen=True)
class TensorBoardConfig:
    """TensorBoard event files that rank 0 writes into the run directory (tensorboard --logdir runs/)."""

    enabled: bool = True
    every_steps: int = 10  # training loss, learning rate and samples/s every this many steps

    def __post_init__(self):
        check(self.every_steps >= 1, "tensorboard.every_steps", self.every_steps, ">= 1")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Epoch budget, batch size per rank and the quality target."""

    max_epochs: int = 64
    local_batch_size: int = 4
    target: float = 0.124
    eval_every: int = 1  # epochs between evaluations
    eval_every_steps: int = 0  # > 0: evaluate every this many optimizer steps instead (inside epochs too)
    # Keras mixed-precision policy (common/runtime/strategy.py): float32 weights, this compute dtype;
    # mixed_float16 adds dynamic loss scaling. Losses and metrics stay float32.
    # auto (the default): mixed_bfloat16 where this host's probe, weighed by the committed record of bfloat16's
    # epochs to the target, says it trains to the target faster, else float32 (common/runtime/precision.py)
    precision: Literal["auto", "float32", "mixed_bfloat16", "mixed_float16"] = "auto"
    jit_compile: bool = False  # XLA-compile each training step's forward and backward pass
    # An emulated accelerator's time instead of each step's work (common/storage/, docs/storage.md)
    emulate: EmulateConfig = dataclasses.field(default_factory=EmulateConfig)

    @property
    def emulated(self) -> bool:
        """Whether an accelerator is emulated (train.emulate.accelerator is not none)."""
        return self.emulate.accelerator != "none"

    def __post_init__(self):
        check(self.max_epochs >= 1, "train.max_epochs", self.max_epochs, ">= 1")
        custom = self.emulate.accelerator == "custom"
        check(self.emulate.samples_per_second > 0 if custom else self.emulate.samples_per_second == 0,
              "train.emulate.samples_per_second", self.emulate.samples_per_second,
              "samples/s > 0 with accelerator=custom" if custom else "0: set only with accelerator=custom")
        check(self.local_batch_size >= 1, "train.local_batch_size", self.local_batch_size, ">= 1")
        check(self.eval_every >= 1, "train.eval_every", self.eval_every, ">= 1")
        check(self.eval_every_steps >= 0, "train.eval_every_steps", self.eval_every_steps, ">= 0")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints, resuming, and what the scheduler's stop signals do (common/runtime/checkpoint.py, docs/faults.md)."""

    dir: str = ""  # "": <run.output_dir>/checkpoints
    every_epochs: int = 0  # a checkpoint at the end of every this many epochs; 0: none on that schedule
    every_minutes: float = 0.0  # one at the first epoch end this many minutes after the last; 0: none
    keep: int = 3  # the newest this many are kept
    # SIGTERM / SIGUSR1 always stop a run after the current step (run_stop aborted, exit 75); with this set,
    # a checkpoint of that step is written first
    on_signal: bool = True
    input_state: bool = True  # save each rank's tf.data iterator (exact resume; DALI's cannot be saved)
    resume: bool = False  # continue from the newest valid checkpoint (from scratch when there is none)
    # A run that meets its target saves the weights that met it as its newest checkpoint, after run_stop (not
    # timed), so that export and evaluation work on any successful run; false: it writes none for that.
    keep_trained: bool = True

    def __post_init__(self):
        check(self.every_epochs >= 0, "checkpoint.every_epochs", self.every_epochs, ">= 0")
        check(self.every_minutes >= 0, "checkpoint.every_minutes", self.every_minutes, ">= 0")
        check(self.keep >= 1, "checkpoint.keep", self.keep, ">= 1")


@dataclasses.dataclass(frozen=True)
class MlperfConfig:
    """Submission metadata written into the MLPerf log.

    division: `auto` logs closed when the application confirms the run is the reference's (model, data
    counts, hyperparameters or an RCP's; each application's config.py), else open; `closed` refuses a run that is
    not; `open` always logs open (resolve_division)."""

    division: Literal["auto", "closed", "open"] = "auto"
    org: str = "hpc-sciml-bench"
    platform: str = "cpu-2core"
    status: str = "onprem"
    log_file: str = "mlperf.log"

    def __post_init__(self):
        check(self.division in ("auto", "closed", "open"), "mlperf.division", self.division,
              "'auto', 'closed' or 'open'")
        check(self.status in ("onprem", "cloud", "preview", "research"), "mlperf.status", self.status,
               "one of onprem, cloud, preview, research")


@dataclasses.dataclass(frozen=True)
class StagedDataConfig:
    """The data-section keys every application shares: where the dataset is and how it is staged
    to node-local storage before training (common/io/staging.py, docs/staging.md)."""

    dir: str = ""  # a converted dataset (manifest.json) or a packed one (pack.json), on the shared file system
    stage_dir: str = ""  # node-local directory to stage into, e.g. /tmp or /dev/shm; "" reads data.dir directly
    # rank: each rank stages the files it reads; node: local rank 0 stages everything once per node;
    # node_share: local rank 0 stages the node's 1/nodes share, which the node's ranks reshuffle every epoch.
    stage_mode: Literal["rank", "node", "node_share"] = "node"
    # When staging happens (docs/fidelity.md, "Staging: the state of the rules"): in_init, inside init between
    # staging_start and staging_stop, untimed, the order of NVIDIA's v3.0 logs and mlcommons/logging issue 318;
    # in_run, timed, between run_start and the first epoch (the rule of v1.0 and v2.0, which the paper describes);
    # before_init, before init_start, untimed and unlogged (the log then says open). One of STAGE_TIMINGS:
    # checked in __post_init__, so that the old name before_run gets an error naming its new one.
    stage_timing: str = "in_init"
    # GB/s one node's staging copies at, for the estimate of init's length (common/io/stage_rate.py); 0: the
    # rate benchmarks/staging_throughput.py measured on this machine kind.
    stage_rate_gb_s: float = 0.0
    stage_threads: int = 0  # files or archives copied in parallel by a staging rank; 0: its cores
    stage_reuse: bool = False  # keep files an earlier staging verified and nothing changed since, else re-hash or
    # copy them (docs/staging.md, "Reuse"); the staging time then covers less
    # Write record files that have no DALI index (GZIP-compressed ones, as CosmoFlow's official release)
    # uncompressed, with DALI index files, into the staged copy, so that DALI can read it (docs/staging.md);
    # other files are copied as they are.
    stage_decompress: bool = False
    # Check the xxh3-128 (older manifests: sha256) of every file a rank reads, before training. None (auto,
    # the default): when DALI reads the files in place, since its reader checks no record CRC and a changed
    # byte can crash it; not for tf.data (it checks every record's CRC) or staged data (staging verified it).
    verify_checksums: bool | None = None
    # DALI's reader maps record files into memory (a little faster on local disks); false: plain reads. An
    # emulated run that evicts the page cache reads plainly, since mapped pages cannot be dropped.
    dali_mmap: bool = True

    def __post_init__(self):
        check(self.stage_threads >= 0, "data.stage_threads", self.stage_threads, ">= 0 (0: the rank's cores)")
        check(self.stage_timing != "before_run", "data.stage_timing", self.stage_timing,
              "before_init (the old name before_run: staging before init_start, untimed and unlogged), or the "
              "default in_init, or in_run")
        check(self.stage_timing in STAGE_TIMINGS, "data.stage_timing", self.stage_timing, f"one of {STAGE_TIMINGS}")
        check(self.stage_rate_gb_s >= 0, "data.stage_rate_gb_s", self.stage_rate_gb_s,
              ">= 0 (0: the staging benchmark's rate)")


STAGE_TIMINGS = ("in_init", "in_run", "before_init")


def check(ok: bool, key: str, value: Any, expected: str) -> None:
    """Raise BenchError naming the config key, its value and what was expected, unless `ok`."""
    documents.check(ok, key, value, expected, noun="config key")


# ---------------------------------------------------------------------------- loading
def differences(items: Sequence[tuple[str, Any, Any]]) -> list[str]:
    """"key value (reference value)" for each (key, value, reference value) whose values differ."""
    def show(value):
        return list(value) if isinstance(value, tuple) else value
    return [f"{key} {show(value)} (reference {show(expected)})" for key, value, expected in items if value != expected]


def section_differences(section: str, mine: Any, reference: Any, skip: Sequence[str] = ()) -> list[str]:
    """`differences` of every field of a config section but `skip`, against the reference's section."""
    return differences([(f"{section}.{field.name}", getattr(mine, field.name), getattr(reference, field.name))
                        for field in dataclasses.fields(reference) if field.name not in skip])


def resolve_division(cfg: T, found: Sequence[str]) -> T:
    """`cfg` with mlperf.division settled to closed or open, given how the run differs from the reference.

    An explicit `closed` with differences is an error that lists them: a log must not claim a division the
    code cannot confirm."""
    asked = cfg.mlperf.division
    if asked == "closed" and found:
        raise BenchError(f"mlperf.division=closed, but this run is not the reference's: {'; '.join(found)}. "
                         f"Set mlperf.division=open (or auto, which logs open), or match the reference")
    division = "closed" if asked != "open" and not found else "open"
    return dataclasses.replace(cfg, mlperf=dataclasses.replace(cfg.mlperf, division=division))


def resolve(cfg: T, replicas: int, with_rcp: Callable, closed_differences: Callable,
            announce: Callable[[str], None] = lambda _msg: None) -> T:
    """The config a run uses: optimizer.rcp's hyperparameters applied (its global batch checked against
    local batch x `replicas`), mlperf.division settled (closed only for the reference's run); an auto
    division that falls to open is announced with the reasons."""
    if cfg.optimizer.rcp:  # the application's mapping (its rcp.py) reads mlperf-logging's RCP files
        cfg = with_rcp(cfg, cfg.train.local_batch_size * replicas)
    found = closed_differences(cfg) + data_differences(cfg.data)
    if cfg.train.emulated:
        found.append(f"train.emulate.accelerator={cfg.train.emulate.accelerator}: steps emulated, nothing trained")
        if cfg.train.emulate.page_cache == "evict":
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, dali_mmap=False))
    if found and cfg.mlperf.division == "auto":
        announce(f"mlperf.division=auto: logging open; not the reference's: {'; '.join(found)}")
    return resolve_division(cfg, found)


def data_differences(data: StagedDataConfig) -> list[str]:
    """How the run's data and its staging depart from the hpc rules (docs/fidelity.md): staging before
    init_start, which the log cannot show, and a data.dir held in RAM (a stage_dir in RAM is allowed)."""
    found = []
    if data.stage_dir and data.stage_timing == "before_init":
        found.append("data.stage_timing before_init (staging before init_start, untimed and unlogged; the rules' "
                     "order stages inside init: in_init)")
    ram = ram_filesystem(data.dir) if data.dir else ""
    if ram:
        found.append(f"data.dir {data.dir} is on {ram}, in RAM (the rules: data start on durable storage, which "
                     f"\"explicitly excludes RAM\"; stage into RAM with data.stage_dir instead)")
    return found


def load_config(path: str | os.PathLike, overrides: Sequence[str] = (), schema: type[T] = None) -> T:
    """Read YAML at `path`, apply `a.b=value` overrides, and build a frozen `schema` instance."""
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"config file {path} does not exist")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise BenchError(f"config file {path} is not readable UTF-8 text ({err})") from None
    raw = _parse_yaml(text, f"config file {path}")
    raw = {} if raw is None else raw  # an empty file: every default
    if not isinstance(raw, dict):
        raise BenchError(f"config file {path}: expected a mapping of sections, found {type(raw).__name__}")
    for item in overrides:
        _apply_override(raw, item)
    try:
        return _expand_refs(build(schema, raw))
    except BenchError as err:
        raise BenchError(f"{path}: {err}") from None


def _apply_override(raw: dict, item: str) -> None:
    if "=" not in item:
        raise BenchError(f"override {item!r}: expected the form section.key=value")
    dotted, text = item.split("=", 1)
    keys = dotted.strip().split(".")
    node = raw
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise BenchError(f"override {item!r}: {key} is not a section")
    node[keys[-1]] = _parse_yaml(text, f"override {item!r}") if text.strip() else ""


def _parse_yaml(text: str, what: str) -> Any:
    """yaml.safe_load, with a BenchError naming `what` for text that is not YAML (or nests too deeply)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise BenchError(f"{what} is not valid YAML: {err}") from None
    except RecursionError:
        raise BenchError(f"{what}: YAML nested too deeply to be a config") from None


def build(schema: type[T], raw: Any, prefix: str = "") -> T:
    """Build config dataclass `schema` from nested dicts (common/base/documents.py, with YAML's loose scalars),
    rejecting unknown keys and wrong types; `prefix` is the dotted path of this section ("" for the root)."""
    try:
        return documents.build(schema, raw, prefix, strict=False)
    except documents.Refused as err:
        raise BenchError(f"config key {err.key} = {documents.show(err.value)}: expected {err.expected}") from None


def _expand_refs(cfg: T) -> T:
    """Expand `${section.key}` references in string fields (used by run.output_dir)."""
    flat = {f"{s}.{k}": v for s, sec in to_dict(cfg).items() if isinstance(sec, dict) for k, v in sec.items()}

    def expand(obj):
        if dataclasses.is_dataclass(obj):
            changes = {f.name: expand(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
            return dataclasses.replace(obj, **changes)
        if isinstance(obj, str) and "${" in obj:
            for ref, val in flat.items():
                obj = obj.replace("${" + ref + "}", str(val))
        return obj

    return expand(cfg)


# ---------------------------------------------------------------------------- saving
def to_dict(cfg: Any) -> dict:
    """Plain nested dict (tuples as lists) of a config dataclass, for YAML and JSON."""
    return documents.to_dict(cfg)


def save_config(cfg: Any, output_dir: str | os.PathLike, name: str = "config.yaml") -> Path:
    """Write the resolved config as YAML into `output_dir` (temporary name, then rename)."""
    return documents.write(Path(output_dir) / name, cfg, kind="yaml")
