"""Activations of Hugging Face FFN blocks -> :class:`~mlpinterp.gaussian.activations.Activation`, verified.

A block's activation is known from two places: the config value the model was built from
(``config.hidden_act``, ``activation_function``, ``dense_act_fn``, Gemma's ``hidden_activation``) and the
module or function the block calls (``mlp.act``, ``mlp.act_fn``, ``layer.activation_fn``, ...). Each gives a
candidate name from our registry (tables :data:`HF_ACTIVATION_NAMES`, :data:`HF_ACTIVATION_CLASSES`); the
first candidate whose torch function equals the block's own activation on a float64 grid
(:data:`GRID_TOLERANCE`) is used, so a name never stands in for a different function:

================================================ ===========================================================
Hugging Face name (``ACT2FN`` key) / class        our activation
================================================ ===========================================================
``gelu``, ``gelu_python`` (``GELUActivation``)    ``gelu`` (erf form, y Phi(y))
``gelu_new`` (``NewGELUActivation``),             ``gelu_tanh`` (0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715
``gelu_pytorch_tanh``/``gelu_python_tanh``        y^3))))
(``GELUTanh``), ``gelu_accurate``,
``gelu_fast`` (``FastGELUActivation``)
``quick_gelu`` (``QuickGELUActivation``)          ``quick_gelu`` (y sigmoid(1.702 y))
``silu``, ``swish`` (``SiLUActivation``)          ``silu``
``relu``, ``tanh``, ``sigmoid``, ``leaky_relu``   the same names
``linear`` (``LinearActivation``)                 ``identity``
================================================ ===========================================================

``gelu_fast`` writes sqrt(2/pi) as 0.7978845608 (10 digits); it differs from the tanh GELU by at most
8.2e-13 on the grid's scale (measured), inside the tolerance. BLOOM's ``BloomGelu`` writes it as 0.79788456
(8 digits): 2.3e-10 on the grid (measured), accepted as ``gelu_tanh`` under its own tolerance
(:data:`CLASS_TOLERANCE`); its approximants are those of the exact tanh GELU, and the import check against the
block bounds the difference of the outputs. Anything else (``gelu_10`` = GELU clipped to
[-10, 10], ``relu6``, ``relu2``, ``mish``, ``xielu``, a custom lambda, a config value that the module does not
compute) raises ``ValueError`` naming the config value and the module's class: the closed forms and
quadrature rules of :mod:`mlpinterp.gaussian` are selected by name, so an unverified name would give silently
wrong approximants.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from mlpinterp.gaussian.activations import Activation, get_activation, register_module_resolver

__all__ = [
    "CLASS_TOLERANCE",
    "GRID_TOLERANCE",
    "HF_ACTIVATION_CLASSES",
    "HF_ACTIVATION_NAMES",
    "describe_activation",
    "max_discrepancy",
    "module_activation",
    "object_activation",
    "resolve_activation",
]

#: Hugging Face ``ACT2FN`` keys (config values) -> our registry names.
HF_ACTIVATION_NAMES: dict[str, str] = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "quick_gelu": "quick_gelu",
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "leaky_relu": "leaky_relu",
    "linear": "identity",
}

#: Classes of ``transformers.activations`` -> our registry names (torch.nn modules map through
#: :func:`~mlpinterp.gaussian.activations.get_activation`).
HF_ACTIVATION_CLASSES: dict[str, str] = {
    "GELUActivation": "gelu",
    "NewGELUActivation": "gelu_tanh",
    "GELUTanh": "gelu_tanh",
    "PytorchGELUTanh": "gelu_tanh",
    "FastGELUActivation": "gelu_tanh",
    "AccurateGELUActivation": "gelu_tanh",
    "QuickGELUActivation": "quick_gelu",
    "SiLUActivation": "silu",
    "LinearActivation": "identity",
    "BloomGelu": "gelu_tanh",
}

#: Classes whose constants are written with fewer digits than float64 holds: their own grid tolerance
#: (max |ours - theirs| / (1 + |theirs|)), just above the measured difference (module docstring).
CLASS_TOLERANCE: dict[str, float] = {"BloomGelu": 5e-10}

#: Largest accepted max_y |ours(y) - theirs(y)| / (1 + |theirs(y)|) over the grid (float64).
GRID_TOLERANCE = 1e-12
_GRID_HALF_WIDTH = 12.0


def _grid():
    import torch

    inner = torch.linspace(-_GRID_HALF_WIDTH, _GRID_HALF_WIDTH, 2401, dtype=torch.float64)
    outer = torch.tensor([15.0, 20.0, 30.0, 50.0], dtype=torch.float64)
    return torch.cat([-outer.flip(0), inner, outer])


def _torch_functions() -> dict:
    import torch
    import torch.nn.functional as F

    return {F.gelu: "gelu", F.silu: "silu", F.relu: "relu", torch.relu: "relu", torch.tanh: "tanh",
            torch.sigmoid: "sigmoid"}


def describe_activation(obj) -> str:
    """Short description of an activation object for messages: ``'NewGELUActivation module'``, ``'function <lambda>'``."""
    import torch

    if isinstance(obj, torch.nn.Module):
        extra = obj.extra_repr()
        return f"{type(obj).__name__}({extra}) module" if extra else f"{type(obj).__name__} module"
    if isinstance(obj, functools.partial):
        kw = ", ".join(f"{k}={v!r}" for k, v in obj.keywords.items())
        return f"functools.partial({getattr(obj.func, '__name__', obj.func)!r}, {kw})"
    if callable(obj):
        return f"function {getattr(obj, '__qualname__', type(obj).__name__)}"
    return f"{type(obj).__name__} {obj!r}"


def _candidate(obj) -> str | None:
    """Our registry name that ``obj`` (an activation module or function) claims to be, or None."""
    import torch
    import torch.nn.functional as F

    if isinstance(obj, torch.nn.Module):
        name = HF_ACTIVATION_CLASSES.get(type(obj).__name__)
        if name is not None and type(obj).__module__.startswith("transformers."):
            return name
        if type(obj).__module__.startswith("torch.nn"):
            try:
                act = get_activation(obj)
            except (TypeError, ValueError):
                return None
            return None if act.name.startswith("torch:") else act.name
        return None
    if isinstance(obj, functools.partial) and obj.func is F.gelu and not obj.args:
        approx = obj.keywords.get("approximate", "none")
        return {"tanh": "gelu_tanh", "none": "gelu"}.get(approx)
    try:
        return _torch_functions().get(obj)
    except TypeError:  # unhashable callable
        return None


def max_discrepancy(act: Activation, fn) -> float:
    """max_y |act.torch_fn(y) - fn(y)| / (1 + |fn(y)|) over a float64 grid (2401 points on [-12, 12], +-15..50).

    The ``1 +`` keeps the measure meaningful where phi(y) underflows to 0 in one implementation and not in the
    other (e.g. ``0.5 y (1 + tanh u)`` vs ``y sigmoid(2u)`` for y << 0). Returns ``inf`` if ``fn`` raises, returns
    a wrong shape or NaN where ours is finite.
    """
    import torch

    y = _grid()
    try:
        with torch.no_grad():
            theirs = fn(y.clone())
        if not isinstance(theirs, torch.Tensor) or theirs.shape != y.shape:
            return math.inf
        theirs = theirs.to(torch.float64)
        with torch.no_grad():
            ours = act.torch_fn(y.clone()).to(torch.float64)
    except Exception:  # noqa: BLE001 - an activation that cannot run on a float64 grid is not verifiable
        return math.inf
    diff = ((ours - theirs).abs() / (1.0 + theirs.abs())).numpy()
    if np.any(np.isnan(diff)):
        return math.inf
    return float(diff.max())


def resolve_activation(obj, config_value=None, config_key: str | None = None, where: str = "the block"):
    """The verified :class:`Activation` of a block whose activation object is ``obj``.

    Args:
        obj: the activation the block calls (a ``transformers.activations`` / ``torch.nn`` module or a function).
        config_value: the config's activation entry (a Hugging Face ``ACT2FN`` key or a callable), or None.
        config_key: the config attribute it was read from (``"hidden_act"``, ...), for messages.
        where: the block's path, for messages.

    Returns:
        ``(activation, source)``: the activation and a one-line description of where it came from, e.g.
        ``"config.hidden_act='gelu_new' (NewGELUActivation module)"``.

    Raises:
        ValueError: no candidate equals ``obj`` on the grid (unknown or unsupported activation, or a config value
            the module does not compute); the message names the config value, ``obj`` and each measured difference.
    """
    found = describe_activation(obj)
    cfg = f"config.{config_key}={config_value!r}" if config_key is not None and config_value is not None else None
    candidates: list[tuple[str, str]] = []
    if isinstance(config_value, str) and config_value in HF_ACTIVATION_NAMES:
        candidates.append((HF_ACTIVATION_NAMES[config_value], f"{cfg} ({found})"))
    own = _candidate(obj)
    if own is not None and own not in [c[0] for c in candidates]:
        note = f"; {cfg} does not match it" if cfg and candidates else (f"; {cfg}" if cfg else "")
        candidates.append((own, f"{found}{note}"))
    tried = []
    tol = _tolerance(obj)
    for name, source in candidates:
        act = get_activation(name)
        err = max_discrepancy(act, obj)
        if err <= tol:
            return act, source
        tried.append(f"{name!r} differs from it by {err:.2g}")
    what = f"{cfg} and the {found}" if cfg else f"the {found} ({config_key or 'no config'} value not set)"
    detail = ("; ".join(tried) + f" (max |difference| / (1 + |value|) on [-50, 50]; tolerance {GRID_TOLERANCE:g})"
              if tried else "neither maps to a supported activation")
    detail = detail.replace(f"tolerance {GRID_TOLERANCE:g}", f"tolerance {tol:g}")
    raise ValueError(
        f"unsupported activation at {where}: found {what}; {detail}. Supported Hugging Face activations: "
        f"{', '.join(sorted(HF_ACTIVATION_NAMES))} (and torch.nn ReLU, GELU, SiLU, Tanh, Sigmoid, LeakyReLU, "
        "Identity). For another elementwise activation build mlpinterp.MLP / GLU from the weights with "
        "activation=<callable> (its Gaussian integrals then use quadrature)"
    )


def _tolerance(obj) -> float:
    """Grid tolerance for ``obj``: :data:`CLASS_TOLERANCE` for the listed ``transformers`` classes, else the default."""
    cls = type(obj)
    if cls.__module__.startswith("transformers.") and cls.__name__ in CLASS_TOLERANCE:
        return CLASS_TOLERANCE[cls.__name__]
    return GRID_TOLERANCE


def module_activation(module) -> Activation:
    """Verified :class:`Activation` of a ``transformers.activations`` module (used by ``get_activation``).

    Raises ``TypeError`` for a class outside :data:`HF_ACTIVATION_CLASSES` (e.g. ``ClippedGELUActivation``) and
    ``ValueError`` if a known class does not compute its function (a patched module).
    """
    if _candidate(module) is None:
        raise TypeError(
            f"act: {describe_activation(module)} is not a supported activation; supported transformers classes: "
            f"{', '.join(sorted(HF_ACTIVATION_CLASSES))}"
        )
    return resolve_activation(module, where=f"act ({type(module).__name__})")[0]


def object_activation(obj) -> Activation:
    """The named activation ``obj`` computes if it is a known module or function (verified on the grid), else
    :func:`~mlpinterp.gaussian.activations.get_activation`'s wrapping of it (used by ``from_module``, where
    a user's own elementwise callable is allowed: its Gaussian integrals then use quadrature)."""
    name = _candidate(obj)
    if name is not None:
        act = get_activation(name)
        if max_discrepancy(act, obj) <= _tolerance(obj):
            return act
    return get_activation(obj)


register_module_resolver("transformers.", module_activation)
