"""ConServe's claims against AMPD, measured on a sweep, with paired confidence intervals and the
sensitivity of each verdict to the simulator's uncalibrated constants (``+experiment=conserve_sensitivity``).

The claims (ConServe, arXiv 2606.01839, abstract; docs/schedulers.md):
  C1 p95 TTFET -51.08 % vs AMPD; C2 zero SLO violations at the tested rates; C3 tokens/J +7.51 % vs AMPD
  (homogeneous tier); C4 a further +22.75 % tokens/J on the heterogeneous tier (ConServe hetero over
  ConServe homogeneous); C5 AMPD degrades linearly with prediction error while ConServe is flat.

Runs are classified from their config columns (``harness.report.load_sweep``): variant (``conserve``,
``ampd_rd`` = AMPD ``mode=remote_default``, ``ampd_cost``), tier (``cluster.name``), rate, seed,
prediction error (``scheduler.predictor.*``) and the sensitivity arm (the one ``hardware.*`` constant
that differs from its most common value). Ratios are paired: the two runs share the seed (the same
conversations and arrival times); cells show the geometric-mean ratio - 1 with the 95 % Student-t
interval of the mean log ratio over the seeds (``harness.stats.mean_ci``) transformed back, or the single
value for one seed.

Verdicts: for a reduction claim (C1), "reproduced" when the whole interval (or the single value) is below 0 and the mean is
at least half the paper's size, "not reproduced" otherwise (the cell says whether the direction agrees);
for a gain claim (C3, C4) the mirror image; C2 "reproduced" when every seed at every rate has
attainment 1.0; C5 "reproduced" when AMPD's p95 TTFET at the largest error rate is above its error-free
value with the interval above 0 and the means grow linearly (R^2 >= 0.8 over the error rates). A claim
whose verdict differs between readings, AMPD modes, rates or sensitivity arms is "depends on X" with X
named.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import pandas as pd

PAPER = {"C1": -51.08, "C3": 7.51, "C4": 22.75}
READINGS = ("first", "visible")
MODES = ("ampd_rd", "ampd_cost")
MODE_LABEL = {"ampd_rd": "AMPD remote_default", "ampd_cost": "AMPD cost"}
# A sensitivity arm "moves" a ratio when its sign differs from the base run's and one of the two is at
# least this far from 0 (%): single-seed ratios closer to 0 than that are within seed-to-seed noise (the
# visible-reading ratios at 0.03 conv/s, where nothing queues, spread by about +-0.5 % over seeds).
SIGN_RESOLUTION_PCT = 1.0
HW_KEYS = ("kv_memory_efficiency", "prefill_efficiency", "memory_power_frac", "idle_w", "memory_efficiency")


def _col(df: pd.DataFrame, key: str) -> pd.Series:
    return df[key] if key in df.columns else pd.Series([None] * len(df), index=df.index, dtype=object)


def classify(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with ``_variant``, ``_error`` (float error rate, or ``sigma<x>``; 0 = none), ``_error_label``,
    ``_sens`` (``base`` or ``<key>=<value>``), ``_tier``, ``_rate``, ``_seed`` columns added."""
    r = runs.copy()
    name = _col(r, "scheduler.name").astype(str)
    mode = _col(r, "scheduler.mode").fillna("remote_default").astype(str)
    r["_variant"] = np.where(name == "ampd", np.where(mode == "cost", "ampd_cost", "ampd_rd"), name)
    er = pd.to_numeric(_col(r, "scheduler.predictor.error_rate"), errors="coerce").fillna(0.0)
    sg = pd.to_numeric(_col(r, "scheduler.predictor.sigma"), errors="coerce").fillna(0.0)
    pm = _col(r, "scheduler.predictor.mode").fillna("lognormal").astype(str)
    r["_error_label"] = [("none" if (m == "rate" and e == 0) or (m != "rate" and s == 0)
                          else f"rate {e:g}" if m == "rate" else f"sigma {s:g}") for m, e, s in zip(pm, er, sg)]
    r["_error"] = [0.0 if lab == "none" else (e if m == "rate" else math.nan)
                   for lab, m, e in zip(r["_error_label"], pm, er)]
    sens = ["base"] * len(r)
    for key in HW_KEYS:
        cols = [c for c in r.columns if c.startswith("hardware.") and c.endswith("." + key)]
        for c in cols:
            v = pd.to_numeric(r[c], errors="coerce")
            if v.nunique() < 2:
                continue
            mode_v = v.mode().iloc[0]
            for i, x in enumerate(v):
                if np.isfinite(x) and x != mode_v and sens[i] == "base":
                    sens[i] = f"{key}={x:g}"
    r["_sens"] = sens
    r["_tier"] = _col(r, "cluster.name").astype(str)
    r["_rate"] = pd.to_numeric(_col(r, "workload.rate_per_s"), errors="coerce")
    r["_seed"] = pd.to_numeric(_col(r, "workload.seed"), errors="coerce")
    return r


def _ci(values) -> tuple[float, float, int]:
    from harness.stats import mean_ci
    return mean_ci(values)


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.1)
    return plt, sns


def _save(fig, out, name: str) -> list:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in ("png", "pdf"):
        p = out / f"{name}.{fmt}"
        fig.savefig(p, dpi=110, bbox_inches="tight")
        paths.append(p)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return paths


def paired(a: pd.DataFrame, b: pd.DataFrame, metric: str) -> tuple[float, tuple[float, float], int]:
    """The paired ratio ``a[metric] / b[metric]`` over seeds (runs matched on the seed), in % change:
    ``(geometric mean - 1, (low, high) of its 95 % interval - 1, n)``, all x 100. The interval is the
    Student-t interval of the mean log ratio, transformed back (ratios are multiplicative: one seed at
    50x must not swamp the others as it does in an arithmetic mean). n = 0 when either side lacks the
    metric; the interval is NaN for n = 1."""
    nan = (math.nan, math.nan)
    if metric not in a.columns or metric not in b.columns:
        return math.nan, nan, 0
    m = a[["_seed", metric]].merge(b[["_seed", metric]], on="_seed", suffixes=("_a", "_b"))
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log(pd.to_numeric(m[f"{metric}_a"], errors="coerce") / pd.to_numeric(m[f"{metric}_b"], errors="coerce"))
    mean, half, n = _ci(x[np.isfinite(x)])
    if n == 0:
        return math.nan, nan, 0
    pct = (math.exp(mean) - 1) * 100
    if not np.isfinite(half):
        return pct, nan, n
    return pct, ((math.exp(mean - half) - 1) * 100, (math.exp(mean + half) - 1) * 100), n


def fmt(mean: float, ci: tuple[float, float], n: int, unit: str = " %") -> str:
    """``-20.4 % [-41.0, +7.8] (n=3)``; the single value for n = 1."""
    if n == 0 or not np.isfinite(mean):
        return "n/a"
    if n == 1 or not np.isfinite(ci[0]):
        return f"{mean:+.1f}{unit} (n={n})"
    return f"{mean:+.1f}{unit} [{ci[0]:+.1f}, {ci[1]:+.1f}] (n={n})"


def verdict_change(mean: float, ci: tuple[float, float], n: int, paper: float) -> str:
    """Reduction (paper < 0) or gain claim: ``reproduced`` / ``not reproduced`` with the direction
    (module docstring); ``ci`` is the interval's (low, high) in %, NaN for one seed (then the single
    value decides)."""
    if n == 0 or not np.isfinite(mean):
        return "no data"
    lo, hi = (ci if np.isfinite(ci[0]) else (mean, mean))
    sign = -1 if paper < 0 else 1
    significant = hi < 0 if sign < 0 else lo > 0
    if significant and abs(mean) >= abs(paper) / 2:
        return "reproduced"
    if significant:
        return "not reproduced (same direction, smaller)"
    opposite = lo > 0 if sign < 0 else hi < 0
    return "not reproduced (opposite direction)" if opposite else "not reproduced (no significant difference)"


def _base(r: pd.DataFrame) -> pd.DataFrame:
    return r[(r._sens == "base") & (r._error_label == "none")]


def _depends(cells: list[dict], factors: list[str]) -> str:
    """``reproduced`` / ``not reproduced`` when every cell agrees, else ``depends on`` the factors along
    which two cells that differ only in that factor get different verdicts."""
    kinds = {c["verdict"].split(" (")[0] for c in cells if c["verdict"] != "no data"}
    if len(kinds) <= 1:
        return next(iter(kinds), "no data")
    dep = []
    for f in factors:
        others = [g for g in factors if g != f]
        groups: dict = {}
        for c in cells:
            groups.setdefault(tuple(c[g] for g in others), set()).add(c["verdict"].split(" (")[0])
        if any(len(v) > 1 for v in groups.values()):
            dep.append(f)
    return "depends on " + (", ".join(dep) if dep else "the combination of " + ", ".join(factors))


def claim_ttfet(r: pd.DataFrame, homo: str) -> tuple[list[str], str, list[dict]]:
    """C1: paired p95 TTFET ratio ConServe / AMPD - 1 per reading, AMPD mode and rate (homogeneous tier)."""
    b = _base(r)
    b = b[b._tier == homo]
    lines = ["| rate (conv/s) | reading | vs | ConServe / AMPD − 1 (p95 TTFET) | verdict |", "|---|---|---|---|---|"]
    cells = []
    for rate in sorted(b._rate.dropna().unique()):
        for rd in READINGS:
            for m in MODES:
                cs, am = b[(b._variant == "conserve") & (b._rate == rate)], b[(b._variant == m) & (b._rate == rate)]
                if cs.empty or am.empty:
                    continue
                mean, half, n = paired(cs, am, f"ttfet_{rd}_p95_s")
                v = verdict_change(mean, half, n, PAPER["C1"])
                cells.append({"rate": rate, "reading": rd, "mode": m, "verdict": v, "mean": mean})
                lines.append(f"| {rate:g} | {rd} | {MODE_LABEL[m]} | {fmt(mean, half, n)} | {v} |")
    return lines, _depends(cells, ["reading", "mode", "rate"]), cells


def claim_slo(r: pd.DataFrame, homo: str) -> tuple[list[str], str, list[dict]]:
    """C2: SLO attainment per reading and rate (mean, min over seeds), ConServe and the AMPD modes."""
    b = _base(r)
    b = b[b._tier == homo]
    lines = ["| rate (conv/s) | reading | ConServe attainment: mean ± CI (min) | AMPD remote_default | AMPD cost |",
             "|---|---|---|---|---|"]
    cells = []
    for rate in sorted(b._rate.dropna().unique()):
        for rd in READINGS:
            col = f"slo_attainment_{rd}"
            if col not in b.columns:
                continue
            row = [f"{rate:g}", rd]
            for v in ("conserve", *MODES):
                x = pd.to_numeric(b[(b._variant == v) & (b._rate == rate)][col], errors="coerce").dropna()
                mean, half, n = _ci(x)
                row.append(f"{mean:.3f} ± {half:.3f} (min {x.min():.3f})" if n > 1 else
                           (f"{mean:.3f}" if n else "n/a"))
                if v == "conserve" and n:
                    ok = bool((x >= 1.0).all())
                    cells.append({"rate": rate, "reading": rd,
                                  "verdict": "reproduced" if ok else "not reproduced"})
            lines.append("| " + " | ".join(row) + " |")
    return lines, _depends(cells, ["reading", "rate"]), cells


def claim_energy(r: pd.DataFrame, homo: str, hetero: Optional[str]) -> tuple[list[str], dict, list[dict], list[dict]]:
    """C3 (ConServe / AMPD tokens/J, homogeneous) and C4 (ConServe hetero / ConServe homogeneous)."""
    b = _base(r)
    lines = ["| rate (conv/s) | comparison | tokens/J ratio − 1 | paper | verdict |", "|---|---|---|---|---|"]
    c3, c4 = [], []
    for rate in sorted(b._rate.dropna().unique()):
        cs_h = b[(b._variant == "conserve") & (b._rate == rate) & (b._tier == homo)]
        for m in MODES:
            am = b[(b._variant == m) & (b._rate == rate) & (b._tier == homo)]
            if cs_h.empty or am.empty:
                continue
            mean, half, n = paired(cs_h, am, "tokens_per_joule")
            v = verdict_change(mean, half, n, PAPER["C3"])
            c3.append({"rate": rate, "mode": m, "verdict": v, "mean": mean})
            lines.append(f"| {rate:g} | C3: ConServe / {MODE_LABEL[m]}, {homo} | {fmt(mean, half, n)} | "
                         f"+{PAPER['C3']} % | {v} |")
        if hetero:
            cs_x = b[(b._variant == "conserve") & (b._rate == rate) & (b._tier == hetero)]
            if not cs_x.empty and not cs_h.empty:
                mean, half, n = paired(cs_x, cs_h, "tokens_per_joule")
                v = verdict_change(mean, half, n, PAPER["C4"])
                c4.append({"rate": rate, "verdict": v, "mean": mean})
                lines.append(f"| {rate:g} | C4: ConServe on {hetero} / on {homo} | {fmt(mean, half, n)} | "
                             f"+{PAPER['C4']} % | {v} |")
    return lines, {"C3": _depends(c3, ["mode", "rate"]), "C4": _depends(c4, ["rate"])}, c3, c4


def claim_robustness(r: pd.DataFrame, homo: str) -> tuple[list[str], str, list[dict]]:
    """C5: AMPD's metrics at each error level over its own error-free run on the same seed (paired),
    ConServe's value beside; the linear fit of the mean ratios over the error rate."""
    b = r[(r._sens == "base") & (r._tier == homo)]
    err = b[b._error_label != "none"]
    if err.empty:
        return [], "no data", []
    rate = float(err._rate.dropna().iloc[0])
    b = b[b._rate == rate]
    metrics = [("ttfet_first_p95_s", "p95 TTFET first"), ("ttfet_visible_p95_s", "p95 TTFET visible"),
               ("slo_attainment_first", "SLO attainment first"), ("slo_attainment_visible", "SLO attainment visible")]
    lines = [f"At {rate:g} conv/s on {homo}; each cell: AMPD at that error / AMPD error-free (same mode, same "
             f"seed) − 1; decision flips = share of turns ≥ 1 whose remote/local choice differs from the error-free "
             f"predictor's on the same view.", "",
             "| AMPD mode | error | decision flips | " + " | ".join(lab for _, lab in metrics) + " |",
             "|---|---|---|" + "---|" * len(metrics)]
    cells = []
    for m in MODES:
        zero = b[(b._variant == m) & (b._error_label == "none")]
        if zero.empty:
            continue
        labels = sorted(set(b[(b._variant == m)]._error_label) - {"none"},
                        key=lambda s: (s.startswith("sigma"), float(s.split()[1])))
        pts = {}
        for lab in labels:
            e = b[(b._variant == m) & (b._error_label == lab)]
            flips = _ci(pd.to_numeric(e.get("ampd_decision_flip_frac", pd.Series(dtype=float)), errors="coerce"))
            row = [MODE_LABEL[m], lab, f"{flips[0]:.3f}" if flips[2] else "n/a"]
            for key, _ in metrics:
                mean, half, n = paired(e, zero, key)
                row.append(fmt(mean, half, n))
                if lab.startswith("rate"):
                    pts.setdefault(key, []).append((float(lab.split()[1]), mean, half, n))
            lines.append("| " + " | ".join(row) + " |")
        for key, lab in metrics[:2]:
            p = sorted([(0.0, 0.0, (0.0, 0.0), 0)] + pts.get(key, []))
            if len(p) < 3:
                continue
            x, y = np.array([q[0] for q in p]), np.array([q[1] for q in p])
            slope, icpt = np.polyfit(x, y, 1)
            ss = float(((y - (slope * x + icpt)) ** 2).sum())
            tot = float(((y - y.mean()) ** 2).sum())
            r2 = 1 - ss / tot if tot > 0 else math.nan
            top = p[-1]
            sig = top[3] > 1 and top[2][0] > 0
            ok = sig and np.isfinite(r2) and r2 >= 0.8
            v = "reproduced" if ok else "not reproduced"
            cells.append({"mode": m, "reading": lab.split()[-1], "verdict": v, "slope": slope, "r2": r2})
            lines.append(f"| {MODE_LABEL[m]} | linear fit, {lab} | | slope {slope:+.1f} % per unit error rate, "
                         f"R² {r2:.2f}; at rate {top[0]:g}: {fmt(top[1], top[2], top[3])} → {v} | | | |")
    cs = b[(b._variant == "conserve") & (b._error_label == "none")]
    if not cs.empty:
        vals = [f"{_ci(cs[k])[0]:.3g}" if k in cs.columns else "n/a" for k, _ in metrics]
        lines.append("| ConServe (predicts nothing: flat by construction) | — | — | " + " | ".join(vals) + " |")
    return lines, _depends(cells, ["mode", "reading"]), cells


def sensitivity(r: pd.DataFrame, homo: str, hetero: Optional[str]) -> tuple[list[str], dict]:
    """Each sensitivity arm (1 seed) against the base runs of the same seed and rate: the C1, C3, C4
    ratios, and whether their sign differs from the base seed's (the verdict moves)."""
    arms = sorted(set(r._sens) - {"base"})
    if not arms:
        return [], {}
    s_rate = float(r[r._sens != "base"]._rate.dropna().iloc[0])
    seed = float(r[r._sens != "base"]._seed.dropna().iloc[0])
    base = r[(r._error_label == "none") & (r._rate == s_rate) & (r._seed == seed)]

    def one(df, v, tier):
        x = df[(df._variant == v) & (df._tier == tier)]
        return x.iloc[0] if len(x) else None

    def ratio(a, b, k):
        if a is None or b is None or k not in a.index or k not in b.index:
            return math.nan
        return (a[k] / b[k] - 1) * 100

    cols = [("C1 first", "ttfet_first_p95_s", "conserve", homo, "ampd_rd", homo),
            ("C1 visible", "ttfet_visible_p95_s", "conserve", homo, "ampd_rd", homo),
            ("C1 first (cost)", "ttfet_first_p95_s", "conserve", homo, "ampd_cost", homo),
            ("C1 visible (cost)", "ttfet_visible_p95_s", "conserve", homo, "ampd_cost", homo),
            ("C3", "tokens_per_joule", "conserve", homo, "ampd_rd", homo),
            ("C3 (cost)", "tokens_per_joule", "conserve", homo, "ampd_cost", homo)]
    if hetero:
        cols.append(("C4", "tokens_per_joule", "conserve", hetero, "conserve", homo))
    lines = [f"One seed ({seed:g}) at {s_rate:g} conv/s; each cell: the ratio − 1 (%) with that constant moved "
             f"(the base row: all constants as shipped). A sign different from the base row's, one of the two beyond "
             f"±{SIGN_RESOLUTION_PCT:g} %, is marked ⚠.", "",
             "| arm | " + " | ".join(c[0] for c in cols) + " |", "|---|" + "---|" * len(cols)]
    base_vals = [ratio(one(base[base._sens == "base"], a, ta), one(base[base._sens == "base"], bb, tb), k)
                 for _, k, a, ta, bb, tb in cols]
    lines.append("| base | " + " | ".join(f"{v:+.1f}" for v in base_vals) + " |")
    moved: dict[str, list[str]] = {}
    for arm in arms:
        a_df = r[(r._sens == arm)]
        vals = []
        for (lab, k, a, ta, bb, tb), bv in zip(cols, base_vals):
            v = ratio(one(a_df, a, ta), one(a_df, bb, tb), k)
            flip = (np.isfinite(v) and np.isfinite(bv) and np.sign(v) != np.sign(bv)
                    and max(abs(v), abs(bv)) >= SIGN_RESOLUTION_PCT)
            if flip:
                moved.setdefault(lab.split()[0], []).append(arm)
            vals.append(f"{v:+.1f}{' ⚠' if flip else ''}")
        lines.append(f"| {arm} | " + " | ".join(vals) + " |")
    return lines, moved


def claims_markdown(runs: pd.DataFrame) -> str:
    """The claims report (markdown) for a sweep's tidy runs table; empty when the sweep has no
    ConServe-vs-AMPD runs."""
    r = classify(runs)
    if not {"conserve"} <= set(r._variant) or not set(MODES) & set(r._variant):
        return ""
    tiers = sorted(set(r._tier))
    homo = next((t for t in tiers if not t.endswith("_hetero")), tiers[0])
    hetero = next((t for t in tiers if t.endswith("_hetero")), None)
    l1, v1, _ = claim_ttfet(r, homo)
    l2, v2, _ = claim_slo(r, homo)
    l3, v34, _, _ = claim_energy(r, homo, hetero)
    l5, v5, _ = claim_robustness(r, homo)
    ls, moved = sensitivity(r, homo, hetero)

    def mv(c):
        return ("; moves under " + ", ".join(sorted(set(moved[c])))) if c in moved else (
            "; no sensitivity arm changes its sign" if ls else "")
    out = ["# ConServe's claims vs AMPD", "",
           "Paired ratios on the same seed: geometric mean of the per-seed ratios − 1, with the 95 % Student-t "
           "interval of the mean log ratio [low, high]; definitions and verdict rules: `harness/claims.py`.", "",
           "| claim | paper | verdict |", "|---|---|---|",
           f"| C1 p95 TTFET vs AMPD | {PAPER['C1']} % | {v1}{mv('C1')} |",
           f"| C2 zero SLO violations at every rate | 0 violations | {v2} |",
           f"| C3 tokens/J vs AMPD, {homo} | +{PAPER['C3']} % | {v34['C3']}{mv('C3')} |",
           f"| C4 further tokens/J on {hetero} | +{PAPER['C4']} % | {v34['C4']}{mv('C4')} |",
           f"| C5 AMPD degrades linearly with error, ConServe flat | linear / flat | {v5} |", "",
           "## C1: p95 TTFET, ConServe vs AMPD", "", *l1, "",
           "## C2: SLO attainment (each variant against its own unloaded TTFET)", "", *l2, "",
           "## C3, C4: tokens per joule", "", *l3, ""]
    if l5:
        out += ["## C5: AMPD vs prediction error", "", *l5, ""]
    if ls:
        out += ["## Sensitivity to the uncalibrated constants", "", *ls, ""]
    return "\n".join(out) + "\n"


def gpu_count(instances_json: Any) -> float:
    """GPUs of a cluster from the runs table's ``cluster.instances`` column (a JSON list of groups)."""
    import json
    try:
        groups = json.loads(instances_json) if isinstance(instances_json, str) else instances_json
        return float(sum(int(g.get("count", 1)) for g in groups))
    except (TypeError, ValueError, AttributeError):
        return math.nan


def split_markdown(runs: pd.DataFrame) -> str:
    """The P/D split on equal GPU counts (``+experiment=pd_split``): per GPU count, cluster and variant,
    the p95 TTFET of both readings (geometric mean over seeds [t-interval of the mean log]), SLO
    attainment (mean), tokens/J (mean), and the paired p95 ratios to collocated serving on the same GPU
    count and seed. Empty unless the sweep has collocated runs beside P/D runs on as many GPUs."""
    r = classify(runs)
    if "cluster.instances" not in r.columns or "collocated" not in set(r._variant):
        return ""
    r["_gpus"] = r["cluster.instances"].map(gpu_count)
    r = r[r._sens == "base"]
    lines = ["## The P/D split on equal GPU counts", "",
             "Per GPU count: p95 TTFET (geometric mean over seeds [95 % interval]), SLO attainment and tokens/J "
             "(mean over seeds), and the paired p95 ratio to collocated serving on the same GPUs and seed.", "",
             "| GPUs | rate (conv/s) | cluster | variant | p95 TTFET first (s) | p95 TTFET visible (s) | SLO first | "
             "SLO visible | tokens/J | first vs collocated | visible vs collocated |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    found = False
    for g, grp in r.groupby("_gpus"):
        col = grp[grp._variant == "collocated"]
        if col.empty or len(set(grp._variant)) < 2:
            continue
        found = True
        for (cl, v), x in grp.groupby(["_tier", "_variant"], sort=True):
            cells = []
            for k in ("ttfet_first_p95_s", "ttfet_visible_p95_s"):
                vals = pd.to_numeric(x[k], errors="coerce")
                lm, hh, n = _ci(np.log(vals[vals > 0]))
                cells.append(f"{math.exp(lm):.3g} [{math.exp(lm - hh):.3g}, {math.exp(lm + hh):.3g}]"
                             if n > 1 and np.isfinite(hh) else (f"{math.exp(lm):.3g}" if n else "n/a"))
            for k in ("slo_attainment_first", "slo_attainment_visible", "tokens_per_joule"):
                cells.append(f"{_ci(pd.to_numeric(x[k], errors='coerce'))[0]:.3g}" if k in x.columns else "n/a")
            for k in ("ttfet_first_p95_s", "ttfet_visible_p95_s"):
                cells.append("—" if v == "collocated" else fmt(*paired(x, col, k)))
            rate = x._rate.dropna()
            lines.append(f"| {g:g} | {rate.iloc[0]:g} | {cl} | {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" if found else ""


def claims_figures(runs: pd.DataFrame, out_dir: Any) -> list:
    """Figures of the claims (PNG + PDF into ``out_dir``): ``claims_vs_rate`` (p95 TTFET of both readings
    -- geometric mean and the t-interval of the mean log over seeds, log axis -- and SLO attainment of
    both readings -- mean and t-interval -- vs the arrival rate, base runs on the homogeneous tier), ``claims_tokens_per_joule`` (tokens/J per variant and tier vs rate) and
    ``claims_vs_error`` (AMPD's p95 TTFET and SLO attainment, both readings, vs the error rate, paired
    ratio to its error-free run; ConServe's error-free value as a reference line)."""
    from pathlib import Path

    from harness.stats import mean_ci
    r = classify(runs)
    if not {"conserve"} <= set(r._variant):
        return []
    plt, sns = _plt()
    out = Path(out_dir)
    tiers = sorted(set(r._tier))
    homo = next((t for t in tiers if not t.endswith("_hetero")), tiers[0])
    b = _base(r)
    labels = {"conserve": "ConServe", **MODE_LABEL}
    made = []
    h = b[b._tier == homo]
    metrics = [("ttfet_first_p95_s", "p95 TTFET, first turn (s)"), ("ttfet_visible_p95_s", "p95 TTFET, visible turn (s)"),
               ("slo_attainment_first", "SLO attainment, first turn"), ("slo_attainment_visible", "SLO attainment, visible turn")]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    for ax, (k, lab) in zip(axes, metrics):
        for v in ("conserve", *MODES):
            g = h[h._variant == v]
            if k not in g.columns:
                continue
            xs, ms, err = [], [], []
            for x, gg in g.groupby("_rate"):
                vals = pd.to_numeric(gg[k], errors="coerce")
                if k.startswith("slo"):  # arithmetic mean +- t half-width
                    m, hh, n = mean_ci(vals)
                    lo, hi = (m - hh, m + hh) if np.isfinite(hh) else (m, m)
                else:  # times span decades: geometric mean, t interval of the mean log
                    lm, hh, n = mean_ci(np.log(vals[vals > 0]))
                    m = math.exp(lm) if n else math.nan
                    lo, hi = (math.exp(lm - hh), math.exp(lm + hh)) if np.isfinite(hh) else (m, m)
                if n:
                    xs.append(x), ms.append(m), err.append((m - lo, hi - m))
            if xs:
                ax.errorbar(xs, ms, yerr=np.array(err).T, marker="o", capsize=3, label=labels[v])
        ax.set_xlabel("arrival rate (conversations/s)")
        ax.set_ylabel(lab)
        if k.startswith("slo"):
            ax.set_ylim(-0.03, 1.03)
        else:
            ax.set_yscale("log")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(frameon=False)
    fig.suptitle(f"{homo}; p95 TTFET: geometric mean over seeds with the 95 % t-interval of the mean log; "
                 f"SLO attainment (against each variant's own unloaded TTFET): mean ± 95 % t-interval", y=1.02)
    fig.tight_layout()
    made += _save(fig, out, "claims_vs_rate")
    e = b.copy()
    e["variant"] = e._variant.map(lambda v: labels[v].replace(" ", "\n", 1))
    g = sns.catplot(data=e, kind="bar", x="variant", y="tokens_per_joule", hue="_tier", col="_rate",
                    errorbar=lambda x: (mean_ci(x)[0] - np.nan_to_num(mean_ci(x)[1]),
                                        mean_ci(x)[0] + np.nan_to_num(mean_ci(x)[1])),
                    capsize=0.1, height=3.2, aspect=1.1)
    g.set_axis_labels("", "tokens per joule (tokens/J)")
    g.set_titles(col_template="rate = {col_name} conv/s")
    if g._legend:
        g._legend.set_title("tier (cluster)")
    made += _save(g.figure, out, "claims_tokens_per_joule")
    er = r[(r._sens == "base") & (r._tier == homo) & r._error.notna()]
    if (er._error > 0).any():
        rate = float(er[er._error > 0]._rate.iloc[0])
        er = er[er._rate == rate]
        fig, axes = plt.subplots(1, 4, figsize=(17, 4.0))
        for ax, (k, lab) in zip(axes, metrics):
            for v in MODES:
                z = er[(er._variant == v) & (er._error == 0)]
                xs, ms, hs = [], [], []
                for x in sorted(er[er._variant == v]._error.unique()):
                    m, ci, n = paired(er[(er._variant == v) & (er._error == x)], z, k) if x > 0 else (0.0, (0.0, 0.0), 1)
                    if n:
                        lo, hi = ci if np.isfinite(ci[0]) else (m, m)
                        xs.append(x), ms.append(m), hs.append((m - lo, hi - m))
                if len(xs) > 1:
                    ax.errorbar(xs, ms, yerr=np.array(hs).T, marker="o", capsize=3, label=labels[v])
            ax.axhline(0.0, color="grey", ls="--", lw=1, label="error-free (ConServe predicts nothing: flat)")
            ax.set_xlabel("prediction error rate (fraction of predictions x or / 2)")
            ax.set_ylabel(f"{lab}\nvs error-free (%)")
        axes[0].legend(frameon=False, fontsize=8)
        fig.suptitle(f"AMPD vs prediction error at {rate:g} conv/s on {homo}; paired on the seed: geometric-mean "
                     f"ratio − 1 with the 95 % t-interval of the mean log", y=1.02)
        fig.tight_layout()
        made += _save(fig, out, "claims_vs_error")
    return made


def write_claims(runs: pd.DataFrame, out_dir: Any, draw: bool = False) -> Optional[str]:
    """Write ``claims.md`` (and, with ``draw``, the claims figures into ``out_dir/figures``) when the
    sweep compares ConServe with AMPD (plus the P/D-split table when it also runs collocated serving on
    as many GPUs); returns the text."""
    from pathlib import Path
    text = claims_markdown(runs)
    split = split_markdown(runs)
    if split:
        text = (text or "# ConServe's claims vs AMPD\n\n") + "\n" + split
    if text:
        (Path(out_dir) / "claims.md").write_text(text)
        if draw:
            claims_figures(runs, Path(out_dir) / "figures")
    return text or None
