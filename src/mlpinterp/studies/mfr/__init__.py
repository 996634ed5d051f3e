"""MFR (Marks et al. 2024): synthetic data, MiniLM, a causal LM and EEG: ``mlpinterp reproduce mfr``."""
