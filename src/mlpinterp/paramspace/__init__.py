"""Parameter space: the core shared by APD (:mod:`mlpinterp.apd`) and SPD (:mod:`mlpinterp.spd`).

* :mod:`~mlpinterp.paramspace.components`  decomposed sites of any ``nn.Module`` and their low-rank components
* :mod:`~mlpinterp.paramspace.forward`     the masked forward: decomposed weights replaced by weighted sums of
                                           components (per-site coefficients), output capture
* :mod:`~mlpinterp.paramspace.losses`      faithfulness and minimality's output distance
* :mod:`~mlpinterp.paramspace.metrics`     MMCS / ML2R against target columns, causal-scrubbing keep-masks
"""

from mlpinterp.paramspace.components import (
    Components,
    Site,
    reference_init_std,
    reference_rank,
    resolve_sites,
    target_weight,
)
from mlpinterp.paramspace.forward import capture_outputs, run_with_components
from mlpinterp.paramspace.losses import faithfulness_loss, minimality_loss
from mlpinterp.paramspace.metrics import ScrubbingResult, column_match, mmcs_ml2r, scrub_keep_masks

__all__ = [
    "Components", "ScrubbingResult", "Site", "capture_outputs", "column_match", "faithfulness_loss",
    "minimality_loss", "mmcs_ml2r", "reference_init_std", "reference_rank", "resolve_sites", "run_with_components",
    "scrub_keep_masks", "target_weight",
]
