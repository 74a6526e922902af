"""deepcam-synth: fields, events, heuristic labels, class frequencies, HDF5 layout, stats, resume, bad input."""
from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np
import pytest

from common.base.errors import BenchError
from data_prep import climate_stats, climate_synth
from data_prep.__main__ import main
from data_prep.climate_labels import (CHANNEL, CLASSES, UNITS, VARIABLES, cyclone_length_km, detect_cyclones,
                                      label_snapshot, lat_lon_grid, periodic_components, river_width_km)
from data_prep.climate_synth import Cyclone, River, SynthSpec

TINY = dict(height=32, width=48)


def synth_args(out: Path, train: int = 3, validation: int = 1, **overrides) -> argparse.Namespace:
    values = dict(out=out, train=train, validation=validation, seed=3, workers=1, **TINY)
    return argparse.Namespace(**{**values, **overrides})


def read_snapshot(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with h5py.File(path, "r") as f:
        return f["climate/data"][()], f["climate/labels_0"][()]


def ocean_point(grid, lat: float) -> tuple[float, float]:
    """An ocean cell near latitude `lat` of the fixed planet."""
    land, _ = climate_synth.orography(grid.height, grid.width)
    row = int(np.argmin(np.abs(grid.lat - lat)))
    col = int(np.flatnonzero(~land[row])[len(np.flatnonzero(~land[row])) // 2])
    return float(grid.lat[row]), float(grid.lon[col])


# ---------------------------------------------------------------------------- fields
def test_variables_are_the_real_datasets_in_order():
    assert VARIABLES == ("TMQ", "U850", "V850", "UBOT", "VBOT", "QREFHT", "PS", "PSL", "T200", "T500", "PRECT",
                         "TS", "TREFHT", "Z1000", "Z200", "ZBOT")
    assert len(UNITS) == 16 and UNITS[CHANNEL["PRECT"]] == "m s-1" and UNITS[CHANNEL["PS"]] == "Pa"
    assert CLASSES == ("background", "tropical_cyclone", "atmospheric_river")


# (channel, lowest allowed, highest allowed): plausible CAM5 values
RANGES = [("TMQ", 0.0, 80.0), ("U850", -70, 70), ("V850", -70, 70), ("UBOT", -60, 60), ("VBOT", -60, 60),
          ("QREFHT", 0.0, 0.03), ("PS", 45_000, 106_000), ("PSL", 93_000, 106_000), ("T200", 190, 250),
          ("T500", 215, 285), ("PRECT", 0.0, 1e-3), ("TS", 200, 320), ("TREFHT", 200, 320), ("Z1000", -600, 500),
          ("Z200", 10_000, 13_000), ("ZBOT", 45, 75)]


def test_fields_are_finite_and_in_physical_ranges():
    spec = SynthSpec(height=64, width=96, seed=1)
    data = np.stack([climate_synth.generate_snapshot(spec, i).data for i in range(6)])
    assert data.dtype == np.float32 and data.shape == (6, 64, 96, 16) and np.isfinite(data).all()
    for name, low, high in RANGES:
        values = data[..., CHANNEL[name]]
        assert low <= values.min() and values.max() <= high, (name, values.min(), values.max())
    assert data[..., CHANNEL["PRECT"]].max() > 1e-6  # somewhere it pours (> 86 mm/day)


def test_climate_has_the_right_latitude_structure():
    spec = SynthSpec(height=64, width=96, seed=1)
    grid = lat_lon_grid(64, 96)
    data = np.stack([climate_synth.generate_snapshot(spec, i).data for i in range(8)])
    zonal = data.mean(axis=(0, 2))  # (H, 16)

    def at(name, lo, hi):  # mean over both hemispheres' |latitude| in [lo, hi]
        rows = (np.abs(grid.lat) >= lo) & (np.abs(grid.lat) <= hi)
        return zonal[rows, CHANNEL[name]].mean()

    assert at("TS", 0, 15) > at("TS", 40, 60) + 10 > at("TS", 75, 90) + 20  # warm tropics, cold poles
    assert at("TMQ", 0, 15) > 2 * at("TMQ", 45, 60) > 4 * at("TMQ", 75, 90)  # moist tropics
    assert at("U850", 35, 55) > 4 and at("U850", 8, 20) < -2  # westerlies, easterly trades
    assert at("PSL", 25, 35) > at("PSL", 55, 65) + 800  # subtropical highs, subpolar lows: geostrophic
    assert at("Z200", 0, 15) > at("Z200", 70, 90) + 600  # warm columns are thick
    assert at("T500", 0, 15) > at("T500", 70, 90) + 15


def test_random_fields_have_unit_variance_and_no_seam():
    grid = lat_lon_grid(64, 96)
    fields = climate_synth.random_fields(np.random.default_rng(0), grid, (700.0, 300.0))
    assert fields.shape == (2, 64, 96) and fields.dtype == np.float32
    mid = np.abs(grid.lat) < 60
    assert 0.75 < fields[:, mid].std() < 1.25
    seam = np.abs(fields[..., 0] - fields[..., -1]).mean()
    inside = np.abs(np.diff(fields, axis=-1)).mean()
    assert seam < 1.5 * inside  # periodic in longitude
    pole = fields[:, 0, :]  # a single point: constant along the row
    assert np.allclose(pole, pole[:, :1], atol=1e-5)


# ---------------------------------------------------------------------------- events and labels
def _calm_atmosphere(grid):
    return climate_synth.background(grid, 0.0, np.random.default_rng(0))


def test_cyclones_are_warm_core_lows_turning_the_right_way():
    grid = lat_lon_grid(96, 144)
    atm = _calm_atmosphere(grid)
    ell = cyclone_length_km(grid)
    centres = [ocean_point(grid, 15.0), ocean_point(grid, -15.0)]
    for lat, lon in centres:
        climate_synth.apply_cyclone(atm, grid, Cyclone(lat, lon, depression_pa=5000.0, rmw_km=ell, holland_b=1.3,
                                                       warm_core=0.1))
    data = climate_synth.derive_channels(atm, grid)
    found = detect_cyclones(data, grid)
    assert len(found) == 2
    labels = label_snapshot(data)
    for (lat, lon), cyclone in zip(centres, sorted(found, key=lambda c: -c.lat)):
        assert abs(cyclone.lat - lat) <= 2 * 180 / 95 and abs((cyclone.lon - lon + 180) % 360 - 180) <= 2 * 2.5
        assert cyclone.depression_pa > 2500 and cyclone.warm_core_k > 2 and cyclone.max_wind > 25
        row, col = int(np.argmin(np.abs(grid.lat - lat))), int(np.argmin(np.abs(grid.lon - lon)))
        assert labels[row, col] == 1
        # circulation of the 850 hPa wind around the centre: counter-clockwise (> 0) in the north
        u, v = data[..., CHANNEL["U850"]], data[..., CHANNEL["V850"]]
        circulation = (u[row - 2, col] - u[row + 2, col]) + (v[row, col + 2] - v[row, col - 2])
        assert np.sign(circulation) == np.sign(lat), (lat, circulation)
        assert data[row, col, CHANNEL["TMQ"]] > data[row + 6, col, CHANNEL["TMQ"]]
        assert data[row, col, CHANNEL["PRECT"]] > 1e-6
    assert 4 <= (labels == 1).sum() / 2 <= 60  # several cells each at 96 x 144


def test_weak_cyclone_stays_below_the_thresholds():
    grid = lat_lon_grid(96, 144)
    atm = _calm_atmosphere(grid)
    lat, lon = ocean_point(grid, 15.0)
    climate_synth.apply_cyclone(atm, grid, Cyclone(lat, lon, 500.0, cyclone_length_km(grid), 1.3, 0.1))
    assert detect_cyclones(climate_synth.derive_channels(atm, grid), grid) == []


def _river(grid, lat, lon, strength):
    lats, lons, headings = climate_synth._river_axis(start=(lat, lon), heading_deg=45.0, turn_deg_per_1000km=-3.0,
                                                      length_km=7000.0, step_km=150.0)
    return River(lats=lats, lons=lons, headings=headings, sigma_km=river_width_km(grid), strength=strength,
                 jet=20.0)


def test_rivers_are_long_moist_filaments_and_weak_ones_are_not_labelled():
    grid = lat_lon_grid(96, 144)
    atm = _calm_atmosphere(grid)
    strong, weak = _river(grid, 20.0, 150.0, 1.0), _river(grid, -20.0, 300.0, 0.15)
    for river in (strong, weak):
        climate_synth.apply_river(atm, grid, river)
    data = climate_synth.derive_channels(atm, grid)
    labels = label_snapshot(data)
    on_axis = [(int(np.argmin(np.abs(grid.lat - a))), int(round(b % 360 / 2.5)) % 144)
               for a, b in zip(strong.lats[5:25:4], strong.lons[5:25:4])]
    assert all(labels[r, c] == 2 for r, c in on_axis), [labels[r, c] for r, c in on_axis]
    assert all(data[r, c, CHANNEL["TMQ"]] > 25 for r, c in on_axis)
    assert (labels[grid.lat < 0] == 2).sum() == 0  # the weak one, and nothing else, in the south
    components, count = periodic_components(labels == 2)
    assert count == 1


def test_cyclone_label_wins_over_river():
    grid = lat_lon_grid(96, 144)
    atm = _calm_atmosphere(grid)
    river = _river(grid, 18.0, 150.0, 1.0)
    climate_synth.apply_river(atm, grid, river)
    lat, lon = float(river.lats[8]), float(river.lons[8])
    climate_synth.apply_cyclone(atm, grid, Cyclone(lat, lon, 6000.0, cyclone_length_km(grid), 1.3, 0.1))
    labels = label_snapshot(climate_synth.derive_channels(atm, grid))
    row, col = int(np.argmin(np.abs(grid.lat - lat))), int(round(lon % 360 / 2.5)) % 144
    assert labels[row, col] == 1
    assert (labels == 2).sum() > 10


def test_components_join_across_the_longitude_seam():
    mask = np.zeros((8, 12), dtype=bool)
    mask[3, :2] = mask[4, -2:] = True  # diagonal neighbours across the seam
    mask[6, 5] = True
    components, count = periodic_components(mask)
    assert count == 2 and components[3, 0] == components[4, -1] != components[6, 5]


def test_class_frequencies_are_like_the_real_data():
    """48 snapshots of 64 x 96; the real data: 98.6% background, 0.05% cyclone, 1.3% river."""
    spec = SynthSpec(height=64, width=96, seed=11)
    counts = sum(np.bincount(climate_synth.generate_snapshot(spec, i).labels.ravel(), minlength=3)
                 for i in range(48))
    background, cyclone, river = counts / counts.sum()
    assert 0.0002 <= cyclone <= 0.002, counts
    assert 0.007 <= river <= 0.025, counts
    assert 0.975 <= background <= 0.993, counts


# ---------------------------------------------------------------------------- determinism
def test_snapshot_depends_only_on_seed_split_index_and_grid():
    spec = SynthSpec(seed=5, **TINY)
    first = climate_synth.generate_snapshot(spec, 2)
    again = climate_synth.generate_snapshot(spec, 2)
    np.testing.assert_array_equal(first.data, again.data)
    np.testing.assert_array_equal(first.labels, again.labels)
    assert first.seed == again.seed
    for other in (climate_synth.generate_snapshot(spec, 3), climate_synth.generate_snapshot(spec, 2, "validation"),
                  climate_synth.generate_snapshot(SynthSpec(seed=6, **TINY), 2)):
        assert other.seed != first.seed and not np.array_equal(other.data, first.data)


def test_output_does_not_depend_on_workers(tmp_path):
    assert climate_synth.run(synth_args(tmp_path / "one", workers=1)) == 0
    assert climate_synth.run(synth_args(tmp_path / "two", workers=2)) == 0
    for split, index in (("train", 0), ("train", 2), ("validation", 0)):
        one = read_snapshot(tmp_path / "one" / split / climate_synth.file_name(index))
        two = read_snapshot(tmp_path / "two" / split / climate_synth.file_name(index))
        for a, b in zip(one, two):
            np.testing.assert_array_equal(a, b)
    one, two = (climate_stats.read_stats(tmp_path / d / "stats.h5") for d in ("one", "two"))
    np.testing.assert_array_equal(one.mean, two.mean)
    np.testing.assert_array_equal(one.sqmean, two.sqmean)


# ---------------------------------------------------------------------------- files
def test_hdf5_layout(tmp_path, capsys):
    out = tmp_path / "deepcam"
    assert main(["deepcam-synth", "--out", str(out), "--train", "2", "--validation", "1", "--height", "32",
                 "--width", "48", "--seed", "7", "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    assert f"-> {out}" in printed and "classes over 2 training snapshots: background" in printed
    assert sorted(p.name for p in out.iterdir()) == ["stats.h5", "train", "validation"]
    assert sorted(p.name for p in (out / "train").iterdir()) == ["data-000000.h5", "data-000001.h5"]
    assert sorted(p.name for p in (out / "validation").iterdir()) == ["data-000000.h5"]
    with h5py.File(out / "train/data-000001.h5", "r") as f:
        data, labels = f["climate/data"], f["climate/labels_0"]
        assert data.shape == (32, 48, 16) and data.dtype == np.float32
        assert labels.shape == (32, 48) and labels.dtype == np.float32
        assert set(np.unique(labels[()])) <= {0.0, 1.0, 2.0}
        assert [str(v) for v in data.attrs["variables"]] == list(VARIABLES)
        assert [str(u) for u in data.attrs["units"]] == list(UNITS)
        assert f.attrs["base_seed"] == 7 and f.attrs["index"] == 1 and f.attrs["split"] == "train"
        assert f.attrs["height"] == 32 and f.attrs["width"] == 48
        assert f.attrs["generator"] == climate_synth.GENERATOR_VERSION
        assert int(f.attrs["seed"]) == climate_synth.snapshot_seed(7, "train", 1)
    with h5py.File(out / "stats.h5", "r") as f:
        for name in ("count", "mean", "sqmean", "minval", "maxval"):
            assert f[f"climate/{name}"].shape == (16,) and f[f"climate/{name}"].dtype == np.float64
        assert f["climate/label_counts"].shape == (3,)


def test_labels_are_the_heuristic_applied_to_the_stored_fields(tmp_path):
    out = tmp_path / "d"
    assert climate_synth.run(synth_args(out, train=2, validation=0, height=64, width=96)) == 0
    for path in sorted((out / "train").glob("data-*.h5")):
        data, labels = read_snapshot(path)
        np.testing.assert_array_equal(label_snapshot(data), labels.astype(np.uint8))


def test_stats_are_exact_over_the_training_files(tmp_path):
    out = tmp_path / "d"
    assert climate_synth.run(synth_args(out, train=4, validation=2)) == 0
    stats = climate_stats.read_stats(out / "stats.h5")
    snapshots = [read_snapshot(out / "train" / climate_synth.file_name(i)) for i in range(4)]
    data = np.concatenate([d.reshape(-1, 16) for d, _ in snapshots]).astype(np.float64)
    np.testing.assert_array_equal(stats.count, np.full(16, data.shape[0], dtype=np.float64))
    np.testing.assert_allclose(stats.mean, data.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.sqmean, (data ** 2).mean(axis=0), rtol=1e-12)
    np.testing.assert_array_equal(stats.minval, data.min(axis=0))
    np.testing.assert_array_equal(stats.maxval, data.max(axis=0))
    labels = np.concatenate([lab.ravel() for _, lab in snapshots]).astype(np.int64)
    np.testing.assert_array_equal(stats.class_counts, np.bincount(labels, minlength=3))
    assert stats.files == 4


def test_stats_command_accepts_any_numeric_labels_and_rejects_bad_ones(tmp_path, capsys):
    directory = tmp_path / "real" / "train"
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, dtype in enumerate((np.float64, np.int32)):
        with h5py.File(directory / f"data-2106-0{i}.h5", "w") as f:
            f["climate/data"] = rng.normal(size=(8, 12, 16)).astype(np.float32)
            f["climate/labels_0"] = rng.integers(0, 3, size=(8, 12)).astype(dtype)
    assert main(["deepcam-stats", "--data", str(directory)]) == 0
    assert "deepcam-stats: 2 files" in capsys.readouterr().out
    stats = climate_stats.read_stats(tmp_path / "real" / "stats.h5")
    assert stats.class_counts.sum() == 2 * 8 * 12
    with h5py.File(directory / "data-2106-09.h5", "w") as f:
        f["climate/data"] = np.zeros((8, 12, 16), np.float32)
        f["climate/labels_0"] = np.full((8, 12), 3.0)
    assert main(["deepcam-stats", "--data", str(directory)]) == 2
    err = " ".join(capsys.readouterr().err.split())  # the message is wrapped
    assert "climate/labels_0 holds 3.0 (96 cells), expected only the classes 0, 1, 2" in err


def test_resume_skips_finished_files_and_removes_stale_temporaries(tmp_path):
    out = tmp_path / "d"
    assert climate_synth.run(synth_args(out)) == 0
    names = lambda: sorted(str(p.relative_to(out)) for p in out.rglob("*"))  # noqa: E731
    before = {p: p.stat().st_mtime_ns for p in out.rglob("data-*.h5")}
    stats_before = climate_stats.read_stats(out / "stats.h5")
    listing = names()
    victim = out / "train" / "data-000001.h5"
    original = read_snapshot(victim)
    victim.unlink()
    (out / "train" / ".data-000001.h5.tmp-999999999").write_bytes(b"half written")  # a killed run's file
    assert climate_synth.run(synth_args(out)) == 0
    assert names() == listing
    for path, mtime in before.items():
        if path != victim:
            assert path.stat().st_mtime_ns == mtime
    for a, b in zip(original, read_snapshot(victim)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(climate_stats.read_stats(out / "stats.h5").mean, stats_before.mean)


@pytest.mark.parametrize("change, message", [
    ({"seed": 4}, r"data-000000\.h5: made with base_seed=3, but this run asks for base_seed=4"),
    ({"height": 40, "width": 60}, r"made with height=32, width=48, but this run asks for height=40, width=60"),
])
def test_refuses_to_mix_datasets(tmp_path, change, message):
    out = tmp_path / "d"
    assert climate_synth.run(synth_args(out, train=1, validation=0)) == 0
    with pytest.raises(BenchError, match=message):
        climate_synth.run(synth_args(out, train=2, validation=0, **change))
    assert sorted(p.name for p in (out / "train").iterdir()) == ["data-000000.h5"]


def test_refuses_files_beyond_the_requested_count(tmp_path):
    out = tmp_path / "d"
    assert climate_synth.run(synth_args(out, train=3, validation=0)) == 0
    with pytest.raises(BenchError, match=r"data-000002\.h5: snapshot 2 is beyond the 2 requested for train/"):
        climate_synth.run(synth_args(out, train=2, validation=0))


def test_unreadable_snapshot_file(tmp_path):
    out = tmp_path / "d"
    (out / "train").mkdir(parents=True)
    (out / "train" / "data-000000.h5").write_bytes(b"not hdf5")
    with pytest.raises(BenchError, match=r"data-000000\.h5: not a readable HDF5 file"):
        climate_synth.run(synth_args(out))


@pytest.mark.parametrize("change, message", [
    ({"height": 0}, r"--height 0: expected at least 32 latitude rows"),
    ({"height": 16, "width": 24}, r"--height 16: expected at least 32 latitude rows \(smaller grids cannot hold"),
    ({"width": -48}, r"--width -48: expected at least 48 longitude columns"),
    ({"height": 64, "width": 400}, r"--width 400 with --height 64: expected a width between 1 and 3 times"),
    ({"train": 0}, r"--train 0: expected a positive number of training snapshots"),
    ({"validation": -1}, r"--validation -1: expected a non-negative number"),
    ({"workers": 0}, r"--workers 0: expected a positive number of processes"),
    ({"seed": -1}, r"--seed -1: expected a non-negative integer"),
])
def test_bad_arguments(tmp_path, change, message):
    with pytest.raises(BenchError, match=message):
        climate_synth.run(synth_args(tmp_path / "d", **change))
    assert not (tmp_path / "d").exists()


def test_out_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(BenchError, match=r"--out .*f: exists and is not a directory"):
        climate_synth.run(synth_args(tmp_path / "f"))


def test_bad_argument_through_the_command_line(tmp_path, capsys):
    assert main(["deepcam-synth", "--out", str(tmp_path / "d"), "--train", "2", "--validation", "1",
                 "--height", "20", "--width", "30"]) == 2
    assert "error: --height 20: expected at least 32 latitude rows" in capsys.readouterr().err
