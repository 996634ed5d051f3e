"""Gaussian and Gaussian-mixture input distributions.

The approximants of Rigg & Belrose (2025, arXiv 2502.01032, §3) are least-squares optimal under
an input law; this module holds the laws. Covariances may be singular (real image data has
constant pixels): the approximant is then defined on the support ``mean + range(cov)`` and,
off the support, by orthogonal projection onto it (the minimum-norm solution, as ``lstsq`` gives).

The rank is decided in standardised coordinates (each coordinate divided by its own standard deviation), so inputs
in mixed units (variances 1e4 and 1e-7) keep every direction they vary along; a direction is dropped only when it
is negligible relative to the variances of the coordinates it mixes, and then with a warning naming its variance.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from mlpinterp.utils.reprs import digest, short_repr
from mlpinterp.utils.validation import check_shape, frozen, to_numpy

#: Relative tolerance (w.r.t. the largest eigenvalue) below which an eigenvalue counts as zero
#: and above which a negative eigenvalue makes a covariance non-PSD.
PSD_RTOL = 1e-10


def _check_cov(cov: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Symmetrise-check ``cov`` and return ``(cov, eigvals, eigvecs)`` with tiny negatives clipped."""
    scale = float(np.max(np.abs(cov))) if cov.size else 0.0
    # halves first: cov - cov.T and cov + cov.T overflow for entries near the float64 maximum
    asym = 2.0 * float(np.max(np.abs(0.5 * cov - 0.5 * cov.T))) if cov.size else 0.0
    if asym > 1e-8 * max(scale, 1e-300):
        raise ValueError(f"{name} must be symmetric; max |cov - cov.T| = {asym:.3g}")
    cov = 0.5 * cov + 0.5 * cov.T
    if scale > 0.0:
        # eigen-decompose the unit-scale matrix (no overflow/underflow inside LAPACK), then rescale
        w, v = np.linalg.eigh(cov / scale)
        with np.errstate(over="ignore"):
            w = w * scale
        if not np.all(np.isfinite(w)):
            raise ValueError(f"{name} has eigenvalues beyond the float64 range (largest entry {scale:.3g})")
    else:
        w, v = np.zeros(cov.shape[0]), np.eye(cov.shape[0])
    top = max(float(w[-1]) if w.size else 0.0, 0.0)
    # relative test only: an indefinite matrix is rejected at any scale (diag(1e-20, -1e-21) included)
    if w.size and w[0] < -PSD_RTOL * max(top, scale):
        raise ValueError(
            f"{name} must be positive semi-definite; smallest eigenvalue {w[0]:.3g} "
            f"(largest {top:.3g})"
        )
    w = np.where(w < PSD_RTOL * top, 0.0, w)
    return cov, w, v


def _support_factor(cov: np.ndarray, mean: np.ndarray, w: np.ndarray, v: np.ndarray,
                    name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(factor [d, r], support [d, r])`` with the rank decided in standardised coordinates.

    A coordinate is constant when its standard deviation is below the rounding of its mean (``4 eps |mean_i|``,
    exactly 0 included); the others are divided by their standard deviations and the correlation matrix's
    eigenvalues below :data:`PSD_RTOL` times its largest count as zero. When that keeps more directions than the
    raw eigenvalues (relative to the largest variance) do, the factor is the SVD of the standardised one mapped
    back, ``U S`` with ``cov ~ U S^2 U^T`` (orthogonal columns: ``factor = support * sqrt(eigenvalue)`` as for the
    raw route). Warns (``RuntimeWarning``) when a dropped direction's standardised eigenvalue is above rounding
    (a direction the data resolve, not numerical noise), naming the variance dropped.
    """
    keep = w > 0
    d = cov.shape[0]
    if keep.all() or d == 0:
        return v[:, keep] * np.sqrt(w[keep]), v[:, keep]
    var = np.maximum(np.diag(cov), 0.0)
    live = var > (4 * np.finfo(float).eps * np.abs(mean)) ** 2
    if not live.any():
        return v[:, keep] * np.sqrt(w[keep]), v[:, keep]
    sd = np.sqrt(var[live])
    corr = cov[np.ix_(live, live)] / sd[:, None] / sd[None, :]
    wc, vc = np.linalg.eigh(0.5 * (corr + corr.T))
    top = max(float(wc[-1]), 0.0)
    keep_c = wc > PSD_RTOL * top
    noise = 64 * np.finfo(float).eps * np.sqrt(corr.shape[0]) * top
    resolved = (~keep_c) & (wc > noise)
    if keep_c.sum() > keep.sum():
        B = np.zeros((d, int(keep_c.sum())))
        B[live] = sd[:, None] * vc[:, keep_c] * np.sqrt(wc[keep_c])
        U, S, _ = np.linalg.svd(B, full_matrices=False)
        nz = S > 0
        factor, support = U[:, nz] * S[nz], U[:, nz]
    else:
        factor, support = v[:, keep] * np.sqrt(w[keep]), v[:, keep]
    if resolved.any():
        dropped = float(var.sum() - np.einsum("dr,dr->", factor, factor))
        warnings.warn(
            f"{name}: {int(resolved.sum())} direction(s) dropped from the support: their eigenvalues in standardised "
            f"coordinates (each coordinate divided by its own standard deviation) are up to {wc[resolved].max():.3g}, "
            f"below {PSD_RTOL:g} of the largest ({top:.3g}); variance dropped {max(dropped, 0.0):.3g} of "
            f"{float(var.sum()):.3g}. The law is treated as constant along them; rescale the inputs or add "
            "shrinkage if the network reads them",
            RuntimeWarning, stacklevel=4,
        )
    return factor, support


def _check_n(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    return int(n)


@dataclass(frozen=True, eq=False)
class Gaussian:
    """Multivariate normal law N(mean, cov) on R^d; cov may be singular.

    Parameters
    ----------
    mean : array ``[d]`` (numpy or torch)
    cov : array ``[d, d]``, symmetric positive semi-definite

    Raises
    ------
    ValueError
        Non-finite entries, wrong shapes, asymmetric or non-PSD ``cov``.

    Attributes
    ----------
    factor : ``[d, r]`` matrix L with ``cov = L L^T`` (r = rank), so ``x = mean + L u``, ``u ~ N(0, I_r)``;
        its columns are orthogonal (``support * sqrt(eigenvalue)``).
    support : ``[d, r]`` orthonormal basis of ``range(cov)``. The rank is decided in standardised coordinates
        (module docstring); a resolvable direction that is dropped raises a ``RuntimeWarning`` naming its variance.
    """

    mean: np.ndarray
    cov: np.ndarray
    factor: np.ndarray = field(init=False, repr=False)
    support: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        mean = to_numpy(self.mean, "mean")
        if mean.ndim != 1 or mean.shape[0] < 1:
            raise ValueError(f"mean must have shape [d >= 1], got {list(mean.shape)}")
        d = mean.shape[0]
        cov = check_shape(to_numpy(self.cov, "cov"), "cov", (d, d))
        cov, w, v = _check_cov(cov, "cov")
        factor, support = _support_factor(cov, mean, w, v, "cov")
        object.__setattr__(self, "mean", frozen(mean))
        object.__setattr__(self, "cov", frozen(cov))
        object.__setattr__(self, "factor", frozen(factor))
        object.__setattr__(self, "support", frozen(support))

    @property
    def d(self) -> int:
        """Dimension d."""
        return self.mean.shape[0]

    @property
    def rank(self) -> int:
        """Rank of the covariance (dimension of the support)."""
        return self.factor.shape[1]

    @property
    def is_singular(self) -> bool:
        return self.rank < self.d

    def __repr__(self) -> str:
        """Dimension, rank, dtype and a digest of mean and covariance (not the arrays)."""
        return short_repr("Gaussian", d=self.d, rank=self.rank, dtype=self.mean.dtype,
                          digest=digest(self.mean, self.cov))

    @classmethod
    def standard(cls, d: int) -> Gaussian:
        """N(0, I_d)."""
        return cls(np.zeros(d), np.eye(d))

    @classmethod
    def from_data(cls, X, *, shrinkage: float | str = 0.0) -> Gaussian:
        """Moment-matched Gaussian of samples ``X [n, d]``: sample mean and covariance (biased, 1/n).

        ``shrinkage``: a float in [0, 1) mixes the covariance with ``trace/d * I``; ``"ledoit-wolf"`` picks
        that mix by the Ledoit-Wolf estimator (``sklearn.covariance.ledoit_wolf``), which makes the
        covariance full rank - sensible for real images, whose nearly constant pixels otherwise receive
        huge least-squares coefficients. Raises ``ValueError`` for fewer than 2 samples or a bad shrinkage.
        """
        X = to_numpy(X, "X")
        if X.ndim != 2 or X.shape[0] < 2:
            raise ValueError(f"X must have shape [n >= 2, d], got {list(X.shape)}")
        mean = X.mean(0)
        if isinstance(shrinkage, str):
            if shrinkage != "ledoit-wolf":
                raise ValueError(f"shrinkage must be a float in [0, 1) or 'ledoit-wolf', got {shrinkage!r}")
            from sklearn.covariance import ledoit_wolf

            cov, _ = ledoit_wolf(X)
            return cls(mean, cov)
        if not 0.0 <= shrinkage < 1.0:
            raise ValueError(f"shrinkage must be in [0, 1), got {shrinkage}")
        Xc = X - mean
        cov = Xc.T @ Xc / X.shape[0]
        if shrinkage:
            cov = (1 - shrinkage) * cov + shrinkage * np.trace(cov) / cov.shape[0] * np.eye(cov.shape[0])
        return cls(mean, cov)

    def sample(self, n: int, generator: np.random.Generator | int | None = None) -> np.ndarray:
        """Draw ``[n, d]`` samples (float64). ``generator``: a numpy Generator or a seed."""
        n = _check_n(n)
        rng = np.random.default_rng(generator)
        u = rng.standard_normal((n, self.rank))
        return self.mean + u @ self.factor.T

    def project_to_support(self, X: np.ndarray) -> np.ndarray:
        """Orthogonal projection of ``X [n, d]`` onto the affine support ``mean + range(cov)``."""
        X = to_numpy(X, "X")
        if X.ndim not in (1, 2) or X.shape[-1] != self.d:
            raise ValueError(f"X must have shape [n, d={self.d}] or [d={self.d}], got {list(X.shape)}")
        P = self.support
        return self.mean + ((X - self.mean) @ P) @ P.T


@dataclass(frozen=True, eq=False)
class GaussianMixture:
    """Finite Gaussian mixture sum_k weights[k] N(means[k], covs[k]).

    Parameters
    ----------
    weights : ``[K]``, non-negative, summing to 1 (tolerance 1e-8)
    means : ``[K, d]``
    covs : ``[K, d, d]``, each symmetric PSD (singular allowed)

    Raises
    ------
    ValueError
        Wrong or mismatched shapes, non-finite values, weights not a probability vector,
        a component covariance that is not symmetric PSD (the message names ``covs[k]``).
    """

    weights: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    components: tuple[Gaussian, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        w = to_numpy(self.weights, "weights")
        if w.ndim != 1 or w.shape[0] < 1:
            raise ValueError(f"weights must have shape [K] with K >= 1, got {list(w.shape)}")
        K = w.shape[0]
        means = to_numpy(self.means, "means")
        if means.ndim != 2 or means.shape[0] != K:
            raise ValueError(f"means must have shape [K={K}, d], got {list(means.shape)}")
        d = means.shape[1]
        covs = check_shape(to_numpy(self.covs, "covs"), "covs", (K, d, d))
        if np.any(w < 0):
            raise ValueError(f"weights must be non-negative, got min {w.min():.3g}")
        if abs(w.sum() - 1.0) > 1e-8:
            raise ValueError(f"weights must sum to 1, got sum {w.sum():.12g}")
        comps = []
        for k in range(K):
            try:
                comps.append(Gaussian(means[k], covs[k]))
            except ValueError as e:
                raise ValueError(str(e).replace("cov", f"covs[{k}]", 1)) from None
        object.__setattr__(self, "weights", frozen(w))
        object.__setattr__(self, "means", frozen(means))
        object.__setattr__(self, "covs", frozen(np.stack([c.cov for c in comps])))
        object.__setattr__(self, "components", tuple(comps))

    @property
    def d(self) -> int:
        return self.means.shape[1]

    @property
    def K(self) -> int:
        return self.weights.shape[0]

    def __repr__(self) -> str:
        """Components, dimension, dtype and a digest of weights, means and covariances (not the arrays)."""
        return short_repr("GaussianMixture", K=self.K, d=self.d, dtype=self.means.dtype,
                          digest=digest(self.weights, self.means, self.covs))

    @property
    def mean(self) -> np.ndarray:
        """Mixture mean ``[d]``."""
        return self.weights @ self.means

    @property
    def cov(self) -> np.ndarray:
        """Mixture covariance ``[d, d]`` by the law of total covariance."""
        mu = self.mean
        dm = self.means - mu
        return np.einsum("k,kij->ij", self.weights, self.covs) + np.einsum("k,ki,kj->ij", self.weights, dm, dm)

    def pooled(self) -> Gaussian:
        """The moment-matched single Gaussian N(mixture mean, mixture covariance)."""
        return Gaussian(self.mean, self.cov)

    @classmethod
    def from_labels(cls, X, y, *, shrinkage: float | str = 0.0) -> GaussianMixture:
        """Class-conditional mixture: one component per label with the class's frequency, mean, covariance.

        ``shrinkage`` is applied to each class covariance as in ``Gaussian.from_data`` (``"ledoit-wolf"``
        for the Ledoit-Wolf estimate).
        ``X [n, d]``, ``y [n]`` integer labels. Classes with fewer than 2 samples raise ``ValueError``.
        Class covariances of real images are typically singular; that is supported.
        """
        X = to_numpy(X, "X")
        y = np.asarray(y)
        if X.ndim != 2 or X.shape[0] < 2:
            raise ValueError(f"X must have shape [n >= 2, d], got {list(X.shape)}")
        if y.dtype.kind == "f" and not np.all(np.isfinite(y)):
            n_bad = int(y.size - np.isfinite(y).sum())
            raise ValueError(f"y contains {n_bad} non-finite label(s) (NaN or inf); labels must be integers")
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise ValueError(f"y must have shape [n={X.shape[0]}], got {list(y.shape)}")
        labels, counts = np.unique(y, return_counts=True)
        if np.any(counts < 2):
            raise ValueError(f"every class needs >= 2 samples; class {labels[counts < 2][0]} has fewer")
        means, covs = [], []
        for lab in labels:
            g = Gaussian.from_data(X[y == lab], shrinkage=shrinkage)
            means.append(g.mean)
            covs.append(g.cov)
        return cls(counts / counts.sum(), np.stack(means), np.stack(covs))

    def sample(
        self, n: int, generator: np.random.Generator | int | None = None, *, return_labels: bool = False
    ):
        """Draw ``[n, d]`` samples; with ``return_labels`` also the ``[n]`` component indices."""
        n = _check_n(n)
        rng = np.random.default_rng(generator)
        z = rng.choice(self.K, size=n, p=self.weights)
        X = np.empty((n, self.d))
        for k, comp in enumerate(self.components):
            idx = np.flatnonzero(z == k)
            if idx.size:
                X[idx] = comp.sample(idx.size, rng)
        return (X, z) if return_labels else X


Distribution = Gaussian | GaussianMixture
