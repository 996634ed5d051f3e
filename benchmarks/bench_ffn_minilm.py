"""Benchmark: exact approximants of all 6 FFN blocks of the pretrained all-MiniLM-L6-v2 on real tokens (issue 14).

1. Capture the inputs of all 6 blocks from the bundled text in one forward pass per batch (>= 100k fit tokens):
   tokens/s.
2. Under one Gaussian (empirical covariance of all fit tokens), degrees 1-3 for every block: the closed form, its
   exact FVU under the Gaussian, and the FVU on the held-out tokens. Wall time of capture + fit + evaluate (goal:
   <= 5 minutes on the 2-core CPU) and peak RSS.
3. Beside it, on block 0: the exact data projection (degrees 1-3 from one pass), the exact mixture projection
   (K = 8) and the hybrid fine-tune (the paper's remedy), each timed.
4. Ratios against what a user would otherwise run, side by side in this run:
   * the exact Gaussian FVU against a Monte Carlo estimate with a standard error of 1e-3;
   * the data projection (normal equations, Cholesky) against scikit-learn ``Ridge`` (the same tiny ridge) and
     ``numpy.linalg.lstsq`` on the same degree-2 features of the same tokens (equal answers checked).

Run: ``python benchmarks/bench_ffn_minilm.py [--tokens 120000] [--threads 2] [--skip-extras]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np
import torch


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=125_000, help="content tokens read (fit + held-out)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-extras", action="store_true", help="only parts 1-2")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import mlpinterp as mi
    from mlpinterp.hf import ffn_paths, ffn_site
    from mlpinterp.lm.capture import capture_ffn_inputs
    from mlpinterp.lm.capture_config import CaptureConfig
    from mlpinterp.lm.input_models import fit_gaussian
    from mlpinterp.lm.models import load_model
    from mlpinterp.poly.metrics import fvu_from_outputs

    print(f"load average before: {os.getloadavg()[0]:.2f}; threads {args.threads}")
    model, tok = load_model("minilm")
    paths = ffn_paths(model)
    sites = {p: ffn_site(model, p) for p in paths}
    t0 = time.perf_counter()
    cap = capture_ffn_inputs(model, tok, {p: s.input_module for p, s in sites.items()},
                             CaptureConfig(max_tokens=args.tokens, keep_fit=100_000), quiet=True)
    t_cap = time.perf_counter() - t0
    print(f"capture: {cap.n_fit_tokens:,} fit + {cap.n_heldout_tokens:,} held-out tokens x 6 blocks in {t_cap:.1f} s "
          f"({cap.tokens_per_s:,.0f} tokens/s of forward passes)")
    t0 = time.perf_counter()
    rows = []
    for p, s in sites.items():
        b = cap.blocks[p]
        X = b.fit.double().numpy()
        g = fit_gaussian(b.moments, "empirical", X)
        Xh = b.heldout.double().numpy()
        Yh = s.network(Xh)
        for n in (1, 2, 3):
            poly = mi.fit_polynomial(s.network, g, n)
            under = mi.fvu(s.network, poly, g).fvu
            held = fvu_from_outputs(Yh, poly(Xh)).fvu
            rows.append((p, n, under, held))
    t_fit = time.perf_counter() - t0
    for p, n, u, h in rows:
        print(f"  {p:18s} degree {n}: FVU under the Gaussian {u:.4f}, on held-out tokens {h:.4f}")
    total = t_cap + t_fit
    print(f"capture + fit + evaluate, 6 blocks x degrees 1-3 under one Gaussian: {total:.1f} s "
          f"(capture {t_cap:.1f} s, fit + exact FVU + held-out {t_fit:.1f} s; goal <= 300 s) - peak RSS "
          f"{peak_rss_gb():.2f} GB; load average {os.getloadavg()[0]:.2f}")
    if args.skip_extras:
        return

    from mlpinterp.lm.input_models import fit_mixture
    from mlpinterp.poly.finetune_config import FinetuneConfig
    from mlpinterp.poly.projection import normal_equations, project_on_data, solve_projection
    from mlpinterp.poly.readout import Readout, RidgeBasis
    from mlpinterp.poly.readout_finetune import finetune

    p0 = paths[0]
    s, b = sites[p0], cap.blocks[p0]
    X = b.fit.double().numpy()
    g = fit_gaussian(b.moments, "empirical", X)
    p3 = mi.fit_polynomial(s.network, g, 3)
    basis = RidgeBasis.from_closed_form(p3, g)
    t0 = time.perf_counter()
    project_on_data(s.network, basis, X, [1, 2, 3])
    print(f"\nblock 0, data projection degrees 1-3 on {X.shape[0]:,} tokens ({basis.n_features(3):,} features): "
          f"{time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    mix, _ = fit_mixture(X, 8, 20_000, seed=0)
    t_em = time.perf_counter() - t0
    try:
        from mlpinterp.poly.mixture.readout_moments import mixture_normal_equations

        t0 = time.perf_counter()
        neq = mixture_normal_equations(s.network, basis, mix, 3)
        for n in (2, 3):
            solve_projection(neq.leading(n, basis), basis)
        print(f"block 0, mixture K = 8: EM {t_em:.1f} s, exact projection degrees 2-3 {time.perf_counter() - t0:.1f} s")
    except ImportError:
        print(f"block 0, mixture K = 8: EM {t_em:.1f} s (exact mixture moments not available)")
    t0 = time.perf_counter()
    start = Readout.from_closed_form(mi.fit_polynomial(s.network, g, 2), basis)
    finetune(s.network, start, X, FinetuneConfig(steps=100))
    print(f"block 0, hybrid degree 2, 100 schedule-free steps of 2,048 tokens: {time.perf_counter() - t0:.1f} s")

    # ratios against what a user would otherwise run
    p2 = mi.fit_polynomial(s.network, g, 2)
    t0 = time.perf_counter()
    exact = mi.fvu(s.network, p2, g)
    t_exact = time.perf_counter() - t0
    t0 = time.perf_counter()
    mc = mi.fvu(s.network, p2, g, method="monte-carlo", n_samples=20_000)
    t_mc20 = time.perf_counter() - t0
    n_needed = int(20_000 * (mc.stderr / 1e-3) ** 2)
    print(f"\nexact FVU under the Gaussian {exact.fvu:.5f} (error bound {exact.error_bound:.1e}) in {t_exact:.2f} s; "
          f"Monte Carlo needs ~{n_needed:,} samples for a 1e-3 standard error: ~{t_mc20 * n_needed / 20_000:.1f} s "
          f"-> ratio {t_mc20 * n_needed / 20_000 / t_exact:.1f}x")
    m = 30_000
    Xs = X[:m]
    t0 = time.perf_counter()
    ro, _ = solve_projection(normal_equations(s.network, basis, Xs, 2), basis, ridge=1e-8)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    Phi = basis.features(Xs, 2)
    Y = s.network(Xs)
    t_feat = time.perf_counter() - t0  # charged to both alternatives (ours builds the same features in chunks)
    from sklearn.linear_model import Ridge

    lam = 1e-8 * float((Phi[:, 1:] ** 2).sum(0).mean())
    t0 = time.perf_counter()
    sk = Ridge(alpha=lam, fit_intercept=False, solver="auto").fit(Phi, Y)
    t_sk = time.perf_counter() - t0 + t_feat
    t0 = time.perf_counter()
    B = np.linalg.lstsq(Phi, Y, rcond=None)[0]
    t_np = time.perf_counter() - t0 + t_feat
    Xe = b.heldout.double().numpy()[:5000]
    ours, theirs, npls = ro(Xe), basis.features(Xe, 2) @ sk.coef_.T, basis.features(Xe, 2) @ B
    rel = lambda a: float(np.abs(a - ours).max() / np.abs(ours).max())  # noqa: E731
    print(f"data projection, degree 2, {m:,} tokens, {Phi.shape[1]:,} features: ours {t_ours:.1f} s; "
          f"scikit-learn Ridge {t_sk:.1f} s ({t_sk / t_ours:.1f}x, max rel. difference {rel(theirs):.1e}); "
          f"numpy lstsq {t_np:.1f} s ({t_np / t_ours:.1f}x, {rel(npls):.1e}); load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
