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

The AuxK loss (Gao et al. 2024, sec. A.2) reconstructs the residual ``e = x - x_hat`` from the ``k_aux`` largest
pre-activations of *dead* latents, as EleutherAI sparsify computes it: ``min(n_dead / k_aux, 1) *
sum ||e_hat - e||^2 / sum ||x - mean(x)||^2`` with ``k_aux`` taken before it is clipped to ``n_dead`` (so few dead
latents weigh little) and the input's total variance as denominator; its gradient reaches the encoder through
the same sparse backward as the TopK latents (``k + k_aux`` entries per row).

Input normalisation (``input_scale = s``, e.g. ``sqrt(d_in) / E||x||`` estimated by the trainer): the SAE
computes on ``s x`` and returns ``x_hat / s``, so every output and metric (``sae_out``, ``fvu``, ``mse``) is in the
original units of ``x``; only latent activations and the parameters live in the normalised space.

Artefacts: ``sae.safetensors`` + ``cfg.json`` (sparsify layout, :func:`mlpinterp.sae.io.save_sae`) or
``sae_weights.safetensors`` + ``cfg.json`` (SAELens layout, ``layout="saelens"``); :mod:`mlpinterp.sae.io`
writes and reads both, with the model name, hook point, dtype, normalisation and a hash of the weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mlpinterp.utils.validation import Bool, Int, check_fields


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
        check_fields(self, {("d_sae", "k"): Int(1, what="a positive int"),
                            "k_aux": Int(1, what="a positive int or None", optional=True),
                            ("tied", "pre_bias", "normalize_decoder"): Bool()})
        if self.k > self.d_sae:
            raise ValueError(f"k must be <= d_sae, got k={self.k} > d_sae={self.d_sae}")


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
    """Fused ``ReLU(TopK((x - b_dec) W^T + b))`` whose backward only touches the selected latents of each row.

    The dense backward of the encoder would cost ``O(batch * d_sae * d_in)``; the selected entries only
    need ``O(batch * k * d_in)`` (a scatter-add), which is what makes TopK SAEs cheap to train on CPU.
    With a ``dead`` mask it also returns the AuxK selection: ``ReLU`` of the ``k_aux`` largest pre-activations
    among the dead latents, whose gradient goes through the same sparse backward (``k + k_aux`` entries a row).
    ``b_dec`` (None: no pre-encoder bias) is an input so that its gradient, ``-sum_rows g_pre W = -g_b W``, costs
    one ``[d_sae] x [d_sae, d_in]`` product instead of a per-row gradient of the input when ``x`` needs none.
    """

    @staticmethod
    def forward(ctx, x: Tensor, b_dec: Tensor | None, weight: Tensor, bias: Tensor, k: int,  # type: ignore[override]
                dead: Tensor | None, k_aux: int):
        xin = x - b_dec if b_dec is not None else x
        pre = torch.addmm(bias, xin, weight.t())
        vals, idx = pre.topk(k, dim=-1, sorted=False)
        acts = vals.clamp_min(0.0)
        if dead is not None:  # the k_aux largest among the dead columns only (cheap when few latents are dead)
            dead_idx = dead.nonzero().squeeze(1)
            aux_vals, j = pre.index_select(1, dead_idx).topk(k_aux, dim=-1, sorted=False)
            aux_idx = dead_idx[j]
        else:
            aux_vals, aux_idx = vals[:, :0], idx[:, :0]
        aux_acts = aux_vals.clamp_min(0.0)
        ctx.save_for_backward(xin, weight, torch.cat([idx, aux_idx], 1), torch.cat([vals, aux_vals], 1))
        ctx.k = k
        ctx.mark_non_differentiable(idx, aux_idx)
        ctx.set_materialize_grads(False)
        return acts, idx, pre, aux_acts, aux_idx

    @staticmethod
    def backward(ctx, g_acts: Tensor, _g_idx, g_pre, g_aux, _g_aux_idx):  # type: ignore[override]
        x, weight, idx, vals = ctx.saved_tensors
        wdt, k = weight.dtype, ctx.k
        need_x, need_bdec, need_w, need_b = ctx.needs_input_grad[:4]
        # Under autocast the forward matmul ran in bf16, so the incoming gradients are bf16 while x and the
        # weight are float32: every product below runs in the weight's dtype with autocast off (mixing dtypes
        # inside embedding_bag / sparse.mm is an error, and a bf16 scatter-add would lose precision).
        with torch.autocast(x.device.type, enabled=False):
            parts = [torch.zeros_like(vals[:, :k], dtype=wdt) if g_acts is None else g_acts.to(wdt),
                     torch.zeros_like(vals[:, k:], dtype=wdt) if g_aux is None else g_aux.to(wdt)]
            g = torch.cat(parts, 1) * (vals > 0)  # ReLU'
            x = x.to(wdt)
            g_x = g_bdec = g_w = g_b = None
            if g_pre is not None:  # someone used pre_acts with a gradient: fall back to dense
                dense = g_pre.to(wdt, copy=True)
                dense.scatter_add_(1, idx, g)
                g_x = dense @ weight if need_x else None
                g_w = dense.t() @ x if need_w else None
                g_b = dense.sum(0) if need_b or need_bdec else None
            else:
                if need_x:
                    g_x = F.embedding_bag(idx, weight, per_sample_weights=g, mode="sum")
                if need_w:
                    d_sae = weight.shape[0]
                    sparse = torch.sparse_coo_tensor(
                        torch.stack([idx.reshape(-1),
                                     torch.arange(idx.shape[0], device=idx.device).repeat_interleave(idx.shape[1])]),
                        g.reshape(-1),
                        (d_sae, x.shape[0]),
                        check_invariants=False,
                    )
                    g_w = torch.sparse.mm(sparse, x)
                if need_b or need_bdec:
                    g_b = torch.zeros(weight.shape[0], dtype=wdt, device=g.device).index_add_(0, idx.reshape(-1),
                                                                                             g.reshape(-1))
            if need_bdec:
                g_bdec = -(g_b @ weight)
        return g_x, g_bdec, g_w, g_b if need_b else None, None, None, None


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
    dtype : torch.dtype
        Parameter dtype (float32 default; bf16 and float64 work).
    model_name, hook_point : str, optional
        Where the SAE's inputs come from (a model name as given to :func:`mlpinterp.lm.models.load_model`, a
        module path); recorded in ``cfg.json`` and checked by :func:`mlpinterp.sae.io.check_provenance` wherever the
        SAE is used on a model.
    input_scale : float
        Inputs are multiplied by this before encoding and reconstructions divided by it (1: no normalisation).

    Raises
    ------
    ValueError
        If ``d_in`` is not a positive int, ``cfg.k > cfg.d_sae`` or ``input_scale`` is not finite and > 0.
    TypeError
        If ``cfg``, ``dtype``, ``generator``, ``model_name`` or ``hook_point`` has the wrong type.
    """

    def __init__(self, d_in: int, cfg: SaeConfig, *, generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float32, model_name: str | None = None, hook_point: str | None = None,
                 input_scale: float = 1.0):
        super().__init__()
        if isinstance(d_in, bool) or not isinstance(d_in, int) or d_in < 1:
            raise ValueError(f"d_in must be a positive int, got {d_in!r}")
        if not isinstance(cfg, SaeConfig):
            raise TypeError(f"cfg must be a SaeConfig, got {type(cfg).__name__}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        for name, v in (("model_name", model_name), ("hook_point", hook_point)):
            if v is not None and (not isinstance(v, str) or not v):
                raise TypeError(f"{name} must be a non-empty str or None, got {v!r}")
        self.d_in = d_in
        self.cfg = cfg
        self.model_name = model_name
        self.hook_point = hook_point
        self.input_scale = input_scale
        self.encoder = nn.Linear(d_in, cfg.d_sae, dtype=dtype)
        self.W_dec_param = None if cfg.tied else nn.Parameter(torch.empty(cfg.d_sae, d_in, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(d_in, dtype=dtype))
        self.reset_parameters(generator)

    # ------------------------------------------------------------------ parameters
    @property
    def input_scale(self) -> float:
        """Multiplier applied to inputs before encoding (reconstructions are divided by it); 1 = none."""
        return self._input_scale

    @input_scale.setter
    def input_scale(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"input_scale must be a finite number > 0, got {value!r}")
        self._input_scale = float(value)

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

    def extra_repr(self) -> str:
        where = f", hook_point={self.hook_point!r}" if self.hook_point else ""
        scale = f", input_scale={self.input_scale:.4g}" if self.input_scale != 1.0 else ""
        return f"d_in={self.d_in}, d_sae={self.cfg.d_sae}, k={self.cfg.k}, tied={self.cfg.tied}{where}{scale}"

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

    def _encode_normalised(self, xs: Tensor) -> EncoderOutput:
        """TopK then ReLU of already scaled inputs ``xs = input_scale * x``."""
        acts, idx, pre, _, _ = _TopKEncode.apply(xs, self.b_dec if self.cfg.pre_bias else None, self.encoder.weight,
                                                 self.encoder.bias, self.cfg.k, None, 0)
        return EncoderOutput(acts, idx, pre)

    def _decode_normalised(self, top_acts: Tensor, top_indices: Tensor) -> Tensor:
        """``sum_j acts_j W_dec[idx_j] + b_dec`` in the normalised space (acts cast to the weights' dtype, which
        also makes the decoder work under autocast)."""
        w = self.W_dec
        return F.embedding_bag(top_indices, w, per_sample_weights=top_acts.to(w.dtype), mode="sum") + self.b_dec

    def encode(self, x: Tensor, *, _checked: bool = False) -> EncoderOutput:
        """TopK then ReLU. ``x``: ``[batch, d_in]`` in original units. Returns :class:`EncoderOutput`."""
        if not _checked:
            x = self._check_input(x)
        return self._encode_normalised(x * self.input_scale if self.input_scale != 1.0 else x)

    def decode(self, top_acts: Tensor, top_indices: Tensor) -> Tensor:
        """``x_hat = (sum_j acts_j W_dec[idx_j] + b_dec) / input_scale``: ``[batch, k]`` x2 -> ``[batch, d_in]``.

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
        out = self._decode_normalised(top_acts, top_indices)
        return out / self.input_scale if self.input_scale != 1.0 else out

    def dense_latents(self, x: Tensor) -> Tensor:
        """Latent activations as a dense ``[batch, d_sae]`` tensor (zeros outside the top k)."""
        enc = self.encode(x)
        z = torch.zeros(x.shape[0], self.cfg.d_sae, dtype=enc.top_acts.dtype, device=enc.top_acts.device)
        return z.scatter(1, enc.top_indices, enc.top_acts)

    def forward(self, x: Tensor, dead_mask: Tensor | None = None,
                reduce_stats: Callable[[Tensor], Tensor] | None = None) -> ForwardOutput:
        """Encode, decode and score one batch; ``sae_out``, ``fvu`` and ``mse`` are in the original units of ``x``.

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
        if dead_mask is not None and dead_mask.shape != (self.cfg.d_sae,):
            raise ValueError(f"dead_mask must have shape [d_sae={self.cfg.d_sae}], got {list(dead_mask.shape)}")
        num_dead = int(dead_mask.sum()) if dead_mask is not None else 0
        s = self.input_scale
        xs = x * s if s != 1.0 else x
        k_aux = self.cfg.k_aux or self.d_in // 2
        dead = dead_mask.to(x.device) if num_dead > 0 else None
        acts, idx, _, aux_acts, aux_idx = _TopKEncode.apply(xs, self.b_dec if self.cfg.pre_bias else None,
                                                             self.encoder.weight, self.encoder.bias, self.cfg.k,
                                                             dead, min(k_aux, num_dead))
        sae_out = self._decode_normalised(acts, idx)
        if s != 1.0:
            sae_out = sae_out / s
        e = x - sae_out
        tiny = torch.finfo(x.dtype).tiny
        l2 = e.pow(2).sum()
        total_var = _total_variance(x, reduce_stats).clamp_min(tiny)
        fvu = l2 / total_var
        numel = torch.tensor(float(e.numel()), dtype=torch.float64, device=e.device)
        mse = l2 / (reduce_stats(numel) if reduce_stats else numel).to(x.dtype).to(x.device)
        auxk = sae_out.new_zeros(())
        if num_dead > 0:
            # Gao et al. 2024, A.2, as sparsify computes it: the scale uses k_aux before it is clipped to the
            # number of dead latents, and the loss is normalised by the input's total variance
            scale = min(num_dead / k_aux, 1.0)
            w = self.W_dec
            e_hat = F.embedding_bag(aux_idx, w, per_sample_weights=aux_acts.to(w.dtype), mode="sum")
            if s != 1.0:
                e_hat = e_hat / s
            auxk = scale * (e_hat - e.detach()).pow(2).sum() / total_var
        return ForwardOutput(sae_out, acts, idx, fvu, mse, auxk)
