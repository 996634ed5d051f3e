"""mlpinterp: decompose what trained feedforward networks compute.

* Function space: exact polynomial approximants (Rigg & Belrose 2025, arXiv 2502.01032).
* Parameter space: Attribution-based Parameter Decomposition (Braun et al. 2025).
* Activation space: TopK SAEs with Mutual Feature Regularization (Marks et al. 2024).
"""

__version__ = "0.1.0"
