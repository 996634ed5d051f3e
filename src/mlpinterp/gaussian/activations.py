"""Activation registry: a name, a torch module or a callable -> :class:`Activation`.

An :class:`Activation` bundles a float64 numpy implementation (used by the Gaussian integrals in
:mod:`mlpinterp.gaussian.univariate` and :mod:`mlpinterp.gaussian.bivariate`), a differentiable torch
implementation, the points where the function is not smooth (quadrature panels are split there) and
its polynomial degree (``1`` for the identity, ``None`` otherwise).

Known names (:data:`ACTIVATION_NAMES`; aliases ``linear`` -> ``identity``, ``swish`` -> ``silu``):

========== ====================================================== =====================================
name       phi(y)                                                 torch equivalent
========== ====================================================== =====================================
identity   y                                                      ``torch.nn.Identity()``
relu       max(y, 0)                                              ``torch.nn.ReLU()``
leaky_relu y if y > 0 else a*y, a = 0.01 (``"leaky_relu:0.2"``)   ``torch.nn.LeakyReLU(a)``
gelu       y * Phi(y) (exact, erf form)                           ``torch.nn.GELU()``
gelu_tanh  0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3)))        ``torch.nn.GELU(approximate="tanh")``
quick_gelu y * sigmoid(1.702 y) (OpenAI CLIP, HF ``quick_gelu``)      ``transformers.activations.QuickGELUActivation()``
silu       y * sigmoid(y)                                         ``torch.nn.SiLU()``
sigmoid    1 / (1 + exp(-y))                                      ``torch.nn.Sigmoid()``
tanh       tanh(y)                                                ``torch.nn.Tanh()``
softplus   log(1 + exp(y)) (beta = 1)                             ``torch.nn.Softplus()``
elu        y if y > 0 else exp(y) - 1 (alpha = 1)                 ``torch.nn.ELU()``
========== ====================================================== =====================================

The numpy implementations are written to be accurate in the tails (``expit``, ``ndtr``, ``expm1``,
``logaddexp``), e.g. ``gelu_tanh`` uses ``1 + tanh(u) = 2 sigmoid(2u)`` so that phi(y) keeps its
relative accuracy for y << 0; the torch implementations are torch's own functions (torch's
``softplus`` switches to ``y`` above ``y > 20``, a relative difference below 1e-10).

This module imports torch lazily: the numpy side works without torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import special

__all__ = ["ACTIVATION_NAMES", "Activation", "get_activation", "register_module_resolver"]

ACTIVATION_NAMES: tuple[str, ...] = (
    "identity",
    "relu",
    "leaky_relu",
    "gelu",
    "gelu_tanh",
    "quick_gelu",
    "silu",
    "sigmoid",
    "tanh",
    "softplus",
    "elu",
)
_ALIASES = {"linear": "identity", "swish": "silu"}
_DEFAULT_LEAKY_SLOPE = 0.01
_GELU_TANH_C = math.sqrt(2.0 / math.pi)
QUICK_GELU_SLOPE = 1.702  # quick_gelu(y) = y sigmoid(1.702 y) (Hendrycks & Gimpel 2016, Sec. 2; HF quick_gelu)


@dataclass(frozen=True)
class Activation:
    """An elementwise activation function phi and what the Gaussian integrals need to know about it.

    Attributes:
        name: canonical name (one of :data:`ACTIVATION_NAMES`, ``"leaky_relu:<slope>"`` for a
            non-default slope, ``"callable:<name>"`` / ``"torch:<module>"`` for wrapped user functions).
            The closed forms in :mod:`mlpinterp.gaussian.univariate` are selected by this name.
        fn: float64 numpy implementation, elementwise, ``fn(y).shape == y.shape``.
        torch_fn: torch implementation, elementwise; differentiable for the named activations and
            torch modules, *not* differentiable for wrapped numpy callables (it round-trips through numpy).
        kinks: points (in units of the pre-activation y) where phi or one of its derivatives jumps,
            e.g. ``(0.0,)`` for relu / leaky_relu / elu; ``()`` if phi is smooth (C-infinity).
        polynomial_degree: ``1`` for the identity, ``None`` for non-polynomial functions.
    """

    name: str
    fn: Callable
    torch_fn: Callable
    kinks: tuple[float, ...] = ()
    polynomial_degree: int | None = None

    def __call__(self, y):
        """Apply ``fn`` (numpy arrays) or ``torch_fn`` (torch tensors)."""
        if type(y).__module__.startswith("torch"):
            return self.torch_fn(y)
        return self.fn(np.asarray(y, dtype=np.float64))


# ---------------------------------------------------------------- numpy implementations (float64)


def _np_identity(y):
    return np.asarray(y, dtype=np.float64) * 1.0


def _np_relu(y):
    return np.maximum(np.asarray(y, dtype=np.float64), 0.0)


def _np_leaky(a: float):
    def f(y):
        y = np.asarray(y, dtype=np.float64)
        return np.where(y > 0, y, a * y)

    return f


def _np_gelu(y):
    y = np.asarray(y, dtype=np.float64)
    return y * special.ndtr(y)


def _np_gelu_tanh(y):
    y = np.asarray(y, dtype=np.float64)
    u = _GELU_TANH_C * y * (1.0 + 0.044715 * (y * y))
    return y * special.expit(2.0 * u)  # 0.5 (1 + tanh u) = sigmoid(2u), accurate for u << 0


def _np_quick_gelu(y):
    y = np.asarray(y, dtype=np.float64)
    return y * special.expit(QUICK_GELU_SLOPE * y)  # expit keeps relative accuracy for y << 0


def _np_silu(y):
    y = np.asarray(y, dtype=np.float64)
    return y * special.expit(y)


def _np_sigmoid(y):
    return special.expit(np.asarray(y, dtype=np.float64))


def _np_tanh(y):
    return np.tanh(np.asarray(y, dtype=np.float64))


def _np_softplus(y):
    return np.logaddexp(0.0, np.asarray(y, dtype=np.float64))


def _np_elu(y):
    y = np.asarray(y, dtype=np.float64)
    return np.where(y > 0, y, np.expm1(np.minimum(y, 0.0)))


# ---------------------------------------------------------------- torch implementations (lazy import)


def _torch_named(name: str, slope: float = _DEFAULT_LEAKY_SLOPE) -> Callable:
    def f(t):
        import torch
        import torch.nn.functional as F

        if name == "identity":
            return t
        if name == "relu":
            return torch.relu(t)
        if name == "leaky_relu":
            return F.leaky_relu(t, negative_slope=slope)
        if name == "gelu":
            return F.gelu(t)
        if name == "gelu_tanh":
            return F.gelu(t, approximate="tanh")
        if name == "quick_gelu":
            return t * torch.sigmoid(QUICK_GELU_SLOPE * t)  # the same expression as transformers' QuickGELU
        if name == "silu":
            return F.silu(t)
        if name == "sigmoid":
            return torch.sigmoid(t)
        if name == "tanh":
            return torch.tanh(t)
        if name == "softplus":
            return F.softplus(t)
        if name == "elu":
            return F.elu(t)
        raise AssertionError(name)  # pragma: no cover

    f.__name__ = f"torch_{name}"
    return f


_NUMPY_FNS: dict[str, Callable] = {
    "identity": _np_identity,
    "relu": _np_relu,
    "gelu": _np_gelu,
    "gelu_tanh": _np_gelu_tanh,
    "quick_gelu": _np_quick_gelu,
    "silu": _np_silu,
    "sigmoid": _np_sigmoid,
    "tanh": _np_tanh,
    "softplus": _np_softplus,
    "elu": _np_elu,
}
_KINKS: dict[str, tuple[float, ...]] = {"relu": (0.0,), "leaky_relu": (0.0,), "elu": (0.0,)}


def _named(name: str, slope: float = _DEFAULT_LEAKY_SLOPE) -> Activation:
    if name == "leaky_relu":
        canonical = "leaky_relu" if slope == _DEFAULT_LEAKY_SLOPE else f"leaky_relu:{slope!r}"
        return Activation(canonical, _np_leaky(slope), _torch_named(name, slope), (0.0,), None)
    return Activation(
        name,
        _NUMPY_FNS[name],
        _torch_named(name),
        _KINKS.get(name, ()),
        1 if name == "identity" else None,
    )


def leaky_slope(act: Activation) -> float:
    """Negative slope ``a`` of a ``leaky_relu`` activation, parsed from its canonical name."""
    if act.name == "leaky_relu":
        return _DEFAULT_LEAKY_SLOPE
    if act.name.startswith("leaky_relu:"):
        return float(act.name.split(":", 1)[1])
    raise ValueError(f"act must be a leaky_relu activation, got {act.name!r}")


def _from_name(name: str) -> Activation:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key.startswith("leaky_relu:"):
        txt = key.split(":", 1)[1]
        try:
            slope = float(txt)
        except ValueError:
            raise ValueError(
                f"act: cannot parse the negative slope in {name!r}; expected e.g. 'leaky_relu:0.2'"
            ) from None
        if not math.isfinite(slope):
            raise ValueError(f"act: leaky_relu slope must be finite, got {slope!r} in {name!r}")
        return _named("leaky_relu", slope)
    if key not in ACTIVATION_NAMES:
        known = ", ".join(ACTIVATION_NAMES + tuple(_ALIASES))
        raise ValueError(
            f"act: unknown activation name {name!r}; known names: {known} (and 'leaky_relu:<slope>')"
        )
    return _named(key)


_MODULE_RESOLVERS: dict[str, Callable] = {}


def register_module_resolver(module_prefix: str, resolve: Callable) -> None:
    """Route torch modules whose class is defined under ``module_prefix`` to ``resolve(module) -> Activation``.

    The registry knows ``torch.nn`` only; a package above it that imports another library's activation modules
    registers its resolver here when it is imported (so the registry imports nothing above it).

    Raises ``TypeError`` unless ``module_prefix`` is a non-empty str and ``resolve`` is callable.
    """
    if not isinstance(module_prefix, str) or not module_prefix:
        raise TypeError(f"module_prefix must be a non-empty str, got {module_prefix!r}")
    if not callable(resolve):
        raise TypeError(f"resolve must be callable, got {type(resolve).__name__}")
    _MODULE_RESOLVERS[module_prefix] = resolve


def _from_module(module) -> Activation:
    """Map a ``torch.nn`` activation module to a named Activation, or wrap it."""
    import torch

    nn = torch.nn
    if isinstance(module, nn.Identity):
        return _named("identity")
    if isinstance(module, nn.ReLU):
        return _named("relu")
    if isinstance(module, nn.LeakyReLU):
        return _named("leaky_relu", float(module.negative_slope))
    if isinstance(module, nn.GELU):
        return _named("gelu_tanh" if module.approximate == "tanh" else "gelu")
    if isinstance(module, nn.SiLU):
        return _named("silu")
    if isinstance(module, nn.Sigmoid):
        return _named("sigmoid")
    if isinstance(module, nn.Tanh):
        return _named("tanh")
    if isinstance(module, nn.Softplus) and float(module.beta) == 1.0:
        return _named("softplus")
    if isinstance(module, nn.ELU) and float(module.alpha) == 1.0:
        return _named("elu")
    for prefix, resolve in _MODULE_RESOLVERS.items():
        if type(module).__module__.startswith(prefix):
            return resolve(module)
    kinks = _module_kinks(module)
    # a float64 copy: parametric modules (PReLU) kept in float32 would reject float64 inputs
    import copy

    module64 = copy.deepcopy(module).double().eval()

    def fn(y):
        y = np.asarray(y, dtype=np.float64)
        with torch.no_grad():
            return module64(torch.from_numpy(np.ascontiguousarray(y))).numpy().astype(np.float64)

    return Activation(f"torch:{module!r}", fn, module, kinks, None)


def _module_kinks(module) -> tuple[float, ...]:
    """Kinks/jumps of the elementwise torch modules we accept; ``TypeError`` for any other module.

    Only modules known to act elementwise (with parameters shared by all entries) are accepted: the Gaussian
    integrals evaluate phi on arrays of quadrature nodes, which is meaningless for Softmax, LayerNorm, ...
    """
    import torch

    nn = torch.nn
    if isinstance(module, (nn.ELU, nn.CELU, nn.SELU)):
        return (0.0,)
    if isinstance(module, nn.Hardtanh):  # includes ReLU6
        return (float(module.min_val), float(module.max_val))
    if isinstance(module, nn.Threshold):
        return (float(module.threshold),)
    if isinstance(module, (nn.Hardshrink, nn.Softshrink)):
        lam = float(module.lambd)
        return (-lam, lam) if lam > 0 else (0.0,)
    if isinstance(module, (nn.Hardswish, nn.Hardsigmoid)):
        return (-3.0, 3.0)
    if isinstance(module, nn.PReLU):
        if module.num_parameters != 1:
            raise TypeError(
                f"act: PReLU with num_parameters={module.num_parameters} is not elementwise with a shared slope; "
                "only num_parameters=1 is supported"
            )
        return (0.0,)
    if isinstance(module, (nn.Softplus, nn.Mish, nn.Softsign, nn.Tanhshrink, nn.LogSigmoid)):
        return ()
    raise TypeError(
        f"act: torch module {type(module).__name__} is not a supported elementwise activation; the Gaussian "
        "integrals need an elementwise phi (supported: ReLU, LeakyReLU, GELU, SiLU, Sigmoid, Tanh, Softplus, ELU, "
        "CELU, SELU, Hardtanh, ReLU6, Threshold, Hardshrink, Softshrink, Hardswish, Hardsigmoid, PReLU(1), Mish, "
        "Softsign, Tanhshrink, LogSigmoid, Identity); wrap a custom elementwise function as a callable instead"
    )


def _check_elementwise(call: Callable, probe: np.ndarray, out: np.ndarray, label: str) -> None:
    """Raise ``ValueError`` unless ``call`` commutes with taking sub-arrays and reversing (elementwise)."""
    try:
        head = np.asarray(call(probe[:3].copy()), dtype=np.float64)
        rev = np.asarray(call(probe[::-1].copy()), dtype=np.float64)
    except Exception:  # noqa: BLE001 - a function that fails on sub-arrays is not elementwise either
        head, rev = None, None
    ok = (
        head is not None and head.shape == (3,) and rev.shape == probe.shape
        and np.allclose(head, out[:3], rtol=1e-12, atol=1e-300, equal_nan=True)
        and np.allclose(rev, out[::-1], rtol=1e-12, atol=1e-300, equal_nan=True)
    )
    if not ok:
        raise ValueError(
            f"act: callable {label!r} must act elementwise: f(y)[i] may depend on y[i] only, but f(y[:3]) or "
            "f(reversed y) disagree with f(y) on a probe (e.g. a normalisation such as y / sum|y| is not elementwise)"
        )


def _wrap_callable(f: Callable) -> Activation:
    """Wrap a user callable acting elementwise on numpy float arrays (or, failing that, torch tensors)."""
    probe = np.linspace(-3.0, 3.0, 7)
    label = getattr(f, "__name__", type(f).__name__)
    try:
        out = np.asarray(f(probe.copy()), dtype=np.float64)
        numpy_ok = True
    except Exception:  # noqa: BLE001 - decide below whether it is a torch function
        numpy_ok = False
    if numpy_ok:
        if out.shape != probe.shape:
            raise ValueError(
                f"act: a callable must act elementwise (output shape == input shape); "
                f"f(y) for y of shape {list(probe.shape)} returned shape {list(out.shape)}"
            )
        _check_elementwise(lambda y: np.asarray(f(y), dtype=np.float64), probe, out, label)

        def fn(y):
            y = np.asarray(y, dtype=np.float64)
            return np.asarray(f(y), dtype=np.float64)

        def torch_fn(t):
            import torch

            vals = fn(t.detach().cpu().to(torch.float64).numpy())
            return torch.as_tensor(vals, dtype=t.dtype, device=t.device)

        return Activation(f"callable:{label}", fn, torch_fn, (), None)
    try:
        import torch

        out = f(torch.from_numpy(probe.copy())).detach().numpy()
    except Exception as e:  # noqa: BLE001
        raise TypeError(
            f"act: callable {label!r} must map numpy float arrays (or torch tensors) elementwise; "
            f"calling it on a float64 array raised {type(e).__name__}: {e}"
        ) from e
    if out.shape != probe.shape:
        raise ValueError(
            f"act: a callable must act elementwise (output shape == input shape); "
            f"f(y) for y of shape {list(probe.shape)} returned shape {list(out.shape)}"
        )
    _check_elementwise(lambda y: f(torch.from_numpy(y)).detach().numpy().astype(np.float64), probe, out, label)

    def fn_t(y):
        y = np.asarray(y, dtype=np.float64)
        with torch.no_grad():
            return f(torch.from_numpy(y)).numpy().astype(np.float64)

    return Activation(f"callable:{label}", fn_t, f, (), None)


def get_activation(act: str | Activation | Callable) -> Activation:
    """Resolve ``act`` to an :class:`Activation`.

    Args:
        act: a name from :data:`ACTIVATION_NAMES` (case-insensitive; aliases ``linear``, ``swish``;
            ``"leaky_relu:<slope>"`` for a custom negative slope), an :class:`Activation` (returned as is),
            a ``torch.nn`` activation module (``ReLU``, ``LeakyReLU``, ``GELU`` in both approximate modes,
            ``SiLU``, ``Sigmoid``, ``Tanh``, ``Softplus`` with beta=1, ``ELU`` with alpha=1, ``Identity``
            map to the named activations; the other elementwise modules ``ELU``, ``CELU``, ``SELU``,
            ``Hardtanh``, ``ReLU6``, ``Threshold``, ``Hardshrink``, ``Softshrink``, ``Hardswish``,
            ``Hardsigmoid``, ``PReLU(num_parameters=1)``, ``Softplus``, ``Mish``, ``Softsign``, ``Tanhshrink``,
            ``LogSigmoid`` are wrapped (float64 copy) with their kinks/jumps declared; modules of another
            library go to the resolver registered for it (:func:`register_module_resolver`; importing
            :mod:`mlpinterp.hf` registers the Hugging Face ones, verified numerically); any other module, e.g.
            ``Softmax`` or ``LayerNorm``, is refused), or a callable mapping numpy float arrays elementwise
            (wrapped; probed for elementwise behaviour; its ``torch_fn`` goes through numpy and is not
            differentiable; it has no declared kinks - build an :class:`Activation` yourself to declare them).

    Returns:
        The :class:`Activation`.

    Raises:
        ValueError: unknown name (the message lists the known names), unparsable leaky slope, or a
            callable that is not elementwise.
        TypeError: ``act`` is neither a string, an Activation nor a callable, or is a torch module that is not
            a supported elementwise activation.
    """
    if isinstance(act, Activation):
        return act
    if isinstance(act, str):
        return _from_name(act)
    try:
        import torch

        if isinstance(act, torch.nn.Module):
            return _from_module(act)
    except ImportError:  # pragma: no cover
        pass
    if callable(act):
        return _wrap_callable(act)
    raise TypeError(
        f"act must be an activation name (one of {', '.join(ACTIVATION_NAMES)}), an Activation, "
        f"a torch.nn module or a callable; got {type(act).__name__}"
    )
