"""Can the mixture quadratic's CG take fewer iterations? Three candidates against today's solver, same run (issue 12).

The operator application is at the CPU's GEMM peak (``profile_mixture_operator.py``), so only the iteration count
is left. Each probe swaps one thing into today's block PCG (float64, ``fvu_tol`` 1e-6, the pooled anchor) and counts
the iterations, operator applications and CPU seconds of a cold solve and of a warm-started next checkpoint
(Galerkin start), against today's solver on the same networks and mixture:

* ``kron``: a preconditioner that captures the correlations between pixels, where today's is Jacobi on the
  off-diagonal A_ij (exact on (c, diag A)). On symmetric A the mixture operator's (c, A) block is
  ``sum_k pi_k w_k w_k^T + 2 sum_k pi_k (S_k (x) S_k + S_k (x) m_k m_k^T + m_k m_k^T (x) S_k)`` with
  ``w_k = (1, Q_k)``, ``Q_k = S_k + m_k m_k^T`` (Isserlis). The probe replaces the Kronecker sum by its nearest
  Kronecker product ``C (x) C`` (Van Loan & Pitsianis 1993; power iteration on the rearranged sum) and inverts
  ``C (x) C`` plus the rank-K term exactly (Woodbury: two r^3 GEMMs per output and application, against the
  operator's 2K), b as is; ``--kron-delta`` is the weight it gives c alone.
* ``recycle``: deflation by the previous solve's Krylov space (Saad, Yeung, Erhel & Guyomarc'h 2000). The cold
  solve's block directions and their images (up to ``--recycle`` of them, M-orthonormalised) join the previous
  corrections in the Galerkin start of the next checkpoint, and every later direction is made M-orthogonal to them.
* ``stack``: three seeds' networks solved as one (their hidden layers side by side, a block-diagonal readout: 30
  outputs), so that block CG shares one Krylov space over 3 x 10 right-hand sides; against the three solved
  one after another.

Usage: python benchmarks/probe_mixture_iterations.py [--case mnist14] [--probes kron recycle stack] [--threads 1]
Timings are CPU seconds with the load average (the CPU may be shared); iteration counts do not depend on the load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np


def _data(case: str):
    from mlpinterp.data import load_mnist
    from mlpinterp.data.pooling import average_pool

    return average_pool(load_mnist(), 14 if case == "mnist14" else None)


def _stack(nets):
    """One MLP computing the outputs of ``nets`` side by side (hidden layers concatenated, block-diagonal readout)."""
    from mlpinterp.networks import MLP

    h, o = nets[0].W1.shape[0], nets[0].W2.shape[0]
    W2 = np.zeros((o * len(nets), h * len(nets)))
    for i, n in enumerate(nets):
        W2[o * i:o * (i + 1), h * i:h * (i + 1)] = n.W2
    return MLP(np.concatenate([n.W1 for n in nets]), np.concatenate([n.b1 for n in nets]), W2,
               np.concatenate([n.b2 for n in nets]), "relu")


def _kron_preconditioner(op, delta: float):
    """``precondition_flat`` replacement: the exact inverse of ``(delta c, b, 2 C A C) + sum_k pi_k w_k w_k^T``."""
    import torch

    from mlpinterp.poly.mixture.operator import unflatten_theta

    r, S, m = op.r, op._S64, op.m.to(torch.float64)
    pi = torch.tensor(op.pi, dtype=torch.float64)
    M = m[:, :, None] * m[:, None, :]
    Q = S + M
    C = torch.eye(r, dtype=torch.float64)
    for _ in range(500):  # power iteration on the rearranged Kronecker sum (its top singular pair)
        a, b = torch.einsum("kij,ij->k", S, C), torch.einsum("kij,ij->k", M, C)
        Cn = torch.einsum("k,kij->ij", pi * (a + b), S) + torch.einsum("k,kij->ij", pi * a, M)
        sigma = float((Cn * C).sum())
        Cn = Cn / Cn.norm()
        done = float((Cn - C).norm()) < 1e-12
        C = Cn
        if done:
            break
    C = C * (np.sign(float(torch.trace(C))) * np.sqrt(abs(sigma)))
    w, V = torch.linalg.eigh(C)
    Ci = (V / w.clamp(min=1e-3 * float(w[-1]))) @ V.T
    K = len(op.pi)
    Y = torch.zeros(K, 1 + r + r * r, dtype=torch.float64)  # B0^{-1} w_k
    Y[:, 0] = 1 / delta
    Y[:, 1 + r:] = (0.5 * Ci @ Q @ Ci).reshape(K, -1)
    Wk = torch.zeros_like(Y)
    Wk[:, 0], Wk[:, 1 + r:] = 1.0, Q.reshape(K, -1)
    G = Wk @ Y.T
    core = torch.linalg.inv(torch.diag(1 / pi) + 0.5 * (G + G.T))

    def precondition_flat(F):
        x = F.to(torch.float64)
        g0, g1, g2 = unflatten_theta(x, r)
        out = torch.empty_like(x)
        c, b, A = unflatten_theta(out, r)
        b.copy_(g1)
        c.copy_(g0 / delta)
        A.copy_(0.5 * (Ci @ g2 @ Ci))
        out -= ((x @ Y.T) @ core) @ Y
        return out.to(F.dtype)

    return precondition_flat, (float(w[0]), float(w[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="mnist14", choices=["mnist14", "mnist"])
    ap.add_argument("--d-hidden", type=int, default=256)
    ap.add_argument("--covariance", default="ledoit-wolf", choices=["empirical", "ledoit-wolf"])
    ap.add_argument("--probes", nargs="+", default=["kron", "recycle", "stack"], choices=["kron", "recycle", "stack"])
    ap.add_argument("--kron-delta", type=float, default=0.1)
    ap.add_argument("--recycle", type=int, nargs="+", default=[100, 300])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_mixture_mnist import train_mlp

    import mlpinterp.poly.mixture.exact as exact
    import mlpinterp.poly.mixture.operator as op_mod
    import mlpinterp.poly.mixture.pcg as pcg_mod
    from mlpinterp.gaussian.distributions import GaussianMixture
    from mlpinterp.poly.mixture.coordinates import coordinates_of

    data = _data(args.case)
    shrink = "ledoit-wolf" if args.covariance == "ledoit-wolf" else 0.0
    mix = GaussianMixture.from_labels(np.asarray(data.X_train, dtype=np.float64), data.y_train, shrinkage=shrink)
    seeds = 3 if "stack" in args.probes else 1
    nets = [[train_mlp(data, args.d_hidden, steps, seed=s)[0] for steps in (400, 450)] for s in range(seeds)]
    op = op_mod.cached_operator(coordinates_of(mix), "diagonal", torch.device("cpu"), torch.float64)
    kw = dict(method="cg", fvu_tol=1e-6, dtype=torch.float64, device="cpu")
    print(f"case {args.case}, d_hidden {args.d_hidden}, {args.covariance} classes, r = {op.r}, K = {mix.K}, "
          f"threads {args.threads}, load average {os.getloadavg()}")
    print("| solver | cold: iterations / applications / CPU s | warm: iterations / applications / CPU s | CPU ratio "
          "(cold + warm) vs today |\n|---|---|---|---|")

    def solve(n0, n1):
        t0 = time.process_time()
        p = exact.fit_mixture(n0, mix, 2, **kw)
        t1 = time.process_time()
        q = exact.fit_mixture(n1, mix, 2, warm_start=p, **kw)
        t2 = time.process_time()
        for s in (p, q):
            if not s.solver_info["converged"]:
                raise RuntimeError(f"a probe's solve did not converge: {s.solver_info['relative_residual']:.2e}")
        return (p, q), [(s.solver_info["iterations"], s.solver_info["operator_applications"]) for s in (p, q)], \
            (t1 - t0, t2 - t1)

    def row(name, its, cpu, base=None, ratio="1"):
        ratio = ratio if base is None else f"{sum(base) / sum(cpu):.2f}x"
        print(f"| {name} | {its[0][0]} / {its[0][1]} / {cpu[0]:.1f} | {its[1][0]} / {its[1][1]} / {cpu[1]:.1f} | "
              f"{ratio} |", flush=True)

    _, its, base = solve(*nets[0])
    row("today (Jacobi off-diagonal, exact on (c, diag A))", its, base)
    if "kron" in args.probes:
        op.precondition_flat, (lo, hi) = _kron_preconditioner(op, args.kron_delta)
        _, its, cpu = solve(*nets[0])
        del op.precondition_flat
        row(f"kron (C eigenvalues {lo:.2f}-{hi:.2f}, delta {args.kron_delta})", its, cpu, base)
    if "recycle" in args.probes:
        blocks, apply_flat = [], op.apply_flat

        def recording(Z):
            Qz = apply_flat(Z)
            blocks.append((Z.clone(), Qz.clone()))
            return Qz

        op.apply_flat = recording
        t0 = time.process_time()
        p = exact.fit_mixture(nets[0][0], mix, 2, **kw)
        cold = (p.solver_info["iterations"], p.solver_info["operator_applications"]), time.process_time() - t0
        del op.apply_flat
        Zs, Qs = torch.cat([z for z, _ in blocks]), torch.cat([q for _, q in blocks])
        del blocks
        galerkin = pcg_mod.galerkin_start
        for n in args.recycle:
            H = Zs[:n] @ Qs[:n].T
            w, V = torch.linalg.eigh(0.5 * (H + H.T))
            T = (V[:, w > 1e-10 * w[-1]] / w[w > 1e-10 * w[-1]].sqrt()).T
            W, MW = T @ Zs[:n], T @ Qs[:n]  # W M W^T = I

            def start(anchor, ra, basis, m_basis, space, W=W, MW=MW):
                return galerkin(anchor, ra, torch.cat([W, basis]), torch.cat([MW, m_basis]), space)

            def deflated(F, W=W, MW=MW):
                Z = type(op).precondition_flat(op, F)
                return Z - (Z @ MW.T) @ W

            pcg_mod.galerkin_start, op.precondition_flat = start, deflated
            t0 = time.process_time()
            q = exact.fit_mixture(nets[0][1], mix, 2, warm_start=p, **kw)
            warm = time.process_time() - t0
            pcg_mod.galerkin_start = galerkin
            del op.precondition_flat
            row(f"recycle {W.shape[0]} directions of the cold solve (warm only)",
                [cold[0], (q.solver_info["iterations"], q.solver_info["operator_applications"])], (cold[1], warm), base)
    if "stack" in args.probes:
        sep_its, sep_cpu = [[0, 0], [0, 0]], [0.0, 0.0]
        for s in range(seeds):
            _, its, cpu = solve(*nets[s])
            for j in range(2):
                sep_its[j] = [a + b for a, b in zip(sep_its[j], its[j], strict=True)]
                sep_cpu[j] += cpu[j]
        row(f"{seeds} seeds one after another (sums)", sep_its, sep_cpu, ratio="1 (for the next row)")
        _, its, cpu = solve(_stack([n[0] for n in nets]), _stack([n[1] for n in nets]))
        row(f"{seeds} seeds stacked: one block CG over {10 * seeds} outputs (ratio vs the row above)", its, cpu,
            sep_cpu)


if __name__ == "__main__":
    main()
