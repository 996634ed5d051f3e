"""Exact ridge-family normal equations under a Gaussian mixture at MiniLM scale, against sampled normal equations.

Problem: a random gelu MLP with d_in 384, d_hidden 1536, d_out 384 (all-MiniLM-L6-v2's FFN shape) and a random
8-component mixture (full covariances, Dirichlet weights, spread means); the ridge basis is the block's closed form
under the pooled Gaussian. For degrees 2 and 3:

1. ``mixture_normal_equations`` (exact): wall time, CPU time, peak traced memory (tracemalloc) and peak RSS.
2. ``projection.normal_equations`` on N0 mixture samples (what a user would otherwise compute): time per sample and
   the normwise relative standard error of its M and C, ``||SE||_F / ||exact||_F`` (per-entry SEs from the sums of
   squares). SE scales as N^-1/2, so the samples needed to match the exact route's accuracy (REL_EXACT = 1e-10
   relative, the accuracy of the univariate Gaussian integrals; the tests find 1e-15 against the closed form) are
   ``N0 (SE(N0) / REL_EXACT)^2``; the ratio printed is the sampling time at that N over the exact time. The same
   for a loose target of 1e-3 (three digits) shows that even then sampling is slower.

Usage: python benchmarks/bench_ffn_mixture_moments.py [--threads 1] [--samples 20000] [--degrees 2 3] [--quick]
(``--quick``: d_in 96, d_hidden 384, for a smoke run; ``--network glu``: a SwiGLU block of the same widths).
About 5 minutes at full size on one idle core (most of it the sampled route).
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import tracemalloc

REL_EXACT = 1e-10
REL_LOOSE = 1e-3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--samples", type=int, default=20_000, help="N0, samples of the sampled route")
    ap.add_argument("--degrees", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--network", choices=["mlp", "glu"], default="mlp",
                    help="mlp: gelu MLP (MiniLM); glu: SwiGLU (silu gate) of the same widths")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))
    import numpy as np

    from mlpinterp import GLU, MLP, GaussianMixture, fit_polynomial
    from mlpinterp.poly.mixture.readout_moments import mixture_normal_equations
    from mlpinterp.poly.projection import normal_equations, solve_projection
    from mlpinterp.poly.readout import RidgeBasis

    d, h, K = (96, 384, 8) if args.quick else (384, 1536, 8)
    rng = np.random.default_rng(0)
    if args.network == "mlp":
        net = MLP(rng.standard_normal((h, d)) * 1.5 / np.sqrt(d), rng.normal(0, 0.5, h),
                  rng.standard_normal((d, h)) / np.sqrt(h), rng.normal(0, 0.1, d), "gelu")
    else:
        net = GLU(rng.standard_normal((h, d)) * 1.5 / np.sqrt(d), rng.normal(0, 0.5, h),
                  rng.standard_normal((h, d)) / np.sqrt(d), rng.normal(0, 0.5, h),
                  rng.standard_normal((d, h)) / np.sqrt(h), rng.normal(0, 0.1, d), "silu")
    covs = []
    for _ in range(K):
        B = rng.standard_normal((d, d)) * rng.uniform(0.3, 1.0, d) / np.sqrt(d)
        covs.append(B @ B.T + 0.01 * np.eye(d))
    mix = GaussianMixture(rng.dirichlet(np.full(K, 2.0)), rng.normal(0, 0.5, (K, d)), np.stack(covs))
    pooled = mix.pooled()
    name = "gelu MLP" if args.network == "mlp" else "SwiGLU"
    print(f"problem: {name} d_in {d}, d_hidden {h}, d_out {d}; mixture K = {K}; threads {args.threads}; "
          f"load before: {os.getloadavg()[0]:.2f}")

    for n in args.degrees:
        basis = RidgeBasis.from_closed_form(fit_polynomial(net, pooled, n), pooled)
        p = basis.n_features(n)
        tracemalloc.start()
        t0, c0 = time.perf_counter(), time.process_time()
        neq = mixture_normal_equations(net, basis, mix, n)
        t_exact, c_exact = time.perf_counter() - t0, time.process_time() - c0
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        _, info = solve_projection(neq, basis)
        print(f"\n== degree {n}: {p} features ==")
        print(f"exact: {t_exact:.1f} s wall, {c_exact:.1f} s CPU, peak traced memory {peak:.0f} MiB, "
              f"peak RSS so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB, "
              f"FVU under the mixture {info['fvu']:.5f}; load {os.getloadavg()[0]:.2f}")

        N0 = max(args.samples, p + 1)
        X = mix.sample(N0, np.random.default_rng(1))
        t0, c0 = time.perf_counter(), time.process_time()
        neq_s = normal_equations(net, basis, X, n)
        t_samp, c_samp = time.perf_counter() - t0, time.process_time() - c0
        # per-entry standard errors from sums of squares (not timed)
        M2 = np.zeros((p, p))
        C2 = np.zeros((p, d))
        for s in range(0, N0, 4096):
            Phi = basis.features(X[s:s + 4096], n) ** 2
            M2 += Phi.T @ Phi
            C2 += Phi.T @ net(X[s:s + 4096]) ** 2
        se_M = np.sqrt(np.maximum(M2 / N0 - (neq_s.M / N0) ** 2, 0.0) / N0)
        se_C = np.sqrt(np.maximum(C2 / N0 - (neq_s.C / N0) ** 2, 0.0) / N0)
        rel = {"M": float(np.linalg.norm(se_M) / np.linalg.norm(neq.M)),
               "C": float(np.linalg.norm(se_C) / np.linalg.norm(neq.C))}
        err = {"M": float(np.linalg.norm(neq_s.M / N0 - neq.M) / np.linalg.norm(neq.M)),
               "C": float(np.linalg.norm(neq_s.C / N0 - neq.C) / np.linalg.norm(neq.C))}
        per = t_samp / N0
        worst = max(rel.values())
        per_cpu = c_samp / N0
        print(f"sampled, N0 = {N0}: {t_samp:.1f} s wall, {c_samp:.1f} s CPU ({per * 1e3:.2f} ms/sample); normwise relative SE "
              f"M {rel['M']:.2e}, C {rel['C']:.2e} (actual distance to exact: M {err['M']:.2e}, C {err['C']:.2e}); "
              f"load {os.getloadavg()[0]:.2f}")
        for target in (REL_EXACT, REL_LOOSE):
            N = N0 * (worst / target) ** 2
            t = N * per
            print(f"  normal equations to relative SE {target:g}: N = {N:.2e} samples, {t:.3g} s sampled "
                  f"= {t / t_exact:.3g} x the exact route (CPU time: {N * per_cpu / c_exact:.3g} x)")
        # the result's accuracy: exact mixture FVU of the sample-fitted read-out minus the optimum (decays as 1/N)
        ro_s, _ = solve_projection(neq_s, basis)
        B = ro_s.coefficients_matrix()
        sst = neq.yy - float(neq.y1 @ neq.y1)
        fvu_s = (neq.yy - 2.0 * float((B * neq.C).sum()) + float((B * (neq.M @ B)).sum())) / sst
        excess = fvu_s - info["fvu"]
        N = N0 * excess / (REL_LOOSE * info["fvu"])
        print(f"  sample-fitted read-out: FVU under the mixture {fvu_s:.5f} (optimum {info['fvu']:.5f}, excess "
              f"{excess:.2e}); excess <= {REL_LOOSE:g} x optimum needs N ~ {N:.2e} samples (excess ~ 1/N), "
              f"{N * per:.3g} s = {N * per / t_exact:.3g} x the exact route (CPU time: {N * per_cpu / c_exact:.3g} x)")


if __name__ == "__main__":
    main()
