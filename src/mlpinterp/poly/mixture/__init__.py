"""Approximants under a Gaussian mixture (Rigg & Belrose 2025, §3.4, §4); the single-Gaussian route is ``poly/ridge.py``.

* ``coordinates.py``  whitened support coordinates of the mixture and the coordinate changes into them
* ``linear.py``       exact degree <= 1 (law of total covariance)
* ``cached_dense.py`` exact quadratic, dense Cholesky factorisation cached per mixture (moderate d_in, e.g. digits)
* ``operator.py``     the mixture operator of the quadratic normal equations (matrix-free) and its preconditioners
* ``pcg.py``          exact quadratic at MNIST scale: block preconditioned CG on that operator, mixed precision
* ``moment_dense.py`` exact, any degree, dense moment-table Gram (small support)
* ``exact.py``        ``fit_mixture``: the entry point of the matrix-free and moment-table solvers
* ``sgd.py``          the paper's hybrid (N(0, I) start + schedule-free SGD on mixture samples), for comparison
* ``readout_moments.py`` exact normal equations of the readout (ridge-family) projection under a mixture
"""
