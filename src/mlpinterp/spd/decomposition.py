"""The trainable SPD decomposition of a target: rank-one subcomponents + causal-importance MLPs per site
(Bushnaq, Braun, Sharkey 2025, Sec. 2).

Every decomposed weight ``W_s`` (``[d_out, d_in]``, an ``nn.Linear`` or a named 2-D parameter, tied ones included;
see :func:`mlpinterp.paramspace.resolve_sites`) is ``sum_c U_c V_c^T`` with ``C`` rank-one subcomponents. They are stored
as APD components of inner rank one (:class:`mlpinterp.paramspace.Components` with ``m = 1``: ``A[s][c] = U_c``,
``B[s][c] = V_c^T``), so APD's forward with per-site coefficients
(:func:`mlpinterp.paramspace.run_with_components`) is the masked forward of SPD, and APD's faithfulness loss and MMCS /
ML2R apply unchanged. Unlike APD, the subcomponents of different sites are independent: site ``s`` subcomponent
``c`` has its own causal importance and mask. Two sites whose target weights are transposes of each other can share
their subcomponents (``tied``: TMS's ``linear2 = linear1^T``, tied this way by the SPD reference implementation);
each still has its own causal importances and masks, and ``tied_updates`` says whether the optimiser sees one set of
factors or the reference's two views of it (:mod:`mlpinterp.spd.tying`).

The causal importance of site ``s`` reads the activation ``a_s`` that ``W_s`` multiplies in the *target*: the input
of the ``nn.Linear`` itself, and for a parameter site the input of the module named in ``reads`` (``""``: the
model's input; default). For the tied ``W`` of TMS (``x_hat = ReLU(W^T W x + b)``) that is ``x``, the input of its
first use, and the mask of subcomponent ``c`` then scales it in both uses. (The reference implementation instead
decomposes the two uses as two separate layers with their own subcomponents.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from mlpinterp.paramspace.components import Components, Site
from mlpinterp.spd.importance import CausalImportance
from mlpinterp.spd.sigmoids import LOWER_SIGMOIDS, upper_leaky_hard_sigmoid
from mlpinterp.spd.tying import TIED_UPDATES, SeparatelyTiedComponents


def _key(name: str) -> str:
    return name.replace(".", "__") or "__input__"


def resolve_reads(model: nn.Module, sites: Sequence[Site], reads: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{site name: module name}`` whose forward input each site's causal importance reads.

    ``nn.Linear`` sites read their own input; parameter sites the module named in ``reads`` (``""`` = the whole
    model, i.e. its input; the default).

    Raises
    ------
    ValueError
        If ``reads`` names a site that is not a parameter site, or a module that the model does not have.
    """
    reads = dict(reads or {})
    names = {s.name: s for s in sites}
    bad = sorted(k for k in reads if k not in names or names[k].kind != "param")
    if bad:
        raise ValueError(f"reads: {bad} are not parameter sites (nn.Linear sites read their own input); parameter "
                         f"sites: {[s.name for s in sites if s.kind == 'param']}")
    modules = dict(model.named_modules())
    out = {}
    for s in sites:
        r = s.name if s.kind == "linear" else reads.get(s.name, "")
        if r not in modules:
            raise ValueError(f"reads[{s.name!r}] = {r!r} is not a module of the model; modules: {sorted(modules)[:40]}")
        out[s.name] = r
    return out


@contextmanager
def capture_reads(model: nn.Module, reads: Mapping[str, str]) -> Iterator[dict[str, torch.Tensor]]:
    """Record ``{site: the first positional input of module reads[site]}`` during forwards inside the block."""
    store: dict[str, torch.Tensor] = {}
    by_module: dict[str, list[str]] = {}
    for site, mod in reads.items():
        by_module.setdefault(mod, []).append(site)

    def hook(_m, args, sites):
        for s in sites:
            store[s] = args[0]

    handles = [model.get_submodule(m).register_forward_pre_hook(lambda mod, args, s=sites: hook(mod, args, s))
               for m, sites in by_module.items()]
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


#: Subcomponent initialisations (see :class:`Decomposition`).
SPD_INITS = ("scaled", "paper-era")


def check_tied_weights(weights: Mapping[str, torch.Tensor], tied: Mapping[str, str], rtol: float = 1e-6) -> None:
    """``ValueError`` unless the target weight of every tied site equals its source's transposed (to ``rtol`` of the
    largest entry): sharing subcomponents is only faithful for a weight and its transpose."""
    for dst, src in tied.items():
        a, b = weights[dst], weights[src].T
        scale = float(b.abs().max()) if b.numel() else 0.0
        if a.shape != b.shape or float((a - b).abs().max()) > rtol * max(scale, 1e-30):
            gap = float((a - b).abs().max()) if a.shape == b.shape else float("nan")
            raise ValueError(f"tied: the target weight of {dst!r} is not {src!r}'s transposed (largest difference "
                             f"{gap:.3g}, shapes {list(a.shape)} and {list(b.shape)}); tie only sites whose weights "
                             "are transposes of each other (TMS's linear1 and linear2)")


class Decomposition(nn.Module):
    """Subcomponents (``components``, APD :class:`Components` with ``m = 1``) and one :class:`CausalImportance`
    per site (``importance[site]``), with ``reads`` (from :func:`resolve_reads`).

    ``init``: ``"scaled"`` (``U_c ~ N(0, 1/C)``, ``V_c ~ N(0, 1/d_in)``; the current SPD reference's scale) or
    ``"paper-era"`` (the SPD reference implementation at the paper's time, June 2025, whose ``init_Vs_and_Us_``
    overwrote the random factors: ``V_c`` and ``U_c`` uniform random unit vectors, then ``U_c`` scaled by the overlap
    ``U_c^T W V_c`` with the target weight, so each subcomponent starts as the projection of ``W`` on ``U_c V_c^T``;
    needs ``target_weights``).

    ``tied``: ``{site: source site}`` sharing subcomponents transposed (:class:`Components`); their target weights
    must be transposes of each other (checked by :func:`check_tied_weights` when ``target_weights`` are given).
    ``tied_updates``: ``"summed"`` (one set of factors) or ``"separate"`` (the tied site's own parameter views of
    them, :class:`~mlpinterp.spd.tying.SeparatelyTiedComponents`, as the SPD reference).
    ``lower_sigmoid``: the sigma_H,lower of the masks, ``"leaky"`` (the paper's) or ``"clamped"`` (the current
    reference's; :mod:`mlpinterp.spd.sigmoids`).

    Raises ``ValueError`` for ``C < 1``, ``d_gate < 1``, another ``init``, ``tied_updates`` or ``lower_sigmoid``,
    ``"paper-era"`` without ``target_weights``, or a bad ``tied`` (and what :class:`Components` raises).
    """

    def __init__(self, sites: Sequence[Site], C: int, d_gate: int, reads: Mapping[str, str],
                 generator: torch.Generator | None = None, init: str = "scaled",
                 tied: Mapping[str, str] | None = None, target_weights: Mapping[str, torch.Tensor] | None = None,
                 tied_updates: str = "summed", lower_sigmoid: str = "leaky"):
        super().__init__()
        if init not in SPD_INITS:
            raise ValueError(f"init must be one of {SPD_INITS}, got {init!r}")
        if tied_updates not in TIED_UPDATES:
            raise ValueError(f"tied_updates must be one of {TIED_UPDATES}, got {tied_updates!r}")
        if lower_sigmoid not in LOWER_SIGMOIDS:
            raise ValueError(f"lower_sigmoid must be one of {tuple(LOWER_SIGMOIDS)}, got {lower_sigmoid!r}")
        if init == "paper-era" and target_weights is None:
            raise ValueError("init='paper-era' scales each subcomponent by its overlap with the target weight: pass "
                             "target_weights ({site: [d_out, d_in]})")
        kind = SeparatelyTiedComponents if tied_updates == "separate" else Components
        self.components = kind(sites, C, m=1, init_scale=1.0, generator=generator, tied=tied)
        self.lower_sigmoid = lower_sigmoid
        if target_weights is not None:
            missing = [s.name for s in sites if s.name not in target_weights]
            if missing:
                raise ValueError(f"target_weights lacks sites {missing}")
            check_tied_weights(target_weights, self.components.tied)
        if init == "paper-era":
            self._overlap_init_(target_weights, generator)
        self.importance = nn.ModuleDict({_key(s.name): CausalImportance(C, d_gate, generator) for s in sites})
        self.reads = dict(reads)

    @torch.no_grad()
    def _overlap_init_(self, target_weights: Mapping[str, torch.Tensor], generator: torch.Generator | None) -> None:
        """``V_c``, ``U_c`` random unit vectors, ``U_c <- (U_c^T W V_c) U_c`` on every site that owns its factors."""
        for s in self.components.owned_sites:
            A, B = self.components.factors(s)  # [C, d_out, 1], [C, 1, d_in]
            V = torch.randn(B.shape, generator=generator, dtype=B.dtype)
            U = torch.randn(A.shape, generator=generator, dtype=A.dtype)
            V /= V.norm(dim=-1, keepdim=True)
            U /= U.norm(dim=1, keepdim=True)
            W = target_weights[s.name].detach().to(device="cpu", dtype=A.dtype)
            overlap = torch.einsum("co,oi,ci->c", U[:, :, 0], W, V[:, 0, :])
            A.copy_(U * overlap[:, None, None])
            B.copy_(V)

    @property
    def sites(self) -> list[Site]:
        return self.components.sites

    @property
    def C(self) -> int:
        return self.components.C

    def U(self, site: Site | str) -> torch.Tensor:
        """``[d_out, C]``: column ``c`` is ``U_c`` (writes to the output space)."""
        return self.components.factors(site)[0][:, :, 0].T

    def V(self, site: Site | str) -> torch.Tensor:
        """``[C, d_in]``: row ``c`` is ``V_c^T`` (reads from the input space)."""
        return self.components.factors(site)[1][:, 0, :]

    def inner_acts(self, acts: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{site: h = a V^T}`` (``[..., C]``) from the target's site inputs ``{site: a [..., d_in]}``.

        Raises ``ValueError`` when a site's input is missing or its last dimension is not ``d_in``.
        """
        out = {}
        for s in self.sites:
            if s.name not in acts:
                raise ValueError(f"no input captured for site {s.name!r} (reads {self.reads.get(s.name)!r}); "
                                 "was the target run inside capture_reads?")
            a = acts[s.name]
            if a.shape[-1] != s.d_in:
                raise ValueError(f"site {s.name!r} reads the input of module {self.reads[s.name]!r}, of shape "
                                 f"{list(a.shape)}, but its weight has d_in = {s.d_in}; set reads to a module whose "
                                 f"input has {s.d_in} features")
            out[s.name] = a @ self.V(s).T
        return out

    def causal_importance(self, acts: Mapping[str, torch.Tensor], compile: bool = False) -> tuple[dict, dict]:
        """``(g_lower, g_upper)``: ``{site: [..., C]}`` through sigma_H,lower (masks; ``self.lower_sigmoid``) and
        sigma_H,upper (minimality); ``compile``: the importance MLPs through ``torch.compile``
        (:class:`CausalImportance`)."""
        raw = {k: self.importance[_key(k)](h, compile) for k, h in self.inner_acts(acts).items()}
        lower = LOWER_SIGMOIDS[self.lower_sigmoid]
        return ({k: lower(v) for k, v in raw.items()},
                {k: upper_leaky_hard_sigmoid(v) for k, v in raw.items()})

    def target_forward(self, model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(model(x), {site: a})``: the target's output and the inputs its decomposed weights multiply."""
        with capture_reads(model, self.reads) as acts:
            out = model(x)
        return out, dict(acts)
