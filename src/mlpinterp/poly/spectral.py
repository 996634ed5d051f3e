"""Spectral tools on approximants: quadratic eigen-features, SVD of linear coefficients, input ablations.

Rigg & Belrose (2025, arXiv 2502.01032): §4.1 reads the eigenvectors of each output's quadratic form
as feature images (Fig. 1); §4.3 projects the top-k right singular vectors of the linear coefficient
matrix out of inputs, an attack that transfers to the network (Figs. 4-5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlpinterp.utils.validation import to_numpy


def _coef(p_or_tensor, k: int) -> np.ndarray:
    return p_or_tensor.coefficients(k) if hasattr(p_or_tensor, "coefficients") else to_numpy(p_or_tensor, "coefficients")


@dataclass(frozen=True)
class QuadraticSpectrum:
    """Eigendecomposition of each output's quadratic form ``Q_o`` (symmetric ``[d_in, d_in]``).

    eigenvalues : ``[d_out, d_in]`` sorted by decreasing |eigenvalue|
    eigenvectors : ``[d_out, d_in, d_in]``; ``eigenvectors[o, :, i]`` pairs with ``eigenvalues[o, i]``
    """

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray

    def top(self, output: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The n leading (by |eigenvalue|) eigenvalues ``[n]`` and eigenvectors ``[d_in, n]`` of one output.

        Raises ``ValueError`` unless ``0 <= output < d_out`` and ``0 <= n <= d_in`` (integers).
        """
        d_out, d_in = self.eigenvalues.shape
        if isinstance(output, bool) or not isinstance(output, int | np.integer) or not 0 <= output < d_out:
            raise ValueError(f"output must be an integer in [0, d_out={d_out}), got {output!r}")
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 0 <= n <= d_in:
            raise ValueError(f"n must be an integer in [0, d_in={d_in}], got {n!r}")
        return self.eigenvalues[output, :n], self.eigenvectors[output, :, :n]


def quadratic_spectrum(p) -> QuadraticSpectrum:
    """Eigendecompose the degree-2 coefficients of ``p`` (an approximant of degree >= 2, or a ``[d_out, d, d]`` tensor).

    Raises ``ValueError`` if the tensor is not ``[d_out, d, d]``.
    """
    Q = _coef(p, 2)
    if Q.ndim != 3 or Q.shape[1] != Q.shape[2]:
        raise ValueError(f"quadratic coefficients must have shape [d_out, d_in, d_in], got {list(Q.shape)}")
    w, v = np.linalg.eigh(0.5 * (Q + np.swapaxes(Q, 1, 2)))
    order = np.argsort(-np.abs(w), axis=1)
    w = np.take_along_axis(w, order, axis=1)
    v = np.take_along_axis(v, order[:, None, :], axis=2)
    return QuadraticSpectrum(w, v)


def linear_svd(p) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SVD ``B = U diag(S) Vt`` of the linear coefficients ``B [d_out, d_in]``; rows of ``Vt`` are input directions."""
    B = _coef(p, 1)
    if B.ndim != 2:
        raise ValueError(f"linear coefficients must have shape [d_out, d_in], got {list(B.shape)}")
    return np.linalg.svd(B, full_matrices=False)


def top_singular_directions(p, k: int) -> np.ndarray:
    """The top-k right singular vectors of the linear coefficients as an orthonormal ``[d_in, k]`` matrix."""
    _, S, Vt = linear_svd(p)
    if not 0 <= k <= Vt.shape[0]:
        raise ValueError(f"k must be in [0, {Vt.shape[0]}] (rank bound of the linear coefficients), got {k}")
    return Vt[:k].T.copy()


def random_directions(d: int, k: int, seed: int = 0) -> np.ndarray:
    """k random orthonormal directions in R^d (QR of a Gaussian matrix): ``[d, k]`` (baseline ablation)."""
    if not 0 <= k <= d:
        raise ValueError(f"k must be in [0, d={d}], got {k}")
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, k)))
    return q * np.sign(np.diag(r))


def pca_directions(X, k: int) -> np.ndarray:
    """Top-k principal directions of data ``X [n, d]``: ``[d, k]`` (baseline ablation), computed in float64.

    A float32 ``X`` is read as it is, in float64 chunks: no float64 copy of it (376 MB for MNIST's training set).
    """
    X = to_numpy(X, "X", dtype=np.float32 if getattr(X, "dtype", None) == np.float32 else np.float64)
    if X.ndim != 2 or X.shape[0] < 1:
        raise ValueError(f"X must have shape [n >= 1, d], got {list(X.shape)}")
    if not 0 <= k <= X.shape[1]:
        raise ValueError(f"k must be in [0, d={X.shape[1]}], got {k}")
    n, d = X.shape
    if n <= 2 * d:
        X = np.asarray(X, dtype=np.float64)
        _, _, Vt = np.linalg.svd(X - X.mean(0), full_matrices=False)
        return Vt[:k].T.copy()
    # tall data (MNIST: 60,000 x 784): the eigenvectors of the centred scatter matrix, accumulated in chunks
    # (no centred copy of X; much faster than the SVD of X); the same subspace up to rounding (tests)
    mu = X.mean(0, dtype=np.float64)
    C = np.zeros((d, d))
    for s in range(0, n, 8192):
        Xc = X[s : s + 8192] - mu  # float64 (mu is): a float32 chunk is cast by the subtraction, not copied first
        C += Xc.T @ Xc
    w, U = np.linalg.eigh(C)
    return U[:, ::-1][:, :k].copy()


def ablate(X, directions: np.ndarray) -> np.ndarray:
    """Project the orthonormal ``directions [d, k]`` out of every input: ``X (I - V V^T)``; ``[n, d]``.

    Raises ``ValueError`` if ``X`` is not ``[n, d]``, ``directions`` not ``[d, k]`` or its columns are not
    orthonormal (``|V^T V - I| > 1e-8``; orthonormalise with ``np.linalg.qr`` first).
    """
    X = to_numpy(X, "X")
    if X.ndim != 2:
        raise ValueError(f"X must have shape [n, d], got {list(X.shape)}")
    V = to_numpy(directions, "directions")
    if V.ndim != 2 or V.shape[0] != X.shape[1]:
        raise ValueError(f"directions must have shape [d={X.shape[1]}, k], got {list(V.shape)}")
    gram_err = float(np.max(np.abs(V.T @ V - np.eye(V.shape[1])), initial=0.0))
    if gram_err > 1e-8:
        raise ValueError(
            f"directions must have orthonormal columns (max |V^T V - I| = {gram_err:.3g}); "
            "orthonormalise them first, e.g. np.linalg.qr(directions)[0]"
        )
    return X - (X @ V) @ V.T


def ablated_outputs(model, X, directions: np.ndarray, *, base: np.ndarray | None = None) -> list[np.ndarray]:
    """``[model(ablate(X, V[:, :k])) for k = 0..K]`` (``V = directions [d, K]``, orthonormal): ``K + 1`` arrays ``[n, d_out]``.

    A ``DensePolynomial`` of degree <= 2 (the mixture approximants) is evaluated once, on ``X``, and the
    ablations follow exactly from its tensors: with ``y = X V_k`` and ``X (I - V_k V_k^T) = X - y V_k^T``,
    ``p(X - y V_k^T) = p(X) - y . (V_k^T T1 + 2 V_k^T T2 x) + y^T (V_k^T T2 V_k) y`` per output (``T2`` symmetrised), so the ``K``
    ablated evaluations cost ``O(n d d_out K)`` instead of ``K`` evaluations of ``O(n d^2 d_out)`` each
    (float64 either way; equal to direct evaluation to rounding, ``tests/test_repro_polynomial.py``).
    Any other ``model`` (a network, a ``RidgePolynomial``) is evaluated on each ablated input. ``base``:
    ``model(X)`` when the caller already has it (``[n, d_out]``; the polynomial is then not evaluated at all).
    Raises ``ValueError`` as ``ablate`` does.
    """
    from mlpinterp.poly.approximant import DensePolynomial

    X = to_numpy(X, "X")
    V = to_numpy(directions, "directions")
    K = V.shape[1] if V.ndim == 2 else 0
    if not (isinstance(model, DensePolynomial) and 1 <= model.degree <= 2):
        return [np.asarray(model(ablate(X, V[:, :k]))) if k or base is None else np.asarray(base)
                for k in range(K + 1)]
    ablate(X[:1], V)  # validation only (shapes, orthonormal columns)
    base = np.asarray(model(X)) if base is None else np.asarray(base, dtype=np.float64)
    Y = X @ V  # [n, K]
    T1 = model.tensors[1]  # [o, d]
    lin = np.broadcast_to(Y[:, None, :] * (T1 @ V)[None], (X.shape[0], T1.shape[0], K))  # y_j (V^T T1)_j
    if model.degree == 2:
        T2 = model.tensors[2]
        T2V = 0.5 * (np.einsum("oab,bj->oaj", T2, V) + np.einsum("oba,bj->oaj", T2, V))  # [o, d, K], symmetric part
        H = (X @ T2V.transpose(1, 0, 2).reshape(X.shape[1], -1)).reshape(X.shape[0], T1.shape[0], K)  # x^T T2 V
        G = np.einsum("aj,oak->ojk", V, T2V)  # [o, K, K]  V^T T2 V
        lin = lin + 2 * Y[:, None, :] * H
    out = [base]
    for k in range(1, K + 1):
        q = base - lin[:, :, :k].sum(2)
        if model.degree == 2:
            yk = Y[:, :k]
            q = q + np.einsum("nj,ojl,nl->no", yk, G[:, :k, :k], yk, optimize=True)
        out.append(q)
    return out


def quadratic_forms(p, U) -> np.ndarray:
    """The quadratic forms of ``p`` along output directions: ``Q_m = sum_o U[o, m] T2[o]``, ``[n_dirs, d_in, d_in]``.

    ``U``: ``[d_out, n_dirs]`` (e.g. top principal directions of the block's output). For a ``RidgePolynomial`` the
    forms are built from its factors, ``A^T diag(U^T (W2 * gamma)) A`` plus the symmetrised gate terms, without
    materialising the ``[d_out, d_in, d_in]`` tensor (so it works at d_in = d_out = 4096); otherwise from
    ``coefficients(2)``; ``p`` may also be the quadratic coefficient tensor ``T2 [d_out, d_in, d_in]`` itself.
    Raises ``TypeError`` for a ``p`` that is none of these (a network, None), ``ValueError`` for a degree < 2
    approximant, a ``T2`` that is not ``[d_out, d, d]`` or a ``U`` of the wrong height.
    """
    from mlpinterp.poly.approximant import RidgePolynomial

    if not isinstance(p, RidgePolynomial) and not hasattr(p, "coefficients"):
        if p is None or not isinstance(p, (np.ndarray, list, tuple)) and not type(p).__module__.startswith("torch"):
            raise TypeError(f"p must be a polynomial approximant (RidgePolynomial, DensePolynomial: fit_polynomial's "
                            f"result) or its quadratic coefficients T2 [d_out, d_in, d_in], got {type(p).__name__}")
        p = to_numpy(p, "p")
        if p.ndim != 3 or p.shape[1] != p.shape[2]:
            raise ValueError(f"p as coefficients must have shape [d_out, d_in, d_in], got {list(p.shape)}")
    U = to_numpy(U, "U")
    if U.ndim == 1:
        U = U[:, None]
    if getattr(p, "degree", 2) < 2:
        raise ValueError(f"p has degree {p.degree}; quadratic forms need degree >= 2")
    d_out = p.d_out if hasattr(p, "d_out") else np.shape(p)[0]
    if U.ndim != 2 or U.shape[0] != d_out:
        raise ValueError(f"U must have shape [d_out={d_out}, n_dirs], got {list(U.shape)}")
    if isinstance(p, RidgePolynomial):
        gamma, delta = p._monomial_weights(2)
        wa = U.T @ (p.W2 * gamma)  # [m, h]
        Q = np.einsum("mh,hd,he->mde", wa, p.A, p.A, optimize=True)
        if delta is not None:
            wg = U.T @ (p.W2 * delta)
            T = np.einsum("mh,hd,he->mde", wg, p.G, p.A, optimize=True)
            Q = Q + 0.5 * (T + np.swapaxes(T, 1, 2))
        return Q
    T2 = _coef(p, 2)
    return np.einsum("om,ode->mde", U, T2)


def readout_quadratic_spectrum(p, U, n: int = 1) -> QuadraticSpectrum:
    """The ``n`` leading (by |eigenvalue|) eigenpairs of :func:`quadratic_forms` ``Q_m`` along output directions
    ``U [d_out, m]`` (Rigg & Belrose 2025, §4.1, on chosen outputs; ``U = I`` gives every output).

    For a :class:`~mlpinterp.poly.approximant.RidgePolynomial` whose ``k`` hidden units with a quadratic term span
    fewer than ``d_in`` dimensions (``Q_m = D^T M_m D`` with ``D [k, d_in]`` their directions, and the gate
    directions of a GLU), each form is eigendecomposed in that span through a thin QR ``D^T = Q R``:
    ``Q_m = Q (R M_m R^T) Q^T``, so a block with d_in = 1000 and 50 neurons costs ``[50, 50]`` eigenproblems, not
    ``[1000, 1000]`` ones; otherwise the dense forms of :func:`quadratic_forms` are eigendecomposed.

    Returns a :class:`QuadraticSpectrum` with eigenvalues ``[m, n]`` and eigenvectors ``[m, d_in, n]`` (unit
    columns in raw input coordinates; eigenvalues beyond the span are 0 and their vectors complete an orthonormal
    basis). Raises ``ValueError`` for ``n`` outside ``[1, d_in]`` and what :func:`quadratic_forms` raises.
    """
    from mlpinterp.poly.approximant import RidgePolynomial

    U = to_numpy(U, "U")
    if U.ndim == 1:
        U = U[:, None]
    if not isinstance(p, RidgePolynomial) or getattr(p, "degree", 2) < 2:
        w, v = _eigh_sorted(quadratic_forms(p, U))
        return QuadraticSpectrum(w[:, :_check_n(n, v.shape[1])], v[:, :, :_check_n(n, v.shape[1])])
    d = p.d_in
    n = _check_n(n, d)
    if U.shape[0] != p.d_out:
        raise ValueError(f"U must have shape [d_out={p.d_out}, n_dirs], got {list(U.shape)}")
    gamma, delta = p._monomial_weights(2)
    c = U.T @ (p.W2 * gamma)  # [m, h]
    e = None if delta is None else U.T @ (p.W2 * delta)
    used = np.any(c != 0, axis=0) if e is None else np.any(c != 0, axis=0) | np.any(e != 0, axis=0)
    k = int(used.sum())
    D = p.A[used] if e is None else np.concatenate([p.A[used], p.G[used]])
    if D.shape[0] >= d:
        w, v = _eigh_sorted(quadratic_forms(p, U))
        return QuadraticSpectrum(w[:, :n], v[:, :, :n])
    m = U.shape[1]
    M = np.zeros((m, D.shape[0], D.shape[0]))
    idx = np.arange(k)
    M[:, idx, idx] = c[:, used]
    if e is not None:
        M[:, idx, k + idx] = M[:, k + idx, idx] = 0.5 * e[:, used]
    Q, R = np.linalg.qr(D.T)  # [d, r], [r, r], r = D.shape[0] < d
    w, v = _eigh_sorted(np.einsum("ij,mjl,kl->mik", R, M, R, optimize=True))
    v = np.einsum("dr,mrn->mdn", Q, v)
    if w.shape[1] < n:  # the rest of the spectrum is 0: complete each basis orthonormally
        pad = n - w.shape[1]
        comp = np.linalg.svd(Q, full_matrices=True)[0][:, Q.shape[1]:Q.shape[1] + pad]
        w = np.concatenate([w, np.zeros((m, pad))], axis=1)
        v = np.concatenate([v, np.broadcast_to(comp, (m, d, pad))], axis=2)
    return QuadraticSpectrum(w[:, :n], v[:, :, :n].copy())


def _check_n(n, d: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 1 <= n <= d:
        raise ValueError(f"n must be an integer in [1, d_in={d}], got {n!r}")
    return int(n)


def _eigh_sorted(Q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenpairs of symmetric ``Q [m, r, r]`` sorted by decreasing |eigenvalue| (ties: stable)."""
    w, v = np.linalg.eigh(0.5 * (Q + np.swapaxes(Q, 1, 2)))
    order = np.argsort(-np.abs(w), axis=1, kind="stable")
    return np.take_along_axis(w, order, axis=1), np.take_along_axis(v, order[:, None, :], axis=2)
