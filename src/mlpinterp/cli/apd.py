"""CLI commands for the apd part of mlpinterp.

- ``mlpinterp reproduce apd --setting tms-5-2 --seeds 3 --out DIR [--quick] [--quiet] [--steps N]
  [--fidelity ours|reference]`` (default: reference for tms-40-10, ours elsewhere)
- ``mlpinterp apd train-target --setting resid-mlp-1 --seed 0 --out target.safetensors [--quick]``
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import typer

from mlpinterp.cli.config_options import add_command, config_options, option
from mlpinterp.cli.options import out_dir
from mlpinterp.cli.paramspace import Fidelity, ToyRepro, ToyTarget, run

Setting = Literal["tms-5-2", "tms-40-10", "resid-mlp-1", "resid-mlp-2", "gated-trig"]
"""APD toy settings (Braun et al. 2025)."""

def _fidelity():
    return option(None, show_default="reference for tms-40-10, ours elsewhere")


@dataclass(frozen=True, kw_only=True)
class ApdRepro(ToyRepro):
    """Inputs of ``reproduce apd``."""

    setting: Setting = "tms-5-2"
    """Toy setting to reproduce."""
    out: Path = out_dir("runs/apd")
    fidelity: Fidelity | None = _fidelity()
    """ours: our presets; reference: the APD reference implementation's way, for TMS (inner rank min(d_in, d_hidden)
    + 1, small 4-D Xavier init, no weight decay, cos(π/2 t/(T-1)) after warm-up, target trained at lr 5e-3 with
    linear decay) and for the residual-MLP targets (MLPs without biases, 1k steps at batch 2048, lr 3e-3, cos(π/2
    t/(T-1)); 10k steps for 3 layers). Default: the better one measured (docs/guides/apd.md)."""


@dataclass(frozen=True, kw_only=True)
class ApdTarget(ToyTarget):
    """Inputs of ``apd train-target``."""

    setting: Setting = "tms-5-2"
    """Toy setting."""
    out: Path = option(Path("runs/apd-target.safetensors"), metavar="FILE")
    fidelity: Fidelity | None = _fidelity()
    """The target's recipe: ours, or reference (the APD reference implementation's, TMS and residual-MLP settings
    only). Default: the one `reproduce apd` uses for the setting."""


@config_options(ApdRepro)
def reproduce_apd(cfg: ApdRepro) -> None:
    """Train the target if needed, decompose it with APD, write figures, metrics.json, report.md and the
    self-contained report.html."""
    from mlpinterp.studies.apd.run import reproduce

    result = run(reproduce, cfg.setting, cfg, fidelity=cfg.fidelity)
    for k, (mu, sd) in result["summary"].items():
        typer.echo(f"{k:28s} {mu:.4g}" + (f" ± {sd:.2g}" if sd is not None else "") + f" (n = {cfg.seeds})")
    typer.echo(f"report: {cfg.out / 'report.html'}")


@config_options(ApdTarget)
def train_target(cfg: ApdTarget) -> None:
    """Train (or hand-code, for gated-trig) a toy target and save it atomically (TMS: the recipe of --fidelity, by
    default the one `reproduce apd` uses for the setting). A target already at --out is reused when it was made
    with the same recipe (setting, seed, --quick, --fidelity) and refused otherwise."""
    from mlpinterp.cli.errors import expected_errors
    from mlpinterp.toys.settings import check_target, get_target
    from mlpinterp.utils.artifact import tensors_path

    path = tensors_path(cfg.out)
    with expected_errors("a target of another recipe: pass another --out; --fidelity reference: TMS and "
                         "residual-MLP settings only (pass --fidelity ours)"):
        reused = check_target(cfg.setting, cfg.seed, path, cfg.quick, cfg.fidelity)
        _, info = get_target(cfg.setting, cfg.seed, path, cfg.quick, cfg.quiet, cfg.fidelity)
    loss = info.get("loss")
    typer.echo(f"{'exists, reused' if reused else 'saved'} {path}"
               + (f" (held-out loss {loss:.4g})" if isinstance(loss, (int, float)) else ""))


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``reproduce apd`` and the ``apd`` group (``apd train-target``)."""
    add_command(reproduce_app, "apd", reproduce_apd)
    apd_app = typer.Typer(rich_markup_mode=None, no_args_is_help=True,
                          help="APD: attribution-based parameter decomposition (Braun et al. 2025).")
    add_command(apd_app, "train-target", train_target)
    app.add_typer(apd_app, name="apd")
