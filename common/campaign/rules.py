"""The MLPerf HPC scoring rules, in one place for the suite's campaigns (scoring.py) and for published
submission trees (analysis/scores.py).

- A run converged when at least one of its evaluations meets the benchmark's target (the compliance checker's
  ATLEAST_ONE_CHECK of hpc_<ruleset>/closed_<benchmark>.yaml, the same in the open division); its time to train
  is run_stop - run_start. A run that did not converge, or has no run_stop, failed: it counts as infinitely
  long.
- Time to train (strong scaling): the olympic mean of the runs' times, the fastest and the slowest dropped; a
  failed run is the dropped slowest, so one failure is allowed and more leave no score.
- Throughput (weak scaling): time_to_train_all = the last counted instance's run_stop - the first one's
  run_start, with the number of counted (converged) instances, which must reach the benchmark's run count.
- Runs per submission: mlperf-logging's table (CosmoFlow 10, DeepCAM 5, OC20 5, OpenFold 10).
- Pruning (rounds 2.0 and later): a run whose seed an earlier run of the submission already used is not counted.
- Rounds: 1.0, 2.0 and 3.0 have their rulesets in mlperf-logging. Round 0.7 has none there: its submissions are
  scored with the 1.0 targets and run counts, and have no RCPs.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from common.base.errors import BenchError

ROUNDS = {"0.7": "1.0.0", "1.0": "1.0.0", "2.0": "2.0.0", "3.0": "3.0.0"}  # round -> mlperf-logging ruleset
RCP_ROUNDS = ("1.0", "2.0", "3.0")  # rounds with reference convergence points in mlperf-logging
PRUNE_SEEDS_FROM = "2.0"
MAX_FAILED = 1  # the olympic mean drops one run as the slowest, which a failed run may be
V07_NOTE = ("round 0.7 has no ruleset in mlperf-logging: scored with the 1.0 targets and run counts, no RCPs; "
            "--check applies the 1.0.0 checker")


@dataclasses.dataclass(frozen=True)
class Target:
    """A benchmark's quality target: an evaluation of `metric` meets it or not."""

    metric: str  # the evaluation's key: eval_error or eval_accuracy
    lower_is_better: bool
    threshold: float  # eval_error <= threshold, or eval_accuracy >= threshold
    bound: float  # the checker's other side: eval_error > 0, eval_accuracy <= 1

    def met(self, value: float) -> bool:
        if self.lower_is_better:
            return self.bound < value <= self.threshold
        return self.threshold <= value <= self.bound

    def text(self) -> str:
        return f"{self.metric} {'<=' if self.lower_is_better else '>='} {self.threshold}"


# The ATLEAST_ONE_CHECK of mlperf-logging's compliance_checker/hpc_<ruleset>/closed_<benchmark>.yaml
# (tests/unit/test_published_scores.py reads them back and compares).
TARGETS = {
    "cosmoflow": Target("eval_error", True, 0.124, 0.0),
    "deepcam": Target("eval_accuracy", False, 0.82, 1.0),
    "oc20": Target("eval_error", True, 0.036, 0.0),
    "openfold": Target("eval_accuracy", False, 0.8, 1.0),
}


def ruleset(round_: str) -> str:
    """mlperf-logging's ruleset for a round ("1.0" -> "1.0.0"); 0.7 has none and gets 1.0's (V07_NOTE)."""
    if round_ not in ROUNDS:
        raise BenchError(f"round {round_!r}: expected one of {', '.join(ROUNDS)}")
    return ROUNDS[round_]


def round_benchmarks(round_: str) -> list[str]:
    """The benchmarks of a round (mlperf-logging's allowed benchmarks of its ruleset)."""
    from mlperf_logging.benchmark_meta import get_allowed_benchmarks
    return list(get_allowed_benchmarks("hpc", "0.7" if round_ == "0.7" else ruleset(round_)))


def target(benchmark: str, round_: str) -> tuple[Target | None, str]:
    """The benchmark's target in this round, or None and why it cannot be scored."""
    if benchmark not in round_benchmarks(round_):
        return None, f"{benchmark} is not a benchmark of MLPerf HPC v{round_}"
    if benchmark not in TARGETS:
        return None, f"no target known for {benchmark}"
    return TARGETS[benchmark], ""


def required_runs(benchmark: str) -> int:
    """How many runs a strong-scaling submission has, and how many converged instances a weak-scaling one
    needs (mlperf-logging's table; 0 for a benchmark it does not know)."""
    from mlperf_logging.benchmark_meta import get_result_file_counts
    return get_result_file_counts("hpc").get(benchmark, 0)


def prunes_duplicate_seeds(round_: str) -> bool:
    return float(round_) >= float(PRUNE_SEEDS_FROM)


def duplicate_seeds(seeds: Sequence[object]) -> list[int]:
    """The indices of the runs whose seed an earlier run already used (None: no seed logged, never a duplicate)."""
    seen, duplicates = set(), []
    for i, seed in enumerate(seeds):
        if seed is None:
            continue
        if seed in seen:
            duplicates.append(i)
        seen.add(seed)
    return duplicates


@dataclasses.dataclass(frozen=True)
class Olympic:
    """An olympic mean: the score (None when there is none), the indices of the counted runs, and why not."""

    minutes: float | None
    counted: tuple[int, ...]
    reason: str


def olympic(minutes: Sequence[float | None]) -> Olympic:
    """The olympic mean of the runs' minutes, None for a failed run (the slowest, dropped first)."""
    failed = sum(m is None for m in minutes)
    if failed > MAX_FAILED:
        return Olympic(None, (), f"{failed} runs failed; the rules drop at most {MAX_FAILED} (as the slowest)")
    passing = sorted((i for i, m in enumerate(minutes) if m is not None), key=lambda i: minutes[i])
    counted = passing[1:len(passing) - (MAX_FAILED - failed)]
    if not counted:
        return Olympic(None, (), f"{len(passing)} compliant runs leave none once the fastest and slowest are "
                                 f"dropped")
    return Olympic(sum(minutes[i] for i in counted) / len(counted), tuple(counted), "")


def time_to_train_all(spans: Sequence[tuple[float, float] | None], required: int) -> tuple[float | None, str]:
    """Minutes from the first counted instance's run_start to the last one's run_stop (spans in ms, None for an
    instance not counted), and why the score is not valid ("" when it is)."""
    counted = [s for s in spans if s is not None]
    if not counted:
        return None, "no instance has a compliant log"
    minutes = (max(b for _, b in counted) - min(a for a, _ in counted)) / 60_000
    if len(counted) < required:
        return minutes, f"{len(counted)} instances converged; the rules ask for at least {required}"
    return minutes, ""


def first_at_target(values: Sequence[float], goal: Target) -> int | None:
    """The index of the first evaluation (values in log order) that meets the target; None when none does."""
    return next((i for i, value in enumerate(values) if goal.met(value)), None)
