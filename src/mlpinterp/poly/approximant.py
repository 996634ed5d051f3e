"""Polynomial approximant objects.

* ``RidgePolynomial``: the exact single-Gaussian approximant in factored form (any degree, O(n d_hidden)
  per input, never a ``d_in^n`` tensor):

      p(x) = b2 + W2 h(x),   h_j(x) = sum_{k<=n} D[j,k] He_k(z_j) + eps_j(x) sum_{k<n} E[j,k] He_k(z_j),
      z_j = A_j . (x - center),   eps_j = G_j . (x - center)          (eps only for GLUs)

* ``DensePolynomial``: explicit symmetric coefficient tensors ``[d_out] , [d_out, d_in], [d_out, d_in, d_in], ...``
  (used for Gaussian-mixture approximants and by materialising a ``RidgePolynomial``).

Both are callable on ``X [n, d_in]`` -> ``[n, d_out]`` and expose ``coefficients(k)``, ``degree``,
``to_module()`` and ``save(path)``. Coefficients are in raw input coordinates: p(x) = sum_k T_k[x, ..., x].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlpinterp.gaussian.hermite import hermite_he, hermite_to_monomial
from mlpinterp.utils.reprs import digest, short_repr
from mlpinterp.utils.validation import as_inputs, frozen, to_numpy

#: Largest number of float64 entries ``coefficients(k)`` will materialise (2 GiB).
MAX_TENSOR_ENTRIES = 2**28


def _check_materialise(d_out: int, d_in: int, k: int) -> None:
    size = d_out * d_in**k
    if size > MAX_TENSOR_ENTRIES:
        raise ValueError(
            f"the degree-{k} coefficient tensor has d_out * d_in^{k} = {d_out} * {d_in}^{k} = {size:.3g} entries, "
            f"more than MAX_TENSOR_ENTRIES = {MAX_TENSOR_ENTRIES:.3g}; evaluate the approximant in factored form "
            "(call it on inputs) instead"
        )


def _sym_outer(G: np.ndarray, A: np.ndarray, r: int, weights: np.ndarray) -> np.ndarray:
    """sum_j weights[o, j] * Sym(G_j (x) A_j^{(x)(r-1)}) -> ``[d_out, d_in^r]`` (r <= 2 fast path, else einsum)."""
    if r == 1:
        return weights @ G
    if r == 2:
        T = np.einsum("oj,ja,jb->oab", weights, G, A, optimize=True)
        return 0.5 * (T + np.swapaxes(T, 1, 2))
    letters = "abcdefgh"[:r]
    ops = ["oj", "j" + letters[0]] + ["j" + c for c in letters[1:]]
    T = np.einsum(",".join(ops) + "->o" + letters, weights, G, *([A] * (r - 1)), optimize=True)
    return _symmetrise(T)


def _symmetrise(T: np.ndarray) -> np.ndarray:
    """Average ``T [o, d, ..., d]`` over all permutations of its trailing axes."""
    import itertools

    r = T.ndim - 1
    perms = list(itertools.permutations(range(1, r + 1)))
    return sum(np.transpose(T, (0,) + p) for p in perms) / len(perms)


def _power_outer(A: np.ndarray, r: int, weights: np.ndarray) -> np.ndarray:
    """sum_j weights[o, j] A_j^{(x) r} -> ``[d_out, d_in^r]``."""
    if r == 0:
        return weights.sum(1)
    if r == 1:
        return weights @ A
    if r == 2:
        # one 2-D GEMM [o*d, h] @ [h, d] (numpy's broadcast batched matmul is much slower here)
        o, (h, d) = weights.shape[0], A.shape
        return ((A.T[None, :, :] * weights[:, None, :]).reshape(o * d, h) @ A).reshape(o, d, d)
    letters = "abcdefgh"[:r]
    ops = ["oj"] + ["j" + c for c in letters]
    return np.einsum(",".join(ops) + "->o" + letters, weights, *([A] * r), optimize=True)


@dataclass(frozen=True, eq=False)
class RidgePolynomial:
    """Factored degree-n polynomial (see module docstring). Produced by ``fit_polynomial`` under one Gaussian.

    Attributes
    ----------
    center : ``[d_in]`` expansion point (the Gaussian mean)
    A : ``[d_hidden, d_in]`` standardised pre-activation directions (zero rows for constant neurons)
    D : ``[d_hidden, n+1]`` Hermite coefficients of each neuron's ridge part
    W2 : ``[d_out, d_hidden]``, b2 : ``[d_out]``
    G : ``[d_hidden, d_in]`` or None, gate-residual directions (GLU only)
    E : ``[d_hidden, n]`` or None, Hermite coefficients multiplying the gate residual (GLU only)
    info : dict of provenance (network type, activation, distribution, method)
    """

    center: np.ndarray
    A: np.ndarray
    D: np.ndarray
    W2: np.ndarray
    b2: np.ndarray
    G: np.ndarray | None = None
    E: np.ndarray | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # private read-only copies: in-place edits by a caller cannot silently change a fitted approximant
        for name in ("center", "A", "D", "W2", "b2", "G", "E"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, frozen(np.asarray(v, dtype=np.float64)))

    @property
    def degree(self) -> int:
        return self.D.shape[1] - 1

    d_in = property(lambda self: self.A.shape[1])
    d_out = property(lambda self: self.W2.shape[0])
    d_hidden = property(lambda self: self.A.shape[0])

    def __repr__(self) -> str:
        """Degree, shapes, provenance (method, distribution), dtype and a digest of the factors (not the arrays)."""
        return short_repr("RidgePolynomial", degree=self.degree, d_in=self.d_in, d_hidden=self.d_hidden,
                          d_out=self.d_out, gated=self.G is not None, method=_info_str(self.info, "method"),
                          distribution=_info_str(self.info, "distribution"), dtype=self.A.dtype,
                          digest=digest(*self.state().values()))

    def hidden(self, X, *, chunk: int = 4096) -> np.ndarray:
        """The polynomial hidden units ``h(x)``: ``[n, d_hidden]``."""
        X, _ = as_inputs(X, self.d_in)
        out = np.empty((X.shape[0], self.d_hidden))
        n = self.degree
        for s in range(0, X.shape[0], chunk):
            Xc = X[s : s + chunk] - self.center
            He = hermite_he(n, Xc @ self.A.T)  # [b, h, n+1]
            h = np.einsum("bjk,jk->bj", He, self.D)
            if self.G is not None and n >= 1:
                h += (Xc @ self.G.T) * np.einsum("bjk,jk->bj", He[..., :n], self.E)
            out[s : s + chunk] = h
        return out

    def __call__(self, X) -> np.ndarray:
        X, single = as_inputs(X, self.d_in)
        out = self.hidden(X) @ self.W2.T + self.b2
        return out[0] if single else out

    def _monomial_weights(self, r: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-neuron scalars gamma_j, delta_j of the degree-r part (see module docstring)."""
        n = self.degree
        H = hermite_to_monomial(n)  # He_k = sum_i H[k, i] z^i
        a0 = -(self.A @ self.center)  # z_j = A_j.x + a0_j
        P = self.D @ H  # [h, n+1] monomial coefficients in z
        i = np.arange(n + 1)
        binom_r = np.array([math.comb(int(t), r) if t >= r else 0 for t in i], dtype=np.float64)
        pw = np.where(i >= r, a0[:, None] ** np.maximum(i - r, 0), 0.0)
        gamma = (P * binom_r * pw).sum(1)
        if self.G is None or n == 0:
            return gamma, None
        Q = self.E @ H[:n, :n]  # [h, n]
        g0 = -(self.G @ self.center)
        i2 = np.arange(n)
        b_r = np.array([math.comb(int(t), r) if t >= r else 0 for t in i2], dtype=np.float64)
        pw_r = np.where(i2 >= r, a0[:, None] ** np.maximum(i2 - r, 0), 0.0)
        gamma = gamma + g0 * (Q * b_r * pw_r).sum(1)
        if r == 0:
            return gamma, None
        b_r1 = np.array([math.comb(int(t), r - 1) if t >= r - 1 else 0 for t in i2], dtype=np.float64)
        pw_r1 = np.where(i2 >= r - 1, a0[:, None] ** np.maximum(i2 - r + 1, 0), 0.0)
        delta = (Q * b_r1 * pw_r1).sum(1)
        return gamma, delta

    def coefficients(self, k: int) -> np.ndarray:
        """Symmetric degree-k coefficient tensor in raw input coordinates.

        Returns ``[d_out]`` (k=0), ``[d_out, d_in]`` (k=1), ``[d_out, d_in, d_in]`` (k=2), ...
        Raises ``ValueError`` if k is outside [0, degree] or the tensor would exceed ``MAX_TENSOR_ENTRIES``.
        """
        if not isinstance(k, int | np.integer) or not 0 <= k <= self.degree:
            raise ValueError(f"k must be an integer in [0, degree={self.degree}], got {k!r}")
        _check_materialise(self.d_out, self.d_in, int(k))
        gamma, delta = self._monomial_weights(int(k))
        T = _power_outer(self.A, int(k), self.W2 * gamma)
        if delta is not None:
            T = T + _sym_outer(self.G, self.A, int(k), self.W2 * delta)
        if k == 0:
            T = T + self.b2
        return T

    def to_dense(self) -> DensePolynomial:
        """Materialise all coefficient tensors (raises ``ValueError`` when too large)."""
        info = {**self.info, "d_in": self.d_in}
        return DensePolynomial(tuple(self.coefficients(k) for k in range(self.degree + 1)), info=info)

    def to_module(self):
        """A float64 ``torch.nn.Module`` computing this polynomial (factored; differentiable).

        The module maps ``[..., d_in] -> [..., d_out]`` and raises ``ValueError`` for another input width.
        """
        from mlpinterp.poly.torch_module import RidgePolynomialModule

        module = RidgePolynomialModule(self)
        module.register_forward_pre_hook(_InputWidthCheck(self.d_in, batched_only=False))
        return module

    def state(self) -> dict[str, np.ndarray]:
        st = dict(center=self.center, A=self.A, D=self.D, W2=self.W2, b2=self.b2)
        if self.G is not None:
            st.update(G=self.G, E=self.E)
        return st

    def save(self, path: str | Path, provenance: dict | None = None) -> Path:
        """Save as the artifact ``ridge_polynomial`` (:func:`mlpinterp.utils.artifact.save_artifact`: safetensors +
        JSON, atomic, hashed); ``provenance`` records what it was computed from (e.g. the network's digest, its
        training step, the distribution), checked by :func:`load_polynomial`. Returns the ``.safetensors`` path."""
        return _save(self, "ridge", path, provenance)


@dataclass(frozen=True, eq=False)
class DensePolynomial:
    """p(x) = sum_k T_k[x, ..., x] with symmetric tensors ``T_k [d_out, d_in^k]`` (k = 0..degree).

    Attributes
    ----------
    tensors : tuple of coefficient tensors, ``tensors[0]`` is ``[d_out]``
    info : provenance dict; ``info["solver_info"]`` holds iterative-solver diagnostics when present
    """

    tensors: tuple[np.ndarray, ...]
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensors", tuple(frozen(np.asarray(T, dtype=np.float64)) for T in self.tensors))

    @property
    def degree(self) -> int:
        return len(self.tensors) - 1

    d_out = property(lambda self: self.tensors[0].shape[0])
    d_in = property(lambda self: self.tensors[1].shape[1] if len(self.tensors) > 1 else self.info.get("d_in", 0))

    def __repr__(self) -> str:
        """Degree, shapes, provenance (method, distribution), dtype and a digest of the tensors (not the arrays)."""
        return short_repr("DensePolynomial", degree=self.degree, d_in=self.d_in, d_out=self.d_out,
                          method=_info_str(self.info, "method"), distribution=_info_str(self.info, "distribution"),
                          dtype=self.tensors[0].dtype, digest=digest(*self.tensors))

    @property
    def solver_info(self) -> dict[str, Any] | None:
        """Iterative solver diagnostics (iterations, relative residual) when an iterative method was used."""
        return self.info.get("solver_info")

    def coefficients(self, k: int) -> np.ndarray:
        """Degree-k coefficient tensor (see ``RidgePolynomial.coefficients``)."""
        if not isinstance(k, int | np.integer) or not 0 <= k <= self.degree:
            raise ValueError(f"k must be an integer in [0, degree={self.degree}], got {k!r}")
        return self.tensors[int(k)]

    def __call__(self, X, *, chunk: int = 1024) -> np.ndarray:
        if self.degree == 0:
            if self.d_in:  # known (recorded in info["d_in"]): validate like any other degree
                X, single = as_inputs(X, self.d_in)
            else:
                X = to_numpy(X, "X")
                single = X.ndim == 1
            n = 1 if single else X.shape[0]
            out = np.broadcast_to(self.tensors[0], (n, self.d_out)).copy()
            return out[0] if single else out
        X, single = as_inputs(X, self.d_in)
        out = np.broadcast_to(self.tensors[0], (X.shape[0], self.d_out)).copy()
        for s in range(0, X.shape[0], chunk):
            Xc = X[s : s + chunk]
            for k in range(1, self.degree + 1):
                T = self.tensors[k]
                Y = np.tensordot(Xc, T, axes=([1], [T.ndim - 1]))  # BLAS: contract the last axis -> [b, o, ...]
                for _ in range(k - 1):
                    Y = np.einsum("no...a,na->no...", Y, Xc)
                out[s : s + chunk] += Y
        return out[0] if single else out

    def to_module(self):
        """A float64 ``torch.nn.Module`` computing this polynomial: ``[n, d_in] -> [n, d_out]``.

        Raises ``ValueError`` for inputs of another shape (when d_in is known, see ``d_in``).
        """
        from mlpinterp.poly.torch_module import DensePolynomialModule

        module = DensePolynomialModule(self)
        if self.d_in:
            module.register_forward_pre_hook(_InputWidthCheck(self.d_in, batched_only=True))
        return module

    def state(self) -> dict[str, np.ndarray]:
        return {f"T{k}": T for k, T in enumerate(self.tensors)}

    def save(self, path: str | Path, provenance: dict | None = None) -> Path:
        """Save as the artifact ``dense_polynomial`` (:func:`mlpinterp.utils.artifact.save_artifact`: safetensors +
        JSON, atomic, hashed); ``provenance`` records what it was computed from (e.g. the network's digest, its
        training step, the distribution), checked by :func:`load_polynomial`. Returns the ``.safetensors`` path."""
        return _save(self, "dense", path, provenance)


Polynomial = RidgePolynomial | DensePolynomial


def _info_str(info: dict, key: str) -> str | None:
    """``info[key]`` as a short string for a repr (``None`` when absent; cut at 60 characters)."""
    v = info.get(key) if isinstance(info, dict) else None
    if v is None:
        return None
    v = str(v)
    return v if len(v) <= 60 else v[:57] + "..."


class _InputWidthCheck:
    """Forward pre-hook of the ``to_module()`` modules: raise ``ValueError`` unless the input is ``[..., d_in]``."""

    def __init__(self, d_in: int, batched_only: bool):
        self.d_in, self.batched_only = int(d_in), batched_only

    def __call__(self, module, args):
        x = args[0] if args else None
        shape = list(getattr(x, "shape", []))
        ok = len(shape) == 2 if self.batched_only else len(shape) >= 1
        if not ok or shape[-1] != self.d_in:
            want = f"[n, d_in={self.d_in}]" if self.batched_only else f"[..., d_in={self.d_in}]"
            raise ValueError(f"x must have shape {want}, got {shape}")
        return None


KINDS = {"ridge": "ridge_polynomial", "dense": "dense_polynomial"}
"""Artifact kind of each polynomial class's files."""


def _save(p: Polynomial, kind: str, path: str | Path, provenance: dict | None) -> Path:
    import torch

    from mlpinterp.utils.artifact import save_artifact

    tensors = {k: torch.from_numpy(np.array(v, copy=True, order="C")) for k, v in p.state().items()}
    meta = {"degree": p.degree, "info": _jsonable(p.info)}
    return save_artifact(path, tensors, kind=KINDS[kind], meta=meta, provenance=provenance)


def _jsonable(d):
    if isinstance(d, dict):
        return {str(k): _jsonable(v) for k, v in d.items()}
    if isinstance(d, list | tuple):
        return [_jsonable(v) for v in d]
    if isinstance(d, np.generic):
        return d.item()
    if isinstance(d, np.ndarray):
        return d.tolist() if d.size <= 64 else f"<array {list(d.shape)}>"
    if isinstance(d, float) and not np.isfinite(d):
        return repr(d)  # "nan", "inf": JSON has no such numbers
    if isinstance(d, str | int | float | bool) or d is None:
        return d
    return repr(d)


def load_polynomial(path: str | Path, provenance: dict | None = None) -> Polynomial:
    """Load an approximant saved with ``.save`` (``path`` with or without the ``.safetensors`` suffix).

    ``provenance``: values the recorded provenance must hold (e.g. ``{"step": 128}``).

    Raises ``FileNotFoundError`` for a missing file; :class:`~mlpinterp.utils.artifact.ArtifactError` (a
    ``ValueError``) for a corrupt, truncated or edited file, a file of another kind or a newer mlpinterp, or another
    provenance; ``ValueError`` for metadata that does not fit the tensors (a ``degree`` that does not match them,
    wrong tensor shapes).
    """
    from mlpinterp.utils.artifact import load_artifact

    art = load_artifact(path, kind=tuple(KINDS.values()), provenance=provenance, what="polynomial",
                        fix="delete it and recompute the approximant")
    tensors, meta = art.tensors, art.meta
    if not isinstance(meta, dict):
        raise ValueError(f"{str(path)!r}: metadata must be a JSON object, got {type(meta).__name__}")
    kind = "ridge" if art.kind == KINDS["ridge"] else "dense"
    degree, info = meta.get("degree"), meta.get("info", {})
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 0:
        raise ValueError(f"{str(path)!r}: metadata 'degree' must be a non-negative int, got {degree!r}")
    if not isinstance(info, dict):
        raise ValueError(f"{str(path)!r}: metadata 'info' must be a dict, got {type(info).__name__}")
    bad = [k for k, v in tensors.items() if not v.dtype.is_floating_point]
    if bad:
        raise ValueError(f"{str(path)!r}: tensors {bad} must have a floating dtype")
    arr = {k: v.double().numpy() for k, v in tensors.items()}
    if kind == "ridge":
        need, optional = {"center", "A", "D", "W2", "b2"}, {"G", "E"}
        if not need <= set(arr) or not set(arr) <= need | optional or ("G" in arr) != ("E" in arr):
            raise ValueError(
                f"{str(path)!r}: a ridge polynomial needs tensors center, A, D, W2, b2 (and G, E together), "
                f"got {sorted(arr)}"
            )
        h, d = arr["A"].shape if arr["A"].ndim == 2 else (-1, -1)
        shapes_ok = (
            arr["A"].ndim == 2 and arr["center"].shape == (d,) and arr["D"].shape == (h, degree + 1)
            and arr["W2"].ndim == 2 and arr["W2"].shape[1] == h and arr["b2"].shape == (arr["W2"].shape[0],)
            and ("G" not in arr or (arr["G"].shape == (h, d) and arr["E"].shape == (h, degree)))
        )
        if not shapes_ok:
            raise ValueError(
                f"{str(path)!r}: ridge tensor shapes are inconsistent with degree {degree}: "
                f"{ {k: list(v.shape) for k, v in arr.items()} }"
            )
        return RidgePolynomial(**arr, info=info)
    names = {f"T{k}" for k in range(degree + 1)}
    if set(arr) != names:
        raise ValueError(
            f"{str(path)!r}: a dense polynomial of degree {degree} needs tensors {sorted(names)}, got {sorted(arr)}"
        )
    T = [arr[f"T{k}"] for k in range(degree + 1)]
    d_out = T[0].shape[0] if T[0].ndim == 1 else -1
    d_in = T[1].shape[-1] if degree >= 1 and T[1].ndim == 2 else info.get("d_in", 0)
    if d_out < 0 or any(t.shape != (d_out,) + (d_in,) * k for k, t in enumerate(T)):
        raise ValueError(
            f"{str(path)!r}: dense tensor shapes must be [d_out, d_in^k]; got {[list(t.shape) for t in T]}"
        )
    return DensePolynomial(tuple(T), info=info)
