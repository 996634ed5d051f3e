"""Profile of the exact mixture quadratic's matrix-free CG (issue 12): where one solve spends its time.

Cases: ``digits`` (8x8 digits, d = 64, 10 empirical class covariances), ``mnist14`` (MNIST 2x2-average-pooled to
14x14, d = 196, 10 empirical classes) and ``mnist`` (d = 784: one operator application only, in float64 and
float32). For each: cProfile of ``fit_mixture`` by phase (setup / right-hand side / CG), and the torch profiler's
per-operator table for the CG's operator applications and preconditioner.

Usage: python benchmarks/profile_mixture_operator.py [--cases digits mnist14 mnist] [--threads 1]
Timings are wall and CPU seconds with the load average (the CPU may be shared).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time


def _mixture_and_net(case: str, seed: int = 0):
    import numpy as np

    from mlpinterp.data import load_digits, load_mnist
    from mlpinterp.gaussian.distributions import GaussianMixture
    from mlpinterp.networks import MLP

    if case == "digits":
        data = load_digits()
        X, y = data.X_train.astype(np.float64), data.y_train
    else:
        data = load_mnist()
        X, y = data.X_train.astype(np.float64), data.y_train
        if case == "mnist14":
            X = X.reshape(-1, 14, 2, 14, 2).mean((2, 4)).reshape(-1, 196)
    d = X.shape[1]
    rng = np.random.default_rng(seed)
    h = 64 if d < 784 else 256
    net = MLP(rng.standard_normal((h, d)) / np.sqrt(d) * 3, rng.normal(0, 0.3, h), rng.standard_normal((10, h)) / np.sqrt(h),
              np.zeros(10), "relu")
    return GaussianMixture.from_labels(X, y), net


def _torch_table(op, theta, n: int, sort: str = "self_cpu_time_total") -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        for _ in range(n):
            g = op.apply(theta)
            op.precondition(g)
    return prof.key_averages().table(sort_by=sort, row_limit=12, max_name_column_width=28)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["digits", "mnist14", "mnist"])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from mlpinterp.poly.mixture.coordinates import coordinates_of
    from mlpinterp.poly.mixture.exact import fit_mixture
    from mlpinterp.poly.mixture.operator import cached_operator

    print(f"threads {args.threads}, load average {os.getloadavg()}")
    for case in args.cases:
        mix, net = _mixture_and_net(case)
        coords = coordinates_of(mix)
        print(f"\n=== {case}: d = {mix.d}, support rank r = {coords.r}, K = {mix.K}, d_out = {net.d_out}")
        if case != "mnist":
            prof = cProfile.Profile()
            t0, c0 = time.perf_counter(), time.process_time()
            prof.enable()
            p = fit_mixture(net, mix, 2, method="cg", fvu_tol=1e-6, device="cpu")
            prof.disable()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            si = p.solver_info
            print(f"fit_mixture: {wall:.2f}s wall, {cpu:.2f}s CPU, {si['iterations']} iterations, "
                  f"{si['operator_applications']} applications, setup {si['setup_time_s']:.2f}s, "
                  f"residual {si['relative_residual']:.1e}, structure {si['operator_structure']}")
            st = pstats.Stats(prof)
            st.sort_stats("cumulative").print_stats(r"(operator|pcg|exact|coordinates|ridge)\.py", 14)
        for dtype in (torch.float64, torch.float32):
            op = cached_operator(coords, "diagonal", torch.device("cpu"), dtype)
            g = torch.Generator().manual_seed(0)
            A = torch.randn(net.d_out, coords.r, coords.r, generator=g, dtype=dtype)
            theta = (torch.randn(net.d_out, generator=g, dtype=dtype),
                     torch.randn(net.d_out, coords.r, generator=g, dtype=dtype), A + A.transpose(1, 2))
            n = 1 if case == "mnist" else 5
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(n):
                op.apply(theta)
            wall, cpu = (time.perf_counter() - t0) / n, (time.process_time() - c0) / n
            flop = 4 * mix.K * net.d_out * coords.r**3
            print(f"one operator application, {str(dtype)[6:]}: {wall:.3f}s wall, {cpu:.3f}s CPU "
                  f"({flop / 1e9:.1f} GFLOP in the 2K GEMMs -> {flop / wall / 1e9:.1f} GFLOP/s), load {os.getloadavg()[0]:.2f}")
            print(_torch_table(op, theta, n))


if __name__ == "__main__":
    main()
