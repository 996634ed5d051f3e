"""Train one TopK SAE on activations already on disk (:mod:`mlpinterp.sae.cached`) and write the SAE directory.

:func:`train_on_activations` is what ``mlpinterp sae train --activations FILE`` runs: the default
:class:`~mlpinterp.sae.mfr.MfrConfig` recipe for one SAE (no MFR), ``ceil(tokens / batch_size)`` steps over
:func:`~mlpinterp.sae.cached.shuffled_batches` of the file's ``train`` tensor, the same output directory as
training on a model (``OUT/sae_0/`` in the sparsify layout, the resumable trainer checkpoint) and, when the file
holds a ``test`` tensor, SAEBench core metrics on it in ``OUT/metrics.json``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from mlpinterp.sae.cached import ActivationFile, read_activations, shuffled_batches
from mlpinterp.sae.core_metrics import core_metrics
from mlpinterp.sae.io import load_sae
from mlpinterp.sae.mfr import MfrConfig, MfrTrainer
from mlpinterp.sae.topk import SaeConfig, TopKSae
from mlpinterp.utils.io import atomic_write_json


def train_on_activations(activations: str | os.PathLike | ActivationFile, out: str | os.PathLike, *,
                         d_sae: int = 3072, k: int = 32, tokens: int = 1_000_000, batch_size: int = 4096,
                         seed: int = 0, quiet: bool = True, **config) -> tuple[TopKSae, dict]:
    """Train one TopK SAE on an activations file (or a read :class:`ActivationFile`) and write it to ``out``.

    Parameters
    ----------
    activations : path or ActivationFile
        Safetensors file with ``train [n, d_in]`` and optionally ``test [n_test, d_in]``.
    out : path
        Output directory: ``sae_0/`` (sparsify layout, loadable by :func:`mlpinterp.sae.io.load_sae`), the trainer
        checkpoint (a second call with more ``tokens`` continues the run) and ``metrics.json``.
    d_sae, k : int
        Latents and TopK k.
    tokens : int
        Training activations; ``ceil(tokens / batch_size)`` steps (rows are reused once the file is exhausted).
    batch_size, seed : int
        Activations per step; seed of the initialisation and of the batch order.
    **config
        Other :class:`MfrConfig` fields (``optimizer``, ``lr``, ``auxk_alpha``, ...).

    Returns
    -------
    (sae, metrics)
        The trained SAE (its saved weights) and the dict written to ``metrics.json`` (``saebench_core`` is
        None without a ``test`` tensor).

    Raises
    ------
    FileNotFoundError / ValueError
        For a missing or malformed activations file (:func:`read_activations`), bad sizes, or a checkpoint in
        ``out`` made with other settings.
    """
    for name, v in (("d_sae", d_sae), ("k", k), ("tokens", tokens), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    data = activations if isinstance(activations, ActivationFile) else read_activations(activations)
    cfg = MfrConfig(sae=SaeConfig(d_sae=d_sae, k=k), n_saes=1, penalty=False, reinit=False, seed=seed, **config)
    out = Path(out)
    trainer = MfrTrainer(data.d_in, cfg, model_name=data.model_name, hook_point=data.hook_point)
    trainer.load_checkpoint(out)
    steps = math.ceil(tokens / batch_size)
    batches = shuffled_batches(data.train, batch_size, seed=seed)
    for _ in range(trainer.step):  # a resumed run continues the same batch sequence
        next(batches)
    trainer.fit(batches, steps, quiet=quiet, checkpoint_dir=out, desc="SAE")
    sae = load_sae(out / "sae_0")
    metrics = {"model_name": data.model_name, "hook_point": data.hook_point, "steps": trainer.step,
               "tokens": trainer.step * batch_size, "batch_size": batch_size, "n_train": int(data.train.shape[0]),
               "n_test": None if data.test is None else int(data.test.shape[0]),
               "saebench_core": None if data.test is None else [{"sae": "sae_0", **core_metrics(sae, data.test)}]}
    atomic_write_json(out / "metrics.json", metrics)
    return sae, metrics
