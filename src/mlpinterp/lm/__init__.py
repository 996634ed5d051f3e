"""Language-model plumbing shared by every consumer of real model activations.

* :mod:`~mlpinterp.lm.text`: corpora on disk, token chunks with the model's special tokens.
* :mod:`~mlpinterp.lm.hooks`: hook points (module paths), reading a module's output, splicing a replacement in.
* :mod:`~mlpinterp.lm.models`: loading a model + tokenizer (embedded MiniLM, or weights already on disk).
* :mod:`~mlpinterp.lm.recovery`: downstream fidelity with a replacement spliced in (loss recovered, embeddings).
"""
