"""End-to-end studies: one sub-package per reproduction (settings, run, report) and the shared report module.

``polynomial`` (Rigg & Belrose 2025 on real images), ``transformer`` (the same on a real transformer's FFN blocks),
``apd`` / ``spd`` (parameter decompositions of the toy targets in :mod:`mlpinterp.toys`), ``mfr`` (feature-aligned
SAEs: synthetic data, MiniLM, a causal LM, EEG); ``report`` renders every study's Markdown template to
``report.md`` + a self-contained ``report.html``; ``paramspace`` holds what APD and SPD runs share (figures, run
directories).
"""
