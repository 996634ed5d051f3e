"""Features of an FFN block's quadratic approximant: eigenvectors of its quadratic term along the block's top
output directions, read out through the unembedding, and compared with SAE decoder directions.

Rigg & Belrose (2025, §4.1) read the eigenvectors of each output's quadratic form as features. A transformer block
has d_out = d_model outputs with no privileged basis, so the forms are taken along the top principal directions
of the block's output on real tokens (the directions it writes to most), ``Q_u = sum_o u_o T2[o]``.
"""

from __future__ import annotations

import numpy as np

from mlpinterp.poly.spectral import quadratic_forms
from mlpinterp.utils.validation import check_int, to_numpy


def output_directions(Y, n_dirs: int) -> tuple[np.ndarray, np.ndarray]:
    """Top principal directions of block outputs ``Y [n, d_out]``: ``U [d_out, n_dirs]`` and their variance
    fractions ``[n_dirs]`` (sign fixed so the largest-magnitude entry of each direction is positive).
    Raises ``TypeError``/``ValueError`` for a non-numeric or non-finite ``Y``, fewer than 2 rows, or outputs that
    do not vary (no direction, and the fractions would be 0 / 0)."""
    Y = to_numpy(Y, "Y")
    n_dirs = check_int(n_dirs, "n_dirs", minimum=1)
    if Y.ndim != 2 or Y.shape[0] < 2:
        raise ValueError(f"Y must have shape [n >= 2, d_out], got {list(Y.shape)}")
    w, V = np.linalg.eigh(np.cov(Y, rowvar=False))
    if not w[-1] > 1e-20 * max(float((Y**2).mean()), 1e-300):
        raise ValueError(f"Y ({Y.shape[0]} outputs) does not vary: the block's output is constant on these inputs")
    order = np.argsort(w)[::-1][: min(n_dirs, Y.shape[1])]
    U = V[:, order]
    U = U * np.sign(U[np.abs(U).argmax(0), np.arange(U.shape[1])])
    return U, w[order] / w.sum()


def eigen_features(p, U, n_top: int = 8) -> dict:
    """Eigendecomposition of ``p``'s quadratic forms along ``U [d_out, m]``.

    Returns ``eigenvalues [m, n_top]`` and ``eigenvectors [m, d_in, n_top]`` (sorted by decreasing |eigenvalue|),
    ``top_energy [m]``: the fraction of each form's squared Frobenius norm carried by its ``n_top`` eigenvalues
    (how low-rank the quadratic term is), and ``spectra [m, d_in]`` (all eigenvalues, sorted by |.|).
    """
    n_top = check_int(n_top, "n_top", minimum=1)
    Q = quadratic_forms(p, U)
    w, V = np.linalg.eigh(0.5 * (Q + np.swapaxes(Q, 1, 2)))
    order = np.argsort(-np.abs(w), axis=1)
    w = np.take_along_axis(w, order, axis=1)
    V = np.take_along_axis(V, order[:, None, :], axis=2)
    k = min(n_top, w.shape[1])
    energy = (w[:, :k] ** 2).sum(1) / np.maximum((w**2).sum(1), 1e-300)
    return {"eigenvalues": w[:, :k], "eigenvectors": V[:, :, :k], "top_energy": energy, "spectra": w}


def unembedding_tokens(vectors, W_U, tokenizer, n_tokens: int = 8) -> list[dict]:
    """Top tokens of each column of ``vectors [d_model, k]`` read through the unembedding ``W_U [vocab, d_model]``.

    Eigenvectors have no sign, so both ends are given: ``{"positive": [...], "negative": [...]}`` per vector
    (tokens with the largest and the smallest logit ``W_U v``). Raises ``TypeError``/``ValueError`` for
    non-numeric or non-finite arrays, mismatched shapes or ``n_tokens < 1``.
    """
    V = to_numpy(vectors, "vectors")
    W = to_numpy(W_U, "W_U")
    n_tokens = check_int(n_tokens, "n_tokens", minimum=1)
    if V.ndim != 2 or W.ndim != 2 or W.shape[1] != V.shape[0]:
        raise ValueError(f"vectors must be [d_model, k] and W_U [vocab, d_model]; got {list(V.shape)}, {list(W.shape)}")
    logits = W @ V
    out = []
    for j in range(V.shape[1]):
        order = np.argsort(logits[:, j])
        out.append({"positive": [tokenizer.decode([int(t)]) for t in order[::-1][:n_tokens]],
                    "negative": [tokenizer.decode([int(t)]) for t in order[:n_tokens]]})
    return out


def sae_alignment(vectors, decoder, *, n_random: int = 256, seed: int = 0) -> dict:
    """How well eigenvectors align with SAE decoder directions, against random directions.

    ``vectors [d, k]`` (unit columns), ``decoder [d_sae, d]`` (rows: decoder directions). For each vector the
    max |cosine| over decoder rows; the baseline is the same statistic for ``n_random`` uniformly random unit
    vectors. Returns ``max_cos [k]``, ``random_mean``, ``random_p95`` and ``fraction_above_random_p95``.
    Raises ``TypeError``/``ValueError`` for non-numeric or non-finite arrays (torch tensors are accepted), mismatched
    shapes, an empty decoder, a zero vector (no direction to compare) or ``n_random < 1``.
    """
    V = to_numpy(vectors, "vectors")
    D = to_numpy(decoder, "decoder")
    n_random = check_int(n_random, "n_random", minimum=1)
    if V.ndim != 2 or D.ndim != 2 or D.shape[1] != V.shape[0] or D.shape[0] < 1 or V.shape[1] < 1:
        raise ValueError(f"vectors must be [d, k >= 1] and decoder [d_sae >= 1, d]; got {list(V.shape)}, "
                         f"{list(D.shape)}")
    zero = np.flatnonzero(np.linalg.norm(V, axis=0) == 0)
    if zero.size:
        raise ValueError(f"vectors column(s) {zero[:5].tolist()} are zero: no direction to align")
    D = D / np.maximum(np.linalg.norm(D, axis=1, keepdims=True), 1e-300)
    V = V / np.maximum(np.linalg.norm(V, axis=0, keepdims=True), 1e-300)
    best = np.abs(D @ V).max(0)
    R = np.random.default_rng(seed).standard_normal((V.shape[0], n_random))
    R /= np.linalg.norm(R, axis=0, keepdims=True)
    rand = np.abs(D @ R).max(0)
    p95 = float(np.quantile(rand, 0.95))
    return {"max_cos": best.tolist(), "random_mean": float(rand.mean()), "random_p95": p95,
            "fraction_above_random_p95": float((best > p95).mean())}
