"""Activation space: TopK sparse autoencoders and Mutual Feature Regularization (Marks et al. 2024).

Modules: ``topk`` (the SAE), ``io`` (sparsify/SAELens artefacts with provenance and a weight hash),
``metrics`` (MSE, FVU, L0, dead fraction, MMCS), ``core_metrics`` (SAEBench core metrics),
``mfr`` (N-SAE trainer with the MFR penalty and re-initialisation; DDP and ensemble-parallel),
``synthetic`` (data with known features), ``analysis`` (similarity to the truth, shared-but-false features),
``activations`` (hook points of any torch module fed by real text), ``evaluate`` (an SAE spliced into a model).
"""

from mlpinterp.sae.analysis import cross_truth_correlation, feature_similarities, mmcs_to_truth, shared_false_cluster
from mlpinterp.sae.core_metrics import core_metrics
from mlpinterp.sae.distributed import Distributed
from mlpinterp.sae.inactivity import INACTIVITY_MEASURES
from mlpinterp.sae.io import check_provenance, load_sae, save_sae
from mlpinterp.sae.metrics import cosine_matrix, dead_fraction, firing_counts, fvu, hungarian_match, l0, mmcs, mse
from mlpinterp.sae.mfr import MfrConfig, MfrTrainer
from mlpinterp.sae.mfr_penalty import mfr_penalty
from mlpinterp.sae.synthetic import SyntheticBatch, SyntheticConfig, SyntheticData
from mlpinterp.sae.topk import EncoderOutput, ForwardOutput, SaeConfig, TopKSae

__all__ = [
    "INACTIVITY_MEASURES",
    "Distributed",
    "EncoderOutput",
    "ForwardOutput",
    "MfrConfig",
    "MfrTrainer",
    "SaeConfig",
    "SyntheticBatch",
    "SyntheticConfig",
    "SyntheticData",
    "TopKSae",
    "check_provenance",
    "core_metrics",
    "cosine_matrix",
    "cross_truth_correlation",
    "dead_fraction",
    "feature_similarities",
    "firing_counts",
    "fvu",
    "hungarian_match",
    "l0",
    "load_sae",
    "mfr_penalty",
    "mmcs",
    "mmcs_to_truth",
    "mse",
    "save_sae",
    "shared_false_cluster",
]
