"""Parameter components of APD, factored low rank per decomposed weight (Braun et al. 2025, Sec. 2.2, App. A.3).

A *site* is one decomposed weight matrix of the target, named either by an ``nn.Linear`` module
(``"layers.0.mlp_in"``: its ``weight``, ``[d_out, d_in]`` as in ``torch.nn.Linear``) or by a 2-D parameter
(``"W"``: any parameter, used anywhere in the forward, e.g. tied as in TMS). Biases, embeddings and every other
parameter stay fixed: the paper's always-active component.

Component ``c`` at site ``s`` is ``P[c, s] = A[s][c] @ B[s][c]`` with ``A[s]``: ``[C, d_out, m]`` and
``B[s]``: ``[C, m, d_in]`` (inner rank ``m``; ``B`` *reads* from the input space, ``A`` *writes* to the output
space). Faithfulness asks ``sum_c P[c, s] = W*[s]`` at every site.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Site:
    """One decomposed weight: ``name`` in the target, ``kind`` ``"linear"`` (an ``nn.Linear`` module) or
    ``"param"`` (a named 2-D parameter), and its shape ``[d_out, d_in]``."""

    name: str
    kind: str
    d_out: int
    d_in: int

    @property
    def numel(self) -> int:
        return self.d_out * self.d_in


def resolve_sites(model: nn.Module, targets: Sequence[str]) -> list[Site]:
    """Resolve target names to :class:`Site` objects.

    Raises
    ------
    TypeError
        If ``targets`` is a string or not a sequence of strings.
    ValueError
        If ``targets`` is empty, has duplicates, or names neither an ``nn.Linear`` module nor a 2-D parameter.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if (isinstance(targets, str) or not isinstance(targets, Sequence)
            or not all(isinstance(t, str) for t in targets)):
        raise TypeError(f"targets must be a sequence (list/tuple) of module/parameter names (str), got {targets!r}")
    if len(targets) == 0:
        raise ValueError("targets must name at least one nn.Linear module or 2-D parameter, got []")
    if len(set(targets)) != len(targets):
        raise ValueError(f"targets must not contain duplicates, got {list(targets)}")
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    sites = []
    for t in targets:
        if t in modules and isinstance(modules[t], nn.Linear):
            w = modules[t].weight
            sites.append(Site(t, "linear", int(w.shape[0]), int(w.shape[1])))
        elif t in params and params[t].ndim == 2:
            sites.append(Site(t, "param", int(params[t].shape[0]), int(params[t].shape[1])))
        else:
            linear = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
            mats = [n for n, p in params.items() if p.ndim == 2]
            what = "a module that is not nn.Linear" if t in modules else (
                f"a {params[t].ndim}-D parameter" if t in params else "not found")
            raise ValueError(
                f"targets: {t!r} must name an nn.Linear module or a 2-D parameter of the model ({what}); "
                f"nn.Linear modules: {linear}; 2-D parameters: {mats}")
    linear_weights = {f"{s.name}.weight" for s in sites if s.kind == "linear"}
    clash = [s.name for s in sites if s.kind == "param" and s.name in linear_weights]
    if clash:
        raise ValueError(f"targets name the same weight twice (as module and as parameter): {clash}")
    return sites


def target_weight(model: nn.Module, site: Site) -> torch.Tensor:
    """The target's current weight at ``site``: ``[d_out, d_in]``."""
    if site.kind == "linear":
        return model.get_submodule(site.name).weight
    return model.get_parameter(site.name)


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _key(name: str) -> str:
    return name.replace(".", "__")


INITS = ("scaled", "reference")


def reference_init_std(C: int, d: int, m: int, instances: int = 3) -> float:
    """Entry std of ``torch.nn.init.xavier_normal_`` on a 4-D tensor ``[instances, C, d, m]``, as the APD reference
    initialises its factors: fan_in ``= C d m``, fan_out ``= instances d m``, std ``= sqrt(2 / (fan_in + fan_out))
    = sqrt(2 / ((C + instances) d m))``."""
    for name, v in (("C", C), ("d", d), ("m", m), ("instances", instances)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return math.sqrt(2.0 / ((C + instances) * d * m))


def reference_rank(d_out: int, d_in: int) -> int:
    """The APD reference's inner rank for TMS: ``min(d_out, d_in) + 1`` (11 for TMS 40-10)."""
    for name, v in (("d_out", d_out), ("d_in", d_in)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return min(d_out, d_in) + 1


def _check_tied(sites: Sequence[Site], tied: Mapping[str, str] | None,
                m: int | None | Mapping[str, int]) -> dict[str, str]:
    """Validated ``{tied site: source site}`` (see :class:`Components`)."""
    if tied is None:
        return {}
    if not isinstance(tied, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tied.items()):
        raise TypeError(f"tied must be a mapping tied site name -> source site name (str), got {tied!r}")
    by_name = {s.name: s for s in sites}
    for dst, src in tied.items():
        unknown = [n for n in (dst, src) if n not in by_name]
        if unknown:
            raise ValueError(f"tied: {unknown} are not sites; sites: {list(by_name)}")
        if dst == src or src in tied:
            raise ValueError(f"tied: {dst!r} -> {src!r}: a site can only be tied to a site that holds its own factors "
                             f"(not to itself or to another tied site); tied: {dict(tied)}")
        a, b = by_name[dst], by_name[src]
        if (a.d_out, a.d_in) != (b.d_in, b.d_out):
            raise ValueError(f"tied: {dst!r} has shape [{a.d_out}, {a.d_in}] but {src!r} transposed is "
                             f"[{b.d_in}, {b.d_out}]; only a weight and its transpose can share components")
        if isinstance(m, Mapping) and dst in m and m.get(src, None) != m[dst]:
            raise ValueError(f"tied: m[{dst!r}] = {m[dst]} differs from its source's m[{src!r}] = {m.get(src)}; a tied "
                             "site has its source's inner rank")
    return dict(tied)


class Components(nn.Module):
    """``C`` parameter components, factored per site with inner rank ``m``.

    Parameters
    ----------
    sites
        Decomposed weights (from :func:`resolve_sites`).
    C
        Number of components.
    m
        Inner rank per site: an int for every site, ``None`` for full rank ``min(d_out, d_in)``, or a mapping
        ``site name -> int``.
    init_scale
        ``B`` rows start ``~ N(0, 1/d_in)`` and ``A`` entries ``~ N(0, init_scale^2 / (C m))``, so that the sum
        of components starts with the typical scale of a ``nn.Linear`` weight times ``init_scale``.
    init
        ``"scaled"`` (the above) or ``"reference"``: the APD reference implementation's Xavier-normal over 4-D
        tensors ``[instances, C, d, m]`` (see :func:`reference_init_std`), so the summed weight starts small
        (entry std ``sqrt(C m) std_A std_B``, ≈ 0.004 for TMS 40-10); ``init_scale`` multiplies ``A``.
    instances
        Number of model instances the reference trained at once (it enters the Xavier fan-out); only for
        ``init="reference"``.
    generator
        Optional ``torch.Generator`` for the initialisation.
    tied
        ``{site: source site}``: ``site`` owns no factors; its components are the source's transposed
        (``A[site] = B[source]^T``, ``B[site] = A[source]^T``, so ``P[c, site] = P[c, source]^T``), for two uses of one
        weight written as two matrices (TMS's ``linear1`` = ``W`` and ``linear2`` = ``W^T``, tied this way in the SPD
        reference implementation). Gradients of both uses reach the source's factors.

    Raises ``ValueError`` for ``C < 1``, a bad ``m``, ``init`` or ``instances``, and for ``tied`` entries that name
    unknown sites, a site tied to itself or to a tied site, or shapes that are not transposes.
    """

    def __init__(self, sites: Sequence[Site], C: int, m: int | None | Mapping[str, int] = None,
                 init_scale: float = 1.0, generator: torch.Generator | None = None, init: str = "scaled",
                 instances: int = 3, tied: Mapping[str, str] | None = None):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
            raise ValueError(f"instances must be a positive int, got {instances!r}")
        if isinstance(C, bool) or not isinstance(C, int) or C <= 0:
            raise ValueError(f"C (number of components) must be a positive int, got {C!r}")
        if isinstance(sites, (str, Site)) or not isinstance(sites, Sequence):
            raise TypeError(f"sites must be a sequence of Site (from resolve_sites), got {type(sites).__name__}")
        bad = [s for s in sites if not isinstance(s, Site)]
        if bad:
            raise TypeError(f"sites must hold Site objects (from resolve_sites), got {bad[0]!r}")
        if len(sites) == 0:
            raise ValueError("sites must hold at least one Site, got []")
        if isinstance(init_scale, bool) or not isinstance(init_scale, (int, float)) or not math.isfinite(init_scale):
            raise ValueError(f"init_scale must be a finite real number, got {init_scale!r}")
        if isinstance(m, Mapping):
            unknown = sorted(set(m) - {s.name for s in sites})
            if unknown:
                raise ValueError(f"m names unknown sites {unknown}; sites: {[s.name for s in sites]}")
        self.sites = list(sites)
        self.tied = _check_tied(self.sites, tied, m)
        self.C = C
        self.A = nn.ParameterDict()
        self.B = nn.ParameterDict()
        for s in self.owned_sites:
            ms = m.get(s.name) if isinstance(m, Mapping) else m
            ms = min(s.d_out, s.d_in) if ms is None else ms
            if isinstance(ms, bool) or not isinstance(ms, int) or ms <= 0:
                raise ValueError(f"m (inner rank) for site {s.name!r} must be a positive int or None, got {ms!r}")
            if init == "reference":
                std_A, std_B = (reference_init_std(C, d, ms, instances) for d in (s.d_out, s.d_in))
                std_A *= init_scale
            else:
                std_A, std_B = init_scale / math.sqrt(C * ms), 1.0 / math.sqrt(s.d_in)
            A = torch.randn(C, s.d_out, ms, generator=generator) * std_A
            B = torch.randn(C, ms, s.d_in, generator=generator) * std_B
            self.A[_key(s.name)] = nn.Parameter(A)
            self.B[_key(s.name)] = nn.Parameter(B)

    @property
    def owned_sites(self) -> list[Site]:
        """The sites that hold their own factors (all but the ``tied`` ones)."""
        return [s for s in self.sites if s.name not in self.tied]

    def factors(self, site: Site | str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A, B)`` of ``site``: ``[C, d_out, m]`` and ``[C, m, d_in]`` (views of the source's for a tied site)."""
        name = site.name if isinstance(site, Site) else site
        if isinstance(name, str) and name in self.tied:
            A, B = self.factors(self.tied[name])
            return B.transpose(1, 2), A.transpose(1, 2)
        if not isinstance(name, str) or _key(name) not in self.A:
            raise ValueError(f"site {name!r} is not a site of these components; sites: {[s.name for s in self.sites]}")
        return self.A[_key(name)], self.B[_key(name)]

    def rank(self, site: Site | str) -> int:
        return int(self.factors(site)[0].shape[-1])

    def weights(self) -> dict[str, torch.Tensor]:
        """Full component matrices ``{site: [C, d_out, d_in]}``."""
        return {s.name: torch.bmm(*self.factors(s)) for s in self.sites}

    def summed(self) -> dict[str, torch.Tensor]:
        """``{site: sum_c P[c] ([d_out, d_in])}``, one matmul per site (``[d_out, C m] @ [C m, d_in]``)."""
        out = {}
        for s in self.sites:
            A, B = self.factors(s)
            C, d_out, m = A.shape
            out[s.name] = A.permute(1, 0, 2).reshape(d_out, C * m) @ B.reshape(C * m, s.d_in)
        return out

    @property
    def n_params(self) -> int:
        """Number of decomposed target parameters ``N`` (the faithfulness normaliser)."""
        return sum(s.numel for s in self.sites)

    @torch.no_grad()
    def normalize_B_(self) -> None:
        """Rescale every row of every ``B`` to unit norm over ``d_in`` (paper App. D.2, resid-MLP-1); tied sites
        are left to their source."""
        for s in self.owned_sites:
            B = self.factors(s)[1]
            B.div_(B.norm(dim=-1, keepdim=True).clamp_min(1e-12))

    @classmethod
    def from_weights(cls, sites: Sequence[Site], weights: Mapping[str, torch.Tensor],
                     m: int | None = None, atol: float = 1e-5) -> Components:
        """Exact factors of given component matrices ``{site: [C, d_out, d_in]}`` via SVD.

        Used to score a hand-built (e.g. ground-truth) decomposition. ``m`` defaults to the largest rank needed.

        Raises
        ------
        ValueError
            If a site is missing, shapes disagree, the ``C`` differ between sites, or a matrix has rank > ``m``.
        """
        sites = list(sites)
        if not isinstance(weights, Mapping):
            raise TypeError(f"weights must be a mapping site name -> [C, d_out, d_in] tensor, got {type(weights).__name__}")
        Cs = set()
        for s in sites:
            if s.name not in weights:
                raise ValueError(f"weights lacks site {s.name!r}; has {sorted(weights)}")
            w = weights[s.name]
            if not isinstance(w, torch.Tensor) or not (w.is_floating_point() or w.dtype in _INT_DTYPES):
                raise TypeError(f"weights[{s.name!r}] must be a real torch.Tensor, got "
                                f"{w.dtype if isinstance(w, torch.Tensor) else type(w).__name__}")
            if w.ndim != 3 or w.shape[0] < 1 or tuple(w.shape[1:]) != (s.d_out, s.d_in):
                raise ValueError(f"weights[{s.name!r}] must have shape [C >= 1, {s.d_out}, {s.d_in}], got {list(w.shape)}")
            if not bool(torch.isfinite(w).all()):
                raise ValueError(f"weights[{s.name!r}] contains {int((~torch.isfinite(w)).sum())} non-finite value(s)")
            Cs.add(int(w.shape[0]))
        if len(Cs) != 1:
            raise ValueError(f"all sites must have the same number of components, got {sorted(Cs)}")
        C = Cs.pop()
        svds = {s.name: torch.linalg.svd(weights[s.name].double(), full_matrices=False) for s in sites}
        ranks = {n: int((S > atol * S.amax(dim=-1, keepdim=True).clamp_min(1e-300)).sum(-1).max()) for n, (_, S, _) in svds.items()}
        m_use = max(1, max(ranks.values())) if m is None else m
        comps = cls(sites, C, m=m_use)
        with torch.no_grad():
            for s in sites:
                U, S, Vh = svds[s.name]
                if ranks[s.name] > m_use:
                    raise ValueError(f"site {s.name!r} needs rank {ranks[s.name]} > m={m_use}")
                A, B = comps.factors(s)
                k = min(m_use, S.shape[-1])
                A.zero_()
                B.zero_()
                A[:, :, :k] = (U[:, :, :k] * S[:, None, :k].sqrt()).float()
                B[:, :k, :] = (S[:, :k, None].sqrt() * Vh[:, :k, :]).float()
        return comps
