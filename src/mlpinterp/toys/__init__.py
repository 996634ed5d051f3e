"""Toy models with ground-truth mechanisms for parameter decomposition (Braun et al. 2025).

- :mod:`.tms`: Toy Model of Superposition with tied weights, ``x_hat = ReLU(W^T W x + b)``.
- :mod:`.resid_mlp`: residual MLP doing compressed computation (1 and 2 layers).
- :mod:`.gated_trig`: hand-coded gated piecewise-trigonometric residual MLP.
- :mod:`.io`: atomic safetensors + JSON save/load of any of them.
"""

from mlpinterp.toys.data import one_hot_inputs, sparse_features, step_generator
from mlpinterp.toys.gated_trig import (
    GatedTrigMLP,
    build_gated_trig,
    gated_trig_ground_truth,
    gated_trig_inputs,
    trig_functions,
)
from mlpinterp.toys.io import load_toy, save_toy
from mlpinterp.toys.resid_mlp import (
    RESID_PRESETS,
    ResidMLPConfig,
    ResidualMLP,
    build_resid_mlp,
    neuron_contributions,
    resid_labels,
    train_resid_mlp,
)
from mlpinterp.toys.tms import (
    TMS,
    TMS_PRESETS,
    TMSConfig,
    TMSLinears,
    as_linears,
    tms_ground_truth,
    train_tms,
    with_identity,
)

__all__ = [
    "GatedTrigMLP", "RESID_PRESETS", "ResidMLPConfig", "ResidualMLP", "TMS", "TMSConfig", "TMS_PRESETS",
    "build_gated_trig", "build_resid_mlp", "gated_trig_ground_truth", "gated_trig_inputs", "load_toy",
    "neuron_contributions", "one_hot_inputs", "resid_labels", "save_toy", "sparse_features", "step_generator",
    "tms_ground_truth", "train_resid_mlp", "train_tms", "trig_functions", "with_identity", "TMSLinears", "as_linears",
]
