"""CLI: ``mlpinterp train`` (a one-hidden-layer classifier, resumable checkpoints) and ``mlpinterp reproduce
polynomial`` (Rigg & Belrose 2025 end to end)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import typer

from mlpinterp.cli.config_options import CommandConfig, add_command, cli_fields, config_options, option, option_name
from mlpinterp.cli.errors import expected_errors, fail
from mlpinterp.cli.options import Device, Out, Quiet, Threads, out_dir, set_threads
from mlpinterp.data.dataset import check_data_path
from mlpinterp.models.config import ClassifierConfig
from mlpinterp.studies.polynomial.settings import DATASET_DEFAULTS, PolynomialReproConfig
from mlpinterp.utils.config_diff import ABSENT, saved_value
from mlpinterp.utils.config_docs import field_default


def _console():
    from mlpinterp.utils.console import console

    return console()


def _g(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _per_dataset(key: str) -> str:
    """``0.005`` or ``digits 256, mnist 512, ...`` from ``DATASET_DEFAULTS`` (shown as the option's default)."""
    vals = {name: d[key] for name, d in DATASET_DEFAULTS.items()}
    if len(set(vals.values())) == 1:
        return _g(next(iter(vals.values())))
    return ", ".join(f"{n} {_g(v)}" for n, v in vals.items())


_PER_DATASET = {k: _per_dataset(k) for k in ("d_hidden", "lr", "steps", "mc_samples")}
"""The defaults shown for the options whose default depends on ``--dataset``."""


@dataclass(frozen=True, kw_only=True)
class TrainCommand(CommandConfig, Out, Quiet, Threads, Device):
    """Inputs of ``mlpinterp train``: a :class:`~mlpinterp.models.config.ClassifierConfig` whose input size comes
    from the dataset and whose width, learning rate and steps default to the dataset's (``DATASET_DEFAULTS``)."""

    out: Path = out_dir("runs/train")
    """Checkpoint directory (a run directory: locked while in use; re-running resumes; a larger --steps extends a
    finished run)."""
    dataset: Literal["digits", "mnist", "fashion-mnist"] = "digits"
    """Training data: digits (bundled with scikit-learn), mnist or fashion-mnist (IDX files)."""
    data: Path | None = option(None, aliases=("--data-path",), metavar="DIR")
    """Directory with the dataset's IDX files (default: $MLPINTERP_DATA/<dataset> or ../shared/data/<dataset>)."""
    d_hidden: int | None = option(None, show_default=_PER_DATASET["d_hidden"])
    """Hidden width: number of neurons (mlp) or of gated units (glu)."""
    arch: Literal["mlp", "glu"] = field_default(ClassifierConfig, "arch")
    """mlp or glu."""
    activation: Literal["relu", "gelu", "silu", "tanh", "identity"] = field_default(ClassifierConfig, "activation")
    """Hidden activation; for glu the gate activation."""
    lr: float | None = option(None, show_default=_PER_DATASET["lr"])
    """Peak learning rate of schedule-free AdamW."""
    steps: int | None = option(None, show_default=_PER_DATASET["steps"])
    """Total optimisation steps."""
    warmup_steps: int = field_default(ClassifierConfig, "warmup_steps")
    """Linear learning-rate warm-up steps."""
    seed: int = field_default(ClassifierConfig, "seed")
    """Seed of the initialisation and of the batch order."""

    def resolved(self) -> dict:
        """Width, learning rate and steps, the dataset's where not given."""
        d = DATASET_DEFAULTS[self.dataset]
        return {k: d[k] if getattr(self, k) is None else getattr(self, k) for k in ("d_hidden", "lr", "steps")}

    def classifier(self, d_in: int, n_classes: int) -> ClassifierConfig:
        """The classifier configuration for data of ``d_in`` inputs and ``n_classes`` classes."""
        return ClassifierConfig(d_in=d_in, n_classes=n_classes, arch=self.arch, activation=self.activation,
                                warmup_steps=self.warmup_steps, seed=self.seed, **self.resolved())

    def validate(self) -> None:
        check_data_path(self.dataset, self.data, "data", "dataset")
        self.classifier(1, 2)  # ClassifierConfig's own checks, before the data is read


@dataclass(frozen=True, kw_only=True)
class PolynomialRun(CommandConfig, Out, Quiet, Threads):
    """Where and how ``reproduce polynomial`` runs (its study settings are a
    :class:`~mlpinterp.studies.polynomial.settings.PolynomialReproConfig`)."""

    out: Path = out_dir("runs/polynomial")
    """Output directory (a run directory: locked while in use; re-running resumes; more --seeds or another --steps
    extend it)."""


_FLAGS = {f.name: option_name(f) for cls in (TrainCommand, PolynomialReproConfig) for f in cli_fields(cls)}
"""Configuration field -> the CLI option that sets it (for the fix of a resume conflict)."""


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
        elif saved is None:
            opts.append(f"(no {flag})")
        elif isinstance(saved, bool):
            opts.append(flag if saved else f"--no-{flag[2:]}")
        else:
            opts.append(f"{flag} {saved}")
    cont = f"rerun with {' '.join(opts)}" if opts else ""
    if other:
        cont += (" and " if cont else "") + f"settings the CLI does not set ({', '.join(other)}: library only, " \
            "through the Python API)"
    return f"to continue the run in {str(out)!r} {cont}; to start a new run pass another --out (or delete {str(out)!r})"


def _warmup_notice(warmup_steps: int, steps: int, lr: float) -> None:
    if warmup_steps > steps:
        _console().print(f"note: --warmup-steps {warmup_steps} > --steps {steps}: the learning rate ramps up for the "
                         f"whole run and reaches {warmup_steps and steps / warmup_steps:.0%} of its peak {lr:g} "
                         "(not clamped, so the run can later be extended with a larger --steps)")


@config_options(TrainCommand)
def train(cfg: TrainCommand) -> None:
    """Train a one-hidden-layer classifier with log-spaced, atomic, resumable checkpoints."""
    from mlpinterp.data import load_dataset
    from mlpinterp.models import RunConflictError, find_checkpoints, train_classifier

    r = cfg.resolved()
    with expected_errors("pass --data DIR holding the dataset's files (or set $MLPINTERP_DATA)"):
        data = load_dataset(cfg.dataset, cfg.data)
    model_cfg = cfg.classifier(data.d_in, data.n_classes)
    _warmup_notice(cfg.warmup_steps, r["steps"], r["lr"])
    before = [s for s, _ in find_checkpoints(cfg.out)]
    with expected_errors():  # the library's messages name the file and say what to delete
        try:
            paths = train_classifier(model_cfg, data, cfg.out, progress=not cfg.quiet, threads=cfg.threads,
                                     device=cfg.device)
        except RunConflictError as e:
            fail(e.problem, _conflict_fix(e, cfg.out))
    steps = r["steps"]
    done_before = [s for s in before if s <= steps]
    if before and max(before) >= steps:
        what = f"already trained: nothing to do (the run in {cfg.out} reaches step {max(before)})"
    elif done_before:
        what = f"resumed at step {max(done_before)}, trained to step {steps}"
    else:
        what = f"trained to step {steps}"
    _console().print(f"{len(paths)} checkpoints in {cfg.out}: {what}")


@config_options(cfg=PolynomialReproConfig, run=PolynomialRun, show_defaults={
    **_PER_DATASET, "max_image_side": "full size; --quick: 8"})
def reproduce_polynomial(cfg: PolynomialReproConfig, run: PolynomialRun) -> None:
    """Train, convert every checkpoint into exact polynomial approximants, and write figures + report."""
    from mlpinterp.models import RunConflictError
    from mlpinterp.studies.polynomial.run import run_polynomial_repro

    set_threads(run.threads)
    r = cfg.resolved()
    _warmup_notice(r["warmup_steps"], r["steps"], r["lr"])
    with expected_errors():  # messages name the file (corrupt: delete it) or the missing data and how to get it
        try:
            res = run_polynomial_repro(cfg, run.out, quiet=run.quiet, threads=run.threads)
        except RunConflictError as e:
            fail(e.problem, _conflict_fix(e, run.out))
    _print_summary(res, run.out)


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
    """Attach ``train`` and ``reproduce polynomial``."""
    add_command(app, "train", train)
    add_command(reproduce_app, "polynomial", reproduce_polynomial)
