"""Activation registry: numpy implementations against torch's modules and mpmath, name/module mapping, errors."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest
import torch
from transformers.activations import QuickGELUActivation

from mlpinterp.gaussian.activations import ACTIVATION_NAMES, Activation, get_activation, leaky_slope

TORCH_MODULES = {
    "identity": torch.nn.Identity(),
    "relu": torch.nn.ReLU(),
    "leaky_relu": torch.nn.LeakyReLU(),
    "gelu": torch.nn.GELU(),
    "gelu_tanh": torch.nn.GELU(approximate="tanh"),
    "quick_gelu": QuickGELUActivation(),  # transformers' own module: x * sigmoid(1.702 x)
    "silu": torch.nn.SiLU(),
    "sigmoid": torch.nn.Sigmoid(),
    "tanh": torch.nn.Tanh(),
    "softplus": torch.nn.Softplus(),
    "elu": torch.nn.ELU(),
}

# mpmath definitions (evaluated at 400 digits so 1 + tanh(u) cannot cancel) written from the textbook formulas, independent of the numpy code.
MP_DEFS = {
    "identity": lambda y: y,
    "relu": lambda y: max(y, 0),
    "leaky_relu": lambda y: y if y > 0 else mp.mpf("0.01") * y,
    "gelu": lambda y: y * mp.ncdf(y),
    "gelu_tanh": lambda y: y / 2 * (1 + mp.tanh(mp.sqrt(2 / mp.pi) * (y + mp.mpf("0.044715") * y**3))),
    "quick_gelu": lambda y: y / (1 + mp.exp(-mp.mpf("1.702") * y)),
    "silu": lambda y: y / (1 + mp.exp(-y)),
    "sigmoid": lambda y: 1 / (1 + mp.exp(-y)),
    "tanh": mp.tanh,
    "softplus": lambda y: mp.log(1 + mp.exp(y)),
    "elu": lambda y: y if y > 0 else mp.exp(y) - 1,
}


def test_names_are_complete():
    assert set(ACTIVATION_NAMES) == set(TORCH_MODULES)


@pytest.mark.parametrize("name", ACTIVATION_NAMES)
def test_numpy_matches_torch_module(name):
    y = np.linspace(-15.0, 15.0, 301)
    act = get_activation(name)
    ref = TORCH_MODULES[name](torch.from_numpy(y)).numpy()
    # torch's softplus returns y above y > 20 only; 1e-12 relative agreement elsewhere
    np.testing.assert_allclose(act.fn(y), ref, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(act.torch_fn(torch.from_numpy(y)).numpy(), ref, rtol=0, atol=0)


@pytest.mark.parametrize("name", ACTIVATION_NAMES)
def test_numpy_tail_accuracy_against_mpmath(name):
    # relative accuracy in the tails (y << 0 is where naive 1 + tanh or 1 - sigmoid forms lose digits)
    ys = [-40.0, -12.5, -3.0, -1e-3, 0.0, 2e-3, 1.7, 9.0, 35.0]
    act = get_activation(name)
    got = act.fn(np.array(ys))
    with mp.workdps(400):
        for y, g in zip(ys, got, strict=True):
            ref = float(MP_DEFS[name](mp.mpf(y)))
            assert abs(g - ref) <= 1e-14 * abs(ref) + 1e-300, (name, y, g, ref)


@pytest.mark.parametrize("name", [n for n in ACTIVATION_NAMES if n != "identity"])
def test_torch_fn_is_differentiable(name):
    y = torch.linspace(-3, 3, 7, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(get_activation(name).torch_fn(y).sum(), y)
    assert torch.all(torch.isfinite(g))


def test_module_mapping():
    for name, module in TORCH_MODULES.items():
        assert get_activation(module).name == name
    act = get_activation(torch.nn.LeakyReLU(0.2))
    assert act.name == "leaky_relu:0.2" and leaky_slope(act) == 0.2
    assert get_activation(torch.nn.LeakyReLU(0.01)).name == "leaky_relu"


@pytest.mark.parametrize(
    "module,kinks", [(torch.nn.Softplus(beta=2.0), ()), (torch.nn.ELU(alpha=2.0), (0.0,)), (torch.nn.Hardtanh(), (-1.0, 1.0))]
)
def test_other_modules_are_wrapped(module, kinks):
    act = get_activation(module)
    assert act.name.startswith("torch:") and act.kinks == kinks
    y = np.linspace(-4, 4, 17)
    np.testing.assert_allclose(act.fn(y), module(torch.from_numpy(y)).numpy(), rtol=0, atol=0)


def test_aliases_and_case():
    assert get_activation("linear").name == "identity"
    assert get_activation("Swish").name == "silu"
    assert get_activation(" ReLU ").name == "relu"
    assert get_activation("identity").polynomial_degree == 1
    assert get_activation("relu").polynomial_degree is None
    assert get_activation("relu").kinks == (0.0,)
    assert get_activation("elu").kinks == (0.0,)
    assert get_activation("gelu").kinks == ()


def test_leaky_custom_slope():
    act = get_activation("leaky_relu:0.2")
    assert act.name == "leaky_relu:0.2" and act.kinks == (0.0,)
    np.testing.assert_allclose(act.fn(np.array([-2.0, 3.0])), [-0.4, 3.0])
    t = act.torch_fn(torch.tensor([-2.0, 3.0], dtype=torch.float64))
    np.testing.assert_allclose(t.numpy(), [-0.4, 3.0])
    assert get_activation("leaky_relu:0.01").name == "leaky_relu"
    with pytest.raises(ValueError, match="cannot parse the negative slope"):
        get_activation("leaky_relu:abc")
    with pytest.raises(ValueError, match="finite"):
        get_activation("leaky_relu:nan")


def test_activation_passthrough_and_call():
    act = get_activation("tanh")
    assert get_activation(act) is act
    np.testing.assert_allclose(act(np.array([0.5])), np.tanh([0.5]))
    assert torch.allclose(act(torch.tensor([0.5])), torch.tanh(torch.tensor([0.5])))


def test_numpy_callable_is_wrapped():
    act = get_activation(np.sin)
    assert act.name == "callable:sin" and act.kinks == () and act.polynomial_degree is None
    y = np.linspace(-2, 2, 5)
    np.testing.assert_allclose(act.fn(y), np.sin(y))
    t = act.torch_fn(torch.from_numpy(y))
    np.testing.assert_allclose(t.numpy(), np.sin(y))


def test_torch_callable_is_wrapped():
    act = get_activation(torch.sin)
    y = np.linspace(-2, 2, 5)
    np.testing.assert_allclose(act.fn(y), np.sin(y), rtol=1e-15)
    yt = torch.from_numpy(y).requires_grad_(True)
    (g,) = torch.autograd.grad(act.torch_fn(yt).sum(), yt)
    np.testing.assert_allclose(g.numpy(), np.cos(y), rtol=1e-15)


def test_unknown_name_lists_known_names():
    with pytest.raises(ValueError, match="unknown activation name 'foo'.*relu.*gelu_tanh"):
        get_activation("foo")


@pytest.mark.parametrize("bad", [3, 2.5, None, [1, 2]])
def test_bad_type(bad):
    with pytest.raises(TypeError, match="act must be an activation name"):
        get_activation(bad)


def test_non_elementwise_callable():
    with pytest.raises(ValueError, match="elementwise"):
        get_activation(lambda y: np.sum(y))


def test_callable_that_fails_everywhere():
    def bad(y):
        raise RuntimeError("boom")

    with pytest.raises(TypeError, match="must map numpy float arrays"):
        get_activation(bad)


def test_activation_is_frozen():
    act = get_activation("relu")
    with pytest.raises(AttributeError):
        act.name = "x"  # type: ignore[misc]
    assert isinstance(act, Activation)


def test_base_layers_import_nothing_above_them():
    """The activation registry, the Gaussian math and the network containers load without any package above them
    (Hugging Face import, polynomials, real-model plumbing, methods)."""
    import subprocess
    import sys

    code = ("import sys, mlpinterp.gaussian.activations, mlpinterp.gaussian.distributions, mlpinterp.networks; "
            "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('mlpinterp.')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert set(eval(out)) <= {"gaussian", "networks", "utils"}, out


def test_module_resolver_routes_another_librarys_modules(monkeypatch):
    import torch

    from mlpinterp.gaussian import activations as reg

    class Foreign(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x)

    Foreign.__module__ = "fakelib.activations"
    with pytest.raises(TypeError, match="not a supported elementwise activation"):
        get_activation(Foreign())  # no resolver for fakelib: refused, never guessed
    monkeypatch.setitem(reg._MODULE_RESOLVERS, "fakelib.", lambda m: get_activation("relu"))
    assert get_activation(Foreign()).name == "relu"
    with pytest.raises(TypeError, match="module_prefix must be a non-empty str"):
        reg.register_module_resolver("", lambda m: None)
    with pytest.raises(TypeError, match="resolve must be callable"):
        reg.register_module_resolver("fakelib.", 3)
