"""CLI commands for the apd part of mlpinterp.

- ``mlpinterp reproduce apd --setting tms-5-2 --seeds 3 --out DIR [--quick] [--quiet] [--steps N]
  [--fidelity ours|reference]`` (default: reference for tms-40-10, ours elsewhere)
- ``mlpinterp apd train-target --setting resid-mlp-1 --seed 0 --out target.safetensors [--quick]``
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from mlpinterp.cli.options import THREADS_DEFAULT, Device, Lr, Out, Quick, Quiet, Steps, Threads
from mlpinterp.cli.paramspace import FidelityOpt, Seeds, run


class Setting(StrEnum):
    """APD toy settings (Braun et al. 2025)."""

    tms_5_2 = "tms-5-2"
    tms_40_10 = "tms-40-10"
    resid_mlp_1 = "resid-mlp-1"
    resid_mlp_2 = "resid-mlp-2"
    gated_trig = "gated-trig"


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach this module's commands to the top-level app and to reproduce."""

    @reproduce_app.command("apd")
    def reproduce_apd(
        setting: Setting = typer.Option(Setting.tms_5_2, "--setting", help="Toy setting to reproduce."),
        out: Out = Path("runs/apd"), seeds: Seeds = 3, quick: Quick = False, device: Device = "cpu",
        quiet: Quiet = False, steps: Steps = None, lr: Lr = None, threads: Threads = THREADS_DEFAULT,
        fidelity: FidelityOpt = None,
    ) -> None:
        """Train the target if needed, decompose it with APD, write figures, metrics.json, report.md and the
        self-contained report.html."""
        from mlpinterp.studies.apd.run import reproduce

        result = run(reproduce, setting.value, seeds, out, quick, quiet, steps, lr, threads, device,
                     fidelity=None if fidelity is None else fidelity.value)
        for k, (mu, sd) in result["summary"].items():
            typer.echo(f"{k:28s} {mu:.4g}" + (f" ± {sd:.2g}" if sd is not None else "") + f" (n = {seeds})")
        typer.echo(f"report: {out / 'report.html'}")

    apd_app = typer.Typer(help="Attribution-based Parameter Decomposition (Braun et al. 2025).", no_args_is_help=True)

    @apd_app.command("train-target")
    def train_target(
        setting: Setting = typer.Option(Setting.tms_5_2, "--setting", help="Toy setting."),
        seed: int = typer.Option(0, "--seed", min=0, help="Seed of the target (>= 0)."),
        out: Path = typer.Option(Path("runs/apd-target.safetensors"), "--out", metavar="FILE",
                                 help="Path of the .safetensors file (the suffix is appended unless present; a .json "
                                      "is written beside)."),
        quick: Quick = False,
        quiet: Quiet = False,
        fidelity: FidelityOpt = None,
    ) -> None:
        """Train (or hand-code, for gated-trig) a toy target and save it atomically (TMS: the recipe of
        ``--fidelity``, by default the one `reproduce apd` uses for the setting). A target already at --out is reused
        when it was made with the same recipe (setting, seed, --quick, --fidelity) and refused otherwise."""
        from mlpinterp.cli.errors import expected_errors, fail
        from mlpinterp.toys.settings import check_target, get_target
        from mlpinterp.utils.artifact import tensors_path

        if out.is_dir():
            fail(f"--out {str(out)!r} is an existing directory; expected the path of a .safetensors file",
                 f"pass a file path, e.g. --out {str(out / 'target.safetensors')!r}")
        path = tensors_path(out)
        fid = None if fidelity is None else fidelity.value
        with expected_errors("a target of another recipe: pass another --out; --fidelity reference: TMS and "
                             "residual-MLP settings only (pass --fidelity ours)"):
            reused = check_target(setting.value, seed, path, quick, fid)
            _, info = get_target(setting.value, seed, path, quick, quiet, fid)
        loss = info.get("loss")
        typer.echo(f"{'exists, reused' if reused else 'saved'} {path}"
                   + (f" (held-out loss {loss:.4g})" if isinstance(loss, (int, float)) else ""))

    app.add_typer(apd_app, name="apd")
