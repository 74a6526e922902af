"""Generate synthetic CosmoFlow universes (lognormal LCDM density fields as particle counts) to HDF5.

Each universe is a periodic cube of N^3 cells with 4 redshift channels, written in the layout of
the real CosmoFlow raw data (docs/formats.md): OUT/universe_<index:06d>.h5 holding `full`
(N, N, N, 4) int16 particle counts, `unitPar` (4,) float32, `physPar` (4,) float64 and `seed`.

The model, per universe:
1. Parameters Omega_m, sigma_8, n_s, H_0 drawn uniformly from the prior: --prior real (default)
   is PARAM_LOW..PARAM_HIGH, ranges like the real dataset's; --prior mini is wider (PRIORS) for the
   mini benchmark's 32^3 samples. `unitPar` maps the prior's ranges linearly onto [-1, 1].
2. A Gaussian linear density field at z = 0 on the grid with P(k) = A k^n_s T(k)^2 (Eisenstein-Hu
   no-wiggle T(k), shape set by Omega_m, h and a fixed Omega_b h^2), normalised to sigma_8
   (data_prep/cosmology.py). Lengths are comoving Mpc/h; the box is --box-size (default 512 Mpc/h,
   the real universes' box), so cells are box/N: 8 Mpc/h for the mini benchmark's N = 64,
   1 Mpc/h for the reference N = 512.
3. Channels z = REDSHIFTS = 0, 0.5, 1.5, 3 (those of the real data) share the phases and scale the
   field by the flat-LCDM growth factor D(z; Omega_m) / D(0), so channel ratios measure Omega_m.
4. Lognormal density 1 + delta = exp(g - sigma_g^2 / 2), g the field at that redshift and sigma_g^2
   its expected variance on the grid, so <1 + delta> = 1.
5. Poisson particle counts with mean n = mean_count * (1 + delta). The particle mass is fixed, so
   n follows the matter in a cell: cells are (box/N)^3 (Mpc/h)^3 = (box/N)^3 h^-3 Mpc^3 holding
   Omega_m rho_crit ∝ Omega_m h^2 Msun/Mpc^3, hence n ∝ Omega_m / h. --mean-count sets the
   particle mass as the mean count at the reference cosmology (Omega_m = 0.3, H_0 = 70): default
   64, so counts run from 46 to 87 per cell on average across the prior. Counts above 32767 are
   clipped to int16; the number of clipped cells is stored as attribute `clipped_cells` and reported.

Identifiability, measured (mini set-up: N = 64, box 512 Mpc/h, each universe cut into 8 sub-cubes
of 32^3 x 4): ordinary least squares from 48 simple statistics of ONE sub-cube (per channel the log
mean count and the mean of log(1 + counts); log covariances of log(1 + counts) between channels; log
auto and cross power spectra of log(1 + counts) in 6 k-bins) and their squares, fitted on 2400
sub-cubes of 300 universes, gives on 1200 sub-cubes of 150 other universes the held-out MAE on
unitPar (chance 0.5): Omega_m 0.034, sigma_8 0.054, n_s 0.34, H_0 0.041 (mean 0.118).
n_s is bounded by cosmic variance, not by the model: one 32^3 cube holds ~16,000 independent
Fourier modes over a factor 16 in k, which fixes the spectral slope to +-0.022 (Fisher, sigma_8
marginalised), a third of the prior's width: a Bayes-optimal MAE of about 0.27. Cell size does not
change this (cells of 3 to 16 Mpc/h gave 0.31-0.36). With 64^3 sub-cubes (N = 128, box 1024 Mpc/h,
800 sub-cubes to fit) the same fit gives 0.014, 0.024, 0.17, 0.018; reference 128^3 sub-cubes hold
64 times the modes of a 32^3 one. --mean-count 128 improves Omega_m and H_0 slightly (0.028, 0.034).

Speed (one process, this machine): 0.10 s per universe at N = 64, 0.7 s at N = 128, 55 s at
N = 512, mostly Poisson sampling. Peak memory is 24 bytes per cell (3.2 GB at N = 512), so
--workers is capped by the available memory. With 1 Mpc/h cells (N = 512 in 512 Mpc/h) about
33,000 cells of the z = 0 channel (0.02%) exceed the int16 range at the default --mean-count and
are clipped; the real data have about one particle per 1 Mpc/h cell (--mean-count 1).

Universe i depends only on (--seed, i, --size, --box-size, --mean-count): its own seed is drawn
from numpy's SeedSequence([seed, i]), so output does not depend on --workers or on which files
already exist. Files are written under a temporary name (.universe_000003.h5.tmp-<pid>) and renamed
when complete; a rerun skips finished files and removes stale temporary ones. A directory holding
universes made with other settings is refused rather than mixed.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import multiprocessing
import os
import re
import signal
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from common.base.errors import BenchError
from common.base.files import atomic_path
from data_prep.stale import plain, remove_stale_temporaries
from data_prep import cosmology

GENERATOR_VERSION = "cosmo-synth-1"

# The prior: parameter names, order and ranges (physPar order; unitPar maps LOW..HIGH to -1..1).
PARAM_NAMES = ("Omega_m", "sigma_8", "n_s", "H_0")
PARAM_LOW = (0.25, 0.78, 0.90, 60.0)
PARAM_HIGH = (0.35, 0.95, 1.00, 80.0)
# Named priors (low, high). "real" is like the real dataset's. "mini" is wider, for the mini
# benchmark's 32^3 samples: they hold 1/64 of the Fourier modes of a 128^3 reference sample, so the
# spectral slope (n_s) of one sample is measured 8x less precisely; widening the ranges (n_s most)
# keeps every parameter identifiable from one sample (docs/synthetic_data.md gives the figures).
PRIORS = {
    "real": (PARAM_LOW, PARAM_HIGH),
    "mini": ((0.15, 0.60, 0.70, 50.0), (0.45, 1.10, 1.30, 90.0)),
}

REDSHIFTS = (0.0, 0.5, 1.5, 3.0)  # the channels, as in the real CosmoFlow universes
DEFAULT_BOX_SIZE = 512.0  # Mpc/h, the real universes' box
DEFAULT_MEAN_COUNT = 64.0  # particles per cell at the reference cosmology
REFERENCE_OMEGA_M, REFERENCE_H = 0.3, 0.7
INT16_MAX = int(np.iinfo(np.int16).max)
SLAB = 64  # planes drawn and written at a time; also the HDF5 chunk edge
BYTES_PER_CELL = 24  # peak memory of one worker per cell (measured at N = 256 and 512)

FILE_RE = re.compile(r"^universe_(\d{6,})\.h5$")
TEMP_RE = re.compile(r"^\.universe_\d{6,}\.h5\.tmp-(\d+)$")


def file_name(index: int) -> str:
    """The file of universe `index`, as in the real data."""
    return f"universe_{index:06d}.h5"


@dataclasses.dataclass(frozen=True)
class SynthSpec:
    """What defines a synthetic dataset; universe i is a pure function of (spec, i)."""

    size: int  # N, cells per side
    box_size: float = DEFAULT_BOX_SIZE  # Mpc/h
    seed: int = 0
    mean_count: float = DEFAULT_MEAN_COUNT  # particles per cell at the reference cosmology
    prior: str = "real"  # a key of PRIORS

    @property
    def cell_size(self) -> float:
        return self.box_size / self.size

    @property
    def bounds(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(low, high) of the prior: the draw ranges and the [-1, 1] normalisation of unitPar."""
        return PRIORS[self.prior]

    def attrs(self) -> dict:
        """The HDF5 file attributes that identify the dataset (checked when resuming)."""
        return {"size": self.size, "box_size": self.box_size, "base_seed": self.seed,
                "mean_count": self.mean_count, "prior": self.prior, "generator": GENERATOR_VERSION}


@dataclasses.dataclass(frozen=True)
class UniverseInfo:
    """The parameters of one generated universe."""

    index: int
    seed: int  # the universe's own seed, stored as `seed`
    phys: np.ndarray  # (4,) float64, physPar
    unit: np.ndarray  # (4,) float32, unitPar
    clipped: int  # cells whose count exceeded int16 and was clipped


# ---------------------------------------------------------------------------- parameters
def universe_seed(seed: int, index: int) -> int:
    """The 63-bit seed of universe `index` of a dataset with base seed `seed`."""
    state = np.random.SeedSequence([seed, index]).generate_state(2, np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1


def draw_parameters(rng: np.random.Generator, prior: str = "real") -> np.ndarray:
    """(4,) float64 physical parameters, uniform over the prior."""
    return rng.uniform(*PRIORS[prior])


def to_unit(phys, prior: str = "real") -> np.ndarray:
    """Map physical parameters (..., 4) linearly onto [-1, 1] (float32)."""
    low, high = (np.asarray(b) for b in PRIORS[prior])
    return (2.0 * (np.asarray(phys) - low) / (high - low) - 1.0).astype(np.float32)


def from_unit(unit, prior: str = "real") -> np.ndarray:
    """Inverse of `to_unit` (float64)."""
    low, high = (np.asarray(b) for b in PRIORS[prior])
    return low + (np.asarray(unit, dtype=np.float64) + 1.0) * (high - low) / 2.0


def mean_count(omega_m: float, h: float, reference_count: float = DEFAULT_MEAN_COUNT) -> float:
    """Mean particles per cell for a fixed particle mass: ∝ Omega_m / h in Mpc/h cells (module doc)."""
    return reference_count * (omega_m / REFERENCE_OMEGA_M) * (REFERENCE_H / h)


# ---------------------------------------------------------------------------- fields
def gaussian_field(rng: np.random.Generator, size: int, cell_size: float, phys) -> tuple[np.ndarray, float]:
    """A Gaussian linear density field at z = 0 on a periodic grid.

    Args:
        rng: the phases' random stream.
        size: N, cells per side; cell_size in Mpc/h.
        phys: (4,) Omega_m, sigma_8, n_s, H_0.
    Returns:
        (N, N, N) float32 field and its expected variance on the grid (sum of P over the modes / V).
    """
    shape = (size,) * 3
    modes = np.fft.rfftn(rng.standard_normal(shape, dtype=np.float32))  # (N, N, N//2+1) complex64
    variance = _shape_modes(modes, cell_size, phys)
    return np.fft.irfftn(modes, s=shape, axes=(0, 1, 2)), variance


def _shape_modes(modes: np.ndarray, cell_size: float, phys) -> float:
    """Multiply white-noise modes in place by sqrt(P(k) / cell volume); return the grid variance.

    With unit white noise per cell, this gives a field whose modes have power P(k); one k-plane at a
    time keeps the float64 temporaries small at N = 512.
    """
    size = modes.shape[0]
    omega_m, sigma_8, n_s, h0 = phys
    kx = 2 * np.pi * np.fft.fftfreq(size, d=cell_size)  # (N,) h/Mpc
    kz = 2 * np.pi * np.fft.rfftfreq(size, d=cell_size)  # (N//2+1,)
    k_yz2 = kx[:, None] ** 2 + kz[None, :] ** 2  # (N, N//2+1)
    log_k, log_p = _power_table(kx, omega_m, sigma_8, n_s, h0 / 100.0)
    multiplicity = np.where((kz == 0) | ((kz == kz[-1]) & (size % 2 == 0)), 1.0, 2.0)  # rfft half-space
    total = 0.0
    for i in range(size):
        k = np.sqrt(kx[i] ** 2 + k_yz2)
        power = np.exp(np.interp(np.log(np.maximum(k, 1e-30)), log_k, log_p))
        power[k == 0] = 0.0  # no mean-density mode: the box has the mean density
        total += float((power * multiplicity).sum())
        modes[i] *= np.sqrt(power / cell_size ** 3).astype(np.float32)
    return total / (size * cell_size) ** 3


def _power_table(kx: np.ndarray, omega_m, sigma_8, n_s, h) -> tuple[np.ndarray, np.ndarray]:
    """ln k and ln P(k) on a fine log grid covering the grid's wavenumbers (interpolated per mode)."""
    k_min = np.abs(kx[1]) * 0.5
    k_max = np.sqrt(3.0) * np.abs(kx).max() * 1.01
    k = np.exp(np.linspace(np.log(k_min), np.log(k_max), 1024))
    return np.log(k), np.log(cosmology.linear_power(k, omega_m, sigma_8, n_s, h))


def count_slabs(field: np.ndarray, variance: float, growth, mean: float,
                rng: np.random.Generator) -> Iterator[tuple[int, int, np.ndarray, int]]:
    """Poisson counts of the lognormal density, one channel and SLAB planes at a time.

    Args:
        field: (N, N, N) float32 linear field at z = 0 with expected variance `variance`.
        growth: (C,) D(z) / D(0) of the channels.
        mean: mean count per cell.
    Yields:
        (channel, first plane, (S, N, N) int16 counts, number of clipped cells).
    """
    for channel, d in enumerate(growth):
        shift = np.float32(0.5 * variance * d * d)
        for start in range(0, field.shape[0], SLAB):
            density = np.exp(field[start:start + SLAB] * np.float32(d) - shift)  # 1 + delta
            counts = rng.poisson(mean * density)
            clipped = int(np.count_nonzero(counts > INT16_MAX))
            yield channel, start, np.minimum(counts, INT16_MAX).astype(np.int16), clipped


def generate(spec: SynthSpec, index: int, sink: Callable[[int, int, np.ndarray], None]) -> UniverseInfo:
    """Draw universe `index`, handing each (channel, first plane, counts slab) to `sink`."""
    seed = universe_seed(spec.seed, index)
    params_rng, phases_rng, counts_rng = (np.random.default_rng(s)
                                          for s in np.random.SeedSequence(seed).spawn(3))
    phys = draw_parameters(params_rng, spec.prior)
    field, variance = gaussian_field(phases_rng, spec.size, spec.cell_size, phys)
    growth = cosmology.growth_factor(REDSHIFTS, phys[0])
    mean = mean_count(phys[0], phys[3] / 100.0, spec.mean_count)
    clipped = 0
    for channel, start, counts, slab_clipped in count_slabs(field, variance, growth, mean, counts_rng):
        sink(channel, start, counts)
        clipped += slab_clipped
    return UniverseInfo(index=index, seed=seed, phys=phys, unit=to_unit(phys, spec.prior), clipped=clipped)


def generate_array(spec: SynthSpec, index: int) -> tuple[np.ndarray, UniverseInfo]:
    """Universe `index` in memory: (N, N, N, 4) int16 counts and its parameters (tests, small N)."""
    n = spec.size
    full = np.empty((n, n, n, len(REDSHIFTS)), dtype=np.int16)

    def sink(channel: int, start: int, counts: np.ndarray) -> None:
        full[start:start + counts.shape[0], ..., channel] = counts

    return full, generate(spec, index, sink)


# ---------------------------------------------------------------------------- files
def write_universe(spec: SynthSpec, index: int, out_dir: Path) -> UniverseInfo:
    """Generate universe `index` into out_dir/universe_<index>.h5 through a temporary file."""
    import h5py
    final = out_dir / file_name(index)
    n, edge = spec.size, min(spec.size, SLAB)
    try:
        with atomic_path(final) as temp, h5py.File(temp, "w") as f:
            full = f.create_dataset("full", (n, n, n, len(REDSHIFTS)), dtype=np.int16,
                                    chunks=(edge, edge, edge, 1))

            def sink(channel: int, start: int, counts: np.ndarray) -> None:
                full[start:start + counts.shape[0], :, :, channel] = counts

            info = generate(spec, index, sink)
            f.create_dataset("unitPar", data=info.unit)
            f.create_dataset("physPar", data=info.phys.astype(np.float64))
            f.create_dataset("seed", data=np.int64(info.seed))
            f.attrs.update({**spec.attrs(), "index": index, "clipped_cells": info.clipped,
                            "redshifts": np.asarray(REDSHIFTS), "param_names": list(PARAM_NAMES),
                            "param_low": np.asarray(spec.bounds[0]), "param_high": np.asarray(spec.bounds[1]),
                            "cell_size": spec.cell_size, "units": "lengths in comoving Mpc/h, H_0 in km/s/Mpc"})
    except OSError as err:  # disk full, permissions: the user's to fix
        raise BenchError(f"{final}: could not write the universe ({err})") from None
    return info


def existing_universes(out_dir: Path, spec: SynthSpec) -> set[int]:
    """Indices of the finished universes in out_dir; raise if any was made with other settings."""
    import h5py
    found = set()
    for path in sorted(out_dir.iterdir()):
        match = FILE_RE.match(path.name)
        if not match:
            continue
        try:
            with h5py.File(path, "r") as f:
                attrs = {key: f.attrs.get(key) for key in (*spec.attrs(), "index")}
        except OSError as err:
            raise BenchError(f"{path}: not a readable HDF5 file ({err}); delete it and rerun") from None
        _check_same_dataset(path, attrs, spec, int(match.group(1)))
        found.add(int(match.group(1)))
    return found


def _check_same_dataset(path: Path, attrs: dict, spec: SynthSpec, index: int) -> None:
    expected = {**spec.attrs(), "index": index}
    differing = {key: attrs[key] for key, value in expected.items()
                 if attrs[key] is None or plain(attrs[key]) != value}
    if differing:
        found = ", ".join(f"{key}={plain(value)!r}" for key, value in differing.items())
        wanted = ", ".join(f"{key}={expected[key]!r}" for key in differing)
        raise BenchError(f"{path}: made with {found}, but this run asks for {wanted}; a directory must hold "
                         f"one dataset: choose another --out or delete the old universes")


# ---------------------------------------------------------------------------- command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options (values are checked in `run`, which raises BenchError)."""
    parser.add_argument("--out", type=Path, required=True, help="output directory (created if needed)")
    parser.add_argument("--universes", type=int, required=True, help="number of universes K")
    parser.add_argument("--size", type=int, required=True, help="cells per side N (e.g. 64 mini, 512 reference)")
    parser.add_argument("--box-size", type=float, default=DEFAULT_BOX_SIZE,
                        help="box side in comoving Mpc/h (default %(default)g, the real universes'; cell = box/N)")
    parser.add_argument("--mean-count", type=float, default=DEFAULT_MEAN_COUNT,
                        help="mean particles per cell at Omega_m=0.3, H_0=70; sets the particle mass "
                             "(default %(default)g)")
    parser.add_argument("--prior", choices=sorted(PRIORS), default="real",
                        help="parameter ranges: 'real' (like the real dataset, default) or 'mini' (wider, "
                             "for 32^3 samples; see docs/synthetic_data.md)")
    parser.add_argument("--seed", type=int, default=0, help="base seed (default %(default)s)")
    parser.add_argument("--start-index", type=int, default=0,
                        help="index of the first universe; files are universe_<index:06d>.h5 (default 0)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes (default: the CPUs available, capped by memory)")


def run(args: argparse.Namespace) -> int:
    """Generate the missing universes of the requested range; print what was written where."""
    spec = spec_from_args(args)
    _check_run_args(args)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out_dir, TEMP_RE)
    wanted = range(args.start_index, args.start_index + args.universes)
    present = existing_universes(out_dir, spec)
    todo = [i for i in wanted if i not in present]
    workers = choose_workers(args.workers, len(todo), spec.size)
    started = time.perf_counter()
    infos = generate_files(spec, out_dir, todo, workers)
    print(summary(spec, out_dir, infos, len(wanted) - len(todo), time.perf_counter() - started), flush=True)
    return 0


def spec_from_args(args: argparse.Namespace) -> SynthSpec:
    """The dataset spec, with every value checked."""
    if args.size < 2:
        raise BenchError(f"--size {args.size}: expected an integer >= 2 (cells per side of a universe)")
    if not (np.isfinite(args.box_size) and args.box_size > 0):
        raise BenchError(f"--box-size {args.box_size}: expected a positive box side in Mpc/h")
    if not (np.isfinite(args.mean_count) and args.mean_count > 0):
        raise BenchError(f"--mean-count {args.mean_count}: expected a positive mean particle count per cell")
    if args.seed < 0:
        raise BenchError(f"--seed {args.seed}: expected a non-negative integer")
    return SynthSpec(size=args.size, box_size=float(args.box_size), seed=args.seed,
                     mean_count=float(args.mean_count), prior=args.prior)


def _check_run_args(args: argparse.Namespace) -> None:
    if args.universes < 1:
        raise BenchError(f"--universes {args.universes}: expected a positive number of universes")
    if args.start_index < 0:
        raise BenchError(f"--start-index {args.start_index}: expected a non-negative index")
    if args.workers is not None and args.workers < 1:
        raise BenchError(f"--workers {args.workers}: expected a positive number of processes")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise BenchError(f"--out {args.out}: exists and is not a directory")


def choose_workers(requested: int | None, jobs: int, size: int) -> int:
    """Worker processes: requested or the available CPUs, at most one per job and what memory allows."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = max(1, min(requested or cpus, jobs))
    fit = _memory_fit(size)
    if fit < workers:
        print(f"cosmo-synth: {workers} workers would need {workers * BYTES_PER_CELL * size ** 3 / 1e9:.1f} GB "
              f"for {size}^3 universes; using {fit}", flush=True)
        workers = fit
    return workers


def _memory_fit(size: int) -> int:
    """How many N^3 generations fit in the available memory (at least 1)."""
    import psutil
    return max(1, int(psutil.virtual_memory().available // (BYTES_PER_CELL * size ** 3)))


def generate_files(spec: SynthSpec, out_dir: Path, indices: list[int], workers: int) -> list[UniverseInfo]:
    """Write the universes `indices` with `workers` processes, showing progress."""
    from tqdm import tqdm
    infos = []
    with tqdm(total=len(indices), unit="universe", desc="cosmo-synth", disable=not indices) as bar:
        if workers <= 1:
            for index in indices:
                infos.append(write_universe(spec, index, out_dir))
                bar.update()
        else:
            # spawn: workers start clean. They ignore Ctrl-C; leaving the block (done, error or Ctrl-C)
            # terminates them at once, and a killed worker's temporary file is removed by the next run.
            context = multiprocessing.get_context("spawn")
            with context.Pool(workers, initializer=_ignore_interrupts) as pool:
                task = functools.partial(write_universe, spec, out_dir=out_dir)
                for info in pool.imap_unordered(task, indices):
                    infos.append(info)
                    bar.update()
    return sorted(infos, key=lambda info: info.index)


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def summary(spec: SynthSpec, out_dir: Path, infos: list[UniverseInfo], skipped: int, seconds: float) -> str:
    """The final report: what was written where, and any clipping."""
    n = spec.size
    line = (f"cosmo-synth: {_plural(len(infos), 'universe')} of {n}^3 x {len(REDSHIFTS)} cells written, "
            f"{skipped} already present (box {spec.box_size:g} Mpc/h, {spec.cell_size:g} Mpc/h cells, "
            f"seed {spec.seed}) in {seconds:.1f} s -> {out_dir}")
    clipped = [info for info in infos if info.clipped]
    if clipped:
        line += (f"\nnote: {_plural(sum(i.clipped for i in clipped), 'cell')} in "
                 f"{_plural(len(clipped), 'universe')} had more than {INT16_MAX} particles and were clipped "
                 f"to {INT16_MAX} (attribute clipped_cells)")
    return line


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
