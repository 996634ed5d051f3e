"""Function space on real transformers: exact polynomial approximants of Hugging Face FFN blocks.

* :mod:`~mlpinterp.ffn.capture`: the blocks' real inputs from text (one forward pass, moments as sums).
* :mod:`~mlpinterp.ffn.readout`: the ridge family (polynomials in the block's own neuron directions).
* :mod:`~mlpinterp.ffn.projection`: exact least-squares projection onto it under the empirical law of the inputs.
* :mod:`~mlpinterp.ffn.mixture_moments`: the same normal equations exactly under a Gaussian mixture (no sampling),
  with :mod:`~mlpinterp.ffn.output_moments` (exact E[f], E||f||^2 of a block under one Gaussian).
* :mod:`~mlpinterp.ffn.hybrid`: the paper's remedy, closed form + schedule-free fine-tuning on real activations.
"""
