"""Forward passes of the target with its decomposed weights replaced by weighted sums of components.

Every decomposed weight ``W[s]`` is replaced, for each sample ``b``, by

``W_b[s] = base * W*[s] + sum_c coef[b, c] P[c, s]``

where ``base`` is ``True`` for the *target-anchored* form (used for gradient attributions at ``theta*``:
``coef = epsilon``, the derivative at ``epsilon = 0`` is the attribution) and ``False`` for the *component* form
(``coef`` = a top-k mask gives the sparse forward ``f(x | kappa(x))`` of the paper; ``coef = 1`` gives the sum
of all components). ``coef`` is ``[C]`` (shared by the batch) or ``[batch, C]``.

At ``nn.Linear`` sites this never builds a per-sample weight: the module's forward is swapped for
``y = base * W* x + A (coef * (B x)) + bias``, i.e. ``[..., d_in] -> [..., C, m] -> [..., d_out]``, costing
``O(C m (d_in + d_out))`` per sample. At parameter sites (e.g. the tied ``W`` of TMS) the weight is substituted
with :func:`torch.func.functional_call`; per-sample coefficients then use :func:`torch.func.vmap` over the batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from mlpinterp.apd.components import Components, Site, target_weight


def _broadcast_coef(coef: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Reshape ``[batch, C]`` coefficients to broadcast against ``x``'s leading dims ``[batch, ..., d_in]``."""
    if coef.ndim >= 2 and x.ndim > coef.ndim:
        coef = coef.reshape(coef.shape[:-1] + (1,) * (x.ndim - coef.ndim) + coef.shape[-1:])
    return coef


def _linear_forward(mod: nn.Linear, site: Site, comps: Components, state: dict):
    def forward(x: torch.Tensor) -> torch.Tensor:
        if state.get("components", True):
            A, B = comps.factors(site)
            C, d_out, m = A.shape
            inner = F.linear(x, B.reshape(C * m, site.d_in)).unflatten(-1, (C, m))  # [..., C, m]
            coef = state["coef"]
            if coef is not None:
                inner = inner * _broadcast_coef(coef, x)[..., None]
            y = F.linear(inner.flatten(-2), A.permute(1, 0, 2).reshape(d_out, C * m))
            if state["base"]:
                y = y + F.linear(x, mod.weight)
        else:
            y = F.linear(x, mod.weight)
        if mod.bias is not None:
            y = y + mod.bias
        delta = state.get("delta")
        if delta is not None:
            y = y + delta[site.name]
        return y

    return forward


@contextmanager
def _patched(model: nn.Module, comps: Components, state: dict) -> Iterator[None]:
    mods = []
    try:
        for s in comps.sites:
            if s.kind == "linear":
                mod = model.get_submodule(s.name)
                mod.forward = _linear_forward(mod, s, comps, state)
                mods.append(mod)
        yield
    finally:
        for mod in mods:
            del mod.forward


def _param_weights(model: nn.Module, comps: Components, coef: torch.Tensor | None,
                   base: bool) -> dict[str, torch.Tensor]:
    out = {}
    for s in comps.sites:
        if s.kind != "param":
            continue
        P = torch.bmm(*comps.factors(s))  # [C, d_out, d_in]
        w = P.sum(0) if coef is None else torch.einsum("c,coi->oi", coef, P)
        out[s.name] = w + target_weight(model, s) if base else w
    return out


def run_with_components(model: nn.Module, comps: Components, x: torch.Tensor,
                        coef: torch.Tensor | None = None, base: bool = False) -> torch.Tensor:
    """Output of ``model`` on ``x`` with every decomposed weight replaced as described in the module docstring.

    Parameters
    ----------
    model
        The target (its own weights are read, never modified).
    comps
        The components.
    x
        Input ``[batch, ...]``.
    coef
        ``None`` (all coefficients 1), ``[C]`` or ``[batch, C]``.
    base
        Add the target's own weight (``True``) or not (``False``).

    Raises
    ------
    TypeError
        If ``coef`` is not a real tensor.
    ValueError
        If ``coef`` has a shape other than ``[C]`` or ``[batch, C]``, or non-finite values.
    """
    C = comps.C
    if coef is not None:
        if not isinstance(coef, torch.Tensor) or coef.is_complex():
            raise TypeError(f"coef must be a real torch.Tensor [C] or [batch, C], got "
                            f"{coef.dtype if isinstance(coef, torch.Tensor) else type(coef).__name__}")
        if coef.is_floating_point() and not bool(torch.isfinite(coef).all()):
            raise ValueError("coef contains NaN or inf")
    if coef is not None and not (tuple(coef.shape) == (C,) or tuple(coef.shape) == (x.shape[0], C)):
        raise ValueError(f"coef must have shape [{C}] or [{x.shape[0]}, {C}], got {list(coef.shape)}")
    has_params = any(s.kind == "param" for s in comps.sites)
    if not has_params:
        with _patched(model, comps, {"coef": coef, "base": base}):
            return model(x)
    if coef is None or coef.ndim == 1:
        with _patched(model, comps, {"coef": coef, "base": base}):
            return torch.func.functional_call(model, _param_weights(model, comps, coef, base), (x,), strict=False)
    state: dict = {"coef": None, "base": base}
    # per-sample weights of the parameter sites, one GEMM per site ([batch, C] @ [C, d_out d_in]), outside vmap
    weights = {}
    for s in comps.sites:
        if s.kind == "param":
            P = torch.bmm(*comps.factors(s))
            w = (coef @ P.reshape(comps.C, -1)).reshape(-1, s.d_out, s.d_in)
            weights[s.name] = w + target_weight(model, s) if base else w

    def one(xb: torch.Tensor, cb: torch.Tensor, wb: dict) -> torch.Tensor:
        state["coef"] = cb[None]
        return torch.func.functional_call(model, wb, (xb[None],), strict=False)[0]

    with _patched(model, comps, state):
        return torch.func.vmap(one)(x, coef, weights)


@contextmanager
def capture_outputs(model: nn.Module, names: Sequence[str]) -> Iterator[dict[str, torch.Tensor]]:
    """Record the outputs of the named submodules during forwards inside the ``with`` block.

    Raises
    ------
    ValueError
        If a name is not a submodule of ``model``.
    """
    if isinstance(names, str):
        raise TypeError(f"names must be a sequence of module names, got the string {names!r}; use ({names!r},)")
    modules = dict(model.named_modules())
    missing = [n for n in names if n not in modules]
    if missing:
        raise ValueError(f"act_names: {missing} are not submodules of the model; available: {sorted(modules)[:50]}")
    store: dict[str, torch.Tensor] = {}
    handles = [modules[n].register_forward_hook(lambda _m, _i, out, n=n: store.__setitem__(n, out)) for n in names]
    try:
        yield store
    finally:
        for h in handles:
            h.remove()
