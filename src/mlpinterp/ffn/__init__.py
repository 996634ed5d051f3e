"""Function space on real transformers: exact polynomial approximants of Hugging Face FFN blocks.

Import (Hugging Face modules -> exact float64 ``MLP`` / ``GLU``): :mod:`mlpinterp.hf`.

Analysis on real activations:

* :mod:`~mlpinterp.ffn.capture`      the blocks' real inputs from text (one forward pass, moments as sums)
* :mod:`~mlpinterp.ffn.readout`      the ridge family (polynomials in the block's own neuron directions)
* :mod:`~mlpinterp.ffn.projection`   exact least-squares projection onto it under the empirical law of the inputs
* :mod:`~mlpinterp.ffn.mixture_moments` the same normal equations exactly under a Gaussian mixture (no sampling),
                                     with :mod:`~mlpinterp.ffn.output_moments` (exact E[f], E||f||^2 under one Gaussian)
* :mod:`~mlpinterp.ffn.hybrid`       the paper's remedy: closed form + schedule-free fine-tuning on real activations
* :mod:`~mlpinterp.ffn.diagnostics`  how Gaussian the inputs are (why a Gaussian input model fails)
* :mod:`~mlpinterp.ffn.features`     eigen-features along the block's top output directions, unembedding, SAEs
"""

