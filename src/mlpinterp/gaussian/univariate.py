"""One-dimensional Gaussian expectations of an activation, vectorised over neurons.

For Y ~ N(mu, sigma^2), Y = mu + sigma Z with Z ~ N(0, 1), this module computes

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
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from mlpinterp.gaussian.activations import _GELU_TANH_C, QUICK_GELU_SLOPE, Activation, get_activation, leaky_slope
from mlpinterp.gaussian.hermite import he_stack
from mlpinterp.utils.validation import to_numpy

__all__ = [
    "gauss_derivative_ev",
    "gauss_ev",
    "gauss_moments",
    "gauss_second_moment",
    "hermite_coefficients",
]

_SQRT2 = math.sqrt(2.0)
_SQRT2PI = math.sqrt(2.0 * math.pi)
_SQRT_HALF_PI = math.sqrt(0.5 * math.pi)

# quadrature parameters (see module docstring)
_N_GL = 16
_X_GL, _W_GL = np.polynomial.legendre.leggauss(_N_GL)
_L = 12.0
_Z0_MAX = 40.0
_N_UNIFORM = 16
_UNIT = np.linspace(0.0, 1.0, _N_UNIFORM + 1)
_CHUNK_NODES = 1 << 16  # neurons * nodes per chunk (cache-sized temporaries: ~2x faster than 1 << 21)
_T_SWITCH = 1.0  # J_n recurrence: forward for t <= _T_SWITCH, continued fraction above
_S_IBP = 1.0  # autograd derivatives: integration by parts for sigma >= _S_IBP, quadrature of phi^{(j)} below
_ANALYTIC_DERIV = ("gelu_tanh", "quick_gelu", "silu", "sigmoid", "tanh", "softplus", "elu")

_CLOSED = ("identity", "relu", "gelu")
_S_TINY = 1e-150  # sigma below this is a point mass (differences are far below float64 resolution)


# ----------------------------------------------------------------------------- validation


def _quiet(fn):
    """Silence float over/underflow warnings of intermediate terms (handled explicitly)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(over="ignore", under="ignore", divide="ignore"):
            return fn(*args, **kwargs)

    return wrapper


#: Highest Hermite degree: k! overflows float64 for k > 170.
MAX_DEGREE = 170


def _checked(values: np.ndarray, name: str) -> np.ndarray:
    """Raise ``ValueError`` if the activation returned NaN at finite pre-activations (a wrong integral otherwise)."""
    if np.any(np.isnan(values)):
        raise ValueError(
            f"activation {name!r} returned NaN at {int(np.isnan(values).sum())} finite pre-activation value(s); "
            "the Gaussian integrals need phi to be defined (non-NaN) on the whole real line"
        )
    return values


def _check_int(k, name: str) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{name} must be a non-negative int, got {type(k).__name__} ({k!r})")
    if k < 0:
        raise ValueError(f"{name} must be a non-negative int, got {k}")
    return int(k)


def _prepare(mu, sigma) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Validate, broadcast and flatten mu, sigma; returns (mu [N], sigma [N], shape)."""
    mu = to_numpy(mu, "mu")
    sigma = to_numpy(sigma, "sigma")
    if np.any(sigma < 0):
        raise ValueError(f"sigma must be >= 0, got min(sigma) = {float(sigma.min())!r}")
    try:
        mu_b, s_b = np.broadcast_arrays(mu, sigma)
    except ValueError:
        raise ValueError(
            f"mu and sigma must be broadcastable, got shapes {list(mu.shape)} and {list(sigma.shape)}"
        ) from None
    shape = mu_b.shape
    return mu_b.reshape(-1).copy(), s_b.reshape(-1).copy(), shape


def _family(act: Activation) -> str:
    if act.name == "leaky_relu" or act.name.startswith("leaky_relu:"):
        return "leaky_relu"
    return act.name


# ----------------------------------------------------------------------------- special functions


def _pdf(x):
    return np.exp(-0.5 * np.square(x)) / _SQRT2PI


def _tail_j(t: np.ndarray, nmax: int) -> np.ndarray:
    """J_n(t) = int_0^inf u^n exp(-t u - u^2/2) du for t in [0, 40], n = 0..nmax: [N, nmax + 1].

    pdf(t) J_n(t) = int_t^inf (z - t)^n pdf(z) dz. Forward recurrence J_{n+1} = n J_{n-1} - t J_n for
    t <= 1 (little cancellation); for t > 1 the ratios q_n = J_{n+1}/J_n from the continued fraction
    q_{n-1} = n / (t + q_n) (Miller's backward recurrence for the minimal solution).
    """
    out = np.empty(t.shape + (nmax + 1,))
    out[:, 0] = _SQRT_HALF_PI * special.erfcx(t / _SQRT2)
    if nmax == 0:
        return out
    out[:, 1] = 1.0 - t * out[:, 0]
    for n in range(1, nmax):
        out[:, n + 1] = n * out[:, n - 1] - t * out[:, n]
    # continued fraction, in bins of t: about (24 / t)^2 extra terms make the start value irrelevant.
    # The forward recurrence stays accurate (< 1e-14, checked against mpmath) up to t = 8 for n <= 1
    # and t = 3 for n <= 2, which spares the long continued fractions in the common low-order calls.
    t_fwd = 8.0 if nmax <= 1 else (3.0 if nmax <= 2 else _T_SWITCH)
    edges = tuple(e for e in (_T_SWITCH, 2.0, 4.0, 8.0) if e >= t_fwd) + (np.inf,)
    for lo_t, hi_t in zip(edges[:-1], edges[1:], strict=True):
        sel = (t > lo_t) & (t <= hi_t)
        if not np.any(sel):
            continue
        tb = t[sel]
        n_start = nmax + 16 + int(math.ceil((24.0 / lo_t) ** 2))
        q = 0.5 * (-tb + np.sqrt(tb * tb + 4.0 * (n_start + 1)))
        qs = np.empty((tb.size, nmax))
        for n in range(n_start, 0, -1):
            q = n / (tb + q)  # q_{n-1} = J_n / J_{n-1}
            if n - 1 < nmax:
                qs[:, n - 1] = q
        res = np.empty((tb.size, nmax + 1))
        res[:, 0] = out[sel, 0]
        for n in range(1, nmax + 1):
            res[:, n] = res[:, n - 1] * qs[:, n - 1]
        out[sel] = res
    return out


def _raw_moments(mu: np.ndarray, s: np.ndarray, nmax: int) -> np.ndarray:
    """E[Y^n], n = 0..nmax, Y ~ N(mu, s^2): M_{n+1} = mu M_n + n s^2 M_{n-1} (terms share a sign)."""
    out = np.empty(mu.shape + (nmax + 1,))
    out[:, 0] = 1.0
    if nmax >= 1:
        out[:, 1] = mu
    s2 = s * s
    for n in range(1, nmax):
        out[:, n + 1] = mu * out[:, n] + n * s2 * out[:, n - 1]
    return out


def _trunc_moments(mu: np.ndarray, s: np.ndarray, nmax: int) -> np.ndarray:
    """E[Y^n 1{Y > 0}], n = 0..nmax, Y ~ N(mu, s^2), s > 0, without tail cancellation: [N, nmax + 1].

    h = mu/s <= 0: s^n pdf(h) J_n(-h); h > 0: E[Y^n] - (-s)^n pdf(h) J_n(h) (the subtracted tail is at
    most half of E[Y^n] for even n and adds for odd n).
    """
    h = mu / s
    t = np.minimum(np.abs(h), _Z0_MAX)
    j = _tail_j(t, nmax)
    spow = np.power.outer(s, np.arange(nmax + 1))
    tail = spow * _pdf(h)[:, None] * j
    raw = _raw_moments(mu, s, nmax)
    sign = (-1.0) ** np.arange(nmax + 1)
    with np.errstate(invalid="ignore"):
        upper = np.where(np.isinf(raw), raw, raw - sign * tail)  # inf - inf: the moment itself overflows
    return np.where((h <= 0)[:, None], tail, upper)


# ----------------------------------------------------------------------------- closed forms (s > 0)


def _relu_hermite_e(mu, s, n):
    """E[relu(mu + s Z) He_k(Z)], k = 0..n."""
    h = mu / s
    out = np.empty(mu.shape + (n + 1,))
    out[:, 0] = _trunc_moments(mu, s, 1)[:, 1]
    if n >= 1:
        out[:, 1] = s * special.ndtr(h)
    if n >= 2:
        ph = _pdf(h)
        live = ph > 0  # where pdf(h) underflows the term is 0 (He_{k-2}(-h) may overflow)
        out[:, 2:] = np.where(live[:, None], (s * ph)[:, None] * he_stack(n - 2, np.where(live, -h, 0.0)), 0.0)
    return out


def _relu_derivs(mu, s, j):
    """E[relu^{(j)}(Y)] for j >= 1: Phi(h) for j = 1, He_{j-2}(-h) pdf(h) / s^{j-1} (delta terms) for j >= 2."""
    h = mu / s
    if j == 1:
        return special.ndtr(h)
    ph = _pdf(h)
    live = ph > 0
    he = he_stack(j - 2, np.where(live, -h, 0.0))[:, j - 2]
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(live, he * ph / s ** (j - 1), 0.0)


def _identity_hermite_e(mu, s, n):
    out = np.zeros(mu.shape + (n + 1,))
    out[:, 0] = mu
    if n >= 1:
        out[:, 1] = s
    return out


def _gelu_derivs(mu, s, n, sigma_power: bool = False):
    """E[gelu^{(k)}(Y)], k = 0..n (gelu = y Phi(y) is smooth); times sigma^k if ``sigma_power``."""
    t = np.hypot(1.0, s)  # sqrt(1 + s^2) without overflow for s > 1e154
    m = mu / t
    out = np.empty(mu.shape + (n + 1,))
    out[:, 0] = (m / t) * special.ndtr(m) + (s * (s / t)) * _trunc_moments(m, np.ones_like(m), 1)[:, 1]
    if n >= 1:
        out[:, 1] = (special.ndtr(m) + (m / t) * _pdf(m) / t) * (s if sigma_power else 1.0)
    if n >= 2:
        pm = _pdf(m)
        live = pm > 0
        he = he_stack(n, np.where(live, m, 0.0))
        k = np.arange(2, n + 1)
        base = s / t if sigma_power else 1.0 / t  # s^k / t^{k+1} = (s/t)^k / t, no overflow
        pref = (-1.0) ** k * pm[:, None] * np.power.outer(base, k)
        # (pm / t) (t^2 He_{k-2} - He_k) without forming t^2 (overflows for s > 1e154)
        out[:, 2:] = np.where(live[:, None], pref * (t[:, None] * he[:, :-2] - he[:, 2:] / t[:, None]), 0.0)
    return out


def _gelu_moments(mu, s, kmax):
    """E[gelu(Y) Y^k], k = 0..kmax, as E[Y^{k+1} 1{D > 0}] with D = Y - W, W ~ N(0, 1) independent.

    gelu(y) = y P(W < y), D ~ N(mu, t^2), t^2 = 1 + s^2, and Y | D ~ N(a + b D, c^2) with a = mu / t^2,
    b = c^2 = s^2 / t^2, so E[Y^n | D] = sum_{j even} C(n, j) (j - 1)!! c^j (a + b D)^{n - j}, a polynomial
    in D whose truncated moments E[D^i 1{D > 0}] come from the cancellation-free tail integrals.
    """
    n_top = kmax + 1
    t = np.hypot(1.0, s)  # no overflow of 1 + s^2
    a = (mu / t) / t
    b = (s / t) ** 2
    T = _trunc_moments(mu, t, n_top)  # [N, n_top + 1]
    out = np.empty(mu.shape + (kmax + 1,))
    for k in range(kmax + 1):
        n = k + 1
        acc = np.zeros(mu.shape)
        for j in range(0, n + 1, 2):
            cj = math.comb(n, j) * math.prod(range(j - 1, 0, -2)) * b ** (j // 2)  # c^2 = b
            r = n - j
            inner = np.zeros(mu.shape)
            for i in range(r + 1):
                inner += math.comb(r, i) * a ** (r - i) * b**i * T[:, i]
            acc += cj * inner
        out[:, k] = acc
    return out


def _closed_hermite_e(fam, act, mu, s, n):
    if fam == "identity":
        return _identity_hermite_e(mu, s, n)
    if fam == "relu":
        return _relu_hermite_e(mu, s, n)
    if fam == "leaky_relu":
        a = leaky_slope(act)
        return a * _identity_hermite_e(mu, s, n) + (1.0 - a) * _relu_hermite_e(mu, s, n)
    if fam == "gelu":
        return _gelu_derivs(mu, s, n, sigma_power=True)
    raise AssertionError(fam)  # pragma: no cover


# ----------------------------------------------------------------------------- quadrature


def _panel_rule(
    centers: list[tuple[np.ndarray, np.ndarray]],
    breaks: list[np.ndarray],
    n_uniform: int = _N_UNIFORM,
    n_gl: int = _N_GL,
) -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss-Legendre rule in z per row, Gaussian weight included: z, w of shape [N, Q].

    ``centers`` are (z_c [N], delta [N]) pairs: the window is [min(-12, z_c - 12), max(12, z_c + 12)]
    over all centers (z_c clipped to [-40, 40]); break points are a uniform grid of ``n_uniform`` panels
    over the window, each z_c +- delta 2^i (geometric grading down to the feature width delta) and
    ``breaks`` (kinks). Break points outside the window are clipped (empty panels get zero weight).
    """
    zc = [np.clip(c, -_Z0_MAX, _Z0_MAX) for c, _ in centers]
    lo = np.minimum.reduce([np.minimum(-_L, c - _L) for c in zc])
    hi = np.maximum.reduce([np.maximum(_L, c + _L) for c in zc])
    n = len(lo)
    pieces = [lo[:, None] + (hi - lo)[:, None] * np.linspace(0.0, 1.0, n_uniform + 1)]
    spacing = (hi - lo) / n_uniform
    for c, (_, delta) in zip(zc, centers, strict=True):
        # grade from delta up to twice the uniform spacing; the uniform grid takes over beyond
        n_grade = int(np.clip(np.ceil(np.log2(np.max(2.0 * spacing / delta))) + 1, 1, 200))
        g = delta[:, None] * 2.0 ** np.arange(n_grade)
        g = np.where(g <= 4.0 * spacing[:, None], g, 0.0)  # per-row cap: a row's rule ignores its batch
        pieces += [c[:, None], c[:, None] + g, c[:, None] - g]
    for b in breaks:
        pieces.append(np.nan_to_num(b, nan=0.0, posinf=hi.max(), neginf=lo.min())[:, None])
    pts = np.clip(np.concatenate(pieces, axis=1), lo[:, None], hi[:, None])
    pts.sort(axis=1)
    if n_gl == _N_GL:
        xg, wg = _X_GL, _W_GL
    else:
        xg, wg = np.polynomial.legendre.leggauss(n_gl)
    half = 0.5 * (pts[:, 1:] - pts[:, :-1])
    mid = 0.5 * (pts[:, 1:] + pts[:, :-1])
    z = mid[..., None] + half[..., None] * xg
    w = half[..., None] * wg * _pdf(z)
    return z.reshape(n, -1), w.reshape(n, -1)


def _rule(mu: np.ndarray, s: np.ndarray, kinks: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Univariate rule: center z0 = -mu/s with feature width delta = min(1/s, 1/(1+|z0|)) / 4."""
    z0 = np.clip(-mu / s, -_Z0_MAX, _Z0_MAX)
    delta = 0.25 * np.minimum(1.0 / s, 1.0 / (1.0 + np.abs(z0)))
    return _panel_rule([(z0, delta)], [(c - mu) / s for c in kinks])


def _quad(mu, s, kinks, integrand, n_out: int) -> np.ndarray:
    """sum_q w[i, q] * integrand(z, y, mu, s)[i, q, :] over the rule, chunked over neurons: [N, n_out]."""
    out = np.empty(mu.shape + (n_out,))
    if mu.size == 0:
        return out
    z, _ = _rule(mu[:1], s[:1], kinks)
    per = max(1, _CHUNK_NODES // (z.shape[1] * max(1, n_out // 4)))
    for i in range(0, mu.size, per):
        m, sg = mu[i : i + per], s[i : i + per]
        z, w = _rule(m, sg, kinks)
        y = m[:, None] + sg[:, None] * z
        out[i : i + per] = integrand(z, y, w, m, sg)
    return out


def _quad_hermite_e(act, mu, s, n):
    def integrand(z, y, w, m, sg):
        f = w * _checked(act.fn(y), act.name)
        res = np.empty((len(m), n + 1))
        h_prev, h_cur = np.ones_like(z), z
        res[:, 0] = f.sum(axis=1)
        for k in range(1, n + 1):
            res[:, k] = np.einsum("ij,ij->i", f, h_cur)
            h_prev, h_cur = h_cur, z * h_cur - k * h_prev
        return res

    return _quad(mu, s, act.kinks, integrand, n + 1)


def _quad_moments(fn, kinks, mu, s, kmax):
    def integrand(z, y, w, m, sg):
        f = w * _checked(fn(y), getattr(fn, "__name__", "activation"))
        res = np.empty((len(m), kmax + 1))
        for k in range(kmax + 1):
            res[:, k] = f.sum(axis=1)
            if k < kmax:
                f = f * y
        return res

    return _quad(mu, s, kinks, integrand, kmax + 1)


# ----------------------------------------------------------------------------- derivatives of phi


def _sigmoid_poly(j: int) -> np.ndarray:
    """Coefficients of P_j with sigmoid^{(j)} = P_j(sigmoid); P_0 = x, P_{j+1} = P_j' (x - x^2)."""
    P = np.polynomial.Polynomial
    p = P([0.0, 1.0])
    for _ in range(j):
        p = p.deriv() * P([0.0, 1.0, -1.0])
    return p.coef


def _sigmoid_deriv(y: np.ndarray, j: int) -> np.ndarray:
    if j == 0:
        return special.expit(y)
    x = special.expit(-np.abs(y))  # evaluate at -|y| (no 1 - sigma cancellation), then reflect
    val = np.polynomial.polynomial.polyval(x, _sigmoid_poly(j))
    sign = np.where(y > 0, (-1.0) ** (j + 1), 1.0)
    return sign * val


def _gelu_tanh_deriv(y: np.ndarray, j: int) -> np.ndarray:
    """gelu_tanh^{(j)}(y) = j! [(y + e) S(e)]_j by Taylor-mode arithmetic, S(e) = sigmoid(v(y + e)).

    v(y) = 2 sqrt(2/pi) (y + 0.044715 y^3) is a cubic; with r = 1 - S = sigmoid(-v) the ODE
    S' = S r v' gives (k + 1) S_{k+1} = [S r v']_k and r_k = -S_k (k >= 1). Every coefficient carries a
    factor S_0 or r_0, so the tails keep their relative accuracy (unlike 1 + tanh differences).
    """
    c = 2.0 * _GELU_TANH_C
    kap = 0.044715
    zero = np.zeros_like(y)
    v = [c * (y + kap * y**3), c * (1.0 + 3.0 * kap * y * y), c * 3.0 * kap * y, c * kap + zero]
    v += [zero] * max(0, j + 2 - len(v))
    dv = [(k + 1) * v[k + 1] for k in range(j + 1)]
    S = [special.expit(v[0])]
    R = [special.expit(-v[0])]
    for k in range(j):
        sr = [sum(S[a] * R[m - a] for a in range(m + 1)) for m in range(k + 1)]
        S.append(sum(sr[m] * dv[k - m] for m in range(k + 1)) / (k + 1))
        R.append(-S[-1])
    return math.factorial(j) * (y * S[j] + S[j - 1])


def _autograd_deriv(torch_fn, y: np.ndarray, j: int) -> np.ndarray | None:
    """phi^{(j)}(y) by nested torch autograd in float64; None if torch_fn is not differentiable."""
    import torch

    yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float64).reshape(-1)).requires_grad_(True)
    out = torch_fn(yt)
    if j == 0:
        return out.detach().numpy().reshape(y.shape)
    if not out.requires_grad:
        return None
    for i in range(j):
        if not out.requires_grad:  # derivative identically zero from here on
            return np.zeros(y.shape)
        (out,) = torch.autograd.grad(out.sum(), yt, create_graph=i < j - 1, allow_unused=True)
        if out is None:
            return np.zeros(y.shape)
    return out.detach().numpy().reshape(y.shape)


def _smooth_deriv(act: Activation, y: np.ndarray, j: int) -> np.ndarray | None:
    """phi^{(j)}(y) away from kinks (at a kink: mean of one-sided values); None if unavailable."""
    fam = _family(act)
    if j == 0:
        return act.fn(y)
    if fam == "identity":
        return np.ones_like(y) if j == 1 else np.zeros_like(y)
    if fam in ("relu", "leaky_relu"):
        a = 0.0 if fam == "relu" else leaky_slope(act)
        if j == 1:
            return np.where(y > 0, 1.0, np.where(y < 0, a, 0.5 * (1.0 + a)))
        return np.zeros_like(y)
    if fam == "gelu":
        if j == 1:
            return special.ndtr(y) + y * _pdf(y)
        he = he_stack(j, y)
        return (-1.0) ** j * _pdf(y) * (he[..., j - 2] - he[..., j])
    if fam == "sigmoid":
        return _sigmoid_deriv(y, j)
    if fam == "tanh":
        return 2.0 ** (j + 1) * _sigmoid_deriv(2.0 * y, j)
    if fam == "silu":
        return y * _sigmoid_deriv(y, j) + j * _sigmoid_deriv(y, j - 1)
    if fam == "quick_gelu":  # quick_gelu(y) = silu(a y) / a, so quick_gelu^{(j)}(y) = a^{j-1} silu^{(j)}(a y)
        u = QUICK_GELU_SLOPE * y
        return QUICK_GELU_SLOPE ** (j - 1) * (u * _sigmoid_deriv(u, j) + j * _sigmoid_deriv(u, j - 1))
    if fam == "softplus":
        return _sigmoid_deriv(y, j - 1)
    if fam == "elu":
        neg = np.exp(np.minimum(y, 0.0))
        pos = 1.0 if j == 1 else 0.0
        return np.where(y > 0, pos, np.where(y < 0, neg, 0.5 * (pos + 1.0)))
    if fam == "gelu_tanh":
        return _gelu_tanh_deriv(y, j)
    try:
        return _autograd_deriv(act.torch_fn, y, j)
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return None


# ----------------------------------------------------------------------------- public API


@_quiet
def hermite_coefficients(act, mu, sigma, n: int) -> np.ndarray:
    """Hermite coefficients c_k = E[phi(mu + sigma Z) He_k(Z)] / k!, k = 0..n, Z ~ N(0, 1).

    phi(mu + sigma z) = sum_k c_k He_k(z) in L2(N(0, 1)); the degree-n truncation is the least-squares
    optimal polynomial of a single neuron under a Gaussian input (Rigg & Belrose 2025, Sec. 3, Eq. for
    the ridge/Hermite expansion). Closed forms for identity, relu, leaky_relu, gelu; quadrature otherwise
    (see module docstring for methods and accuracy).

    Args:
        act: activation (name, :class:`~mlpinterp.gaussian.activations.Activation`, torch module, callable).
        mu: pre-activation means, any shape, broadcastable with ``sigma``.
        sigma: pre-activation standard deviations (>= 0; 0 is a point mass).
        n: highest degree, ``n >= 0``.

    Returns:
        float64 array ``[*broadcast(mu, sigma).shape, n + 1]``.

    Raises:
        ValueError: NaN/inf in ``mu``/``sigma``, negative ``sigma``, negative ``n``, unknown activation.
        TypeError: non-int ``n``, bad ``act`` type.
    """
    act = get_activation(act)
    n = _check_int(n, "n")
    if n > MAX_DEGREE:
        raise ValueError(f"n must be <= {MAX_DEGREE} (k! overflows float64 beyond), got {n}")
    mu, s, shape = _prepare(mu, sigma)
    out = np.zeros(mu.shape + (n + 1,))
    pm = s < _S_TINY
    if np.any(pm):
        out[pm, 0] = _checked(act.fn(mu[pm]), act.name)
    sel = ~pm
    if np.any(sel):
        fam = _family(act)
        if fam in _CLOSED or fam == "leaky_relu":
            e = _closed_hermite_e(fam, act, mu[sel], s[sel], n)
        else:
            e = _quad_hermite_e(act, mu[sel], s[sel], n)
        fact = np.array([math.factorial(k) for k in range(n + 1)], dtype=np.float64)
        out[sel] = e / fact
    return out.reshape(shape + (n + 1,))


@_quiet
def gauss_ev(act, mu, sigma) -> np.ndarray:
    """E[phi(Y)] for Y ~ N(mu, sigma^2), elementwise over ``broadcast(mu, sigma)``.

    Equals the Hermite coefficient c_0 (Rigg & Belrose 2025, Sec. 3). See :func:`hermite_coefficients`
    for arguments, exceptions and accuracy.

    Returns:
        float64 array of shape ``broadcast(mu, sigma).shape``.
    """
    return hermite_coefficients(act, mu, sigma, 0)[..., 0]


@_quiet
def gauss_moments(act, mu, sigma, kmax: int) -> np.ndarray:
    """E[phi(Y) Y^k], k = 0..kmax, for Y ~ N(mu, sigma^2).

    Computed directly (not from Hermite coefficients, whose binomial recombination cancels in the tails):
    truncated Gaussian moments E[Y^{k+1} 1{Y>0}] for relu / leaky_relu (see module docstring), raw
    moments for the identity, for gelu E[Y^{k+1} 1{Y - W > 0}] with an independent W ~ N(0, 1) (a
    polynomial in the truncated moments of Y - W), quadrature of phi(y) y^k otherwise. Accuracy: |error| <= 1e-10 *
    E[|phi(Y)| |Y|^k]. These are the "master theorem" cross-moments of Rigg & Belrose (2025, Thm 3.1).

    Args:
        act, mu, sigma: as in :func:`hermite_coefficients`.
        kmax: highest power, ``kmax >= 0``.

    Returns:
        float64 array ``[*broadcast(mu, sigma).shape, kmax + 1]``.

    Raises:
        ValueError / TypeError: as in :func:`hermite_coefficients` (argument ``kmax``).
    """
    act = get_activation(act)
    kmax = _check_int(kmax, "kmax")
    mu, s, shape = _prepare(mu, sigma)
    out = np.zeros(mu.shape + (kmax + 1,))
    pm = s < _S_TINY
    if np.any(pm):
        out[pm] = act.fn(mu[pm])[:, None] * np.power.outer(mu[pm], np.arange(kmax + 1))
    sel = ~pm
    if np.any(sel):
        m, sg = mu[sel], s[sel]
        fam = _family(act)
        if fam == "identity":
            out[sel] = _raw_moments(m, sg, kmax + 1)[:, 1:]
        elif fam == "gelu":
            out[sel] = _gelu_moments(m, sg, kmax)
        elif fam in ("relu", "leaky_relu"):
            relu = _trunc_moments(m, sg, kmax + 1)[:, 1:]
            if fam == "relu":
                out[sel] = relu
            else:
                a = leaky_slope(act)
                out[sel] = a * _raw_moments(m, sg, kmax + 1)[:, 1:] + (1.0 - a) * relu
        else:
            out[sel] = _quad_moments(act.fn, act.kinks, m, sg, kmax)
    return out.reshape(shape + (kmax + 1,))


@_quiet
def gauss_second_moment(act, mu, sigma) -> np.ndarray:
    """E[phi(Y)^2] for Y ~ N(mu, sigma^2), elementwise over ``broadcast(mu, sigma)``.

    Closed forms: identity mu^2 + sigma^2; relu E[Y^2 1{Y>0}]; leaky_relu a^2 E[Y^2] + (1 - a^2) E[relu^2].
    Quadrature of phi(y)^2 otherwise (relative error <= 1e-10: the integrand is non-negative).
    By Parseval, E[phi^2] = sum_k k! c_k^2 (Rigg & Belrose 2025, Sec. 3: the FVU of the degree-n
    truncation is sum_{k>n} k! c_k^2 / Var phi).

    Returns:
        float64 array of shape ``broadcast(mu, sigma).shape``.

    Raises:
        ValueError / TypeError: as in :func:`hermite_coefficients`.
    """
    act = get_activation(act)
    mu, s, shape = _prepare(mu, sigma)
    out = np.zeros(mu.shape)
    pm = s < _S_TINY
    if np.any(pm):
        out[pm] = act.fn(mu[pm]) ** 2
    sel = ~pm
    if np.any(sel):
        m, sg = mu[sel], s[sel]
        fam = _family(act)
        if fam == "identity":
            out[sel] = m * m + sg * sg
        elif fam in ("relu", "leaky_relu"):
            relu2 = _trunc_moments(m, sg, 2)[:, 2]
            a = 0.0 if fam == "relu" else leaky_slope(act)
            # relu alone: no 0 * (m^2 + s^2) term, which is 0 * inf = NaN when s^2 overflows
            out[sel] = relu2 if a == 0.0 else a * a * (m * m + sg * sg) + (1.0 - a * a) * relu2
        else:
            fn = act.fn
            out[sel] = _quad_moments(lambda y: fn(y) ** 2, act.kinks, m, sg, 0)[:, 0]
    return out.reshape(shape)


@_quiet
def gauss_derivative_ev(act, mu, sigma, j: int) -> np.ndarray:
    """E[phi^{(j)}(Y)] for Y ~ N(mu, sigma^2), with distributional derivatives at kinks.

    E.g. relu'' = delta, so E[relu''(Y)] = pdf_Y(0); generally a jump at c contributes
    E[delta^{(r)}(Y - c)] = He_r((c - mu)/sigma) pdf((c - mu)/sigma) / sigma^{r+1}. By Gaussian
    integration by parts E[phi^{(j)}(Y)] = E[phi(Y) He_j(Z)] / sigma^j = j! c_j / sigma^j (Stein's lemma,
    Rigg & Belrose 2025, Sec. 3). Closed forms for identity, relu, leaky_relu, gelu; quadrature of the
    analytic derivative (sigmoid polynomials, Taylor-mode arithmetic for gelu_tanh, plus delta terms for
    elu) for the other named activations, accurate to 1e-10 * E[|phi^{(j)}(Y)|] (smooth part). For
    other activations: quadrature of the torch-autograd derivative when sigma < 1, otherwise integration
    by parts (accuracy then 1e-10 * E[|phi(Y) He_j(Z)|] / sigma^j, which is poor for small sigma
    when no derivative is available, e.g. wrapped numpy callables). With sigma == 0 returns phi^{(j)}(mu) (at a kink: the limit
    sigma -> 0+, which is +-inf for delta terms); this needs the derivative, else ValueError.

    Args:
        act, mu, sigma: as in :func:`hermite_coefficients`.
        j: derivative order, ``j >= 0``.

    Returns:
        float64 array of shape ``broadcast(mu, sigma).shape``.

    Raises:
        ValueError: as in :func:`hermite_coefficients` (argument ``j``); sigma == 0 with j >= 1 for an
            activation whose derivative is not available.
        TypeError: non-int ``j``.
    """
    act = get_activation(act)
    j = _check_int(j, "j")
    mu, s, shape = _prepare(mu, sigma)
    out = np.zeros(mu.shape)
    fam = _family(act)
    if j == 0:
        return gauss_ev(act, mu, s).reshape(shape)
    pm = s < _S_TINY
    if np.any(pm):
        y = mu[pm]
        val = _smooth_deriv(act, y, j)
        if val is None:
            raise ValueError(
                f"gauss_derivative_ev: sigma == 0 needs phi^({j}) but activation {act.name!r} has no "
                "available derivative (its torch_fn is not differentiable)"
            )
        # delta terms at a kink sitting exactly at mu: limit sigma -> 0+ of He_r(0) pdf(0) / sigma^(r+1)
        if fam in ("relu", "leaky_relu") and j >= 2:
            a = 0.0 if fam == "relu" else leaky_slope(act)
            val = np.where(y == 0, _delta_limit([(1.0 - a, j - 2)]), val)
        if fam == "elu" and j >= 3:
            val = np.where(y == 0, _delta_limit([(-1.0, r) for r in range(j - 2)]), val)
        out[pm] = val
    sel = ~pm
    if np.any(sel):
        m, sg = mu[sel], s[sel]
        if fam in _CLOSED or fam == "leaky_relu":
            if fam == "gelu":
                out[sel] = _gelu_derivs(m, sg, j)[:, j]
            elif fam == "identity":
                out[sel] = 1.0 if j == 1 else 0.0
            else:
                a = 0.0 if fam == "relu" else leaky_slope(act)
                out[sel] = (a if j == 1 else 0.0) + (1.0 - a) * _relu_derivs(m, sg, j)
        else:
            out[sel] = _numeric_derivative_ev(act, fam, m, sg, j)
    return out.reshape(shape)


def _delta_limit(terms: list[tuple[float, int]]) -> float:
    """lim_{sigma -> 0+} sum_i a_i He_{r_i}(0) pdf(0) / sigma^(r_i + 1): 0 or +-inf."""
    best_r, best = -1, 0.0
    for a, r in terms:
        he0 = he_stack(r, np.zeros(1))[0, r]
        if a * he0 != 0 and r > best_r:
            best_r, best = r, a * he0
    return float(np.sign(best) * np.inf) if best != 0 else 0.0


def _numeric_derivative_ev(act, fam, mu, s, j):
    """Named smooth activations and elu: quadrature of the analytic phi^{(j)} (+ elu's delta terms), which
    keeps relative accuracy in the tails. Others: the same with autograd derivatives for sigma < 1 when
    phi has no kinks and torch_fn is differentiable, else integration by parts E[phi He_j] / sigma^j."""
    out = np.empty(mu.shape)
    if fam in _ANALYTIC_DERIV:
        use_quad = np.ones(mu.shape, dtype=bool)
    else:
        use_quad = np.zeros(mu.shape, dtype=bool)
        small = s < _S_IBP
        if np.any(small) and not act.kinks:
            probe = _smooth_deriv(act, np.zeros(1), j)
            use_quad = small if probe is not None else use_quad
    ibp = ~use_quad
    if np.any(ibp):
        out[ibp] = _quad_hermite_e(act, mu[ibp], s[ibp], j)[:, j] / s[ibp] ** j
    if np.any(use_quad):
        m, sg = mu[use_quad], s[use_quad]
        val = _quad_moments(lambda y: _smooth_deriv(act, y, j), act.kinks, m, sg, 0)[:, 0]
        if fam == "elu":  # elu^{(m)} jumps by -1 at 0 for m >= 2: elu^{(j)} += -sum_{r=0}^{j-3} delta^{(r)}
            c = -m / sg
            he = he_stack(max(j - 3, 0), c)
            for r in range(j - 2):
                val = val - he[:, r] * _pdf(c) / sg ** (r + 1)
        out[use_quad] = val
    return out
