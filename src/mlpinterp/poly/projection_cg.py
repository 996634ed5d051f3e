"""The data projection without the ``[F, F]`` normal equations: conjugate gradients on the ridge system.

Solves the same problem as :func:`mlpinterp.poly.projection.project_on_data` (least squares over the ridge family
of degree n on samples ``X``, unpenalised intercept, ridge ``lam`` on the other coefficients): with the constant
feature eliminated, ``(Phi_c^T Phi_c + lam I) B = Phi_c^T (Y - ybar)`` for the centred features ``Phi_c`` (the
Schur complement of the dense system, :class:`~mlpinterp.poly.projection.RidgePath`). Each operator application
recomputes the features of ``X`` chunk by chunk: ``Phi_c^T (Phi_c V) = Phi^T (Phi V) - n mu (mu . V)``, so memory
is O(chunk x F + F x d_out) and a Llama-7B-width GLU (F = 26,113 at degree 2, a 5.5 GB Gram) fits in a few
hundred MB. Jacobi-preconditioned CG (Hestenes & Stiefel 1952; Saad, *Iterative Methods*, Alg. 9.1) runs on every
output column at once, each column with its own step sizes, until every column's relative residual is below
``tol``. Under ``torch.distributed`` every sum over samples is all-reduced, so processes holding shares of the
samples solve the single-process system.
"""

from __future__ import annotations

import numpy as np

from mlpinterp.networks import Network
from mlpinterp.poly.readout import Readout, RidgeBasis
from mlpinterp.poly.ridge_validation import RIDGE_GRID, validation_targets
from mlpinterp.utils.validation import check_int, to_numpy


def _all_reduce(a: np.ndarray) -> np.ndarray:
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        buf = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))
        dist.all_reduce(buf)
        return buf.numpy()
    return a


class _Streamed:
    """Feature sums of one degree on ``X`` and the centred Gram operator, recomputing features chunk by chunk."""

    def __init__(self, network: Network, basis: RidgeBasis, X, degree: int, chunk: int):
        self.basis, self.X, self.degree, self.chunk = basis, X, degree, chunk
        p = basis.n_features(degree) - 1
        o = network.d_out
        s1, s2, C = np.zeros(p), np.zeros(p), np.zeros((p, o))
        y1, yy, n = np.zeros(o), 0.0, 0
        for Phi, Xc in self._chunks():
            Y = network(Xc)
            s1 += Phi.sum(0)
            s2 += (Phi * Phi).sum(0)
            C += Phi.T @ Y
            y1 += Y.sum(0)
            yy += float((Y * Y).sum())
            n += Phi.shape[0]
        flat = _all_reduce(np.concatenate([s1, s2, C.ravel(), y1, [yy, float(n)]]))
        self.s1, self.s2 = flat[:p], flat[p:2 * p]
        C = flat[2 * p:2 * p + p * o].reshape(p, o)
        y1 = flat[2 * p + p * o:2 * p + p * o + o]
        yy, self.n = float(flat[-2]), float(flat[-1])
        self.mu, self.ybar = self.s1 / self.n, y1 / self.n
        self.Cc = C - self.n * np.outer(self.mu, self.ybar)
        self.sst = yy - self.n * float(self.ybar @ self.ybar)
        self.diag = self.s2 - self.n * self.mu**2  # diagonal of the centred Gram

    def _chunks(self):
        for s in range(0, self.X.shape[0], self.chunk):
            Xc = to_numpy(self.X[s:s + self.chunk], "X")
            yield self.basis._features(Xc, self.degree)[:, 1:], Xc

    def gram(self, V: np.ndarray) -> np.ndarray:
        """``Phi_c^T Phi_c V`` for ``V [F - 1, k]`` (one pass over ``X``)."""
        out = np.zeros_like(V)
        for Phi, _ in self._chunks():
            out += Phi.T @ (Phi @ V)
        out = _all_reduce(out)
        return out - self.n * np.outer(self.mu, self.mu @ V)


def _pcg(op: _Streamed, lam: float, tol: float, maxiter: int, B0: np.ndarray | None) -> tuple[np.ndarray, dict]:
    """Jacobi-preconditioned CG on every column of ``(Gc + lam I) B = Cc``; ``(B, {"iterations", "residual"})``."""
    rhs = op.Cc
    pre = 1.0 / np.maximum(op.diag + lam, 1e-300)
    B = np.zeros_like(rhs) if B0 is None else B0.copy()
    R = rhs - (op.gram(B) + lam * B) if B0 is not None else rhs.copy()
    norm_rhs = np.maximum(np.linalg.norm(rhs, axis=0), 1e-300)
    Z = R * pre[:, None]
    P = Z.copy()
    rz = (R * Z).sum(0)
    it = 0
    res = np.linalg.norm(R, axis=0) / norm_rhs
    while it < maxiter and res.max() > tol:
        AP = op.gram(P) + lam * P
        pap = (P * AP).sum(0)
        alpha = np.where(pap > 0, rz / np.where(pap > 0, pap, 1.0), 0.0)
        B += alpha * P
        R -= alpha * AP
        Z = R * pre[:, None]
        rz_new = (R * Z).sum(0)
        beta = np.where(rz > 0, rz_new / np.where(rz > 0, rz, 1.0), 0.0)
        P = Z + beta * P
        rz = rz_new
        it += 1
        res = np.linalg.norm(R, axis=0) / norm_rhs
    return B, {"iterations": it, "residual": float(res.max())}


def _full(op: _Streamed, Bc: np.ndarray) -> np.ndarray:
    """Coefficients with the intercept: ``b = ybar - mu . B`` on top of ``B``."""
    return np.concatenate([(op.ybar - op.mu @ Bc)[None, :], Bc], axis=0)


def project_cg(network: Network, basis: RidgeBasis, X, degrees: list[int], *, ridge, X_val=None, chunk: int = 4096,
               tol: float = 1e-10, maxiter: int = 2000) -> dict[int, tuple[Readout, dict]]:
    """:func:`~mlpinterp.poly.projection.project_on_data` with ``solver="cg"`` (module docstring); same returns, with
    ``info["solver"] = "cg"``, ``info["iterations"]`` and ``info["residual"]`` (largest relative residual over
    outputs). Raises ``ValueError`` for a non-positive ``tol`` / ``maxiter`` and when CG does not reach ``tol``
    within ``maxiter`` iterations (the message gives the residual reached)."""
    chunk = check_int(chunk, "chunk", minimum=1)
    maxiter = check_int(maxiter, "maxiter", minimum=1)
    if not (isinstance(tol, float | int) and 0 < tol < 1):
        raise ValueError(f"tol must be a number in (0, 1), got {tol!r}")
    if not (isinstance(X, np.ndarray) or type(X).__module__.startswith("torch")):
        X = to_numpy(X, "X")
    if X.ndim != 2 or X.shape[1] != network.d_in or X.shape[0] < 1:
        raise ValueError(f"X must have shape [m, d_in={network.d_in}] with m >= 1, got {list(X.shape)}")
    if not isinstance(ridge, str):
        grid = (float(ridge),)
    else:
        grid = RIDGE_GRID
        Phi_val, Y_val, sst_val = validation_targets(network, basis, X_val, degrees[-1])
    out = {}
    for d in degrees:
        op = _Streamed(network, basis, X, d, chunk)
        if not op.sst > 0:
            raise ValueError(f"the block's outputs have (numerically) no variance on the samples (total sum of squares "
                             f"{op.sst:.3g}): the FVU is undefined")
        scale = float(op.s2.mean()) if op.s2.size else 0.0  # mean diagonal of the uncentred Gram, as the dense route
        best, path, B_prev = None, [], None
        for r in grid:
            lam = r * scale
            if lam == 0 and np.any(op.diag <= 1e-12 * np.maximum(op.s2, 1e-300)):
                raise ValueError(f"the degree-{d} normal equations are not positive definite with ridge=0: "
                                 f"{int((op.diag <= 1e-12 * np.maximum(op.s2, 1e-300)).sum())} features are constant "
                                 "on the samples; use ridge > 0")
            Bc, cg = _pcg(op, lam, tol, maxiter, B_prev)
            if cg["residual"] > tol:
                raise ValueError(f"the degree-{d} CG projection stopped at relative residual {cg['residual']:.3g} after "
                                 f"{cg['iterations']} iterations (tol {tol:g}); raise maxiter or the ridge")
            B_prev = Bc
            GB = op.gram(Bc)
            sse = op.sst - 2.0 * float((Bc * op.Cc).sum()) + float((Bc * GB).sum())
            B = _full(op, Bc)
            info = {"fvu": max(sse, 0.0) / op.sst, "lam": lam, "n": int(op.n), "solver": "cg", **cg}
            if isinstance(ridge, str):
                p_d = basis.n_features(d)
                fvu_val = float(((Phi_val[:, :p_d] @ B - Y_val) ** 2).sum()) / sst_val
                path.append({"ridge": r, "fvu_val": fvu_val})
                info.update(ridge=r, fvu_val=fvu_val)
            if best is None or (isinstance(ridge, str) and info["fvu_val"] < best[1]["fvu_val"]):
                best = (B, info)
        B, info = best
        if isinstance(ridge, str):
            info["ridge_path"] = path
        out[d] = (Readout.from_coefficients(basis, B, d), info)
    return out
