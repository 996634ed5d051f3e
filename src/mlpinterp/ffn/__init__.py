"""Import side of transformer FFN blocks: Hugging Face modules -> exact float64 ``MLP`` / ``GLU``.

* :mod:`~mlpinterp.ffn.blocks`      ``ffn_site`` / ``from_hf`` / ``ffn_paths``: paths, families, hook modules
* :mod:`~mlpinterp.ffn.layouts`     naming conventions of FFN blocks, weight reading, the forward self-check
* :mod:`~mlpinterp.ffn.activation`  Hugging Face activation names/classes -> verified registry activations
"""

from mlpinterp.ffn.blocks import FFNSite, ffn_paths, ffn_site, from_hf

__all__ = ["FFNSite", "ffn_paths", "ffn_site", "from_hf"]
