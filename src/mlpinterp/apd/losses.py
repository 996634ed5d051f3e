"""APD losses (Braun et al. 2025, Sec. 2.2 and App. A.3-A.4), normalised as in the reference implementation.

Faithfulness and the output distance of minimality are shared with SPD (:mod:`mlpinterp.paramspace.losses`).

- simplicity: ``sum_b sum_c s_c(x_b) sum_s ||P_{c,s}||_p^p / (N * batch)`` (Schatten-p, ``p`` may be < 1);
- hidden-activation reconstruction: MSE between chosen activations of the target and of the sparse forward;
- Lp variant (App. A.4): ``sum_c A_c(x)^{p1}`` and ``sum_c A_c(x)^{p1} sum_s ||P_{c,s}||_{p2}^{p2}``.

Schatten-p from the factors, without an SVD. For ``P = A B`` (``A``: ``[d_out, m]``, ``B``: ``[m, d_in]``) the
squared singular values of ``P`` are the non-zero eigenvalues of ``P^T P = B^T (A^T A) B``. Because
``eig(XY) = eig(YX)`` away from zero, they are also the eigenvalues of the ``m x m`` product
``G_A G_B = (A^T A)(B B^T)``. That product is not symmetric, but with a Cholesky factor ``G_B = L L^T`` it is
similar to the symmetric PSD matrix ``M = L^T G_A L`` (``G_A G_B = L^{-T} M L^T``), so
``sigma_i(P)^2 = eigvalsh(M)_i`` and ``||P||_p^p = sum_i (sigma_i^2)^{p/2}``. Cost ``O(m^2 (d_out + d_in) + m^3)``
per component instead of an SVD of the ``d_out x d_in`` matrix; computed in float64 with a ``1e-12``-relative
jitter on ``G_B`` (which moves eigenvalues by at most ``1e-12 ||G_A|| tr(G_B)/m``). The paper's cheaper surrogate
replaces ``sigma_m`` by ``||A[:, m]|| ||B[m, :]||`` (exact when the rank-one terms are orthogonal, always for
``m = 1``); it is available as ``mode="factor"``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import torch

from mlpinterp.paramspace.components import Components
from mlpinterp.paramspace.losses import check_loss_tensor

EPS = 1e-16
SCHATTEN_MODES = ("exact", "factor")


def _exponent(p, name: str) -> float:
    """``p`` must be a finite real number > 0 (not a bool or a string)."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"{name} must be a real number > 0, got {type(p).__name__} {p!r}")
    if not (math.isfinite(float(p)) and p > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {p}")
    return float(p)


def _attr(attr, C: int | None) -> torch.Tensor:
    """Attributions ``[batch, C]``: finite and >= 0 (sums of squares)."""
    check_loss_tensor(attr, "attr", "[batch, C]")
    if attr.ndim != 2 or (C is not None and attr.shape[1] != C):
        raise ValueError(f"attr must have shape [batch, C{'' if C is None else '=' + str(C)}], got {list(attr.shape)}")
    if bool((attr < 0).any()):
        raise ValueError("attr must be >= 0 (attributions are sums of squares), got negative values")
    return attr


def schatten_pp(A: torch.Tensor, B: torch.Tensor, p: float, mode: str = "exact") -> torch.Tensor:
    """``||A_c B_c||_p^p`` for every component: ``A``: ``[C, d_out, m]``, ``B``: ``[C, m, d_in]`` -> ``[C]``.

    ``mode="exact"`` uses the eigenvalues of the ``m x m`` Gram product (module docstring); eigenvalues below
    ``1e-10`` of the largest are treated as exact zeros (round-off of a rank-deficient product), so the value is the
    Schatten norm to float64 precision and its gradient stays finite. ``mode="factor"`` is the paper's surrogate
    ``sum_m (||A[:, m]||^2 ||B[m, :]||^2 + 1e-16)^{p/2}`` (as in the reference implementation).

    Raises
    ------
    ValueError
        If ``p <= 0``, ``mode`` is unknown or the factor shapes do not chain.
    """
    _exponent(p, "p (Schatten exponent)")
    for name, t in (("A", A), ("B", B)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point torch.Tensor, got "
                            f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} contains {int((~torch.isfinite(t)).sum())} non-finite value(s) (NaN or inf)")
    if A.ndim != 3 or B.ndim != 3 or A.shape[0] != B.shape[0] or A.shape[2] != B.shape[1]:
        raise ValueError(f"A [C, d_out, m] and B [C, m, d_in] must chain, got {list(A.shape)} and {list(B.shape)}")
    if mode == "factor":
        s = (A**2).sum(1) * (B**2).sum(2)  # [C, m]
        return ((s + EPS) ** (p / 2)).sum(-1)
    if mode != "exact":
        raise ValueError(f"mode must be one of {SCHATTEN_MODES}, got {mode!r}")
    Ad, Bd = A.double(), B.double()
    GA = Ad.transpose(1, 2) @ Ad  # [C, m, m]
    GB = Bd @ Bd.transpose(1, 2)
    m = GA.shape[-1]
    eye = torch.eye(m, dtype=GA.dtype, device=GA.device)
    jitter = 1e-12 * (GB.diagonal(dim1=1, dim2=2).sum(-1) / m)[:, None, None] + 1e-300
    L = torch.linalg.cholesky(GB + jitter * eye)
    M = L.transpose(1, 2) @ GA @ L
    lam = torch.linalg.eigvalsh(0.5 * (M + M.transpose(1, 2)))  # sigma^2 ascending, [C, m]
    r = min(A.shape[1], m, B.shape[2])  # rank(A B) <= r: the m - r smallest eigenvalues are exactly 0
    lam = lam[:, m - r :]
    # eigenvalues below 1e-10 of the largest are round-off of zero singular values: count them as 0 (no gradient)
    keep = lam > 1e-10 * lam.amax(dim=-1, keepdim=True).clamp_min(1e-300)
    val = torch.where(keep, lam.clamp_min(1e-300) ** (p / 2), torch.zeros_like(lam))
    return val.sum(-1).to(A.dtype)


def component_schatten(comps: Components, p: float, mode: str = "exact") -> torch.Tensor:
    """``[C]``: ``sum_s ||P_{c,s}||_p^p`` over sites."""
    return sum(schatten_pp(*comps.factors(s), p=p, mode=mode) for s in comps.sites)


def simplicity_loss(comps: Components, mask: torch.Tensor, p: float, mode: str = "exact") -> torch.Tensor:
    """``sum_{b,c} mask[b,c] sum_s ||P_{c,s}||_p^p / (N * batch)``; ``mask``: ``[batch, C]`` (bool or weights)."""
    if not isinstance(mask, torch.Tensor) or mask.is_complex():
        raise TypeError(f"mask must be a real torch.Tensor [batch, C], got "
                        f"{mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__}")
    if mask.ndim != 2 or mask.shape[0] < 1 or mask.shape[1] != comps.C:
        raise ValueError(f"mask must have shape [batch >= 1, C={comps.C}], got {list(mask.shape)}")
    if mask.is_floating_point() and not bool(torch.isfinite(mask).all()):
        raise ValueError("mask contains NaN or inf")
    per_c = component_schatten(comps, p, mode)
    return (mask.to(per_c.dtype) * per_c).sum() / (comps.n_params * mask.shape[0])


def act_recon_loss(acts: Mapping[str, torch.Tensor], target_acts: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Mean over the named activations of their MSE (mean over entries); shapes must agree name by name."""
    if not isinstance(acts, Mapping) or not isinstance(target_acts, Mapping):
        raise TypeError(f"acts and target_acts must be mappings name -> tensor, got {type(acts).__name__} and "
                        f"{type(target_acts).__name__}")
    if set(acts) != set(target_acts) or not acts:
        raise ValueError(f"acts and target_acts must name the same non-empty set, got {sorted(acts)} / {sorted(target_acts)}")
    for n in acts:
        check_loss_tensor(acts[n], f"acts[{n!r}]", "")
        check_loss_tensor(target_acts[n], f"target_acts[{n!r}]", "")
        if acts[n].shape != target_acts[n].shape:
            raise ValueError(f"acts[{n!r}] and target_acts[{n!r}] must have the same shape, got "
                             f"{list(acts[n].shape)} and {list(target_acts[n].shape)}")
    return sum(((acts[n] - target_acts[n]) ** 2).mean() for n in acts) / len(acts)


def lp_minimality_loss(attr: torch.Tensor, p1: float) -> torch.Tensor:
    """``mean_b sum_c A_c(x_b)^{p1}`` with ``A_c = sqrt(attr)`` (``attr``: ``[batch, C]`` sums of squares)."""
    _exponent(p1, "p1")
    _attr(attr, None)
    return ((attr + EPS) ** (p1 / 2)).sum(-1).mean()


def lp_simplicity_loss(comps: Components, attr: torch.Tensor, p1: float, p2: float, mode: str = "exact") -> torch.Tensor:
    """``mean_b sum_c A_c(x_b)^{p1} sum_s ||P_{c,s}||_{p2}^{p2} / N``."""
    _exponent(p1, "p1")
    _attr(attr, comps.C)
    per_c = component_schatten(comps, p2, mode)
    return (((attr + EPS) ** (p1 / 2)) * per_c).sum(-1).mean() / comps.n_params
