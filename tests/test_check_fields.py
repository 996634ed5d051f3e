"""The one mechanism for configuration fields (utils.validation.check_fields and its rules)."""

from dataclasses import dataclass

import numpy as np
import pytest

from mlpinterp.utils.validation import Bool, Int, OneOf, Real, check_fields


@dataclass(frozen=True)
class Cfg:
    steps: int = 10
    seed: int = 0
    k_aux: int | None = None
    lr: float = 1e-3
    dropout: float = 0.0
    flag: bool = True
    kind: str = "a"

    def __post_init__(self):
        check_fields(self, {"steps": Int(1), "seed": Int(None), "k_aux": Int(1, what="a positive int or None",
                                                                                 optional=True),
                            "lr": Real(0.0, lo_open=True), "dropout": Real(0.0, 1.0, hi_open=True),
                            "flag": Bool(), "kind": OneOf(("a", "b", "c"))})


def test_valid_values_pass():
    Cfg(steps=np.int64(3), seed=-4, k_aux=2, lr=5, dropout=0.5, flag=np.bool_(False), kind="c")


@pytest.mark.parametrize("kw,err,msg", [
    (dict(steps=0), ValueError, "steps must be >= 1, got 0"),
    (dict(steps=2.0), TypeError, "steps must be an int, got float 2.0"),
    (dict(steps=True), TypeError, "steps must be an int, got bool True"),
    (dict(seed="0"), TypeError, "seed must be an int, got str '0'"),
    (dict(k_aux=0), ValueError, "k_aux must be a positive int or None, got 0"),
    (dict(k_aux=1.5), ValueError, "k_aux must be a positive int or None, got 1.5"),
    (dict(lr=0.0), ValueError, r"lr must be finite and > 0, got 0.0"),
    (dict(lr=float("nan")), ValueError, "lr must be finite and > 0, got nan"),
    (dict(lr="1"), TypeError, "lr must be a real number, got str '1'"),
    (dict(dropout=1.0), ValueError, "dropout must be < 1, got 1.0"),
    (dict(flag="no"), TypeError, "flag must be a bool, got str 'no'"),
    (dict(kind="d"), ValueError, r"kind must be one of \('a', 'b', 'c'\), got 'd'"),
    (dict(kind=["a"]), ValueError, r"kind must be one of \('a', 'b', 'c'\), got \['a'\]"),
])
def test_each_rule_names_the_field_and_what_was_expected(kw, err, msg):
    with pytest.raises(err, match=f"^{msg}$"):
        Cfg(**kw)


def test_worded_rules():
    class C:
        lr, x, mode = -1.0, float("inf"), "z"

    with pytest.raises(ValueError, match=r"^lr must be > 0, got -1.0$"):
        check_fields(C(), {"lr": Real(0.0, lo_open=True, range_what="> 0")})
    with pytest.raises(ValueError, match=r"^x must be finite, got inf$"):
        check_fields(C(), {"x": Real(0.0, range_what=">= 0")})
    with pytest.raises(ValueError, match=r"^lr must be a finite float >= 0, got -1.0$"):
        check_fields(C(), {"lr": Real(0.0, what="a finite float >= 0")})
    with pytest.raises(ValueError, match=r"^mode must be 'x' or 'y', got 'z'$"):
        check_fields(C(), {"mode": OneOf(("x", "y"), either=True)})
    with pytest.raises(ValueError, match="either=True needs two choices"):
        OneOf(("x", "y", "z"), either=True)
