"""CLI: ``mlpinterp approx WEIGHTS``: the exact least-squares polynomial approximant of a network and its FVU.

    mlpinterp approx WEIGHTS [--degree 2] [--activation relu] [--distribution standard|gaussian|mixture --dataset D]
        [--mean MEAN.npy --cov COV.npy] [--data DIR] [--out PATH] [--samples N] [--fvu-method auto|exact|monte-carlo]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import typer

from mlpinterp.cli.config_options import CommandConfig, add_command, config_options, invalid, option
from mlpinterp.cli.errors import expected_errors, fail
from mlpinterp.data.dataset import check_data_path
from mlpinterp.utils.validation import Int

Dataset = Literal["digits", "mnist", "fashion-mnist"]
"""Datasets whose moments can define the input law (those of ``train`` and ``reproduce polynomial``)."""

_WEIGHTS_FIX = ("pass a classifier checkpoint (step_N.safetensors written by `mlpinterp train`), or a .safetensors "
                "or .npz file with W1, b1, W2, b2 (MLP) or W, b, V, c[, W2, b2] (GLU) and --activation")


@dataclass(frozen=True, kw_only=True)
class ApproxCommand(CommandConfig):
    """Inputs of ``mlpinterp approx``."""

    weights: Path = option(argument=True, metavar="WEIGHTS")
    """Network weights: a classifier checkpoint (step_*.safetensors), or a .safetensors/.npz with W1,b1,W2,b2 (MLP)
    or W,b,V,c[,W2,b2] (GLU)."""
    degree: int = option(2, check=Int(0, what="a non-negative integer"))
    """Total degree of the polynomial (0, 1, 2, 3, ...)."""
    activation: str | None = None
    """Activation for raw weight files: relu, gelu, silu, tanh, ..."""
    distribution: Literal["standard", "gaussian", "mixture"] = "standard"
    """Input law: standard = N(0, I); gaussian = moment-matched Gaussian of --dataset; mixture = its
    class-conditional mixture (Ledoit-Wolf class covariances)."""
    mean: Path | None = None
    """A .npy file with the Gaussian mean [d_in] (with --cov)."""
    cov: Path | None = None
    """A .npy file with the Gaussian covariance [d_in, d_in] (with --mean)."""
    dataset: Dataset | None = None
    """Dataset whose moments define the input law (with --distribution gaussian or mixture)."""
    data: Path | None = option(None, aliases=("--data-path",), metavar="DIR")
    """Directory with the dataset's IDX files (default: $MLPINTERP_DATA/<dataset> or ../shared/data/<dataset>)."""
    out: Path | None = option(None, metavar="PATH")
    """Write the approximant here (PATH.safetensors + PATH.json)."""
    samples: int = 100_000
    """Monte Carlo samples when the FVU has no closed form (or with --fvu-method monte-carlo)."""
    fvu_method: Literal["auto", "exact", "monte-carlo"] = "auto"
    """How the FVU is computed: auto (exact when a closed form exists, else Monte Carlo with --samples), exact, or
    monte-carlo (memory independent of d_hidden^2)."""

    def validate(self) -> None:
        if self.dataset is not None:
            check_data_path(self.dataset, self.data, "data", "dataset")
        if (self.mean is None) != (self.cov is None):
            raise invalid("--mean and --cov must be given together", "pass both --mean MEAN.npy and --cov COV.npy")
        if self.mean is not None and (self.distribution != "standard" or self.dataset is not None):
            given = f"--distribution {self.distribution}" + (f" --dataset {self.dataset}" if self.dataset else "")
            raise invalid(f"--mean/--cov define the input law, so {given} would be ignored",
                          "pass either --mean and --cov, or --distribution gaussian|mixture with --dataset")
        if self.mean is None and self.distribution != "standard" and self.dataset is None:
            raise invalid(f"--distribution {self.distribution} needs --dataset",
                          "pass --dataset digits|mnist|fashion-mnist")


def load_network(path: Path, activation: str | None):
    """Load weights from a classifier checkpoint, a safetensors file or an ``.npz``: ``(network, metadata)``.

    Keys ``W1, b1, W2, b2`` give an MLP; ``W, b, V, c[, W2, b2]`` a GLU. Raises ``ValueError`` (with a ``fix``)
    naming the file and what was expected."""
    from mlpinterp.networks import GLU, MLP

    if not path.exists():
        raise invalid(f"weights file {str(path)!r} does not exist", _WEIGHTS_FIX)
    meta: dict = {}
    if path.suffix == ".npz":
        try:
            with np.load(path) as z:
                arrays = {k: z[k] for k in z.files}
        except Exception as e:  # noqa: BLE001 - numpy raises several types on corrupt archives
            raise invalid(f"{str(path)!r} is not a valid .npz file ({e})", _WEIGHTS_FIX) from e
    elif path.suffix == ".safetensors":
        from mlpinterp.utils.artifact import artifact_kind, read_safetensors
        from mlpinterp.utils.io import read_json

        kind = artifact_kind(path)
        if kind == "classifier_checkpoint":
            from mlpinterp.models import load_classifier

            try:
                model, meta = load_classifier(path)
                return model.to_network(), meta
            except (ValueError, TypeError, KeyError, FileNotFoundError) as e:
                raise invalid(str(e), getattr(e, "fix", None) or _WEIGHTS_FIX) from e
        if kind is not None:
            raise invalid(f"{str(path)!r} is an mlpinterp {kind!r} artifact, not network weights", _WEIGHTS_FIX)
        try:
            tensors, _ = read_safetensors(path, what="weights file")
            meta_path = path.with_suffix(".json")
            meta = read_json(meta_path, what="weights metadata", fix=None) if meta_path.is_file() else {}
        except ValueError as e:
            raise invalid(str(e), getattr(e, "fix", None) or _WEIGHTS_FIX) from e
        arrays = {k: v.double().numpy() for k, v in tensors.items()}
    else:
        raise invalid(f"expected a .safetensors or .npz file, got {path.name!r}", _WEIGHTS_FIX)
    act = activation or meta.get("activation")
    if act is None:
        raise invalid("--activation is required for raw weight files", "pass --activation relu (or the network's)")
    try:
        if {"W1", "b1", "W2", "b2"} <= arrays.keys():
            return MLP(arrays["W1"], arrays["b1"], arrays["W2"], arrays["b2"], act), meta
        if {"W", "V"} <= arrays.keys():
            return GLU(arrays["W"], arrays.get("b"), arrays["V"], arrays.get("c"), arrays.get("W2"), arrays.get("b2"),
                       act), meta
    except (ValueError, TypeError) as e:
        raise invalid(str(e), "pass finite weights of matching shapes ([out, in]) and a known --activation") from e
    raise invalid(f"{str(path)!r} has keys {sorted(arrays)}; expected W1, b1, W2, b2 (MLP) or W, b, V, c[, W2, b2] "
                  "(GLU)", _WEIGHTS_FIX)


def _npy(name: str, file: Path, shape: tuple[int, ...], d: int) -> np.ndarray:
    """The array of ``--mean``/``--cov`` ``file``, of ``shape``; ``ValueError`` naming the option otherwise."""
    what = "the mean [d_in]" if name == "--mean" else "the covariance [d_in, d_in]"
    fix = f"pass a .npy file written by numpy.save holding {what} with d_in = {d}, the network's input size"
    try:
        arr = np.load(file, allow_pickle=False)
    except EOFError:  # an empty file (click would report an EOFError as a bare "Aborted.")
        raise invalid(f"{name} {str(file)!r} is an empty file, not a .npy array", fix) from None
    except (ValueError, OSError) as e:
        raise invalid(f"{name}: cannot read {str(file)!r} as a .npy array ({e})", fix) from e
    if not isinstance(arr, np.ndarray):  # .npz archives load as NpzFile
        if hasattr(arr, "close"):
            arr.close()
        raise invalid(f"{name} {str(file)!r} must be a .npy file holding one array, got a {type(arr).__name__} "
                      "(.npz?)", fix)
    if arr.size == 0:
        raise invalid(f"{name} {str(file)!r} holds an empty array (shape {list(arr.shape)})", fix)
    if arr.shape != shape:
        raise invalid(f"{name[2:]} must have shape {list(shape)} (the network's d_in = {d}), got {list(arr.shape)} in "
                      f"{str(file)!r}", fix)
    return arr


def _distribution(cmd: ApproxCommand, d: int):
    """The input law of ``cmd`` for a network of input size ``d``."""
    from mlpinterp.gaussian.distributions import Gaussian, GaussianMixture

    if cmd.mean is not None:
        arrays = [_npy("--mean", cmd.mean, (d,), d), _npy("--cov", cmd.cov, (d, d), d)]
        try:
            return Gaussian(*arrays)
        except (ValueError, TypeError) as e:
            raise invalid(f"--mean/--cov: {e}", "pass a finite mean and a symmetric positive semi-definite "
                                                "covariance") from e
    if cmd.distribution == "standard":
        return Gaussian.standard(d)
    from mlpinterp.data import load_dataset

    with expected_errors("pass --data DIR holding the dataset's files (or set $MLPINTERP_DATA)"):
        data = load_dataset(cmd.dataset, cmd.data)
    mix = GaussianMixture.from_labels(data.X_train, data.y_train, shrinkage="ledoit-wolf")
    return mix if cmd.distribution == "mixture" else mix.pooled()


def _refuse_out_over_input(out: Path, weights: Path) -> None:
    """``approx --out`` writes ``OUT.safetensors`` and ``OUT.json``: refuse when either is the weights file or the
    sidecar of a checkpoint (``step_N.json``), which the approximant would overwrite."""
    from mlpinterp.utils.artifact import tensors_path

    written = tensors_path(out)
    src = weights.resolve()
    inputs = {src, src.with_suffix(".json")}
    clash = [str(p) for p in (written, written.with_suffix(".json")) if p.resolve() in inputs]
    if clash:
        fail(f"--out {str(out)!r} would overwrite the network being approximated ({', '.join(clash)})",
             "pass an --out path outside the weights file and its .json, e.g. --out approx/degree2")


@config_options(ApproxCommand)
def approx(cfg: ApproxCommand) -> None:
    """Compute the exact least-squares polynomial approximant of a network and print its FVU."""
    from mlpinterp.poly.fit import fit_polynomial
    from mlpinterp.poly.metrics import fvu
    from mlpinterp.utils.console import console

    if cfg.out is not None:
        _refuse_out_over_input(cfg.out, cfg.weights)
    net, _ = load_network(cfg.weights, cfg.activation)
    dist = _distribution(cfg, net.d_in)
    try:
        p = fit_polynomial(net, dist, cfg.degree)
    except TypeError as e:  # a network or law the solvers do not take: named by the library
        raise invalid(str(e)) from e
    try:
        r = fvu(net, p, dist, n_samples=cfg.samples, method=cfg.fvu_method)
    except ValueError as e:
        raise invalid(str(e).replace("n_samples", "--samples"), getattr(e, "fix", None)) from e
    con = console()
    se = f" ± {r.stderr:.2e} (Monte Carlo, {r.n_samples} samples)" if r.method == "monte-carlo" else \
        f" (exact, numerical error <= {r.error_bound:.1e})"
    con.print(f"degree-{cfg.degree} approximant of a {type(net).__name__} (d_in={net.d_in}, d_hidden={net.d_hidden}, "
              f"d_out={net.d_out}): FVU = {r.fvu:.6f}{se}")
    if cfg.out is not None:
        import hashlib

        from mlpinterp.utils.reprs import digest

        arrays = [getattr(dist, n) for n in ("mean", "cov", "weights", "means", "covs") if hasattr(dist, n)]
        provenance = {"weights_sha256": hashlib.sha256(cfg.weights.read_bytes()).hexdigest(),
                      "distribution": f"{type(dist).__name__}:{digest(*arrays, length=32)}", "degree": cfg.degree}
        with expected_errors("pass an --out path in a writable directory"):
            path = p.save(cfg.out, provenance=provenance)
        con.print(f"wrote {path} and {path.with_suffix('.json')}")


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``approx``."""
    add_command(app, "approx", approx)
