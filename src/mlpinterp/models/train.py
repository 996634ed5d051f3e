"""Training one-hidden-layer classifiers with schedule-free AdamW and resumable, atomic checkpoints.

Follows Rigg & Belrose (2025, arXiv 2502.01032, §4): schedule-free AdamW (Defazio et al. 2024,
``schedulefree.AdamWScheduleFree``), linear warm-up, batch 64, weight decay 0.1, checkpoints at
log-spaced steps. Each checkpoint stores the *evaluation* weights x (the schedule-free average),
which are the weights a user should analyse.

Files in ``out_dir``:

* ``step_{step:07d}.safetensors`` + ``.json``: model weights (eval mode) and metadata (step, seed,
  train/test accuracy, train/test loss in nats, config, dataset, cumulative wall time);
* ``optim_{step:07d}.safetensors`` + ``.json``: the training state (train-mode weights y, the
  optimiser's z and second moments, its step counter and weight sums). Only the newest is kept.

Determinism and resumption: the batch order of epoch ``e`` is a permutation drawn from
``numpy.random.default_rng([seed, e])`` (a pure function of the seed and the epoch, so no
generator state needs saving), the initialisation uses ``torch.manual_seed(seed)`` in a forked RNG,
and evaluating at a checkpoint restores the train-mode weights bit for bit. Hence re-running
``train_classifier`` on the same ``out_dir`` after an interruption, or with a larger ``steps``,
yields weights bit-identical to one uninterrupted run (same device, torch build and number of
CPU threads: BLAS kernels may sum in a different order with a different thread count).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import schedulefree
import torch
from torch import nn

from mlpinterp.data.dataset import Dataset
from mlpinterp.models.classifier import Classifier, ClassifierConfig
from mlpinterp.models.config import ADDED_FIELDS
from mlpinterp.utils.artifact import ArtifactError, load_artifact, save_artifact
from mlpinterp.utils.batches import epoch_batch_indices
from mlpinterp.utils.checkpoint import (
    TrainingDiverged,
    check_loss_finite,
    check_params_finite,
    optimizer_tensors,
    restore_optimizer,
    split_optimizer_tensors,
)
from mlpinterp.utils.config_diff import config_diff
from mlpinterp.utils.progress import progress_bar
from mlpinterp.utils.rundir import RunConflictError, open_run
from mlpinterp.utils.validation import check_device

CHECKPOINT_KIND = "classifier_checkpoint"
"""Artifact kind of the eval-mode weights ``step_N.safetensors`` (:mod:`mlpinterp.utils.artifact`)."""

STATE_KIND = "classifier_training_state"
"""Artifact kind of the training state ``optim_N.safetensors``."""

_RECOMPUTE = "delete it (and its .json) and rerun: missing checkpoints are recomputed (bit-identical)"

_STEP_RE = re.compile(r"^step_(\d{7,})\.json$")
_EVAL_CHUNK = 8192


def checkpoint_steps(max_steps: int) -> list[int]:
    """Log-spaced checkpoint steps: ``2^k`` and ``1.5 * 2^k`` for ``k >= 4``, up to ``max_steps``.

    Returns the sorted list ``[16, 24, 32, 48, 64, 96, ...]`` truncated at ``max_steps`` and always
    ending with ``max_steps`` itself (e.g. ``checkpoint_steps(200) == [16, 24, 32, 48, 64, 96, 128,
    192, 200]``; ``checkpoint_steps(10) == [10]``).

    Raises ``ValueError`` unless ``max_steps`` is a positive int.
    """
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive int, got {max_steps!r}")
    max_steps = int(max_steps)
    out = []
    k = 4
    while 2**k <= max_steps:
        out.append(2**k)
        if 3 * 2 ** (k - 1) <= max_steps:
            out.append(3 * 2 ** (k - 1))
        k += 1
    if not out or out[-1] != max_steps:
        out.append(max_steps)
    return out


def checkpoint_path(out_dir: str | os.PathLike, step: int) -> Path:
    """``out_dir/step_{step:07d}.safetensors``."""
    return Path(out_dir) / f"step_{step:07d}.safetensors"


def _optim_path(out_dir: Path, step: int) -> Path:
    return out_dir / f"optim_{step:07d}.safetensors"


def find_checkpoints(out_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``out_dir`` as sorted ``(step, safetensors_path)`` pairs.

    A checkpoint is complete when both ``step_N.safetensors`` and ``step_N.json`` exist (the JSON is
    written last, atomically). Returns ``[]`` if ``out_dir`` does not exist.
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    found = []
    for p in out_dir.iterdir():
        m = _STEP_RE.match(p.name)
        if m and p.with_suffix(".safetensors").is_file():
            found.append((int(m.group(1)), p.with_suffix(".safetensors")))
    return sorted(found)


@torch.no_grad()
def _evaluate(model: Classifier, X: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Accuracy (fraction) and mean cross-entropy (nats) over the whole split."""
    correct = 0
    loss = 0.0
    for i in range(0, X.shape[0], _EVAL_CHUNK):
        logits = model(X[i : i + _EVAL_CHUNK])
        yy = y[i : i + _EVAL_CHUNK]
        correct += int((logits.argmax(1) == yy).sum())
        loss += float(nn.functional.cross_entropy(logits.double(), yy, reduction="sum"))
    return correct / X.shape[0], loss / X.shape[0]


def _optimizer_tensors(model: Classifier, opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """The train-mode weights ``y.*`` and the optimiser state ``opt.*`` as tensors, its param groups (the
    schedule-free weight sums and learning rates) as metadata."""
    tensors = {f"y.{name}": p.detach().clone() for name, p in model.named_parameters()}
    tensors.update(optimizer_tensors(opt, "opt"))
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.state_dict()["param_groups"]]
    return tensors, {"param_groups": groups}


def _restore_optimizer(model: Classifier, opt: torch.optim.Optimizer, path: Path) -> None:
    fix = "delete it (and its .json) and rerun: training restarts and recomputes the checkpoints bit-identically"
    art = load_artifact(path, kind=STATE_KIND, fix=fix, what="optimizer state")
    tensors, meta = art.tensors, art.meta
    try:
        state, unknown = split_optimizer_tensors(tensors, opt, "opt")
        if unknown:
            raise KeyError(f"optimiser state of no parameter: {unknown[:3]}")
        groups = meta["param_groups"]
        for g in groups:
            g["betas"] = tuple(g["betas"])
        restore_optimizer(opt, state, groups)
        with torch.no_grad():
            params = dict(model.named_parameters())
            if set(params) != {k[2:] for k in tensors if k.startswith("y.")}:
                raise KeyError("train-mode weights do not match the model's parameters")
            for name, p in params.items():
                p.copy_(tensors[f"y.{name}"])
    except (KeyError, ValueError, TypeError, RuntimeError) as e:
        raise ValueError(f"optimizer state {str(path)!r} is invalid or does not match the config ({e}); {fix}") from e
    for g in opt.param_groups:
        g["train_mode"] = True


def _read_meta(path: Path) -> dict:
    """The verified metadata of checkpoint ``path`` (``step_N.safetensors``); :class:`ArtifactError` if it is corrupt,
    incomplete or not an object."""
    art = load_artifact(path, kind=CHECKPOINT_KIND, fix=_RECOMPUTE, what="checkpoint")
    if not isinstance(art.meta, dict):
        raise ArtifactError(path.with_suffix(".json"), f"must be a JSON object, got {type(art.meta).__name__}",
                            _RECOMPUTE, "checkpoint metadata")
    return art.meta


def _run_diff(meta: dict, cfg: ClassifierConfig, data: Dataset) -> dict[str, tuple]:
    """``{field: (saved, requested)}`` for every setting (other than ``steps``) where a checkpoint differs (a field
    the checkpoint was written before compares as its :data:`~mlpinterp.models.config.ADDED_FIELDS` value)."""
    diff = config_diff(meta.get("config") or {}, cfg.to_dict(), ignore={"steps"}, implicit=ADDED_FIELDS)
    if meta.get("dataset") != data.name:
        diff["dataset"] = (meta.get("dataset"), data.name)
    return diff


def train_classifier(
    cfg: ClassifierConfig,
    data: Dataset,
    out_dir: str | os.PathLike,
    *,
    progress: bool = True,
    device: str | torch.device = "cpu",
    threads: int | None = 1,
) -> list[Path]:
    """Train a classifier on ``data`` and write checkpoints at :func:`checkpoint_steps` ``(cfg.steps)``.

    Minimises the mean cross-entropy of ``Classifier(cfg)`` with ``schedulefree.AdamWScheduleFree``
    (``lr``, ``weight_decay``, ``warmup_steps`` from ``cfg``, betas (0.9, 0.999)) on batches of
    ``cfg.batch_size`` drawn epoch by epoch without replacement. At each checkpoint step the
    schedule-free average x is evaluated on the full train and test sets and saved; training then
    continues from the unchanged train-mode weights.

    Re-running with the same ``out_dir`` resumes from the newest complete checkpoint that has its
    training state, skipping finished work (a finished run returns at once); the result is
    bit-identical to an uninterrupted run. ``cfg.steps`` may be raised between runs to extend
    training (a finished run is extended from its last checkpoint) or lowered (the checkpoints up to the new
    ``steps`` are already there); every other field must match the checkpoints already in ``out_dir``.
    ``cfg.warmup_steps`` is used as given, also when it exceeds ``cfg.steps`` (the learning rate then ramps for
    the whole run and never reaches ``cfg.lr``); it is never clamped, so a short run can later be extended.

    Parameters
    ----------
    cfg
        Architecture and hyper-parameters; ``cfg.d_in``/``cfg.n_classes`` must match ``data``.
    data
        Training and test data.
    out_dir
        Directory for the checkpoints (created if needed).
    progress
        Show a progress bar (with the latest test accuracy).
    device
        Torch device for training; checkpoints are stored on CPU.
    threads
        Torch intra-op CPU threads while training (restored afterwards). One thread is fastest for these
        small per-step workloads (more threads cost more in synchronisation than they save); ``None`` keeps
        torch's setting. Bit-identical resumption needs the same value.

    Returns
    -------
    list[Path]
        The ``step_*.safetensors`` paths of this run's checkpoint steps, in step order.

    Raises
    ------
    TypeError
        ``cfg`` or ``data`` of the wrong type.
    ValueError
        ``cfg`` does not match ``data`` (d_in, n_classes), fewer training examples than
        ``batch_size``, ``device`` not a device of this machine (e.g. ``"cuda"`` without CUDA), or a resumed
        checkpoint is corrupt (the message says which file to delete).
    RunConflictError
        ``out_dir`` holds checkpoints of a different run (a ``ValueError``; ``.diff`` and ``.fix`` say how).
    """
    if not isinstance(cfg, ClassifierConfig):
        raise TypeError(f"cfg must be a ClassifierConfig, got {type(cfg).__name__}")
    if not isinstance(data, Dataset):
        raise TypeError(f"data must be a mlpinterp.data.Dataset, got {type(data).__name__}")
    if cfg.d_in != data.d_in or cfg.n_classes != data.n_classes:
        raise ValueError(
            f"cfg (d_in={cfg.d_in}, n_classes={cfg.n_classes}) does not match data {data.name!r} "
            f"(d_in={data.d_in}, n_classes={data.n_classes})"
        )
    if data.n_train < cfg.batch_size:
        raise ValueError(f"batch_size {cfg.batch_size} exceeds the {data.n_train} training examples")
    dev = check_device(device)
    out_dir = Path(out_dir)
    fresh = not out_dir.exists()
    try:
        with open_run(out_dir, "train", {**cfg.to_dict(), "dataset": data.name}, resumable=("steps",),
                      implicit=ADDED_FIELDS):
            return _train_locked(cfg, data, out_dir, progress, dev, threads)
    except TrainingDiverged as e:
        if fresh:  # a run that diverged leaves nothing behind (its earlier checkpoints belong to a useless run)
            shutil.rmtree(out_dir, ignore_errors=True)
            e.fix = f"rerun with a lower --lr (lr = {cfg.lr:g}); nothing was written to {str(out_dir)!r}"
        raise


def _train_locked(cfg: ClassifierConfig, data: Dataset, out_dir: Path, progress: bool, device: torch.device,
                  threads: int | None) -> list[Path]:
    """:func:`train_classifier` once ``out_dir`` is open (locked, its configuration checked)."""
    targets = checkpoint_steps(cfg.steps)
    paths = [checkpoint_path(out_dir, s) for s in targets]

    # Existing checkpoints must belong to this run; find the newest one we can resume from.
    existing = find_checkpoints(out_dir)
    resume_step, resume_meta = 0, None
    for step, path in existing:
        meta = _read_meta(path)
        diff = _run_diff(meta, cfg, data)
        if diff:
            raise RunConflictError(out_dir, f"checkpoint {path.name}", diff)
        if (
            step <= cfg.steps
            and _optim_path(out_dir, step).is_file()
            and _optim_path(out_dir, step).with_suffix(".json").is_file()
        ):
            resume_step, resume_meta = step, meta
    done = {s for s, _ in existing}
    if all(s in done for s in targets):
        return paths

    model = Classifier(cfg).to(device)
    opt = schedulefree.AdamWScheduleFree(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, warmup_steps=cfg.warmup_steps
    )
    wall0 = 0.0
    if resume_step > 0:
        _restore_optimizer(model, opt, _optim_path(out_dir, resume_step))
        wall0 = float(resume_meta.get("wall_time_s", 0.0))
    else:
        opt.train()
    model.train()

    X_train = torch.tensor(data.X_train, device=device)
    y_train = torch.tensor(data.y_train, device=device)
    X_test = torch.tensor(data.X_test, device=device)
    y_test = torch.tensor(data.y_test, device=device)
    perm_cache: dict = {}
    todo = set(targets)
    t_start = time.perf_counter()
    threads_before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with progress_bar(total=cfg.steps, initial=resume_step, desc=f"train {data.name}", quiet=not progress) as bar:
            for t in range(resume_step, cfg.steps):
                idx = torch.from_numpy(epoch_batch_indices(cfg.seed, data.n_train, cfg.batch_size, t, perm_cache)).to(device)
                loss = nn.functional.cross_entropy(model(X_train[idx]), y_train[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                step = t + 1
                check_loss_finite("classifier", step, float(loss.detach()), cfg.lr)  # before the step: nothing diverged is kept
                opt.step()
                bar.advance()
                if step in todo:
                    check_params_finite("classifier", step, model, cfg.lr)
                    metrics = _checkpoint(
                        model,
                        opt,
                        cfg,
                        data,
                        out_dir,
                        step,
                        (X_train, y_train, X_test, y_test),
                        wall0 + time.perf_counter() - t_start,
                    )
                    bar.postfix(test_acc=float(metrics['test_accuracy']))
    finally:
        torch.set_num_threads(threads_before)
    return paths


def _checkpoint(model, opt, cfg, data, out_dir, step, tensors, wall) -> dict:
    """Save the training state, then the eval-mode weights + metrics; restore train mode exactly."""
    X_train, y_train, X_test, y_test = tensors
    opt_tensors, opt_meta = _optimizer_tensors(model, opt)
    optim_path = _optim_path(out_dir, step)
    save_artifact(optim_path, opt_tensors, kind=STATE_KIND, meta={"step": step, **opt_meta},
                  provenance={"step": step})
    y_weights = [p.detach().clone() for p in model.parameters()]
    opt.eval()  # parameters <- schedule-free average x
    model.eval()
    train_acc, train_loss = _evaluate(model, X_train, y_train)
    test_acc, test_loss = _evaluate(model, X_test, y_test)
    meta = {
        "step": step,
        "seed": cfg.seed,
        "train_accuracy": train_acc,
        "train_loss": train_loss,
        "test_accuracy": test_acc,
        "test_loss": test_loss,
        "config": cfg.to_dict(),
        "dataset": data.name,
        "dataset_description": data.description,
        "wall_time_s": wall,
        "torch_version": torch.__version__,
    }
    save_artifact(checkpoint_path(out_dir, step), dict(model.state_dict()), kind=CHECKPOINT_KIND, meta=meta,
                  provenance={"step": step, "dataset": data.name, "seed": cfg.seed})
    with torch.no_grad():  # back to the exact train-mode weights y (no lerp round trip)
        for p, y in zip(model.parameters(), y_weights, strict=True):
            p.copy_(y)
    for g in opt.param_groups:
        g["train_mode"] = True
    model.train()
    for p in out_dir.glob("optim_*.safetensors"):  # keep only the newest training state
        m = re.match(r"^optim_(\d+)\.safetensors$", p.name)
        if m and int(m.group(1)) < step:
            p.unlink(missing_ok=True)
            p.with_suffix(".json").unlink(missing_ok=True)
    return meta


def load_classifier(path: str | os.PathLike, config: ClassifierConfig | None = None, *,
                    provenance: dict | None = None) -> tuple[Classifier, dict]:
    """Load a checkpoint written by :func:`train_classifier`.

    Parameters
    ----------
    path
        ``step_N.safetensors`` (or its ``.json`` sibling, or the path without suffix).
    config
        If given, the checkpoint's config must equal it.
    provenance
        If given, the recorded provenance (``step``, ``dataset``, ``seed``) must hold these values.

    Returns
    -------
    (Classifier, dict)
        The model in eval mode on CPU holding the schedule-free average weights, and the metadata.

    Raises
    ------
    FileNotFoundError
        Missing ``.safetensors`` or ``.json`` file.
    ArtifactError
        (a ``ValueError``) Corrupt, truncated or edited files (the SHA-256 over tensors and metadata), a file of
        another kind or of a newer mlpinterp, or a provenance other than ``provenance``.
    ValueError
        Metadata without a valid config, tensors whose names or shapes do not match the config, non-finite
        weights, or a config different from ``config``.
    """
    path = Path(path)
    if path.suffix in (".json", ""):
        path = path.with_suffix(".safetensors")
    if not path.with_suffix(".json").is_file():
        raise FileNotFoundError(f"checkpoint metadata {str(path.with_suffix('.json'))!r} does not exist")
    art = load_artifact(path, kind=CHECKPOINT_KIND, provenance=provenance, fix=_RECOMPUTE, what="checkpoint")
    tensors, meta = art.tensors, art.meta
    if not isinstance(meta, dict) or "config" not in meta:
        raise ValueError(f"checkpoint metadata {str(path.with_suffix('.json'))!r} has no 'config'")
    cfg = ClassifierConfig.from_dict(meta["config"])
    if config is not None:
        if not isinstance(config, ClassifierConfig):
            raise TypeError(f"config must be a ClassifierConfig or None, got {type(config).__name__}")
        if config != cfg:
            a, b = cfg.to_dict(), config.to_dict()
            diff = ", ".join(f"{k}: {a[k]!r} != {b[k]!r}" for k in a if a[k] != b[k])
            raise ValueError(f"checkpoint {str(path)!r} config mismatch ({diff})")
    model = Classifier(cfg)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if want != got:
        raise ValueError(f"checkpoint {str(path)!r} tensors {got} do not match its config, which needs {want}")
    for k, v in tensors.items():
        if not v.dtype.is_floating_point:
            raise ValueError(
                f"checkpoint {str(path)!r} tensor {k!r} has dtype {v.dtype}; weights must have a real floating dtype"
            )
        if not torch.isfinite(v).all():
            raise ValueError(f"checkpoint {str(path)!r} tensor {k!r} has non-finite values")
    model.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()})
    model.eval()
    return model, meta
