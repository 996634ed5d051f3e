"""CLI: ``mlpinterp reproduce spd`` (Stochastic Parameter Decomposition, Bushnaq, Braun, Sharkey 2025).

    mlpinterp reproduce spd --setting tms-5-2 --seeds 10 --out DIR [--quick/--no-quick] [--device cuda]
        [--steps N] [--lr LR] [--importance-minimality-coeff BETA] [--threads T] [--compile/--no-compile]
        [--apd-run DIR] [--recipe current|paper] [--quiet]     (default recipe: current; paper for resid-mlp-2)
    mlpinterp spd train-target --setting resid-mlp-1 --seed 0 --out target.safetensors [--quick]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import typer

from mlpinterp.cli.config_options import add_command, config_options, option
from mlpinterp.cli.options import out_dir
from mlpinterp.cli.paramspace import ToyRepro, ToyTarget, run
from mlpinterp.utils.validation import Real

Setting = Literal["tms-5-2", "tms-40-10", "tms-5-2-id", "tms-40-10-id", "resid-mlp-1", "resid-mlp-2", "resid-mlp-3"]
"""SPD toy settings (SPD paper Sec. 3; the "-id" ones have an identity layer inserted)."""


@dataclass(frozen=True, kw_only=True)
class SpdRepro(ToyRepro):
    """Inputs of ``reproduce spd``."""

    setting: Setting = "tms-5-2"
    """Toy setting to reproduce."""
    out: Path = out_dir("runs/spd")
    importance_minimality_coeff: float | None = option(None, check=Real(0), show_default="the preset's")
    """Override the preset's beta_min, the coefficient of the importance-minimality loss (>= 0): the knob of the SPD
    paper's Fig. 8 (resid-MLP-1's W_out merges into one co-active group only at a small enough beta;
    docs/guides/spd.md). The run is then a custom run, not a reproduction."""
    compile: bool = True
    """torch.compile the causal-importance MLPs (the step's hot path: faster steps on the CPU,
    docs/measurements.md; needs a C++ compiler on the CPU). A run resumes only with the same choice."""
    recipe: Literal["current", "paper"] | None = None
    """Default: current (paper for resid-mlp-2, where current is not implemented), the recipe that measured better
    across seeds (docs/guides/spd.md). current: the SPD reference implementation's recipe of Feb 2026
    (goodfire-ai/spd): a delta component instead of the faithfulness loss, a 200-step faithfulness warm-up, fresh
    layerwise masks, the lower hard sigmoid clamped to [0, 1], tied factors as two optimiser parameters, its step
    counts (TMS 10k, 40-10+ID 20k, resid-MLP-1 20k) and, for TMS, its cosine annealing. paper: the SPD paper's
    presets (40k TMS steps, the faithfulness loss, the leaky lower sigmoid). With --quick, the quick preset's steps,
    batch and (TMS 5-2) lr."""
    apd_run: Path | None = option(None, metavar="DIR")
    """--out directory of `reproduce apd` on the same TMS setting: its per-seed MMCS / ML2R go beside ours in the
    report (the targets are checked identical)."""


@dataclass(frozen=True, kw_only=True)
class SpdTarget(ToyTarget):
    """Inputs of ``spd train-target``."""

    setting: Setting = "tms-5-2"
    """Toy setting (an '-id' setting's target is its base setting's, the identity inserted on loading)."""
    out: Path = option(Path("runs/spd-target.safetensors"), metavar="FILE")


@config_options(SpdRepro)
def reproduce_spd(cfg: SpdRepro) -> None:
    """Train the target if needed, decompose it with SPD, write figures, metrics.json, report.md and report.html
    (the paper's numbers and our APD numbers beside ours)."""
    from mlpinterp.studies.spd.run import reproduce

    config = {"compile": cfg.compile, **({} if cfg.importance_minimality_coeff is None else
                                         {"importance_minimality_coeff": cfg.importance_minimality_coeff})}
    result = run(reproduce, cfg.setting, cfg, config=config, apd_run=cfg.apd_run, recipe=cfg.recipe)
    if "mmcs" in result:
        typer.echo(f"MMCS per seed: {', '.join(f'{v:.4f}' for v in result['mmcs'])}")
        typer.echo(f"ML2R per seed: {', '.join(f'{v:.4f}' for v in result['ml2r'])}")
        typer.echo(f"failed seeds (MMCS < 0.99): {result['failed_seeds']} of {cfg.seeds}")
    typer.echo(f"report: {cfg.out / 'report.html'}")


@config_options(SpdTarget)
def train_target(cfg: SpdTarget) -> None:
    """Train the toy target `reproduce spd` decomposes (the SPD reference's recipe) and save it atomically; a
    target already at --out is reused when it was made with the same recipe and refused otherwise."""
    from mlpinterp.studies.spd.run import spd_target
    from mlpinterp.studies.spd.settings import target_fidelity
    from mlpinterp.toys.settings import check_target
    from mlpinterp.utils.io import tensors_path

    path = tensors_path(cfg.out)
    base = cfg.setting.removesuffix("-id")
    reused = check_target(base, cfg.seed, path, cfg.quick, target_fidelity(base))
    _, _, info = spd_target(cfg.setting, cfg.seed, path, cfg.quick, cfg.quiet)
    loss = info.get("loss")
    typer.echo(f"{'exists, reused' if reused else 'saved'} {path}"
               + (f" (held-out loss {loss:.4g})" if isinstance(loss, (int, float)) else ""))


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``reproduce spd`` and the ``spd`` group (``spd train-target``)."""
    add_command(reproduce_app, "spd", reproduce_spd)
    spd_app = typer.Typer(rich_markup_mode=None, help="SPD: stochastic parameter decomposition (Bushnaq, Braun, Sharkey 2025).",
                          no_args_is_help=True)
    add_command(spd_app, "train-target", train_target)
    app.add_typer(spd_app, name="spd")
