"""Gradient attributions of parameter components (Braun et al. 2025, App. A.1, eq. for ``A_c(x)``).

For each sample ``x`` and component ``c`` we return the sum over outputs of the squared first-order effect

``attr[b, c] = sum_o ( sum_{s,i,j} d f_o(x_b, theta) / d theta_{s,i,j} * P_{c,s,i,j} )^2``

evaluated at ``theta = theta*`` (``source="target"``) or at ``theta = sum_c P_c`` (``source="apd"``, the variant the
paper used for TMS 5-2). The paper's ``A_c(x)`` is ``sqrt(attr / d_L)``; the monotone transform does not change
top-k selections. All non-batch output dimensions are summed over.

The inner sum is the directional derivative of ``f`` along ``P_c``. Three ways to get it:

- ``method="forward"`` (any model): forward-mode AD, ``vmap`` over the ``C`` components of one
  :func:`torch.func.jvp`. At an ``nn.Linear`` site the parameter tangent ``P_c`` enters as the output tangent
  ``A_c (B_c x)`` (``x`` the site's input), so no ``[C, d_out, d_in]`` tensor and no ``C x C`` work is formed;
  at a parameter site (e.g. tied weights) the tangent is ``P_c`` itself. Cost: ``C`` tangent propagations.
- ``method="closed"`` (residual-MLP stacks: the toy targets): the same derivative in closed form. With
  ``r_0 = embed(x)``, ``pre_l = W_in_l r_l + b``, ``h_l = ReLU(pre_l)``, ``r_{l+1} = r_l + W_out_l h_l + b'`` and
  ``f = W_U r_L``, the tangent obeys ``d pre_l = W_in_l d r_l + A_in_l (B_in_l r_l)``,
  ``d h_l = 1[pre_l > 0] * d pre_l``, ``d r_{l+1} = d r_l + W_out_l d h_l + A_out_l (B_out_l h_l)``. The residual
  stream never has to be formed: ``W_in_k d r_k`` and ``W_U d r_L`` only need the sample-independent products
  ``W_in_k W_out_j``, ``W_in_k A_out_j``, ``W_U W_out_j`` and ``W_U A_out_j``. Writing
  ``W_U d r_L = M_c z`` with ``z = (d h_j, B_out_j h_j)_j`` (length ``D = L (d_mlp + m)``), the squared norm is
  ``z^T (M_c^T M_c) z`` with a ``D x D`` Gram matrix when ``d_out > D``. Per-sample cost
  ``O(C (L^2 d_mlp^2 + D min(D, d_out)))`` instead of ``O(C d_resid (d_mlp + d_out))``.
- ``method="closed"`` also covers the tied-weight TMS ``f = ReLU(W^T W x + b)`` (decomposed site ``W``): the
  tangent is ``1[pre > 0] * (P_c^T (W x) + W^T (P_c x))``, three GEMMs over all components at once
  (``O(batch C d_hidden n_features)``, no autograd).
- :func:`attributions_reference`: the paper's algorithm, one reverse-mode backward pass per output dimension
  (kept as the oracle and for benchmarks).

``method="auto"`` picks ``"closed"`` when the model qualifies (:func:`closed_form_applies`), else ``"forward"``.
"""

from __future__ import annotations

import torch
from torch import nn

from mlpinterp.paramspace.components import Components
from mlpinterp.paramspace.forward import param_weights, patched, run_with_components
from mlpinterp.utils.validation import check_batch_tensor

SOURCES = ("target", "apd")
METHODS = ("auto", "forward", "closed")


def _check_source(source: str) -> bool:
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    return source == "target"


def is_residual_mlp(model: nn.Module, comps: Components) -> bool:
    """Whether the closed form applies: ``model`` has ``embed(x)``, ``readout_weight()`` (``[d_out, d_resid]``) and
    ``layers`` of blocks with ``nn.Linear`` ``mlp_in``/``mlp_out`` and ``nn.ReLU`` ``act`` computing
    ``r + mlp_out(act(mlp_in(r)))``, and every site is one of those ``nn.Linear`` modules."""
    if not (hasattr(model, "embed") and hasattr(model, "readout_weight") and hasattr(model, "layers")):
        return False
    names = set()
    for i, blk in enumerate(model.layers):
        if not (isinstance(getattr(blk, "mlp_in", None), nn.Linear) and isinstance(getattr(blk, "mlp_out", None), nn.Linear)
                and isinstance(getattr(blk, "act", None), nn.ReLU)):
            return False
        names |= {f"layers.{i}.mlp_in", f"layers.{i}.mlp_out"}
    return all(s.kind == "linear" and s.name in names for s in comps.sites)


def is_tied_relu_autoencoder(model: nn.Module, comps: Components) -> bool:
    """Whether ``model`` declares ``tied_relu_autoencoder`` true (it computes ``ReLU(W^T W x + b)`` from a tied
    parameter ``W`` ``[d_hidden, n_features]`` and a bias ``b``, as :class:`~mlpinterp.toys.tms.TMS` without an
    identity layer does) and its only decomposed site is the parameter ``W``."""
    return (getattr(model, "tied_relu_autoencoder", False) is True and len(comps.sites) == 1
            and comps.sites[0].kind == "param" and comps.sites[0].name == "W")


def closed_form_applies(model: nn.Module, comps: Components) -> bool:
    """Whether ``method="closed"`` is available: a residual-MLP stack (:func:`is_residual_mlp`) or a tied ReLU
    autoencoder such as TMS (:func:`is_tied_relu_autoencoder`)."""
    return is_residual_mlp(model, comps) or is_tied_relu_autoencoder(model, comps)


def attributions(model: nn.Module, comps: Components, x: torch.Tensor, source: str = "target",
                 chunk_size: int | None = None, method: str = "auto") -> torch.Tensor:
    """Batched gradient attributions ``[batch, C]`` (all outputs and components at once).

    Differentiable with respect to the component factors (needed by the Lp variant); call it under
    ``torch.no_grad()`` when only a top-k mask is needed. ``chunk_size`` bounds how many components the forward
    method propagates at once (memory ``~ chunk_size x`` one forward).

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor.
    ValueError
        If ``source`` or ``method`` is unknown, ``method="closed"`` for a model that does not qualify, ``x`` has
        no batch dimension or non-finite values, or ``chunk_size`` is not a positive int.
    """
    base = _check_source(source)
    check_batch_tensor(x, "x")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    closed_ok = closed_form_applies(model, comps)
    if method == "closed" and not closed_ok:
        raise ValueError("method='closed' needs a residual-MLP model (see is_residual_mlp) with only its "
                         "mlp_in/mlp_out Linear layers as targets, or a TMS with only W decomposed")
    if (method == "closed" or (method == "auto" and closed_ok)) and is_tied_relu_autoencoder(model, comps):
        return _closed_tms(model, comps, x, base)
    if method == "closed" or (method == "auto" and closed_ok):
        # chunks of 256 samples keep the [C, chunk, D] intermediates cache-sized (memory-bound otherwise)
        return torch.cat([_closed_residual_mlp(model, comps, xc, base) for xc in x.split(256)])
    return _forward_mode(model, comps, x, base, chunk_size)


def _forward_mode(model: nn.Module, comps: Components, x: torch.Tensor, base: bool,
                  chunk_size: int | None) -> torch.Tensor:
    C = comps.C
    lin = [s for s in comps.sites if s.kind == "linear"]
    has_params = any(s.kind == "param" for s in comps.sites)
    # primal pass: the inputs of every Linear site under theta (target or summed components)
    inputs: dict[str, torch.Tensor] = {}
    handles = [model.get_submodule(s.name).register_forward_pre_hook(
        lambda _m, args, n=s.name: inputs.__setitem__(n, args[0])) for s in lin]
    try:  # (under the caller's grad mode: the Lp variant differentiates through the site inputs too)
        if base:
            model(x)
        else:
            run_with_components(model, comps, x, None, base=False)
    finally:
        for h in handles:
            h.remove()
    w = {s.name: torch.einsum("...i,cmi->...cm", inputs[s.name], comps.factors(s)[1]) for s in lin}  # [b, C, m]
    eps0 = torch.zeros(C, dtype=x.dtype, device=x.device)
    delta0 = {s.name: torch.zeros(w[s.name].shape[:-2] + (s.d_out,), dtype=x.dtype, device=x.device) for s in lin}
    state = {"coef": None, "base": base, "components": not base, "delta": None}

    def f(delta: dict, eps: torch.Tensor) -> torch.Tensor:
        state["delta"] = delta
        if not has_params:
            return model(x)
        weights = param_weights(model, comps, eps if base else 1.0 + eps, base)
        return torch.func.functional_call(model, weights, (x,), strict=False)

    def tangent_out(c: torch.Tensor) -> torch.Tensor:
        t_delta = {s.name: torch.einsum("...m,om->...o", w[s.name][..., c, :], comps.factors(s)[0][c]) for s in lin}
        t_eps = (torch.arange(C, device=x.device) == c).to(x.dtype)
        return torch.func.jvp(f, (delta0, eps0), (t_delta, t_eps))[1]

    with patched(model, comps, state):
        J = torch.func.vmap(tangent_out, chunk_size=chunk_size)(torch.arange(C, device=x.device))
    return J.pow(2).flatten(2).sum(-1).T  # [C, batch, ...] -> [batch, C]


def _closed_tms(model: nn.Module, comps: Components, x: torch.Tensor, base: bool) -> torch.Tensor:
    A, B = comps.factors("W")  # [C, d_h, m], [C, m, n]
    P = torch.bmm(A, B)  # [C, d_h, n]
    C, d_h, n = P.shape
    W = model.W.to(x.dtype) if base else P.sum(0)
    P_rows, P_cols = P.reshape(C * d_h, n).T, P.permute(1, 0, 2).reshape(d_h, C * n)

    def chunk(xc: torch.Tensor) -> torch.Tensor:  # 512 samples keep [chunk, C, n] cache-sized
        h = xc @ W.T  # [b, d_h]
        mask = (h @ W + model.b > 0).to(x.dtype)  # [b, n]
        d_pre = ((xc @ P_rows).reshape(-1, d_h) @ W).reshape(-1, C, n)  # W^T P_c x
        d_pre += (h @ P_cols).reshape(-1, C, n)  # + P_c^T h
        d_pre *= mask[:, None, :]
        return torch.linalg.vecdot(d_pre, d_pre)  # [b, C]

    return torch.cat([chunk(xc) for xc in x.split(512)])


def _closed_residual_mlp(model: nn.Module, comps: Components, x: torch.Tensor, base: bool) -> torch.Tensor:
    summed = {} if base else comps.summed()
    names = {s.name for s in comps.sites}

    def weight(name: str) -> torch.Tensor:
        return summed[name] if name in summed else model.get_submodule(name).weight

    def factors(name: str):
        return comps.factors(name) if name in names else None

    R = model.readout_weight().to(x.dtype)  # [d_out, d_resid]
    r = model.embed(x)
    L = len(model.layers)
    W_in = [weight(f"layers.{l}.mlp_in") for l in range(L)]
    W_out = [weight(f"layers.{l}.mlp_out") for l in range(L)]
    dh: list[torch.Tensor] = []  # [b, C, d_mlp]
    w_out: list[torch.Tensor | None] = []  # [b, C, m]
    for l, blk in enumerate(model.layers):
        pre = r @ W_in[l].T + (blk.mlp_in.bias if blk.mlp_in.bias is not None else 0.0)
        h = torch.relu(pre)
        dpre = 0.0
        fin = factors(f"layers.{l}.mlp_in")
        if fin is not None:
            A, B = fin
            dpre = torch.einsum("bcm,cdm->bcd", torch.einsum("bi,cmi->bcm", r, B), A)
        for j in range(l):  # W_in_l d r_l = sum_j (W_in_l W_out_j) dh_j + (W_in_l A_out_j) w_out_j
            dpre = dpre + torch.einsum("bcd,ed->bce", dh[j], W_in[l] @ W_out[j])
            if w_out[j] is not None:
                A_out = factors(f"layers.{j}.mlp_out")[0]
                dpre = dpre + torch.einsum("bcm,cem->bce", w_out[j], torch.einsum("er,crm->cem", W_in[l], A_out))
        if isinstance(dpre, float):
            dpre = torch.zeros(x.shape[0], comps.C, h.shape[-1], dtype=x.dtype, device=x.device)
        dh.append((pre > 0).to(x.dtype)[:, None, :] * dpre)
        fout = factors(f"layers.{l}.mlp_out")
        w_out.append(torch.einsum("bi,cmi->bcm", h, fout[1]) if fout is not None else None)
        r = r + h @ W_out[l].T + (blk.mlp_out.bias if blk.mlp_out.bias is not None else 0.0)
    # W_U d r_L = M_c z with z = concat_j(dh_j, w_out_j) and M_c = [W_U W_out_j, W_U A_out_j]_j
    z = torch.cat([t for j in range(L) for t in (dh[j], w_out[j]) if t is not None], dim=-1)  # [b, C, D]
    blocks = []
    for j in range(L):
        blocks.append((R @ W_out[j]).expand(comps.C, -1, -1))
        if w_out[j] is not None:
            blocks.append(torch.einsum("or,crm->com", R, factors(f"layers.{j}.mlp_out")[0]))
    M = torch.cat(blocks, dim=-1)  # [C, d_out, D]
    if M.shape[1] <= M.shape[2]:  # few outputs: form d f directly
        df = torch.bmm(z.transpose(0, 1), M.transpose(1, 2))  # [C, b, d_out]
        return df.pow(2).sum(-1).T
    # many outputs: ||M_c z||^2 = z^T (M_c^T M_c) z with the [D, D] Gram matrix (D = L (d_mlp + m))
    G = M.transpose(1, 2) @ M  # [C, D, D]
    zt = z.transpose(0, 1)  # [C, b, D]
    return (torch.bmm(zt, G) * zt).sum(-1).T


def attributions_reference(model: nn.Module, comps: Components, x: torch.Tensor,
                           source: str = "target") -> torch.Tensor:
    """Per-output reference ``[batch, C]``: one backward pass per output dimension (the APD paper's loop).

    Uses per-sample coefficients ``eps[b, c]`` (zero), so the gradient of ``sum_b f_o(x_b)`` with respect to
    ``eps`` is the per-sample derivative; squares are accumulated over outputs. Not differentiable.
    """
    base = _check_source(source)
    with torch.enable_grad():
        eps = torch.zeros(x.shape[0], comps.C, dtype=x.dtype, device=x.device, requires_grad=True)
        out = run_with_components(model, comps, x, eps if base else 1.0 + eps, base=base)
        flat = out.reshape(out.shape[0], -1)
        attr = torch.zeros(x.shape[0], comps.C, dtype=x.dtype, device=x.device)
        for o in range(flat.shape[1]):
            (g,) = torch.autograd.grad(flat[:, o].sum(), eps, retain_graph=o + 1 < flat.shape[1])
            attr += g.detach() ** 2
    return attr
