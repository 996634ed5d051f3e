"""Statistics and verdicts of the MFR study: mean ± standard error over seeds per (condition, k), paired
differences against the baseline, and SAEBench core metrics averaged over seeds and SAEs."""

from __future__ import annotations

import numpy as np


def value(r: dict, key: str) -> float:
    v = r[key]
    if isinstance(v, dict):
        v = v["r"]
    return float(np.mean(v))


def summarise(results: list[dict], keys: list[str]) -> dict:
    """Mean and standard error over seeds, per (condition, k)."""
    summary: dict = {}
    for cond in dict.fromkeys(r["condition"] for r in results):  # run order: baseline, reinit, mfr, mfr_alpha*
        for k in sorted({r["k"] for r in results}):
            rs = [r for r in results if r["condition"] == cond and r["k"] == k]
            if not rs:
                continue
            entry = {}
            for key in keys:
                vals = np.array([value(r, key) for r in rs if key in r], dtype=np.float64)
                vals = vals[np.isfinite(vals)]
                entry[key] = {"mean": float(vals.mean()) if vals.size else float("nan"),
                              "se": float(vals.std(ddof=1) / np.sqrt(vals.size)) if vals.size > 1 else float("nan"),
                              "n": int(vals.size)}
            summary.setdefault(cond, {})[str(k)] = entry
    return summary



def run_kind(exp) -> str:
    """``"full"`` when every budget field has the setting's default, else ``"quick"`` (no verdicts from it)."""
    full = type(exp)()
    budget = ("steps", "batch_size", "d_sae", "eval_samples", "train_chunks", "eval_chunks", "ctx_len")
    return "full" if all(getattr(exp, f) == getattr(full, f) for f in budget if hasattr(exp, f)) else "quick"


def paired(results: list[dict], cond: str, k: int, key: str) -> np.ndarray:
    """Per-seed differences ``cond - baseline`` of the SAE-mean of ``key`` (relative, in %, for FVU)."""
    base = {r["seed"]: value(r, key) for r in results if r["condition"] == "baseline" and r["k"] == k}
    out = []
    for r in results:
        if r["condition"] == cond and r["k"] == k and r["seed"] in base and key in r:
            b, v = base[r["seed"]], value(r, key)
            out.append(100 * (v - b) / b if key == "fvu" else v - b)
    return np.array(out, dtype=np.float64)


def verdicts(results: list[dict], primary: str, run_kind: str) -> list[dict]:
    """One verdict per (condition != baseline, k): ``better than baseline`` / ``worse than baseline`` (the paired
    difference of ``primary`` beyond 2 standard errors over >= 2 seeds), ``no clear difference``, ``one seed: no
    verdict`` or ``quick run: not a reproduction``, with the one-line reason."""
    higher_is_better = primary != "fvu"
    out = []
    for cond in dict.fromkeys(r["condition"] for r in results):
        if cond == "baseline":
            continue
        for k in sorted({r["k"] for r in results if r["condition"] == cond}):
            d = paired(results, cond, k, primary)
            d_fvu = paired(results, cond, k, "fvu")
            cross = [r.get("mmcs_cross") for r in results if r["condition"] == cond and r["k"] == k]
            cross = [c for c in cross if c is not None]
            n = int(np.isfinite(d).sum())
            mean = float(np.nanmean(d)) if n else float("nan")
            se = float(np.nanstd(d, ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
            gain = mean if higher_is_better else -mean
            if run_kind != "full":
                word = "quick run: not a reproduction"
            elif n < 2:
                word = "one seed: no verdict"
            elif gain > 2 * se:
                word = "better than baseline"
            elif gain < -2 * se:
                word = "worse than baseline"
            else:
                word = "no clear difference"
            what = "MMCS to truth" if primary == "mmcs_truth" else "held-out FVU"
            value = f"{mean:+.1f} %" if primary == "fvu" else f"{mean:+.4f}"
            reason = (f"{what} {value} vs baseline (paired over {n} seed{'s' if n != 1 else ''})" if n
                      else "no paired baseline run")
            if primary != "fvu" and d_fvu.size:
                reason += f", FVU {np.nanmean(d_fvu):+.1f} %"
            if cross and float(np.mean(cross)) > 0.99 and gain < 0:
                reason += f"; the SAEs are near copies of each other (cross-SAE MMCS {float(np.mean(cross)):.3f})"
            out.append({"condition": cond, "k": k, "verdict": word, "reason": reason, "n": n,
                        "mean_diff": mean, "se_diff": se})
    return out


def core_summary(results: list[dict]) -> dict:
    """Mean over seeds and SAEs of every SAEBench core metric, per condition and k: ``{cond: {k: {cat.key: v}}}``."""
    out: dict = {}
    for cond in dict.fromkeys(r["condition"] for r in results):
        for k in sorted({r["k"] for r in results}):
            cores = [c for r in results if r["condition"] == cond and r["k"] == k for c in r.get("saebench_core", [])]
            if not cores:
                continue
            flat: dict[str, list[float]] = {}
            for c in cores:
                for cat, d in c.items():
                    for key, v in d.items():
                        if isinstance(v, (int, float)):
                            flat.setdefault(f"{cat}.{key}", []).append(float(v))
            out.setdefault(cond, {})[str(k)] = {key: float(np.mean(v)) for key, v in flat.items()}
    return out


def fvu_improvement_pct(summary: dict, k_values) -> dict[str, dict[str, float]]:
    """``{condition: {str(k): 100 * (FVU_baseline - FVU_condition) / FVU_baseline}}`` from :func:`summarise`'s
    per-condition, per-k means (percent; positive: the condition reconstructs better than the baseline); a k
    missing in either is left out, and the baseline has no entry."""
    improvement: dict[str, dict[str, float]] = {}
    for cond in summary:
        for k in k_values:
            b, m = summary.get("baseline", {}).get(str(k)), summary[cond].get(str(k))
            if cond != "baseline" and b and m:
                improvement.setdefault(cond, {})[str(k)] = 100 * (b["fvu"]["mean"] - m["fvu"]["mean"]) / b["fvu"]["mean"]
    return improvement
