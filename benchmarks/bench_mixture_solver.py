"""Exact mixture quadratic: today's matrix-free CG against a baseline revision, same problem, same run (issue 12).

Case ``mnist`` (default): the 784-256-10 ReLU MLP of ``bench_mixture_mnist.py`` (400 Adam steps) under the 10-class
MNIST mixture with empirical class covariances (``--d-hidden 512 --covariance ledoit-wolf``: the main job's); ``mnist14``: the same on MNIST 2x2-average-pooled to 14x14
(d = 196, 196-256-10). The baseline is ``fit_mixture`` of ``--baseline-rev`` (default 82154cb, before issue 12),
run in a subprocess from ``git archive`` of that revision with the same network, mixture and stopping rule
(``fvu_tol`` 1e-6, ``tol`` 1e-10, float64, its pooled start). Today's solver runs in float64, float32 with float64
refinement, bfloat16 GEMMs with float32/float64 refinement (``bf16``), and warm-started from the first network's
solution on a second "checkpoint" (50 more Adam steps).

Accuracy, for every solution: the true relative residual under the float64 operator of today's code (the same
normal equations), and the excess FVU against the baseline's answer and against today's float64 answer when that
row ran (Monte Carlo, 20,000 mixture samples). Timings: wall and CPU seconds with the load average (the CPU may be
shared), ratios against the baseline and against today's float32 solver; peak RSS of the process after each
row (``ru_maxrss``, cumulative: list ``bf16`` first to see its own peak).

``--device cuda``: today's solvers run on the GPU (``fit_mixture(device=...)``); the solver ``cpu32`` is today's
float32 solver on the CPU in the same run, the row to compare a GPU with (its ratio is printed).

``--huge-pages`` (default ``today``): today's solvers run with torch's transparent huge pages, as the ``mlpinterp``
command runs them, and the baseline without (as its users ran it); ``both`` / ``none`` isolate the solver's code.

Usage: python benchmarks/bench_mixture_solver.py [--case mnist] [--solvers bf16 float32 float64 warm32 warmbf16]
       [--baseline-cache DIR] [--threads 2] [--device cuda --solvers cpu32 float32 warm32]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_BASELINE_SNIPPET = r"""
import json, sys, time
import numpy as np, torch
torch.set_num_threads(int(sys.argv[5]))
from mlpinterp.networks import MLP
from mlpinterp.gaussian.distributions import GaussianMixture
z = np.load(sys.argv[1])
dtype = sys.argv[4]
net = MLP(z["W1"], z["b1"], z["W2"], z["b2"], "relu")
mix = GaussianMixture(z["weights"], z["means"], z["covs"])
try:
    from mlpinterp.poly.mixture.exact import fit_mixture
except ImportError:  # revisions before the mixture package
    from mlpinterp.poly.mixture_quadratic import fit_mixture
kw = dict(method="cg", fvu_tol=1e-6, maxiter=500, device="cpu")
kw.update(tol=1e-10) if dtype == "float64" else kw.update(dtype=dtype)
out = {}
t0, c0 = time.perf_counter(), time.process_time()
p = fit_mixture(net, mix, 2, **kw)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
np.savez(sys.argv[2], *p.tensors)
si = p.solver_info
out["cold"] = {"wall_s": wall, "cpu_s": cpu, "iterations": si["iterations"], "relative_residual": si["relative_residual"],
               "stopped_by": si["stopped_by"]}
if "W1b" in z:  # the second checkpoint, warm-started from the first (if the revision has warm starts)
    net2 = MLP(z["W1b"], z["b1b"], z["W2b"], z["b2b"], "relu")
    t0, c0 = time.perf_counter(), time.process_time()
    q = fit_mixture(net2, mix, 2, warm_start=p, **kw)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    np.savez(sys.argv[2].replace(".npz", "_warm.npz"), *q.tensors)
    si = q.solver_info
    out["warm"] = {"wall_s": wall, "cpu_s": cpu, "iterations": si["iterations"],
                   "relative_residual": si["relative_residual"], "stopped_by": si["stopped_by"]}
json.dump(out, open(sys.argv[3], "w"))
"""


def _problem(case: str, d_hidden: int = 256, covariance: str = "empirical"):
    import numpy as np

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_mixture_mnist import train_mlp

    from mlpinterp.data import load_mnist
    from mlpinterp.data.pooling import average_pool
    from mlpinterp.gaussian.distributions import GaussianMixture

    data = average_pool(load_mnist(), 14 if case == "mnist14" else None)
    nets = [train_mlp(data, d_hidden, steps)[0] for steps in (400, 450)]  # two "checkpoints"
    shrink = "ledoit-wolf" if covariance == "ledoit-wolf" else 0.0
    mix = GaussianMixture.from_labels(np.asarray(data.X_train, dtype=np.float64), data.y_train, shrinkage=shrink)
    return nets, mix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="mnist", choices=["mnist", "mnist14"])
    ap.add_argument("--solvers", nargs="+", default=["baseline", "float64", "float32", "warm32"],
                    choices=["baseline", "float64", "float32", "bf16", "warm64", "warm32", "warmbf16", "cpu32"])
    ap.add_argument("--device", default="cpu", help="where today's solvers run: cpu (default) or cuda")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every solver (the baseline too)")
    ap.add_argument("--d-hidden", type=int, default=256)
    ap.add_argument("--covariance", default="empirical", choices=["empirical", "ledoit-wolf"])
    ap.add_argument("--baseline-rev", default="82154cb")
    ap.add_argument("--baseline-dtype", default="float64", choices=["float64", "float32", "bfloat16"],
                    help="the baseline's dtype (float64: tol 1e-10, the pre-issue-12 rule; others: the revision's "
                         "default rule); with --baseline-warm also its warm start on the second checkpoint")
    ap.add_argument("--baseline-warm", action="store_true",
                    help="also time the baseline revision's warm start (revisions after 82154cb)")
    ap.add_argument("--baseline-cache", default=None,
                    help="directory keeping the baseline's answer and timings: reused by later runs (for a loaded "
                         "CPU, where one run cannot hold every solver: compare CPU seconds then)")
    ap.add_argument("--outputs", type=int, default=10,
                    help="keep the first N of the 10 outputs (each output's CG is independent and the time is "
                         "proportional to the number of outputs: a loaded CPU's run then fits in 15 minutes)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--huge-pages", default="today", choices=["today", "both", "none"],
                    help="torch's transparent huge pages (THP_MEM_ALLOC_ENABLE, which the mlpinterp command sets): for "
                         "today's solvers only (default: each side as its users ran it), for both, or for neither")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.huge_pages != "none":  # before torch's first allocation, as the mlpinterp command does
        from mlpinterp.utils.malloc import enable_transparent_huge_pages

        enable_transparent_huge_pages()
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from mlpinterp.poly.approximant import DensePolynomial
    from mlpinterp.poly.mixture.coordinates import coordinates_of, quadratic_in_u, tensors_in_u
    from mlpinterp.poly.mixture.exact import fit_mixture
    from mlpinterp.poly.mixture.operator import cached_operator, theta_dot
    from mlpinterp.poly.ridge import fit_ridge

    print(f"case {args.case}, d_hidden {args.d_hidden}, {args.covariance} class covariances, torch threads "
          f"{args.threads}, load average {os.getloadavg()}")
    (net, net2), mix = _problem(args.case, args.d_hidden, args.covariance)
    if args.outputs < 10:
        from mlpinterp.networks import MLP

        net, net2 = (MLP(n.W1, n.b1, n.W2[: args.outputs], n.b2[: args.outputs], "relu") for n in (net, net2))
    coords = coordinates_of(mix)
    print(f"d = {mix.d}, outputs {net.d_out}, support rank r = {coords.r}, K = {mix.K}, class ranks {[c.rank for c in mix.components]}")
    op = cached_operator(coords, "diagonal", torch.device("cpu"), torch.float64)
    t = lambda ts: tuple(torch.as_tensor(a, dtype=torch.float64) for a in ts)  # noqa: E731

    def residual(p, network):
        rhs = op.apply(None, components=[t(quadratic_in_u(fit_ridge(network, c, 2), coords)) for c in mix.components])
        res = [a - b for a, b in zip(rhs, op.apply(t(tensors_in_u(p, coords, 2))), strict=True)]
        return float((torch.sqrt(theta_dot(res, res)) / torch.sqrt(theta_dot(rhs, rhs))).max())

    X = mix.sample(20_000, np.random.default_rng(12345))
    rows, sols = {}, {}

    def excess(p, ref, network):
        f = network(X)
        return float(((p(X) - ref(X)) ** 2).sum(1).mean() / ((f - f.mean(0)) ** 2).sum(1).mean())

    def record(name, p, wall, cpu, network, its, extra=""):
        ref = sols.get(("baseline", id(network))) or sols.get(("baseline-warm", id(network)))
        exc = None if ref is None else excess(p, ref, network)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rows[name] = {"wall_s": wall, "cpu_s": cpu, "iterations": its, "true_relative_residual": residual(p, network),
                      "excess_fvu_vs_baseline": exc, "load": os.getloadavg()[0], "peak_rss_mb": rss}
        sols[(name, id(network))] = p
        print(f"{name:10s} wall {wall:7.1f}s  CPU {cpu:7.1f}s  its {its:4d}  true residual "
              f"{rows[name]['true_relative_residual']:.1e}  excess FVU vs baseline {exc}  load {os.getloadavg()[0]:.1f}  "
              f"peak RSS {rss:.0f} MB {extra}", flush=True)

    tag = f"{args.case}-h{args.d_hidden}-{args.covariance}-o{net.d_out}"
    cache = Path(args.baseline_cache) / tag if args.baseline_cache else None
    if cache is not None and (cache / "info.json").exists():
        info = json.loads((cache / "info.json").read_text())
        if abs(info["W1_sum"] - float(net.W1.sum())) > 1e-9 * abs(info["W1_sum"]):
            raise SystemExit(f"{cache} holds the baseline of another network; delete it")
        z = np.load(cache / "sol.npz")
        record("baseline", DensePolynomial(tuple(z[f"arr_{i}"] for i in range(3))), info["wall_s"], info["cpu_s"], net,
               info["iterations"], f"(from {cache}, an earlier run: load then {info.get('load')})")
    elif "baseline" in args.solvers:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(f"git archive {args.baseline_rev} src | tar -x -C {tmp}", shell=True, check=True,
                           cwd=Path(__file__).parent.parent)
            second = {}  # the second checkpoint's network, for the baseline's warm start
            if args.baseline_warm:
                second = dict(W1b=net2.W1, b1b=net2.b1, W2b=net2.W2, b2b=net2.b2)
            np.savez(f"{tmp}/problem.npz", W1=net.W1, b1=net.b1, W2=net.W2, b2=net.b2, weights=mix.weights,
                     means=mix.means, covs=mix.covs, **second)
            env = {**os.environ, "PYTHONPATH": f"{tmp}/src", "OMP_NUM_THREADS": str(args.threads),
                   "THP_MEM_ALLOC_ENABLE": "1" if args.huge_pages == "both" else "0"}
            subprocess.run([sys.executable, "-c", _BASELINE_SNIPPET, f"{tmp}/problem.npz", f"{tmp}/sol.npz",
                            f"{tmp}/info.json", args.baseline_dtype, str(args.threads)], env=env, check=True)
            both = json.load(open(f"{tmp}/info.json"))
            info = both["cold"]
            info["load"], info["W1_sum"] = os.getloadavg()[0], float(net.W1.sum())
            z = np.load(f"{tmp}/sol.npz")
            p = DensePolynomial(tuple(z[f"arr_{i}"] for i in range(3)))
            if "warm" in both:
                zw = np.load(f"{tmp}/sol_warm.npz")
                pw, iw = DensePolynomial(tuple(zw[f"arr_{i}"] for i in range(3))), both["warm"]
            if cache is not None:
                cache.mkdir(parents=True, exist_ok=True)
                (cache / "info.json").write_text(json.dumps(info))
                np.savez(cache / "sol.npz", *p.tensors)
        record("baseline", p, info["wall_s"], info["cpu_s"], net, info["iterations"],
               f"(stopped by {info['stopped_by']}, its own residual {info['relative_residual']:.1e})")
        if args.baseline_warm:
            record("baseline-warm", pw, iw["wall_s"], iw["cpu_s"], net2, iw["iterations"],
                   f"(stopped by {iw['stopped_by']}, its own residual {iw['relative_residual']:.1e})")
    first = None
    for name in args.solvers:
        if name == "baseline":
            continue
        dtype = {"32": torch.float32, "64": torch.float64, "16": torch.bfloat16}[name[-2:]]
        warm = name.startswith("warm")
        network = net2 if warm else net
        device = "cpu" if name == "cpu32" else args.device
        if warm and first is None:
            first = fit_mixture(net, mix, 2, method="cg", fvu_tol=1e-6, dtype=dtype, device=device)
        t0, c0 = time.perf_counter(), time.process_time()
        p = fit_mixture(network, mix, 2, method="cg", fvu_tol=1e-6, dtype=dtype, device=device,
                        warm_start=first if warm else None)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        si = p.solver_info
        record(name, p, wall, cpu, network, si["iterations"],
               f"(converged {si['converged']}, stopped by {si['stopped_by']}, sweeps "
               f"{[(w['dtype'], w['iterations']) for w in si['sweeps']]}, applications "
               f"{si['operator_applications_by_dtype']}, fallback {si['fallback']}, structure "
               f"{si['operator_structure']}, init {si['init']}, device {si['device']})")
        rows[name]["solver_info"] = {k: si[k] for k in ("sweeps", "fallback", "operator_applications_by_dtype",
                                                         "setup_time_s", "converged", "stopped_by")}
        if name == "cpu32":
            continue
        if name == "float64" or (name == "float32" and "float64" not in args.solvers) or (
                name == "bf16" and not {"float64", "float32"} & set(args.solvers)):
            first = p if first is None else first
    if "baseline" in rows:
        b = rows["baseline"]
        print("\nratios against the baseline (wall / CPU; > 1 = faster):")
        for name, r in rows.items():
            if name.startswith("warm") and "baseline-warm" in rows:
                bw = rows["baseline-warm"]
                print(f"  {name:10s} {bw['wall_s'] / r['wall_s']:5.2f}x wall  {bw['cpu_s'] / r['cpu_s']:5.2f}x CPU"
                      "  (against the baseline's warm start on the same second checkpoint)")
            elif not name.startswith("baseline"):
                print(f"  {name:10s} {b['wall_s'] / r['wall_s']:5.2f}x wall  {b['cpu_s'] / r['cpu_s']:5.2f}x CPU"
                      + ("  (warm: second checkpoint, started from the first's solution)" if name.startswith("warm") else ""))
    if ("float64", id(net)) in sols:
        print("\nexcess FVU against today's float64 answer (same network):")
        for (name, nid), p in sols.items():
            if nid == id(net) and name != "float64":
                rows[name]["excess_fvu_vs_float64"] = e = excess(p, sols[("float64", id(net))], net)
                print(f"  {name:10s} {e:.2e}")
    if "float32" in rows and {"bf16", "warmbf16"} & set(rows):
        b = rows["float32"]
        print("\nratios against today's float32 solver (wall / CPU; > 1 = faster):")
        for name in ("bf16", "warmbf16"):
            if name in rows:
                r = rows[name]
                print(f"  {name:10s} {b['wall_s'] / r['wall_s']:5.2f}x wall  {b['cpu_s'] / r['cpu_s']:5.2f}x CPU")
    if "cpu32" in rows:
        b = rows["cpu32"]
        print(f"\nwall-time ratios against today's float32 solver on the CPU (> 1 = faster; --device {args.device}):")
        for name, r in rows.items():
            if name not in ("cpu32", "baseline", "baseline-warm"):
                print(f"  {name:10s} {b['wall_s'] / r['wall_s']:5.2f}x wall"
                      + ("  (warm-started: a second checkpoint)" if name.startswith("warm") else ""))
    print(f"load average end {os.getloadavg()}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
