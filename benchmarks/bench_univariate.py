"""Timing of the univariate (and bivariate) Gaussian integrals.

    python benchmarks/bench_univariate.py [--neurons 100000] [--degree 8] [--quad-neurons 200] [--grid 1024]

Times ``hermite_coefficients`` for ``--neurons`` neurons (relu: closed form; gelu_tanh: composite
Gauss-Legendre quadrature) against a naive loop of ``scipy.integrate.quad`` (one call per neuron and
degree) over ``--quad-neurons`` neurons, and prints the per-neuron speed ratio and the largest
deviation between the two on the common neurons (for relu that is the naive loop's own error: QUADPACK
over (-inf, inf) is not told about the kink; the closed form is accurate to ~1e-14). ``--grid d`` also times ``gauss_product_ev`` on a
[d, d] grid of neuron pairs (set 0 to skip). Single-threaded numpy is assumed (OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from scipy import integrate  # noqa: E402

from mlpinterp.gaussian.activations import get_activation  # noqa: E402
from mlpinterp.gaussian.bivariate import gauss_product_ev  # noqa: E402
from mlpinterp.gaussian.univariate import hermite_coefficients  # noqa: E402


def naive_quad(name: str, mu: np.ndarray, sigma: np.ndarray, n: int) -> np.ndarray:
    """c_k by scipy.integrate.quad over z in (-inf, inf), one call per neuron and k (the naive baseline)."""
    f = get_activation(name).fn
    out = np.empty((len(mu), n + 1))
    for i, (m, s) in enumerate(zip(mu, sigma, strict=True)):
        for k in range(n + 1):
            e_k = [0.0] * k + [1.0]

            def integrand(z, m=m, s=s, e_k=e_k):
                he = np.polynomial.hermite_e.hermeval(z, e_k)
                return float(f(np.array(m + s * z))) * he * math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)

            out[i, k] = integrate.quad(integrand, -np.inf, np.inf, limit=200)[0] / math.factorial(k)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--neurons", type=int, default=100_000)
    ap.add_argument("--degree", type=int, default=8)
    ap.add_argument("--quad-neurons", type=int, default=200)
    ap.add_argument("--grid", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    mu = rng.normal(size=args.neurons) * 2.0
    sigma = np.exp(rng.normal(size=args.neurons) * 0.5)
    n = args.degree
    m_small, s_small = mu[: args.quad_neurons], sigma[: args.quad_neurons]

    print(f"hermite_coefficients, n = {n}, {args.neurons} neurons (mu ~ N(0, 4), log sigma ~ N(0, 0.25))")
    for name in ("relu", "gelu_tanh"):
        hermite_coefficients(name, mu[:10], sigma[:10], n)  # warm-up
        t0 = time.perf_counter()
        c = hermite_coefficients(name, mu, sigma, n)
        t_vec = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = naive_quad(name, m_small, s_small, n)
        t_naive = time.perf_counter() - t0
        per_vec = t_vec / args.neurons
        per_naive = t_naive / args.quad_neurons
        dev = np.max(np.abs(c[: args.quad_neurons] - ref))
        print(
            f"  {name:10s} vectorised {t_vec:7.3f} s ({per_vec * 1e6:8.2f} us/neuron) | "
            f"scipy.quad loop {t_naive:6.2f} s for {args.quad_neurons} ({per_naive * 1e6:9.1f} us/neuron) | "
            f"speed-up x{per_naive / per_vec:,.0f} | max |diff| {dev:.1e}"
        )

    if args.grid > 0:
        d, d_in = args.grid, 64
        W = rng.normal(size=(d, d_in)) / math.sqrt(d_in)
        b = rng.normal(size=d) * 0.5
        C = W @ W.T
        s = np.sqrt(np.diag(C))
        R = np.clip(C / np.outer(s, s), -1.0, 1.0)
        print(f"gauss_product_ev on a [{d}, {d}] grid (random W [d, {d_in}], max off-diagonal |rho| = "
              f"{np.max(np.abs(R - np.diag(np.diag(R)))):.2f})")
        for name in ("relu", "gelu", "gelu_tanh"):
            gauss_product_ev(name, 0.0, 1.0, 0.0, 1.0, 0.5)  # warm-up (imports)
            t0 = time.perf_counter()
            G, err = gauss_product_ev(name, b[:, None], s[:, None], b[None, :], s[None, :], R, return_error=True)
            dt = time.perf_counter() - t0
            rel = np.max(err / np.sqrt(np.outer(np.diag(G), np.diag(G))))
            print(f"  {name:10s} {dt:6.2f} s   max error estimate / sqrt(E phi_i^2 E phi_j^2) = {rel:.1e}")


if __name__ == "__main__":
    main()
