"""Rigg & Belrose (2025) on real images: ``mlpinterp reproduce polynomial``."""
