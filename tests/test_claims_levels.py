"""C5 per error level and the lack-of-fit test for "linear" (``harness.analysis.claims.claim_robustness_levels``)
on a hand-made sweep: every expected value written out from the t-interval formula (t_{0.975, 2} = 4.303)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from harness.analysis.claims import classify, claim_robustness_levels


def sweep() -> pd.DataFrame:
    """AMPD remote_default at 0.09 conv/s on a40_1p3d, seeds 0-2: first-turn SLO attainment 0.9 error-free, 0.70 /
    0.72 / 0.68 with 10 % of decisions misrouted (a step: +20 / +18 / +22 pp of violations), 0.75 on every seed at
    50 % (+15 pp); visible attainment and tokens/J unchanged."""
    rows = []
    for seed in range(3):
        for f, att in ((0.0, 0.9), (0.1, (0.70, 0.72, 0.68)[seed]), (0.5, 0.75)):
            rows.append({"scheduler.name": "ampd", "scheduler.mode": "remote_default", "scheduler.misroute_frac": f,
                         "cluster.name": "a40_1p3d", "workload.rate_per_s": 0.09, "workload.seed": seed,
                         "slo_attainment_first": att, "slo_attainment_visible": 0.5, "tokens_per_joule": 60.0})
    return pd.DataFrame(rows)


def test_levels_and_lack_of_fit_by_hand():
    lines, levels, fits = claim_robustness_levels(classify(sweep()), "a40_1p3d")
    lv = {(c["metric"], c["level"]): c for c in levels}
    c = lv[("SLO violations first", 0.1)]
    half = 4.303 * 2.0 / math.sqrt(3)                       # sd of (20, 18, 22) = 2
    assert c["mean"] == pytest.approx(20.0) and c["ci"][0] == pytest.approx(20.0 - half, abs=1e-3)
    assert c["n"] == 3 and c["verdict"] == "reproduced"      # worse at 10 %: the paper's own example
    assert lv[("SLO violations first", 0.5)]["mean"] == pytest.approx(15.0)
    assert lv[("SLO violations visible", 0.1)]["verdict"] == "no difference"   # a zero interval inside +-3 pp
    assert lv[("tokens/J", 0.5)]["verdict"] == "no difference"
    # the line through (0, 0) and (0.5, 15 pp) predicts 3 pp at 0.1; the deviations 17, 15, 19 pp: sd 2, one
    # interior level (Bonferroni 0.05 / 1): [17 - 4.97, 17 + 4.97] lies wholly above +3 pp -> lack of fit
    f = next(x for x in fits if x["metric"] == "SLO violations first")
    assert f["level"] == 0.1 and f["mean"] == pytest.approx(17.0)
    assert f["ci"][0] == pytest.approx(17.0 - half, abs=1e-3) and f["verdict"] == "lack of fit"
    assert next(x for x in fits if x["metric"] == "tokens/J")["verdict"] == "fits a line"
    assert any("| 0.09 | AMPD remote_default | SLO violations first |" in x for x in lines)
    assert claim_robustness_levels(classify(sweep()[lambda d: d["scheduler.misroute_frac"] == 0]), "a40_1p3d") == ([], [], [])


def test_the_levels_figure_is_drawn(tmp_path):
    from harness.analysis.claims import robustness_levels_figure
    (p,) = robustness_levels_figure(sweep(), tmp_path)
    assert p.name == "ampd_robustness.png" and p.stat().st_size > 10_000
    assert robustness_levels_figure(sweep()[lambda d: d["scheduler.misroute_frac"] == 0], tmp_path / "none") == []


def test_ampd_threshold_arms_in_the_sensitivity_matrix():
    """A one-seed AMPD threshold arm (remote_default's local-TTFT budget at 2 s instead of 1 s) moves AMPD only:
    its C1 ratio pairs ConServe's base run with the arm's AMPD run (serving p95 10 s vs 8 s: +25.0 %; base 10 s vs
    20 s: -50.0 %), the cost rule's columns are not touched (NaN, left out), and the matrix names the threshold."""
    from baselines.ampd import AmpdConfig
    from harness.analysis.claims import AMPD_KNOB_DEFAULTS, claim_ttfet, sensitivity, sensitivity_matrix
    cfg = AmpdConfig()
    assert AMPD_KNOB_DEFAULTS == {"tpot_slo_s": cfg.tpot_slo_s, "ttft_slo_s": cfg.ttft_slo_s,
                                  "kv_high_frac": cfg.kv_high_frac}
    rows = []
    for seed in range(3):
        for name, mode, serving in (("conserve", None, 10.0), ("ampd", "remote_default", 20.0 + seed),
                                    ("ampd", "cost", 12.0)):
            rows.append({"scheduler.name": name, "scheduler.mode": mode, "cluster.name": "a40_1p3d",
                         "workload.rate_per_s": 0.06, "workload.seed": seed, "ttfet_first_p95_s": 1.0,
                         "ttfet_visible_p95_s": 500.0, "ttfet_serving_p95_s": serving, "tokens_per_joule": 60.0,
                         "scheduler.ttft_slo_s": 1.0 if name == "ampd" else None})
    rows.append({**rows[1], "scheduler.ttft_slo_s": 2.0, "ttfet_serving_p95_s": 8.0})
    r = classify(pd.DataFrame(rows))
    assert list(r._sens) == ["base"] * 9 + ["ampd.ttft_slo_s=2"]
    lines, vals = sensitivity(r, "a40_1p3d", None)
    j = vals["cols"].index("C1 serving")
    assert vals["base"][j] == pytest.approx(-50.0) and vals["arms"]["ampd.ttft_slo_s=2"][j] == pytest.approx(25.0)
    assert math.isnan(vals["arms"]["ampd.ttft_slo_s=2"][vals["cols"].index("C1 serving (cost)")])
    _, _, cells = claim_ttfet(r, "a40_1p3d")
    assert all(c["n"] == 3 for c in cells)            # the arm's run is not a fourth AMPD seed of the base cell
    lm, overall = sensitivity_matrix({"C1": cells}, vals)
    row = next(x for x in lm if x.startswith("| C1 | ampd.ttft_slo_s (one seed) |"))
    assert "2 (serving, AMPD remote_default): " in row and "(cost)" not in row


def test_c5_row_words_per_level_and_linear():
    """The results page's C5 row (``harness.analysis.results.c5_row``) on the hand-made sweep: at 10 % first-turn
    violations grow (+20 pp, reproduced) while visible violations and tokens/J do not move (no difference): the word
    depends on the metric, at both levels; the line through (0, 0) and (0.5, 15 pp) misses the 10 % step (lack of
    fit, above), so "linear" reads *not linear*; the row's cells are the 10 % level's, first-turn violations first."""
    from harness.analysis.results import c5_row, linear_word
    row = c5_row(sweep())
    assert row.word == "depends on metric"
    assert row.cells.startswith("0.09/s AMPD remote_default misroute 0.1 SLO violations first: +20.0 pp [")
    assert "linear: not linear (seeds per cell: 3)" in row.cells
    assert "| 0.1 | depends on metric | 3 / 3 | 3 |" in row.detail
    assert any("**not linear** (lack of fit ×1, fits a line ×2 of 3 level cells)" in x for x in row.detail)
    assert any("ampd_robustness.png" in x for x in row.detail)
    assert c5_row(sweep()[lambda d: d["scheduler.misroute_frac"] == 0]) is None
    assert linear_word([]) == "no data"
    assert linear_word([{"verdict": "fits a line"}, {"verdict": "inconclusive"}]) == "inconclusive"
    assert linear_word([{"verdict": "fits a line"}] * 2) == "fits a line"


def test_shipped_c5_level_cell_by_hand():
    """The shipped ampd_robustness table (docs/data/ampd_robustness/runs.csv): AMPD remote_default at 0.075 conv/s
    with 10 % of its decisions misrouted, first-turn SLO violations against error-free AMPD on the same seed: per seed
    100 x (attainment error-free - attainment misrouted) pp, their mean and the 95 % t-interval (t_{0.975, n-1} from
    scipy), recomputed here with plain pandas; the results page's level cell equals it."""
    from pathlib import Path

    from scipy import stats

    from harness.analysis.results import c5_row
    p = Path(__file__).resolve().parents[1] / "docs/data/ampd_robustness/runs.csv"
    if not p.is_file():
        pytest.skip("no shipped ampd_robustness table")
    runs = pd.read_csv(p)
    rd = runs[(runs["scheduler.name"] == "ampd") & (runs["scheduler.mode"] == "remote_default")
              & (runs["workload.rate_per_s"] == 0.075)]
    zero = rd[rd["scheduler.misroute_frac"] == 0].set_index("workload.seed")["slo_attainment_first"]
    ten = rd[rd["scheduler.misroute_frac"] == 0.1].set_index("workload.seed")["slo_attainment_first"]
    seeds = sorted(set(zero.index) & set(ten.index))
    d = 100 * (zero[seeds] - ten[seeds])
    n = len(d)
    half = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
    row = c5_row(runs)
    want = (f"| 0.075 | AMPD remote_default | SLO violations first | {d.mean():+.1f} pp "
            f"[{d.mean() - half:+.1f}, {d.mean() + half:+.1f}] (n={n}")
    assert n >= 3 and any(x.startswith(want) for x in row.detail), want
