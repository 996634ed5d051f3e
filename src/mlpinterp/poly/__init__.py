"""Function space: least-squares polynomial approximants of MLPs and GLUs (Rigg & Belrose 2025)."""
