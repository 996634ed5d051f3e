"""One small instance of every artifact type the project writes, with its public loader and a snapshot of what the
loader returns, for the corruption tests (tests/test_artifacts.py) and benchmarks/bench_artifact_flips.py.

Each case writes its files into a directory and returns ``(tensor file, metadata file)``; ``load(directory)``
returns a snapshot (tensors, arrays and plain values) of everything the loader gives back, compared bit for bit by
:func:`same`. The writers and loaders used are the public ones (a few private helpers where the loader is inside a
trainer), so the benchmark also runs against earlier versions of mlpinterp (where ``provenance`` did not exist).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[Path], tuple[Path, Path]]
    load: Callable[[Path], object]


def same(a, b) -> bool:
    """Bit-identical: tensors and arrays by dtype, shape and bytes, containers element by element."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        if not (torch.is_tensor(a) and torch.is_tensor(b)) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        as_bytes = [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in (a, b)]
        return bool(torch.equal(*as_bytes))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _save_poly(p, path: Path):
    try:
        return p.save(path, provenance={"step": 256})
    except TypeError:  # earlier versions: no provenance
        return p.save(path)


def _poly(dense: bool) -> Case:
    def make(d: Path):
        import mlpinterp as mi

        rng = np.random.default_rng(0)
        net = mi.MLP(rng.normal(size=(4, 3)), rng.normal(size=4), rng.normal(size=(2, 4)), rng.normal(size=2), "relu")
        p = mi.fit_polynomial(net, mi.Gaussian.standard(3), 2)
        path = _save_poly(p.to_dense() if dense else p, d / "p")
        return path, path.with_suffix(".json")

    def load(d: Path):
        from mlpinterp.poly.approximant import load_polynomial

        q = load_polynomial(d / "p.safetensors")
        return {"state": q.state(), "degree": q.degree, "info": q.info, "type": type(q).__name__}

    return Case("dense_polynomial" if dense else "ridge_polynomial", make, load)


def _classifier_cfg():
    from mlpinterp.models import ClassifierConfig

    return ClassifierConfig(d_in=64, n_classes=10, d_hidden=8, steps=16, warmup_steps=4, lr=5e-3, seed=0)


def _train_classifier(d: Path) -> None:
    from mlpinterp.data import load_digits
    from mlpinterp.models import train_classifier

    train_classifier(_classifier_cfg(), load_digits(), d, progress=False)


def _classifier() -> Case:
    def make(d: Path):
        _train_classifier(d)
        for p in d.glob("optim_*"):
            p.unlink()
        return d / "step_0000016.safetensors", d / "step_0000016.json"

    def load(d: Path):
        from mlpinterp.models import load_classifier

        model, meta = load_classifier(d / "step_0000016.safetensors")
        return {"state": dict(model.state_dict()), "meta": meta}

    return Case("classifier_checkpoint", make, load)


def _classifier_state() -> Case:
    def make(d: Path):
        _train_classifier(d)
        return d / "optim_0000016.safetensors", d / "optim_0000016.json"

    def load(d: Path):
        import schedulefree

        from mlpinterp.models import Classifier
        from mlpinterp.models.train import _restore_optimizer

        cfg = _classifier_cfg()
        model = Classifier(cfg)
        opt = schedulefree.AdamWScheduleFree(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                             warmup_steps=cfg.warmup_steps)
        _restore_optimizer(model, opt, d / "optim_0000016.safetensors")
        return {"params": dict(model.state_dict()), "opt": opt.state_dict()}

    return Case("classifier_training_state", make, load)


def _sae_case(layout: str) -> Case:
    def make(d: Path):
        from mlpinterp.sae.io import save_sae
        from mlpinterp.sae.topk import SaeConfig, TopKSae

        sae = TopKSae(6, SaeConfig(d_sae=10, k=4), generator=torch.Generator().manual_seed(0), dtype=torch.float32,
                      hook_point="encoder.layer.3.output", model_name="minilm")
        with torch.no_grad():
            sae.b_dec.normal_(0, 1.0, generator=torch.Generator().manual_seed(2))
        save_sae(sae, d, layout=layout)
        return d / ("sae.safetensors" if layout == "sparsify" else "sae_weights.safetensors"), d / "cfg.json"

    def load(d: Path):
        from mlpinterp.sae.io import load_sae

        sae = load_sae(d)
        return {"state": dict(sae.state_dict()), "cfg": dataclasses.asdict(sae.cfg), "hook": sae.hook_point,
                "model": sae.model_name, "scale": sae.input_scale, "d_in": sae.d_in, "dtype": str(sae.dtype)}

    return Case(f"sae_{layout}", make, load)


def _toy() -> Case:
    def make(d: Path):
        from mlpinterp.toys import TMS, save_toy

        torch.manual_seed(0)
        path = save_toy(TMS(5, 2), d / "target", {"loss": 0.25, "config": {"seed": 0, "steps": 100}})
        return path, path.with_suffix(".json")

    def load(d: Path):
        from mlpinterp.toys import load_toy

        model, meta = load_toy(d / "target.safetensors")
        return {"state": dict(model.state_dict()), "meta": meta, "type": type(model).__name__}

    return Case("toy_target", make, load)


_APD_CONFIG = {"steps": 4, "lr": 0.01, "C": 3}


def _adam_module():
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 2)
    return module, torch.optim.Adam(module.parameters(), lr=0.01)


def _apd() -> Case:
    def make(d: Path):
        from mlpinterp.utils.checkpoint import save_training_state

        module, opt = _adam_module()
        for _ in range(3):
            opt.zero_grad()
            module(torch.ones(4, 3)).pow(2).sum().backward()
            opt.step()
        save_training_state(d / "checkpoint.safetensors", module, opt, 3, _APD_CONFIG,
                            [{"step": 0, "loss": 0.5}, {"step": 1, "loss": 0.25}], 1.5)
        return d / "checkpoint.safetensors", d / "checkpoint.json"

    def load(d: Path):
        from mlpinterp.utils.checkpoint import load_training_state

        module, opt = _adam_module()
        step, history, seconds = load_training_state(d / "checkpoint.safetensors", module, opt, _APD_CONFIG)
        return {"step": step, "history": history, "seconds": seconds, "state": dict(module.state_dict()),
                "opt": opt.state_dict()}

    return Case("apd_checkpoint", make, load)


def _mfr_trainer():
    from mlpinterp.sae.mfr import MfrConfig, MfrTrainer
    from mlpinterp.sae.topk import SaeConfig

    return MfrTrainer(6, MfrConfig(sae=SaeConfig(d_sae=8, k=2), n_saes=1, penalty=False, reinit=False),
                      hook_point="encoder.layer.3.output", model_name="minilm")


def _mfr() -> Case:
    def make(d: Path):
        t = _mfr_trainer()
        t.train_step(torch.randn(32, 6, generator=torch.Generator().manual_seed(3)))
        t.save_checkpoint(d)
        return d / "trainer_rank0.safetensors", d / "trainer_rank0.json"

    def load(d: Path):
        t = _mfr_trainer()
        assert t.load_checkpoint(d)
        return {"step": t.step, "history": t.history, "alpha": t.alpha, "n_reinits": t.n_reinits,
                "scale": t.input_scale, "window": t.window_counts, "since": t.since_fired,
                "saes": [dict(s.state_dict()) for s in t.saes], "opts": [o.state_dict() for o in t.opts],
                "checks": t.checks, "events": t.reinit_events}

    return Case("mfr_checkpoint", make, load)


def _lm() -> Case:
    def make(d: Path):
        from mlpinterp.lm import train as lm_train

        module, opt = _adam_module()
        opt.zero_grad()
        module(torch.ones(4, 3)).pow(2).sum().backward()
        opt.step()
        meta = {"config": {"steps": 4}, "corpus": {"train_digest": "abc", "held_out_digest": "def"},
                "tokenizer_digest": "tok", "threads": 1, "step": 1, "history": {"loss": [2.5], "lr": [0.01],
                                                                                  "eval": []}, "seconds": 0.5}
        lm_train._save_checkpoint(d, module, opt, meta)
        path = lm_train._checkpoint_path(d)
        return path, path.with_suffix(".json")

    def load(d: Path):
        from mlpinterp.lm import train as lm_train

        path = lm_train._checkpoint_path(d)
        if hasattr(lm_train, "_load_checkpoint"):
            tensors, meta = lm_train._load_checkpoint(path)
        else:  # earlier versions
            from mlpinterp.utils.io import load_tensors, read_json

            meta = read_json(path.with_suffix(".json"))
            tensors, _ = load_tensors(path)
        module, opt = _adam_module()
        rng = torch.get_rng_state()
        try:
            lm_train._restore(path, module, opt, tensors)
            restored = torch.get_rng_state()
        finally:
            torch.set_rng_state(rng)
        return {"meta": meta, "state": dict(module.state_dict()), "opt": opt.state_dict(), "rng": restored}

    return Case("lm_checkpoint", make, load)


def _run_directory() -> Case:
    """A run directory's record (``run.json``) and a JSON output it reads back (``config.json``)."""
    _CONFIG = {"seed": 0, "lr": 0.01, "steps": [64, 128]}

    def make(d: Path):
        from mlpinterp.utils.rundir import open_run

        with open_run(d / "run", "reproduce test", {"seed": 0, "lr": 0.01}) as rd:
            try:
                from mlpinterp.utils.rundir import write_output
            except ImportError:  # an earlier mlpinterp: plain JSON
                from mlpinterp.utils.io import atomic_write_json as write_output
            write_output(rd.path / "config.json", _CONFIG)
        return d / "run" / "run.json", d / "run" / "config.json"

    def load(d: Path):
        from mlpinterp.utils.rundir import read_run

        try:
            from mlpinterp.utils.rundir import read_output
        except ImportError:
            from mlpinterp.utils.io import read_json as read_output
        rec = read_run(d / "run")
        return {"record": {k: v for k, v in rec.items() if k != "sessions"},
                "sessions": [{k: v for k, v in s.items() if k != "wall_s"} for s in rec["sessions"]],
                "wall": [s.get("wall_s") for s in rec["sessions"]], "config": read_output(d / "run" / "config.json")}

    return Case("run_directory", make, load)


def cases() -> list[Case]:
    """Every artifact type with a public (or trainer-internal) loader."""
    return [_poly(False), _poly(True), _classifier(), _classifier_state(), _sae_case("sparsify"),
            _sae_case("saelens"), _toy(), _apd(), _mfr(), _lm(), _run_directory()]


def canonical(raw: bytes):
    """The parsed content of a JSON file (``None`` when it does not parse): what a flip in JSON whitespace or an
    exponent's case leaves unchanged."""
    try:
        return json.dumps(json.loads(raw.decode("utf-8")), sort_keys=True)
    except (ValueError, UnicodeDecodeError):
        return None


@dataclasses.dataclass(frozen=True)
class Trial:
    case: str
    file: str  # "tensors" or "json"
    op: str  # "flip byte B bit b" or "truncate to N"
    outcome: str  # "refused", "identical" (loaded, bit-identical) or "changed" (loaded, different: silent)
    error: BaseException | None
    canonical_same: bool  # the mutated JSON parses to the same content as the original (False for tensor files)


def run_mutations(case: Case, tmp: Path, flips_per_file: int, seed: int = 0,
                  truncations: tuple[float, ...] = (0.0, 8, 0.25, 0.5, 0.9, -1)) -> list[Trial]:
    """Write ``case`` once, then for each of its two files: ``flips_per_file`` single-bit flips at uniformly drawn
    positions (``numpy.random.default_rng(seed)``) and truncations (a fraction of the length, an absolute byte
    count, or -1: the last byte dropped), each on a fresh copy, loaded with the case's loader."""
    import shutil

    pristine, work = tmp / f"{case.name}.pristine", tmp / f"{case.name}.work"
    pristine.mkdir(parents=True)
    files = case.make(pristine)
    reference = case.load(pristine)
    rng = np.random.default_rng(seed)
    out = []
    for label, f in zip(("tensors", "json"), files, strict=True):
        rel = f.relative_to(pristine)
        raw = f.read_bytes()
        ops = []
        for _ in range(flips_per_file):
            pos, bit = int(rng.integers(len(raw))), int(rng.integers(8))
            mutated = bytearray(raw)
            mutated[pos] ^= 1 << bit
            ops.append((f"flip byte {pos} bit {bit}", bytes(mutated)))
        for t in truncations:
            n = len(raw) - 1 if t == -1 else int(t) if t >= 1 else int(t * len(raw))
            ops.append((f"truncate to {n}", raw[:n]))
        for op, data in ops:
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(pristine, work)
            (work / rel).write_bytes(data)
            is_json = label == "json" or f.suffix == ".json"  # a run directory's two files are both JSON
            canon = is_json and canonical(data) is not None and canonical(data) == canonical(raw)
            try:
                got = case.load(work)
            except Exception as e:  # noqa: BLE001 - every refusal is recorded; the test checks the type
                out.append(Trial(case.name, label, op, "refused", e, canon))
                continue
            out.append(Trial(case.name, label, op, "identical" if same(got, reference) else "changed", None, canon))
    shutil.rmtree(work, ignore_errors=True)
    return out
