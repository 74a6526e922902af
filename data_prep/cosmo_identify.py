"""Simple statistics of CosmoFlow sub-cubes and a least-squares probe of what they reveal.

Used by the identifiability test and benchmark: if ordinary least squares on a few dozen
statistics of one sample recovers a parameter well, a CNN can learn it from that sample.
"""
from __future__ import annotations

import numpy as np

from data_prep import cosmo_synth
from data_prep.cosmo_synth import SynthSpec


def subcube_statistics(cube: np.ndarray, bins: int = 4) -> np.ndarray:
    """Simple statistics of one (s, s, s, 4) count cube, the kind a CNN can compute.

    Per channel: log mean count, mean and log variance of log(1 + counts); log covariances of
    channels 0-2 with channel 3 (growth ratios, free of independent shot noise); log power
    spectrum of log(1 + counts) at z = 3 and its cross spectrum with z = 0, in `bins` log-k bins.
    """
    s = cube.shape[0]
    logs = np.log1p(cube.astype(np.float64))  # (s, s, s, 4)
    flat = logs.reshape(-1, 4)
    centred = flat - flat.mean(axis=0)
    cov = centred.T @ centred / len(flat)  # (4, 4)
    modes = np.fft.rfftn(logs - flat.mean(axis=0), axes=(0, 1, 2))  # (s, s, s//2+1, 4)
    freq = np.fft.fftfreq(s)
    k = np.sqrt(freq[:, None, None] ** 2 + freq[None, :, None] ** 2 + np.fft.rfftfreq(s)[None, None, :] ** 2)
    which = np.digitize(k, np.geomspace(1.0 / s, np.sqrt(3) / 2 + 1e-9, bins + 1)) - 1  # k = 0 -> -1
    spectra = []
    for a, b in ((3, 3), (0, 3)):
        cross = (modes[..., a] * np.conj(modes[..., b])).real
        spectra += [np.log(abs(cross[which == i].mean())) for i in range(bins)]
    return np.concatenate([np.log(cube.reshape(-1, 4).mean(axis=0)), flat.mean(axis=0),
                           np.log(np.diag(cov)), np.log(np.abs(cov[3, :3])), spectra])


def subcube_dataset(spec: SynthSpec, indices, sub: int) -> tuple[np.ndarray, np.ndarray]:
    """Statistics (M, F) of every sub^3 sub-cube of the universes, and their unitPar (M, 4)."""
    features, targets = [], []
    for index in indices:
        full, info = cosmo_synth.generate_array(spec, index)
        for i in range(0, spec.size, sub):
            for j in range(0, spec.size, sub):
                for k in range(0, spec.size, sub):
                    features.append(subcube_statistics(full[i:i + sub, j:j + sub, k:k + sub]))
                    targets.append(info.unit)
    return np.array(features), np.array(targets)


def least_squares_mae(train_x, train_y, test_x, test_y) -> np.ndarray:
    """Held-out MAE (4,) of an ordinary least-squares fit from standardised statistics to unitPar."""
    mean, std = train_x.mean(axis=0), train_x.std(axis=0) + 1e-12

    def design(x):
        return np.hstack([np.ones((len(x), 1)), (x - mean) / std])

    weights, *_ = np.linalg.lstsq(design(train_x), train_y, rcond=None)
    prediction = np.clip(design(test_x) @ weights, -1, 1)
    return np.abs(prediction - test_y).mean(axis=0)
