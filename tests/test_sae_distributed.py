"""Two gloo processes on localhost give the same losses as one process (DDP and ensemble-parallel modes)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.distributed as dist

from mlpinterp.sae.distributed import Distributed
from mlpinterp.sae.mfr import MfrConfig, MfrTrainer
from mlpinterp.sae.synthetic import SyntheticConfig, SyntheticData
from mlpinterp.sae.topk import SaeConfig
from tests.gloo import run_forked

STEPS = 6


def _cfg() -> MfrConfig:
    # reinit with a tiny window and a low threshold so that re-initialisations happen during the run
    # input normalisation on: the scale is estimated from the global batch (all-reduced in ddp mode)
    return MfrConfig(sae=SaeConfig(d_sae=24, k=3, tied=False), n_saes=2, optimizer="adam", lr=1e-2, warmup_steps=2,
                     inactivity_window=2, inactivity_threshold=0.2, dead_after_samples=32, seed=0,
                     normalize_activations="expected_average_only_in")


def _data() -> SyntheticData:
    return SyntheticData(SyntheticConfig(n_features=24, d=10, n_groups=3, k_active=2, seed=0))


def _run(mode: str) -> dict:
    torch.set_num_threads(1)
    tr = MfrTrainer(10, _cfg(), Distributed(mode), dtype=torch.float64)
    data = _data()
    tr.estimate_input_scale([tr.dist.local_batch(data.batch(i, 32).x.double()) for i in range(2)])
    for i in range(STEPS):
        tr.train_step(tr.dist.local_batch(data.batch(i, 32).x.double()))
    return {"recon": [h["recon"] for h in tr.history], "auxk": [h["auxk"] for h in tr.history],
            "l0": [h["l0"] for h in tr.history], "scale": [tr.input_scale],
            "penalty": [h["penalty"] for h in tr.history], "reinit": tr.reinit_events,
            "w": {i: s.W_dec.detach().tolist() for i, s in zip(tr.owned, tr.saes, strict=True)}}


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        res = {mode: _run(mode) for mode in ("ddp", "ensemble")}
        with open(f"{out_dir}/rank{rank}.json", "w") as f:
            json.dump(res, f)
    finally:
        dist.destroy_process_group()


def test_two_process_gloo_matches_one_process(tmp_path):
    single = _run("none")
    # fork: the children reuse the parent's imports (spawn would re-import torch, several seconds each);
    # each child sets one thread before any tensor op. A deadline turns a hang into a failure.
    run_forked(_worker, (2, str(tmp_path / "init"), str(tmp_path)), what="the 2-process gloo run")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert single["reinit"], "the run should exercise re-initialisation"
    for mode in ("ddp", "ensemble"):
        for r in range(2):
            got = ranks[r][mode]
            for key in ("recon", "auxk", "penalty", "l0", "scale"):
                np.testing.assert_allclose(got[key], single[key], rtol=1e-9, atol=1e-12, err_msg=f"{mode} {key}")
            assert got["reinit"] == [e for e in single["reinit"] if mode == "ddp" or e["sae"] % 2 == r]
    # parameters agree too: ddp holds both SAEs on each rank, ensemble one per rank
    for i in range(2):
        np.testing.assert_allclose(ranks[0]["ddp"]["w"][str(i)], single["w"][i], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(ranks[i]["ensemble"]["w"][str(i)], single["w"][i], rtol=1e-9, atol=1e-12)


def test_init_distributed_outside_torchrun_is_a_clear_error(monkeypatch):
    from mlpinterp.sae.distributed import init_distributed

    if dist.is_initialized():  # pragma: no cover
        pytest.skip("a process group is already initialised")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="must be launched with torchrun"):
        init_distributed("ddp")
    with pytest.raises(ValueError, match="mode must be 'none', 'ddp' or 'ensemble'"):
        init_distributed("pipeline")
    assert Distributed("none").local_batch(torch.zeros(3, 2)).shape == (3, 2)
