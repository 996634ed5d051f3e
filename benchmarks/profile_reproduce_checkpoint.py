"""Profile of one seed of ``reproduce polynomial`` on MNIST, part by part, without running the whole seed.

    OMP_NUM_THREADS=1 python benchmarks/profile_reproduce_checkpoint.py --steps 512 --checkpoints 2

Trains one seed for ``--steps`` steps (fewer checkpoints than the main job), then times every part of the
evaluation of the last ``--checkpoints`` checkpoints (the first of them cold, the others warm-started, as in
the main job), the SVD attack and the feature file at the final one, and prints wall seconds and the process's
resident memory (current and peak, from /proc and ``resource``) after each part. The mixture-quadratic solve is
split into its setup (the per-class ridge fits and their u-coordinate tensors, the right-hand side, the anchor),
the CG iterations and the change back to raw coordinates by wrapping those functions.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import tempfile
import time
from collections import defaultdict

import numpy as np

T: dict = defaultdict(float)
N: dict = defaultdict(int)


def rss_mb() -> tuple[float, float]:
    with open("/proc/self/statm") as f:
        cur = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return cur, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextlib.contextmanager
def part(name: str):
    t = time.perf_counter()
    yield
    T[name] += time.perf_counter() - t
    N[name] += 1
    cur, peak = rss_mb()
    print(f"  {name:<44s} {time.perf_counter() - t:8.2f} s   RSS {cur:6.0f} MB  peak {peak:6.0f} MB", flush=True)


def wrap(module, attr: str, name: str) -> None:
    f = getattr(module, attr)

    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            T[name] += time.perf_counter() - t
            N[name] += 1

    setattr(module, attr, g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=512)
    ap.add_argument("--checkpoints", type=int, default=2)
    ap.add_argument("--out", default=None, help="training directory (kept; default: a temporary one)")
    ap.add_argument("--no-attack", action="store_true")
    args = ap.parse_args()

    from mlpinterp.data import load_dataset
    from mlpinterp.gaussian.distributions import GaussianMixture
    from mlpinterp.models import ClassifierConfig, find_checkpoints, load_classifier, train_classifier
    from mlpinterp.poly.mixture import exact
    from mlpinterp.studies.polynomial import evaluate as pe
    from mlpinterp.studies.polynomial import run as pr
    from mlpinterp.studies.polynomial.settings import PolynomialReproConfig

    wrap(exact, "fit_ridge", "  solve: per-class + pooled fit_ridge")
    wrap(exact, "quadratic_in_u", "  solve: quadratic_in_u (11 per solve)")
    wrap(exact, "_pcg", "  solve: PCG (all sweeps)")
    wrap(exact, "u_to_raw", "  solve: u_to_raw")
    wrap(exact, "coordinates_of", "  solve: coordinates_of")

    r = PolynomialReproConfig(dataset="mnist", seeds=1, steps=args.steps).resolved()
    print(f"load {os.getloadavg()}")
    with part("load MNIST"):
        data = load_dataset("mnist", None)
    with part("mixture (Ledoit-Wolf) + pooled"):
        mixture = GaussianMixture.from_labels(data.X_train, data.y_train, shrinkage="ledoit-wolf")
        gaussian = mixture.pooled()
    inputs = pe.EvalInputs(mixture, gaussian, data.X_test.astype(np.float64), data.y_test, r["mc_samples"])
    tmp = tempfile.TemporaryDirectory() if args.out is None else None
    ck_dir = args.out or tmp.name
    ccfg = ClassifierConfig(d_in=data.d_in, n_classes=data.n_classes, d_hidden=r["d_hidden"], arch="mlp",
                            activation="relu", lr=r["lr"], warmup_steps=r["warmup_steps"], steps=r["steps"], seed=0)
    with part(f"train {args.steps} steps"):
        train_classifier(ccfg, data, ck_dir, progress=False)
    ckpts = find_checkpoints(ck_dir)[-args.checkpoints:]
    warm = None
    # evaluate_checkpoint, split into its parts (the same calls in the same order)
    for step, path in ckpts:
        print(f"checkpoint {step} (load {os.getloadavg()[0]:.2f})")
        model, _ = load_classifier(path)
        net = model.to_network()
        approx = {}
        for name, dist_name, degree in pe.APPROXIMANTS:
            dist = mixture if dist_name == "mixture" else gaussian
            with part(f"fit {name}"):
                if name == "quadratic_mixture":
                    approx[name] = pe.fit_polynomial(net, dist, 2, method="cg", warm_start=warm, dtype="auto")
                else:
                    approx[name] = pe.fit_polynomial(net, dist, degree)
        si = approx["quadratic_mixture"].solver_info
        print(f"    CG {si['iterations']} it ({si['init']}), residual {si['relative_residual']:.2e}, "
              f"setup {si['setup_time_s']:.1f} s, sweeps {[(s['iterations'], s['dtype']) for s in si['sweeps']]}")
        for k in [k for k in T if k.startswith("  solve")]:
            print(f"    {k:<42s} {T[k]:8.2f} s cumulative ({N[k]} calls)")
        warm = approx["quadratic_mixture"]
        with part("MC samples (drawn per checkpoint)"):
            mc = inputs.mixture_samples()
        with part("network on test + MC"):
            f_test, f_mix = net(inputs.X_test), net(mc)
        for name, p in approx.items():
            with part(f"eval {name} on test + MC"):
                q_test, q_mix = p(inputs.X_test), p(mc)
            with part("summaries (FVU, KL)"):
                pe._summary(f_test, q_test)
                pe._summary(f_mix, q_mix)
            if name.endswith("gaussian"):
                with part(f"exact FVU {name}"):
                    pe.fvu(net, p, gaussian)
    if not args.no_attack:
        with part("svd_attack"):
            pe.svd_attack(net, approx, data.X_train.astype(np.float64), inputs.X_test, inputs.y_test,
                          input_cov=mixture.cov, k_max=r["attack_k"], seed=0)
        steps = [s for s, _ in find_checkpoints(ck_dir)]
        with part("_save_features"), tempfile.TemporaryDirectory() as d:
            from pathlib import Path

            pr._save_features(Path(d) / "f.npz", Path(ck_dir), inputs, steps, approx)
    print(f"peak RSS {rss_mb()[1]:.0f} MB, load {os.getloadavg()}")


if __name__ == "__main__":
    main()
