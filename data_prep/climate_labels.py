"""TECA-like heuristic labels for CAM5-style climate snapshots: tropical cyclones and atmospheric rivers.

The labeller sees only the 16 fields of a snapshot, never the generator's list of events, so labels are
a deterministic function of the data: what a segmentation network is asked to learn. It also runs on
real DeepCAM files (same channel order, same grid convention).

Grid convention (DeepCAM's CAM5 files): H rows of latitude from -90 (row 0) to +90 (row H-1) inclusive,
W columns of longitude 0, 360/W, ... (periodic). Lengths in km on a sphere of radius 6371 km.

Tropical cyclones (class 1). Sizes are in units of the cyclone length scale l = max(70 km, 0.8 grid
cells) (`cyclone_length_km`; one cell = the larger of the latitude spacing and the longitude spacing
at 20 degrees), so a cyclone spans the same number of cells on every grid coarser than about 1/3 degree.
1. Candidates: cells whose PSL is the minimum of a box of +-4 l around them, at |latitude| <= 35, with
   a UBOT/VBOT wind speed >= 17 m/s somewhere within that box. Strongest (lowest PSL) first; a candidate
   within 4 l of an accepted cyclone is skipped.
2. Accepted if all of: the mean PSL over the ring 4-7 l minus the centre's PSL >= 10 hPa (depression);
   the mean of (T200 + T500) / 2 within 1.5 l exceeds its mean over the ring by >= 1 K (warm core);
   the wind speed reaches 17 m/s within 3 l; the mean cyclonic tangential wind (counter-clockwise in the
   northern hemisphere, clockwise in the southern) within 3 l is >= 5 m/s.
3. Labelled: the cells within 3.5 l of the centre whose wind speed is >= 17 m/s, plus every cell closer
   to the centre than the strongest wind (the calm eye).

Atmospheric rivers (class 2). IVT ~ TMQ * |(U850, V850)| (kg m^-1 s^-1), an integrated vapour transport
estimate from the column water and the 850 hPa wind.
1. Candidate cells: IVT >= 500, TMQ >= 20 kg m^-2 (Ralph et al. 2004's 2 cm of water vapour),
   |latitude| >= 15 (poleward of the deep tropics, whose moisture would otherwise join everything).
2. Connected components (8-neighbour, periodic in longitude). Kept if: length >= 2000 km, where length
   is the great-circle distance between the two cells farthest apart (double sweep); length / width >= 2
   with width = area / length; the component reaches |latitude| <= 35 (it starts in the subtropics);
   its mean poleward IVT (TMQ * V850 * sign(latitude)) is >= 50 (it carries moisture poleward).

Where both apply, the cyclone wins (as in the real TECA labels). Thresholds live in `LabelThresholds`.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

# The 16 CAM5 variables of the DeepCAM dataset, in channel order, and their units.
VARIABLES = ("TMQ", "U850", "V850", "UBOT", "VBOT", "QREFHT", "PS", "PSL", "T200", "T500", "PRECT", "TS",
             "TREFHT", "Z1000", "Z200", "ZBOT")
UNITS = ("kg m-2", "m s-1", "m s-1", "m s-1", "m s-1", "kg kg-1", "Pa", "Pa", "K", "K", "m s-1", "K", "K",
         "m", "m", "m")
CHANNEL = {name: i for i, name in enumerate(VARIABLES)}
CLASSES = ("background", "tropical_cyclone", "atmospheric_river")
BACKGROUND, CYCLONE, RIVER = 0, 1, 2

EARTH_RADIUS_KM = 6371.0


@dataclasses.dataclass(frozen=True)
class LabelThresholds:
    """The labelling heuristic's thresholds (module docstring); radii in units of the cyclone length."""

    cyclone_max_lat: float = 35.0  # degrees
    cyclone_search: float = 4.0  # half-width of the local-minimum box and the suppression radius
    cyclone_ring: tuple[float, float] = (4.0, 7.0)  # environment ring for depression and warm core
    cyclone_core: float = 1.5  # warm-core radius
    cyclone_wind_radius: float = 3.0  # where the wind criteria are checked
    cyclone_label_radius: float = 3.5  # the labelled disc's outer limit
    cyclone_depression_pa: float = 1000.0
    cyclone_warm_core_k: float = 1.0
    cyclone_wind: float = 17.0  # m/s, UBOT/VBOT speed: detection and labelled region
    cyclone_tangential_wind: float = 5.0  # m/s, mean cyclonic tangential wind
    river_ivt: float = 500.0  # kg m-1 s-1
    river_tmq: float = 20.0  # kg m-2
    river_min_lat: float = 15.0  # degrees: candidate cells are poleward of this
    river_reach_lat: float = 35.0  # degrees: a river reaches at least this far equatorward
    river_length_km: float = 2000.0
    river_aspect: float = 2.0
    river_poleward_ivt: float = 50.0  # kg m-1 s-1, component mean


DEFAULT_THRESHOLDS = LabelThresholds()


# ---------------------------------------------------------------------------- the grid
class LatLonGrid:
    """Coordinates and cell sizes of the H x W latitude-longitude grid (module docstring)."""

    def __init__(self, height: int, width: int):
        self.height, self.width = height, width
        self.lat = np.linspace(-90.0, 90.0, height)  # (H,) degrees, row 0 = south pole
        self.lon = np.arange(width) * (360.0 / width)  # (W,) degrees east
        self.phi = np.radians(self.lat)
        self.coslat = np.maximum(np.cos(self.phi), 0.0)
        self.dlat_km = math.pi * EARTH_RADIUS_KM / (height - 1)
        self.dlon_km = 2 * math.pi * EARTH_RADIUS_KM * self.coslat / width  # (H,)
        # area of each row's cells: the band between the half-way latitudes (non-zero at the poles)
        edges = np.radians(np.clip(np.concatenate([[-90.0], (self.lat[1:] + self.lat[:-1]) / 2, [90.0]]),
                                   -90, 90))
        self.cell_area_km2 = (EARTH_RADIUS_KM ** 2 * (2 * math.pi / width)
                              * (np.sin(edges[1:]) - np.sin(edges[:-1])))  # (H,)
        # one cell: the larger spacing where events live (longitude spacing taken at 20 degrees)
        self.dlon20_km = 2 * math.pi * EARTH_RADIUS_KM * math.cos(math.radians(20)) / width
        self.resolution_km = max(self.dlat_km, self.dlon20_km)

    @functools.cached_property
    def unit_vectors(self) -> np.ndarray:
        """(H, W, 3) cell centres on the unit sphere (great-circle distances)."""
        lam = np.radians(self.lon)
        return np.stack(np.broadcast_arrays(self.coslat[:, None] * np.cos(lam)[None, :],
                                            self.coslat[:, None] * np.sin(lam)[None, :],
                                            np.sin(self.phi)[:, None]), axis=-1)

    def rows_within(self, lat: float, radius_km: float) -> np.ndarray:
        """Row indices within radius_km (in latitude) of `lat`."""
        reach = radius_km / self.dlat_km
        centre = (lat + 90.0) / 180.0 * (self.height - 1)
        return np.arange(max(0, math.floor(centre - reach)), min(self.height, math.ceil(centre + reach) + 1))

    def cols_within(self, lon: float, radius_km: float, lat_max: float) -> np.ndarray:
        """Column indices (wrapped) within radius_km of `lon` at latitudes up to |lat_max|."""
        cos_min = max(math.cos(math.radians(min(abs(lat_max), 89.0))), 1e-3)
        reach = radius_km / (2 * math.pi * EARTH_RADIUS_KM * cos_min / self.width)
        if 2 * reach + 1 >= self.width:
            return np.arange(self.width)
        centre = lon / 360.0 * self.width
        return np.arange(math.floor(centre - reach), math.ceil(centre + reach) + 1) % self.width


@functools.lru_cache(maxsize=8)
def lat_lon_grid(height: int, width: int) -> LatLonGrid:
    """The (cached) grid of an H x W snapshot."""
    return LatLonGrid(height, width)


def cyclone_length_km(grid: LatLonGrid) -> float:
    """The cyclone length scale l: 70 km, or 0.8 cells on grids coarser than ~1/3 degree."""
    return max(70.0, 0.8 * grid.resolution_km)


def river_width_km(grid: LatLonGrid) -> float:
    """The river width scale (Gaussian sigma across the river): 300 km, or 1.5 cells on coarse grids.

    Used by the generator only; the labeller's river criteria are physical (2000 km, aspect 2)."""
    return max(300.0, 1.5 * grid.resolution_km)


def haversine_km(lat1, lon1, lat2, lon2) -> np.ndarray:
    """Great-circle distances in km between points given in degrees (broadcasting)."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dp, dl = p2 - p1, np.radians(np.asarray(lon2) - np.asarray(lon1))
    a = np.sin(dp / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0)))


# ---------------------------------------------------------------------------- labelling
def label_snapshot(data: np.ndarray, thresholds: LabelThresholds = DEFAULT_THRESHOLDS) -> np.ndarray:
    """Labels of one snapshot from its fields.

    Args:
        data: (H, W, 16) fields in the channel order of VARIABLES (any float dtype).
    Returns:
        (H, W) uint8: 0 background, 1 tropical cyclone, 2 atmospheric river (cyclones win).
    """
    data = np.asarray(data)
    if data.ndim != 3 or data.shape[2] != len(VARIABLES) or min(data.shape[:2]) < 3:
        raise ValueError(f"climate data of shape {data.shape}: expected (H, W, {len(VARIABLES)}) with H, W >= 3")
    grid = lat_lon_grid(*data.shape[:2])
    labels = np.zeros(data.shape[:2], dtype=np.uint8)
    labels[river_mask(data, grid, thresholds)] = RIVER
    for cyclone in detect_cyclones(data, grid, thresholds):
        block = labels[np.ix_(cyclone.rows, cyclone.cols)]
        block[cyclone.mask] = CYCLONE
        labels[np.ix_(cyclone.rows, cyclone.cols)] = block
    return labels


@dataclasses.dataclass(frozen=True)
class DetectedCyclone:
    """A cyclone found in the fields: its centre and labelled cells (mask over rows x cols)."""

    lat: float
    lon: float
    depression_pa: float
    warm_core_k: float
    max_wind: float
    rows: np.ndarray  # (h,) row indices of the window
    cols: np.ndarray  # (w,) column indices (wrapped)
    mask: np.ndarray  # (h, w) bool, the labelled cells


def detect_cyclones(data: np.ndarray, grid: LatLonGrid,
                    thresholds: LabelThresholds = DEFAULT_THRESHOLDS) -> list[DetectedCyclone]:
    """Tropical cyclones in the fields, strongest first (module docstring, steps 1-3)."""
    from scipy import ndimage
    t = thresholds
    ell = cyclone_length_km(grid)
    psl = data[..., CHANNEL["PSL"]].astype(np.float64)
    wind = np.hypot(data[..., CHANNEL["UBOT"]], data[..., CHANNEL["VBOT"]]).astype(np.float64)
    box_rows = max(1, math.ceil(t.cyclone_search * ell / grid.dlat_km))
    box_cols = max(1, math.ceil(t.cyclone_search * ell / grid.dlon20_km))
    size = (2 * box_rows + 1, 2 * box_cols + 1)
    is_min = psl == ndimage.minimum_filter(psl, size=size, mode=("nearest", "wrap"))
    windy = ndimage.maximum_filter(wind, size=size, mode=("nearest", "wrap")) >= t.cyclone_wind
    tropical = (np.abs(grid.lat) <= t.cyclone_max_lat)[:, None]
    rows, cols = np.nonzero(is_min & windy & tropical)
    order = np.argsort(psl[rows, cols], kind="stable")
    found: list[DetectedCyclone] = []
    for r, c in zip(rows[order], cols[order]):
        lat, lon = grid.lat[r], grid.lon[c]
        if any(haversine_km(lat, lon, f.lat, f.lon) < t.cyclone_search * ell for f in found):
            continue
        cyclone = _check_cyclone(data, grid, psl, wind, r, c, ell, t)
        if cyclone is not None:
            found.append(cyclone)
    return found


def _check_cyclone(data, grid, psl, wind, r, c, ell, t: LabelThresholds) -> DetectedCyclone | None:
    """Apply the criteria around candidate (r, c); return the cyclone or None."""
    lat, lon = grid.lat[r], grid.lon[c]
    outer = t.cyclone_ring[1] * ell
    rows = grid.rows_within(lat, outer)
    cols = grid.cols_within(lon, outer, max(abs(grid.lat[rows[0]]), abs(grid.lat[rows[-1]])))
    dist = haversine_km(lat, lon, grid.lat[rows][:, None], grid.lon[cols][None, :])  # (h, w)
    window = np.ix_(rows, cols)
    ring = (dist >= t.cyclone_ring[0] * ell) & (dist <= outer)
    if not ring.any():
        return None
    depression = psl[window][ring].mean() - psl[r, c]
    if depression < t.cyclone_depression_pa:
        return None
    t_mid = 0.5 * (data[..., CHANNEL["T200"]][window] + data[..., CHANNEL["T500"]][window]).astype(np.float64)
    core = dist <= max(t.cyclone_core * ell, grid.dlat_km * 0.5)
    warm = t_mid[core].mean() - t_mid[ring].mean()
    if warm < t.cyclone_warm_core_k:
        return None
    speed = wind[window]
    near = dist <= t.cyclone_wind_radius * ell
    max_wind = speed[near].max()
    if max_wind < t.cyclone_wind:
        return None
    if _mean_cyclonic_wind(data, grid, rows, cols, r, c, near) < t.cyclone_tangential_wind:
        return None
    eye = dist[near][np.argmax(speed[near])]
    mask = (dist <= t.cyclone_label_radius * ell) & ((speed >= t.cyclone_wind) | (dist <= eye))
    return DetectedCyclone(lat=float(lat), lon=float(lon), depression_pa=float(depression),
                           warm_core_k=float(warm), max_wind=float(max_wind), rows=rows, cols=cols, mask=mask)


def _mean_cyclonic_wind(data, grid, rows, cols, r, c, near) -> float:
    """Mean tangential UBOT/VBOT wind around (r, c) over `near`, positive when cyclonic."""
    window = np.ix_(rows, cols)
    u = data[..., CHANNEL["UBOT"]][window].astype(np.float64)
    v = data[..., CHANNEL["VBOT"]][window].astype(np.float64)
    # local east/north offsets of the cells from the centre (km)
    dlon = (grid.lon[cols] - grid.lon[c] + 180.0) % 360.0 - 180.0
    x = np.radians(dlon)[None, :] * EARTH_RADIUS_KM * grid.coslat[rows][:, None]
    y = np.radians(grid.lat[rows] - grid.lat[r])[:, None] * EARTH_RADIUS_KM * np.ones_like(x)
    radius = np.hypot(x, y)
    use = near & (radius > 0)
    if not use.any():
        return 0.0
    tangential = (u * -y + v * x)[use] / radius[use]  # counter-clockwise component
    return float(np.sign(grid.lat[r]) * tangential.mean()) if grid.lat[r] != 0 else 0.0


def river_mask(data: np.ndarray, grid: LatLonGrid, thresholds: LabelThresholds = DEFAULT_THRESHOLDS) -> np.ndarray:
    """(H, W) bool: the cells of atmospheric rivers (module docstring)."""
    t = thresholds
    tmq = data[..., CHANNEL["TMQ"]].astype(np.float64)
    u850 = data[..., CHANNEL["U850"]].astype(np.float64)
    v850 = data[..., CHANNEL["V850"]].astype(np.float64)
    ivt = tmq * np.hypot(u850, v850)
    candidate = (ivt >= t.river_ivt) & (tmq >= t.river_tmq) & (np.abs(grid.lat) >= t.river_min_lat)[:, None]
    components, count = periodic_components(candidate)
    if count == 0:
        return candidate
    poleward = tmq * v850 * np.sign(grid.lat)[:, None]
    keep = np.zeros(count + 1, dtype=bool)
    flat = components.ravel()
    cells = np.flatnonzero(flat)
    order = cells[np.argsort(flat[cells], kind="stable")]
    bounds = np.cumsum(np.bincount(flat[order], minlength=count + 1))
    area = np.broadcast_to(grid.cell_area_km2[:, None], components.shape).ravel()
    min_area = t.river_length_km * grid.dlat_km  # a river at least one cell wide: quick reject
    for label in range(1, count + 1):
        members = order[bounds[label - 1]:bounds[label]]
        comp_area = area[members].sum()
        if comp_area < min_area:
            continue
        keep[label] = _is_river(members, comp_area, grid, poleward.ravel(), t)
    return keep[components]


def _is_river(members: np.ndarray, area_km2: float, grid: LatLonGrid, poleward: np.ndarray,
              t: LabelThresholds) -> bool:
    rows = members // grid.width
    if np.abs(grid.lat[rows]).min() > t.river_reach_lat:
        return False
    if poleward[members].mean() < t.river_poleward_ivt:
        return False
    length = _diameter_km(grid.unit_vectors.reshape(-1, 3)[members])
    return length >= t.river_length_km and length * length / area_km2 >= t.river_aspect


def _diameter_km(points: np.ndarray) -> float:
    """Approximate largest great-circle distance within a set of unit vectors (double sweep)."""
    a = points[np.argmin(points @ points[0])]
    b = points[np.argmin(points @ a)]
    return float(EARTH_RADIUS_KM * np.arccos(np.clip(a @ b, -1.0, 1.0)))


def periodic_components(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """8-connected components of a (H, W) mask, joined across the longitude seam.

    Returns:
        (H, W) int32 component numbers 1..count (0 outside the mask), and count.
    """
    from scipy import ndimage
    components, count = ndimage.label(mask, structure=np.ones((3, 3), dtype=bool))
    if count == 0:
        return components.astype(np.int32), 0
    parent = np.arange(count + 1)

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first, last = components[:, 0], components[:, -1]
    for shift in (-1, 0, 1):  # 8-neighbours across the seam: same row and the rows above and below
        right = np.roll(last, shift)
        if shift == -1:
            right[-1] = 0
        elif shift == 1:
            right[0] = 0
        for a, b in zip(first[(first > 0) & (right > 0)], right[(first > 0) & (right > 0)]):
            ra, rb = root(int(a)), root(int(b))
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    roots = np.array([root(i) for i in range(count + 1)])
    unique, renumbered = np.unique(roots, return_inverse=True)  # root 0 stays 0
    return renumbered[components].astype(np.int32), len(unique) - 1
