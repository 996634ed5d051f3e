"""TopK sparse autoencoder (Gao et al. 2024, "Scaling and evaluating sparse autoencoders", eq. 2-3).

``z = ReLU(TopK(W_enc (x - b_dec) + b_enc))``, ``x_hat = z W_dec + b_dec``.

Layout follows EleutherAI sparsify: ``encoder`` is a ``torch.nn.Linear(d_in, d_sae)`` (weight ``[d_sae, d_in]``,
i.e. ``[out, in]``) and the decoder dictionary ``W_dec`` is ``[d_sae, d_in]``: row ``j`` is the direction
latent ``j`` writes into activation space (the "feature"), the convention shared by sparsify and SAELens.

* ``tied=True`` (Marks et al. 2024, sec. 3, the MFR paper's setting): ``W_dec`` *is* ``encoder.weight``;
  rows are kept at unit norm.
* ``tied=False`` (modern default): separate ``W_dec`` with unit-norm rows (= unit-norm decoder columns in the
  ``[d_in, d_sae]`` nn.Linear view); :meth:`TopKSae.remove_gradient_parallel_to_decoder_directions` projects
  the gradient onto the tangent space of the sphere before each step and
  :meth:`TopKSae.set_decoder_norm_to_unit_norm` renormalises after it.

The AuxK loss (Gao et al. 2024, sec. A.2) reconstructs the residual ``x - x_hat`` from the ``k_aux`` largest
pre-activations of *dead* latents; it is normalised by the residual's variance like sparsify.

Artefacts: ``sae.safetensors`` + ``cfg.json`` (sparsify layout, :meth:`TopKSae.save`) or
``sae_weights.safetensors`` + ``cfg.json`` (SAELens layout, ``layout="saelens"``); :meth:`TopKSae.load`
reads both.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from safetensors.torch import save as st_save
from torch import Tensor, nn

from mlpinterp.utils.io import atomic_write_bytes, atomic_write_json, load_tensors


@dataclass(frozen=True)
class SaeConfig:
    """Hyper-parameters of one TopK SAE (everything except ``d_in``, which comes from the data)."""

    d_sae: int = 3072
    """Number of latents (dictionary size)."""

    k: int = 32
    """Number of latents kept by TopK per sample (upper bound on L0)."""

    tied: bool = False
    """Tie the decoder to the encoder (``W_dec = encoder.weight``), as in Marks et al. 2024."""

    pre_bias: bool = True
    """Subtract ``b_dec`` from the input before encoding (Bricken et al. 2023)."""

    normalize_decoder: bool = True
    """Keep decoder rows at unit norm (projected gradient + renormalisation after each step)."""

    k_aux: int | None = None
    """Latents used by the AuxK loss; ``None`` means ``d_in // 2`` (Gao et al. 2024)."""

    def __post_init__(self) -> None:
        for name in ("d_sae", "k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.k > self.d_sae:
            raise ValueError(f"k must be <= d_sae, got k={self.k} > d_sae={self.d_sae}")
        if self.k_aux is not None and (isinstance(self.k_aux, bool) or not isinstance(self.k_aux, int) or self.k_aux < 1):
            raise ValueError(f"k_aux must be a positive int or None, got {self.k_aux!r}")
        for name in ("tied", "pre_bias", "normalize_decoder"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__} {getattr(self, name)!r}")


class ForwardOutput(NamedTuple):
    """What :meth:`TopKSae.forward` returns."""

    sae_out: Tensor
    """Reconstruction ``x_hat``, ``[batch, d_in]``."""

    latent_acts: Tensor
    """Activations of the selected latents after ReLU, ``[batch, k]`` (may contain zeros)."""

    latent_indices: Tensor
    """Indices of the selected latents, ``[batch, k]`` (int64)."""

    fvu: Tensor
    """Fraction of variance unexplained: ``sum ||x - x_hat||^2 / sum ||x - mean(x)||^2`` (scalar)."""

    mse: Tensor
    """Mean squared error per element (scalar)."""

    auxk_loss: Tensor
    """AuxK loss (scalar; 0 when no ``dead_mask`` is given or no latent is dead)."""


class EncoderOutput(NamedTuple):
    """What :meth:`TopKSae.encode` returns."""

    top_acts: Tensor
    """``[batch, k]`` ReLU of the top-k pre-activations."""

    top_indices: Tensor
    """``[batch, k]`` int64 latent indices."""

    pre_acts: Tensor
    """``[batch, d_sae]`` pre-activations ``W_enc (x - b_dec) + b_enc``."""


class _TopKEncode(torch.autograd.Function):
    """Fused ``ReLU(TopK(x W^T + b))`` whose backward only touches the ``k`` selected latents per row.

    The dense backward of the encoder would cost ``O(batch * d_sae * d_in)``; the selected entries only
    need ``O(batch * k * d_in)`` (a scatter-add), which is what makes TopK SAEs cheap to train on CPU.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, k: int):  # type: ignore[override]
        pre = torch.addmm(bias, x, weight.t())
        vals, idx = pre.topk(k, dim=-1, sorted=False)
        acts = vals.clamp_min(0.0)
        ctx.save_for_backward(x, weight, idx, vals)
        ctx.mark_non_differentiable(idx)
        ctx.set_materialize_grads(False)
        return acts, idx, pre

    @staticmethod
    def backward(ctx, g_acts: Tensor, _g_idx, g_pre):  # type: ignore[override]
        x, weight, idx, vals = ctx.saved_tensors
        g = torch.zeros_like(vals) if g_acts is None else g_acts * (vals > 0)  # ReLU derivative
        g_x = g_w = g_b = None
        if g_pre is not None:  # someone used pre_acts with a gradient (e.g. AuxK): fall back to dense
            dense = g_pre.clone()
            dense.scatter_add_(1, idx, g)
            if ctx.needs_input_grad[0]:
                g_x = dense @ weight
            if ctx.needs_input_grad[1]:
                g_w = dense.t() @ x
            if ctx.needs_input_grad[2]:
                g_b = dense.sum(0)
            return g_x, g_w, g_b, None
        if ctx.needs_input_grad[0]:
            g_x = F.embedding_bag(idx, weight, per_sample_weights=g, mode="sum")
        if ctx.needs_input_grad[1]:
            d_sae = weight.shape[0]
            sparse = torch.sparse_coo_tensor(
                torch.stack([idx.reshape(-1),
                             torch.arange(idx.shape[0], device=idx.device).repeat_interleave(idx.shape[1])]),
                g.reshape(-1),
                (d_sae, x.shape[0]),
                check_invariants=False,
            )
            g_w = torch.sparse.mm(sparse, x)
        if ctx.needs_input_grad[2]:
            g_b = torch.zeros(weight.shape[0], dtype=g.dtype, device=g.device).index_add_(0, idx.reshape(-1),
                                                                                         g.reshape(-1))
        return g_x, g_w, g_b, None


def _total_variance(x: Tensor, reduce_stats: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """``sum_i ||x_i - mean(x)||^2`` over the batch (over all ranks when ``reduce_stats`` sums across them)."""
    if reduce_stats is None:
        return (x - x.mean(0)).pow(2).sum().detach()
    xd = x.detach().double()
    n = torch.tensor([float(x.shape[0])], dtype=xd.dtype, device=xd.device)
    stats = reduce_stats(torch.cat([xd.sum(0), xd.pow(2).sum(0), n]))
    d = x.shape[1]
    s1, s2, n = stats[:d], stats[d:2 * d], stats[-1]
    return (s2 - s1.pow(2) / n).sum().clamp_min(0).to(x.dtype)


class TopKSae(nn.Module):
    """TopK sparse autoencoder; see the module docstring for the maths and the layout.

    Parameters
    ----------
    d_in : int
        Width of the activations it reads.
    cfg : SaeConfig
        Hyper-parameters.
    generator : torch.Generator, optional
        Source of randomness for the initialisation (deterministic given its seed).

    Raises
    ------
    ValueError
        If ``d_in`` is not a positive int or ``cfg.k > cfg.d_sae``.
    """

    def __init__(self, d_in: int, cfg: SaeConfig, *, generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        if isinstance(d_in, bool) or not isinstance(d_in, int) or d_in < 1:
            raise ValueError(f"d_in must be a positive int, got {d_in!r}")
        if not isinstance(cfg, SaeConfig):
            raise TypeError(f"cfg must be a SaeConfig, got {type(cfg).__name__}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.d_in = d_in
        self.cfg = cfg
        self.encoder = nn.Linear(d_in, cfg.d_sae, dtype=dtype)
        self.W_dec_param = None if cfg.tied else nn.Parameter(torch.empty(cfg.d_sae, d_in, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(d_in, dtype=dtype))
        self.reset_parameters(generator)

    # ------------------------------------------------------------------ parameters
    @property
    def W_dec(self) -> Tensor:
        """Decoder dictionary ``[d_sae, d_in]`` (the encoder weight itself when tied)."""
        return self.encoder.weight if self.W_dec_param is None else self.W_dec_param

    @property
    def device(self) -> torch.device:
        return self.b_dec.device

    @property
    def dtype(self) -> torch.dtype:
        return self.b_dec.dtype

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Re-initialise all parameters: encoder ~ U(-1/sqrt(d_in), 1/sqrt(d_in)) (nn.Linear's default),
        decoder = encoder rows normalised to unit norm, biases 0 (sparsify's scheme)."""
        bound = 1.0 / math.sqrt(self.d_in)
        w = torch.rand(self.encoder.weight.shape, generator=generator, dtype=torch.float64) * 2 * bound - bound
        self.encoder.weight.copy_(w)
        self.encoder.bias.zero_()
        self.b_dec.zero_()
        if self.W_dec_param is not None:
            self.W_dec_param.copy_(self.encoder.weight)
        if self.cfg.normalize_decoder:
            self.set_decoder_norm_to_unit_norm()

    @torch.no_grad()
    def set_decoder_norm_to_unit_norm(self) -> None:
        """Rescale every decoder row to unit L2 norm (in place)."""
        w = self.W_dec
        w.div_(w.norm(dim=1, keepdim=True).clamp_min(torch.finfo(w.dtype).eps))

    @torch.no_grad()
    def remove_gradient_parallel_to_decoder_directions(self) -> None:
        """Project ``W_dec.grad`` onto the tangent space of the unit sphere, row by row (in place)."""
        w = self.W_dec
        if w.grad is None:
            return
        parallel = (w.grad * w).sum(dim=1, keepdim=True)
        w.grad.sub_(parallel * w)

    # ------------------------------------------------------------------ forward
    def _check_input(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.ndim != 2 or x.shape[1] != self.d_in:
            raise ValueError(f"x must have shape [batch, d_in={self.d_in}], got {list(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
        if not bool(torch.isfinite(x).all()):
            n_bad = int((~torch.isfinite(x)).sum())
            raise ValueError(f"x contains {n_bad} non-finite value(s) (NaN or inf)")
        return x.to(self.dtype)

    def encode(self, x: Tensor, *, _checked: bool = False) -> EncoderOutput:
        """TopK then ReLU. ``x``: ``[batch, d_in]``. Returns :class:`EncoderOutput`."""
        if not _checked:
            x = self._check_input(x)
        if self.cfg.pre_bias:
            x = x - self.b_dec
        acts, idx, pre = _TopKEncode.apply(x, self.encoder.weight, self.encoder.bias, self.cfg.k)
        return EncoderOutput(acts, idx, pre)

    def decode(self, top_acts: Tensor, top_indices: Tensor) -> Tensor:
        """``x_hat = sum_j acts_j W_dec[idx_j] + b_dec``: ``[batch, k]`` x2 -> ``[batch, d_in]``.

        Raises ``TypeError``/``ValueError`` if ``top_indices`` is not an integer tensor of indices in ``[0, d_sae)``,
        ``top_acts`` not a finite floating-point tensor of the same ``[batch, k]`` shape.
        """
        if not isinstance(top_acts, Tensor) or not top_acts.is_floating_point():
            raise TypeError(f"top_acts must be a floating-point torch.Tensor [batch, k], got "
                            f"{top_acts.dtype if isinstance(top_acts, Tensor) else type(top_acts).__name__}")
        if not isinstance(top_indices, Tensor) or top_indices.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"top_indices must be an int64/int32 torch.Tensor [batch, k], got "
                            f"{top_indices.dtype if isinstance(top_indices, Tensor) else type(top_indices).__name__}")
        if top_indices.ndim != 2 or top_acts.shape != top_indices.shape:
            raise ValueError(f"top_acts and top_indices must have the same shape [batch, k], got "
                             f"{list(top_acts.shape)} and {list(top_indices.shape)}")
        if top_indices.numel() and (int(top_indices.min()) < 0 or int(top_indices.max()) >= self.cfg.d_sae):
            raise ValueError(f"top_indices must lie in [0, d_sae={self.cfg.d_sae}), got values in "
                             f"[{int(top_indices.min())}, {int(top_indices.max())}]")
        if not bool(torch.isfinite(top_acts).all()):
            raise ValueError(f"top_acts contains {int((~torch.isfinite(top_acts)).sum())} non-finite value(s)")
        return F.embedding_bag(top_indices, self.W_dec, per_sample_weights=top_acts, mode="sum") + self.b_dec

    def dense_latents(self, x: Tensor) -> Tensor:
        """Latent activations as a dense ``[batch, d_sae]`` tensor (zeros outside the top k)."""
        enc = self.encode(x)
        z = torch.zeros(x.shape[0], self.cfg.d_sae, dtype=enc.top_acts.dtype, device=enc.top_acts.device)
        return z.scatter(1, enc.top_indices, enc.top_acts)

    def forward(self, x: Tensor, dead_mask: Tensor | None = None,
                reduce_stats: Callable[[Tensor], Tensor] | None = None) -> ForwardOutput:
        """Encode, decode and score one batch.

        Parameters
        ----------
        x : Tensor ``[batch, d_in]``
        dead_mask : Tensor ``[d_sae]`` bool, optional
            Latents counted as dead; enables the AuxK loss.
        reduce_stats : callable, optional
            Data-parallel training: sums a (detached) tensor over ranks. The denominators of FVU, MSE and AuxK
            are then those of the *global* batch, so ``fvu``/``mse``/``auxk_loss`` are this rank's additive
            share of the global values.

        Raises
        ------
        ValueError / TypeError
            If ``x`` has the wrong shape or dtype, or ``dead_mask`` the wrong shape.
        """
        x = self._check_input(x)
        if x.shape[0] < 1:
            raise ValueError(f"x must have at least one row (FVU and MSE are undefined on an empty batch), got {list(x.shape)}")
        if dead_mask is not None:
            if not isinstance(dead_mask, Tensor) or dead_mask.dtype != torch.bool:
                raise TypeError(f"dead_mask must be a bool torch.Tensor [d_sae={self.cfg.d_sae}], got "
                                f"{dead_mask.dtype if isinstance(dead_mask, Tensor) else type(dead_mask).__name__}")
        enc = self.encode(x, _checked=True)
        sae_out = F.embedding_bag(enc.top_indices, self.W_dec, per_sample_weights=enc.top_acts, mode="sum") + self.b_dec
        e = x - sae_out
        tiny = torch.finfo(x.dtype).tiny
        l2 = e.pow(2).sum()
        fvu = l2 / _total_variance(x, reduce_stats).clamp_min(tiny)
        numel = torch.tensor(float(e.numel()), dtype=torch.float64, device=e.device)
        mse = l2 / (reduce_stats(numel) if reduce_stats else numel).to(x.dtype).to(x.device)
        auxk = sae_out.new_zeros(())
        if dead_mask is not None:
            if dead_mask.shape != (self.cfg.d_sae,):
                raise ValueError(f"dead_mask must have shape [d_sae={self.cfg.d_sae}], got {list(dead_mask.shape)}")
            num_dead = int(dead_mask.sum())
            if num_dead > 0:
                k_aux = min(self.cfg.k_aux or self.d_in // 2, num_dead)
                scale = min(num_dead / k_aux, 1.0)
                aux_pre = enc.pre_acts.masked_fill(~dead_mask.to(enc.pre_acts.device), -torch.inf)
                aux_vals, aux_idx = aux_pre.topk(k_aux, dim=-1, sorted=False)
                e_hat = F.embedding_bag(aux_idx, self.W_dec, per_sample_weights=aux_vals.clamp_min(0), mode="sum")
                e_var = _total_variance(e.detach(), reduce_stats)
                auxk = scale * (e_hat - e.detach()).pow(2).sum() / e_var.clamp_min(tiny)
        return ForwardOutput(sae_out, enc.top_acts, enc.top_indices, fvu, mse, auxk)

    # ------------------------------------------------------------------ I/O
    def save(self, path: str | os.PathLike, layout: Literal["sparsify", "saelens"] = "sparsify",
             extra_cfg: dict | None = None) -> Path:
        """Write the SAE to directory ``path`` atomically and return it.

        ``layout="sparsify"``: ``sae.safetensors`` (``encoder.weight [d_sae, d_in]``, ``encoder.bias``,
        ``W_dec [d_sae, d_in]``, ``b_dec``) + ``cfg.json``. ``layout="saelens"``: ``sae_weights.safetensors``
        (``W_enc [d_in, d_sae]``, ``b_enc``, ``W_dec [d_sae, d_in]``, ``b_dec``) + ``cfg.json``.
        """
        path = Path(path)
        if extra_cfg is not None and not isinstance(extra_cfg, dict):
            raise TypeError(f"extra_cfg must be a dict or None, got {type(extra_cfg).__name__}")
        reserved = sorted(set(extra_cfg or {}) & ({f.name for f in fields(SaeConfig)} | {"d_in", "num_latents", "layout"}))
        if reserved:
            raise ValueError(f"extra_cfg must not override the SAE's own cfg.json keys, got {reserved}")
        cfg = {**asdict(self.cfg), "d_in": self.d_in, "num_latents": self.cfg.d_sae, "expansion_factor":
               self.cfg.d_sae / self.d_in, "multi_topk": False, "skip_connection": False,
               "architecture": "topk", "layout": layout, **(extra_cfg or {})}
        w_enc = self.encoder.weight.detach().cpu().contiguous()
        w_dec = self.W_dec.detach().cpu().clone().contiguous()
        if layout == "sparsify":
            tensors = {"encoder.weight": w_enc, "encoder.bias": self.encoder.bias.detach().cpu(),
                       "W_dec": w_dec, "b_dec": self.b_dec.detach().cpu()}
            fname = "sae.safetensors"
        elif layout == "saelens":
            tensors = {"W_enc": w_enc.t().contiguous(), "b_enc": self.encoder.bias.detach().cpu(),
                       "W_dec": w_dec, "b_dec": self.b_dec.detach().cpu()}
            cfg.update({"activation_fn_kwargs": {"k": self.cfg.k}, "apply_b_dec_to_input": self.cfg.pre_bias,
                        "dtype": str(self.dtype).removeprefix("torch."), "device": "cpu",
                        "normalize_activations": "none", "rescale_acts_by_decoder_norm": False,
                        "sae_lens_version": "6.0.0"})
            fname = "sae_weights.safetensors"
        else:
            raise ValueError(f"layout must be 'sparsify' or 'saelens', got {layout!r}")
        atomic_write_bytes(path / fname, st_save({k: v.contiguous() for k, v in tensors.items()}))
        atomic_write_json(path / "cfg.json", cfg)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device = "cpu") -> TopKSae:
        """Load an SAE written by :meth:`save` (either layout; also reads sparsify's own TopK SAEs).

        Raises
        ------
        FileNotFoundError
            If ``path`` holds neither ``sae.safetensors`` nor ``sae_weights.safetensors``, or no ``cfg.json``.
        ValueError
            If the files are corrupt or the tensor shapes disagree with ``cfg.json``.
        """
        path = Path(path)
        if path.is_file():
            raise ValueError(f"path must be the SAE's directory (holding cfg.json and the .safetensors file), "
                             f"got the file {str(path)!r}")
        cfg_path = path / "cfg.json"
        if not cfg_path.exists():
            raise FileNotFoundError(f"{str(cfg_path)!r} does not exist")
        try:
            raw = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{str(cfg_path)!r} is not valid JSON ({e})") from e
        if not isinstance(raw, dict):
            raise ValueError(f"{str(cfg_path)!r} must hold a JSON object, got {type(raw).__name__}")
        if (path / "sae.safetensors").exists():
            tensors, _ = load_tensors(path / "sae.safetensors")
            w_enc, b_enc = tensors.get("encoder.weight"), tensors.get("encoder.bias")
        elif (path / "sae_weights.safetensors").exists():
            tensors, _ = load_tensors(path / "sae_weights.safetensors")
            w_enc, b_enc = tensors.get("W_enc"), tensors.get("b_enc")
            w_enc = None if w_enc is None else w_enc.t()
        else:
            raise FileNotFoundError(f"{str(path)!r} holds neither sae.safetensors nor sae_weights.safetensors")
        missing = [n for n, t in (("encoder weight", w_enc), ("encoder bias", b_enc),
                                  ("W_dec", tensors.get("W_dec")), ("b_dec", tensors.get("b_dec"))) if t is None]
        if missing:
            raise ValueError(f"SAE file in {str(path)!r} lacks tensors: {missing}")
        where = f"in {str(path)!r}"
        for name, t in (("encoder weight", w_enc), ("encoder bias", b_enc), ("W_dec", tensors["W_dec"]),
                        ("b_dec", tensors["b_dec"])):
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
        if "d_sae" not in kw:
            if raw.get("num_latents") is not None:
                kw["d_sae"] = _int("num_latents", raw["num_latents"])
            else:
                kw["d_sae"] = int(w_enc.shape[0])
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
        for name, t in (("encoder weight", w_enc), ("W_dec", tensors["W_dec"])):
            if tuple(t.shape) != want:
                raise ValueError(f"{name} {where} must have shape {list(want)}, got {list(t.shape)}")
        for name, t, n in (("encoder bias", b_enc, cfg.d_sae), ("b_dec", tensors["b_dec"], d_in)):
            if tuple(t.shape) != (n,):
                raise ValueError(f"{name} {where} must have shape [{n}], got {list(t.shape)}")
        sae = cls(d_in, cfg, dtype=w_enc.dtype)
        with torch.no_grad():
            sae.encoder.weight.copy_(w_enc)
            sae.encoder.bias.copy_(b_enc)
            sae.b_dec.copy_(tensors["b_dec"])
            if not cfg.tied:
                sae.W_dec_param.copy_(tensors["W_dec"])
        return sae.to(device)
