"""A site description: what a batch job on one system needs (jobs/sites/*.yaml; docs/jobs.md).

The YAML is read into frozen dataclasses by common.runtime.config's builder: unknown keys and wrong types are
errors naming the key. `check_site` then refuses what cannot make a working job (a scheduler without
its launcher's essentials, a container without an image, paths that must be absolute).
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Literal

import yaml

from common.runtime.config import DistConfig, build
from common.base.errors import BenchError

SITES_DIR = Path(__file__).resolve().parent / "sites"
SCHEDULERS = ("slurm", "lsf", "pbs", "pjsub", "sge", "cobalt", "local")
BENCHMARKS = ("cosmoflow", "deepcam")
DEFAULT_LAUNCHERS = {"slurm": "srun", "lsf": "jsrun", "pbs": "mpiexec", "pjsub": "mpiexec", "sge": "mpirun",
                     "cobalt": "aprun", "local": "horovodrun"}


@dataclasses.dataclass(frozen=True)
class ContainerConfig:
    """The image the trainings run in; `none` runs them in the site's Python environment."""

    kind: Literal["none", "shifter", "sarus", "apptainer", "podman-hpc"] = "none"
    image: str = ""
    options: str = ""  # extra flags for the container runtime (e.g. --module=gpu for shifter)


@dataclasses.dataclass(frozen=True)
class HorovodTuning:
    """Exported as HOROVOD_* and passed as the runs' dist.* settings (the config is what the run applies)."""

    fusion_threshold_mb: float = 64.0
    cycle_time_ms: float = DistConfig.cycle_time_ms  # why this default: common/runtime/config.py
    hierarchical_allreduce: bool = False
    hierarchical_allgather: bool = False


@dataclasses.dataclass(frozen=True)
class Site:
    """One system's batch environment."""

    name: str = ""
    description: str = ""  # what the system is; example files say they are examples to adapt
    scheduler: Literal["slurm", "lsf", "pbs", "pjsub", "sge", "cobalt", "local"] = "slurm"
    # "": the scheduler's usual (DEFAULT_LAUNCHERS)
    launcher: Literal["", "srun", "jsrun", "mpiexec", "mpirun", "aprun", "ibrun", "horovodrun"] = ""
    account: str = ""  # project / account / group charged
    # Slurm partition, LSF, PBS, Grid Engine or Cobalt queue, Fugaku resource group; {{ nodes }} and
    # {{ accelerators }} are filled in with the job's (e.g. a partition named by its GPU count)
    queue: str = ""
    qos: str = ""
    constraint: str = ""  # the node type: Slurm --constraint; Grid Engine's resource type (ABCI: rt_F)
    time_limit: str = "01:00:00"  # hh:mm:ss
    ranks_per_node: int = 1
    accelerators_per_node: int = 0
    cpus_per_rank: int = 1  # cores (hardware threads where the scheduler counts those) per rank
    cpu_bind: str = ""  # the launcher's binding keyword, e.g. cores (srun), rs (jsrun), depth (mpiexec, aprun)
    threads_per_rank: int = 0  # OMP_NUM_THREADS and dist.threads_per_rank; 0: cpus_per_rank
    launcher_args: str = ""  # extra launcher flags, verbatim
    scheduler_args: tuple[str, ...] = ()  # extra directive lines' arguments, verbatim (e.g. "--exclusive")
    modules: tuple[str, ...] = ()  # `module load` each
    setup: tuple[str, ...] = ()  # shell lines run before the launch (e.g. source a virtual environment)
    suite_dir: str = ""  # the suite's checkout on the system (absolute)
    python: str = "python"  # the interpreter that runs the trainings (inside the container, when there is one)
    # The Python that runs a campaign's driver, where the launcher is (outside any container; it needs the
    # suite's requirements); "": `python`.
    driver_python: str = ""
    data: dict[str, str] = dataclasses.field(default_factory=dict)  # benchmark -> dataset directory (absolute)
    output_root: str = ""  # where run and campaign directories go (absolute), e.g. a scratch file system
    stage_dir: str = ""  # node-local directory to stage into ("" reads data in place)
    stage_mode: Literal["rank", "node", "node_share"] = "node"
    # GB (10^9 bytes) stage_dir holds on each node; 0: not known, and not checked. The renderer refuses a job
    # whose share of the dataset per node is larger (jobs/render.py, `check_stage_capacity`). With Fugaku's
    # $PJM_LOCALTMP it is also the LLIO node temporary area the job asks for (#PJM --llio localtmp-size).
    stage_capacity_gb: float = 0.0
    # GB/s one node stages at (from data, into stage_dir); 0: the rate benchmarks/staging_throughput.py measured
    # on the machine `jobs render` runs on. Used for the estimate of init's length (common/io/stage_rate.py) and
    # passed to the trainings as data.stage_rate_gb_s.
    stage_rate_gb_s: float = 0.0
    # benchmark -> GB the staged dataset takes, where it is not the official one (jobs/render.py, DATASET_GB)
    dataset_gb: dict[str, float] = dataclasses.field(default_factory=dict)
    container: ContainerConfig = ContainerConfig()
    horovod: HorovodTuning = HorovodTuning()
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # exported as given
    # Config overrides this system's jobs give a benchmark (before the job's own), e.g. Mesh-TF partitioning.
    overrides: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    source: str = ""  # the site file (set by load_site, not a key of the file)

    @property
    def launcher_kind(self) -> str:
        return self.launcher or DEFAULT_LAUNCHERS[self.scheduler]

    @property
    def threads(self) -> int:
        return self.threads_per_rank or self.cpus_per_rank


def site_path(name_or_path: str) -> Path:
    """A site file: a path, or the name of an example in jobs/sites/."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        return path
    return SITES_DIR / f"{name_or_path}.yaml"


def example_sites() -> list[str]:
    return sorted(p.stem for p in SITES_DIR.glob("*.yaml"))


def load_site(name_or_path: str) -> Site:
    path = site_path(name_or_path)
    if not path.is_file():
        raise BenchError(f"site {name_or_path!r}: {path} does not exist (examples: {', '.join(example_sites())})")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as err:
        raise BenchError(f"site file {path} is not UTF-8 text ({err})") from None
    except (yaml.YAMLError, RecursionError) as err:
        raise BenchError(f"site file {path} is not valid YAML: {err}") from None
    if isinstance(raw, dict) and "source" in raw:
        raise BenchError(f"site file {path}: source is set to the file's path when it is read, not a key of the file")
    try:
        site = dataclasses.replace(build(Site, raw), source=str(path))
        check_site(site)
    except BenchError as err:
        raise BenchError(f"site file {path}: {err}") from None
    return site


def check_site(site: Site) -> None:
    """What a job from this site needs, beyond the types."""
    if not site.name:
        raise BenchError("name is empty; give the system's name (it names the jobs and the submission)")
    for key, value in (("suite_dir", site.suite_dir), ("output_root", site.output_root),
                       *((f"data.{b}", d) for b, d in site.data.items()), ("stage_dir", site.stage_dir)):
        if value and not value.startswith(("/", "$")):
            raise BenchError(f"{key} {value!r}: expected an absolute path (or one starting with an environment "
                             f"variable such as $SCRATCH)")
    for key, value in (("ranks_per_node", site.ranks_per_node), ("cpus_per_rank", site.cpus_per_rank)):
        if value < 1:
            raise BenchError(f"{key} {value}: expected >= 1")
    if site.accelerators_per_node and site.accelerators_per_node % site.ranks_per_node and \
            site.ranks_per_node % site.accelerators_per_node:
        raise BenchError(f"accelerators_per_node {site.accelerators_per_node} and ranks_per_node "
                         f"{site.ranks_per_node}: expected one to divide the other")
    _check_staging(site)
    if site.container.kind != "none" and not site.container.image:
        raise BenchError(f"container.kind {site.container.kind}: container.image is empty")
    if site.launcher_kind == "jsrun" and site.scheduler != "lsf":
        raise BenchError(f"launcher jsrun with scheduler {site.scheduler}: jsrun runs inside LSF allocations only")
    if site.launcher_kind == "ibrun" and site.scheduler != "slurm":
        raise BenchError(f"launcher ibrun with scheduler {site.scheduler}: ibrun (TACC) reads its tasks from a Slurm "
                         f"allocation")
    if site.scheduler == "sge" and not site.constraint:
        raise BenchError("scheduler sge: constraint is empty; give the resource type that allocates whole nodes "
                         "(#$ -l <type>=<nodes>; ABCI: rt_F)")


def _check_staging(site: Site) -> None:
    """The node-local capacity and the dataset sizes: positive figures, for known benchmarks."""
    if site.stage_capacity_gb < 0:
        raise BenchError(f"stage_capacity_gb {site.stage_capacity_gb:g}: expected >= 0 (0: not known)")
    if site.stage_rate_gb_s < 0:
        raise BenchError(f"stage_rate_gb_s {site.stage_rate_gb_s:g}: expected >= 0 (0: the staging benchmark's rate)")
    if site.stage_capacity_gb and not site.stage_dir:
        raise BenchError(f"stage_capacity_gb {site.stage_capacity_gb:g} with an empty stage_dir: give the node-local "
                         f"directory it is the capacity of")
    for bench, gb in site.dataset_gb.items():
        if bench not in BENCHMARKS or gb <= 0:
            raise BenchError(f"dataset_gb.{bench} {gb:g}: expected a benchmark of {list(BENCHMARKS)} and GB > 0")
    if site.scheduler == "pjsub" and site.stage_dir.startswith("$PJM_LOCALTMP") and site.stage_capacity_gb > 93.4:
        raise BenchError(f"stage_capacity_gb {site.stage_capacity_gb:g} with $PJM_LOCALTMP: LLIO's node temporary "
                         f"area holds at most 87 GiB (93.4 GB) per node")
