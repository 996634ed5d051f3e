"""Short reprs (shapes, activation, dtype, digest), config field docs for --help, the CLI console width, and the
scipy-based KL (log domain)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy.special import softmax

import mlpinterp as mi
from mlpinterp.gaussian.distributions import GaussianMixture
from mlpinterp.utils.config_docs import field_default, field_docs
from mlpinterp.utils.reprs import digest


@pytest.fixture
def objects():
    rng = np.random.default_rng(0)
    W1 = rng.normal(size=(300, 64))  # big enough that printing the arrays would be thousands of characters
    net = mi.MLP(W1, np.zeros(300), rng.normal(size=(10, 300)), np.zeros(10), "gelu")
    glu = mi.GLU(rng.normal(size=(40, 64)), None, rng.normal(size=(40, 64)), None, activation="silu")
    g = mi.Gaussian(rng.normal(size=64), np.diag(np.r_[np.ones(50), np.zeros(14)]))
    X, y = rng.normal(size=(300, 64)), rng.integers(0, 3, 300)
    mix = GaussianMixture.from_labels(X, y, shrinkage="ledoit-wolf")
    ridge = mi.fit_polynomial(net, mi.Gaussian.standard(64), 2)
    dense = mi.fit_polynomial(net, mix, 1)
    return net, glu, g, mix, ridge, dense


def test_reprs_are_short_and_name_shapes(objects):
    net, glu, g, mix, ridge, dense = objects
    want = {
        net: "MLP(d_in=64, d_hidden=300, d_out=10, activation='gelu', dtype=float64, digest=",
        glu: "GLU(d_in=64, d_hidden=40, d_out=40, activation='silu', dtype=float64, digest=",
        g: "Gaussian(d=64, rank=50, dtype=float64, digest=",
        mix: "GaussianMixture(K=3, d=64, dtype=float64, digest=",
        ridge: "RidgePolynomial(degree=2, d_in=64, d_hidden=300, d_out=10, gated=False, method=",
        dense: "DensePolynomial(degree=1, d_in=64, d_out=10, method=",
    }
    for obj, prefix in want.items():
        r = repr(obj)
        assert r.startswith(prefix), r
        assert len(r) < 220 and "array" not in r and "[" not in r and "\n" not in r, r


def test_digest_identifies_the_numbers(objects):
    net = objects[0]
    same = mi.MLP(net.W1.copy(), net.b1.copy(), net.W2.copy(), net.b2.copy(), "gelu")
    assert repr(same) == repr(net)
    W1 = net.W1.copy()
    W1[17, 3] = np.nextafter(W1[17, 3], np.inf)  # one ulp in one weight
    assert repr(mi.MLP(W1, net.b1, net.W2, net.b2, "gelu")) != repr(net)
    assert digest(np.zeros((2, 3))) != digest(np.zeros((3, 2)))  # same bytes, other shape
    assert digest(np.zeros(3)) != digest(np.zeros(3, dtype=np.float32))
    assert digest(np.ones(3), None) != digest(np.ones(3))
    assert len(digest(np.ones(3), length=12)) == 12
    with pytest.raises(ValueError, match="length"):
        digest(np.ones(3), length=2)


@dataclasses.dataclass
class _Cfg:
    lr: float = 5e-3
    """Peak learning rate of
    ``schedule-free`` AdamW (see :func:`train`)."""
    steps: int = 10
    undocumented: int = 1
    items: list = dataclasses.field(default_factory=lambda: [1, 2])
    """A list."""


@dataclasses.dataclass
class _Child(_Cfg):
    extra: str = "x"
    """Extra field."""


def test_field_docs_read_the_docstring_under_each_field():
    assert field_docs(_Cfg) == {"lr": "Peak learning rate of schedule-free AdamW (see train).", "items": "A list."}
    assert field_docs(_Child)["extra"] == "Extra field." and "lr" in field_docs(_Child)
    assert field_default(_Cfg, "lr") == 5e-3 and field_default(_Cfg, "items") == [1, 2]
    with pytest.raises(KeyError, match="no field 'nope'"):
        field_default(_Cfg, "nope")
    with pytest.raises(TypeError, match="dataclass"):
        field_docs(int)


def test_every_cli_config_field_is_documented():
    from mlpinterp.models import ClassifierConfig
    from mlpinterp.studies.polynomial.run import PolynomialReproConfig

    for cls in (ClassifierConfig, PolynomialReproConfig):
        missing = {f.name for f in dataclasses.fields(cls)} - set(field_docs(cls)) - {"extra"}
        assert not missing, (cls.__name__, missing)


def test_console_is_unwrapped_off_a_terminal(monkeypatch, capsys):
    from rich.table import Table

    from mlpinterp.utils.console import console

    monkeypatch.setenv("COLUMNS", "80")  # exported by some shells: still unwrapped off a terminal
    t = Table()
    t.add_column("claim")
    long = "a claim of about one hundred and forty characters " * 3
    t.add_row(long)
    console().print(t)
    assert long.strip() in capsys.readouterr().out  # one line, not wrapped at 80 columns


def test_kl_from_outputs_log_domain_and_one_row():
    from mlpinterp.poly.metrics import kl_from_outputs

    rng = np.random.default_rng(3)
    f, q = rng.normal(size=(50, 5)), rng.normal(size=(50, 5))
    P, Q = softmax(f, axis=1), softmax(q, axis=1)
    want = (P * np.log(P / Q)).sum(1)  # hand formula in the probability domain
    kl, se = kl_from_outputs(f, q)
    assert kl == pytest.approx(want.mean(), rel=1e-12)
    assert se == pytest.approx(want.std(ddof=1) / math.sqrt(50), rel=1e-10)
    # logits 1000 apart: softmax(q) underflows to 0 where softmax(f) is 1; the log domain stays exact
    kl, _ = kl_from_outputs(np.array([[0.0, -1000.0], [0.0, -1000.0]]), np.array([[-1000.0, 0.0], [-1000.0, 0.0]]))
    assert kl == pytest.approx(1000.0, rel=1e-12)
    kl, se = kl_from_outputs(f[:1], q[:1])
    assert kl == pytest.approx(want[0], rel=1e-12) and math.isnan(se)  # one row: no standard error, never 0


@pytest.mark.parametrize("v", [10**400, -(10**400)])
def test_check_real_refuses_an_int_beyond_the_float_range_naming_it(v):
    """An int too large for a float is a ValueError naming the argument (before: OverflowError "int too large to
    convert to float" from math.isfinite, naming nothing), e.g. an SPD faithfulness-warm-up weight decay."""
    from mlpinterp.spd import SPDConfig
    from mlpinterp.utils.validation import check_real

    with pytest.raises(ValueError, match=r"x must be finite, got an int beyond the float range"):
        check_real(v, "x")
    with pytest.raises(ValueError, match=r"faithfulness_warmup_weight_decay must be finite and >= 0, got an int "
                                         r"beyond the float range"):
        SPDConfig(faithfulness_warmup_weight_decay=v)
