"""One-dimensional Gaussian expectations of an activation, vectorised over neurons.

For Y ~ N(mu, sigma^2), Y = mu + sigma Z with Z ~ N(0, 1), this package computes

* ``gauss_ev``            E[phi(Y)]
* ``gauss_second_moment`` E[phi(Y)^2]
* ``gauss_moments``       E[phi(Y) Y^k], k = 0..kmax
* ``gauss_derivative_ev`` E[phi^{(j)}(Y)] (distributional derivatives: relu'' = delta)
* ``hermite_coefficients`` c_k = E[phi(mu + sigma Z) He_k(Z)] / k!, k = 0..n

which are the per-neuron ingredients of the closed-form polynomial approximants of Rigg & Belrose
(2025, "Converting MLPs into Polynomials in Closed Form", arXiv 2502.01032, Sec. 3 and App. A).

Methods
-------
*Closed forms* (identity, relu, leaky_relu, gelu in its erf form). Gaussian integration by parts
(Stein) gives E[g(Z) He_k(Z)] = E[g^{(k)}(Z)], hence for relu with h = mu / sigma

    E[relu(Y) He_0] = sigma * E[(h + Z)_+],  E[relu(Y) He_1] = sigma Phi(h),
    E[relu(Y) He_k] = sigma pdf(h) He_{k-2}(-h)   (k >= 2),

and truncated moments E[Y^n 1{Y > 0}] for E[relu^2], E[relu Y^k]. The tail integrals
int_t^inf (z - t)^n pdf(z) dz = pdf(t) J_n(t), J_n(t) = int_0^inf u^n exp(-t u - u^2 / 2) du, are never
formed as ``mu Phi(h) + sigma pdf(h)`` (which cancels catastrophically for h << 0, the weakness of the
authors' EleutherAI/polyapprox code) but from J_0(t) = sqrt(pi/2) erfcx(t/sqrt 2) and the recurrence
t J_n + J_{n+1} = n J_{n-1}, run forwards for t <= 1 and as a continued fraction (backwards) for t > 1.
For gelu = y Phi(y), with t = sqrt(1 + sigma^2) and m = mu / t (Gaussian convolution),

    E[gelu^{(k)}(Y)] = (-1)^k pdf(m) / t^{k+1} [t^2 He_{k-2}(m) - He_k(m)]   (k >= 2),
    E[gelu'(Y)] = Phi(m) + mu pdf(m) / t^3,  E[gelu(Y)] = (mu / t^2) Phi(m) + (sigma^2 / t) E[(m + Z)_+].

*Quadrature* (every other activation, and E[gelu^2]): composite Gauss-Legendre in z
(16 nodes per panel) over the window [min(-12, z0 - 12), max(12, z0 + 12)] with z0 = -mu / sigma the
activation's transition point (clipped to [-40, 40]; beyond that pdf(z0) underflows); panels are a
uniform grid (16 panels) merged with geometrically graded break points z0 +- delta 2^i from
delta = min(1/sigma, 1/(1 + |z0|)) / 4 up to twice the uniform spacing, so features of width 1/sigma
(and the 1/|z0| decay scale of the Gaussian in the tails) are resolved, and split at the activation's
kinks: about 600 nodes per neuron. Work is chunked over neurons to bound memory.

Accuracy (tested against mpmath at 30 digits for |mu/sigma| <= 30, sigma in [1e-3, 1e3], k <= 8):
|error| <= 1e-10 * scale, with scale = E[|phi(Y)| |He_k(Z)|] / k! for Hermite coefficients,
E[|phi(Y)| |Y|^k] for moments and E[|phi^{(j)}(Y)|] (smooth part) for derivatives. This is a relative
error bound whenever the integrand has one sign (e.g. relu, any tail), and a mixed bound where the
exact value is small by cancellation (e.g. odd Hermite coefficients of an even function).

sigma == 0 is a point mass: E[phi(Y)] = phi(mu), c_0 = phi(mu), c_k = 0 (k >= 1); tiny sigma is
continuous with it (sigma < 1e-150 is treated as 0). Overflow/underflow of intermediate terms (e.g. huge
|mu/sigma|) is handled and silenced; results are never NaN for finite inputs. At a kink with sigma == 0, derivatives take the limit sigma -> 0+ (relu'(0) = 1/2).

Layout (one small module per activation family, as in the authors' polyapprox, with the shared parts once):

* :mod:`.expectations` the five public functions: validation, point masses, dispatch by family
* :mod:`.relu`         identity / relu / leaky_relu closed forms
* :mod:`.gelu`         gelu closed forms; pointwise derivatives of gelu and of the tanh GELU (Taylor mode)
* :mod:`.sigmoid`      pointwise derivatives of sigmoid, tanh, silu, quick_gelu, softplus
* :mod:`.elu`          elu's pointwise derivatives and delta terms
* :mod:`.derivatives`  E[phi^{(j)}(Y)] without a closed form (analytic or autograd derivatives, or Stein)
* :mod:`.truncated`    cancellation-free tail integrals J_n and truncated Gaussian moments
* :mod:`.quadrature`   the composite Gauss-Legendre rules (shared with :mod:`mlpinterp.gaussian.bivariate`)
* :mod:`.common`       input validation, family names, the normal pdf
"""

from mlpinterp.gaussian.univariate.common import MAX_DEGREE
from mlpinterp.gaussian.univariate.expectations import (
    gauss_derivative_ev,
    gauss_ev,
    gauss_moments,
    gauss_second_moment,
    hermite_coefficients,
)

__all__ = [
    "MAX_DEGREE",
    "gauss_derivative_ev",
    "gauss_ev",
    "gauss_moments",
    "gauss_second_moment",
    "hermite_coefficients",
]
