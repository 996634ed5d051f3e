"""CLI for the function-space part: ``mlpinterp approx``, ``mlpinterp train``, ``mlpinterp reproduce polynomial``."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import numpy as np
import typer


class DatasetName(StrEnum):
    digits = "digits"
    mnist = "mnist"
    fashion_mnist = "fashion-mnist"


class DistName(StrEnum):
    standard = "standard"
    gaussian = "gaussian"
    mixture = "mixture"


def _console():
    from rich.console import Console

    return Console()


def load_network(path: Path, activation: str | None):
    """Load weights from a classifier checkpoint, a safetensors file or an ``.npz``.

    Keys ``W1, b1, W2, b2`` give an MLP; ``W, b, V, c[, W2, b2]`` a GLU. Raises ``typer.BadParameter``.
    """
    from mlpinterp.networks import GLU, MLP

    if not path.exists():
        raise typer.BadParameter(f"weights file {str(path)!r} does not exist", param_hint="WEIGHTS")
    meta: dict = {}
    if path.suffix == ".npz":
        try:
            with np.load(path) as z:
                arrays = {k: z[k] for k in z.files}
        except Exception as e:  # noqa: BLE001 - numpy raises several types on corrupt archives
            raise typer.BadParameter(f"{str(path)!r} is not a valid .npz file ({e})", param_hint="WEIGHTS") from e
    elif path.suffix == ".safetensors":
        from mlpinterp.utils.io import load_tensors

        try:
            tensors, meta = load_tensors(path)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="WEIGHTS") from e
        if not isinstance(meta, dict):
            raise typer.BadParameter(
                f"metadata of {str(path)!r} must be a JSON object, got {type(meta).__name__}", param_hint="WEIGHTS"
            )
        fmt = meta.get("format")
        if fmt is not None and not isinstance(fmt, str):
            raise typer.BadParameter(
                f"metadata 'format' of {str(path)!r} must be a string, got {fmt!r}", param_hint="WEIGHTS"
            )
        if (fmt or "").startswith("mlpinterp.classifier"):
            from mlpinterp.models import load_classifier

            try:
                model, _ = load_classifier(path)
                return model.to_network(), meta
            except (ValueError, TypeError, KeyError, FileNotFoundError) as e:
                raise typer.BadParameter(str(e), param_hint="WEIGHTS") from e
        arrays = {k: v.double().numpy() for k, v in tensors.items()}
    else:
        raise typer.BadParameter(f"expected a .safetensors or .npz file, got {path.name!r}", param_hint="WEIGHTS")
    act = activation or meta.get("activation")
    if act is None:
        raise typer.BadParameter("--activation is required for raw weight files", param_hint="--activation")
    try:
        if {"W1", "b1", "W2", "b2"} <= arrays.keys():
            return MLP(arrays["W1"], arrays["b1"], arrays["W2"], arrays["b2"], act), meta
        if {"W", "V"} <= arrays.keys():
            return GLU(arrays["W"], arrays.get("b"), arrays["V"], arrays.get("c"), arrays.get("W2"), arrays.get("b2"),
                       act), meta
    except (ValueError, TypeError) as e:
        raise typer.BadParameter(str(e), param_hint="WEIGHTS") from e
    raise typer.BadParameter(
        f"{str(path)!r} has keys {sorted(arrays)}; expected W1, b1, W2, b2 (MLP) or W, b, V, c[, W2, b2] (GLU)",
        param_hint="WEIGHTS",
    )


def _distribution(kind: DistName, d: int, mean: Path | None, cov: Path | None, dataset: DatasetName | None,
                  data_path: Path | None):
    from mlpinterp.gaussian.distributions import Gaussian, GaussianMixture

    if mean is not None or cov is not None:
        if mean is None or cov is None:
            raise typer.BadParameter("--mean and --cov must be given together", param_hint="--mean/--cov")
        arrays = []
        for name, file in (("--mean", mean), ("--cov", cov)):
            try:
                arr = np.load(file, allow_pickle=False)
            except (ValueError, OSError) as e:
                raise typer.BadParameter(f"cannot read {str(file)!r} as a .npy array ({e})", param_hint=name) from e
            if not isinstance(arr, np.ndarray):  # .npz archives load as NpzFile
                if hasattr(arr, "close"):
                    arr.close()
                raise typer.BadParameter(
                    f"{str(file)!r} must be a .npy file holding one array, got a {type(arr).__name__} (.npz?)",
                    param_hint=name,
                )
            arrays.append(arr)
        try:
            return Gaussian(*arrays)
        except (ValueError, TypeError) as e:
            raise typer.BadParameter(str(e), param_hint="--mean/--cov") from e
    if kind == DistName.standard:
        return Gaussian.standard(d)
    if dataset is None:
        raise typer.BadParameter(f"--distribution {kind.value} needs --dataset", param_hint="--dataset")
    from mlpinterp.data import load_dataset

    data = load_dataset(dataset.value, data_path)
    mix = GaussianMixture.from_labels(data.X_train, data.y_train, shrinkage="ledoit-wolf")
    return mix if kind == DistName.mixture else mix.pooled()


def approx(
    weights: Annotated[Path, typer.Argument(help="Network weights: a classifier checkpoint (step_*.safetensors), "
                                             "or a .safetensors/.npz with W1,b1,W2,b2 (MLP) or W,b,V,c[,W2,b2] (GLU).")],
    degree: Annotated[int, typer.Option(help="Total degree of the polynomial (0, 1, 2, 3, ...).")] = 2,
    activation: Annotated[str | None, typer.Option(help="Activation for raw weight files: relu, gelu, silu, tanh, ...")] = None,
    distribution: Annotated[DistName, typer.Option(help="Input law: standard = N(0, I); gaussian = moment-matched "
                                                   "Gaussian of --dataset; mixture = its class-conditional mixture (Ledoit-Wolf class covariances).")] = DistName.standard,
    mean: Annotated[Path | None, typer.Option(help="A .npy file with the Gaussian mean [d_in] (with --cov).")] = None,
    cov: Annotated[Path | None, typer.Option(help="A .npy file with the Gaussian covariance [d_in, d_in].")] = None,
    dataset: Annotated[DatasetName | None, typer.Option(help="Dataset whose moments define the input law.")] = None,
    data_path: Annotated[Path | None, typer.Option(help="Directory with the dataset's IDX files.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the approximant here (.safetensors + .json).")] = None,
    samples: Annotated[int, typer.Option(help="Monte Carlo samples when the FVU has no closed form.")] = 100_000,
) -> None:
    """Compute the exact least-squares polynomial approximant of a network and print its FVU."""
    from mlpinterp.poly.fit import fit_polynomial
    from mlpinterp.poly.metrics import fvu

    net, _ = load_network(weights, activation)
    dist = _distribution(distribution, net.d_in, mean, cov, dataset, data_path)
    try:
        p = fit_polynomial(net, dist, degree)
    except (ValueError, TypeError) as e:
        raise typer.BadParameter(str(e)) from e
    try:
        r = fvu(net, p, dist, n_samples=samples)
    except ValueError as e:
        hint = "--samples" if "n_samples" in str(e) else None
        raise typer.BadParameter(str(e).replace("n_samples", "--samples"), param_hint=hint) from e
    con = _console()
    se = f" ± {r.stderr:.2e} (Monte Carlo, {r.n_samples} samples)" if r.method == "monte-carlo" else \
        f" (exact, numerical error <= {r.error_bound:.1e})"
    con.print(f"degree-{degree} approximant of a {type(net).__name__} (d_in={net.d_in}, d_hidden={net.d_hidden}, "
              f"d_out={net.d_out}): FVU = {r.fvu:.6f}{se}")
    if out is not None:
        path = p.save(out)
        con.print(f"wrote {path} and {path.with_suffix('.json')}")


def train(
    out: Annotated[Path, typer.Option(help="Checkpoint directory (re-running resumes).")],
    dataset: Annotated[DatasetName, typer.Option(help="Training data.")] = DatasetName.digits,
    data_path: Annotated[Path | None, typer.Option(help="Directory with the dataset's IDX files.")] = None,
    d_hidden: Annotated[int, typer.Option(help="Hidden width.")] = 256,
    arch: Annotated[str, typer.Option(help="mlp or glu.")] = "mlp",
    activation: Annotated[str, typer.Option(help="relu, gelu, silu, tanh or identity (glu: gate).")] = "relu",
    lr: Annotated[float, typer.Option(help="Peak learning rate (schedule-free AdamW).")] = 2e-3,
    steps: Annotated[int, typer.Option(help="Training steps.")] = 8192,
    warmup_steps: Annotated[int, typer.Option(help="Warm-up steps.")] = 1000,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Train a one-hidden-layer classifier with log-spaced, atomic, resumable checkpoints."""
    from mlpinterp.data import load_dataset
    from mlpinterp.models import ClassifierConfig, train_classifier

    data = load_dataset(dataset.value, data_path)
    try:
        cfg = ClassifierConfig(d_in=data.d_in, n_classes=data.n_classes, d_hidden=d_hidden, arch=arch,
                               activation=activation, lr=lr, steps=steps, warmup_steps=min(warmup_steps, steps), seed=seed)
    except (ValueError, TypeError) as e:
        raise typer.BadParameter(str(e)) from e
    paths = train_classifier(cfg, data, out, progress=not quiet)
    _console().print(f"{len(paths)} checkpoints in {out}")


def reproduce_polynomial(
    dataset: Annotated[DatasetName, typer.Option(help="digits (bundled, no download), mnist or fashion-mnist.")] = DatasetName.digits,
    seeds: Annotated[int, typer.Option(help="Number of training seeds (error bands are mean ± std).")] = 3,
    out: Annotated[Path, typer.Option(help="Output directory (re-running resumes).")] = Path("runs/polynomial"),
    steps: Annotated[int | None, typer.Option(help="Training steps (default 8192).")] = None,
    d_hidden: Annotated[int | None, typer.Option(help="Hidden width (default: digits 256, MNIST 512).")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate (default 2e-3).")] = None,
    arch: Annotated[str, typer.Option(help="mlp or glu.")] = "mlp",
    activation: Annotated[str, typer.Option(help="Hidden activation (glu: gate).")] = "relu",
    mc_samples: Annotated[int | None, typer.Option(help="Monte Carlo samples under the mixture.")] = None,
    covariance: Annotated[str, typer.Option(help="Class covariance estimator: ledoit-wolf (full rank) or empirical "
                                            "(singular on real images).")] = "ledoit-wolf",
    quadratic_mixture_steps: Annotated[str, typer.Option(help="Checkpoints that get the exact mixture quadratic: "
                                                         "all, final, or auto (all on digits, final on MNIST).")] = "auto",
    data_path: Annotated[Path | None, typer.Option(help="Directory with the dataset's IDX files.")] = None,
    smoke: Annotated[bool, typer.Option("--smoke", help="Tiny configuration for CI (seconds).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bars.")] = False,
) -> None:
    """Train, convert every checkpoint into exact polynomial approximants, and write figures + report."""
    from mlpinterp.experiments.polynomial_repro import PolynomialReproConfig, run_polynomial_repro

    try:
        cfg = PolynomialReproConfig(dataset=dataset.value, seeds=seeds, steps=steps, d_hidden=d_hidden, lr=lr, arch=arch,
                                    activation=activation, mc_samples=mc_samples, covariance=covariance,
                                    quadratic_mixture_steps=quadratic_mixture_steps,
                                    data_path=str(data_path) if data_path else None, smoke=smoke)
        cfg.resolved()
    except (ValueError, TypeError) as e:
        raise typer.BadParameter(str(e)) from e
    res = run_polynomial_repro(cfg, out, quiet=quiet)
    _print_summary(res, out)


def _print_summary(res: dict, out: Path) -> None:
    from rich.table import Table

    con = _console()
    t = Table(title=f"{res['dataset']['name']}: final checkpoint (mean ± std over {res['seeds']} seeds)")
    for col in ("approximant", "FVU mixture", "FVU test", "KL test [nats]", "test acc"):
        t.add_column(col)
    for name, d in res["final"].items():
        if name == "network":
            t.add_row("network", "", "", "", f"{d['test_accuracy']['mean']:.3f} ± {d['test_accuracy']['std']:.3f}")
            continue
        t.add_row(name, *(f"{d[m]['mean']:.4f} ± {d[m]['std']:.4f}" for m in ("fvu_mixture", "fvu_test", "kl_test",
                                                                              "test_accuracy")))
    con.print(t)
    c = Table(title="Paper claims")
    for col in ("claim", "ours", "verdict"):
        c.add_column(col)
    for r in res["claims"]:
        c.add_row(r["claim"], r["ours"], r["verdict"])
    con.print(c)
    con.print(f"report: {out / 'report.md'}  ({out / 'report.html'}, figures in {out / 'figures'})")


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``approx``, ``train`` and ``reproduce polynomial``."""
    app.command("approx")(approx)
    app.command("train")(train)
    reproduce_app.command("polynomial")(reproduce_polynomial)
