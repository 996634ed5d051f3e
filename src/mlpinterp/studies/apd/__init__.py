"""APD (Braun et al. 2025) on the toy targets: ``mlpinterp reproduce apd``."""
