"""Least-squares projection of an FFN block onto its ridge family under the empirical law of real inputs.

Minimises ``sum_i ||f(x_i) - p(x_i)||^2 + lam ||B_nc||^2`` over the ridge family of degree n
(:mod:`mlpinterp.poly.readout`) exactly, through the normal equations ``(M + lam I_nc) B = C`` with
``M = sum_i phi(x_i) phi(x_i)^T`` and ``C = sum_i phi(x_i) f(x_i)^T``: the closed form of what fine-tuning the
read-out by SGD would converge to (the paper's own remedy for non-Gaussian inputs, Rigg & Belrose 2025,
Limitations, fine-tunes the closed form on data). ``M`` and ``C`` are sums, so they are all-reduced under
``torch.distributed`` and a projection spread over processes equals the single-process one.

Because the features of degree n - 1 lead those of degree n, one pass over the data builds the normal equations of
every degree <= n. The projection of degree 1 is ordinary least squares of an affine map (the baseline a user
would compute by hand).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

from mlpinterp.networks import GLU, MLP, Network
from mlpinterp.poly.readout import Readout, RidgeBasis
from mlpinterp.poly.ridge_validation import RIDGE_GRID, validation_targets
from mlpinterp.utils.validation import check_instance, check_int, check_real, check_shape, to_numpy

#: Default ridge: lam = DEFAULT_RIDGE * (mean diagonal of M over the non-constant features); a conditioning guard,
#: far below the noise level of 10^4-10^5 tokens.
DEFAULT_RIDGE = 1e-8


@dataclass
class NormalEquations:
    """Sums over samples of the degree-``degree`` features ``phi`` and targets ``y = f(x)``.

    M : ``[p, p]``; C : ``[p, d_out]``; yy : sum ||y||^2; y1 : sum y ``[d_out]``; n : samples.
    exact : True when the sums are exact expectations under an input model (then ``n = 1``), not sample sums.
    """

    degree: int
    M: np.ndarray
    C: np.ndarray
    yy: float
    y1: np.ndarray
    n: int
    exact: bool = False

    def all_reduce(self) -> NormalEquations:
        """Sum over the processes of the default ``torch.distributed`` group (no-op when not initialised)."""
        import torch
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            flat = np.concatenate([self.M.ravel(), self.C.ravel(), [self.yy], self.y1, [float(self.n)]])
            buf = torch.from_numpy(flat)
            dist.all_reduce(buf)
            b = buf.numpy()
            p, o = self.C.shape
            self.M = b[:p * p].reshape(p, p).copy()
            self.C = b[p * p:p * p + p * o].reshape(p, o).copy()
            self.yy = float(b[p * p + p * o])
            self.y1 = b[p * p + p * o + 1:p * p + p * o + 1 + o].copy()
            self.n = int(round(b[-1]))
        return self

    def check(self, basis: RidgeBasis) -> NormalEquations:
        """``self`` if it was built for ``basis`` at its degree (``M [p, p]``, ``C [p, d_out]`` with
        ``p = basis.n_features(degree)``, finite sums, ``n >= 1``); ``TypeError``/``ValueError`` otherwise."""
        check_instance(basis, RidgeBasis, "basis")
        degree = check_int(self.degree, "degree", minimum=1)
        p = basis.n_features(degree)
        if not isinstance(self.M, np.ndarray) or self.M.shape != (p, p) or not isinstance(self.C, np.ndarray) or \
                self.C.ndim != 2 or self.C.shape[0] != p:
            raise ValueError(f"the normal equations (M {list(np.shape(self.M))}, C {list(np.shape(self.C))}) were not "
                             f"built for this basis: its degree-{degree} family has {p} features (another basis, "
                             "block or degree?)")
        for name in ("M", "C", "y1"):
            to_numpy(getattr(self, name), name)
        check_real(self.yy, "yy", 0.0)
        check_shape(np.asarray(self.y1), "y1", (self.C.shape[1],))
        check_int(self.n, "n", minimum=1)
        return self

    def leading(self, degree: int, basis: RidgeBasis) -> NormalEquations:
        """The normal equations of a lower degree ``1 <= degree <= self.degree`` (leading block)."""
        degree = check_int(degree, "degree", minimum=1)
        if degree > self.degree:
            raise ValueError(f"degree must be <= {self.degree} (the degree these normal equations were built for), "
                             f"got {degree}")
        self.check(basis)
        p = basis.n_features(degree)
        return NormalEquations(degree, self.M[:p, :p], self.C[:p], self.yy, self.y1, self.n, self.exact)


def _check_network_basis(network, basis: RidgeBasis) -> None:
    """The network is an MLP/GLU whose widths and gating match the basis (the family is in its own neurons)."""
    check_instance(network, (MLP, GLU), "network")
    check_instance(basis, RidgeBasis, "basis")
    gated = isinstance(network, GLU)
    if basis.d_in != network.d_in or basis.d_hidden != network.d_hidden or basis.gated != gated:
        raise ValueError(f"basis (d_in={basis.d_in}, d_hidden={basis.d_hidden}, {'gated' if basis.gated else 'MLP'}) "
                         f"is not the ridge family of network {type(network).__name__}(d_in={network.d_in}, "
                         f"d_hidden={network.d_hidden}): build it from this block's closed form "
                         "(RidgeBasis.from_closed_form(fit_polynomial(network, gaussian, n), gaussian))")


def normal_equations(network: Network, basis: RidgeBasis, X, degree: int, *, chunk: int = 4096) -> NormalEquations:
    """Accumulate :class:`NormalEquations` of ``network`` on inputs ``X [m, d_in]`` (numpy or torch, any real dtype:
    float16/bfloat16 tensors and tensors requiring grad included; summed in float64).

    Raises ``TypeError``/``ValueError`` for a network or basis of the wrong kind, a basis that is not the network's
    family (other widths or gating), an ``X`` that is non-numeric (complex included), non-finite or not
    ``[m >= 1, d_in]``, a non-int ``degree`` / ``chunk``.
    """
    degree = check_int(degree, "degree", minimum=1)
    chunk = check_int(chunk, "chunk", minimum=1)
    _check_network_basis(network, basis)
    if not (isinstance(X, np.ndarray) or type(X).__module__.startswith("torch")):
        X = to_numpy(X, "X")  # lists and other array-likes; arrays and tensors are converted chunk by chunk below
    if X.ndim != 2 or X.shape[1] != network.d_in or X.shape[0] < 1:
        raise ValueError(f"X must have shape [m, d_in={network.d_in}] with m >= 1, got {list(X.shape)}")
    p = basis.n_features(degree)
    M = np.zeros((p, p))
    C = np.zeros((p, network.d_out))
    yy, y1 = 0.0, np.zeros(network.d_out)
    for s in range(0, X.shape[0], chunk):
        Xc = to_numpy(X[s:s + chunk], "X")  # float64, finite, real (no float64 copy of all of X at once)
        Phi = basis._features(Xc, degree)
        Y = network(Xc)
        M += Phi.T @ Phi
        C += Phi.T @ Y
        yy += float((Y * Y).sum())
        y1 += Y.sum(0)
    return NormalEquations(degree, M, C, yy, y1, X.shape[0])


def solve_projection(neq: NormalEquations, basis: RidgeBasis, *, ridge: float = DEFAULT_RIDGE) -> tuple[Readout, dict]:
    """Solve the (ridge-regularised) normal equations; returns the :class:`Readout` and a dict with the in-sample
    ``fvu`` (pooled over outputs), ``lam`` (absolute ridge) and ``n``.

    Raises ``TypeError`` for a ``neq`` that is not :class:`NormalEquations`; ``ValueError`` when ``neq`` was not
    built for ``basis`` (:meth:`NormalEquations.check`), there are fewer samples than features (the projection is
    not identified), the regularised system is not positive definite (constant features such as a dead neuron or a
    constant input dimension with ``ridge=0``: the message counts them), or the targets have no variance (the FVU is
    undefined: a constant block output).
    """
    check_instance(neq, NormalEquations, "neq")
    neq.check(basis)
    ridge = check_real(ridge, "ridge", 0.0)
    p = neq.M.shape[0]
    if not neq.exact and neq.n < p:
        raise ValueError(f"the degree-{neq.degree} ridge family has {p} features but only {neq.n} samples were given; "
                         "capture more tokens or lower the degree")
    diag = np.diag(neq.M)[1:]
    lam = ridge * float(diag.mean()) if diag.size else 0.0
    A = neq.M.copy()
    A[np.arange(1, p), np.arange(1, p)] += lam
    try:
        B = scipy.linalg.solve(A, neq.C, assume_a="pos")
    except (np.linalg.LinAlgError, ValueError) as e:
        _not_positive_definite(neq, ridge, e)
    return Readout.from_coefficients(basis, B, neq.degree), _in_sample(neq, B, lam)


def _not_positive_definite(neq: NormalEquations, ridge: float, e: Exception):
    """Raise the ``ValueError`` of a singular regularised system, counting the constant features."""
    p = neq.M.shape[0]
    # a feature with (numerically) zero variance is a multiple of the constant feature: M is singular
    mean = neq.M[0, 1:] / max(neq.M[0, 0], 1e-300)
    var = np.diag(neq.M)[1:] / max(neq.M[0, 0], 1e-300) - mean**2
    n_const = int((var <= 1e-12 * np.maximum(np.diag(neq.M)[1:] / max(neq.M[0, 0], 1e-300), 1e-300)).sum())
    what = f"{n_const} of the {p - 1} features are constant on the samples (dead neurons or constant input " \
           "dimensions)" if n_const else "the features are linearly dependent on the samples"
    raise ValueError(f"the degree-{neq.degree} normal equations are not positive definite with ridge={ridge:g}: "
                     f"{what}; use ridge > 0 (default {DEFAULT_RIDGE:g}) or more varied samples ({e})") from e


class RidgePath:
    """Solutions of the normal equations for many ridges from one eigendecomposition.

    With the constant feature eliminated (its coefficient is unpenalised: ``b = (y1 - m B) / n``), the other
    coefficients solve ``(Mc + lam I) B = Cc`` with the centred ``Mc = M_11 - m m^T / n``, ``Cc = C_1 - m y1^T / n``
    (``m = M[0, 1:]``, ``n = M[0, 0]``): the Schur complement of the system :func:`solve_projection` solves, so
    both give the same coefficients. ``Mc = Q diag(e) Q^T`` once; each ridge then costs two ``[p, p] x [p, d_out]``
    products: ``B = Q diag(1 / (e + lam)) Q^T Cc``.
    """

    def __init__(self, neq: NormalEquations):
        M, C = neq.M, neq.C
        n = float(M[0, 0])
        m = M[0, 1:]
        Mc = M[1:, 1:] - np.outer(m, m) / n
        self.e, self.Q = np.linalg.eigh(0.5 * (Mc + Mc.T))
        self.QtC = self.Q.T @ (C[1:] - np.outer(m, neq.y1) / n)
        self.neq, self.m, self.n = neq, m, n

    def solve(self, lam: float) -> np.ndarray:
        """``B [p, d_out]`` of the system with absolute ridge ``lam``; ``ValueError`` when it is not positive definite."""
        den = self.e + lam
        top = max(float(np.abs(self.e).max()) if self.e.size else 0.0, 1e-300)
        if self.e.size and not float(den.min()) > 1e-13 * top:
            raise np.linalg.LinAlgError(f"smallest eigenvalue {float(den.min()):.3g} of the centred, regularised "
                                        f"normal equations (largest {top:.3g})")
        Bc = self.Q @ (self.QtC / den[:, None])
        b = (self.neq.y1 - self.m @ Bc) / self.n
        return np.concatenate([b[None, :], Bc], axis=0)


def _total_samples(m: int) -> int:
    """``m`` summed over the processes of the default ``torch.distributed`` group (``m`` when not initialised)."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        buf = torch.tensor([float(m)], dtype=torch.float64)
        dist.all_reduce(buf)
        return int(round(float(buf[0])))
    return m


#: Bytes per Gram entry the dense route holds at once: M, the centred copy, its eigenvectors and LAPACK workspace.
DENSE_BYTES_PER_ENTRY = 8 * 4


def project_on_data(network: Network, basis: RidgeBasis, X, degrees, *, ridge: float | str = DEFAULT_RIDGE,
                    X_val=None, chunk: int = 4096, solver: str = "auto", tol: float = 1e-10,
                    maxiter: int = 2000) -> dict[int, tuple[Readout, dict]]:
    """The data projections of every degree in ``degrees`` from one pass over ``X``: ``{degree: (readout, info)}``.

    ``ridge``: a relative ridge (see :func:`solve_projection`), or ``"validation"``: for each degree the ridge of
    :data:`RIDGE_GRID` with the lowest FVU on ``X_val`` (samples not in ``X``; required then), reported as
    ``info["ridge"]`` with the grid's validation FVUs in ``info["ridge_path"]``; the whole grid is solved from one
    eigendecomposition per degree (:class:`RidgePath`). With 10^4 tokens and 3,457 features per output (MiniLM,
    degree 3) the unregularised fit overfits; the validation choice guards it.

    ``solver``: ``"dense"`` forms the ``[F, F]`` normal equations (F = ``basis.n_features(max degree)``);
    ``"cg"`` never does: conjugate gradients on the same ridge system with the features recomputed from ``X`` in
    chunks at every iteration (:mod:`mlpinterp.poly.projection_cg`; memory O(chunk x F + F x d_out), relative
    residual ``tol`` per output, at most ``maxiter`` iterations); ``"auto"`` is dense when the Gram fits in memory
    (:mod:`mlpinterp.utils.memory`), else CG (F = 26,113 for a Llama-7B-width GLU at degree 2: 22 GB dense).
    ``info["solver"]`` says which ran. Under ``torch.distributed`` the sums are all-reduced before solving (each
    process passes its own share of the samples; ``X_val`` is used as given on each process).

    The number of samples is checked against the number of features before any pass over ``X``. Raises
    ``ValueError`` for fewer samples than features, ``ridge="validation"`` without ``X_val``, an unknown ``ridge``
    or ``solver``.
    """
    if isinstance(degrees, (str, bytes)) or not hasattr(degrees, "__iter__"):
        raise TypeError(f"degrees must be a list of ints >= 1, got {type(degrees).__name__} {degrees!r}")
    degrees = sorted({check_int(d, "degree", minimum=1) for d in degrees})
    if not degrees:
        raise ValueError("degrees must name at least one degree >= 1, got none")
    if isinstance(ridge, str):
        if ridge != "validation":
            raise ValueError(f"ridge must be a number >= 0 or 'validation', got {ridge!r}")
        if X_val is None:
            raise ValueError("ridge='validation' needs X_val (samples held back from X)")
    else:
        ridge = check_real(ridge, "ridge", 0.0)
    if solver not in ("auto", "dense", "cg"):
        raise ValueError(f"solver must be 'auto', 'dense' or 'cg', got {solver!r}")
    _check_network_basis(network, basis)
    shape = tuple(getattr(X, "shape", ()))
    p = basis.n_features(degrees[-1])
    if len(shape) == 2 and shape[1] == network.d_in:
        n_total = _total_samples(shape[0])
        if n_total < p:
            raise ValueError(f"the degree-{degrees[-1]} ridge family has {p} features but only {n_total} samples "
                             "were given; capture more tokens or lower the degree")
    if solver == "auto":
        from mlpinterp.utils.memory import InsufficientMemoryError, require

        try:
            require(DENSE_BYTES_PER_ENTRY * p * p, "", "")
            solver = "dense"
        except InsufficientMemoryError:
            solver = "cg"
    if solver == "cg":
        from mlpinterp.poly.projection_cg import project_cg

        return project_cg(network, basis, X, degrees, ridge=ridge, X_val=X_val, chunk=chunk, tol=tol,
                          maxiter=maxiter)
    from mlpinterp.utils.memory import require

    require(DENSE_BYTES_PER_ENTRY * p * p, f"the dense [F, F] normal equations (F = {p})",
            "pass solver='cg' (no [F, F] matrix), fewer degrees, or a lower degree")
    neq = normal_equations(network, basis, X, degrees[-1], chunk=chunk).all_reduce()
    if not isinstance(ridge, str):
        return {d: _with_solver(solve_projection(neq.leading(d, basis), basis, ridge=ridge)) for d in degrees}
    Phi_val, Y_val, sst = validation_targets(network, basis, X_val, degrees[-1])
    out = {}
    for d in degrees:
        sub = neq.leading(d, basis)
        path = RidgePath(sub)
        diag = np.diag(sub.M)[1:]
        scale = float(diag.mean()) if diag.size else 0.0
        p_d = basis.n_features(d)

        def fit(r, sub=sub, path=path, scale=scale):
            try:
                B = path.solve(r * scale)
            except np.linalg.LinAlgError as e:
                _not_positive_definite(sub, r, e)
            return B, _in_sample(sub, B, r * scale)

        out[d] = _pick_ridge(basis, d, fit, Phi_val[:, :p_d], Y_val, sst, "dense")
    return out


def _with_solver(res: tuple[Readout, dict], solver: str = "dense") -> tuple[Readout, dict]:
    return res[0], {**res[1], "solver": solver}


def _pick_ridge(basis, degree, fit, Phi_val, Y_val, sst, solver):
    """The grid ridge with the lowest validation FVU: ``(readout, info)`` with ``ridge``, ``fvu_val``, ``ridge_path``."""
    path, best = [], None
    for r in RIDGE_GRID:
        B, info = fit(r)
        fvu_val = float(((Phi_val @ B - Y_val) ** 2).sum()) / sst
        path.append({"ridge": r, "fvu_val": fvu_val})
        if best is None or fvu_val < best[2]:
            best = (B, info, fvu_val, r)
    B, info, fvu_val, r = best
    ro = Readout.from_coefficients(basis, B, degree)
    return ro, {**info, "ridge": r, "fvu_val": fvu_val, "ridge_path": path, "solver": solver}


def _in_sample(neq: NormalEquations, B: np.ndarray, lam: float) -> dict:
    """``{"fvu", "lam", "n"}`` of coefficients ``B`` on the samples summarised by ``neq``."""
    sse = neq.yy - 2.0 * float((B * neq.C).sum()) + float((B * (neq.M @ B)).sum())
    sst = _sst(neq)
    return {"fvu": max(sse, 0.0) / sst, "lam": lam, "n": neq.n}


def _sst(neq: NormalEquations) -> float:
    sst = neq.yy - float(neq.y1 @ neq.y1) / neq.n
    if not sst > 1e-10 * neq.yy or not sst > 0:
        raise ValueError(f"the block's outputs have (numerically) no variance on the samples (total sum of squares "
                         f"{sst:.3g} against sum ||y||^2 = {neq.yy:.3g}): the FVU is undefined (a constant block, or "
                         "identical inputs)")
    return sst
