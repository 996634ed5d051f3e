"""Approximants under a Gaussian mixture (Rigg & Belrose 2025, §3.4, §4); the single-Gaussian route is ``poly/ridge.py``.

* ``coordinates.py``  whitened support coordinates of the mixture (the mixture in them) and the coordinate changes
                      of polynomials into and out of them
* ``linear.py``       exact degree <= 1 (law of total covariance)
* ``cached_dense.py`` exact quadratic, dense Cholesky factorisation cached per mixture (moderate d_in, e.g. digits)
* ``factored.py``     the factored form of a ridge quadratic, which the operator applies without forming it
* ``operator.py``     the mixture operator of the quadratic normal equations (matrix-free), its preconditioners, its
                      flat parameter layout, and its precisions as the solver sees them
* ``pcg.py``          generic block preconditioned CG in mixed precision on flat vectors (knows no mixture)
* ``system.py``       the quadratic's normal equations set up for ``pcg.py``: operators, right-hand side, anchor
* ``moment_dense.py`` exact, any degree, dense moment-table Gram (small support)
* ``exact.py``        ``fit_mixture``: projections -> coordinates -> one solve in u -> raw coefficients
* ``sgd.py``          the paper's hybrid (N(0, I) start + schedule-free SGD on mixture samples), for comparison
* ``readout_moments.py`` exact normal equations of the readout (ridge-family) projection under a mixture
"""
