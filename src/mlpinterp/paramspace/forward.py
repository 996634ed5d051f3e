"""Forward passes of the target with its decomposed weights replaced by weighted sums of components.

Every decomposed weight ``W[s]`` is replaced, for each sample ``b``, by

``W_b[s] = base * W*[s] + sum_c coef[b, c] P[c, s]``

where ``base`` is ``True`` for the *target-anchored* form (used for gradient attributions at ``theta*``:
``coef = epsilon``, the derivative at ``epsilon = 0`` is the attribution) and ``False`` for the *component* form
(``coef`` = a top-k mask gives the sparse forward ``f(x | kappa(x))`` of the paper; ``coef = 1`` gives the sum
of all components). ``coef`` is ``[C]`` (shared by the batch) or ``[batch, C]``, one for every site (APD: a
component spans all sites), or a mapping ``site name -> [C] | [batch, C]`` with its own coefficients per site
(SPD: every site has its own ``C`` rank-one subcomponents and its own masks). With ``only`` a subset of the sites
is replaced and the others keep the target's weight (SPD's layerwise reconstruction). ``base`` may also be a mapping
``site name -> [batch]``, a per-sample weight ``base_b`` of the target's own weight: SPD's delta component
``sum_c m_bc P_c + r_b (W* - sum_c P_c) = r_b W* + sum_c (m_bc - r_b) P_c`` is this form with ``base_b = r_b``.

At ``nn.Linear`` sites this never builds a per-sample weight: the module's forward is swapped for
``y = base * W* x + A (coef * (B x)) + bias``, i.e. ``[..., d_in] -> [..., C, m] -> [..., d_out]``, costing
``O(C m (d_in + d_out))`` per sample. At parameter sites (e.g. the tied ``W`` of TMS) the weight is substituted
with :func:`torch.func.functional_call`; per-sample coefficients then use :func:`torch.func.vmap` over the batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from mlpinterp.paramspace.components import Components, Site, target_weight


def _broadcast_coef(coef: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Reshape ``[batch, C]`` coefficients to broadcast against ``x``'s leading dims ``[batch, ..., d_in]``."""
    if coef.ndim >= 2 and x.ndim > coef.ndim:
        coef = coef.reshape(coef.shape[:-1] + (1,) * (x.ndim - coef.ndim) + coef.shape[-1:])
    return coef


def _site_coef(coef, name: str):
    """The coefficients of site ``name``: ``coef`` itself (shared by all sites) or its entry in a per-site mapping."""
    return coef.get(name) if isinstance(coef, Mapping) else coef


def _add_base(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, base, name: str) -> torch.Tensor:
    """``y + base * W* x``: ``base`` a bool (all sites) or a mapping ``site -> [batch]`` per-sample weights."""
    b = _site_coef(base, name)
    if isinstance(b, torch.Tensor):
        return y + b.reshape(b.shape + (1,) * (x.ndim - b.ndim)) * F.linear(x, weight)
    return y + F.linear(x, weight) if b else y


def _linear_forward(mod: nn.Linear, site: Site, comps: Components, state: dict):
    def forward(x: torch.Tensor) -> torch.Tensor:
        only = state.get("only")
        if state.get("components", True) and (only is None or site.name in only):
            A, B = comps.factors(site)
            C, d_out, m = A.shape
            inner = F.linear(x, B.reshape(C * m, site.d_in)).unflatten(-1, (C, m))  # [..., C, m]
            coef = _site_coef(state["coef"], site.name)
            if coef is not None:
                inner = inner * _broadcast_coef(coef, x)[..., None]
            y = F.linear(inner.flatten(-2), A.permute(1, 0, 2).reshape(d_out, C * m))
            y = _add_base(y, x, mod.weight, state["base"], site.name)
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
def patched(model: nn.Module, comps: Components, state: dict) -> Iterator[None]:
    """For the duration, every ``nn.Linear`` site of ``model`` computes its masked forward from ``comps`` as ``state``
    says (``coef``: ``None``, ``[C]``/``[batch, C]`` or a per-site mapping; ``base``; ``components``; ``only``: the
    sites that use components; ``delta``: per-site output tangents added); the modules' own forward is restored
    after. Parameter sites are not patched: pass their weights from :func:`param_weights` to a functional call."""
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


def param_weights(model: nn.Module, comps: Components, coef, base: bool,
                  only: frozenset | None = None) -> dict[str, torch.Tensor]:
    """Weights of the parameter sites for a shared ``coef`` (``None``/``[C]``) or a per-site mapping of them."""
    out = {}
    for s in comps.sites:
        if s.kind != "param" or (only is not None and s.name not in only):
            continue
        P = torch.bmm(*comps.factors(s))  # [C, d_out, d_in]
        c = _site_coef(coef, s.name)
        w = P.sum(0) if c is None else torch.einsum("c,coi->oi", c, P)
        out[s.name] = w + target_weight(model, s) if _site_coef(base, s.name) is True else w
    return out


def _check_coef(coef, C: int, n: int, what: str) -> None:
    if not isinstance(coef, torch.Tensor) or coef.is_complex():
        raise TypeError(f"{what} must be a real torch.Tensor [C] or [batch, C], got "
                        f"{coef.dtype if isinstance(coef, torch.Tensor) else type(coef).__name__}")
    if coef.is_floating_point() and not bool(torch.isfinite(coef).all()):
        raise ValueError(f"{what} contains NaN or inf")
    if not (tuple(coef.shape) == (C,) or tuple(coef.shape) == (n, C)):
        raise ValueError(f"{what} must have shape [{C}] or [{n}, {C}], got {list(coef.shape)}")


def run_with_components(model: nn.Module, comps: Components, x: torch.Tensor,
                        coef: torch.Tensor | Mapping[str, torch.Tensor | None] | None = None,
                        base: bool | Mapping[str, torch.Tensor] = False,
                        only: Sequence[str] | None = None) -> torch.Tensor:
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
        ``None`` (all coefficients 1), ``[C]`` or ``[batch, C]`` for every site, or a mapping
        ``site name -> None | [C] | [batch, C]`` (sites it lacks get coefficient 1).
    base
        Add the target's own weight (``True``) or not (``False``), or a mapping ``site name -> [batch]``: the
        target's weight times a per-sample factor at those sites (sites it lacks: not added).
    only
        Names of the sites to replace (``None``: all); the other sites keep the target's weight.

    Raises
    ------
    TypeError
        If ``coef`` (or an entry) is not a real tensor.
    ValueError
        If a ``coef`` has a shape other than ``[C]`` or ``[batch, C]`` or non-finite values, a ``base`` entry is
        not a finite ``[batch]`` tensor of its site's target weight's dtype, or ``coef``/``base``/``only`` name a
        site that is not one of ``comps``.
    """
    C, n = comps.C, x.shape[0]
    names = [s.name for s in comps.sites]
    if isinstance(coef, Mapping):
        unknown = sorted(set(coef) - set(names))
        if unknown:
            raise ValueError(f"coef names unknown sites {unknown}; sites: {names}")
        for k, v in coef.items():
            if v is not None:
                _check_coef(v, C, n, f"coef[{k!r}]")
    elif coef is not None:
        _check_coef(coef, C, n, "coef")
    base_n = {}  # per-sample base factors
    if isinstance(base, Mapping):
        unknown = sorted(set(base) - set(names))
        if unknown:
            raise ValueError(f"base names unknown sites {unknown}; sites: {names}")
        for k, v in base.items():
            if not isinstance(v, torch.Tensor) or not v.is_floating_point() or tuple(v.shape) != (n,):
                raise ValueError(f"base[{k!r}] must be a floating-point tensor of shape [batch={n}], got "
                                 f"{list(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}")
            w_dtype = target_weight(model, comps.sites[names.index(k)]).dtype
            if v.dtype != w_dtype:  # it scales that weight: another dtype is a torch error or a promoted output
                raise ValueError(f"base[{k!r}] must have the dtype of the target's weight {w_dtype}, got {v.dtype}")
            if not bool(torch.isfinite(v).all()):
                raise ValueError(f"base[{k!r}] contains NaN or inf")
        base_n = dict(base)
    elif not isinstance(base, bool):
        raise TypeError(f"base must be a bool or a mapping site name -> [batch] tensor, got {type(base).__name__}")
    if only is not None:
        if isinstance(only, str) or not all(isinstance(o, str) for o in only):
            raise TypeError(f"only must be a sequence of site names, got {only!r}")
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ValueError(f"only names unknown sites {unknown}; sites: {names}")
        only = frozenset(only)
    param_sites = [s for s in comps.sites if s.kind == "param" and (only is None or s.name in only)]
    per_site = {s.name: _site_coef(coef, s.name) for s in comps.sites}
    batched = {k: v for k, v in per_site.items() if v is not None and v.ndim == 2}
    state: dict = {"coef": coef, "base": base, "only": only}
    if not param_sites:
        with patched(model, comps, state):
            return model(x)
    if not any(s.name in batched or s.name in base_n for s in param_sites):
        with patched(model, comps, state):
            return torch.func.functional_call(model, param_weights(model, comps, coef, base, only), (x,),
                                              strict=False)
    static = {k: v for k, v in per_site.items() if k not in batched}
    # per-sample weights of the parameter sites, one GEMM per site ([batch, C] @ [C, d_out d_in]), outside vmap
    weights = {}
    for s in param_sites:
        P = torch.bmm(*comps.factors(s))
        c = per_site[s.name]
        if c is None or c.ndim == 1:
            w = (P.sum(0) if c is None else torch.einsum("c,coi->oi", c, P)).expand(n, s.d_out, s.d_in)
        else:
            w = (c @ P.reshape(comps.C, -1)).reshape(-1, s.d_out, s.d_in)
        b = _site_coef(base, s.name)
        if isinstance(b, torch.Tensor):
            w = w + b[:, None, None] * target_weight(model, s)
        elif b:
            w = w + target_weight(model, s)
        weights[s.name] = w

    def one(xb: torch.Tensor, cb: dict, bb: dict, wb: dict) -> torch.Tensor:
        state["coef"] = {**static, **{k: v[None] for k, v in cb.items()}}
        state["base"] = base if isinstance(base, bool) else {k: v[None] for k, v in bb.items()}
        return torch.func.functional_call(model, wb, (xb[None],), strict=False)[0]

    with patched(model, comps, state):
        return torch.func.vmap(one)(x, batched, base_n, weights)


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
