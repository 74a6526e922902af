"""Scores with their run-to-run uncertainty, and two campaigns compared (docs/campaigns.md, "Uncertainty").

Training is not deterministic, so a campaign's olympic mean is one draw from a distribution. Its
confidence interval here is a stratified percentile bootstrap over the runs: the compliant runs' values
are resampled with replacement (as many as there were), the failed runs are kept as they were (their
number decides which runs the olympic mean drops, and a rate estimated from one or two failures in ten
would make every interval unbounded), and the olympic mean is taken of each resample; the interval is
the central `confidence` part of those means. With the rules' 5 or 10 runs it is a rough interval (a
percentile bootstrap of so few values is too narrow by about sqrt((n-1)/n), and cannot reach beyond
the values seen), which the text says where it is shown.

    python -m common.campaign compare CAMPAIGN_A CAMPAIGN_B [--confidence 0.95]

compares two scored campaigns of one benchmark (two systems, or two settings on one): the difference of
their olympic means with its bootstrap interval, and whether that interval excludes zero.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from common.base.errors import BenchError

RESAMPLES = 10_000
CONFIDENCE = 0.95
SEED = 0  # the same campaign gives the same interval every time it is scored
METHOD = "stratified percentile bootstrap over the compliant runs (failed runs kept as observed)"


@dataclasses.dataclass(frozen=True)
class Interval:
    low: float | None  # None: too few compliant runs for an olympic mean
    high: float | None
    confidence: float
    resamples: int
    method: str = METHOD

    def text(self, unit: str = "min", digits: int = 3) -> str:
        if self.low is None or self.high is None:
            return "none (too few compliant runs for an olympic mean)"
        return f"[{self.low:.{digits}f}, {self.high:.{digits}f}] {unit}".rstrip()


def olympic_means(values: np.ndarray, failed: int) -> np.ndarray | None:
    """The olympic mean of each row of `values` (compliant runs' values) with `failed` failed runs: the
    fastest dropped, and the slowest unless a failed run is dropped in its place; None without any left
    (or with more than one failure, which leaves no score)."""
    runs = values.shape[-1]
    counted = slice(1, runs - (1 - failed))
    if failed > 1 or counted.stop - counted.start < 1:
        return None
    return np.sort(values, axis=-1)[..., counted].mean(axis=-1)


def resampled_means(passing: list[float], failed: int, resamples: int = RESAMPLES,
                    seed: int = SEED) -> np.ndarray | None:
    """The olympic means of `resamples` bootstrap resamples of the compliant runs' values."""
    values = np.asarray(passing, dtype=float)
    if values.size == 0:
        return None
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, values.size, size=(resamples, values.size))
    return olympic_means(values[picks], failed)


def olympic_interval(passing: list[float], failed: int, confidence: float = CONFIDENCE,
                     resamples: int = RESAMPLES, seed: int = SEED) -> Interval:
    """The bootstrap interval of the olympic mean of `passing` (compliant runs) with `failed` failures."""
    means = resampled_means(passing, failed, resamples, seed)
    return _percentiles(means, confidence, resamples)


def difference_interval(a: tuple[list[float], int], b: tuple[list[float], int], confidence: float = CONFIDENCE,
                        resamples: int = RESAMPLES, seed: int = SEED) -> Interval:
    """The bootstrap interval of olympic(a) - olympic(b), each (compliant values, failed count) resampled
    on its own."""
    means_a = resampled_means(*a, resamples=resamples, seed=seed)
    means_b = resampled_means(*b, resamples=resamples, seed=seed + 1)
    if means_a is None or means_b is None:
        return Interval(None, None, confidence, resamples)
    return _percentiles(means_a - means_b, confidence, resamples)


def _percentiles(samples: np.ndarray | None, confidence: float, resamples: int) -> Interval:
    if not 0 < confidence < 1:
        raise BenchError(f"confidence {confidence}: expected a fraction between 0 and 1, e.g. 0.95")
    if samples is None:
        return Interval(None, None, confidence, resamples)
    low, high = np.quantile(samples, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Interval(float(low), float(high), confidence, resamples)


# ---------------------------------------------------------------------------- two campaigns
@dataclasses.dataclass(frozen=True)
class Side:
    """One campaign as a comparison reads it from its score.json."""

    name: str
    benchmark: str
    passing: list[float]  # the compliant runs' minutes
    failed: int
    score: float | None
    interval: Interval


def read_side(campaign: Path, confidence: float) -> Side:
    path = campaign / "score.json"
    try:
        score = json.loads(path.read_text())
        runs, benchmark, mode = score["runs"], score["benchmark"], score["mode"]
        passing = [float(r["minutes"]) for r in runs if r["compliant"]]
    except FileNotFoundError:
        raise BenchError(f"{path}: no such file; score the campaign first (python -m common.campaign score "
                         f"{campaign})") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BenchError(f"{path}: not a campaign score ({type(err).__name__}: {err})") from None
    if mode != "time_to_train":
        raise BenchError(f"{path}: a {mode} campaign; compare compares time-to-train campaigns (olympic means)")
    failed = len(runs) - len(passing)
    means = olympic_means(np.asarray([passing]), failed) if passing else None
    return Side(name=str(campaign), benchmark=benchmark, passing=passing, failed=failed,
                score=None if means is None else float(means[0]),
                interval=olympic_interval(passing, failed, confidence))


def compare(a: Path, b: Path, confidence: float = CONFIDENCE) -> str:
    """The comparison of campaigns `a` and `b` as text: each score and interval, the difference a - b with
    its interval, and what it allows one to say."""
    sides = [read_side(a, confidence), read_side(b, confidence)]
    if sides[0].benchmark != sides[1].benchmark:
        raise BenchError(f"{a} is {sides[0].benchmark}, {b} is {sides[1].benchmark}: compare one benchmark's campaigns")
    lines = [f"{'AB'[i]}: {s.name}: olympic mean " + (f"{s.score:.3f} min" if s.score is not None else "none") +
             f", {confidence:.0%} interval {s.interval.text()} ({len(s.passing)} compliant runs, {s.failed} failed)"
             for i, s in enumerate(sides)]
    diff = difference_interval((sides[0].passing, sides[0].failed), (sides[1].passing, sides[1].failed), confidence)
    if None in (sides[0].score, sides[1].score) or diff.low is None:
        return "\n".join(lines + ["no comparison: a campaign has too few compliant runs for an olympic mean"])
    lines.append(f"A - B: {sides[0].score - sides[1].score:+.3f} min, {confidence:.0%} interval "
                 f"[{diff.low:+.3f}, {diff.high:+.3f}] min ({METHOD}, {diff.resamples} resamples)")
    lines.append(verdict(diff, sides[0].interval, sides[1].interval))
    return "\n".join(lines)


def verdict(diff: Interval, a: Interval, b: Interval) -> str:
    """What the intervals allow one to say."""
    level = f"{diff.confidence:.0%}"
    if diff.high < 0:
        said = f"A is faster: the interval of the difference lies below zero ({level})"
    elif diff.low > 0:
        said = f"B is faster: the interval of the difference lies above zero ({level})"
    else:
        said = f"no difference shown: the interval of the difference contains zero ({level})"
    overlap = a.low <= b.high and b.low <= a.high
    return f"{said}; the two scores' intervals {'overlap' if overlap else 'do not overlap'}"
