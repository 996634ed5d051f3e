"""The Hugging Face import: FFN blocks of transformers models -> exact float64 ``MLP`` / ``GLU``.

* :mod:`~mlpinterp.hf.blocks`      ``ffn_site`` / ``from_hf`` / ``ffn_paths``: paths, families, hook modules
* :mod:`~mlpinterp.hf.layouts`     naming conventions of FFN blocks, weight reading, the forward self-check,
                                   ``from_module`` for a user's own torch module
* :mod:`~mlpinterp.hf.activation`  Hugging Face activation names/classes -> verified registry activations
                                   (registered with the activation registry on import)
"""

from mlpinterp.hf.blocks import FFNSite, ffn_paths, ffn_site, from_hf
from mlpinterp.hf.layouts import from_module

__all__ = ["FFNSite", "ffn_paths", "ffn_site", "from_hf", "from_module"]
