"""cosmo-synth: physics (growth, sigma_8), determinism, HDF5 layout, resume, bad input, identifiability."""
from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np
import pytest

from common.base.errors import BenchError
from data_prep import cosmo_synth, cosmology
from data_prep.__main__ import main
from data_prep.cosmo_identify import least_squares_mae, subcube_dataset
from data_prep.cosmo_synth import REDSHIFTS, SynthSpec


def synth_args(out: Path, universes: int = 2, size: int = 16, **overrides) -> argparse.Namespace:
    values = dict(out=out, universes=universes, size=size, box_size=cosmo_synth.DEFAULT_BOX_SIZE,
                  mean_count=cosmo_synth.DEFAULT_MEAN_COUNT, seed=3, start_index=0, workers=1, prior="real")
    return argparse.Namespace(**{**values, **overrides})


def read_universe(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {key: f[key][()] for key in ("full", "unitPar", "physPar", "seed")}


# ---------------------------------------------------------------------------- physics
def test_growth_factor_flat_lcdm():
    z = np.array([0.0, 0.5, 1.5, 3.0])
    low, high = cosmology.growth_factor(z, 0.25), cosmology.growth_factor(z, 0.35)
    assert low[0] == pytest.approx(1.0) and high[0] == pytest.approx(1.0)
    assert np.all(np.diff(low) < 0) and np.all(np.diff(high) < 0)
    assert np.all(low[1:] > high[1:])  # less matter: structure grew less recently, D(z)/D(0) larger
    np.testing.assert_allclose(cosmology.growth_factor(z, 1.0), 1.0 / (1.0 + z), rtol=1e-6)  # Einstein-de Sitter
    np.testing.assert_allclose(cosmology.growth_factor(z, 0.3), carroll_press_turner(z, 0.3), rtol=0.01)


def carroll_press_turner(z, omega_m):
    """D(z)/D(0) from the Carroll, Press & Turner (1992) fit of the growth suppression g(Omega)."""
    def suppression(om):
        ol = 1.0 - om
        return 2.5 * om / (om ** (4 / 7) - ol + (1 + om / 2) * (1 + ol / 70))

    a = 1.0 / (1.0 + np.asarray(z))
    om_z = omega_m / (omega_m + (1.0 - omega_m) * a ** 3)
    return a * suppression(om_z) / suppression(omega_m)


def test_power_spectrum_is_normalised_to_sigma_8():
    k = np.exp(np.linspace(np.log(1e-5), np.log(1e3), 4096))
    power = cosmology.linear_power(k, 0.3, 0.83, 0.96, 0.7)
    assert cosmology.sigma_tophat(8.0, k, power) == pytest.approx(0.83, rel=1e-6)
    assert cosmology.sigma_tophat(16.0, k, power) < 0.83 < cosmology.sigma_tophat(4.0, k, power)
    assert cosmology.transfer_eh_nowiggle(1e-5, 0.3, 0.7) == pytest.approx(1.0, abs=1e-3)


def test_generated_field_has_the_drawn_sigma_8():
    """The realised linear field, smoothed with an 8 Mpc/h top-hat, has rms sigma_8 (256 Mpc/h box)."""
    size, cell, sigma_8 = 64, 4.0, 0.85
    freq = 2 * np.pi * np.fft.fftfreq(size, d=cell)
    k = np.sqrt(freq[:, None, None] ** 2 + freq[None, :, None] ** 2
                + (2 * np.pi * np.fft.rfftfreq(size, d=cell))[None, None, :] ** 2)
    measured = []
    for seed in range(4):
        field, variance = cosmo_synth.gaussian_field(np.random.default_rng(seed), size, cell,
                                                     (0.3, sigma_8, 0.95, 70.0))
        assert field.dtype == np.float32 and field.shape == (size,) * 3
        assert field.var() == pytest.approx(variance, rel=0.05)
        smoothed = np.fft.irfftn(np.fft.rfftn(field) * cosmology.tophat_window(k * 8.0), s=field.shape,
                                 axes=(0, 1, 2))
        measured.append(smoothed.std())
    assert np.all(np.abs(np.array(measured) / sigma_8 - 1) < 0.06), measured
    assert np.mean(measured) == pytest.approx(sigma_8, rel=0.03)


def test_mean_count_follows_the_matter_per_cell():
    spec = SynthSpec(size=16, seed=5, mean_count=40.0)
    full, info = cosmo_synth.generate_array(spec, 0)
    omega_m, h = info.phys[0], info.phys[3] / 100
    expected = 40.0 * (omega_m / 0.3) * (0.7 / h)
    assert cosmo_synth.mean_count(omega_m, h, 40.0) == pytest.approx(expected)
    # same comoving matter at every redshift; the mean of 1 + delta is 1 up to sampling noise
    np.testing.assert_allclose(full.reshape(-1, 4).mean(axis=0), expected, rtol=0.1)


# ---------------------------------------------------------------------------- determinism
def test_same_seed_same_universe_other_index_other_universe():
    spec = SynthSpec(size=16, seed=11)
    first, info = cosmo_synth.generate_array(spec, 4)
    again, info_again = cosmo_synth.generate_array(spec, 4)
    other, info_other = cosmo_synth.generate_array(spec, 5)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(info.phys, info_again.phys)
    assert info.seed == info_again.seed != info_other.seed
    assert not np.array_equal(first, other) and not np.array_equal(info.phys, info_other.phys)
    assert not np.array_equal(first, cosmo_synth.generate_array(SynthSpec(size=16, seed=12), 4)[0])


def test_output_does_not_depend_on_workers_or_start_index(tmp_path):
    assert cosmo_synth.run(synth_args(tmp_path / "one", universes=3, workers=1)) == 0
    assert cosmo_synth.run(synth_args(tmp_path / "two", universes=3, workers=2)) == 0
    assert cosmo_synth.run(synth_args(tmp_path / "late", universes=1, start_index=2)) == 0
    for index in range(3):
        name = cosmo_synth.file_name(index)
        one, two = read_universe(tmp_path / "one" / name), read_universe(tmp_path / "two" / name)
        for key in one:
            np.testing.assert_array_equal(one[key], two[key])
    np.testing.assert_array_equal(read_universe(tmp_path / "one/universe_000002.h5")["full"],
                                  read_universe(tmp_path / "late/universe_000002.h5")["full"])


# ---------------------------------------------------------------------------- files
def test_hdf5_layout(tmp_path, capsys):
    out = tmp_path / "raw"
    assert main(["cosmo-synth", "--out", str(out), "--universes", "2", "--size", "16", "--seed", "7",
                 "--workers", "1"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["universe_000000.h5", "universe_000001.h5"]
    assert f"-> {out}" in capsys.readouterr().out
    with h5py.File(out / "universe_000001.h5", "r") as f:
        assert f["full"].shape == (16, 16, 16, 4) and f["full"].dtype == np.int16
        assert f["unitPar"].shape == (4,) and f["unitPar"].dtype == np.float32
        assert f["physPar"].shape == (4,) and f["physPar"].dtype == np.float64
        assert f["seed"].shape == () and f["seed"].dtype == np.int64
        unit, phys, full = f["unitPar"][()], f["physPar"][()], f["full"][()]
        assert int(f["seed"][()]) == cosmo_synth.universe_seed(7, 1)
        assert list(f.attrs["redshifts"]) == list(REDSHIFTS)
        assert [str(name) for name in f.attrs["param_names"]] == ["Omega_m", "sigma_8", "n_s", "H_0"]
        assert f.attrs["size"] == 16 and f.attrs["base_seed"] == 7 and f.attrs["index"] == 1
        assert f.attrs["box_size"] == cosmo_synth.DEFAULT_BOX_SIZE and f.attrs["cell_size"] == 32.0
    assert np.all(np.abs(unit) <= 1)
    np.testing.assert_allclose(cosmo_synth.to_unit(phys), unit, rtol=1e-6)
    np.testing.assert_allclose(cosmo_synth.from_unit(unit), phys, rtol=1e-6)
    assert np.all((phys >= cosmo_synth.PARAM_LOW) & (phys <= cosmo_synth.PARAM_HIGH))
    assert full.min() >= 0 and full.mean() > 10  # tens of particles per cell


def test_resume_skips_finished_files_and_removes_stale_temporaries(tmp_path):
    out = tmp_path / "raw"
    assert cosmo_synth.run(synth_args(out, universes=3)) == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    original = read_universe(out / "universe_000001.h5")
    (out / "universe_000001.h5").unlink()
    stale = out / ".universe_000001.h5.tmp-999999999"  # a killed run's half-written file (no such pid)
    stale.write_bytes(b"half written")
    assert cosmo_synth.run(synth_args(out, universes=3)) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(before)
    for name in ("universe_000000.h5", "universe_000002.h5"):
        assert (out / name).stat().st_mtime_ns == before[name]
    again = read_universe(out / "universe_000001.h5")
    for key in original:
        np.testing.assert_array_equal(original[key], again[key])


@pytest.mark.parametrize("change, message", [
    ({"seed": 4}, r"universe_000000\.h5: made with base_seed=3, but this run asks for base_seed=4"),
    ({"size": 8}, r"universe_000000\.h5: made with size=16, but this run asks for size=8"),
    ({"box_size": 100.0}, r"box_size=512\.0, but this run asks for box_size=100\.0"),
])
def test_refuses_to_mix_datasets(tmp_path, change, message):
    out = tmp_path / "raw"
    assert cosmo_synth.run(synth_args(out, universes=1)) == 0
    with pytest.raises(BenchError, match=message):
        cosmo_synth.run(synth_args(out, universes=2, **change))
    assert sorted(p.name for p in out.iterdir()) == ["universe_000000.h5"]


def test_unreadable_universe_file(tmp_path):
    out = tmp_path / "raw"
    out.mkdir()
    (out / "universe_000000.h5").write_bytes(b"not hdf5")
    with pytest.raises(BenchError, match=r"universe_000000\.h5: not a readable HDF5 file"):
        cosmo_synth.run(synth_args(out))


@pytest.mark.parametrize("change, message", [
    ({"size": 0}, r"--size 0: expected an integer >= 2"),
    ({"universes": 0}, r"--universes 0: expected a positive number"),
    ({"box_size": -5.0}, r"--box-size -5\.0: expected a positive box side in Mpc/h"),
    ({"mean_count": 0.0}, r"--mean-count 0\.0: expected a positive"),
    ({"seed": -1}, r"--seed -1: expected a non-negative integer"),
    ({"start_index": -2}, r"--start-index -2: expected a non-negative index"),
    ({"workers": 0}, r"--workers 0: expected a positive number of processes"),
])
def test_bad_arguments(tmp_path, change, message):
    with pytest.raises(BenchError, match=message):
        cosmo_synth.run(synth_args(tmp_path / "raw", **change))
    assert not (tmp_path / "raw").exists()


def test_bad_argument_through_the_command_line(tmp_path, capsys):
    assert main(["cosmo-synth", "--out", str(tmp_path), "--universes", "1", "--size", "-4"]) == 2
    assert "error: --size -4: expected an integer >= 2" in capsys.readouterr().err


# ---------------------------------------------------------------------------- identifiability
def test_each_parameter_is_identifiable_from_one_mini_sample():
    """The mini benchmark's samples: 64^3 universes cut into 32^3 x 4 cubes, from held-out universes.

    Chance (predicting 0 for a uniform target on [-1, 1]) is 0.5. Omega_m (growth ratios between
    channels), sigma_8 (amplitude) and H_0 (mean count ∝ Omega_m / h) come out far better (measured
    here about 0.05, 0.06, 0.06). n_s only shows in the spectral slope across the ~16,000 Fourier
    modes of one 32^3 cube, so cosmic variance bounds it (Fisher: slope to +-0.022, a third of the
    prior's width; Bayes-optimal MAE about 0.27); measured about 0.34, hence its own, looser bound.
    """
    spec = SynthSpec(size=64, seed=2026)
    train_x, train_y = subcube_dataset(spec, range(48), sub=32)
    test_x, test_y = subcube_dataset(spec, range(1000, 1024), sub=32)
    mae = least_squares_mae(train_x, train_y, test_x, test_y)
    chance = np.abs(test_y).mean(axis=0)
    report = dict(zip(cosmo_synth.PARAM_NAMES, np.round(mae, 3)))
    omega_m, sigma_8, n_s, h_0 = mae
    assert omega_m < 0.12 and sigma_8 < 0.12 and h_0 < 0.12, report
    assert np.all(mae[[0, 1, 3]] < 0.3 * chance[[0, 1, 3]]), report
    assert n_s < 0.42 and n_s < 0.85 * chance[2], report


def test_mini_prior_makes_n_s_identifiable_from_one_sample():
    """With the wider mini prior the same statistics pin n_s down too (measured about 0.09 with 256
    training universes; here fewer universes, so a looser bound)."""
    spec = SynthSpec(size=64, seed=2026, prior="mini")
    train_x, train_y = subcube_dataset(spec, range(48), sub=32)
    test_x, test_y = subcube_dataset(spec, range(1000, 1024), sub=32)
    mae = least_squares_mae(train_x, train_y, test_x, test_y)
    report = dict(zip(cosmo_synth.PARAM_NAMES, np.round(mae, 3)))
    assert np.all(mae < 0.2) and mae[2] < 0.4 * np.abs(test_y[:, 2]).mean(), report


def test_mini_prior_is_wider_and_normalised_to_its_own_ranges(tmp_path):
    out = tmp_path / "u"
    cosmo_synth.run(synth_args(out, universes=3, prior="mini"))
    low, high = cosmo_synth.PRIORS["mini"]
    for path in sorted(out.glob("universe_*.h5")):
        data = read_universe(path)
        assert np.all((data["physPar"] >= low) & (data["physPar"] <= high))
        np.testing.assert_allclose(cosmo_synth.from_unit(data["unitPar"], "mini"), data["physPar"], rtol=1e-6)
        with h5py.File(path) as f:
            assert f.attrs["prior"] == "mini"
            np.testing.assert_array_equal(f.attrs["param_low"], low)
    real_low, real_high = cosmo_synth.PRIORS["real"]
    assert all(lo <= rlo and hi >= rhi for lo, hi, rlo, rhi in zip(low, high, real_low, real_high))
    with pytest.raises(BenchError, match="prior"):  # a mini dataset is not extended with real-prior universes
        cosmo_synth.run(synth_args(out, universes=4))
