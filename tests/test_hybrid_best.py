"""The hybrid fine-tune keeps its best validated step (ffn.hybrid).

Oracle: the validation FVU of the returned readouts recomputed directly from the network's outputs, against the
recorded history; a learning rate large enough to make the last step worse than the start.
"""

from __future__ import annotations

import numpy as np

import mlpinterp as mi
from mlpinterp.poly.finetune_config import FinetuneConfig
from mlpinterp.poly.readout import Readout, RidgeBasis
from mlpinterp.poly.readout_finetune import finetune


def _fvu(net, ro, X):
    Y = net(X)
    return float(((ro(X) - Y) ** 2).sum() / ((Y - Y.mean(0)) ** 2).sum())


def test_best_validated_step_is_kept_and_last_is_reported():
    rng = np.random.default_rng(0)
    d, h, o = 6, 10, 3
    net = mi.MLP(rng.standard_normal((h, d)), rng.standard_normal(h), rng.standard_normal((o, h)), np.zeros(o),
                 activation="gelu")
    g = mi.Gaussian(np.zeros(d), np.eye(d))
    p = mi.fit_polynomial(net, g, 2)
    start = Readout.from_closed_form(p, RidgeBasis.from_closed_form(p, g))
    X, Xv = g.sample(2000, rng), g.sample(1000, rng)  # Gaussian inputs: the closed form is already optimal
    cfg = FinetuneConfig(steps=40, lr=0.3, eval_every=10, batch_size=64, warmup_steps=0)
    hr = finetune(net, start, X, cfg, X_val=Xv)
    s = hr.summary()
    fvus = {e["step"]: e["fvu_val"] for e in hr.history}
    assert s["last_step"] == 40 and s["best_step"] == min(fvus, key=fvus.get)
    assert s["last_fvu_val"] > s["best_fvu_val"]  # the large step size degraded the start
    np.testing.assert_allclose(_fvu(net, hr.readout, Xv), s["best_fvu_val"], rtol=1e-4)  # float32 training
    np.testing.assert_allclose(_fvu(net, hr.last_readout, Xv), s["last_fvu_val"], rtol=1e-4)
    no_val = finetune(net, start, X, cfg)
    assert no_val.best_step is None and no_val.last_readout is no_val.readout
