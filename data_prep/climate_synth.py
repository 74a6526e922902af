"""Generate synthetic DeepCAM climate snapshots (16 CAM5 fields, cyclone and river labels) to HDF5.

Each snapshot is an H x W latitude-longitude grid (latitude -90..90 with row 0 at the south pole,
longitude periodic; the real data are 768 x 1152) of the 16 CAM5 variables of the DeepCAM dataset,
written in its layout: OUT/train/data-<index:06d>.h5 and OUT/validation/data-<index:06d>.h5 holding
`climate/data` (H, W, 16) float32 and `climate/labels_0` (H, W) float32 with values 0 (background),
1 (tropical cyclone), 2 (atmospheric river); OUT/stats.h5 holds the per-channel `count`, `mean`,
`sqmean`, `minval`, `maxval` (float64, (16,)) over the training files, combined exactly in file order.

The model, per snapshot (docs/climate_data.md gives the details and the measured figures):
1. A season s in [-1, 1] (+1: northern summer) shifts the thermal equator by 6 s degrees, the ITCZ by
   7 s, strengthens the winter westerlies and warms the summer hemisphere's high latitudes.
2. Zonal-mean climate: 850 hPa easterly trades, mid-latitude westerlies and polar easterlies; sea-level
   pressure in geostrophic balance with that wind (dp/dy = -rho f u: equatorial trough, subtropical
   highs, subpolar lows); surface air, 500 and 200 hPa temperatures falling poleward; column relative
   humidity with a moist ITCZ and dry subtropics.
3. A fixed planet: continents and mountains (up to 4 km, an Antarctic plateau of 3 km) from fixed
   low-order waves, the same for every seed and grid size. Land lowers PS (hypsometric), cools with
   altitude (6.5 K/km), is drier, follows the season more and slows and turns the near-surface wind more.
4. Synoptic weather from Gaussian random fields with a red spectrum (a mixture of Gaussian spectra
   at L, L/2, L/4; isotropic in km, periodic in longitude, single-valued at the poles): a streamfunction
   (L = 700 km) gives non-divergent 850 hPa winds (std ~2 m/s in the tropics, ~7 m/s at 50 degrees)
   and the geostrophic pressure anomaly rho f psi; temperature (warm ridges aloft), humidity, 200 hPa
   and rain-variability fields.
5. Tropical cyclones (Poisson count; 6-28 degrees latitude over the ocean, more in the summer
   hemisphere): Holland (1980) pressure profile with a depression of 5-70 hPa (weak ones more likely),
   gradient-wind balanced cyclonic winds (counter-clockwise in the north, clockwise in the south), a
   warm core at 500 and 200 hPa, a saturated column and eyewall rain. Sizes scale with
   `cyclone_length_km` (70 km, or 0.8 cells on grids coarser than ~1/3 degree).
6. Atmospheric rivers (Poisson count): curved filaments 4000-9000 km long from 14-28 degrees latitude
   toward the pole and east, Gaussian across (sigma `river_width_km`: 300 km, or 1.5 cells), carrying
   near-saturated subtropical air (60% of the warmth of their origin) and a geostrophically balanced
   low-level jet of 15-25 m/s along the axis. Strengths vary: some stay below the detection thresholds.
   On coarse grids events are larger than in nature and correspondingly fewer, so a network can
   segment them and the class frequencies stay about the same at every grid size.
7. The 16 channels follow from that state: TMQ = column RH x saturated column water, QREFHT from
   surface RH and saturation at TREFHT, PRECT from column RH (Bretherton et al. 2004) plus eyewall
   rain, UBOT/VBOT the 850 hPa wind slowed by friction and turned toward low pressure, PS, Z1000,
   Z200 and ZBOT hypsometric.
8. Labels come from the fields alone, by the TECA-like heuristic of data_prep/climate_labels.py.

Snapshot i of a split depends only on (--seed, split, i, --height, --width): its generator is seeded
from numpy's SeedSequence([seed, split, i]), so output does not depend on --workers or on which files
exist. Train and validation snapshots come from different streams (no duplicates between them).
Files are written under a temporary name (.data-000003.h5.tmp-<pid>) and renamed when complete; a
rerun verifies and skips finished files, removes stale temporaries and recomputes stats.h5.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import multiprocessing
import os
import re
import signal
import time
from pathlib import Path

import numpy as np

from common.base.errors import BenchError
from common.base.files import atomic_path
from data_prep.stale import plain, remove_stale_temporaries
from data_prep import climate_stats
from data_prep.climate_labels import (CLASSES, EARTH_RADIUS_KM, UNITS, VARIABLES, LatLonGrid, cyclone_length_km,
                                      label_snapshot, lat_lon_grid, river_width_km)

GENERATOR_VERSION = "deepcam-synth-1"
SPLITS = ("train", "validation")
MIN_HEIGHT, MIN_WIDTH = 32, 48  # below this, cyclones and rivers no longer fit the tropics and mid-latitudes
FULL_HEIGHT, FULL_WIDTH = 768, 1152  # the real DeepCAM grid

# Physical constants (SI unless a name says otherwise)
G = 9.80665
R_DRY = 287.04
OMEGA = 7.292e-5
RHO_AIR = 1.2
EARTH_RADIUS_M = EARTH_RADIUS_KM * 1e3
LAPSE_RATE = 6.5e-3  # K/m
COLUMN_WATER_FACTOR = 0.29  # saturated column water / (q_sat(TREFHT) * PS / g): water-vapour scale height
COLUMN_WARMEST = 300.0  # K: above this, column saturation follows TREFHT at 30% (no 120 kg/m2 deserts)
ZBOT_LOG_PRESSURE = math.log(1 / 0.9925)  # CAM5's lowest model level sits at ~0.9925 PS
MM_PER_DAY = 1e-3 / 86400.0  # m/s

# Synoptic random fields: largest correlation length L of each (km), and the red mixture of Gaussian
# spectra every field is made of (lengths L * MIX_SCALES, weights MIX_WEIGHTS; `random_fields`)
FLOW_LENGTH_KM, TEMPERATURE_LENGTH_KM, MOISTURE_LENGTH_KM, T200_LENGTH_KM = 700.0, 800.0, 600.0, 900.0
RAIN_LENGTH_KM = 300.0
MIX_SCALES = (1.0, 0.5, 0.25)
MIX_WEIGHTS = (1.0, 0.45, 0.2)
PSI_STD = 5.5e6  # m^2/s: unit streamfunction -> ~7 m/s wind std at 768 x 1152, ~6 at 96 x 144 (measured)

# Events: expected numbers drawn per snapshot at the reference resolution. On coarse grids events are
# larger by `scale` (cyclone_length_km, river_width_km relative to 768 x 1152) and fewer by
# scale ** -exponent; the exponents (measured) keep the class frequencies about the same at every size.
CYCLONES_PER_SNAPSHOT = 5.0
RIVERS_PER_SNAPSHOT = 8.5
CYCLONE_RATE_EXPONENT = 1.6
RIVER_RATE_EXPONENT = 1.5
OROGRAPHY_SEED = 20_160_101  # the fixed planet

FILE_RE = re.compile(r"^data-(\d{6,})\.h5$")
TEMP_RE = re.compile(r"^\.data-\d{6,}\.h5\.tmp-(\d+)$")
BYTES_PER_CELL = 600  # memory of one worker per grid cell (530 MB peak measured at 768 x 1152)


def file_name(index: int) -> str:
    """The file of snapshot `index` (DeepCAM's real files are data-<date>.h5; ours are numbered)."""
    return f"data-{index:06d}.h5"


@dataclasses.dataclass(frozen=True)
class SynthSpec:
    """What defines a synthetic dataset; snapshot (split, i) is a pure function of (spec, split, i)."""

    height: int = FULL_HEIGHT
    width: int = FULL_WIDTH
    seed: int = 0

    def attrs(self) -> dict:
        """The HDF5 attributes that identify the dataset (checked when resuming)."""
        return {"generator": GENERATOR_VERSION, "base_seed": self.seed, "height": self.height, "width": self.width}


@dataclasses.dataclass(frozen=True)
class Cyclone:
    """A tropical cyclone as drawn (the labeller never sees this)."""

    lat: float
    lon: float
    depression_pa: float  # Holland's Delta p
    rmw_km: float  # radius of maximum wind
    holland_b: float
    warm_core: float  # K of 500 hPa warming per hPa of depression


@dataclasses.dataclass(frozen=True)
class River:
    """An atmospheric river as drawn: its axis, width and strength."""

    lats: np.ndarray  # (n,) degrees along the axis, from the subtropical end
    lons: np.ndarray  # (n,) degrees, unwrapped (continuous)
    headings: np.ndarray  # (n, 2) unit (east, north) direction of the axis
    sigma_km: float  # Gaussian half-width at the start (narrows to 65% at the end)
    strength: float  # 0..1: moisture, warmth and jet scale together
    jet: float  # m/s at full strength


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One generated snapshot and what was drawn for it."""

    data: np.ndarray  # (H, W, 16) float32, channels in VARIABLES order
    labels: np.ndarray  # (H, W) uint8
    seed: int  # the snapshot's own seed
    season: float
    cyclones: tuple[Cyclone, ...]
    rivers: tuple[River, ...]


@dataclasses.dataclass
class Atmosphere:
    """The state the 16 channels derive from; (H, W) float64 arrays, modified in place by events."""

    psl: np.ndarray  # Pa
    u850: np.ndarray  # m/s
    v850: np.ndarray
    t_sl: np.ndarray  # K, near-surface air temperature reduced to sea level
    t500: np.ndarray
    t200: np.ndarray
    rh_col: np.ndarray  # column relative humidity, 0..1
    rh_sfc: np.ndarray  # near-surface relative humidity, 0..1
    rain_noise: np.ndarray  # multiplicative rain variability
    rain_extra: np.ndarray  # m/s, cyclone eyewall rain


# ---------------------------------------------------------------------------- seeds
def snapshot_seed(seed: int, split: str, index: int) -> int:
    """The 63-bit seed of snapshot `index` of `split` for a dataset with base seed `seed`."""
    state = np.random.SeedSequence([seed, SPLITS.index(split), index]).generate_state(2, np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1


# ---------------------------------------------------------------------------- random fields
def random_fields(rng: np.random.Generator, grid: LatLonGrid, lengths_km) -> np.ndarray:
    """Smooth Gaussian random fields on the lat-lon grid with a red spectrum, one per length L.

    Each field is a sum of components with Gaussian spectra exp(-k^2 L_j^2 / 2), L_j = L * MIX_SCALES,
    weighted by MIX_WEIGHTS and drawn from the same white noise: isotropic in km, with a spectrum that
    falls off more slowly than one Gaussian. Components narrower than 0.8 cells are left out (a coarse
    grid is a smoothed atmosphere). Gaussian spectra are separable, so each component is a latitude
    filter (FFT over a padded latitude axis: no pole-to-pole periodicity) and a longitude filter per
    row, in which zonal mode m has wavenumber m / (R cos(latitude)): the same correlation length in km
    at every latitude, and single-valued fields at the poles.
    Returns:
        (n, H, W) float32, unit variance on every row.
    """
    import scipy.fft as sfft
    rows, a_lat, a_lon = _spectral_filters(grid.height, grid.width, tuple(lengths_km))
    noise = rng.standard_normal((len(a_lat), rows, grid.width), dtype=np.float32)
    lat_modes = sfft.fft(sfft.rfft(noise, axis=2), axis=1)  # (n, rows, M) complex64
    modes = np.zeros((len(a_lat), grid.height, a_lon.shape[-1]), dtype=np.complex64)
    for j in range(a_lat.shape[1]):
        modes += sfft.ifft(lat_modes * a_lat[:, j, :, None], axis=1)[:, :grid.height] * a_lon[:, j]
    return sfft.irfft(modes, n=grid.width, axis=2)


@functools.lru_cache(maxsize=4)
def _spectral_filters(height: int, width: int, lengths_km: tuple) -> tuple[int, np.ndarray, np.ndarray]:
    """The filters of `random_fields` on one grid (the same for every snapshot).

    Returns:
        padded rows; (n, J, rows) float32 latitude filters (unit variance each); (n, J, H, M) float32
        longitude filters with the mixture weights and the per-row normalisation of the sum folded in.
    """
    grid = lat_lon_grid(height, width)
    scales = np.array([[length * f for f in MIX_SCALES] for length in lengths_km])  # (n, J)
    weights = np.where(scales >= 0.8 * grid.resolution_km, np.asarray(MIX_WEIGHTS), 0.0)  # (n, J)
    weights[:, 0] = MIX_WEIGHTS[0]  # the largest component always stays
    pad = min(height, math.ceil(3 * scales.max() / grid.dlat_km))
    import scipy.fft as sfft
    rows = sfft.next_fast_len(height + pad)
    k_lat = 2 * np.pi * np.fft.fftfreq(rows, d=grid.dlat_km)  # (rows,) rad/km
    a_lat = np.exp(-0.5 * (k_lat[None, None, :] * scales[:, :, None]) ** 2)  # (n, J, rows)
    a_lat /= np.sqrt(np.mean(a_lat ** 2, axis=2, keepdims=True))  # each component: unit variance
    m = np.arange(width // 2 + 1)
    k_lon = m[None, :] / (EARTH_RADIUS_KM * np.maximum(grid.coslat, 1e-9))[:, None]  # (H, M)
    a_lon = np.exp(-0.5 * (k_lon[None, None] * scales[:, :, None, None]) ** 2)  # (n, J, H, M)
    multiplicity = np.where((m == 0) | ((width % 2 == 0) & (m == width // 2)), 1.0, 2.0)
    a_lon /= np.sqrt(np.sum(multiplicity * a_lon ** 2, axis=3, keepdims=True) / width)
    # variance per row of the weighted sum of correlated components: sum_jk w_j w_k rho_jk
    rho_lat = np.einsum("njr,nkr->njk", a_lat, a_lat) / rows  # (n, J, J)
    variance = np.zeros((len(scales), height))
    for j in range(scales.shape[1]):
        for k in range(scales.shape[1]):
            rho_lon = np.sum(multiplicity * a_lon[:, j] * a_lon[:, k], axis=2) / width  # (n, H)
            variance += weights[:, j, None] * weights[:, k, None] * rho_lat[:, j, k, None] * rho_lon
    a_lon *= (weights[:, :, None, None] / np.sqrt(variance)[:, None, :, None])
    return rows, a_lat.astype(np.float32), a_lon.astype(np.float32)


# ---------------------------------------------------------------------------- the planet
@functools.lru_cache(maxsize=4)
def orography(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed planet on an H x W grid: (H, W) bool land mask and (H, W) float64 elevation in m.

    Continents are the high parts of a fixed sum of low-order waves evaluated at the cell centres, so
    every grid size sees the same continents (~30% of the surface between 60S and 60N, plus Antarctica).
    """
    rng = np.random.default_rng(OROGRAPHY_SEED)
    terms = 40
    m = rng.integers(0, 7, terms)
    n = rng.integers(1, 7, terms)
    phase_lon, phase_lat = rng.uniform(0, 2 * np.pi, (2, terms))
    amplitude = rng.standard_normal(terms) / (1.0 + 0.5 * (m + n))

    def waves(lat_deg: np.ndarray, lon_deg: np.ndarray) -> np.ndarray:
        phi, lam = np.radians(lat_deg)[:, None], np.radians(lon_deg)[:, None]
        by_lat = amplitude * np.cos(n * phi + phase_lat) * np.cos(phi) ** np.minimum(m, 2)  # (H, K)
        return by_lat @ np.cos(m * lam + phase_lon).T  # (H, W)

    reference = waves(np.linspace(-60, 60, 121), np.arange(360.0))
    threshold, top = np.quantile(reference, 0.70), reference.max()
    grid = lat_lon_grid(height, width)
    c = waves(grid.lat, grid.lon)
    elevation = 4000.0 * np.clip((c - threshold) / (top - threshold), 0.0, 1.0) ** 1.5
    ice = np.clip((-grid.lat - 66.0) / 14.0, 0.0, 1.0)[:, None] * np.ones((1, width))
    land = (c > threshold) | (ice > 0)
    elevation = np.maximum(elevation, 3000.0 * ice ** 0.7)
    return land, elevation


# ---------------------------------------------------------------------------- climate
@dataclasses.dataclass(frozen=True)
class ZonalMean:
    """Zonal-mean climate for one season; (H,) arrays."""

    u850: np.ndarray
    psl: np.ndarray
    t_sl: np.ndarray
    t500: np.ndarray
    t200: np.ndarray
    rh_col: np.ndarray


def _zonal_wind(lat: np.ndarray, season: float) -> np.ndarray:
    """850 hPa zonal-mean wind (m/s): trades, westerlies (stronger in winter), polar easterlies."""
    a = np.abs(lat - 6.0 * season)  # distance from the thermal equator
    summer = season * np.sign(lat)
    return (-6.0 * np.exp(-((a - 12.0) / 9.0) ** 2) + (10.0 - 2.5 * summer) * np.exp(-((a - 45.0) / 11.0) ** 2)
            - 3.0 * np.exp(-((a - 75.0) / 7.0) ** 2))


def _geostrophic_pressure(lat: np.ndarray, season: float, mean_pa: float = 101_100.0) -> np.ndarray:
    """Zonal-mean sea-level pressure in geostrophic balance with `_zonal_wind`: dp/dy = -rho f u."""
    fine = np.linspace(-90.0, 90.0, 1441)
    phi = np.radians(fine)
    gradient = -RHO_AIR * 2 * OMEGA * np.sin(phi) * _zonal_wind(fine, season) * EARTH_RADIUS_M  # Pa/rad
    steps = 0.5 * (gradient[1:] + gradient[:-1]) * np.diff(phi)
    pressure = np.concatenate([[0.0], np.cumsum(steps)])
    weights = np.cos(phi)
    pressure += mean_pa - np.sum(pressure * weights) / np.sum(weights)
    return np.interp(lat, fine, pressure)


def zonal_mean(grid: LatLonGrid, season: float) -> ZonalMean:
    """The zonal-mean climate of a season (+1 northern summer, -1 southern summer)."""
    lat = grid.lat
    s2 = np.sin(np.radians(lat - 6.0 * season)) ** 2
    sin = np.sin(grid.phi)
    summer_pole = sin * np.abs(sin)  # +1 north pole, -1 south pole
    a = np.abs(lat - 6.0 * season)
    return ZonalMean(
        u850=_zonal_wind(lat, season),
        psl=_geostrophic_pressure(lat, season),
        t_sl=300.5 - 14.0 * s2 - 36.0 * s2 ** 2 + 12.0 * season * summer_pole,
        t500=267.5 - 30.0 * s2 + 6.0 * season * summer_pole,
        t200=218.0 + 5.0 * np.exp(-((a - 48.0) / 14.0) ** 2) + 8.0 * season * summer_pole * sin ** 2,
        rh_col=(0.42 + 0.33 * np.exp(-((lat - 7.0 * season) / 9.0) ** 2) - 0.10 * np.exp(-((a - 25.0) / 9.0) ** 2)
                + 0.18 * np.exp(-((a - 55.0) / 15.0) ** 2)),
    )


def background(grid: LatLonGrid, season: float, rng: np.random.Generator) -> Atmosphere:
    """Zonal-mean climate plus synoptic random weather (module docstring, steps 2-4)."""
    land, _ = orography(grid.height, grid.width)
    clim = zonal_mean(grid, season)
    psi_unit, temp, moist, t200_noise, rain = random_fields(
        rng, grid, (FLOW_LENGTH_KM, TEMPERATURE_LENGTH_KM, MOISTURE_LENGTH_KM, T200_LENGTH_KM, RAIN_LENGTH_KM))
    lat = grid.lat[:, None]
    flow_envelope = 0.3 + 0.7 * np.exp(-((np.abs(lat) - 50.0) / 20.0) ** 2)
    psi = PSI_STD * flow_envelope * psi_unit  # (H, W) m^2/s
    u_eddy, v_eddy = nondivergent_wind(psi, grid)
    f = 2 * OMEGA * np.sin(grid.phi)[:, None]
    psl_eddy = RHO_AIR * f * psi
    sin2 = np.sin(grid.phi)[:, None] ** 2
    t_eddy = (1.0 + 3.0 * sin2) * temp * np.where(land, 1.6, 1.0)
    t500_eddy = 0.6 * t_eddy + 0.3 * psl_eddy / 100.0  # ridges are warm aloft
    rh_col = np.clip(clim.rh_col[:, None] + 0.13 * moist, 0.03, 0.97) * np.where(land, 0.8, 1.0)
    rh_sfc = np.clip(0.45 + 0.5 * rh_col + 0.05 * moist, 0.1, 1.0) * np.where(land, 0.85, 1.0)
    land_season = 6.0 * season * np.sign(lat) * np.sqrt(sin2) * land  # continents follow the season
    return Atmosphere(
        psl=clim.psl[:, None] + psl_eddy,
        u850=clim.u850[:, None] + u_eddy,
        v850=v_eddy,
        t_sl=clim.t_sl[:, None] + t_eddy + land_season,
        t500=clim.t500[:, None] + t500_eddy,
        t200=clim.t200[:, None] - 0.4 * t500_eddy + 1.5 * t200_noise,
        rh_col=rh_col,
        rh_sfc=rh_sfc,
        rain_noise=np.exp(0.6 * rain),
        rain_extra=np.zeros((grid.height, grid.width)),
    )


def nondivergent_wind(psi: np.ndarray, grid: LatLonGrid) -> tuple[np.ndarray, np.ndarray]:
    """(u, v) = (-d psi / dy, d psi / dx) on the sphere (centred differences, periodic in longitude)."""
    dy = grid.dlat_km * 1e3
    u = -np.gradient(psi, dy, axis=0)
    dx = np.maximum(grid.dlon_km, 1e-6)[:, None] * 1e3
    v = (np.roll(psi, -1, axis=1) - np.roll(psi, 1, axis=1)) / (2 * dx)
    return u, v


# ---------------------------------------------------------------------------- events
def draw_cyclones(rng: np.random.Generator, grid: LatLonGrid, season: float) -> tuple[Cyclone, ...]:
    """Tropical cyclones of one snapshot: Poisson count, over the ocean, random strengths."""
    land, _ = orography(grid.height, grid.width)
    ell = cyclone_length_km(grid)
    scale = ell / cyclone_length_km(lat_lon_grid(FULL_HEIGHT, FULL_WIDTH))
    cyclones = []
    for _ in range(rng.poisson(CYCLONES_PER_SNAPSHOT / scale ** CYCLONE_RATE_EXPONENT)):
        north = rng.random() < 0.5 + 0.3 * season  # more in the summer hemisphere
        lat, lon = 0.0, 0.0
        for _attempt in range(20):
            lat = (1 if north else -1) * rng.uniform(6.0, 28.0)
            lon = rng.uniform(0.0, 360.0)
            if not land[_row(grid, lat), _col(grid, lon)]:
                break
        else:
            continue  # no ocean found: no cyclone
        cyclones.append(Cyclone(lat=lat, lon=lon, depression_pa=500.0 + 6500.0 * rng.random() ** 1.5,
                                rmw_km=ell * rng.uniform(0.6, 1.4), holland_b=rng.uniform(1.0, 1.6),
                                warm_core=rng.uniform(0.06, 0.12)))
    return tuple(cyclones)


def draw_rivers(rng: np.random.Generator, grid: LatLonGrid, season: float) -> tuple[River, ...]:
    """Atmospheric rivers of one snapshot: Poisson count, curved poleward filaments, random strengths."""
    width = river_width_km(grid)
    scale = width / river_width_km(lat_lon_grid(FULL_HEIGHT, FULL_WIDTH))
    rivers = []
    for _ in range(rng.poisson(RIVERS_PER_SNAPSHOT / scale ** RIVER_RATE_EXPONENT)):
        north = rng.random() < 0.5 - 0.15 * season  # a few more in the winter hemisphere
        sigma = width * rng.uniform(0.8, 1.2)
        lats, lons, headings = _river_axis(
            start=((1 if north else -1) * rng.uniform(14.0, 28.0), rng.uniform(0.0, 360.0)),
            heading_deg=rng.uniform(30.0, 70.0), turn_deg_per_1000km=rng.uniform(-6.0, 2.0),
            length_km=rng.uniform(4000.0, 9000.0) * math.sqrt(scale), step_km=min(sigma / 2, 150.0))
        rivers.append(River(lats=lats, lons=lons, headings=headings, sigma_km=sigma,
                            strength=rng.uniform(0.3, 1.0), jet=rng.uniform(15.0, 25.0)))
    return tuple(rivers)


def _river_axis(start, heading_deg, turn_deg_per_1000km, length_km, step_km):
    """Points along a river's axis: from `start` poleward and eastward, turning as it goes."""
    lat, lon = start
    hemisphere = 1.0 if lat >= 0 else -1.0
    theta = math.radians(heading_deg)  # angle from east toward the pole
    turn = math.radians(turn_deg_per_1000km) / 1000.0 * step_km
    lats, lons, headings = [], [], []
    for _ in range(max(2, int(length_km / step_km) + 1)):
        east, north = math.cos(theta), hemisphere * math.sin(theta)
        lats.append(lat)
        lons.append(lon)
        headings.append((east, north))
        lat += math.degrees(step_km * north / EARTH_RADIUS_KM)
        lon += math.degrees(step_km * east / (EARTH_RADIUS_KM * max(math.cos(math.radians(lat)), 0.05)))
        theta = min(max(theta + turn, math.radians(-10.0)), math.radians(85.0))
        if abs(lat) > 72.0:
            break
    return np.array(lats), np.array(lons), np.array(headings)


def apply_cyclone(atm: Atmosphere, grid: LatLonGrid, cyclone: Cyclone) -> None:
    """Add a warm-core vortex: Holland pressure profile, gradient wind, warm core, moisture, rain."""
    ell = cyclone_length_km(grid)
    outer = 6.0 * ell  # Gaussian taper of the pressure anomaly
    rows, cols, x, y = _local_window(grid, cyclone.lat, cyclone.lon, 1.6 * outer)
    r = np.maximum(np.hypot(x, y), 1.0)  # km
    dp, rm, b = cyclone.depression_pa, cyclone.rmw_km, cyclone.holland_b
    a = (rm / r) ** b
    ea = np.exp(-a)
    taper = np.exp(-(r / outer) ** 2)
    window = np.ix_(rows, cols)
    atm.psl[window] -= dp * (1.0 - ea) * taper
    dp_dr = dp * taper * (b * a * ea / r + 2.0 * r * (1.0 - ea) / outer ** 2) / 1e3  # Pa/m
    f = abs(2 * OMEGA * math.sin(math.radians(cyclone.lat)))
    r_m = r * 1e3
    speed = np.sqrt(r_m * dp_dr / RHO_AIR + (f * r_m / 2) ** 2) - f * r_m / 2  # gradient wind
    turn = 1.0 if cyclone.lat >= 0 else -1.0  # counter-clockwise in the north
    atm.u850[window] += turn * speed * -y / r
    atm.v850[window] += turn * speed * x / r
    warm = cyclone.warm_core * dp / 100.0 * np.exp(-(r / (2.0 * ell)) ** 2)
    atm.t500[window] += warm
    atm.t200[window] += 1.8 * warm
    wet = min(1.0, dp / 2000.0) * 0.85 * np.exp(-(r / (3.0 * ell)) ** 2)
    atm.rh_col[window] += (0.98 - atm.rh_col[window]) * wet
    atm.rain_extra[window] += 3.5e-5 * (dp / 7000.0) * np.exp(-((r - rm) / (0.7 * rm)) ** 2)


def apply_river(atm: Atmosphere, grid: LatLonGrid, river: River) -> None:
    """Add a moist, warm filament with a balanced low-level jet along the river's axis."""
    from scipy.special import erf
    reach = 3.5 * river.sigma_km
    lat_lo, lat_hi = river.lats.min(), river.lats.max()
    reach_deg = math.degrees(reach / EARTH_RADIUS_KM)
    rows = np.flatnonzero((grid.lat >= lat_lo - reach_deg) & (grid.lat <= lat_hi + reach_deg))
    lat_max = max(abs(lat_lo), abs(lat_hi)) + reach_deg
    cols = _cols_between(grid, river.lons.min(), river.lons.max(), reach, lat_max)
    if rows.size == 0:
        return
    x, y, nearest = _nearest_axis_point(grid, rows, cols, river)
    east, north = river.headings[nearest, 0], river.headings[nearest, 1]
    along = nearest / max(1, len(river.lats) - 1)  # 0 at the subtropical end, 1 at the poleward end
    sigma = river.sigma_km * (1.0 - 0.35 * along)
    distance = np.hypot(x, y)
    taper = np.where(along < 0.7, 1.0, np.cos(np.pi / 2 * (along - 0.7) / 0.3) ** 2)
    core = np.exp(-0.5 * (distance / sigma) ** 2) * taper * river.strength
    window = np.ix_(rows, cols)
    # the river carries subtropical air: its core keeps 60% of the warmth of its origin (at least 4 K)
    origin = atm.t_sl[_row(grid, river.lats[0]), _col(grid, river.lons[0])]
    warmth = np.maximum(4.0, 0.6 * (origin - atm.t_sl[window]))
    atm.rh_col[window] += (0.97 - atm.rh_col[window]) * core
    atm.t_sl[window] += warmth * core
    atm.t500[window] += 2.0 * core
    atm.u850[window] += river.jet * core * east
    atm.v850[window] += river.jet * core * north
    # geostrophic pressure of the jet: dp/dn = -rho f J(n), n the distance to the left of the flow
    left = east * y - north * x
    f = 2 * OMEGA * np.sin(grid.phi[rows])[:, None]
    jump = -RHO_AIR * f * river.jet * river.strength * sigma * 1e3 * math.sqrt(math.pi / 2)
    fade = taper * np.exp(-0.5 * (distance / (3 * sigma)) ** 2)  # a local trough-ridge pair
    atm.psl[window] += jump * erf(left / (sigma * math.sqrt(2))) * fade


def _nearest_axis_point(grid: LatLonGrid, rows: np.ndarray, cols: np.ndarray, river: River):
    """For the cells rows x cols: local (east, north) offset in km from the nearest axis point, and its index."""
    cos_cell = grid.coslat[rows][:, None]
    best = np.full((len(rows), len(cols)), np.inf)
    x = np.zeros_like(best)
    y = np.zeros_like(best)
    nearest = np.zeros(best.shape, dtype=np.int64)
    for i, (lat, lon) in enumerate(zip(river.lats, river.lons)):  # one (h, w) plane at a time: little memory
        dx = np.radians((grid.lon[cols] - lon + 180.0) % 360.0 - 180.0)[None, :] * EARTH_RADIUS_KM * cos_cell
        dy = np.radians(grid.lat[rows] - lat)[:, None] * EARTH_RADIUS_KM
        d2 = dx * dx + dy * dy
        closer = d2 < best
        best = np.where(closer, d2, best)
        x = np.where(closer, dx, x)
        y = np.where(closer, dy, y)
        nearest[closer] = i
    return x, y, nearest


def _local_window(grid: LatLonGrid, lat: float, lon: float, radius_km: float):
    """Rows, columns and local (east, north) offsets in km of the cells within a box around a point."""
    rows = grid.rows_within(lat, radius_km)
    cols = grid.cols_within(lon, radius_km, max(abs(grid.lat[rows[0]]), abs(grid.lat[rows[-1]])))
    dlon = (grid.lon[cols] - lon + 180.0) % 360.0 - 180.0
    x = np.radians(dlon)[None, :] * EARTH_RADIUS_KM * grid.coslat[rows][:, None]
    y = np.radians(grid.lat[rows] - lat)[:, None] * EARTH_RADIUS_KM * np.ones((1, len(cols)))
    return rows, cols, x, y


def _cols_between(grid: LatLonGrid, lon_lo: float, lon_hi: float, reach_km: float, lat_max: float) -> np.ndarray:
    """Wrapped column indices covering the (unwrapped) longitudes lon_lo..lon_hi plus reach_km."""
    cos_min = max(math.cos(math.radians(min(lat_max, 85.0))), 0.05)
    pad = math.degrees(reach_km / (EARTH_RADIUS_KM * cos_min))
    first = math.floor((lon_lo - pad) / 360.0 * grid.width)
    last = math.ceil((lon_hi + pad) / 360.0 * grid.width)
    if last - first + 1 >= grid.width:
        return np.arange(grid.width)
    return np.arange(first, last + 1) % grid.width


def _row(grid: LatLonGrid, lat: float) -> int:
    return int(round((lat + 90.0) / 180.0 * (grid.height - 1)))


def _col(grid: LatLonGrid, lon: float) -> int:
    return int(round(lon / 360.0 * grid.width)) % grid.width


# ---------------------------------------------------------------------------- the 16 channels
def saturation_humidity(temperature: np.ndarray, pressure: np.ndarray) -> np.ndarray:
    """Saturation specific humidity (kg/kg) over water (Bolton 1980 vapour pressure)."""
    vapour = 611.2 * np.exp(17.67 * (temperature - 273.15) / (temperature - 29.65))
    return 0.622 * vapour / (pressure - 0.378 * vapour)


def derive_channels(atm: Atmosphere, grid: LatLonGrid) -> np.ndarray:
    """The 16 CAM5 channels from the state (module docstring, step 7); (H, W, 16) float32."""
    land, elevation = orography(grid.height, grid.width)
    trefht = atm.t_sl - LAPSE_RATE * elevation
    ts = trefht + np.where(land, 1.5, 0.8)
    ps = atm.psl * np.exp(-G * elevation / (R_DRY * (trefht + 0.5 * LAPSE_RATE * elevation)))
    qsat = saturation_humidity(trefht, ps)
    qrefht = atm.rh_sfc * qsat
    rh_col = np.clip(atm.rh_col, 0.0, 0.99)
    # the column above a hot surface is not as hot: its saturation follows TREFHT only slowly past 300 K
    t_column = np.minimum(trefht, COLUMN_WARMEST + 0.3 * (trefht - COLUMN_WARMEST))
    column_sat = saturation_humidity(t_column, ps) * ps / G * COLUMN_WATER_FACTOR
    tmq = rh_col * column_sat
    rain_mm_day = np.exp(15.6 * (rh_col - 0.603)) * (column_sat / 50.0) * atm.rain_noise
    prect = np.maximum(rain_mm_day - 0.05, 0.0) * MM_PER_DAY + atm.rain_extra
    ubot, vbot = _surface_wind(atm.u850, atm.v850, grid, land)
    t_virtual = atm.t_sl * (1 + 0.61 * qrefht)
    z1000 = R_DRY * t_virtual / G * np.log(atm.psl / 1e5)
    thickness = 0.5 * math.log(2.0) * (t_virtual + atm.t500) + 0.5 * math.log(2.5) * (atm.t500 + atm.t200)
    z200 = z1000 + R_DRY / G * thickness
    zbot = R_DRY / G * trefht * (1 + 0.61 * qrefht) * ZBOT_LOG_PRESSURE
    channels = {"TMQ": tmq, "U850": atm.u850, "V850": atm.v850, "UBOT": ubot, "VBOT": vbot, "QREFHT": qrefht,
                "PS": ps, "PSL": atm.psl, "T200": atm.t200, "T500": atm.t500, "PRECT": prect, "TS": ts,
                "TREFHT": trefht, "Z1000": z1000, "Z200": z200, "ZBOT": zbot}
    data = np.empty((grid.height, grid.width, len(VARIABLES)), dtype=np.float32)
    for i, name in enumerate(VARIABLES):
        data[..., i] = channels[name]
    return data


def _surface_wind(u: np.ndarray, v: np.ndarray, grid: LatLonGrid, land: np.ndarray):
    """Near-surface wind: the 850 hPa wind slowed by friction and turned toward low pressure
    (to the left in the north, to the right in the south), more over land."""
    factor = np.where(land, 0.55, 0.75)
    angle = np.radians(np.where(land, 30.0, 20.0)) * np.sign(grid.lat)[:, None]
    cos, sin = np.cos(angle), np.sin(angle)
    return factor * (u * cos - v * sin), factor * (u * sin + v * cos)


# ---------------------------------------------------------------------------- one snapshot
def generate_snapshot(spec: SynthSpec, index: int, split: str = "train") -> Snapshot:
    """Snapshot `index` of `split`: fields, labels from the fields, and what was drawn."""
    seed = snapshot_seed(spec.seed, split, index)
    season_rng, field_rng, cyclone_rng, river_rng = (np.random.default_rng(s)
                                                     for s in np.random.SeedSequence(seed).spawn(4))
    grid = lat_lon_grid(spec.height, spec.width)
    season = float(season_rng.uniform(-1.0, 1.0))
    atm = background(grid, season, field_rng)
    cyclones = draw_cyclones(cyclone_rng, grid, season)
    rivers = draw_rivers(river_rng, grid, season)
    for river in rivers:
        apply_river(atm, grid, river)
    for cyclone in cyclones:
        apply_cyclone(atm, grid, cyclone)
    data = derive_channels(atm, grid)
    return Snapshot(data=data, labels=label_snapshot(data), seed=seed, season=season, cyclones=cyclones,
                    rivers=rivers)


# ---------------------------------------------------------------------------- files
@dataclasses.dataclass(frozen=True)
class FileResult:
    """A snapshot file of the dataset, written now or found complete, and its statistics."""

    split: str
    index: int
    written: bool
    partial: climate_stats.PartialStats


def write_snapshot(spec: SynthSpec, split: str, index: int, out_dir: Path) -> FileResult:
    """Generate snapshot `index` of `split` into out_dir/<split>/data-<index>.h5 through a temporary file."""
    import h5py
    snapshot = generate_snapshot(spec, index, split)
    final = out_dir / split / file_name(index)
    try:
        with atomic_path(final) as temp, h5py.File(temp, "w") as f:
            group = f.create_group("climate")
            data = group.create_dataset("data", data=snapshot.data)
            data.attrs.update({"variables": list(VARIABLES), "units": list(UNITS)})
            labels = group.create_dataset("labels_0", data=snapshot.labels.astype(np.float32))
            labels.attrs["classes"] = list(CLASSES)
            f.attrs.update({**spec.attrs(), "split": split, "index": index, "seed": snapshot.seed,
                            "season": snapshot.season, "cyclones_drawn": len(snapshot.cyclones),
                            "rivers_drawn": len(snapshot.rivers),
                            "grid": "latitude -90..90 (row 0 south, inclusive), longitude 0..360 periodic"})
    except OSError as err:  # disk full, permissions: the user's to fix
        raise BenchError(f"{final}: could not write the snapshot ({err})") from None
    return FileResult(split, index, True, climate_stats.partial_stats(snapshot.data, snapshot.labels))


def read_existing(spec: SynthSpec, split: str, index: int, out_dir: Path) -> FileResult:
    """Statistics of a finished snapshot file (already verified by `existing_snapshots`)."""
    return FileResult(split, index, False, climate_stats.file_partial_stats(out_dir / split / file_name(index)))


def existing_snapshots(out_dir: Path, spec: SynthSpec, split: str, wanted: int) -> set[int]:
    """Indices of the finished snapshots of a split; raise if any was made with other settings or lies
    beyond the requested count."""
    import h5py
    found = set()
    split_dir = out_dir / split
    for path in sorted(split_dir.iterdir()):
        match = FILE_RE.match(path.name)
        if not match:
            continue
        index = int(match.group(1))
        try:
            with h5py.File(path, "r") as f:
                attrs = {key: plain(f.attrs.get(key)) for key in (*spec.attrs(), "split", "index")}
                shape = f["climate/data"].shape if "climate/data" in f else None
        except OSError as err:
            raise BenchError(f"{path}: not a readable HDF5 file ({err}); delete it and rerun") from None
        _check_same_dataset(path, attrs, shape, spec, split, index)
        if index >= wanted:
            raise BenchError(f"{path}: snapshot {index} is beyond the {wanted} requested for {split}/ "
                             f"(indices 0..{wanted - 1}); pass a larger --{split} or delete the extra files")
        found.add(index)
    return found


def _check_same_dataset(path: Path, attrs: dict, shape, spec: SynthSpec, split: str, index: int) -> None:
    expected = {**spec.attrs(), "split": split, "index": index}
    differing = {key: attrs[key] for key, value in expected.items() if attrs[key] != value}
    if differing:
        found = ", ".join(f"{key}={value!r}" for key, value in differing.items())
        wanted = ", ".join(f"{key}={expected[key]!r}" for key in differing)
        raise BenchError(f"{path}: made with {found}, but this run asks for {wanted}; a directory must hold "
                         f"one dataset: choose another --out or delete the old files")
    if shape != (spec.height, spec.width, len(VARIABLES)):
        raise BenchError(f"{path}: climate/data has shape {shape}, expected "
                         f"{(spec.height, spec.width, len(VARIABLES))}; delete it and rerun")


# ---------------------------------------------------------------------------- a dataset
@dataclasses.dataclass(frozen=True)
class DatasetReport:
    """What `write_dataset` did."""

    out_dir: Path
    written: dict  # split -> number of files written now
    present: dict  # split -> number found complete
    stats: climate_stats.ChannelStats  # over the training files
    seconds: float


def write_dataset(out_dir: Path, spec: SynthSpec, train: int, validation: int, workers: int | None = None,
                  progress: bool = True) -> DatasetReport:
    """Generate the missing snapshots of OUT/train and OUT/validation, then OUT/stats.h5.

    Args:
        train, validation: snapshots per split (indices 0..n-1); validation may be 0.
        workers: processes (default: the CPUs available, capped by memory).
    """
    started = time.perf_counter()
    out_dir = Path(out_dir)
    jobs, present = [], {}
    for split, count in (("train", train), ("validation", validation)):
        (out_dir / split).mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(out_dir / split, TEMP_RE)
        done = existing_snapshots(out_dir, spec, split, count)
        present[split] = len(done)
        jobs += [(split, i, i in done) for i in range(count)]
    workers = choose_workers(workers, len(jobs), spec)
    results = run_jobs(spec, out_dir, jobs, workers, progress)
    train_partials = [r.partial for r in sorted(results, key=lambda r: r.index) if r.split == "train"]
    stats = climate_stats.combine(train_partials)
    climate_stats.write_stats(out_dir / "stats.h5", stats, attrs={**spec.attrs(), "files": train,
                                                                  "source": "train/data-*.h5"})
    written = {split: sum(r.written for r in results if r.split == split) for split in SPLITS}
    return DatasetReport(out_dir, written, present, stats, time.perf_counter() - started)


def choose_workers(requested: int | None, jobs: int, spec: SynthSpec) -> int:
    """Worker processes: requested or the available CPUs, at most one per job and what memory allows."""
    import psutil
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = max(1, min(requested or cpus, max(jobs, 1)))
    per_worker = BYTES_PER_CELL * spec.height * spec.width
    fit = max(1, int(psutil.virtual_memory().available // per_worker))
    if fit < workers:
        print(f"deepcam-synth: {workers} workers would need {workers * per_worker / 1e9:.1f} GB; using {fit}",
              flush=True)
        workers = fit
    return workers


def run_jobs(spec: SynthSpec, out_dir: Path, jobs: list[tuple[str, int, bool]], workers: int,
             progress: bool) -> list[FileResult]:
    """Write the missing snapshots and read the statistics of the present ones, showing progress."""
    from tqdm import tqdm
    results = []
    task = functools.partial(_job, spec, out_dir)
    with tqdm(total=len(jobs), unit="file", desc="deepcam-synth", disable=not (progress and jobs)) as bar:
        if workers <= 1:
            for job in jobs:
                results.append(task(job))
                bar.update()
        else:
            # spawn: workers start clean. They ignore Ctrl-C; leaving the block (done, error or Ctrl-C)
            # terminates them at once, and a killed worker's temporary file is removed by the next run.
            context = multiprocessing.get_context("spawn")
            chunk = max(1, min(16, len(jobs) // (8 * workers)))
            with context.Pool(workers, initializer=_ignore_interrupts) as pool:
                for result in pool.imap_unordered(task, jobs, chunksize=chunk):
                    results.append(result)
                    bar.update()
    return results


def _job(spec: SynthSpec, out_dir: Path, job: tuple[str, int, bool]) -> FileResult:
    split, index, present = job
    return read_existing(spec, split, index, out_dir) if present else write_snapshot(spec, split, index, out_dir)


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# ---------------------------------------------------------------------------- command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options (values are checked in `run`, which raises BenchError)."""
    parser.add_argument("--out", type=Path, required=True,
                        help="output directory: train/, validation/ and stats.h5 (created if needed)")
    parser.add_argument("--train", type=int, required=True, help="training snapshots")
    parser.add_argument("--validation", type=int, required=True, help="validation snapshots (0 for none)")
    parser.add_argument("--height", type=int, default=FULL_HEIGHT,
                        help=f"latitude rows H (default %(default)s, the real grid; >= {MIN_HEIGHT})")
    parser.add_argument("--width", type=int, default=FULL_WIDTH,
                        help=f"longitude columns W (default %(default)s; >= {MIN_WIDTH}, 1-3 times H)")
    parser.add_argument("--seed", type=int, default=0, help="base seed (default %(default)s)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes (default: the CPUs available, capped by memory)")


def run(args: argparse.Namespace) -> int:
    """Generate the missing snapshots, recompute stats.h5, print what was written where."""
    spec = spec_from_args(args)
    _check_run_args(args)
    report = write_dataset(Path(args.out), spec, args.train, args.validation, args.workers)
    print(summary(spec, report), flush=True)
    return 0


def spec_from_args(args: argparse.Namespace) -> SynthSpec:
    """The dataset spec, with every value checked."""
    if args.height < MIN_HEIGHT:
        raise BenchError(f"--height {args.height}: expected at least {MIN_HEIGHT} latitude rows (smaller grids "
                         f"cannot hold cyclones and rivers; the real grid is {FULL_HEIGHT} x {FULL_WIDTH})")
    if args.width < MIN_WIDTH:
        raise BenchError(f"--width {args.width}: expected at least {MIN_WIDTH} longitude columns (smaller grids "
                         f"cannot hold cyclones and rivers; the real grid is {FULL_HEIGHT} x {FULL_WIDTH})")
    if not args.height <= args.width <= 3 * args.height:
        raise BenchError(f"--width {args.width} with --height {args.height}: expected a width between 1 and 3 "
                         f"times the height, for cells roughly as wide as high (the real grid: 1152 = 1.5 x 768)")
    if args.seed < 0:
        raise BenchError(f"--seed {args.seed}: expected a non-negative integer")
    return SynthSpec(height=args.height, width=args.width, seed=args.seed)


def _check_run_args(args: argparse.Namespace) -> None:
    if args.train < 1:
        raise BenchError(f"--train {args.train}: expected a positive number of training snapshots")
    if args.validation < 0:
        raise BenchError(f"--validation {args.validation}: expected a non-negative number of validation snapshots")
    if args.workers is not None and args.workers < 1:
        raise BenchError(f"--workers {args.workers}: expected a positive number of processes")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise BenchError(f"--out {out}: exists and is not a directory")
    for split in SPLITS:
        if (out / split).exists() and not (out / split).is_dir():
            raise BenchError(f"{out / split}: exists and is not a directory")


def summary(spec: SynthSpec, report: DatasetReport) -> str:
    """The final report: files, time, measured class frequencies, where."""
    frequencies = report.stats.class_frequencies
    classes = ", ".join(f"{name} {100 * freq:.3f}%" for name, freq in zip(CLASSES, frequencies))
    written = sum(report.written.values())
    present = sum(report.present.values())
    return (f"deepcam-synth: {written} snapshots of {spec.height} x {spec.width} x {len(VARIABLES)} written "
            f"(train {report.written['train']}, validation {report.written['validation']}), {present} already "
            f"present, seed {spec.seed}, in {report.seconds:.1f} s -> {report.out_dir}\n"
            f"classes over {int(report.stats.files)} training snapshots: {classes}; stats -> "
            f"{report.out_dir / 'stats.h5'}")
