"""Benchmark: the main job end to end (issue 4), wall time, CPU time and peak memory.

    python benchmarks/bench_reproduce_polynomial.py --dataset digits --seeds 3     # target <= 5 min on 2 cores
    python benchmarks/bench_reproduce_polynomial.py --dataset mnist --seeds 3      # target <= 60 min

Runs into a fresh temporary directory (no resumption) and prints the figures; the run's own
``results.json`` holds per-checkpoint fit times (``fit_seconds``) and solver diagnostics.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time

from mlpinterp.studies.polynomial.run import PolynomialReproConfig, run_polynomial_repro


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        t0, c0 = time.perf_counter(), time.process_time()
        res = run_polynomial_repro(PolynomialReproConfig(dataset=args.dataset, seeds=args.seeds, steps=args.steps),
                                   out, quiet=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    q = res["final"]["quadratic_mixture"]["fvu_mixture"]
    print(f"{args.dataset}, {args.seeds} seeds, {res['config']['steps']} steps: wall {wall / 60:.1f} min, "
          f"CPU {cpu / 60:.1f} min, peak RSS {peak:.0f} MiB; final quadratic (mixture) FVU {q['mean']:.4f} ± {q['std']:.4f}")


if __name__ == "__main__":
    main()
