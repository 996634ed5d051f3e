"""Train a small GPT-2-architecture causal LM and its byte-level BPE tokenizer on text documents.

The MFR paper's real-model result (Marks et al. 2024, Table 2) is on GPT-2 Small's layer-0 MLP output with the
SAE spliced in; no causal LM with trained weights is available offline, so ``mlpinterp train-lm`` trains one here
(:class:`~mlpinterp.lm.train_config.LmTrainConfig`: 4 layers, d_model 256 by default) and saves it as a standard
Hugging Face directory that ``GPT2LMHeadModel.from_pretrained`` / ``AutoTokenizer.from_pretrained`` (and
:func:`mlpinterp.lm.models.load_model`) read.

Data: :func:`mlpinterp.lm.text.split_files` splits the documents (files) of the text directory into training
documents and held-out ones (``*test*``: wikitext-2 test among the bundled corpora); the tokenizer
(:func:`~mlpinterp.lm.tokenizer.train_tokenizer`) and the model see only the training documents.
:func:`mlpinterp.lm.text.token_chunks` cuts each document into ``n_positions``-token chunks (no chunk crosses a
document); step ``t`` trains on the chunks :func:`mlpinterp.utils.batches.epoch_batch_indices` draws from
``(seed, epoch)``. Loss: mean next-token cross-entropy (nats/token) over the ``n_positions - 1`` targets of every
chunk. Optimiser: AdamW (betas 0.9 / 0.95; weight decay on matrices only), linear warm-up to ``lr``, cosine decay
to ``min_lr_fraction * lr``, global gradient-norm clip.

Held-out perplexity: ``exp`` of the mean next-token cross-entropy over every target of the held-out chunks, the
same cross-entropy :func:`mlpinterp.lm.recovery.downstream_comparison` reports as "clean" (so the perplexity and
the loss-recovered protocol's clean CE are one number).

Files in ``out``: the Hugging Face directory (``config.json``, ``model.safetensors``, ``generation_config.json``,
``tokenizer.json``, ``tokenizer_config.json``), ``metrics.json`` (held-out CE and perplexity, tokens, time, load),
``checkpoint/train_state.safetensors`` + ``.json`` (parameters, AdamW moments, the torch RNG state, step, history;
written atomically every ``checkpoint_every`` steps). Re-running on the same ``out`` resumes from the checkpoint
and gives weights bit-identical to an uninterrupted run (same torch build and number of threads); a finished run
returns its metrics at once; another configuration or corpus is refused (a checkpoint written before a field of
:data:`~mlpinterp.lm.train_config.ADDED_FIELDS` existed compares as the behaviour of that time).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mlpinterp.lm.text import read_texts, split_files, texts_digest, token_chunks
from mlpinterp.lm.tokenizer import tokenizer_digest, train_tokenizer
from mlpinterp.lm.train_config import ADDED_FIELDS, LmTrainConfig
from mlpinterp.models.train import RunConflictError
from mlpinterp.utils.artifact import ArtifactError, load_artifact, save_artifact
from mlpinterp.utils.batches import epoch_batch_indices
from mlpinterp.utils.checkpoint import (
    check_loss_finite,
    check_params_finite,
    optimizer_tensors,
    restore_optimizer,
    split_optimizer_tensors,
)
from mlpinterp.utils.config_diff import config_diff
from mlpinterp.utils.progress import progress_bar
from mlpinterp.utils.rundir import check_out_dir, open_run, read_output, write_output
from mlpinterp.utils.schedules import cosine_half, linear_warmup
from mlpinterp.utils.validation import check_instance, check_int

CHECKPOINT_KIND = "lm_checkpoint"
"""Artifact kind of the training state ``checkpoint/train_state.safetensors`` (:mod:`mlpinterp.utils.artifact`)."""


def lr_at(cfg: LmTrainConfig, step: int) -> float:
    """Learning rate of 0-based ``step``: ``lr (step + 1) / warmup_steps`` during warm-up, then cosine decay from
    ``lr`` to ``min_lr_fraction * lr`` at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * linear_warmup(step, cfg.warmup_steps)
    floor = cfg.min_lr_fraction * cfg.lr
    return floor + (cfg.lr - floor) * cosine_half(step - cfg.warmup_steps, cfg.steps - cfg.warmup_steps,
                                                  zero_at_last_step=True)


def next_token_ce(model: nn.Module, ids: Tensor) -> Tensor:
    """Mean next-token cross-entropy (nats/token) of ``model`` on ``ids [batch, seq]``: every position but the
    last predicts the next token."""
    logits = model(input_ids=ids).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))


def held_out_ce(model: nn.Module, ids: Tensor, batch_size: int = 16) -> float:
    """Mean next-token cross-entropy (nats/token) over every target of ``ids [n, seq]``, in eval mode: the clean CE
    of :func:`mlpinterp.lm.recovery.downstream_comparison`."""
    from mlpinterp.lm.recovery import downstream_comparison

    return float(downstream_comparison(model, {}, ids, batch_size=batch_size)["clean"]["ce"])


def _model(cfg: LmTrainConfig, vocab_size: int, eos_id: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab_size, n_positions=cfg.n_positions, n_embd=cfg.d_model, n_layer=cfg.n_layer,
                        n_head=cfg.n_head, resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
                        bos_token_id=eos_id, eos_token_id=eos_id)
    return GPT2LMHeadModel(config)


def _optimizer(cfg: LmTrainConfig, model: nn.Module) -> torch.optim.AdamW:
    """AdamW with weight decay on the 2-D weights except the position embedding."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "wpe" not in name else rest).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def _checkpoint_path(out: Path) -> Path:
    return out / "checkpoint" / "train_state.safetensors"


def _save_checkpoint(out: Path, model: nn.Module, opt: torch.optim.Optimizer, meta: dict) -> None:
    tensors = {f"param.{n}": p.detach() for n, p in model.named_parameters()}
    tensors.update(optimizer_tensors(opt, "opt"))
    tensors["rng.torch"] = torch.get_rng_state()
    save_artifact(_checkpoint_path(out), tensors, kind=CHECKPOINT_KIND, meta=meta,
                  provenance={"step": meta["step"], "corpus": meta["corpus"]["train_digest"]})


def _load_checkpoint(path: Path) -> tuple[dict, dict]:
    """``(tensors, metadata)`` of the verified checkpoint at ``path``; :class:`ArtifactError` naming the fix."""
    art = load_artifact(path, kind=CHECKPOINT_KIND, what="checkpoint",
                        fix=f"delete {str(path.parent)!r} to restart the run from step 0")
    if not isinstance(art.meta, dict):
        raise ArtifactError(path, f"holds metadata of type {type(art.meta).__name__}, expected a JSON object",
                            f"delete {str(path.parent)!r} to restart the run from step 0", "checkpoint")
    return art.tensors, art.meta


def _restore(path: Path, model: nn.Module, opt: torch.optim.Optimizer, tensors: dict) -> None:
    fix = f"delete {str(path.parent)!r} to restart the run from step 0"
    try:
        state, unknown = split_optimizer_tensors(tensors, opt, "opt")
        if unknown:
            raise KeyError(f"optimiser state of no parameter: {unknown[:3]}")
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(tensors[f"param.{n}"])
        restore_optimizer(opt, state)
        torch.set_rng_state(tensors["rng.torch"])
    except (KeyError, RuntimeError, ValueError) as e:
        raise ValueError(f"checkpoint {str(path)!r} does not match the model ({e}); {fix}") from e


def _save_hf(out: Path, model: nn.Module | None, tokenizer) -> None:
    """``save_pretrained`` of the tokenizer (and the model unless None) into a temporary directory, then each file
    renamed into ``out`` (``config.json`` last), so an interruption never leaves a half-written file there."""
    from transformers.utils import logging as hf_logging

    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".hf."))
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Writing model shards" is noise beside our own progress bar
    try:
        if model is not None:
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        files = sorted(tmp.iterdir(), key=lambda p: p.name == "config.json")
        for f in files:
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if bars:
            hf_logging.enable_progress_bar()


def _load_tokenizer(out: Path, digest: str):
    from transformers import PreTrainedTokenizerFast

    try:
        tok = PreTrainedTokenizerFast.from_pretrained(out)
    except (OSError, ValueError) as e:
        raise ValueError(f"the tokenizer in {str(out)!r} cannot be read ({e}); delete {str(out)!r} to restart") from e
    if tokenizer_digest(tok) != digest:
        raise ValueError(f"the tokenizer in {str(out)!r} is not the one the checkpoint was trained with (digest "
                         f"{tokenizer_digest(tok)} vs {digest}); delete {str(out)!r} to restart the run")
    return tok


def train_lm(cfg: LmTrainConfig, out: str | os.PathLike, *, text_dir: str | os.PathLike | None = None,
             quiet: bool = False, threads: int | None = 1) -> dict:
    """Train the tokenizer and the causal LM of ``cfg`` into ``out`` (:func:`_train_lm`), with ``out`` opened by
    :func:`mlpinterp.utils.rundir.open_run` (one writer; the configuration compared on every resume)."""
    check_instance(cfg, LmTrainConfig, "cfg")
    with open_run(check_out_dir(out), "train-lm", cfg.to_dict(), implicit=ADDED_FIELDS):
        return _train_lm(cfg, out, text_dir=text_dir, quiet=quiet, threads=threads)


def _train_lm(cfg: LmTrainConfig, out: str | os.PathLike, *, text_dir: str | os.PathLike | None = None,
              quiet: bool = False, threads: int | None = 1) -> dict:
    """Train the tokenizer and the causal LM of ``cfg`` on the documents of ``text_dir`` into ``out``; returns the
    metrics written to ``out/metrics.json``.

    ``threads``: torch CPU threads while training (restored afterwards; ``None`` keeps torch's setting);
    bit-identical resumption needs the same value. Metrics: ``held_out`` (``ce`` in nats/token, ``perplexity`` =
    exp(ce), ``tokens``, ``chunks``, ``files``), ``train`` (``tokens_seen``, ``train_tokens`` in the corpus,
    ``epochs``, ``seconds``, ``tokens_per_second``, ``final_loss``), ``model`` (parameters, vocabulary size),
    ``history`` (per step loss and lr; held-out CE every ``eval_every`` steps), ``load_average``, ``threads``.

    Raises ``TypeError`` for a ``cfg`` that is not an :class:`LmTrainConfig`, ``FileNotFoundError`` /
    ``ValueError`` for a missing or empty text directory, ``ValueError`` when the training documents give fewer
    chunks than ``batch_size`` or the held-out ones no chunk of ``n_positions`` tokens, for a corrupt checkpoint,
    and :class:`mlpinterp.models.RunConflictError` (a ``ValueError``) when ``out`` holds a run of other settings.
    """
    check_instance(cfg, LmTrainConfig, "cfg")
    if threads is not None:
        check_int(threads, "threads", minimum=1)
    out = check_out_dir(out)
    train_files, held_files = split_files(text_dir)
    train_texts, held_texts = read_texts(train_files), read_texts(held_files)
    corpus = {"train_digest": texts_digest(train_texts), "held_out_digest": texts_digest(held_texts),
              "train_files": [f.name for f in train_files], "held_out_files": [f.name for f in held_files]}
    ckpt = _checkpoint_path(out)
    saved = None
    if ckpt.exists() and ckpt.with_suffix(".json").exists():
        _, saved = _load_checkpoint(ckpt)
        digests = [k for k in corpus if k.endswith("digest")]
        diff = config_diff(saved.get("config", {}), cfg.to_dict(), implicit=ADDED_FIELDS)
        diff.update(config_diff({k: v for k, v in saved.get("corpus", {}).items() if k in digests},
                                {k: corpus[k] for k in digests}))
        if diff:
            raise RunConflictError(out, "a train-lm checkpoint", diff,
                                   fix="pass the saved settings to resume that run, or choose another --out (or "
                                       f"delete {str(out)!r})")
        if saved.get("step") == cfg.steps and (out / "metrics.json").exists():
            return read_output(out / "metrics.json", what="metrics")
    out.mkdir(parents=True, exist_ok=True)
    tok = _load_tokenizer(out, saved["tokenizer_digest"]) if saved else \
        train_tokenizer(train_texts, cfg.vocab_size, cfg.tokenizer_min_frequency)
    train_ids = token_chunks(tok, train_texts, cfg.n_positions)
    try:
        held_ids = token_chunks(tok, held_texts, cfg.n_positions, cfg.eval_chunks or None)
    except ValueError as e:
        raise ValueError(f"held-out documents {corpus['held_out_files']}: {e}") from e
    if train_ids.shape[0] < cfg.batch_size:
        raise ValueError(f"batch_size {cfg.batch_size} exceeds the {train_ids.shape[0]} training chunks of "
                         f"n_positions={cfg.n_positions} tokens in {corpus['train_files']}")
    threads_before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            return _train(cfg, out, tok, train_ids, held_ids, corpus, saved, quiet, torch.get_num_threads())
    finally:
        torch.set_num_threads(threads_before)


def _train(cfg, out, tok, train_ids, held_ids, corpus, saved, quiet, threads) -> dict:
    torch.manual_seed(cfg.seed)
    model = _model(cfg, len(tok), tok.eos_token_id)
    opt = _optimizer(cfg, model)
    step, history, seconds, ckpt = 0, {"loss": [], "lr": [], "eval": []}, 0.0, _checkpoint_path(out)
    if saved is not None:
        tensors, _ = _load_checkpoint(ckpt)
        _restore(ckpt, model, opt, tensors)
        step, history, seconds = int(saved["step"]), saved["history"], float(saved["seconds"])
    else:
        _save_hf(out, None, tok)  # the tokenizer is on disk before the first checkpoint refers to it
    meta = {"config": cfg.to_dict(), "corpus": corpus, "tokenizer_digest": tokenizer_digest(tok), "threads": threads}
    cache: dict = {}
    n_chunks = train_ids.shape[0]
    t0 = time.perf_counter()
    model.train()
    with progress_bar(total=cfg.steps, initial=step, desc="train-lm", quiet=quiet) as bar:
        while step < cfg.steps:
            lr = lr_at(cfg, step)
            for g in opt.param_groups:
                g["lr"] = lr
            ids = train_ids[torch.from_numpy(epoch_batch_indices(cfg.seed, n_chunks, cfg.batch_size, step, cache))]
            loss = _step(model, opt, ids, cfg.grad_clip, step + 1, lr)
            step += 1
            history["loss"].append(loss)
            history["lr"].append(lr)
            if cfg.eval_every and step % cfg.eval_every == 0:
                ce = held_out_ce(model, held_ids[:cfg.eval_progress_chunks])
                model.train()
                history["eval"].append({"step": step, "ce": ce})
            bar.advance()
            bar.postfix(loss=loss, **({"held_out_ce": history["eval"][-1]["ce"]} if history["eval"] else {}))
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                check_params_finite("train-lm", step, model, lr)
                _save_checkpoint(out, model, opt, {**meta, "step": step, "history": history,
                                                   "seconds": seconds + time.perf_counter() - t0})
    seconds += time.perf_counter() - t0
    model.eval()
    _save_hf(out, model, tok)
    ce = held_out_ce(model, held_ids)
    tokens_seen = cfg.steps * cfg.batch_size * cfg.n_positions
    metrics = {
        "held_out": {"ce": ce, "perplexity": math.exp(ce), "chunks": int(held_ids.shape[0]),
                     "tokens": int(held_ids.shape[0] * (cfg.n_positions - 1)), "files": corpus["held_out_files"]},
        "train": {"tokens_seen": tokens_seen, "train_tokens": int(n_chunks * cfg.n_positions),
                  "epochs": tokens_seen / (n_chunks * cfg.n_positions), "seconds": seconds,
                  "tokens_per_second": tokens_seen / seconds if seconds > 0 else float("nan"),
                  "final_loss": history["loss"][-1], "files": corpus["train_files"]},
        "model": {"parameters": sum(p.numel() for p in model.parameters()), "vocab_size": len(tok),
                  "architecture": "GPT2LMHeadModel"},
        "config": cfg.to_dict(), "history": history, "threads": threads, "load_average": list(os.getloadavg()),
        "tokenizer_digest": meta["tokenizer_digest"],
    }
    write_output(out / "metrics.json", metrics)
    return metrics


def _step(model: nn.Module, opt: torch.optim.Optimizer, ids: Tensor, grad_clip: float, step: int, lr: float) -> float:
    """One AdamW step (the ``step``-th, at learning rate ``lr``) on the next-token cross-entropy of ``ids``; returns
    the loss (nats/token). Raises :class:`~mlpinterp.utils.checkpoint.TrainingDiverged` before stepping on a
    non-finite loss."""
    loss = next_token_ce(model, ids)
    check_loss_finite("train-lm", step, float(loss.detach()), lr)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return float(loss.detach())
