"""CLI: ``mlpinterp reproduce spd`` (Stochastic Parameter Decomposition, Bushnaq, Braun, Sharkey 2025).

    mlpinterp reproduce spd --setting tms-5-2 --seeds 10 --out DIR [--quick/--no-quick] [--device cuda]
        [--steps N] [--lr LR] [--importance-minimality-coeff BETA] [--threads T] [--compile/--no-compile]
        [--apd-run DIR] [--recipe current|paper] [--quiet]     (default recipe: current; paper for resid-mlp-2)
    mlpinterp spd train-target --setting resid-mlp-1 --seed 0 --out target.safetensors [--quick]
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from mlpinterp.cli.options import THREADS_DEFAULT, Device, Lr, Out, Quick, Quiet, Steps, Threads, flag
from mlpinterp.cli.paramspace import Seeds, run


class Setting(StrEnum):
    """SPD toy settings (SPD paper Sec. 3; the "-id" ones have an identity layer inserted)."""

    tms_5_2 = "tms-5-2"
    tms_40_10 = "tms-40-10"
    tms_5_2_id = "tms-5-2-id"
    tms_40_10_id = "tms-40-10-id"
    resid_mlp_1 = "resid-mlp-1"
    resid_mlp_2 = "resid-mlp-2"
    resid_mlp_3 = "resid-mlp-3"


class Recipe(StrEnum):
    """Whose recipe: the SPD paper's presets or the reference implementation's current ones."""

    paper = "paper"
    current = "current"


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``reproduce spd`` and the ``spd`` group (``spd train-target``)."""

    @reproduce_app.command("spd")
    def reproduce_spd(
        setting: Setting = typer.Option(Setting.tms_5_2, "--setting", help="Toy setting to reproduce."),
        out: Out = Path("runs/spd"), seeds: Seeds = 3, quick: Quick = False, device: Device = "cpu",
        quiet: Quiet = False, steps: Steps = None, lr: Lr = None, threads: Threads = THREADS_DEFAULT,
        importance_minimality_coeff: float | None = typer.Option(
            None, "--importance-minimality-coeff", min=0.0,
            help="Override the preset's beta_min, the coefficient of the importance-minimality loss (>= 0): the "
                 "knob of the SPD paper's Fig. 8 (resid-MLP-1's W_out merges into one co-active group only at a "
                 "small enough beta; docs/guides/spd.md). The run is then a custom run, not a reproduction."),
        compile: bool = flag("--compile/--no-compile", default=True,
                                     help="torch.compile the causal-importance MLPs (the step's hot path: faster "
                                          "steps on the CPU, docs/measurements.md; needs a C++ compiler "
                                          "on the CPU). A run resumes only with the same choice."),
        recipe: Recipe | None = typer.Option(
            None, "--recipe", show_default=False,
            help="Default: current (paper for resid-mlp-2, where current is not implemented), the recipe that "
                 "measured better across seeds (docs/guides/spd.md). current: the "
                 "SPD reference implementation's recipe of Feb 2026 (goodfire-ai/spd): a delta component instead of "
                 "the faithfulness loss, a 200-step faithfulness warm-up, fresh layerwise masks, the lower hard "
                 "sigmoid clamped to [0, 1], tied factors as two optimiser parameters, its step counts (TMS 10k, "
                 "40-10+ID 20k, resid-MLP-1 20k) and, for TMS, its cosine annealing. paper: the SPD paper's presets "
                 "(40k TMS steps, the faithfulness loss, the leaky lower sigmoid). With --quick, the quick preset's "
                 "steps, batch and (TMS 5-2) lr."),
        apd_run: Path | None = typer.Option(None, "--apd-run", help="--out directory of `reproduce apd` on the same "
                                            "TMS setting: its per-seed MMCS / ML2R go beside ours in the report "
                                            "(the targets are checked identical)."),
    ) -> None:
        """Train the target if needed, decompose it with SPD, write figures, metrics.json, report.md and
        report.html (the paper's numbers and our APD numbers beside ours)."""
        from mlpinterp.studies.spd.run import reproduce

        result = run(reproduce, setting.value, seeds, out, quick, quiet, steps, lr, threads, device,
                     config={"compile": compile, **({} if importance_minimality_coeff is None else
                                                    {"importance_minimality_coeff": importance_minimality_coeff})},
                     apd_run=apd_run, recipe=recipe.value if recipe is not None else None)
        if "mmcs" in result:
            typer.echo(f"MMCS per seed: {', '.join(f'{v:.4f}' for v in result['mmcs'])}")
            typer.echo(f"ML2R per seed: {', '.join(f'{v:.4f}' for v in result['ml2r'])}")
            typer.echo(f"failed seeds (MMCS < 0.99): {result['failed_seeds']} of {seeds}")
        typer.echo(f"report: {out / 'report.html'}")

    spd_app = typer.Typer(help="Stochastic Parameter Decomposition (Bushnaq, Braun, Sharkey 2025).",
                          no_args_is_help=True)

    @spd_app.command("train-target")
    def train_target(
        setting: Setting = typer.Option(Setting.tms_5_2, "--setting", help="Toy setting (an '-id' setting's target is "
                                        "its base setting's, the identity inserted on loading)."),
        seed: int = typer.Option(0, "--seed", min=0, help="Seed of the target (>= 0)."),
        out: Path = typer.Option(Path("runs/spd-target.safetensors"), "--out", metavar="FILE",
                                 help="Path of the .safetensors file (the suffix is appended unless present; a .json "
                                      "is written beside)."),
        quick: Quick = False,
        quiet: Quiet = False,
    ) -> None:
        """Train the toy target `reproduce spd` decomposes (the SPD reference's recipe) and save it atomically; a
        target already at --out is reused when it was made with the same recipe and refused otherwise."""
        from mlpinterp.cli.errors import fail
        from mlpinterp.studies.spd.run import spd_target
        from mlpinterp.studies.spd.settings import target_fidelity
        from mlpinterp.toys.settings import check_target
        from mlpinterp.utils.io import tensors_path

        if out.is_dir():
            fail(f"--out {str(out)!r} is an existing directory; expected the path of a .safetensors file",
                 f"pass a file path, e.g. --out {str(out / 'target.safetensors')!r}")
        path = tensors_path(out)
        base = setting.value.removesuffix("-id")
        reused = check_target(base, seed, path, quick, target_fidelity(base))
        _, _, info = spd_target(setting.value, seed, path, quick, quiet)
        loss = info.get("loss")
        typer.echo(f"{'exists, reused' if reused else 'saved'} {path}"
                   + (f" (held-out loss {loss:.4g})" if isinstance(loss, (int, float)) else ""))

    app.add_typer(spd_app, name="spd")
