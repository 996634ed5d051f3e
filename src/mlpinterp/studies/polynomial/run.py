"""``mlpinterp reproduce polynomial``: Rigg & Belrose (2025, arXiv 2502.01032) end to end on real data.

For each seed: train a one-hidden-layer classifier with log-spaced checkpoints (resumable), fit the
exact linear and quadratic approximants under the class-conditional Gaussian mixture of the training
set and under the single moment-matched Gaussian at every checkpoint, measure FVU / KL / accuracy under
the mixture and on the real test set, run the SVD ablation attack with random and PCA baselines at the
final checkpoint, then aggregate over seeds into JSON/CSV, figures and ``report.md``/``report.html``.

Layout of ``out``::

    config.json                     the run's configuration
    seed{S}/checkpoints/step_*.safetensors|json   classifier checkpoints (atomic, resumable)
    seed{S}/eval/step_*.json        per-checkpoint metrics (skipped when present: resumable)
    seed{S}/attack.json             SVD attack at the final checkpoint
    seed{S}/features.npz            linear rows and top quadratic eigenvectors per class
    results.json, curves.csv, attack.csv, figures/*.png, report.md, report.html
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlpinterp.data import load_dataset
from mlpinterp.data.pooling import average_pool
from mlpinterp.gaussian.distributions import GaussianMixture
from mlpinterp.models import ClassifierConfig, checkpoint_steps, find_checkpoints, load_classifier, train_classifier
from mlpinterp.studies.polynomial.evaluate import EvalInputs, evaluate_checkpoint, fit_approximants, svd_attack
from mlpinterp.studies.polynomial.settings import ADDED_FIELDS, DATASET_DEFAULTS, SMOKE, PolynomialReproConfig
from mlpinterp.utils.progress import progress_bar
from mlpinterp.utils.rundir import RunDir, open_run, read_output, write_output

__all__ = ["DATASET_DEFAULTS", "SMOKE", "PolynomialReproConfig", "run_polynomial_repro"]
from mlpinterp.poly.spectral import quadratic_spectrum, top_singular_directions
from mlpinterp.utils.config_diff import config_diff

RESUMABLE_CHANGES = ("seeds", "steps", "data_path")
"""Settings that may change between runs into one output directory (more seeds, longer or shorter training, the
same data elsewhere); any other change would mix results of two configurations and is refused."""


def _read_json(path: Path, expect: type | None = None):
    """A JSON file this experiment wrote (:func:`~mlpinterp.utils.rundir.read_output`: verified against the digest
    in ``run.json``); a corrupt one raises ``ValueError`` saying to delete it."""
    return read_output(path, what="file", expect=expect, fix="delete it and rerun to recompute it")


def _check_resume(out: Path, r: dict) -> None:
    """Refuse to resume into ``out`` when its ``config.json`` differs in a setting not in ``RESUMABLE_CHANGES``; a
    ``config.json`` written before a field of :data:`ADDED_FIELDS` existed is read with the behaviour of that time."""
    from mlpinterp.models import RunConflictError

    f = out / "config.json"
    if not f.exists():
        return
    old = read_output(f, what="run configuration", fix="delete it and rerun")
    diff = config_diff(old, r, ignore=RESUMABLE_CHANGES, implicit=ADDED_FIELDS)
    if diff:
        raise RunConflictError(out, "config.json", diff)


def run_polynomial_repro(cfg: PolynomialReproConfig, out: str | Path, *, quiet: bool = False,
                         threads: int | None = 1) -> dict:
    """Run (or resume) the whole reproduction into ``out``; returns the aggregated results dict.

    ``out`` is opened with :func:`mlpinterp.utils.rundir.open_run` (locked; a configuration differing in a field
    other than :data:`RESUMABLE_CHANGES` is refused; the final approximants are keyed by the step they were fitted
    at, so a run resumed to fewer steps refits them)."""
    r = cfg.resolved()
    with open_run(out, "reproduce polynomial", r, resumable=RESUMABLE_CHANGES, implicit=ADDED_FIELDS,
                  check=lambda path: _check_resume(path, r)) as rd:
        return _run(cfg, r, rd, quiet, threads)


def _run(cfg: PolynomialReproConfig, r: dict, rd: RunDir, quiet: bool, threads: int | None) -> dict:
    from mlpinterp.studies.polynomial.figures import make_figures
    from mlpinterp.studies.polynomial.report import summarise, write_report

    out = rd.path
    write_output(out / "config.json", r)
    data = average_pool(load_dataset(cfg.dataset, cfg.data_path), r["max_image_side"])
    if r["attack_k"] > min(data.n_classes, data.d_in):
        raise ValueError(f"attack_k must be <= min(n_classes, d_in) = {min(data.n_classes, data.d_in)} on "
                         f"{data.name} (the singular directions of the linear approximant), got {r['attack_k']}")
    shrink = "ledoit-wolf" if cfg.covariance == "ledoit-wolf" else 0.0
    mixture = GaussianMixture.from_labels(data.X_train, data.y_train, shrinkage=shrink)
    gaussian = mixture.pooled()
    inputs = EvalInputs(mixture, gaussian, data.X_test.astype(np.float64), data.y_test, r["mc_samples"])

    per_seed = []
    for seed in range(cfg.seeds):
        ccfg = ClassifierConfig(d_in=data.d_in, n_classes=data.n_classes, d_hidden=r["d_hidden"], arch=cfg.arch,
                                activation=cfg.activation, lr=r["lr"], warmup_steps=r["warmup_steps"],
                                steps=r["steps"], seed=seed)
        ck_dir = out / f"seed{seed}" / "checkpoints"
        train_classifier(ccfg, data, ck_dir, progress=not quiet, threads=threads)
        per_seed.append(_evaluate_seed(rd, f"seed{seed}", ck_dir, inputs, data, r, seed, quiet))

    results = summarise(per_seed, r, data)
    results["wall_seconds"], results["sessions"] = rd.wall_seconds, rd.sessions
    write_output(out / "results.json", results)
    make_figures(results, per_seed, data, out / "figures")
    write_report(results, out)
    return results


def _quadratic_mixture_steps(steps: list[int], policy: str) -> set[int]:
    """Checkpoints at which the exact mixture quadratic is fitted (``policy``: all, final; auto = all)."""
    return {steps[-1]} if policy == "final" else set(steps)


def _evaluate_seed(rd: RunDir, seed_name: str, ck_dir: Path, inputs: EvalInputs, data, r: dict, seed: int,
                   quiet: bool) -> dict:
    from mlpinterp.poly.approximant import load_polynomial
    from mlpinterp.utils.artifact import ArtifactError, artifact_digest

    seed_dir = rd.path / seed_name
    ev_dir = seed_dir / "eval"
    ev_dir.mkdir(parents=True, exist_ok=True)
    ap_dir = seed_dir / "approximants"
    wanted = set(checkpoint_steps(r["steps"]))  # this run's checkpoints (a longer earlier run may have left more)
    ckpts = [(s, p) for s, p in find_checkpoints(ck_dir) if s in wanted]
    steps = [s for s, _ in ckpts]
    quad_steps = _quadratic_mixture_steps(steps, r["quadratic_mixture_steps"])
    curves, final_approx, warm = [], None, None
    with progress_bar(total=len(ckpts), desc=f"seed {seed}: approximants (checkpoints)", quiet=quiet) as bar:
        for step, path in ckpts:
            f = ev_dir / f"step_{step:07d}.json"
            if f.exists():
                res = _read_json(f)
            else:
                model, meta = load_classifier(path)
                res, approx = evaluate_checkpoint(model.to_network(), inputs, quadratic_mixture=step in quad_steps,
                                                  warm_start=warm, cg_dtype=r["mixture_cg_dtype"])
                warm = approx.get("quadratic_mixture", warm)  # the next checkpoint's CG starts from this solution
                res["step"] = step
                res["network"]["train_accuracy"] = meta.get("train_accuracy")
                if step == steps[-1]:  # keep the final approximants for the attack and the feature images
                    final_approx = approx
                    for name, p in approx.items():
                        p.save(ap_dir / name, provenance={"step": step, "checkpoint": artifact_digest(path)})
                # memory: this checkpoint's other approximants (quadratic_gaussian: 49 MB on MNIST) are not
                # kept through the next checkpoint's solve (``warm`` and ``final_approx`` keep what is used)
                del approx
                write_output(f, res)
            curves.append(res)
            bar.advance()

    final_step, final_path = ckpts[-1]
    model, _ = load_classifier(final_path)
    net = model.to_network()
    computed_from = {"step": final_step, "checkpoint": artifact_digest(final_path)}
    if final_approx is None:
        names = list(curves[-1]["approximants"])
        try:  # the saved approximants, if they were computed from this very checkpoint
            final_approx = {name: load_polynomial(ap_dir / f"{name}.safetensors", provenance=computed_from)
                            for name in names}
        except (FileNotFoundError, ArtifactError):  # missing, or of another step or run: refit once
            final_approx, _ = fit_approximants(net, inputs)
            for name, p in final_approx.items():
                p.save(ap_dir / name, provenance=computed_from)
    attack_file = seed_dir / "attack.json"
    attack = _read_json(attack_file) if attack_file.exists() else None
    if attack is None or attack.get("step", final_step) != final_step:  # (re)compute after extending training
        attack = svd_attack(net, final_approx, data.X_train, inputs.X_test, inputs.y_test,
                            input_cov=inputs.mixture.cov, k_max=r["attack_k"], seed=seed)
        attack["step"] = final_step
        write_output(attack_file, attack)
    feat_file = seed_dir / "features.npz"
    if not feat_file.exists() or _features_step(feat_file) != final_step:
        _save_features(feat_file, ck_dir, inputs, steps, final_approx)
    return {"seed": seed, "curves": curves, "attack": attack, "features": str(feat_file),
            "final_checkpoint": str(final_path)}


def _features_step(path: Path) -> int | None:
    """The final step recorded in a ``features.npz`` (``None`` when it cannot be read: it is then recomputed)."""
    try:
        with np.load(path) as z:
            return int(z["steps"][-1])
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _save_features(path: Path, ck_dir: Path, inputs: EvalInputs, steps: list[int], final_approx: dict,
                   n_eig: int = 2) -> None:
    """Linear coefficient rows (mixture) at 3 checkpoints and the top quadratic eigenvectors at the final one."""
    from mlpinterp.poly.fit import fit_polynomial

    pick = sorted({steps[0], steps[len(steps) // 2], steps[-1]})
    arrays: dict[str, np.ndarray] = {"steps": np.array(pick)}
    for s in pick[:-1]:
        model, _ = load_classifier(ck_dir / f"step_{s:07d}.safetensors")
        arrays[f"linear_{s}"] = fit_polynomial(model.to_network(), inputs.mixture, 1).coefficients(1)
    B = final_approx["linear_mixture"].coefficients(1)
    arrays[f"linear_{pick[-1]}"] = B
    arrays["attack_directions"] = top_singular_directions(B @ inputs.mixture.cov, min(10, *B.shape))  # as svd_attack
    spec = quadratic_spectrum(final_approx["quadratic_mixture"])
    arrays[f"eigvals_{pick[-1]}"] = spec.eigenvalues[:, :n_eig]
    arrays[f"eigvecs_{pick[-1]}"] = np.transpose(spec.eigenvectors[:, :, :n_eig], (0, 2, 1))
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)
