"""CLI: ``mlpinterp reproduce mfr`` (Marks et al. 2024, mutual feature regularisation).

    mlpinterp reproduce mfr --setting synthetic|minilm|lm|gpt2|eeg --k 6 12 18 24 30 --seeds N --out DIR [--quick]
        [--quiet]   (--setting lm --model PATH|gpt2: the paper's Table 2 protocol on a causal LM's layer-0 MLP output;
        --setting eeg --data DIR: EDF recordings under DIR, e.g. the TUH EEG corpus)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import typer

from mlpinterp.cli.config_options import CommandConfig, add_command, config_options, invalid, option
from mlpinterp.cli.errors import expected_errors
from mlpinterp.cli.options import Device, Out, Quick, Quiet, Seeds, Threads, out_dir, seeds_field, set_threads
from mlpinterp.utils.validation import Int, Real

_TEXT = ("minilm", "lm", "gpt2")


def positive_ints(values: tuple[int, ...], name: str) -> None:
    """Rule: at least one value, each >= 1."""
    if not values:
        raise ValueError(f"{name} needs at least one value")
    bad = [v for v in values if v < 1]
    if bad:
        raise ValueError(f"{name} values must be positive, got {bad[0]}")


@dataclass(frozen=True, kw_only=True)
class MfrCommand(CommandConfig, Out, Seeds, Quick, Device, Quiet, Threads):
    """Inputs of ``reproduce mfr``: the setting, the run grid (k x seeds x conditions) and per-setting inputs; the
    rest of each setting's configuration is its preset (:mod:`mlpinterp.studies.mfr.settings`)."""

    setting: Literal["synthetic", "minilm", "lm", "gpt2", "eeg"] = "synthetic"
    """synthetic | minilm | lm (a causal LM's layer-0 MLP output, the paper's Table 2) | gpt2 (mid-depth residual
    stream; weights on disk) | eeg (EDF recordings under --data)."""
    out: Path = out_dir("runs/mfr")
    k: tuple[int, ...] | None = option(None, check=positive_ints, greedy=True, metavar="K",
                                       show_default="the setting's (synthetic, minilm: 6 12 18 24 30); --quick: 6")
    """TopK k values: --k 6 12 18 24 30 (or --k 6,12, or --k 6 --k 12)."""
    seeds: int | None = seeds_field(None)
    """Seeds per (k, condition)."""
    steps: int | None = option(None, check=Int(1), show_default="the setting's")
    """Override the setting's number of steps."""
    model: str | None = option(None, only_for=("lm",), show_default="gpt2")
    """--setting lm: a train-lm output directory or 'gpt2' (weights on disk)."""
    hook_point: str | None = option(None, only_for=_TEXT, show_default="minilm, gpt2: a mid-depth residual stream; "
                                                                         "lm: transformer.h.0.mlp")
    """minilm / lm / gpt2: the hook point."""
    data: Path | None = option(None, aliases=("--text-dir",), only_for=(*_TEXT, "eeg"), metavar="DIR",
                               show_default="minilm / lm / gpt2: ../shared/data/text")
    """minilm / lm / gpt2: directory of *.txt documents (files with 'test' in the name are held out); eeg (needed):
    directory of EDF/EDF+ recordings (searched recursively), e.g. a TUH EEG download."""
    channels: str | None = option(None, only_for=("eeg",), show_default="those common to every recording")
    """--setting eeg: comma-separated channel labels as in the EDF header."""
    window: int | None = option(None, check=Int(1), only_for=("eeg",), show_default="32")
    """--setting eeg: samples per vector at 128 Hz (1: one channel vector per time step)."""
    n_saes: int = option(2, check=Int(2))
    """SAEs trained in parallel."""
    alpha: float | None = option(None, check=Real(0), show_default="auto: initial penalty = initial loss")
    """MFR penalty weight (>= 0)."""
    extra_alpha: tuple[float, ...] = option((0.1,), metavar="ALPHA")
    """Fixed penalty weight run as an extra condition mfr_alpha<a>; repeat for several."""
    no_extra_alpha: bool = option(False, negatable=False)
    """Run no fixed-alpha condition."""
    inactivity_threshold: float | None = option(None, check=Real(0), show_default="1, the paper's")
    """Re-initialise an SAE whose inactivity measure exceeds this."""

    def validate(self) -> None:
        if self.setting == "eeg" and self.data is None:
            raise invalid("--setting eeg needs --data DIR (a directory of EDF recordings)",
                          "pass --data, e.g. the edf/ folder of a TUH EEG download (see docs/guides/sae.md, EEG)")

    def runs(self) -> dict:
        """The fields of the setting's experiment configuration the options set."""
        return {"n_saes": self.n_saes, "alpha": self.alpha,
                **({"k_values": self.k} if self.k else {}),
                **({"seeds": self.seeds} if self.seeds is not None else {}),
                "extra_alphas": () if self.no_extra_alpha else tuple(self.extra_alpha),
                **({"steps": self.steps} if self.steps is not None else {}),
                **({"inactivity_threshold": self.inactivity_threshold}
                   if self.inactivity_threshold is not None else {})}


def _run_eeg(cmd: MfrCommand, kw: dict) -> dict:
    """``reproduce mfr --setting eeg``; returns the metrics dict."""
    from mlpinterp.data.eeg import EegConfig
    from mlpinterp.studies.mfr.eeg import run_eeg
    from mlpinterp.studies.mfr.settings import EegExperiment

    eeg = EegConfig(channels=tuple(c.strip() for c in (cmd.channels or "").split(",") if c.strip()) or None,
                    **({"window": cmd.window} if cmd.window is not None else {}))
    exp = EegExperiment.quick(eeg=eeg, **kw) if cmd.quick else EegExperiment(eeg=eeg, **kw)
    return run_eeg(cmd.out, exp, cmd.data, quiet=cmd.quiet, device=cmd.device)


def _run_text_or_synthetic(cmd: MfrCommand, kw: dict) -> dict:
    """``reproduce mfr --setting synthetic|minilm|lm|gpt2``; returns the metrics dict."""
    from mlpinterp.studies.mfr import run as exp_mod
    from mlpinterp.studies.mfr import settings

    common = {"quiet": cmd.quiet, "device": cmd.device}
    if cmd.setting == "synthetic":
        exp = settings.SyntheticExperiment.quick(**kw) if cmd.quick else settings.SyntheticExperiment(**kw)
        return exp_mod.run_synthetic(cmd.out, exp, **common)
    if cmd.setting == "lm":
        kw.update(model=cmd.model or "gpt2", **({"hook_point": cmd.hook_point} if cmd.hook_point else {}))
        exp = settings.LmExperiment.quick(**kw) if cmd.quick else settings.LmExperiment(**kw)
        return exp_mod.run_minilm(cmd.out, exp, text_dir=cmd.data, **common)
    if cmd.setting == "gpt2":  # needs GPT-2 weights on disk (no download)
        kw.update(model="gpt2", hook_point=cmd.hook_point or "transformer.h.5")
    elif cmd.hook_point:
        kw["hook_point"] = cmd.hook_point
    exp = settings.MinilmExperiment.quick(**kw) if cmd.quick else settings.MinilmExperiment(**kw)
    return exp_mod.run_minilm(cmd.out, exp, text_dir=cmd.data, **common)


@config_options(MfrCommand)
def reproduce_mfr(cfg: MfrCommand) -> None:
    """Reproduce the MFR paper end to end (Marks et al. 2024): figures, metrics.json, report.md and report.html in
    OUT."""
    from mlpinterp.utils.rundir import wall_time_statement

    set_threads(cfg.threads)
    with expected_errors():
        metrics = _run_eeg(cfg, cfg.runs()) if cfg.setting == "eeg" else _run_text_or_synthetic(cfg, cfg.runs())
    typer.echo(f"wrote {cfg.out / 'report.md'} ({wall_time_statement(metrics['seconds'], metrics.get('sessions'))})")


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``reproduce mfr``."""
    add_command(reproduce_app, "mfr", reproduce_mfr)
