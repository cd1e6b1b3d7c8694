"""ConServe's claims against AMPD, measured on a sweep, with paired confidence intervals and the
sensitivity of each verdict to the simulator's uncalibrated constants (``+experiment=conserve_sensitivity``).

The claims (ConServe, arXiv 2606.01839, abstract; docs/schedulers.md):
  C1 p95 TTFET -51.08 % vs AMPD; C2 zero SLO violations at the tested rates; C3 tokens/J +7.51 % vs AMPD
  (homogeneous tier); C4 a further +22.75 % tokens/J on the heterogeneous tier (ConServe hetero over
  ConServe homogeneous); C5 AMPD degrades linearly with prediction error while ConServe is flat.

Runs are classified from their config columns (``harness.analysis.report.load_sweep``): variant (``conserve``,
``ampd_rd`` = AMPD ``mode=remote_default``, ``ampd_cost``, or the scheduler's name for the other
variants), tier (``cluster.name``), rate, seed, prediction error (``scheduler.predictor.*``) and the
sensitivity arm (the one ``hardware.*`` constant that differs from its most common value). Ratios are
paired: the two runs share the seed (the same conversations and arrival times); the seed is the
independent unit. Cells show the geometric-mean ratio - 1 with the 95 % Student-t interval of the mean
log ratio over the seeds transformed back (``harness.analysis.stats.ratio_interval``), n and the sign count
(k of n seeds on the estimate's side of 0), or the single value for one seed.

Verdicts: every verdict word comes from ``harness.analysis.stats.verdict`` (docs/metrics.md, "Intervals and
verdicts"): reproduced / same direction, smaller / opposite / no difference / inconclusive, decided by the
interval. C1, C3, C4: the paired ratio against the paper's number; C2: ConServe's SLO violations (the mean
violated share over seeds in percentage points, the interval of ``harness.analysis.stats.violation_share``)
against the claimed 0, within the equivalence margin; C5: AMPD's paired ratio
at the largest error rate against its error-free run, direction "grows" (any size), with the linear
fit's R^2 beside it (descriptive). One seed gives no interval, so "inconclusive".

The sensitivity matrix (:func:`sensitivity_matrix`): each claim's word per modelling choice (AMPD rule,
rate, TTFET reading, and each uncalibrated constant of the sensitivity arms); the claim's overall word is
the one that holds across the matrix, else "depends on <choices>" naming each choice that flips it; C4,
which rests on the power model of two tiers, reads "model-dependent (not measurable without NVML on the
tier)" wherever anything flips it.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import pandas as pd

from harness.analysis.stats import (EQUIVALENCE_MARGIN_PCT, logit_t_interval, mean_ci, point_interval, ratio_interval,
                                    verdict, violation_share)

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
    """``runs`` with ``_variant``, ``_error`` (float error rate, or ``sigma<x>``; 0 = none), ``_error_label``
    (``none``, ``rate x``, ``sigma x``, ``misroute x`` or ``<predictor label> + misroute x``), ``_misroute``,
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
    # error at the decision (AMPD scheduler.misroute_frac): its own label, so a misrouted arm is never taken
    # for the error-free baseline
    mis = pd.to_numeric(_col(r, "scheduler.misroute_frac"), errors="coerce").fillna(0.0)
    r["_misroute"] = mis
    r["_error_label"] = [lab if not x > 0 else (f"misroute {x:g}" if lab == "none" else f"{lab} + misroute {x:g}")
                         for lab, x in zip(r["_error_label"], mis)]
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


def paired(a: pd.DataFrame, b: pd.DataFrame, metric: str) -> tuple[float, tuple[float, float], int, int]:
    """The paired ratio ``a[metric] / b[metric]`` over seeds (runs matched on the seed), in % change:
    ``(geometric mean - 1, (low, high) of its 95 % interval - 1, n, k)`` (x 100 but n and k) from
    :func:`harness.analysis.stats.ratio_interval`: the Student-t interval of the mean log ratio, transformed back
    (ratios are multiplicative: one seed at 50x must not swamp the others as it does in an arithmetic
    mean); k = seeds on the estimate's side (the sign count). n = 0 when either side lacks the metric; the
    interval is NaN for n = 1."""
    if metric not in a.columns or metric not in b.columns:
        return math.nan, (math.nan, math.nan), 0, 0
    m = a[["_seed", metric]].merge(b[["_seed", metric]], on="_seed", suffixes=("_a", "_b"))
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log(pd.to_numeric(m[f"{metric}_a"], errors="coerce") / pd.to_numeric(m[f"{metric}_b"], errors="coerce"))
    return ratio_interval(x[np.isfinite(x)])


def fmt(mean: float, ci: tuple[float, float], n: int, k: Optional[int] = None, unit: str = " %") -> str:
    """``-20.4 % [-41.0, +7.8] (n=3, 3 of 3 < 0)``: estimate, 95 % interval, seeds and (with ``k``) the sign
    count; the single value for n = 1."""
    if n == 0 or not np.isfinite(mean):
        return "n/a"
    signs = "" if k is None or mean == 0 else f", {k} of {n} {'<' if mean < 0 else '>'} 0"
    if n == 1 or not np.isfinite(ci[0]):
        return f"{mean:+.1f}{unit} (n={n}{signs})"
    return f"{mean:+.1f}{unit} [{ci[0]:+.1f}, {ci[1]:+.1f}] (n={n}{signs})"


def _base(r: pd.DataFrame) -> pd.DataFrame:
    return r[(r._sens == "base") & (r._error_label == "none")]


def _flipping(cells: list[dict], factors: list[str]) -> list[str]:
    """The factors along which two cells that differ only in that factor get different verdicts."""
    dep = []
    for f in factors:
        others = [g for g in factors if g != f]
        groups: dict = {}
        for c in cells:
            groups.setdefault(tuple(c.get(g) for g in others), set()).add(c["verdict"])
        if any(len(v) > 1 for v in groups.values()):
            dep.append(f)
    return dep


def _depends(cells: list[dict], factors: list[str]) -> str:
    """The one verdict (:func:`harness.analysis.stats.verdict`) when every cell agrees, else ``depends on`` the
    factors along which two cells that differ only in that factor get different verdicts; ``no data``
    without cells."""
    kinds = {c["verdict"] for c in cells}
    if len(kinds) <= 1:
        return next(iter(kinds), "no data")
    dep = _flipping(cells, factors)
    return "depends on " + (", ".join(dep) if dep else "the combination of " + ", ".join(factors))


def claim_ttfet(r: pd.DataFrame, homo: str, margin: float = EQUIVALENCE_MARGIN_PCT) -> tuple[list[str], str, list[dict]]:
    """C1: paired p95 TTFET ratio ConServe / AMPD - 1 per reading, AMPD mode and rate (homogeneous tier),
    each with its verdict (:func:`harness.analysis.stats.verdict`, equivalence ``margin`` in %)."""
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
                mean, ci, n, k = paired(cs, am, f"ttfet_{rd}_p95_s")
                v = verdict(mean, ci, PAPER["C1"], margin)
                cells.append({"rate": rate, "reading": rd, "mode": m, "verdict": v, "mean": mean, "ci": ci, "n": n})
                lines.append(f"| {rate:g} | {rd} | {MODE_LABEL[m]} | {fmt(mean, ci, n, k)} | {v} |")
    return lines, _depends(cells, ["reading", "mode", "rate"]), cells


def claim_slo(r: pd.DataFrame, homo: str, margin: float = EQUIVALENCE_MARGIN_PCT) -> tuple[list[str], str, list[dict]]:
    """C2: SLO attainment per reading and rate (seed-level estimate [95 % logit interval], min over seeds),
    ConServe and the AMPD modes, and ConServe's violations judged against the paper's zero: the mean over
    seeds of each seed's violated share, in percentage points, with the 95 % interval of
    :func:`harness.analysis.stats.violation_share` (the seed-level t-interval joined with the pooled
    conversations' Clopper-Pearson interval, so it neither averages a collapsed seed away nor collapses to
    zero width when every seed is perfect) and the worst seed beside it; the verdict
    (:func:`harness.analysis.stats.verdict`, paper effect 0) is *reproduced* only when that interval lies
    inside ``[0, margin]`` pp."""
    b = _base(r)
    b = b[b._tier == homo]
    lines = ["| rate (conv/s) | reading | ConServe attainment [95 % interval] (n, min) | AMPD remote_default | "
             "AMPD cost | ConServe violations, mean share (pp) [95 % interval] (n), worst seed | verdict |",
             "|---|---|---|---|---|---|---|"]
    cells = []
    for rate in sorted(b._rate.dropna().unique()):
        for rd in READINGS:
            col = f"slo_attainment_{rd}"
            if col not in b.columns:
                continue
            row, tail = [f"{rate:g}", rd], ["n/a", "no data"]
            for v in ("conserve", *MODES):
                g = b[(b._variant == v) & (b._rate == rate)]
                x = pd.to_numeric(g[col], errors="coerce")
                trials = pd.to_numeric(g["num_conversations"], errors="coerce") if "num_conversations" in g else []
                est, lo, hi, n = logit_t_interval(x, trials)
                row.append(f"{est:.3f} [{lo:.3f}, {hi:.3f}] (n={n}, min {x.min():.3f})" if n > 1 and np.isfinite(lo)
                           else (f"{est:.3f} (n={n})" if n else "n/a"))
                if v == "conserve" and n:
                    share, vlo, vhi, vn, worst = violation_share(x, trials)
                    viol, ci = 100 * share, (100 * vlo, 100 * vhi)
                    verd = verdict(viol, ci, 0.0, margin)
                    cells.append({"rate": rate, "reading": rd, "verdict": verd, "mean": viol, "ci": ci, "n": vn,
                                  "worst": 100 * worst})
                    tail = [f"{fmt(viol, ci, vn, unit=' pp')}, worst {100 * worst:.1f} pp", verd]
            lines.append("| " + " | ".join(row + tail) + " |")
    return lines, _depends(cells, ["reading", "rate"]), cells


def claim_energy(r: pd.DataFrame, homo: str, hetero: Optional[str], margin: float = EQUIVALENCE_MARGIN_PCT) -> tuple[list[str], dict, list[dict], list[dict]]:
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
            mean, ci, n, k = paired(cs_h, am, "tokens_per_joule")
            v = verdict(mean, ci, PAPER["C3"], margin)
            c3.append({"rate": rate, "mode": m, "verdict": v, "mean": mean, "ci": ci, "n": n})
            lines.append(f"| {rate:g} | C3: ConServe / {MODE_LABEL[m]}, {homo} | {fmt(mean, ci, n, k)} | "
                         f"+{PAPER['C3']} % | {v} |")
        if hetero:
            cs_x = b[(b._variant == "conserve") & (b._rate == rate) & (b._tier == hetero)]
            if not cs_x.empty and not cs_h.empty:
                mean, ci, n, k = paired(cs_x, cs_h, "tokens_per_joule")
                v = verdict(mean, ci, PAPER["C4"], margin)
                c4.append({"rate": rate, "verdict": v, "mean": mean, "ci": ci, "n": n})
                lines.append(f"| {rate:g} | C4: ConServe on {hetero} / on {homo} | {fmt(mean, ci, n, k)} | "
                             f"+{PAPER['C4']} % | {v} |")
    return lines, {"C3": _depends(c3, ["mode", "rate"]), "C4": _depends(c4, ["rate"])}, c3, c4


def claim_robustness(r: pd.DataFrame, homo: str, margin: float = EQUIVALENCE_MARGIN_PCT) -> tuple[list[str], str, list[dict]]:
    """C5: AMPD's metrics at each error level over its own error-free run on the same seed and load
    (paired), ConServe's value beside, one table per load that has error arms. Error in the predictor
    (``rate x``, ``sigma x``): per AMPD mode and p95 TTFET reading the verdict of the paired ratio at the
    largest error rate (:func:`harness.analysis.stats.verdict`, direction "grows", any size) and, descriptive, the
    linear fit of the ratios over the error rate (slope, R^2). Error at the decision (``misroute x``,
    ``scheduler.misroute_frac``): the realised misrouted share and the slope over the misroute rate."""
    b0 = r[(r._sens == "base") & (r._tier == homo)]
    err = b0[b0._error_label != "none"]
    if err.empty:
        return [], "no data", []
    metrics = [("ttfet_first_p95_s", "p95 TTFET first"), ("ttfet_visible_p95_s", "p95 TTFET visible"),
               ("slo_attainment_first", "SLO attainment first"), ("slo_attainment_visible", "SLO attainment visible")]
    lines: list[str] = []
    cells = []
    for rate in sorted(err._rate.dropna().unique()):
        b = b0[b0._rate == rate]
        if lines:
            lines.append("")
        lines += [f"At {rate:g} conv/s on {homo}; each cell: AMPD at that error / AMPD error-free (same mode, same "
                  f"seed, same load) − 1; decisions: for a predictor error the share of turns ≥ 1 whose "
                  f"remote/local choice differs from the error-free predictor's on the same view "
                  f"(`ampd_decision_flip_frac`), for a misroute arm the share inverted (`ampd_misrouted_frac`).", "",
                  "| AMPD mode | error | decisions changed | " + " | ".join(lab for _, lab in metrics) + " |",
                  "|---|---|---|" + "---|" * len(metrics)]
        for m in MODES:
            zero = b[(b._variant == m) & (b._error_label == "none")]
            if zero.empty:
                continue
            labels = sorted(set(b[(b._variant == m)]._error_label) - {"none"},
                            key=lambda s: ({"rate": 0, "sigma": 1}.get(s.split()[0], 2), float(s.split()[1]), s))
            pts, mis = {}, {}
            for lab in labels:
                e = b[(b._variant == m) & (b._error_label == lab)]
                share_key = "ampd_misrouted_frac" if lab.startswith("misroute") else "ampd_decision_flip_frac"
                share = mean_ci(pd.to_numeric(e.get(share_key, pd.Series(dtype=float)), errors="coerce"))
                row = [MODE_LABEL[m], lab, f"{share[0]:.3f}" if share[2] else "n/a"]
                for key, _ in metrics:
                    mean, ci, n, k = paired(e, zero, key)
                    row.append(fmt(mean, ci, n, k))
                    if lab.startswith("rate") and "+" not in lab:
                        pts.setdefault(key, []).append((float(lab.split()[1]), mean, ci, n, k))
                    if lab.startswith("misroute"):
                        mis.setdefault(key, []).append((float(lab.split()[1]), mean))
                lines.append("| " + " | ".join(row) + " |")
            for key, lab in metrics[:2]:   # error at the decision: the slope over the misroute rate (no verdict)
                q = sorted([(0.0, 0.0)] + mis.get(key, []))
                if len(q) >= 3 and all(np.isfinite(y) for _, y in q):
                    slope = float(np.polyfit([a for a, _ in q], [y for _, y in q], 1)[0])
                    lines.append(f"| {MODE_LABEL[m]} | linear fit over misroute rate, {lab} | | slope {slope:+.1f} % "
                                 f"per unit decision-error rate | | | |")
            for key, lab in metrics[:2]:
                p = sorted([(0.0, 0.0, (0.0, 0.0), 0, 0)] + pts.get(key, []))
                if len(p) < 3:
                    continue
                x, y = np.array([q[0] for q in p]), np.array([q[1] for q in p])
                slope, icpt = np.polyfit(x, y, 1)
                ss = float(((y - (slope * x + icpt)) ** 2).sum())
                tot = float(((y - y.mean()) ** 2).sum())
                r2 = 1 - ss / tot if tot > 0 else math.nan
                top = p[-1]
                v = verdict(top[1], top[2], +1.0, margin, min_effect=0.0)  # the claim: grows (no size given)
                cells.append({"mode": m, "reading": lab.split()[-1], "verdict": v, "slope": slope, "r2": r2,
                              "mean": top[1], "ci": top[2], "n": top[3], "rate": rate})
                lines.append(f"| {MODE_LABEL[m]} | linear fit, {lab} | | slope {slope:+.1f} % per unit error rate, "
                             f"R² {r2:.2f}; at rate {top[0]:g}: {fmt(*top[1:])} → {v} | | | |")
        cs = b[(b._variant == "conserve") & (b._error_label == "none")]
        if not cs.empty:
            vals = [f"{point_interval(k, pd.to_numeric(cs[k], errors='coerce'))[0]:.3g}" if k in cs.columns else "n/a"
                    for k, _ in metrics]
            lines.append("| ConServe (predicts nothing: flat by construction) | — | — | " + " | ".join(vals) + " |")
    return lines, _depends(cells, ["mode", "reading"]), cells


# the choices a claim's cells vary (cell keys), in the order the matrix shows them, with their names
MATRIX_FACTORS = {"mode": "AMPD rule", "rate": "rate (conv/s)", "reading": "TTFET reading", "metric": "metric"}
# a sensitivity-table column (:func:`sensitivity`) -> (claim, reading, AMPD mode) of the claim cell it shifts
ARM_COLUMNS = {"C1 first": ("C1", "first", "ampd_rd"), "C1 visible": ("C1", "visible", "ampd_rd"),
               "C1 first (cost)": ("C1", "first", "ampd_cost"), "C1 visible (cost)": ("C1", "visible", "ampd_cost"),
               "C3": ("C3", None, "ampd_rd"), "C3 (cost)": ("C3", None, "ampd_cost"), "C4": ("C4", None, None)}
POWER_KEYS = ("memory_power_frac", "idle_w")   # the power model's uncalibrated constants (docs/hardware.md)
C4_MODEL_DEPENDENT = "model-dependent (not measurable without NVML on the tier)"


def _level(f: str, v: Any) -> str:
    return MODE_LABEL.get(v, str(v)) if f == "mode" else (f"{v:g}" if isinstance(v, float) else str(v))


def _words(cells: list[dict]) -> str:
    counts: dict[str, int] = {}
    for c in cells:
        counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    return ", ".join(f"{w} ×{k}" if k > 1 else w for w, k in counts.items())


def shifted_verdict(cell: dict, base_pct: float, arm_pct: float, paper: float,
                    margin: float = EQUIVALENCE_MARGIN_PCT) -> str:
    """The verdict of a claim cell with one uncalibrated constant moved, from one seed: the cell's
    seed-level estimate and interval (% change of a paired ratio) shifted on the log scale by the change
    the constant makes on that seed, ``log(1 + arm_pct/100) - log(1 + base_pct/100)``, then judged by
    :func:`harness.analysis.stats.verdict`. An approximation (the seed-to-seed spread is taken as the
    base cell's, which the constant is assumed not to change), stated in claims.md beside the words.
    Returns ``inconclusive`` when any input is not finite."""
    lo, hi = cell["ci"]
    if not all(np.isfinite(x) for x in (cell["mean"], lo, hi, base_pct, arm_pct)):
        return "inconclusive"
    d = math.log1p(arm_pct / 100) - math.log1p(base_pct / 100)

    def sh(x: float) -> float:
        return (math.exp(math.log1p(x / 100) + d) - 1) * 100
    return verdict(sh(cell["mean"]), (sh(lo), sh(hi)), paper, margin)


def sensitivity_matrix(claims: dict[str, list[dict]], arm_values: dict,
                       margin: float = EQUIVALENCE_MARGIN_PCT) -> tuple[list[str], dict[str, str]]:
    """Each claim's verdict word per modelling choice, and the word that holds across them all.

    ``claims``: ``{claim: cells}`` as the ``claim_*`` functions return them (dicts with ``verdict`` and
    the factors of :data:`MATRIX_FACTORS` they vary: AMPD rule, rate, TTFET reading, metric);
    ``arm_values``: :func:`sensitivity`'s third value (one seed per uncalibrated constant moved). A
    constant's word per claim cell at the arms' rate comes from :func:`shifted_verdict`. Returns the
    markdown lines and ``{claim: overall}``: the one word when every cell and every constant agree,
    else ``depends on <choices>`` naming each choice that flips it (C4, an energy ratio of two tiers
    that rests on the power model: :data:`C4_MODEL_DEPENDENT` when anything flips it)."""
    lines = ["Per claim and choice: the verdict words of its cells at each level of that choice (×k: k cells, "
             "the other choices varying). A choice *flips* the claim when two cells that differ only in it get "
             "different words. Uncalibrated constants (docs/hardware.md): one seed each at "
             f"{arm_values.get('rate', math.nan):g} conv/s, the base cell's seed-level interval shifted on the "
             "log scale by that seed's change (`harness.analysis.claims.shifted_verdict`). Not varied here: the "
             "step-time model (roofline only).", "",
             "| claim | choice | verdict per level | flips |", "|---|---|---|---|"]
    overall: dict[str, str] = {}
    for claim, cells in claims.items():
        if not cells:
            continue
        factors = [f for f in MATRIX_FACTORS if all(f in c for c in cells) and len({c[f] for c in cells}) > 1]
        flips = [MATRIX_FACTORS[f] for f in _flipping(cells, factors)]
        for f in factors:
            per = "; ".join(f"{_level(f, v)}: {_words([c for c in cells if c[f] == v])}"
                            for v in sorted({c[f] for c in cells}, key=lambda x: (str(type(x)), x)))
            lines.append(f"| {claim} | {MATRIX_FACTORS[f]} | {per} | {'yes' if MATRIX_FACTORS[f] in flips else 'no'} |")
        consts: dict[str, list[str]] = {}
        for col, (cl, rd, m) in ARM_COLUMNS.items():
            if cl != claim or col not in arm_values.get("cols", []):
                continue
            j = arm_values["cols"].index(col)
            base = [c for c in cells if c.get("rate") == arm_values["rate"] and c.get("reading", rd) == rd
                    and c.get("mode", m) == m]
            if not base:
                continue
            where = ", ".join(x for x in (rd, MODE_LABEL.get(m)) if x)
            for arm, vals in arm_values["arms"].items():
                w = shifted_verdict(base[0], arm_values["base"][j], vals[j], PAPER[claim], margin)
                key, level = arm.split("=", 1)
                consts.setdefault(key, []).append(f"{level}{f' ({where})' if where else ''}: {w}"
                                                  + (f" ⚠ (base {base[0]['verdict']})" if w != base[0]["verdict"] else ""))
        for key, words in consts.items():
            flip = any("⚠" in w for w in words)
            lines.append(f"| {claim} | {key} (one seed) | {'; '.join(words)} | {'yes' if flip else 'no'} |")
            if flip:
                flips.append(key)
        word = _depends(cells, factors) if not flips else "depends on " + ", ".join(flips)
        if claim == "C4" and flips:
            word = C4_MODEL_DEPENDENT
        overall[claim] = word
        lines.append(f"| {claim} | **overall** | **{word}** | |")
    return lines, overall


def sensitivity(r: pd.DataFrame, homo: str, hetero: Optional[str]) -> tuple[list[str], dict]:
    """Each sensitivity arm (1 seed) against the base runs of the same seed and rate: the C1, C3, C4
    ratios, and whether their sign differs from the base seed's (the verdict moves).

    Returns ``(lines, values)``: the markdown table (a flipped sign marked ⚠) and
    ``{"rate", "seed", "cols": [column labels], "base": [base ratios, %], "arms": {arm: [ratios, %]}}``
    for :func:`sensitivity_matrix` (empty without arms)."""
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
    nums: dict[str, list[float]] = {}
    for arm in arms:
        a_df = r[(r._sens == arm)]
        vals = []
        for (_, k, a, ta, bb, tb), bv in zip(cols, base_vals):
            v = ratio(one(a_df, a, ta), one(a_df, bb, tb), k)
            nums.setdefault(arm, []).append(v)
            flip = (np.isfinite(v) and np.isfinite(bv) and np.sign(v) != np.sign(bv)
                    and max(abs(v), abs(bv)) >= SIGN_RESOLUTION_PCT)
            vals.append(f"{v:+.1f}{' ⚠' if flip else ''}")
        lines.append(f"| {arm} | " + " | ".join(vals) + " |")
    return lines, {"rate": s_rate, "seed": seed, "cols": [c[0] for c in cols], "base": base_vals,
                          "arms": nums}


def claims_markdown(runs: pd.DataFrame, margin: float = EQUIVALENCE_MARGIN_PCT) -> str:
    """The claims report (markdown) for a sweep's tidy runs table, verdicts by :func:`harness.analysis.stats.verdict`
    with the equivalence ``margin`` (%, percentage points for C2); empty when the sweep has no
    ConServe-vs-AMPD runs."""
    r = classify(runs)
    if not {"conserve"} <= set(r._variant) or not set(MODES) & set(r._variant):
        return ""
    tiers = sorted(set(r._tier))
    homo = next((t for t in tiers if not t.endswith("_hetero")), tiers[0])
    hetero = next((t for t in tiers if t.endswith("_hetero")), None)
    l1, v1, c1 = claim_ttfet(r, homo, margin)
    l2, v2, c2 = claim_slo(r, homo, margin)
    l3, v34, c3, c4 = claim_energy(r, homo, hetero, margin)
    l5, v5, c5 = claim_robustness(r, homo, margin)
    ls, arm_values = sensitivity(r, homo, hetero)
    lm, overall = sensitivity_matrix({"C1": c1, "C2": c2, "C3": c3, "C4": c4, "C5": c5}, arm_values, margin)

    out = ["# ConServe's claims vs AMPD", "",
           "Paired ratios on the same seed (the seed is the independent unit): geometric mean of the per-seed "
           "ratios − 1, with the 95 % Student-t interval of the mean log ratio [low, high], the seeds n and the sign "
           "count (k of n seeds on the estimate's side of 0). Verdicts from one rule decided by the interval "
           "(`harness.analysis.stats.verdict`, docs/metrics.md \"Intervals and verdicts\"), first match: *no "
           f"difference* (the interval inside ±{margin:g} %, the equivalence margin, whatever its sign), *opposite* "
           "(it excludes 0 on the other side), *inconclusive* (it includes 0; also any single seed), *reproduced* "
           "(it excludes 0 on the paper's side and reaches half the paper's size), *same direction, smaller* (it "
           "lies wholly below half the paper's size). C2 (a claimed zero): *reproduced* when the violations' "
           f"interval lies inside ±{margin:g} pp.", "",
           "| claim | paper | verdict |", "|---|---|---|",
           f"| C1 p95 TTFET vs AMPD | {PAPER['C1']} % | {overall.get('C1', v1)} |",
           f"| C2 zero SLO violations at every rate | 0 violations | {overall.get('C2', v2)} |",
           f"| C3 tokens/J vs AMPD, {homo} | +{PAPER['C3']} % | {overall.get('C3', v34['C3'])} |",
           f"| C4 further tokens/J on {hetero} | +{PAPER['C4']} % | {overall.get('C4', v34['C4'])} |",
           f"| C5 AMPD degrades linearly with error, ConServe flat | linear / flat | {overall.get('C5', v5)} |", "",
           "(The word that holds across every choice of the sensitivity matrix below, or the choices that flip it.)",
           "",
           "## C1: p95 TTFET, ConServe vs AMPD", "", *l1, "",
           "## C2: SLO attainment (each variant against its own unloaded TTFET)", "", *l2, "",
           "## C3, C4: tokens per joule", "", *l3, ""]
    if l5:
        out += ["## C5: AMPD vs prediction error", "", *l5, ""]
    if ls:
        out += ["## Sensitivity to the uncalibrated constants", "", *ls, ""]
    if lm:
        out += ["## Sensitivity matrix: each claim's verdict per modelling choice", "", *lm, ""]
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
    the p95 TTFET of both readings, SLO attainment and tokens/J (each the seed-level estimate [95 %
    interval] of :func:`harness.analysis.stats.point_interval`), and the paired p95 ratios to collocated serving on the same GPU
    count and seed. Empty unless the sweep has collocated runs beside P/D runs on as many GPUs."""
    r = classify(runs)
    if "cluster.instances" not in r.columns or "collocated" not in set(r._variant):
        return ""
    r["_gpus"] = r["cluster.instances"].map(gpu_count)
    r = r[r._sens == "base"]
    lines = ["## The P/D split on equal GPU counts", "",
             "Per GPU count: p95 TTFET, SLO attainment and tokens/J (seed-level estimate [95 % interval], "
             "`harness.analysis.stats.point_interval`), and the paired p95 ratio to collocated serving on the same GPUs and "
             "seed (n, sign count).", "",
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
            trials = pd.to_numeric(x["num_conversations"], errors="coerce") if "num_conversations" in x else []
            for k in ("ttfet_first_p95_s", "ttfet_visible_p95_s", "slo_attainment_first", "slo_attainment_visible",
                      "tokens_per_joule"):
                est, lo, hi, n = (point_interval(k, pd.to_numeric(x[k], errors="coerce"), trials)
                                  if k in x.columns else (math.nan, math.nan, math.nan, 0))
                cells.append(f"{est:.3g} [{lo:.3g}, {hi:.3g}]" if n > 1 and np.isfinite(lo)
                             else (f"{est:.3g}" if n else "n/a"))
            for k in ("ttfet_first_p95_s", "ttfet_visible_p95_s"):
                cells.append("—" if v == "collocated" else fmt(*paired(x, col, k)))
            rate = x._rate.dropna()
            lines.append(f"| {g:g} | {rate.iloc[0]:g} | {cl} | {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" if found else ""


def claims_figures(runs: pd.DataFrame, out_dir: Any) -> list:
    """Figures of the claims (PNG + PDF into ``out_dir``): ``claims_vs_rate`` (p95 TTFET of both readings,
    log axis, and SLO attainment of both readings vs the arrival rate, base runs on the homogeneous tier;
    seed-level estimates and 95 % intervals of ``harness.analysis.plotting.seed_frame``, inside the metrics' ranges),
    ``claims_tokens_per_joule`` (tokens/J per variant and tier vs rate, ``harness.analysis.plotting.seed_bars``) and
    ``claims_vs_error`` (AMPD's p95 TTFET and SLO attainment, both readings, vs the error rate, paired
    ratio to its error-free run; ConServe's error-free value as a reference line)."""
    from pathlib import Path

    from harness.analysis.plotting import _plt, _save, seed_bars, seed_frame, seeds_note
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
            a = seed_frame(g, ["_rate"], k)
            if len(a):
                ax.errorbar(a["_rate"], a["est"], yerr=np.array([a["est"] - a["lo"], a["hi"] - a["est"]]),
                            marker="o", capsize=3, label=labels.get(v, v))
        ax.set_xlabel("arrival rate (conversations/s)")
        ax.set_ylabel(lab)
        if k.startswith("slo"):
            ax.set_ylim(-0.03, 1.03)
        else:
            ax.set_yscale("log")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(frameon=False)
    fig.suptitle(f"{homo}; p95 TTFET: geometric mean over seeds with the 95 % t-interval of the mean log; "
                 f"SLO attainment (against each variant's own unloaded TTFET): 95 % t-interval of the seeds' logits; "
                 f"{seeds_note(h.groupby(['_variant', '_rate']).size())}", y=1.02)
    fig.tight_layout()
    made += _save(fig, out, "claims_vs_rate")
    e = b.copy()
    e["variant"] = e._variant.map(lambda v: labels.get(v, v).replace(" ", "\n", 1))
    est, bar = seed_bars("tokens_per_joule")
    g = sns.catplot(data=e, kind="bar", x="variant", y="tokens_per_joule", hue="_tier", col="_rate",
                    estimator=est, errorbar=bar, capsize=0.1, height=3.2, aspect=1.1)
    g.set_axis_labels("", "tokens per joule (tokens/J)")
    g.set_titles(col_template="rate = {col_name} conv/s")
    if g._legend:
        g._legend.set_title(f"tier (cluster)\n(bars: 95 % interval,\n{seeds_note(e.groupby(['_variant', '_tier', '_rate']).size())})")
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
                    m, ci, n, _ = (paired(er[(er._variant == v) & (er._error == x)], z, k) if x > 0
                                   else (0.0, (0.0, 0.0), 1, 0))
                    if n:
                        lo, hi = ci if np.isfinite(ci[0]) else (m, m)
                        xs.append(x), ms.append(m), hs.append((m - lo, hi - m))
                if len(xs) > 1:
                    ax.errorbar(xs, ms, yerr=np.array(hs).T, marker="o", capsize=3, label=labels.get(v, v))
            ax.axhline(0.0, color="grey", ls="--", lw=1, label="error-free (ConServe predicts nothing: flat)")
            ax.set_xlabel("prediction error rate (fraction of predictions x or / 2)")
            ax.set_ylabel(f"{lab}\nvs error-free (%)")
        axes[0].legend(frameon=False, fontsize=8)
        fig.suptitle(f"AMPD vs prediction error at {rate:g} conv/s on {homo}; paired on the seed: geometric-mean "
                     f"ratio − 1 with the 95 % t-interval of the mean log; "
                     f"{seeds_note(er.groupby(['_variant', '_error']).size())}", y=1.02)
        fig.tight_layout()
        made += _save(fig, out, "claims_vs_error")
    return made


def write_claims(runs: pd.DataFrame, out_dir: Any, draw: bool = False,
                 margin: float = EQUIVALENCE_MARGIN_PCT) -> Optional[str]:
    """Write ``claims.md`` (and, with ``draw``, the claims figures into ``out_dir/figures``) when the
    sweep compares ConServe with AMPD (plus the P/D-split table when it also runs collocated serving on
    as many GPUs); returns the text."""
    from pathlib import Path
    text = claims_markdown(runs, margin)
    split = split_markdown(runs)
    if split:
        text = (text or "# ConServe's claims vs AMPD\n\n") + "\n" + split
    if text:
        (Path(out_dir) / "claims.md").write_text(text)
        if draw:
            claims_figures(runs, Path(out_dir) / "figures")
    return text or None
