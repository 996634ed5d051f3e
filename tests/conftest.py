import copy
import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def _tms52_trained():
    """A TMS 5-2 target trained once per test session (800 steps, 2 instances, the better kept)."""
    from mlpinterp.toys import TMSConfig, train_tms

    model, _ = train_tms(TMSConfig(n_features=5, d_hidden=2, steps=800, batch_size=512, n_instances=2), quiet=True)
    return model


@pytest.fixture()
def tms52_target(_tms52_trained):
    """A private copy of the session's TMS 5-2 target (tests may freeze or modify it)."""
    return copy.deepcopy(_tms52_trained)
