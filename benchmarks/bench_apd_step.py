"""Benchmark: wall time of APD training steps for the paper presets, extrapolated to a full run.

    OMP_NUM_THREADS=1 python benchmarks/bench_apd_step.py [--setting tms-5-2] [--steps 300] [--threads 1]

Prints ms/step, the extrapolation to the preset's step count and the machine's load average (the shared CPU of
a busy machine inflates every number).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from mlpinterp.apd import decompose, with_overrides
from mlpinterp.studies.apd.settings import PRESETS
from mlpinterp.toys import RESID_PRESETS, TMS_PRESETS, build_gated_trig, build_resid_mlp, step_generator
from mlpinterp.toys.settings import setting_spec
from mlpinterp.toys.tms import TMS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--setting", default="tms-5-2", choices=sorted(PRESETS))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    name = args.setting
    if name in TMS_PRESETS:
        model = TMS(TMS_PRESETS[name].n_features, TMS_PRESETS[name].d_hidden)
    elif name in RESID_PRESETS:
        model = build_resid_mlp(RESID_PRESETS[name])
    else:
        model = build_gated_trig()[0]
    model.requires_grad_(False)
    full = PRESETS[name]
    cfg = with_overrides(full, steps=args.steps, log_every=10**9)
    spec = setting_spec(name)
    sample = lambda step: spec.sample(cfg.batch_size, step_generator(0, step))
    t = time.perf_counter()
    decompose(model, sample, cfg, quiet=True)
    sec = (time.perf_counter() - t) / args.steps
    res = {"setting": name, "batch_size": cfg.batch_size, "ms_per_step": 1e3 * sec,
           "full_preset_steps": full.steps, "full_preset_minutes": sec * full.steps / 60,
           "threads": args.threads, "load_average": list(os.getloadavg())}
    print(f"{name}: {res['ms_per_step']:.1f} ms/step at batch {cfg.batch_size} -> full preset ({full.steps} steps) "
          f"~{res['full_preset_minutes']:.1f} min on {args.threads} thread(s); load average {res['load_average']}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
