"""Exact normal equations of the ridge-family projection under a Gaussian mixture, from weights and moments.

:func:`mixture_normal_equations` returns the :class:`~mlpinterp.poly.projection.NormalEquations` of the projection of
an FFN block ``f`` (MLP or GLU, :mod:`mlpinterp.networks`) onto its degree-n ridge family
(:mod:`mlpinterp.poly.readout`) with the sample sums replaced by expectations under a
:class:`~mlpinterp.gaussian.distributions.GaussianMixture` ``sum_k pi_k N(m_k, S_k)``: ``M = E[phi phi^T]``,
``C = E[phi f^T]``, ``yy = E||f||^2``, ``y1 = E[f]``, ``n = 1``, ``exact = True``. Then
:func:`~mlpinterp.poly.projection.solve_projection` gives the least-squares optimal member of the ridge family under
the mixture (the mixture input model's approximant; Rigg & Belrose 2025, arXiv 2502.01032, eq. 2 restricted to the
ridge family), and its ``fvu`` is the exact FVU under the mixture.

Method (per component, then weighted by pi_k). Every feature and every hidden unit is a polynomial in a few
jointly Gaussian *slots* (affine forms of x), written in probabilists' Hermite polynomials:

* features: ``1``; ``u_a`` (slot ``u``, degree 1); ``He_t(z_i)`` (slot ``z``); ``eps_i He_{t-1}(z_i)`` (slots
  ``e`` of degree 1 and ``z``);
* hidden unit j of the network, with ``Z_j = (y_j - E y_j) / sd(y_j)`` its standardised pre-activation under the
  component and ``c_jk`` the Hermite coefficients of ``phi`` about ``y_j``'s law
  (:func:`~mlpinterp.gaussian.univariate.hermite_coefficients`): ``phi(y_j) = sum_k c_jk He_k(Z_j)`` (MLP) and
  ``phi(y_j) g_j = sum_k c_jk He_k(Z_j) He_1(g_j)`` (GLU gate ``g_j = v_j . x + c_j``). The series may be cut at
  ``k <= n`` (MLP) / ``n + 1`` (GLU): higher Wiener chaoses are orthogonal to every feature of degree <= n.

For jointly Gaussian slots X with mean mu and covariance Sigma, the Hermite generating function
``E[prod_v exp(tau_v X_v - tau_v^2 / 2)] = exp(tau . mu + tau^T (Sigma - I) tau / 2)`` gives (Wick's theorem with
self-contractions of a Hermite slot weighted by ``Var X_v - 1``)

    E[prod_v He_{k_v}(X_v)] = prod_v k_v! [tau^k] exp(tau . mu + tau^T (Sigma - I) tau / 2).

For a row family I (feature i) against a column family J (feature or hidden unit j) the exponent splits into a
per-row part, a per-column part and the cross term ``tau_I^T X tau_J`` with the pair covariances
``X_vw = Cov(X_v(i), X_w(j))`` (``[rows, cols]`` matrices, one matrix product each), so

    E[F_i G_j] = sum_n prod_vw X_vw^n_vw / n_vw!  *  Q_I(i; rowsum n) * Q_J(j; colsum n)

over the few cross-contraction patterns n (at most 4 for an MLP block, 32 for a GLU block of degree 3), where Q is
the per-row Wick coefficient of what is left. This covers ``E[He_s(z_i) He_t(z_j)]`` (non-standard bivariate normals:
``sum_k C(s,k) C(t,k) k! rho^k h_{s-k} h_{t-k}``), ``E[u He_t(z)]``, the GLU terms with four correlated linear forms,
and ``C``: ``E[phi(y_j) F] = sum_k c_jk E[He_k(Z_j) F]`` (Z_j is standard, so it is a Hermite slot without
self-contractions). A singular or zero component covariance needs nothing special (its factor ``L``, ``S = L L^T``,
has fewer columns; a point mass has none).

``yy`` and ``y1`` are the output moments of the block under each component
(:func:`~mlpinterp.poly.output_moments.output_moments`: bivariate Mehler sums with rigorous truncation bounds and
conditional quadrature where they do not converge).

Cost per component: the slot matrix products (O(d_hidden^2 rank)), then O(patterns) elementwise passes over the
``[d_hidden, d_hidden]`` pair grid, chunked over rows (``chunk`` rows at a time) so temporaries stay at a few
``chunk x d_hidden`` arrays; ``M`` itself is ``p x p`` floats (p = 1 + r + (n - 1) d_hidden, doubled for GLUs).
``benchmarks/bench_ffn_mixture_moments.py`` times it against sampled normal equations at MiniLM scale
(``docs/measurements.md``): a sample fit within 0.1% of this optimum takes orders of magnitude more CPU time.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from mlpinterp.gaussian.distributions import Gaussian, GaussianMixture
from mlpinterp.gaussian.univariate import hermite_coefficients
from mlpinterp.networks import GLU, Network, validate_network
from mlpinterp.poly.output_moments import output_moments
from mlpinterp.poly.projection import NormalEquations
from mlpinterp.poly.readout import RidgeBasis
from mlpinterp.utils.validation import check_int

#: Largest degree accepted (GLU targets need Hermite coefficients up to degree + 1 <= 170, where k! overflows).
MAX_DEGREE = 168


@dataclass
class _Family:
    """Rows that are polynomials ``sum_t w_t prod_v He_{k_tv}(X_v)`` in a few jointly Gaussian slots X_v.

    Under one component: ``mu[v] [rows]`` slot means; ``cov[(v, w)] [rows]`` within-row covariances (``v == w``:
    ``Var X_v - 1``, the Hermite self-contraction weight); ``dirs[v] [rows, q]`` with
    ``Cov(X_v(i), X'_w(j)) = dirs[v][i] . dirs'[w][j]``; ``terms``: (degrees per slot, weight ``[rows]`` or 1.0).
    """

    rows: int
    slots: tuple[str, ...]
    mu: dict
    cov: dict
    dirs: dict
    terms: list
    _cache: dict = field(default_factory=dict, repr=False)

    def max_degree(self, v: int) -> int:
        return max(k[v] for k, _ in self.terms)

    def wick(self, m: tuple[int, ...], sl: slice) -> np.ndarray | float:
        """``[tau^m] exp(tau . mu + tau^T cov tau / 2)`` for the rows ``sl`` (Wick sum over partial matchings)."""
        S = len(self.slots)
        pairs = [(a, b) for a in range(S) for b in range(a, S)]
        bounds = [(m[a] // 2 if a == b else min(m[a], m[b])) + 1 for a, b in pairs]
        total: np.ndarray | float = 0.0
        for counts in itertools.product(*(range(bd) for bd in bounds)):
            single = list(m)
            for (a, b), n in zip(pairs, counts, strict=True):
                single[a] -= n
                single[b] -= n
            if min(single, default=0) < 0:
                continue
            term: np.ndarray | float = 1.0
            for v, s in enumerate(single):
                if s:
                    term = term * self.mu[self.slots[v]][sl] ** s / math.factorial(s)
            for (a, b), n in zip(pairs, counts, strict=True):
                if n:
                    c = self.cov[(self.slots[a], self.slots[b])][sl]
                    term = term * (0.5 * c if a == b else c) ** n / math.factorial(n)
            total = total + term
        return total

    def factor(self, removed: tuple[int, ...], sl: slice) -> np.ndarray | float:
        """``Q(removed) = sum_t w_t prod_v k_tv! [tau^(k_t - removed)] exp(...)`` for the rows ``sl``."""
        key = (removed, sl.start, sl.stop)
        if key in self._cache:
            return self._cache[key]
        total: np.ndarray | float = 0.0
        for k, w in self.terms:
            rest = tuple(a - b for a, b in zip(k, removed, strict=True))
            if min(rest, default=0) < 0:
                continue
            coef = math.prod(math.factorial(a) for a in k)
            wk = self.wick(rest, sl)
            weight = w[sl] if isinstance(w, np.ndarray) else w
            total = total + coef * weight * wk
        self._cache[key] = total
        return total


def _cross(fi: _Family, fj: _Family, sl: slice, cache: dict) -> np.ndarray:
    """``E[F_i G_j]`` for the rows ``sl`` of ``fi`` and every row of ``fj``: ``[len(sl), fj.rows]``.

    ``cache`` keeps the pair-covariance powers ``X_vw^n / n!`` between calls (families share slot directions)."""
    nr = len(range(*sl.indices(fi.rows)))
    out = np.zeros((nr, fj.rows))
    SI, SJ = len(fi.slots), len(fj.slots)
    cells = [(v, w) for v in range(SI) for w in range(SJ)]

    def mono(v, w, n):  # X_vw^n / n! (a loop, not recursion: a self-referencing closure would be a reference
        # cycle keeping ``cache`` alive until the garbage collector runs, i.e. the caches of several components)
        a, b = fi.dirs[fi.slots[v]], fj.dirs[fj.slots[w]]
        key = (id(a), id(b), sl.start, sl.stop)
        if (*key, 1) not in cache:
            cache[(*key, 1)] = a[sl] @ b.T
        for k in range(2, n + 1):
            if (*key, k) not in cache:
                cache[(*key, k)] = cache[(*key, k - 1)] * (cache[(*key, 1)] / k)
        return cache[(*key, n)]

    dI = [fi.max_degree(v) for v in range(SI)]
    dJ = [fj.max_degree(w) for w in range(SJ)]
    full = slice(0, fj.rows)
    tmp = np.empty_like(out)
    for ns in itertools.product(*(range(min(dI[v], dJ[w]) + 1) for v, w in cells)):
        rowsum = tuple(sum(n for (a, _), n in zip(cells, ns, strict=True) if a == v) for v in range(SI))
        colsum = tuple(sum(n for (_, b), n in zip(cells, ns, strict=True) if b == w) for w in range(SJ))
        if any(r > d for r, d in zip(rowsum, dI, strict=True)) or any(c > d for c, d in zip(colsum, dJ, strict=True)):
            continue
        qi = fi.factor(rowsum, sl)
        qj = fj.factor(colsum, full)
        if (np.isscalar(qi) and qi == 0.0) or (np.isscalar(qj) and qj == 0.0):
            continue
        np.multiply(np.broadcast_to(qi, (nr,))[:, None], np.broadcast_to(qj, (fj.rows,))[None, :], out=tmp)
        for (v, w), n in zip(cells, ns, strict=True):
            if n:
                tmp *= mono(v, w, n)
        out += tmp
    return out


def _rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("iq,iq->i", a, b)


def _feature_families(basis: RidgeBasis, comp: Gaussian, degree: int) -> list[_Family]:
    """The feature families in :meth:`RidgeBasis.features` order: 1, u, then per t: He_t(z) [, eps He_{t-1}(z)]."""
    L = comp.factor
    delta = comp.mean - basis.center
    fams = [_Family(1, (), {}, {}, {}, [((), 1.0)])]
    UL = basis.white.T @ L
    fams.append(_Family(basis.rank, ("u",), {"u": basis.white.T @ delta}, {("u", "u"): _rowdot(UL, UL) - 1.0},
                        {"u": UL}, [((1,), 1.0)]))
    if degree >= 2:
        AL = basis.A @ L
        mu = {"z": basis.A @ delta}
        cov = {("z", "z"): _rowdot(AL, AL) - 1.0}
        dirs = {"z": AL}
        if basis.gated:
            GL = basis.G @ L
            mu["e"] = basis.G @ delta
            cov[("e", "e")] = _rowdot(GL, GL) - 1.0
            cov[("z", "e")] = _rowdot(AL, GL)
            dirs["e"] = GL
        for t in range(2, degree + 1):
            fams.append(_Family(basis.d_hidden, ("z",), mu, cov, dirs, [((t,), 1.0)]))
            if basis.gated:
                fams.append(_Family(basis.d_hidden, ("z", "e"), mu, cov, dirs, [((t - 1, 1), 1.0)]))
    return fams


def _target_family(network: Network, comp: Gaussian, degree: int) -> _Family:
    """The hidden units of ``network`` under ``comp`` as Hermite series in (Z_j [, g_j]), cut at the degree that
    features of total degree ``degree`` can see."""
    L = comp.factor
    gated = isinstance(network, GLU)
    W, b = (network.W, network.b) if gated else (network.W1, network.b1)
    m = W @ comp.mean + b
    WL = W @ L
    s = np.sqrt(_rowdot(WL, WL))
    ZL = np.where(s[:, None] > 0, WL / np.where(s > 0, s, 1.0)[:, None], 0.0)
    kmax = degree + 1 if gated else degree
    c = hermite_coefficients(network.act, m, s, kmax)  # [h, kmax + 1]; s == 0: c_0 = phi(m), c_k = 0
    h = W.shape[0]
    zero = np.zeros(h)
    if not gated:
        return _Family(h, ("Z",), {"Z": zero}, {("Z", "Z"): zero}, {"Z": ZL},
                       [((k,), c[:, k]) for k in range(kmax + 1)])
    gL = network.V @ L
    return _Family(h, ("Z", "g"), {"Z": zero, "g": network.V @ comp.mean + network.c},
                   {("Z", "Z"): zero, ("g", "g"): _rowdot(gL, gL) - 1.0, ("Z", "g"): _rowdot(ZL, gL)},
                   {"Z": ZL, "g": gL}, [((k, 1), c[:, k]) for k in range(kmax + 1)])


def _check_basis(basis: RidgeBasis, d: int) -> None:
    if not isinstance(basis, RidgeBasis):
        raise TypeError(f"basis must be a mlpinterp.poly.readout.RidgeBasis, got {type(basis).__name__}")
    arrays = {"basis.center": (basis.center, (d,)), "basis.A": (basis.A, (None, d)),
              "basis.white": (basis.white, (d, None))}
    if basis.G is not None:
        arrays["basis.G"] = (basis.G, (basis.A.shape[0], d))
    for name, (a, shape) in arrays.items():
        a = np.asarray(a)
        if a.ndim != len(shape) or any(s is not None and s != t for s, t in zip(shape, a.shape, strict=True)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {want} (d_in = {d}), got {list(a.shape)}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name} contains NaN or inf")


def mixture_normal_equations(network: Network, basis: RidgeBasis, mixture: GaussianMixture | Gaussian, degree: int,
                             *, chunk: int = 1024) -> NormalEquations:
    """Exact :class:`NormalEquations` of ``network``'s projection onto ``basis``'s degree-``degree`` ridge family under
    ``mixture`` (see the module docstring for the method).

    Parameters
    ----------
    network : ``MLP`` or ``GLU`` with ``d_in = d``.
    basis : :class:`RidgeBasis` on R^d (any d_hidden; usually the block's own, from its closed form under one Gaussian).
    mixture : ``GaussianMixture`` on R^d (a ``Gaussian`` is taken as one component); singular and zero component
        covariances are allowed.
    degree : int >= 1 (<= :data:`MAX_DEGREE`).
    chunk : neuron rows per pass over the ``[d_hidden, d_hidden]`` pair grid (memory: about 10 ``chunk x d_hidden``
        float64 temporaries for GLUs, fewer for MLPs, beside ``M``).

    Returns
    -------
    ``NormalEquations(degree, M [p, p], C [p, d_out], yy, y1 [d_out], n=1, exact=True)`` with
    ``p = basis.n_features(degree)``; ``leading(d, basis)`` gives every lower degree.

    Raises
    ------
    TypeError : network, basis or mixture of the wrong type; degree or chunk not an int.
    ValueError : dimensions that disagree (naming both), degree < 1 or > MAX_DEGREE, a malformed basis.
    """
    network = validate_network(network)
    degree = check_int(degree, "degree", minimum=1)
    if degree > MAX_DEGREE:
        raise ValueError(f"degree must be <= {MAX_DEGREE} (Hermite coefficients of degree + 1 need k! in float64), "
                         f"got {degree}")
    chunk = check_int(chunk, "chunk", minimum=1)
    if isinstance(mixture, Gaussian):
        mixture = GaussianMixture(np.ones(1), mixture.mean[None], mixture.cov[None])
    if not isinstance(mixture, GaussianMixture):
        raise TypeError(f"mixture must be a mlpinterp.GaussianMixture (or Gaussian), got {type(mixture).__name__}")
    d = network.d_in
    if mixture.d != d:
        raise ValueError(f"mixture has dimension {mixture.d} but the network has d_in = {d}")
    _check_basis(basis, d)

    p = basis.n_features(degree)
    M = np.zeros((p, p))
    C = np.zeros((p, network.d_out))
    yy = 0.0
    y1 = np.zeros(network.d_out)
    W2, b2 = network.W2, network.b2
    for pi, comp in zip(mixture.weights, mixture.components, strict=True):
        if pi == 0.0:
            continue
        fams = _feature_families(basis, comp, degree)
        target = _target_family(network, comp, degree)
        offs = np.cumsum([0] + [f.rows for f in fams])
        cache: dict = {}  # X^n / n! per (slot directions, rows); the arrays live as long as fams
        for a, fa in enumerate(fams):
            for s in range(0, fa.rows, chunk):
                sl = slice(s, min(s + chunk, fa.rows))
                r0, r1 = offs[a] + sl.start, offs[a] + sl.stop
                for b in range(a, len(fams)):
                    blk = _cross(fa, fams[b], sl, cache)
                    M[r0:r1, offs[b]:offs[b + 1]] += pi * blk
                    if b > a:
                        M[offs[b]:offs[b + 1], r0:r1] += pi * blk.T
                H = _cross(fa, target, sl, cache)  # E[phi_i hidden_j]
                C[r0:r1] += pi * (H @ W2.T + np.outer(_mean(fa, sl), b2))
        e_f, e_ff = output_moments(network, comp, chunk=chunk)
        yy += pi * e_ff
        y1 += pi * e_f
    return NormalEquations(degree, M, C, float(yy), y1, 1, exact=True)


def _mean(fam: _Family, sl: slice) -> np.ndarray:
    """E[F_i] for the rows ``sl`` (the family against the constant)."""
    n = len(range(*sl.indices(fam.rows)))
    return np.broadcast_to(fam.factor((0,) * len(fam.slots), sl), (n,))
