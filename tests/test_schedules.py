"""Schedule factors of mlpinterp.utils.schedules pinned at their ends and midpoints by hand values."""

import math

import pytest

from mlpinterp.utils.schedules import (
    constant,
    cosine_half,
    cosine_half_rise,
    cosine_quarter,
    linear_decay,
    linear_warmup,
)

SQRT_HALF = 0.7071067811865476  # cos(pi / 4) = 1 / sqrt(2)
COS_PI_8_SQ = 0.8535533905932737  # (1 + cos(pi / 4)) / 2 = cos^2(pi / 8)


def test_cosine_half_zero_at_last_step():
    # 101 steps: t = step / 100
    assert cosine_half(0, 101) == 1.0
    assert cosine_half(25, 101) == pytest.approx(COS_PI_8_SQ, abs=1e-15)
    assert cosine_half(50, 101) == pytest.approx(0.5, abs=1e-15)
    assert cosine_half(75, 101) == pytest.approx(1 - COS_PI_8_SQ, abs=1e-15)
    assert cosine_half(100, 101) == pytest.approx(0.0, abs=1e-16)
    assert cosine_half(500, 101) == pytest.approx(0.0, abs=1e-16)  # past the end: the final factor
    assert cosine_half(0, 1) == 1.0  # one step: t = 0


def test_cosine_half_zero_after_last_step():
    # 100 steps: t = step / 100, so the last step 99 is not yet 0
    assert cosine_half(0, 100, zero_at_last_step=False) == 1.0
    assert cosine_half(50, 100, zero_at_last_step=False) == pytest.approx(0.5, abs=1e-15)
    assert cosine_half(99, 100, zero_at_last_step=False) == pytest.approx((1 + math.cos(0.99 * math.pi)) / 2)
    assert cosine_half(99, 100, zero_at_last_step=False) == pytest.approx(2.4671e-4, rel=1e-4)
    assert cosine_half(100, 100, zero_at_last_step=False) == pytest.approx(0.0, abs=1e-16)


def test_cosine_quarter():
    assert cosine_quarter(0, 101) == 1.0
    assert cosine_quarter(50, 101) == pytest.approx(SQRT_HALF, abs=1e-15)
    assert cosine_quarter(100, 101) == pytest.approx(0.0, abs=1e-16)
    assert cosine_quarter(0, 1) == 1.0
    # a quarter period is above the half one everywhere inside (1, 0)
    assert all(cosine_quarter(s, 11) > cosine_half(s, 11) for s in range(1, 10))


def test_linear_decay_and_warmup():
    assert linear_decay(0, 100) == 1.0
    assert linear_decay(50, 100) == 0.5
    assert linear_decay(99, 100) == pytest.approx(0.01)
    assert linear_decay(50, 101, zero_at_last_step=True) == 0.5
    assert linear_decay(100, 101, zero_at_last_step=True) == 0.0
    assert [linear_warmup(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert linear_warmup(0, 0) == 1.0


def test_cosine_half_rise():
    assert cosine_half_rise(0, 100) == 0.0
    assert cosine_half_rise(50, 100) == pytest.approx(0.5, abs=1e-15)
    assert cosine_half_rise(25, 100) == pytest.approx(1 - COS_PI_8_SQ, abs=1e-15)
    assert cosine_half_rise(100, 100) == 1.0
    assert cosine_half_rise(10**6, 100) == 1.0
    assert cosine_half_rise(0, 0) == 1.0


def test_constant():
    assert [constant(s, 5) for s in (0, 2, 4, 9)] == [1.0, 1.0, 1.0, 1.0]
    assert constant(0, 1) == 1.0


@pytest.mark.parametrize("call", [lambda: constant(-1, 10), lambda: constant(0, 0), lambda: cosine_half(-1, 10), lambda: cosine_quarter(0, 0),
                                  lambda: linear_decay(3, 0), lambda: linear_warmup(-1, 5),
                                  lambda: cosine_half_rise(0, -1)])
def test_bad_steps_raise(call):
    with pytest.raises(ValueError, match="must be >= 0"):
        call()


def test_trainers_take_their_schedules_from_here():
    """APD's "cosine" is the half cosine, SPD's "cosine" the quarter one (the reference's), SPD's
    "cosine-annealing" the half one; the causal LM decays to its floor with a half cosine after warm-up."""
    from mlpinterp.apd import APDConfig
    from mlpinterp.apd import lr_at as apd_lr
    from mlpinterp.lm.train import lr_at as lm_lr
    from mlpinterp.lm.train_config import LmTrainConfig
    from mlpinterp.spd import SPDConfig
    from mlpinterp.spd import lr_at as spd_lr

    apd = APDConfig(steps=120, lr=1.0, lr_schedule="cosine", warmup_frac=1 / 6)  # 20 warm-up steps, T' = 100
    assert [apd_lr(s, apd) for s in (0, 9, 19)] == [0.05, 0.5, 1.0]
    assert apd_lr(20, apd) == 1.0 and apd_lr(70, apd) == pytest.approx(0.5)
    spd = SPDConfig(steps=101, lr=1.0)
    assert spd.lr_schedule == "cosine" and spd_lr(50, spd) == pytest.approx(SQRT_HALF)
    with pytest.raises(ValueError, match="must be >= 0"):  # every schedule, the constant one too, checks the step
        spd_lr(-1, SPDConfig(lr_schedule="constant"))
    lm = LmTrainConfig(steps=111, warmup_steps=10, lr=1.0, min_lr_fraction=0.1)  # decay over steps 10..110
    assert lm_lr(lm, 0) == 0.1 and lm_lr(lm, 9) == 1.0
    assert lm_lr(lm, 10) == 1.0
    assert lm_lr(lm, 60) == pytest.approx(0.1 + 0.9 * 0.5)  # t = 50 / 100
    assert lm_lr(lm, 110) == pytest.approx(0.1)  # the floor at the last step
