"""Shared Gaussian math: distributions, univariate integrals per activation, master theorem, Isserlis."""
