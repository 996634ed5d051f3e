"""Benchmark: exact single-Gaussian approximants (issue 2).

1. d_in 784, d_hidden 1024, d_out 10, full covariance: wall time and peak memory to fit degree 1,
   degree 2 (materialised coefficient tensors) and degree 3 (factored; evaluated on 1,000 inputs).
2. Against what a user would do otherwise - least squares on samples of explicit monomial features - at
   d_in 64 (degree 2: 2,145 features): the wall time the sampling fit needs to reach the exact FVU
   (within 5%), printed as a ratio. Both are measured side by side in this run.

Run: ``python benchmarks/bench_fit_gaussian.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import resource
import time
import tracemalloc

import numpy as np

from mlpinterp import MLP, Gaussian, fit_polynomial, fvu


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def random_problem(d_in, d_hidden, d_out, seed=0):
    rng = np.random.default_rng(seed)
    net = MLP(rng.standard_normal((d_hidden, d_in)) / np.sqrt(d_in), rng.normal(0, 0.1, d_hidden),
              rng.standard_normal((d_out, d_hidden)) / np.sqrt(d_hidden), np.zeros(d_out), "relu")
    L = rng.standard_normal((d_in, d_in)) / np.sqrt(d_in)
    return net, Gaussian(rng.normal(0, 0.1, d_in), L @ L.T + 0.1 * np.eye(d_in))


def timed(fn, *a, **k):
    tracemalloc.start()
    t0 = time.perf_counter()
    out = fn(*a, **k)
    dt = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return out, dt, peak


def part1() -> None:
    print("== exact fit, d_in 784, d_hidden 1024, d_out 10, full covariance ==")
    net, g = random_problem(784, 1024, 10)
    for degree in (1, 2, 3):
        def fit_and_use(degree=degree):
            p = fit_polynomial(net, g, degree)
            if degree <= 2:
                for k in range(degree + 1):
                    p.coefficients(k)  # materialise
            else:
                p(np.zeros((1000, 784)))  # factored evaluation
            return p

        _, dt, peak = timed(fit_and_use)
        what = "materialised" if degree <= 2 else "factored, + 1000 evaluations"
        print(f"degree {degree} ({what}): {dt:7.3f} s, peak traced memory {peak:7.1f} MiB")
    print(f"process peak RSS so far: {peak_rss_mb():.0f} MiB (target: degree 2 <= 2 s, <= 1 GB)")


def monomials(X, degree):
    """All monomials of degree <= degree (vectorised per degree: what a careful user would write)."""
    cols = [np.ones((len(X), 1)), X]
    prev, prev_idx = X, [(i,) for i in range(X.shape[1])]
    for _ in range(2, degree + 1):
        nxt, idx = [], []
        for col, t in zip(prev.T, prev_idx, strict=True):
            j = np.arange(t[-1], X.shape[1])
            nxt.append(col[:, None] * X[:, j])
            idx += [t + (int(k),) for k in j]
        prev, prev_idx = np.concatenate(nxt, 1), idx
        cols.append(prev)
    return np.concatenate(cols, 1)


def part2() -> None:
    print("\n== exact vs least squares on samples, d_in 64, d_hidden 256, degree 2 ==")
    net, g = random_problem(64, 256, 10, seed=1)
    t0 = time.perf_counter()
    p = fit_polynomial(net, g, 2)
    t_exact = time.perf_counter() - t0
    target = fvu(net, p, g).fvu
    print(f"exact: {t_exact:.4f} s, FVU {target:.5f}")
    rng = np.random.default_rng(0)
    X_eval = g.sample(20_000, rng)
    F_eval, f_eval = monomials(X_eval - g.mean, 2), net(X_eval)
    var = ((f_eval - f_eval.mean(0)) ** 2).sum()
    for n in (5_000, 10_000, 20_000, 40_000, 80_000):
        t0 = time.perf_counter()
        X = g.sample(n, rng)
        beta, *_ = np.linalg.lstsq(monomials(X - g.mean, 2), net(X), rcond=None)
        dt = time.perf_counter() - t0
        f_hat = ((F_eval @ beta - f_eval) ** 2).sum() / var
        print(f"sampling OLS with {n:6d} samples: {dt:7.3f} s, held-out FVU {f_hat:.5f} "
              f"(exact {target:.5f}); exact is {dt / t_exact:,.0f}x faster")
        if f_hat <= 1.05 * target:
            print(f"-> reached the exact FVU within 5% at {n} samples: ratio {dt / t_exact:,.0f}x (target >= 100x)")
            return
    print("-> sampling OLS did not reach the exact FVU within 5% at 80,000 samples")


if __name__ == "__main__":
    part1()
    part2()
