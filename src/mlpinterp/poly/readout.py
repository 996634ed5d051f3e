"""The ridge family of an FFN block: polynomials in the block's own neuron directions, with a free read-out.

For a block with pre-activations ``y_j = w_j . x + b_j`` (and, for a GLU, gates ``g_j = v_j . x + c_j``) and a
reference Gaussian N(c, S) (the one fitted to the block's inputs), let ``z_j = A_j . (x - c)`` be the standardised
pre-activations, ``eps_j = G_j . (x - c)`` the GLU gate residuals (the part of ``g_j`` uncorrelated with ``y_j``
under N(c, S)) and ``u = white^T (x - c)`` whitened input coordinates. The degree-n ridge family is

    p(x) = b + L u + sum_{t=2..n} R_t He_t(z) + sum_{t=2..n} S_t (eps * He_{t-1}(z))          (GLU terms only for GLUs)

with free ``b [d_out]``, ``L [d_out, r]``, ``R_t, S_t [d_out, d_hidden]``. It holds every affine map and, under
N(c, S), the exact optimal approximant of any degree (Rigg & Belrose 2025, eq. 2: under one Gaussian the optimum
replaces each activation by its Hermite truncation, :mod:`mlpinterp.poly.ridge`, which is in this span); it is
nested in n. Its span does not depend on the standardisation (``He_t(z_j)`` spans the same space as
``(w_j . x)^t`` modulo lower degrees), which only conditions the least-squares problems.

:class:`Readout` holds one member of the family; :meth:`Readout.to_polynomial` expands it into an ordinary
:class:`~mlpinterp.poly.approximant.RidgePolynomial` (one hidden unit per (neuron, degree) term plus r linear units)
so every approximant tool applies: calling, ``coefficients(k)``, eigen-features, ``to_module()``, ``save``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlpinterp.gaussian.distributions import Gaussian
from mlpinterp.gaussian.hermite import hermite_he
from mlpinterp.poly.approximant import RidgePolynomial
from mlpinterp.utils.validation import as_inputs, check_instance, check_int, check_shape, to_numpy


@dataclass(frozen=True)
class RidgeBasis:
    """The fixed directions of a block's ridge family (see module docstring).

    center : ``[d_in]``; A : ``[d_hidden, d_in]``; G : ``[d_hidden, d_in]`` or None (GLU gate residuals);
    white : ``[d_in, r]`` whitening map of the reference Gaussian on its support (``u = white^T (x - center)``).

    Raises ``TypeError``/``ValueError`` (naming the field) for non-numeric or non-finite arrays or shapes that do
    not fit together.
    """

    center: np.ndarray
    A: np.ndarray
    G: np.ndarray | None
    white: np.ndarray

    def __post_init__(self) -> None:
        center = to_numpy(self.center, "center")
        if center.ndim != 1 or center.shape[0] < 1:
            raise ValueError(f"center must have shape [d_in >= 1], got {list(center.shape)}")
        d = center.shape[0]
        A = check_shape(to_numpy(self.A, "A"), "A", (None, d))
        G = None if self.G is None else check_shape(to_numpy(self.G, "G"), "G", (A.shape[0], d))
        white = check_shape(to_numpy(self.white, "white"), "white", (d, None))
        for name, v in (("center", center), ("A", A), ("G", G), ("white", white)):
            object.__setattr__(self, name, v)

    @classmethod
    def from_closed_form(cls, p: RidgePolynomial, gaussian: Gaussian) -> RidgeBasis:
        """The basis of the closed-form approximant ``p`` fitted under ``gaussian`` (its directions and center).

        The whitening map is the Gaussian's own on its support (``white = support diag(1 / sqrt(eigenvalues))``,
        the eigenvalues :class:`Gaussian` keeps), so a degenerate Gaussian gives ``rank < d_in`` whitened
        coordinates. Raises ``TypeError`` if ``p`` is not a ``RidgePolynomial`` (the closed form of
        ``fit_polynomial`` under one Gaussian) or ``gaussian`` not a ``Gaussian``, ``ValueError`` if their
        dimensions differ.
        """
        check_instance(p, RidgePolynomial, "p", "RidgePolynomial (fit_polynomial(network, gaussian, n))")
        check_instance(gaussian, Gaussian, "gaussian", "Gaussian (the input model p was fitted under)")
        if gaussian.d != p.d_in:
            raise ValueError(f"gaussian has dimension {gaussian.d}, but p has d_in={p.d_in}: the basis needs the "
                             "Gaussian p was fitted under")
        scale = np.linalg.norm(gaussian.factor, axis=0)  # factor = support * sqrt(eigenvalue), column by column
        white = gaussian.support / np.maximum(scale, 1e-300)
        return cls(center=np.asarray(p.center), A=np.asarray(p.A),
                   G=None if p.G is None else np.asarray(p.G), white=white)

    d_in = property(lambda self: self.A.shape[1])
    d_hidden = property(lambda self: self.A.shape[0])
    rank = property(lambda self: self.white.shape[1])
    gated = property(lambda self: self.G is not None)

    def n_features(self, degree: int) -> int:
        """Number of features of the degree-``degree`` family (constant included); ``degree >= 0``."""
        degree = check_int(degree, "degree", minimum=0)
        per = 2 if self.gated else 1
        return 1 + (self.rank if degree >= 1 else 0) + per * self.d_hidden * max(degree - 1, 0)

    def features(self, X: np.ndarray, degree: int) -> np.ndarray:
        """Feature matrix ``[m, n_features(degree)]`` of inputs ``X [m, d_in]`` (float64).

        Order: ``1``, ``u`` (r), then for t = 2..degree: ``He_t(z)`` (d_hidden) and, for GLUs, ``eps He_{t-1}(z)``
        (d_hidden). So the features of degree n - 1 are the leading columns of those of degree n.
        Raises ``TypeError``/``ValueError`` naming ``X`` (non-numeric, non-finite, not ``[m, d_in]``) or ``degree``.
        """
        degree = check_int(degree, "degree", minimum=0)
        return self._features(check_shape(to_numpy(X, "X"), "X", (None, self.d_in)), degree)

    def _features(self, X: np.ndarray, degree: int) -> np.ndarray:
        """:meth:`features` without validation (hot loops that validated ``X`` once)."""
        Xc = X - self.center
        cols = [np.ones((Xc.shape[0], 1))]
        if degree >= 1:
            cols.append(Xc @ self.white)
        if degree >= 2:
            He = hermite_he(degree, Xc @ self.A.T)  # [m, h, degree + 1]
            eps = Xc @ self.G.T if self.gated else None
            for t in range(2, degree + 1):
                cols.append(He[:, :, t])
                if eps is not None:
                    cols.append(eps * He[:, :, t - 1])
        return np.concatenate(cols, axis=1)


@dataclass(frozen=True)
class Readout:
    """One member of the ridge family: ``b [d_out]``, ``L [d_out, r]``, ``R, S: [degree - 1, d_out, d_hidden]``
    (``R[t - 2]`` multiplies ``He_t(z)``, ``S[t - 2]`` multiplies ``eps He_{t-1}(z)``; S is None for MLPs).

    Raises ``TypeError`` if ``basis`` is not a :class:`RidgeBasis` and ``ValueError`` (naming the field) for
    non-finite coefficients or shapes that do not match the basis (``S`` must be given exactly for a gated basis).
    """

    basis: RidgeBasis
    b: np.ndarray
    L: np.ndarray
    R: np.ndarray
    S: np.ndarray | None

    def __post_init__(self) -> None:
        bs = check_instance(self.basis, RidgeBasis, "basis")
        b = to_numpy(self.b, "b")
        if b.ndim != 1 or b.shape[0] < 1:
            raise ValueError(f"b must have shape [d_out >= 1], got {list(b.shape)}")
        o = b.shape[0]
        L = to_numpy(self.L, "L")
        if L.shape != (o, bs.rank):
            raise ValueError(f"L must have shape [d_out, basis.rank] = [{o}, {bs.rank}] (d_out from b [{o}]), got "
                             f"{list(L.shape)}")
        R = check_shape(to_numpy(self.R, "R"), "R", (None, o, bs.d_hidden))
        if bs.gated != (self.S is not None):
            raise ValueError(f"S must be {'given' if bs.gated else 'None'} for a{' gated' if bs.gated else 'n MLP'} "
                             f"basis (basis.G is {'set' if bs.gated else 'None'}), got "
                             f"{'None' if self.S is None else 'an array'}")
        S = None if self.S is None else check_shape(to_numpy(self.S, "S"), "S", R.shape)
        for name, v in (("b", b), ("L", L), ("R", R), ("S", S)):
            object.__setattr__(self, name, v)

    @property
    def degree(self) -> int:
        """Total degree (>= 1)."""
        return self.R.shape[0] + 1

    @classmethod
    def from_coefficients(cls, basis: RidgeBasis, B: np.ndarray, degree: int) -> Readout:
        """Split the coefficient matrix ``B [n_features(degree), d_out]`` of :meth:`RidgeBasis.features`."""
        check_instance(basis, RidgeBasis, "basis")
        degree = check_int(degree, "degree", minimum=1)
        B = to_numpy(B, "B")
        if B.ndim != 2 or B.shape[0] != basis.n_features(degree):
            raise ValueError(f"B must have shape [n_features({degree}) = {basis.n_features(degree)}, d_out] for "
                             f"degree >= 1, got {list(B.shape)}")
        h, r = basis.d_hidden, basis.rank
        b, L = B[0], B[1:1 + r].T
        per = 2 if basis.gated else 1
        blocks = B[1 + r:].reshape(degree - 1, per, h, B.shape[1])
        R = np.transpose(blocks[:, 0], (0, 2, 1))
        S = np.transpose(blocks[:, 1], (0, 2, 1)) if basis.gated else None
        return cls(basis, b, L, R, S)

    @classmethod
    def from_closed_form(cls, p: RidgePolynomial, basis: RidgeBasis) -> Readout:
        """The closed-form approximant ``p`` (whose directions are ``basis``'s) written in the family's coordinates.

        Uses ``x - c = white^+ u`` on the support: the degree-1 terms ``D_j1 z_j`` and ``E_j0 eps_j`` become ``L u``.
        Raises ``TypeError`` for a ``p`` that is not a ``RidgePolynomial``, ``ValueError`` if ``p``'s directions are
        not ``basis``'s (another block, another Gaussian, or a GLU basis for an MLP approximant).
        """
        check_instance(p, RidgePolynomial, "p", "RidgePolynomial (fit_polynomial(network, gaussian, n))")
        check_instance(basis, RidgeBasis, "basis")
        if (p.G is not None) != basis.gated or p.A.shape != basis.A.shape or \
                not np.allclose(p.A, basis.A, rtol=1e-12, atol=0) or not np.allclose(p.center, basis.center) or \
                (p.G is not None and not np.allclose(p.G, basis.G, rtol=1e-12, atol=0)):
            raise ValueError(f"p's directions (A {list(p.A.shape)}, {'gated' if p.G is not None else 'not gated'}) "
                             f"are not basis's (A {list(basis.A.shape)}, {'gated' if basis.gated else 'not gated'}) "
                             "or their centers differ: build the basis from the same closed form, "
                             "RidgeBasis.from_closed_form(p, gaussian)")
        n = p.degree
        if n < 1:
            raise ValueError("the ridge family starts at degree 1; got a degree-0 approximant")
        unwhite = np.linalg.pinv(basis.white)  # [r, d]: x - c = unwhite^T u on the support
        Wd = p.W2 * p.D[:, 0]
        b = Wd.sum(1) + p.b2
        L = (p.W2 * p.D[:, 1]) @ (p.A @ unwhite.T)
        if p.G is not None:
            L = L + (p.W2 * p.E[:, 0]) @ (p.G @ unwhite.T)
        R = np.stack([p.W2 * p.D[:, t] for t in range(2, n + 1)]) if n >= 2 else np.zeros((0, p.d_out, p.d_hidden))
        S = None
        if p.G is not None:
            S = np.stack([p.W2 * p.E[:, t - 1] for t in range(2, n + 1)]) if n >= 2 else \
                np.zeros((0, p.d_out, p.d_hidden))
        return cls(basis, b, L, R, S)

    def coefficients_matrix(self) -> np.ndarray:
        """Inverse of :meth:`from_coefficients`: ``B [n_features(degree), d_out]``."""
        parts = [self.b[None, :], self.L.T]
        for t in range(self.R.shape[0]):
            parts.append(self.R[t].T)
            if self.S is not None:
                parts.append(self.S[t].T)
        return np.concatenate(parts, axis=0)

    def __call__(self, X) -> np.ndarray:
        """``p(X)``: ``[m, d_out]`` for ``X [m, d_in]`` (``[d_out]`` for a single ``[d_in]``; chunked features times
        the coefficient matrix). Raises ``TypeError``/``ValueError`` naming ``X``."""
        X, single = as_inputs(X, self.basis.d_in)
        B = self.coefficients_matrix()
        out = np.empty((X.shape[0], B.shape[1]))
        for s in range(0, X.shape[0], 4096):
            out[s:s + 4096] = self.basis._features(X[s:s + 4096], self.degree) @ B
        return out[0] if single else out

    def to_polynomial(self, info: dict | None = None) -> RidgePolynomial:
        """The same polynomial as a :class:`RidgePolynomial` with ``r + (degree - 1) d_hidden (x 2 for GLUs)``
        hidden units: linear units along the whitened coordinates, one unit per (neuron, Hermite degree) term."""
        bs = self.basis
        n = self.degree
        h, r, d = bs.d_hidden, bs.rank, bs.d_in
        dirs, Ds, Es, Gs, W2 = [bs.white.T], [], [], [], [self.L]
        D_lin = np.zeros((r, n + 1))
        D_lin[:, 1] = 1.0
        Ds.append(D_lin)
        Es.append(np.zeros((r, n)))
        Gs.append(np.zeros((r, d)))
        for t in range(2, n + 1):
            Dt = np.zeros((h, n + 1))
            Dt[:, t] = 1.0
            dirs.append(bs.A)
            Ds.append(Dt)
            Es.append(np.zeros((h, n)))
            Gs.append(np.zeros((h, d)))
            W2.append(self.R[t - 2])
            if bs.gated:
                Et = np.zeros((h, n))
                Et[:, t - 1] = 1.0
                dirs.append(bs.A)
                Ds.append(np.zeros((h, n + 1)))
                Es.append(Et)
                Gs.append(bs.G)
                W2.append(self.S[t - 2])
        return RidgePolynomial(
            center=bs.center, A=np.concatenate(dirs), D=np.concatenate(Ds), W2=np.concatenate(W2, axis=1),
            b2=self.b, G=np.concatenate(Gs) if bs.gated else None, E=np.concatenate(Es) if bs.gated else None,
            info=dict(info or {}, family="ridge-readout", degree=n),
        )
