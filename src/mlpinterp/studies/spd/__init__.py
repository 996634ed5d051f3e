"""SPD (Bushnaq, Braun, Sharkey 2025) on the toy targets: ``mlpinterp reproduce spd``."""
