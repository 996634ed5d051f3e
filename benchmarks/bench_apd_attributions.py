"""Benchmark: batched APD attributions vs the per-output backward loop (the paper's algorithm).

Settings: resid-mlp-1 (C=130, m=1, 100 outputs, d_resid=1000) and TMS 40-10 (C=50, full rank, tied weights),
each with the closed form and the generic forward mode.
Prints median wall times over ``--repeats`` runs, the speed-up ratio and the max relative difference.

    OMP_NUM_THREADS=1 python benchmarks/bench_apd_attributions.py [--batch 2048] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from mlpinterp.apd import attributions, attributions_reference
from mlpinterp.paramspace import Components, resolve_sites
from mlpinterp.toys import RESID_PRESETS, TMS, build_resid_mlp, sparse_features, step_generator


def _time(fn, repeats: int) -> tuple[float, torch.Tensor]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-forward", action="store_true", help="skip the generic forward-mode timing on resid-mlp-1")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = []

    model = build_resid_mlp(RESID_PRESETS["resid-mlp-1"]).requires_grad_(False)
    comps = Components(resolve_sites(model, model.target_names()), 130, m=1, generator=torch.Generator().manual_seed(0))
    x = sparse_features(args.batch, 100, 0.01, (-1.0, 1.0), generator=step_generator(0, 0))
    with torch.no_grad():
        t_ref, ref = _time(lambda: attributions_reference(model, comps, x), args.repeats)
        methods = ["closed"] + ([] if args.skip_forward else ["forward"])
        for method in methods:
            t, a = _time(lambda m=method: attributions(model, comps, x, method=m, chunk_size=26), args.repeats)
            err = float((a - ref).abs().max() / ref.abs().max())
            results.append({"setting": "resid-mlp-1", "C": 130, "batch": args.batch, "method": method,
                            "seconds": t, "reference_seconds": t_ref, "speedup": t_ref / t, "max_rel_diff": err})

    tms = TMS(40, 10).requires_grad_(False)
    comps = Components(resolve_sites(tms, ["W"]), 50, generator=torch.Generator().manual_seed(0))
    x = sparse_features(args.batch, 40, 0.05, generator=step_generator(0, 1))
    with torch.no_grad():
        t_ref, ref = _time(lambda: attributions_reference(tms, comps, x), args.repeats)
        for method in ("closed", "forward"):
            t, a = _time(lambda m=method: attributions(tms, comps, x, method=m), args.repeats)
            results.append({"setting": "tms-40-10", "C": 50, "batch": args.batch, "method": method, "seconds": t,
                            "reference_seconds": t_ref, "speedup": t_ref / t,
                            "max_rel_diff": float((a - ref).abs().max() / ref.abs().max())})
    for r in results:
        print(f"{r['setting']:12s} C={r['C']:<4d} batch={r['batch']:<5d} {r['method']:8s} "
              f"{r['seconds'] * 1e3:9.1f} ms  reference {r['reference_seconds'] * 1e3:9.1f} ms  "
              f"ratio {r['speedup']:6.2f}x  max rel diff {r['max_rel_diff']:.1e}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
