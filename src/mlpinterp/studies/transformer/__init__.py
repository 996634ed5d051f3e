"""Exact polynomial approximants of a real transformer's FFN blocks: ``mlpinterp reproduce transformer``."""
