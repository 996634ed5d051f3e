"""Saved TopK SAEs: the sparsify and SAELens layouts, where the SAE was trained, and their verification.

An SAE written here is the artifact ``sae`` (:mod:`mlpinterp.utils.artifact`): the weights file's safetensors
``__metadata__`` header (which SAELens and sparsify ignore) holds the format, kind, provenance and a SHA-256 over the
tensors AND the canonical ``cfg.json``, so a changed bit in either file is refused by :func:`load_sae`.

Layouts (written atomically, weights first and ``cfg.json`` last):

* ``"sparsify"``: ``sae.safetensors`` (``encoder.weight [d_sae, d_in]``, ``encoder.bias``, ``W_dec [d_sae, d_in]``,
  ``b_dec``) + ``cfg.json`` with EleutherAI sparsify's keys (``activation``, ``num_latents``, ``k``, ``transcode``,
  ``skip_connection``, ..., ``d_in``): ``sparsify.SparseCoder.load_from_disk`` reads it.
* ``"saelens"``: ``sae_weights.safetensors`` (``W_enc [d_in, d_sae]``, ``b_enc``, ``W_dec``, ``b_dec``) +
  ``cfg.json`` with SAELens 6 keys (``architecture="topk"``, ``k``, ``apply_b_dec_to_input``,
  ``normalize_activations``, ``metadata.hook_name``, ...): ``sae_lens.SAE.load_from_disk`` reads it.

Our keys sit beside theirs (both libraries drop unknown keys): every :class:`~mlpinterp.sae.topk.SaeConfig`
field, ``layout``, ``model_name``, ``hook_point``, ``d_in``, ``dtype``, ``input_scale`` and ``input_scale_folded``.
A ``cfg.json`` with our keys (or a weights file with the artifact header) is verified as an artifact; an
mlpinterp SAE written before the header (``mlpinterp_format`` 1 or 2 in ``cfg.json``, a ``weights_sha256`` over the
tensors only) loads only with ``verify_hash=False``.

Input normalisation is *folded* into the written weights (``W_enc * s``, ``W_dec / s``, ``b_dec / s``, as SAELens's
``fold_activation_norm_scaling_factor``), so any loader computes the same function of the raw activations;
:func:`load_sae` unfolds it again (``input_scale_folded``) to restore the trained parametrisation.

Loading a file written by sparsify or SAELens honours every field that changes the computation, or refuses
it by name (``ValueError``):

* SAELens: ``architecture`` (only ``topk``; pre-6 files: ``activation_fn[_str]`` + ``activation_fn_kwargs.k``),
  ``apply_b_dec_to_input`` (our ``pre_bias``), ``rescale_acts_by_decoder_norm`` (folded into the weights: exact),
  ``normalize_activations`` (only ``none``: ``expected_average_only_in`` needs a factor SAELens does not store,
  ``layer_norm`` / ``constant_norm_rescale`` / ``covariance_whitening`` are not implemented here),
  ``reshape_activations`` (only ``none``), ``hook_head_index`` (only null), ``dtype`` (the weights are cast to
  it, as SAELens does); ``metadata.hook_name`` / ``hook_name`` and ``model_name`` are recorded as the SAE's
  ``hook_point`` / ``model_name``.
* sparsify: ``activation`` (only ``topk``), ``transcode`` and ``skip_connection`` / ``W_skip`` (refused);
  sparsify always subtracts ``b_dec`` before encoding (``pre_bias=True``).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import asdict, fields
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from mlpinterp.sae.topk import SaeConfig, TopKSae
from mlpinterp.utils.artifact import (
    Artifact,
    ArtifactError,
    has_envelope,
    load_artifact,
    read_safetensors,
    save_artifacts,
)

KIND = "sae"
"""Artifact kind of the SAEs written here."""

SAELENS_FORMAT = "6.0.0"
"""``metadata.sae_lens_version`` written into SAELens-layout files: the cfg.json format (SAELens >= 6)."""

_WEIGHT_FILES = {"sparsify": "sae.safetensors", "saelens": "sae_weights.safetensors"}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _reserved_keys() -> set[str]:
    return ({f.name for f in fields(SaeConfig)} | {
        "d_in", "num_latents", "layout", "architecture", "mlpinterp_format", "model_name", "hook_point", "dtype",
        "input_scale", "input_scale_folded", "weights_sha256", "expansion_factor", "activation", "multi_topk",
        "skip_connection", "transcode", "apply_b_dec_to_input", "normalize_activations", "reshape_activations",
        "rescale_acts_by_decoder_norm", "metadata", "activation_fn_kwargs", "device", "hook_name"})


# ----------------------------------------------------------------------------- saving
def save_sae(sae: TopKSae, path: str | os.PathLike, layout: Literal["sparsify", "saelens"] = "sparsify",
             extra_cfg: dict | None = None, provenance: dict | None = None) -> Path:
    """Write ``sae`` to directory ``path`` in ``layout`` (see the module docstring) and return ``path``;
    ``provenance``: what it was trained from (e.g. the training step), recorded in the artifact header. Raises as
    :func:`sae_artifact`, and :class:`~mlpinterp.utils.io.WriteError` when the write fails."""
    save_artifacts([sae_artifact(sae, path, layout, extra_cfg, provenance)])
    return Path(path)


def sae_artifact(sae: TopKSae, path: str | os.PathLike, layout: Literal["sparsify", "saelens"] = "sparsify",
                 extra_cfg: dict | None = None, provenance: dict | None = None) -> Artifact:
    """The artifact :func:`save_sae` writes into directory ``path``: ``sae``'s weights (copied, input scale folded
    in) and ``cfg.json`` in ``layout``, for :func:`~mlpinterp.utils.artifact.save_artifacts` (e.g. with the other
    files of a training checkpoint, written together).

    Raises
    ------
    TypeError
        If ``extra_cfg`` is not a dict.
    ValueError
        If ``layout`` is unknown, ``extra_cfg`` would override a key of the format, or ``layout="sparsify"`` is
        asked for an SAE with ``pre_bias=False`` (sparsify always subtracts ``b_dec``: use ``"saelens"``).
    """
    path = Path(path)
    if extra_cfg is not None and not isinstance(extra_cfg, dict):
        raise TypeError(f"extra_cfg must be a dict or None, got {type(extra_cfg).__name__}")
    reserved = sorted(set(extra_cfg or {}) & _reserved_keys())
    if reserved:
        raise ValueError(f"extra_cfg must not override the SAE's own cfg.json keys, got {reserved}")
    if layout not in _WEIGHT_FILES:
        raise ValueError(f"layout must be 'sparsify' or 'saelens', got {layout!r}")
    if layout == "sparsify" and not sae.cfg.pre_bias:
        raise ValueError("layout='sparsify' cannot hold an SAE with pre_bias=False: sparsify always subtracts b_dec "
                         "from the input; save it with layout='saelens' (apply_b_dec_to_input=false)")
    s, dtype = sae.input_scale, sae.dtype

    def folded(t: Tensor, factor: float) -> Tensor:
        t = t.detach().cpu()
        return t.clone().contiguous() if factor == 1.0 else (t.double() * factor).to(dtype).contiguous()

    w_enc, b_enc = folded(sae.encoder.weight, s), folded(sae.encoder.bias, 1.0)
    w_dec, b_dec = folded(sae.W_dec, 1 / s), folded(sae.b_dec, 1 / s)
    if layout == "sparsify":
        tensors = {"encoder.weight": w_enc, "encoder.bias": b_enc, "W_dec": w_dec, "b_dec": b_dec}
    else:
        tensors = {"W_enc": w_enc.t().contiguous(), "b_enc": b_enc, "W_dec": w_dec, "b_dec": b_dec}
    cfg = {**asdict(sae.cfg), "d_in": sae.d_in, "num_latents": sae.cfg.d_sae, "architecture": "topk",
           "layout": layout, "model_name": sae.model_name,
           "hook_point": sae.hook_point, "dtype": _dtype_name(dtype), "input_scale": s, "input_scale_folded": True}
    if layout == "sparsify":
        cfg.update({"activation": "topk", "expansion_factor": max(1, sae.cfg.d_sae // sae.d_in), "multi_topk": False,
                    "skip_connection": False, "transcode": False})
    else:
        cfg.update({"device": "cpu", "apply_b_dec_to_input": sae.cfg.pre_bias, "normalize_activations": "none",
                    "reshape_activations": "none", "rescale_acts_by_decoder_norm": False,
                    "activation_fn_kwargs": {"k": sae.cfg.k},
                    "metadata": {"model_name": sae.model_name, "hook_name": sae.hook_point, "hook_head_index": None,
                                 "sae_lens_version": SAELENS_FORMAT, "sae_lens_training_version": None}})
    cfg.update(extra_cfg or {})
    return Artifact(tensors, cfg, provenance, KIND, path / _WEIGHT_FILES[layout], meta_path=path / "cfg.json")


# ----------------------------------------------------------------------------- loading
def _refuse(where: str, key: str, value, why: str) -> ValueError:
    return ValueError(f"cfg.json {where}: {key}={value!r} is not supported ({why})")


def _saelens_fields(raw: dict, where: str) -> dict:
    """Computation-changing fields of a SAELens cfg.json (either the 6.x or the pre-6 format), checked."""
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else {}
    arch = raw.get("architecture")
    act = raw.get("activation_fn", raw.get("activation_fn_str"))
    if arch is None:  # pre-6 SAELens: the architecture follows from the activation function
        arch = "topk" if act == "topk" else "standard"
    if arch != "topk":
        raise _refuse(where, "architecture", arch, "only TopK SAEs load here; JumpReLU / standard / gated / "
                      "batchtopk SAEs compute a different function")
    if act not in (None, "topk"):
        raise _refuse(where, "activation_fn", act, "a TopK SAE needs activation_fn 'topk'")
    for key, ok in (("normalize_activations", "none"), ("reshape_activations", "none")):
        v = raw.get(key, ok)
        if v != ok:
            why = ("SAELens does not store the scaling factor with the SAE; fold it into the weights with "
                   "SAE.fold_activation_norm_scaling_factor(factor) and save again"
                   if v == "expected_average_only_in" else f"only {ok!r} is implemented here")
            raise _refuse(where, key, v, why)
    head = raw.get("hook_head_index", meta.get("hook_head_index"))
    if head is not None:
        raise _refuse(where, "hook_head_index", head, "single-head SAEs read part of a hook point")
    apply = raw.get("apply_b_dec_to_input", True)
    if not isinstance(apply, bool):
        raise ValueError(f"cfg.json {where}: 'apply_b_dec_to_input' must be a bool, got {apply!r}")
    if "pre_bias" in raw and raw["pre_bias"] != apply:
        raise ValueError(f"cfg.json {where}: pre_bias={raw['pre_bias']!r} contradicts "
                         f"apply_b_dec_to_input={apply!r}")
    rescale = raw.get("rescale_acts_by_decoder_norm", False)
    if not isinstance(rescale, bool):
        raise ValueError(f"cfg.json {where}: 'rescale_acts_by_decoder_norm' must be a bool, got {rescale!r}")
    hook = meta.get("hook_name") or raw.get("hook_name") or raw.get("hook_point")
    model = meta.get("model_name") or raw.get("model_name")
    return {"pre_bias": apply, "rescale": rescale, "hook_point": hook, "model_name": model}


def _sparsify_fields(raw: dict, tensors: dict, where: str, ours: bool) -> dict:
    act = raw.get("activation", "topk")
    if act != "topk":
        raise _refuse(where, "activation", act, "only TopK is implemented here (groupmax selects differently)")
    if raw.get("transcode", False):
        raise _refuse(where, "transcode", raw["transcode"], "a transcoder predicts another module's output")
    if raw.get("skip_connection", False) or "W_skip" in tensors:
        raise _refuse(where, "skip_connection", raw.get("skip_connection", True),
                      "the skip connection W_skip adds a dense linear term to the output")
    # sparsify itself always subtracts b_dec; our own older files may say otherwise
    return {"pre_bias": raw.get("pre_bias", True) if ours else True, "rescale": False,
            "hook_point": raw.get("hook_point"), "model_name": raw.get("model_name")}


def load_sae(path: str | os.PathLike, device: str | torch.device = "cpu", *, verify_hash: bool = True) -> TopKSae:
    """Load an SAE written by :func:`save_sae`, by sparsify or by SAELens (directory ``path``).

    An SAE written by mlpinterp is verified as an artifact (the SHA-256 over the weights and ``cfg.json``, the
    format, the kind); ``verify_hash=False`` skips the hash check (only for deliberately edited files, and for
    mlpinterp SAEs written before the artifact header).

    Raises
    ------
    FileNotFoundError
        If ``path`` holds neither ``sae.safetensors`` nor ``sae_weights.safetensors``, or no ``cfg.json``.
    ArtifactError
        (a ``ValueError``) If an mlpinterp SAE's files are corrupt, truncated or changed after saving (the weights
        or ``cfg.json``), of a newer mlpinterp, or written before the artifact header (without ``verify_hash=False``).
    ValueError
        If a file is corrupt, the tensor shapes or dtype disagree with ``cfg.json``, or ``cfg.json`` asks for a
        computation this class does not implement (named).
    """
    path = Path(path)
    if path.is_file():
        raise ValueError(f"path must be the SAE's directory (holding cfg.json and the .safetensors file), "
                         f"got the file {str(path)!r}")
    cfg_path = path / "cfg.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{str(cfg_path)!r} does not exist")
    wfile = next((path / f for f in _WEIGHT_FILES.values() if (path / f).exists()), None)
    if wfile is None:
        raise FileNotFoundError(f"{str(path)!r} holds neither sae.safetensors nor sae_weights.safetensors")
    tensors, raw, ours = _read_files(wfile, cfg_path, verify_hash)
    where = f"in {str(path)!r}"
    if wfile.name == _WEIGHT_FILES["sparsify"]:
        info = _sparsify_fields(raw, tensors, where, ours)
        w_enc, b_enc = tensors.get("encoder.weight"), tensors.get("encoder.bias")
    else:
        info = _saelens_fields(raw, where)
        w_enc, b_enc = tensors.get("W_enc"), tensors.get("b_enc")
        w_enc = None if w_enc is None else w_enc.t()
    missing = [n for n, t in (("encoder weight", w_enc), ("encoder bias", b_enc),
                              ("W_dec", tensors.get("W_dec")), ("b_dec", tensors.get("b_dec"))) if t is None]
    if missing:
        raise ValueError(f"SAE file in {str(path)!r} lacks tensors: {missing}")
    w_dec, b_dec = tensors["W_dec"], tensors["b_dec"]
    for name, t in (("encoder weight", w_enc), ("encoder bias", b_enc), ("W_dec", w_dec), ("b_dec", b_dec)):
        if not t.is_floating_point():
            raise ValueError(f"{name} {where} must be a floating-point tensor, got dtype {t.dtype}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} {where} contains {int((~torch.isfinite(t)).sum())} non-finite value(s)")
    if w_enc.ndim != 2:
        raise ValueError(f"encoder weight {where} must be 2-D [d_sae, d_in], got shape {list(w_enc.shape)}")

    def _int(key: str, v):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"cfg.json {where}: {key!r} must be an int, got {type(v).__name__} {v!r}")
        return v

    d_in = _int("d_in", raw["d_in"]) if "d_in" in raw else int(w_enc.shape[1])
    names = {f.name for f in fields(SaeConfig)}
    kw = {k: v for k, v in raw.items() if k in names}
    kw["pre_bias"] = info["pre_bias"]
    if "d_sae" not in kw:
        kw["d_sae"] = _int("num_latents", raw["num_latents"]) if raw.get("num_latents") else int(w_enc.shape[0])
    if "k" not in kw:
        afk = raw.get("activation_fn_kwargs")
        if not isinstance(afk, dict) or "k" not in afk:
            raise ValueError(f"cfg.json {where} gives no top-k 'k' (neither 'k' nor 'activation_fn_kwargs.k')")
        kw["k"] = _int("activation_fn_kwargs.k", afk["k"])
    try:
        cfg = SaeConfig(**kw)
    except (TypeError, ValueError) as e:
        raise type(e)(f"cfg.json {where}: {e}") from e
    want = (cfg.d_sae, d_in)
    for name, t in (("encoder weight", w_enc), ("W_dec", w_dec)):
        if tuple(t.shape) != want:
            raise ValueError(f"{name} {where} must have shape {list(want)}, got {list(t.shape)}")
    for name, t, n in (("encoder bias", b_enc, cfg.d_sae), ("b_dec", b_dec, d_in)):
        if tuple(t.shape) != (n,):
            raise ValueError(f"{name} {where} must have shape [{n}], got {list(t.shape)}")
    dtype = w_enc.dtype
    if "dtype" in raw:
        name = str(raw["dtype"]).removeprefix("torch.")
        want_dtype = getattr(torch, name, None)
        if not isinstance(want_dtype, torch.dtype) or not want_dtype.is_floating_point:
            raise ValueError(f"cfg.json {where}: dtype {raw['dtype']!r} is not a floating-point torch dtype")
        if ours and want_dtype != dtype:
            raise ValueError(f"cfg.json {where} records dtype {name} but the weights are {_dtype_name(dtype)}")
        dtype = want_dtype  # SAELens casts the weights to its cfg dtype
    scale = raw.get("input_scale", 1.0) if ours else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"cfg.json {where}: 'input_scale' must be a finite number > 0, got {scale!r}")
    folded = raw.get("input_scale_folded", False) if ours else False
    w_enc64, b_enc64, w_dec64, b_dec64 = (t.double() for t in (w_enc, b_enc, w_dec, b_dec))
    if info["rescale"]:  # SAELens: pre-activations times ||W_dec_j||, decoder rows divided by it -> fold (exact)
        n = w_dec64.norm(dim=1, keepdim=True)
        if not bool((n > 0).all()):
            raise ValueError(f"W_dec {where} has a zero row; rescale_acts_by_decoder_norm=true is undefined for it")
        w_enc64, b_enc64, w_dec64 = w_enc64 * n, b_enc64 * n[:, 0], w_dec64 / n
    if folded and scale != 1.0:
        w_enc64, w_dec64, b_dec64 = w_enc64 / scale, w_dec64 * scale, b_dec64 * scale
    if cfg.tied and not torch.allclose(w_dec64, w_enc64, rtol=1e-5, atol=1e-7 * float(w_enc64.abs().max())):
        raise ValueError(f"cfg.json {where} says tied=true but W_dec differs from the encoder weight (max |diff| "
                         f"{float((w_dec64 - w_enc64).abs().max()):.3g})")
    sae = TopKSae(d_in, cfg, dtype=dtype, model_name=info["model_name"], hook_point=info["hook_point"],
                  input_scale=float(scale))
    with torch.no_grad():
        sae.encoder.weight.copy_(w_enc64)
        sae.encoder.bias.copy_(b_enc64)
        sae.b_dec.copy_(b_dec64)
        if not cfg.tied:
            sae.W_dec_param.copy_(w_dec64)
    return sae.to(device)


def _read_files(wfile: Path, cfg_path: Path, verify_hash: bool) -> tuple[dict[str, Tensor], dict, bool]:
    """``(tensors, cfg, ours)``: an mlpinterp SAE (the artifact header in the weights file, or our keys in
    ``cfg.json``) verified as an artifact; a file of SAELens or sparsify read as it is."""
    header = has_envelope(wfile)
    try:
        raw = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        if header:  # ours: the artifact loader names the corruption and the fix
            raw = None
        else:
            raise ValueError(f"{str(cfg_path)!r} is not valid JSON ({e})") from e
    ours = header or (isinstance(raw, dict) and bool({"mlpinterp_format", "layout", "input_scale_folded"} & set(raw)))
    fix = ("save the SAE again (or retrain it); only if the edit was deliberate, load it unverified (library only: "
           "load_sae(path, verify_hash=False); the CLI always verifies) and save it again")
    if ours and (header or verify_hash):
        if not header:
            try:  # a corrupt file is named as such
                read_safetensors(wfile, what="SAE weights")
            except ValueError as e:
                raise ArtifactError(wfile, f"is not a valid safetensors file (corrupt or truncated: {e.__cause__})",
                                    fix, "SAE") from e
            fmt = raw.get("mlpinterp_format")
            raise ArtifactError(wfile, "carries no artifact header although cfg.json has mlpinterp's keys"
                                       + (f" (cfg.json mlpinterp_format {fmt!r}: an earlier mlpinterp wrote it)"
                                          if fmt is not None else " (the header was removed or damaged)")
                                       + ", so its weights and cfg.json cannot be verified",
                                "load it unverified and save it again (library only: load_sae(path, "
                                "verify_hash=False), then save_sae; the CLI always verifies)", "SAE")
        art = load_artifact(wfile, kind=KIND, meta_path=cfg_path, verify=verify_hash, fix=fix, what="SAE")
        tensors, raw = art.tensors, art.meta
    else:
        tensors, _ = read_safetensors(wfile, what="SAE weights")
    if not isinstance(raw, dict):
        raise ValueError(f"{str(cfg_path)!r} must hold a JSON object, got {type(raw).__name__}")
    return tensors, raw, ours


# ----------------------------------------------------------------------------- provenance
def check_provenance(what: str, *, recorded_model: str | None, recorded_hook: str | None,
                     model_name: str | None, hook_point: str | None, allow_mismatch: bool = False,
                     override: str = "allow_mismatch=True") -> None:
    """Refuse to use an SAE (or resume a checkpoint) at another hook point or model than it was trained on.

    ``what`` names the use in the message (e.g. ``"resuming the checkpoint in 'runs/sae'"``). A ``None`` on
    either side means "not recorded" and is not compared; model names compare by
    :func:`~mlpinterp.lm.models.canonical_model_name` (``"minilm"`` is ``"sentence-transformers/all-MiniLM-L6-v2"``). With ``allow_mismatch`` a mismatch only warns
    (``UserWarning``); ``override`` names the flag in the message (e.g. ``--allow-hook-mismatch``).

    Raises ``ValueError`` naming both values.
    """
    problems = []
    if recorded_hook is not None and hook_point is not None and recorded_hook != hook_point:
        problems.append(f"hook point {recorded_hook!r}, not {hook_point!r}")
    from mlpinterp.lm.models import canonical_model_name  # "minilm" and its Hugging Face id are one model

    if recorded_model is not None and model_name is not None and \
            canonical_model_name(recorded_model) != canonical_model_name(model_name):
        problems.append(f"model {recorded_model!r}, not {model_name!r}")
    if not problems:
        return
    msg = f"{what}: it was trained on {' and '.join(problems)}"
    if allow_mismatch:
        warnings.warn(msg + f" (used anyway because of {override})", UserWarning, stacklevel=2)
        return
    raise ValueError(msg + f"; its numbers at another hook point or model would be meaningless (pass {override} "
                     f"to use it anyway)")
