"""SPD beside APD on the same targets: an APD run's ``metrics.json`` read and checked, its targets compared tensor by
tensor with ours, and its per-seed MMCS / ML2R put beside SPD's."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from mlpinterp.studies.paramspace.rundir import method_of
from mlpinterp.studies.paramspace.statistics import FAILED_MMCS, paper_statistic
from mlpinterp.utils.artifact import load_artifact
from mlpinterp.utils.rundir import read_output
from mlpinterp.utils.validation import check_instance, check_int, check_real


def read_apd_run(apd_run: str | Path, setting: str, out: str | Path | None = None) -> dict:
    """The ``metrics.json`` of a ``reproduce apd`` run on ``setting`` (TMS 5-2 or 40-10; the "-id" variants are refused: the APD paper has no runs with the identity layer
    to compare with), checked
    before any training: written by ``reproduce apd`` (not SPD, not another command), not the SPD run's own ``out``,
    made with ``--fidelity ours`` (SPD's TMS targets use that recipe), and with a well-formed record per seed
    (int ``seed``, finite ``mmcs`` / ``ml2r``, per-feature ``max_cos`` / ``l2_ratio`` lists); any preset is accepted
    (the comparison records it).

    Raises ``ValueError`` naming the file and what is wrong with it; ``TypeError`` if ``apd_run`` is not a path.
    """
    check_instance(apd_run, (str, os.PathLike), "apd_run",
                   "path of a `reproduce apd` run directory (str or os.PathLike)")
    base = setting.removesuffix("-id")
    if not setting.startswith("tms") or setting != base:
        raise ValueError(f"apd_run: APD comparisons are for tms-5-2 and tms-40-10 (the APD paper's settings), not "
                         f"{setting!r}")
    path = Path(apd_run) / "metrics.json"
    if out is not None and Path(apd_run).resolve() == Path(out).resolve():
        raise ValueError(f"apd_run: {str(apd_run)!r} is this SPD run's own --out; pass the --out directory of a "
                         f"`mlpinterp reproduce apd --setting {base}` run")
    if not path.is_file():
        raise ValueError(f"apd_run: {str(path)!r} does not exist; pass the --out directory of a finished "
                         f"`mlpinterp reproduce apd --setting {base}` run")
    try:
        m = read_output(path, what="APD metrics")
    except ValueError as e:
        raise ValueError(f"apd_run: {e} (rerunning `reproduce apd` on that directory rewrites it)") from e
    if method_of(m) != "apd":
        raise ValueError(f"apd_run: {str(path)!r} was not written by `reproduce apd` (it has no APD configuration"
                         f"{'; it is an SPD run' if method_of(m) == 'spd' else ''}); pass an APD run's --out")
    if m.get("setting") != base or not isinstance(m.get("per_seed"), list):
        raise ValueError(f"apd_run: {str(path)!r} is an APD run of setting {m.get('setting')!r}, expected {base!r}")
    if m.get("fidelity", "ours") != "ours":
        raise ValueError(f"apd_run: {str(path)!r} is an APD run with --fidelity {m.get('fidelity')!r}, whose targets "
                         "are not SPD's (SPD trains TMS targets with the `ours` recipe); make the APD run with "
                         "--fidelity ours")
    if not isinstance(m.get("config", {}), dict):
        raise ValueError(f"apd_run: {str(path)!r}: 'config' must be a JSON object, got {m['config']!r}")
    for i, rec in enumerate(m["per_seed"]):
        where = f"apd_run: {str(path)!r}: per_seed[{i}]"
        if not isinstance(rec, dict):
            raise ValueError(f"{where} must be a JSON object, got {rec!r}")
        for key, check in (("seed", lambda v: check_int(v, "seed", 0)),
                           ("mmcs", lambda v: check_real(v, "mmcs")), ("ml2r", lambda v: check_real(v, "ml2r")),
                           ("max_cos", lambda v: [check_real(x, "max_cos[j]") for x in v]),
                           ("l2_ratio", lambda v: [check_real(x, "l2_ratio[j]") for x in v])):
            if key not in rec:
                raise ValueError(f"{where} has no {key!r}; rerun `reproduce apd` on that directory")
            try:
                check(rec[key])
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where}[{key!r}] is invalid ({e}); rerun `reproduce apd` on that directory") from e
    m["dir"] = str(Path(apd_run))
    return m


def check_same_target(apd: dict, out: Path, seed: int) -> None:
    """``ValueError`` unless seed ``seed``'s target in the APD run (if it has that seed) equals ours, tensor by tensor
    (another target recipe or ``--fidelity`` would make the comparison unlike for like)."""
    theirs_path = Path(apd["dir"]) / f"seed{seed}" / "target.safetensors"
    if not any(int(m["seed"]) == seed for m in apd["per_seed"]):
        return
    ours = load_artifact(out / f"seed{seed}" / "target.safetensors", kind="toy_target", what="target").tensors
    theirs = load_artifact(theirs_path, kind="toy_target", what="APD target").tensors
    if sorted(ours) != sorted(theirs) or any(not torch.equal(ours[k], theirs[k]) for k in ours):
        raise ValueError(f"apd_run: seed {seed}'s target in {apd['dir']!r} differs from ours in {str(out)!r} (another "
                         f"target recipe or --fidelity {apd.get('fidelity')!r}); compare runs on the same targets: "
                         f"SPD trains TMS targets with APD's `--fidelity ours` recipe (constant lr)")


def compare_apd(apd: dict, seeds: int) -> dict:
    """APD's per-seed MMCS / ML2R beside ours for the seeds both runs have (their targets were checked identical
    with :func:`check_same_target` before each seed's decomposition)."""
    by_seed = {int(m["seed"]): m for m in apd["per_seed"]}
    common = [s for s in range(seeds) if s in by_seed]
    per = [by_seed[s] for s in common]
    return {"dir": apd["dir"], "fidelity": apd.get("fidelity"), "quick": apd.get("quick"), "seeds": common,
            "mmcs": [float(m["mmcs"]) for m in per], "ml2r": [float(m["ml2r"]) for m in per],
            "failed_seeds": int(sum(m["mmcs"] < FAILED_MMCS for m in per)),
            "paper_statistic": paper_statistic(per) if per else None, "steps": apd.get("config", {}).get("steps")}

