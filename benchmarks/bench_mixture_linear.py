"""Exact linear approximant under the 10-class MNIST Gaussian mixture (d = 784, K = 10): wall time (target <= 1 s).

Law of total covariance (Rigg & Belrose 2025, §3.4) with arbitrary weights, for a ReLU MLP and a SwiGLU of
d_hidden = 256. The mixture is built from the real MNIST train set (not timed). Also checks the result
against a Monte Carlo least-squares fit on 100k mixture samples (max |z| of 20 predictions x 3 outputs, robust SEs).

Usage: python benchmarks/bench_mixture_linear.py [--threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from mlpinterp import GLU, MLP, GaussianMixture, fit_polynomial
    from mlpinterp.data import load_mnist

    data = load_mnist()
    mix = GaussianMixture.from_labels(data.X_train.astype(np.float64), data.y_train)
    rng = np.random.default_rng(0)
    d, h = 784, 256
    nets = {
        "relu MLP": MLP(rng.standard_normal((h, d)) / np.sqrt(d) * 3, rng.normal(0, 0.3, h),
                        rng.standard_normal((10, h)) / np.sqrt(h), np.zeros(10), "relu"),
        "SwiGLU": GLU(rng.standard_normal((h, d)) / np.sqrt(d) * 3, rng.normal(0, 0.3, h),
                      rng.standard_normal((h, d)) / np.sqrt(d) * 3, None,
                      rng.standard_normal((10, h)) / np.sqrt(h), None, "silu"),
    }
    X = mix.sample(100_000, np.random.default_rng(1))
    for name, net in nets.items():
        times, cpu = [], []
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            p = fit_polynomial(net, mix, 1)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        # Monte Carlo check of the result (OLS on [1, x] restricted to the support; robust SE)
        f = net(X)
        U = mix.pooled().support
        F = np.concatenate([np.ones((len(X), 1)), (X - mix.mean) @ U], axis=1)
        beta, *_ = np.linalg.lstsq(F, f, rcond=None)
        resid = f - F @ beta
        bread = np.linalg.inv(F.T @ F)
        Xe = mix.sample(20, np.random.default_rng(2))
        Fe = np.concatenate([np.ones((20, 1)), (Xe - mix.mean) @ U], axis=1)
        z = []
        pe = p(Xe)
        for o in range(3):
            cov = bread @ ((F * resid[:, o : o + 1] ** 2).T @ F) @ bread
            z.append((pe[:, o] - Fe @ beta[:, o]) / np.sqrt(np.einsum("np,pq,nq->n", Fe, cov, Fe)))
        print(f"{name}: linear mixture approximant at d={d}, K={mix.K}: median {np.median(times):.3f}s "
              f"(min {min(times):.3f}s, CPU {np.median(cpu):.3f}s, {args.threads} thread(s), target <= 1 s, ratio {1.0 / np.median(times):.1f}x "
              f"under target); Monte Carlo check max |z| = {np.abs(np.array(z)).max():.2f} (n = {len(X)})")
    print(f"load average {os.getloadavg()} (shared CPU)")


if __name__ == "__main__":
    main()
