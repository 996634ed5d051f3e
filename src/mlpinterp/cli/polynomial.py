"""CLI for the function-space part: ``mlpinterp approx``, ``mlpinterp train``, ``mlpinterp reproduce polynomial``."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from mlpinterp.cli.errors import expected_errors, fail
from mlpinterp.cli.options import THREADS_DEFAULT, Device, Quiet, Threads, _non_empty, flag, set_threads
from mlpinterp.models.config import ClassifierConfig
from mlpinterp.studies.polynomial.settings import DATASET_DEFAULTS, SMOKE, PolynomialReproConfig
from mlpinterp.utils.config_diff import ABSENT, saved_value
from mlpinterp.utils.config_docs import field_default, field_docs


class DatasetName(StrEnum):
    digits = "digits"
    mnist = "mnist"
    fashion_mnist = "fashion-mnist"


class DistName(StrEnum):
    standard = "standard"
    gaussian = "gaussian"
    mixture = "mixture"


def _console():
    from mlpinterp.utils.console import console

    return console()


_CLS = field_docs(ClassifierConfig)
_REPRO = field_docs(PolynomialReproConfig)


def _g(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _per_dataset(key: str) -> str:
    """``0.005`` or ``digits 256, mnist 512, ...`` from ``DATASET_DEFAULTS`` (shown as the option's default)."""
    vals = {name: d[key] for name, d in DATASET_DEFAULTS.items()}
    if len(set(vals.values())) == 1:
        return _g(next(iter(vals.values())))
    return ", ".join(f"{n} {_g(v)}" for n, v in vals.items())


_SMOKE_HELP = ", ".join(f"{k} {_g(v)}" for k, v in SMOKE.items())

#: config field -> the CLI option that sets it (for the fix of a resume conflict)
_FLAGS = {"d_hidden": "--d-hidden", "arch": "--arch", "activation": "--activation", "lr": "--lr",
          "warmup_steps": "--warmup-steps", "seed": "--seed", "dataset": "--dataset", "mc_samples": "--mc-samples",
          "covariance": "--covariance", "quadratic_mixture_steps": "--quadratic-mixture-steps", "smoke": "--quick",
          "mixture_cg_dtype": "--mixture-cg-dtype", "max_image_side": "--max-image-side"}


def _conflict_fix(e, out: Path) -> str:
    """How to continue the run in ``out`` (its saved settings as CLI options) or start a new one; a setting the run
    was written before has the value of that time."""
    if "command" in e.diff:  # another command's run: its settings are not this command's options
        saved = saved_value(e.diff["command"][0])
        return (f"{str(out)!r} holds a run of `mlpinterp {saved}`: continue it with that command, or pass another "
                f"--out (or delete {str(out)!r}) to start a new run")
    opts, other = [], []
    for k, (saved, _) in sorted(e.diff.items()):
        if saved is ABSENT:  # the saved run never had this setting: nothing to pass
            continue
        saved = saved_value(saved)
        flag = _FLAGS.get(k)
        if flag is None:
            other.append(f"{k}={saved!r}")
        elif isinstance(saved, bool) or saved is None:
            opts.append(flag if saved else f"(no {flag})")
        else:
            opts.append(f"{flag} {saved}")
    cont = f"rerun with {' '.join(opts)}" if opts else ""
    if other:
        cont += (" and " if cont else "") + f"settings without a CLI option ({', '.join(other)}: Python API)"
    return f"to continue the run in {str(out)!r} {cont}; to start a new run pass another --out (or delete {str(out)!r})"


def _check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise typer.BadParameter(f"{str(out)!r} exists and is not a directory; pass a directory", param_hint="--out")


def _warmup_notice(warmup_steps: int, steps: int, lr: float) -> None:
    if warmup_steps > steps:
        _console().print(f"note: --warmup-steps {warmup_steps} > --steps {steps}: the learning rate ramps up for the "
                         f"whole run and reaches {warmup_steps and steps / warmup_steps:.0%} of its peak {lr:g} "
                         "(not clamped, so the run can later be extended with a larger --steps)")


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
        from mlpinterp.utils.artifact import artifact_kind, read_safetensors
        from mlpinterp.utils.io import read_json

        kind = artifact_kind(path)
        if kind == "classifier_checkpoint":
            from mlpinterp.models import load_classifier

            try:
                model, meta = load_classifier(path)
                return model.to_network(), meta
            except (ValueError, TypeError, KeyError, FileNotFoundError) as e:
                raise typer.BadParameter(str(e), param_hint="WEIGHTS") from e
        if kind is not None:
            raise typer.BadParameter(f"{str(path)!r} is an mlpinterp {kind!r} artifact, not network weights; pass a "
                                     "classifier checkpoint (step_N.safetensors) or a file of raw weights",
                                     param_hint="WEIGHTS")
        try:
            tensors, _ = read_safetensors(path, what="weights file")
            meta_path = path.with_suffix(".json")
            meta = read_json(meta_path, what="weights metadata", fix=None) if meta_path.is_file() else {}
        except ValueError as e:
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
        if kind != DistName.standard or dataset is not None:
            given = f"--distribution {kind.value}" + (f" --dataset {dataset.value}" if dataset is not None else "")
            fail(f"--mean/--cov define the input law, so {given} would be ignored",
                 "pass either --mean and --cov, or --distribution gaussian|mixture with --dataset")
        arrays = []
        for name, file in (("--mean", mean), ("--cov", cov)):
            try:
                arr = np.load(file, allow_pickle=False)
            except EOFError:  # an empty file (click would report an EOFError as a bare "Aborted.")
                fail(f"{name} {str(file)!r} is an empty file, not a .npy array",
                     f"pass a .npy file written by numpy.save (the mean [d_in = {d}], the covariance [{d}, {d}])")
            except (ValueError, OSError) as e:
                raise typer.BadParameter(f"cannot read {str(file)!r} as a .npy array ({e})", param_hint=name) from e
            if not isinstance(arr, np.ndarray):  # .npz archives load as NpzFile
                if hasattr(arr, "close"):
                    arr.close()
                raise typer.BadParameter(
                    f"{str(file)!r} must be a .npy file holding one array, got a {type(arr).__name__} (.npz?)",
                    param_hint=name,
                )
            if arr.size == 0:
                fail(f"{name} {str(file)!r} holds an empty array (shape {list(arr.shape)})",
                     f"pass the {'mean [d_in]' if name == '--mean' else 'covariance [d_in, d_in]'} with d_in = {d}, "
                     "the network's input size")
            want = (d,) if name == "--mean" else (d, d)
            if arr.shape != want:
                raise typer.BadParameter(f"{name[2:]} must have shape {list(want)} (the network's d_in = {d}), got "
                                         f"{list(arr.shape)} in {str(file)!r}", param_hint=name)
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

    with expected_errors("pass --data-path DIR holding the dataset's files (or set $MLPINTERP_DATA)"):
        data = load_dataset(dataset.value, data_path)
    mix = GaussianMixture.from_labels(data.X_train, data.y_train, shrinkage="ledoit-wolf")
    return mix if kind == DistName.mixture else mix.pooled()


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


def approx(
    weights: Annotated[Path, typer.Argument(help="Network weights: a classifier checkpoint (step_*.safetensors), "
                                             "or a .safetensors/.npz with W1,b1,W2,b2 (MLP) or W,b,V,c[,W2,b2] (GLU).")],
    degree: Annotated[int, typer.Option(help="Total degree of the polynomial (0, 1, 2, 3, ...).")] = 2,
    activation: Annotated[str | None, typer.Option(help="Activation for raw weight files: relu, gelu, silu, tanh, ...")] = None,
    distribution: Annotated[DistName, typer.Option(help="Input law: standard = N(0, I); gaussian = moment-matched "
                                                   "Gaussian of --dataset; mixture = its class-conditional mixture (Ledoit-Wolf class covariances).")] = DistName.standard,
    mean: Annotated[Path | None, typer.Option(help="A .npy file with the Gaussian mean \\[d_in] (with --cov).")] = None,
    cov: Annotated[Path | None, typer.Option(help="A .npy file with the Gaussian covariance \\[d_in, d_in].")] = None,
    dataset: Annotated[DatasetName | None, typer.Option(help="Dataset whose moments define the input law.")] = None,
    data_path: Annotated[Path | None, typer.Option(help="Directory with the dataset's IDX files.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the approximant here (.safetensors + .json).")] = None,
    samples: Annotated[int, typer.Option(help="Monte Carlo samples when the FVU has no closed form.")] = 100_000,
) -> None:
    """Compute the exact least-squares polynomial approximant of a network and print its FVU."""
    from mlpinterp.poly.fit import fit_polynomial
    from mlpinterp.poly.metrics import fvu

    if out is not None:
        _refuse_out_over_input(out, weights)
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
        import hashlib

        from mlpinterp.utils.reprs import digest

        arrays = [getattr(dist, n) for n in ("mean", "cov", "weights", "means", "covs") if hasattr(dist, n)]
        provenance = {"weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
                      "distribution": f"{type(dist).__name__}:{digest(*arrays, length=32)}", "degree": degree}
        with expected_errors("pass an --out path in a writable directory"):
            path = p.save(out, provenance=provenance)
        con.print(f"wrote {path} and {path.with_suffix('.json')}")


def train(
    out: Annotated[Path, typer.Option("--out", callback=_non_empty, metavar="DIR",
                                      help="Checkpoint directory (a run directory: locked while in use; re-running "
                                           "resumes; a larger --steps extends a finished run).")] = Path("runs/train"),
    dataset: Annotated[DatasetName, typer.Option(help="Training data.")] = DatasetName.digits,
    data_path: Annotated[Path | None, typer.Option(help="Directory with the dataset's IDX files.")] = None,
    d_hidden: Annotated[int | None, typer.Option(help=f"{_CLS['d_hidden']}",
                                                 show_default=_per_dataset("d_hidden"))] = None,
    arch: Annotated[str, typer.Option(help=_CLS["arch"])] = field_default(ClassifierConfig, "arch"),
    activation: Annotated[str, typer.Option(help=_CLS["activation"])] = field_default(ClassifierConfig, "activation"),
    lr: Annotated[float | None, typer.Option(help=_CLS["lr"], show_default=_per_dataset("lr"))] = None,
    steps: Annotated[int | None, typer.Option(help=f"{_CLS['steps']}",
                                              show_default=_per_dataset("steps"))] = None,
    warmup_steps: Annotated[int, typer.Option(help=_CLS["warmup_steps"])] = field_default(ClassifierConfig,
                                                                                          "warmup_steps"),
    seed: Annotated[int, typer.Option(help=_CLS["seed"])] = field_default(ClassifierConfig, "seed"),
    quiet: Quiet = False,
    threads: Threads = THREADS_DEFAULT,
    device: Device = "cpu",
) -> None:
    """Train a one-hidden-layer classifier with log-spaced, atomic, resumable checkpoints."""
    from mlpinterp.data import load_dataset
    from mlpinterp.models import RunConflictError, find_checkpoints, train_classifier

    _check_out_dir(out)
    defaults = DATASET_DEFAULTS[dataset.value]
    d_hidden = defaults["d_hidden"] if d_hidden is None else d_hidden
    lr = defaults["lr"] if lr is None else lr
    steps = defaults["steps"] if steps is None else steps
    with expected_errors("pass --data-path DIR holding the dataset's files (or set $MLPINTERP_DATA)"):
        data = load_dataset(dataset.value, data_path)
    try:
        cfg = ClassifierConfig(d_in=data.d_in, n_classes=data.n_classes, d_hidden=d_hidden, arch=arch,
                               activation=activation, lr=lr, steps=steps, warmup_steps=warmup_steps, seed=seed)
    except (ValueError, TypeError) as e:
        raise typer.BadParameter(str(e)) from e
    _warmup_notice(warmup_steps, steps, lr)
    before = [s for s, _ in find_checkpoints(out)]
    with expected_errors():  # the library's messages name the file and say what to delete
        try:
            paths = train_classifier(cfg, data, out, progress=not quiet, threads=threads, device=device)
        except RunConflictError as e:
            fail(e.problem, _conflict_fix(e, out))
    done_before = [s for s in before if s <= steps]
    if before and max(before) >= steps:
        what = f"already trained: nothing to do (the run in {out} reaches step {max(before)})"
    elif done_before:
        what = f"resumed at step {max(done_before)}, trained to step {steps}"
    else:
        what = f"trained to step {steps}"
    _console().print(f"{len(paths)} checkpoints in {out}: {what}")


def reproduce_polynomial(
    dataset: Annotated[DatasetName, typer.Option(help=_REPRO["dataset"])] = DatasetName.digits,
    seeds: Annotated[int, typer.Option(help=_REPRO["seeds"] + " Error bands are mean ± std; one seed shows none.")
                     ] = field_default(PolynomialReproConfig, "seeds"),
    out: Annotated[Path, typer.Option("--out", callback=_non_empty, metavar="DIR",
                                      help="Output directory (a run directory: locked while in use; re-running "
                                           "resumes; more --seeds or another --steps extend it).")
                   ] = Path("runs/polynomial"),
    steps: Annotated[int | None, typer.Option(help="Training steps.",
                                              show_default=_per_dataset("steps"))] = None,
    d_hidden: Annotated[int | None, typer.Option(help="Hidden width.",
                                                 show_default=_per_dataset("d_hidden"))] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate of schedule-free AdamW.",
                                             show_default=_per_dataset("lr"))] = None,
    arch: Annotated[str, typer.Option(help=_REPRO["arch"])] = field_default(PolynomialReproConfig, "arch"),
    activation: Annotated[str, typer.Option(help=_REPRO["activation"])] = field_default(PolynomialReproConfig,
                                                                                       "activation"),
    warmup_steps: Annotated[int, typer.Option(help=_REPRO["warmup_steps"])] = field_default(PolynomialReproConfig,
                                                                                           "warmup_steps"),
    mc_samples: Annotated[int | None, typer.Option(help="Monte Carlo samples under the mixture.",
                                                   show_default=_per_dataset("mc_samples"))] = None,
    covariance: Annotated[str, typer.Option(help=_REPRO["covariance"])] = field_default(PolynomialReproConfig,
                                                                                       "covariance"),
    quadratic_mixture_steps: Annotated[str, typer.Option(help=_REPRO["quadratic_mixture_steps"])] = field_default(
        PolynomialReproConfig, "quadratic_mixture_steps"),
    mixture_cg_dtype: Annotated[str, typer.Option(help=_REPRO["mixture_cg_dtype"])] = field_default(
        PolynomialReproConfig, "mixture_cg_dtype"),
    max_image_side: Annotated[int | None, typer.Option(help=_REPRO["max_image_side"], show_default="full size")] = None,
    data_path: Annotated[Path | None, typer.Option(help="Directory with the dataset's IDX files.")] = None,
    quick: Annotated[bool, flag("--quick/--no-quick", help=f"{_REPRO['smoke']} Sets {_SMOKE_HELP}; its report draws "
                                                             "no verdict.")] = False,
    smoke: Annotated[bool, flag("--smoke", help="Old spelling of --quick.", hidden=True)] = False,
    quiet: Quiet = False,
    threads: Threads = THREADS_DEFAULT,
) -> None:
    """Train, convert every checkpoint into exact polynomial approximants, and write figures + report."""
    from mlpinterp.models import RunConflictError
    from mlpinterp.studies.polynomial.run import run_polynomial_repro

    _check_out_dir(out)
    set_threads(threads)
    smoke = quick or smoke
    try:
        cfg = PolynomialReproConfig(dataset=dataset.value, seeds=seeds, steps=steps, d_hidden=d_hidden, lr=lr, arch=arch,
                                    activation=activation, warmup_steps=warmup_steps, mc_samples=mc_samples,
                                    covariance=covariance, quadratic_mixture_steps=quadratic_mixture_steps,
                                    mixture_cg_dtype=mixture_cg_dtype, max_image_side=max_image_side,
                                    data_path=str(data_path) if data_path else None, smoke=smoke)
        r = cfg.resolved()
    except (ValueError, TypeError) as e:
        raise typer.BadParameter(str(e)) from e
    _warmup_notice(r["warmup_steps"], r["steps"], r["lr"])
    with expected_errors():  # messages name the file (corrupt: delete it) or the missing data and how to get it
        try:
            res = run_polynomial_repro(cfg, out, quiet=quiet, threads=threads)
        except RunConflictError as e:
            fail(e.problem, _conflict_fix(e, out))
    _print_summary(res, out)


def _print_summary(res: dict, out: Path) -> None:
    from rich.table import Table

    from mlpinterp.studies.polynomial.report import _stat

    con = _console()
    n = res["seeds"]
    spread = f"mean ± std over {n} seeds" if n > 1 else "one seed: no spread"
    smoke = " - quick run, not a reproduction" if res["config"].get("smoke") else ""
    t = Table(title=f"{res['dataset']['name']}: final checkpoint ({spread}){smoke}")
    for col in ("approximant", "FVU mixture", "FVU test", "KL test [nats]", "test acc"):
        t.add_column(col)
    for name, d in res["final"].items():
        if name == "network":
            t.add_row("network", "—", "—", "—", _stat(d["test_accuracy"]).format(".3f", n=n))
            continue
        t.add_row(name, *(_stat(d[m]).format(".4f", n=n) for m in ("fvu_mixture", "fvu_test", "kl_test",
                                                                   "test_accuracy")))
    con.print(t)
    c = Table(title="Paper claims")
    for col in ("claim", "ours", "verdict"):
        c.add_column(col)
    for r in res["claims"]:
        c.add_row(r["claim"], r["ours"], r["verdict"] + (f": {r['reason']}" if r.get("reason") else ""))
    con.print(c)
    con.print(f"report: {out / 'report.md'}  ({out / 'report.html'}, figures in {out / 'figures'})")


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``approx``, ``train`` and ``reproduce polynomial``."""
    app.command("approx")(approx)
    app.command("train")(train)
    reproduce_app.command("polynomial")(reproduce_polynomial)
