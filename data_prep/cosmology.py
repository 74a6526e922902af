"""Linear-theory cosmology for the synthetic universes: P(k), T(k), sigma_8 and D(z).

Flat LCDM without radiation. Lengths are comoving Mpc/h, wavenumbers h/Mpc and power spectra
(Mpc/h)^3, the conventions of N-body initial-condition codes. Only numpy is used.

- Transfer function: Eisenstein & Hu (1998, ApJ 496, 605) "no-wiggle" fit, eqs. 26-31, with a
  fixed physical baryon density `OMEGA_B_H2` (BBN) and CMB temperature `T_CMB`. Its shape depends
  on Omega_m h (the turnover) and on the baryon fraction Omega_b / Omega_m.
- Primordial spectrum: A k^n_s, with A fixed by sigma_8, the rms of the linear density contrast
  at z = 0 in a top-hat sphere of radius 8 Mpc/h.
- Growth: the growing mode of flat LCDM, D(a) ∝ E(a) ∫_0^a da' / (a' E(a'))^3 (exact without
  radiation), normalised to D(z=0) = 1.
"""
from __future__ import annotations

import numpy as np

OMEGA_B_H2 = 0.02237  # physical baryon density (Planck 2018), held fixed across universes
T_CMB = 2.7255  # K
SIGMA_8_RADIUS = 8.0  # Mpc/h


def transfer_eh_nowiggle(k, omega_m: float, h: float) -> np.ndarray:
    """Eisenstein-Hu no-wiggle transfer function T(k), with T -> 1 as k -> 0.

    Args:
        k: wavenumbers in h/Mpc, any shape.
        omega_m: total matter density Omega_m (cold dark matter + baryons).
        h: H_0 / (100 km/s/Mpc).
    Returns:
        T(k), float64, the shape of `k`.
    """
    k = np.asarray(k, dtype=np.float64)
    om_h2 = omega_m * h * h
    f_b = OMEGA_B_H2 / om_h2
    theta2 = (T_CMB / 2.7) ** 2
    s = 44.5 * np.log(9.83 / om_h2) / np.sqrt(1.0 + 10.0 * OMEGA_B_H2 ** 0.75)  # sound horizon, Mpc
    alpha = 1.0 - 0.328 * np.log(431.0 * om_h2) * f_b + 0.38 * np.log(22.3 * om_h2) * f_b ** 2
    k_mpc = k * h  # the fit's suppression scale is in 1/Mpc
    gamma_eff = omega_m * h * (alpha + (1.0 - alpha) / (1.0 + (0.43 * k_mpc * s) ** 4))
    q = k * theta2 / gamma_eff
    l0 = np.log(2.0 * np.e + 1.8 * q)
    c0 = 14.2 + 731.0 / (1.0 + 62.5 * q)
    return l0 / (l0 + c0 * q * q)


def tophat_window(x) -> np.ndarray:
    """Fourier transform of a unit top-hat sphere, W(x) = 3 (sin x - x cos x) / x^3, x = k R."""
    x = np.asarray(x, dtype=np.float64)
    small = x < 1e-3
    xs = np.where(small, 1.0, x)  # avoids 0/0; the series below covers small x
    exact = 3.0 * (np.sin(xs) - xs * np.cos(xs)) / xs ** 3
    return np.where(small, 1.0 - x * x / 10.0, exact)


def sigma_tophat(radius: float, k, power) -> float:
    """rms linear density contrast in a top-hat sphere: sigma^2 = ∫ k^3 P(k) W(kR)^2 dln k / 2 pi^2.

    Args:
        radius: sphere radius in Mpc/h.
        k: (M,) wavenumbers in h/Mpc, uniformly spaced in ln k and covering the spectrum.
        power: (M,) P(k) in (Mpc/h)^3.
    """
    integrand = k ** 3 * power * tophat_window(k * radius) ** 2
    return float(np.sqrt(np.trapezoid(integrand, np.log(k)) / (2.0 * np.pi ** 2)))


def linear_power(k, omega_m: float, sigma_8: float, n_s: float, h: float) -> np.ndarray:
    """Linear matter power spectrum at z = 0, P(k) = A k^n_s T(k)^2 with A set by sigma_8.

    Args:
        k: wavenumbers in h/Mpc, any shape.
    Returns:
        P(k) in (Mpc/h)^3, float64, the shape of `k`.
    """
    k_table = np.exp(np.linspace(np.log(1e-5), np.log(1e3), 4096))  # h/Mpc, for the sigma_8 integral
    shape = k_table ** n_s * transfer_eh_nowiggle(k_table, omega_m, h) ** 2
    amplitude = (sigma_8 / sigma_tophat(SIGMA_8_RADIUS, k_table, shape)) ** 2
    k = np.asarray(k, dtype=np.float64)
    return amplitude * k ** n_s * transfer_eh_nowiggle(k, omega_m, h) ** 2


def _growth_unnormalised(a: float, omega_m: float, steps: int = 4096) -> float:
    """D(a) ∝ (5/2) Omega_m E(a) ∫_0^a da' / (a' E(a'))^3, equal to a while matter dominates."""
    omega_l = 1.0 - omega_m
    x = np.linspace(0.0, a, steps + 1)
    # 1 / (a E(a))^3 = a^1.5 / (Omega_m + Omega_L a^3)^1.5, finite at a = 0
    integral = np.trapezoid(x ** 1.5 / (omega_m + omega_l * x ** 3) ** 1.5, x)
    e_of_a = np.sqrt(omega_m / a ** 3 + omega_l)
    return 2.5 * omega_m * e_of_a * integral


def growth_factor(z, omega_m: float) -> np.ndarray:
    """Linear growth factor of flat LCDM normalised to D(z=0) = 1.

    Args:
        z: redshifts >= 0, any shape.
        omega_m: matter density today (Omega_Lambda = 1 - Omega_m).
    Returns:
        D(z) / D(0), float64, the shape of `z`.
    """
    z = np.asarray(z, dtype=np.float64)
    d0 = _growth_unnormalised(1.0, omega_m)
    values = [_growth_unnormalised(1.0 / (1.0 + zi), omega_m) / d0 for zi in z.ravel()]
    return np.asarray(values, dtype=np.float64).reshape(z.shape)
