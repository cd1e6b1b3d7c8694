"""harness.analysis.claims on a hand-made runs table: paired ratios, verdicts, sensitivity flags, robustness fit."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from harness.analysis.claims import claims_markdown, classify, fmt, on_seed, paired
from harness.analysis.stats import verdict


def row(variant, tier="a40_1p3d", rate=0.06, seed=0, err=0.0, kvmem=0.915, **metrics):
    name, mode = ("conserve", None) if variant == "conserve" else ("ampd", variant.split("_")[1])
    mode = {"rd": "remote_default", "cost": "cost", None: None}[mode]
    base = {"ttfet_first_p95_s": 1.0, "ttfet_visible_p95_s": 100.0, "slo_attainment_first": 1.0,
            "slo_attainment_visible": 1.0, "tokens_per_joule": 60.0, "ampd_decision_flip_frac": 0.0}
    base.update(metrics)
    return {"scheduler.name": name, "scheduler.mode": mode, "cluster.name": tier, "workload.rate_per_s": rate,
            "workload.seed": seed, "scheduler.predictor.mode": "rate" if err else "lognormal",
            "scheduler.predictor.error_rate": err, "scheduler.predictor.sigma": 0.0,
            "hardware.a40.kv_memory_efficiency": kvmem, **base}


def test_paired_ratio_and_verdicts_by_hand():
    rows = []
    # ConServe's visible p95 is 80, 90, 70 against AMPD's 100 on the same seeds: -20, -10, -30 %
    for s, cs in enumerate([80.0, 90.0, 70.0]):
        rows += [row("conserve", seed=s, ttfet_visible_p95_s=cs), row("ampd_rd", seed=s)]
    r = classify(pd.DataFrame(rows))
    mean, ci, n, k = paired(r[r._variant == "conserve"], r[r._variant == "ampd_rd"], "ttfet_visible_p95_s")
    # logs: ln 0.8 = -0.22314, ln 0.9 = -0.10536, ln 0.7 = -0.35667; mean -0.22839 -> 0.79581 - 1 = -20.42 %
    # deviations +0.00525, +0.12303, -0.12828: sd = sqrt(0.03162 / 2) = 0.12574;
    # half-width t(0.975, 2) x 0.12574 / sqrt(3) = 4.3027 x 0.072596 = 0.31236;
    # interval exp(-0.54075) - 1 = -41.77 %, exp(0.08397) - 1 = +8.76 %
    assert n == 3 and mean == pytest.approx(-20.42, abs=0.01)
    assert ci[0] == pytest.approx(-41.77, abs=0.02) and ci[1] == pytest.approx(8.76, abs=0.02)
    assert k == 3                                 # all three seeds below 0
    assert fmt(mean, ci, n, k) == "-20.4 % [-41.8, +8.8] (n=3, 3 of 3 < 0)"
    # crosses 0 and reaches beyond the 3 % margin on both sides: neither a difference nor none
    assert verdict(mean, ci, -51.08) == "inconclusive"


def test_the_five_verdicts_on_hand_made_intervals():
    """One rule (harness.analysis.stats.verdict), decided by the interval, on intervals made by hand at every
    boundary; margin 3 % (EQUIVALENCE_MARGIN_PCT); paper C1 -51.08 % (half: 25.54 %), C3 +7.51 % (half:
    3.755 %). The estimate passed is deliberately off-centre where it would have changed the old rule's
    word: the rule must not read it."""
    # 1. margin first: an interval inside +-3 % is "no difference" whatever its sign, even excluding 0
    assert verdict(+1.0, (0.5, 2.0), -51.08) == "no difference"              # the two cases
    assert verdict(-1.0, (-2.0, -0.5), -51.08) == "no difference"
    assert verdict(+0.5, (-2.0, 2.9), -51.08) == "no difference"              # includes 0
    assert verdict(0.0, (-3.0, 3.0), 7.51) == "no difference"                 # ends on the margin: inside
    assert verdict(+2.0, (1.0, 3.0), 7.51) == "no difference"                 # just inside, on the paper's side
    assert verdict(+2.0, (1.0, 3.01), 7.51) == "same direction, smaller"      # just outside: 3.01 < 3.755
    assert verdict(+0.5, (-2.0, 3.1), -51.08) == "inconclusive"               # includes 0, leaves the margin
    assert verdict(+1.0, (-1.0, 2.0), 7.51, margin=1.5) == "inconclusive"     # the margin is a knob
    assert verdict(+1.0, (0.5, 2.0), 7.51, margin=0.0) == "same direction, smaller"   # no margin: 2.0 < 3.755
    # 2. direction: excludes 0 on the other side -> opposite; touches or includes 0 -> inconclusive
    assert verdict(+10.0, (5.0, 15.0), -51.08) == "opposite"                  # above 0 against a reduction
    assert verdict(-3.0, (-5.0, -1.0), 7.51) == "opposite"
    assert verdict(-40.0, (-60.0, 0.0), -51.08) == "inconclusive"             # a bound at 0 does not exclude it
    assert verdict(+5.0, (0.0, 9.0), 7.51) == "inconclusive"
    assert verdict(+5.0, (1e-9, 9.0), 7.51) == "reproduced"                   # just past 0
    assert verdict(-5.0, (-9.0, -3.5), -51.08) == "same direction, smaller"   # |-9| < 25.54
    # 3. size on the interval: reproduced when its far end reaches half the paper's, else smaller
    assert verdict(-30.0, (-35.0, -25.0), -51.08) == "reproduced"              # reaches -35 <= -25.54
    assert verdict(-10.0, (-30.0, -5.0), -51.08) == "reproduced"               # estimate small, the interval reaches
    assert verdict(-10.0, (-25.54, -5.0), -51.08) == "reproduced"              # touching half: reaches it
    assert verdict(-10.0, (-25.53, -5.0), -51.08) == "same direction, smaller"  # just short of it
    assert verdict(-40.0, (-15.0, -5.0), -51.08) == "same direction, smaller"  # estimate off-centre: not read
    assert verdict(+3.0, (1.0, 3.755), 7.51) == "reproduced"                  # touching half, positive paper
    assert verdict(+3.0, (1.0, 3.75), 7.51) == "same direction, smaller"
    assert verdict(+5.0, (4.0, 6.0), 7.51) == "reproduced"
    # 0. no interval (one seed, no data)
    assert verdict(-30.0, (math.nan, math.nan), -51.08) == "inconclusive"
    assert verdict(math.nan, (-35.0, -25.0), -51.08) == "inconclusive"
    # a claimed zero (C2's violations, percentage points): inside the margin reproduces it, beyond it opposes
    assert verdict(0.4, (0.1, 2.0), 0.0) == "reproduced"
    assert verdict(0.0, (0.0, 3.0), 0.0) == "reproduced"                      # on the margin: inside
    assert verdict(0.0, (0.0, 3.01), 0.0) == "inconclusive"                   # just outside, not wholly beyond
    assert verdict(8.0, (4.0, 12.0), 0.0) == "opposite"
    assert verdict(8.0, (3.01, 12.0), 0.0) == "opposite"                      # wholly beyond, just
    assert verdict(8.0, (3.0, 12.0), 0.0) == "inconclusive"                   # touches the margin
    assert verdict(-8.0, (-12.0, -4.0), 0.0) == "opposite"                    # below -margin
    assert verdict(2.0, (0.5, 6.0), 0.0) == "inconclusive"
    # a claimed direction without a size (C5, min_effect 0): growth beyond the margin reproduces it; growth
    # inside the margin is no difference (the old rule read (0.2, 1.8) as reproduced)
    assert verdict(+5.0, (3.2, 6.8), +1.0, min_effect=0.0) == "reproduced"
    assert verdict(+1.0, (0.2, 1.8), +1.0, min_effect=0.0) == "no difference"
    assert verdict(-5.0, (-6.8, -3.2), +1.0, min_effect=0.0) == "opposite"
    with pytest.raises(ValueError, match="margin"):
        verdict(0.0, (0.0, 0.0), 1.0, margin=-1.0)
    with pytest.raises(ValueError, match="min_effect"):
        verdict(0.0, (0.0, 0.0), 1.0, min_effect=-1.0)
    for bad in (None, math.nan):                                               # no paper number: no claim to judge
        with pytest.raises(ValueError, match="paper_effect"):
            verdict(0.0, (-1.0, 1.0), bad)


def test_c2_violation_share_sees_every_seed():
    """harness.analysis.stats.violation_share on hand-made seeds (attainment, 200 conversations each)."""
    from scipy import stats
    from harness.analysis.stats import violation_share
    # nine seeds at 1.0, one at 0.5: violations v = 0 x 9, 0.5; mean 0.05; deviations -0.05 x 9, +0.45:
    # sum of squares 9 x 0.0025 + 0.2025 = 0.225, sd = sqrt(0.225 / 9) = 0.15811, se = sd / sqrt(10) = 0.05;
    # t(0.975, 9) = 2.2622 (printed table): t-interval 0.05 -+ 0.11311 = [-0.0631, 0.1631] -> cut at 0.
    # Pooled: 100 of 2000 conversations, Clopper-Pearson about [0.041, 0.060] -- inside the t-interval.
    share, lo, hi, n, worst = violation_share([1.0] * 9 + [0.5], [200] * 10)
    assert (share, n, worst) == (pytest.approx(0.05), 10, 0.5)
    assert lo == 0.0 and hi == pytest.approx(0.05 + 2.2622 * 0.05, abs=1e-4)
    assert 100 * hi > 3.0                                     # above the 3 pp margin: not "zero violations"
    assert verdict(100 * share, (100 * lo, 100 * hi), 0.0) == "inconclusive"
    # three perfect seeds (n = 3): the t-interval has zero width; the pooled 0 of 600 conversations has the
    # Clopper-Pearson upper bound 1 - 0.025^(1/600) = 1 - exp(ln 0.025 / 600) = 1 - exp(-0.0061481) = 0.0061293
    share, lo, hi, n, worst = violation_share([1.0, 1.0, 1.0], [200, 200, 200])
    assert (share, lo, n, worst) == (0.0, 0.0, 3, 0.0)
    assert hi == pytest.approx(0.0061293, abs=1e-6) and hi > lo            # not zero width
    assert verdict(0.0, (0.0, 100 * hi), 0.0) == "reproduced"                # 0.61 pp inside 3 pp
    # every seed at 0.99 (2 of 200 each): zero-width t-interval, so the pooled 6 of 600 decide; checked
    # against scipy's own exact binomial interval
    share, lo, hi, n, _ = violation_share([0.99] * 3, [200] * 3)
    cp = stats.binomtest(6, 600).proportion_ci(confidence_level=0.95, method="exact")
    assert share == pytest.approx(0.01) and (lo, hi) == (pytest.approx(cp.low), pytest.approx(cp.high))
    # trials unknown: 100 conversations a seed (PROPORTION_FALLBACK_TRIALS): 0 of 300 -> 1 - 0.025^(1/300)
    assert violation_share([1.0, 1.0, 1.0])[2] == pytest.approx(1 - 0.025 ** (1 / 300))
    assert violation_share([0.9]) == (pytest.approx(0.1), pytest.approx(math.nan, nan_ok=True),
                                      pytest.approx(math.nan, nan_ok=True), 1, pytest.approx(0.1))
    assert violation_share([])[3] == 0
    with pytest.raises(ValueError, match="attainment"):
        violation_share([1.2, 0.9])


def test_claim_slo_judges_zero_on_the_mean_share():
    """C2 in claims.md: a collapsed seed is not averaged away, and perfect seeds still get an interval."""
    rows = []
    for s in range(10):
        rows += [row("conserve", seed=s, slo_attainment_first=0.5 if s == 9 else 1.0, num_conversations=200),
                 row("ampd_rd", seed=s, num_conversations=200)]
    from harness.analysis.claims import claim_slo
    lines, word, cells = claim_slo(classify(pd.DataFrame(rows)), "a40_1p3d")
    first = next(c for c in cells if c["reading"] == "first")
    visible = next(c for c in cells if c["reading"] == "visible")
    assert first["mean"] == pytest.approx(5.0) and first["ci"][1] == pytest.approx(16.311, abs=0.01)
    assert first["worst"] == pytest.approx(50.0) and first["verdict"] == "inconclusive"
    # visible: ten perfect seeds of 200: 0 of 2000 -> upper 1 - 0.025^(1/2000) = 0.18427 pp
    assert visible["ci"] == (0.0, pytest.approx(100 * (1 - 0.025 ** (1 / 2000)), abs=1e-4))
    assert visible["verdict"] == "reproduced"
    assert word == "depends on reading"
    text = "\n".join(lines)
    assert "+5.0 pp [+0.0, +16.3] (n=10), worst 50.0 pp | inconclusive |" in text


def test_claims_table_depends_on_reading_and_flags_sensitivity():
    rows = []
    for s in range(3):
        # first reading: ConServe 40 % lower on every seed; visible: ConServe 10 % higher
        rows += [row("conserve", seed=s, ttfet_first_p95_s=0.6 + 0.01 * s, ttfet_visible_p95_s=110.0 + s,
                     tokens_per_joule=66.0 + s),
                 row("ampd_rd", seed=s), row("ampd_cost", seed=s),
                 row("conserve", tier="a40_1p3d_hetero", seed=s, tokens_per_joule=67.0 + s)]
        for e, f in ((0.1, 1.02), (0.3, 1.06), (0.5, 1.10)):   # AMPD's first-turn p95 grows linearly
            rows.append(row("ampd_rd", seed=s, err=e, ttfet_first_p95_s=f, ampd_decision_flip_frac=e / 10))
    # a sensitivity arm (seed 0) where ConServe's tokens/J falls below AMPD's
    rows += [row("conserve", kvmem=0.85, tokens_per_joule=50.0), row("ampd_rd", kvmem=0.85),
             row("ampd_cost", kvmem=0.85), row("conserve", tier="a40_1p3d_hetero", kvmem=0.85)]
    md = claims_markdown(pd.DataFrame(rows))
    c1 = next(l for l in md.splitlines() if l.startswith("| C1"))
    assert "depends on TTFET reading" in c1
    c3 = next(l for l in md.splitlines() if l.startswith("| C3"))
    # seed 0: +10 % (66 / 60) as shipped, -16.7 % (50 / 60) with the constant moved: the word flips
    assert "depends on kv_memory_efficiency" in c3
    c5 = next(l for l in md.splitlines() if l.startswith("| C5"))
    # only the first-turn p95 TTFET grows with the predictor's error; C5 is judged on SLO violations and
    # tokens/J, which do not move: the fitted change over 0-0.5 is 0 with a zero-width interval
    assert c5.endswith("| no difference |")
    # p95 TTFET first (beside): +0, +2, +6, +10 % over error 0, 0.1, 0.3, 0.5 on every seed: slope 20 % per unit
    fit = next(l for l in md.splitlines() if "| predictor error rate, 0 – 0.5 |" in l)
    assert "| +20.0 % [+20.0, +20.0] (n=3, 3 of 3 > 0), R² 1.00 |" in fit


def test_split_table_pairs_with_collocated_on_the_same_gpus():
    import json
    from harness.analysis.claims import split_markdown
    pd4 = json.dumps([{"role": "prefiller", "hardware": "a40", "count": 1}, {"role": "decoder", "hardware": "a40", "count": 3}])
    col4 = json.dumps([{"role": "collocated", "hardware": "a40", "count": 4}])
    rows = []
    for s in range(3):
        a = row("conserve", seed=s, ttfet_visible_p95_s=120.0)
        a["cluster.instances"] = pd4
        c = row("conserve", tier="a40_4x", seed=s, ttfet_visible_p95_s=100.0)
        c.update({"scheduler.name": "collocated", "cluster.instances": col4})
        rows += [a, c]
    md = split_markdown(pd.DataFrame(rows))
    line = next(l for l in md.splitlines() if l.startswith("| 4 |") and "| conserve |" in l)
    assert "+20.0 % [+20.0, +20.0] (n=3, 3 of 3 > 0)" in line      # 120 / 100 on every seed
    assert split_markdown(pd.DataFrame([r for r in rows if r["scheduler.name"] != "collocated"])) == ""


def test_c5_pairs_each_error_arm_with_the_error_free_run_of_its_own_load():
    """Two loads with misroute arms (ampd_robustness: 0.06 and 0.04 conv/s): each arm is paired with the
    error-free AMPD of the same load and seed only (3 pairs, not 6), in a table of its own per load, and the
    decisions column shows the realised misrouted share."""
    from harness.analysis.claims import claim_robustness
    rows = []
    for s in range(3):
        for rate, base_first, mis_first in ((0.06, 1.0, 1.10), (0.04, 2.0, 2.50)):
            rows.append(row("ampd_rd", rate=rate, seed=s, ttfet_first_p95_s=base_first))
            rows.append({**row("ampd_rd", rate=rate, seed=s, ttfet_first_p95_s=mis_first),
                         "scheduler.misroute_frac": 0.3, "ampd_misrouted_frac": 0.296})
            rows.append(row("conserve", rate=rate, seed=s))
        for e, first in ((0.1, 1.05), (0.3, 1.1), (0.5, 1.2)):   # predictor-error arms at 0.06 only
            rows.append(row("ampd_rd", rate=0.06, seed=s, err=e, ttfet_first_p95_s=first))
    r = classify(pd.DataFrame(rows))
    lines, _, cells = claim_robustness(r, "a40_1p3d")
    text = "\n".join(lines)
    assert "At 0.04 conv/s" in text and "At 0.06 conv/s" in text
    mis = [ln for ln in lines if ln.startswith("| AMPD remote_default | misroute 0.3 |")]
    # 0.06: 1.10 / 1.0 - 1 = +10.0 % on every seed; 0.04: 2.5 / 2.0 - 1 = +25.0 %; n = 3 pairs each
    assert len(mis) == 2
    assert "| 0.296 |" in mis[0] and "| +25.0 % [+25.0, +25.0] (n=3, 3 of 3 > 0) |" in mis[0]   # loads ascending
    assert "| 0.296 |" in mis[1] and "| +10.0 % [+10.0, +10.0] (n=3, 3 of 3 > 0) |" in mis[1]
    # one misroute arm per load: no slope (a line needs 2 arms besides 0); the predictor axis at 0.06 only,
    # where violations and tokens/J do not move: no difference
    assert {(c["axis"], c["rate"]) for c in cells} == {("predictor error rate", 0.06)}
    assert {c["verdict"] for c in cells} == {"no difference"}

def test_shifted_verdict_by_hand():
    """A C1 cell of -30 % [-35, -25] (reproduced: <= -25.54 %) whose seed reads -30 % as shipped and -10 %
    with a constant moved: the shift is ln(0.90) - ln(0.70), so the cell becomes 0.70 x 0.9/0.7 - 1 = -10 %
    [0.65 x 9/7 - 1, 0.75 x 9/7 - 1] = [-16.43, -3.57] %: below 0, and all of it under half the paper's
    51.08 % -> "same direction, smaller"."""
    from harness.analysis.claims import shifted_verdict
    cell = {"mean": -30.0, "ci": (-35.0, -25.0), "verdict": "reproduced"}
    assert shifted_verdict(cell, -30.0, -30.0, -51.08) == "reproduced"   # no change, the same word
    assert shifted_verdict(cell, -30.0, -10.0, -51.08) == "same direction, smaller"
    assert shifted_verdict(cell, -30.0, math.nan, -51.08) == "inconclusive"


def test_sensitivity_matrix_names_the_choice_that_flips_and_c4_is_model_dependent():
    from harness.analysis.claims import C4_MODEL_DEPENDENT, sensitivity_matrix
    c1 = [{"rate": r, "reading": rd, "mode": m, "verdict": v, "mean": -30.0, "ci": (-35.0, -25.0), "n": 3}
          for r in (0.03, 0.09) for rd in ("first", "visible") for m in ("ampd_rd", "ampd_cost")
          for v in ["reproduced" if m == "ampd_rd" else "opposite"]]           # the AMPD rule alone flips C1
    c3 = [{"rate": r, "mode": m, "verdict": "reproduced", "mean": 8.0, "ci": (5.0, 11.0), "n": 3}
          for r in (0.03, 0.09) for m in ("ampd_rd", "ampd_cost")]
    c4 = [{"rate": r, "verdict": "reproduced", "mean": 20.0, "ci": (15.0, 25.0), "n": 3} for r in (0.03, 0.09)]
    # one seed at 0.09 conv/s: C3 (remote_default) +8 % as shipped; memory_power_frac=0.95 leaves C3 at
    # +8 % and takes C4 from +20 % to +1 %: 1.20 -> 1.01 is a factor 0.8417, so [15, 25] % -> [-3.2, +5.2] %
    arms = {"rate": 0.09, "seed": 0, "cols": ["C3", "C4"], "base": [8.0, 20.0],
            "arms": {"memory_power_frac=0.95": [8.0, 1.0]}}
    lines, overall = sensitivity_matrix({"C1": c1, "C3": c3, "C4": c4}, arms)
    assert overall["C1"] == "depends on AMPD rule"
    assert overall["C3"] == "reproduced"                  # the constant moves nothing there
    assert overall["C4"] == C4_MODEL_DEPENDENT
    row = next(ln for ln in lines if ln.startswith("| C4 | memory_power_frac"))
    assert "0.95: inconclusive ⚠ (base reproduced)" in row and row.endswith("| yes |")
    assert next(ln for ln in lines if ln.startswith("| C1 | rate")).endswith("| no |")



def test_c5_slopes_per_seed_with_their_interval_by_hand():
    """C5 on the paper's metrics, both rules, a hand-made sweep at 0.09 conv/s, 3 seeds, misroute 0 / 0.1 /
    0.3 / 0.5. remote_default: visible attainment 0.9 - (0.40 + 0.02 s) f on seed s, so the violations grow
    by 100 (0.40 + 0.02 s) f pp: per-seed slopes 40, 42, 44 pp per unit rate, mean 42, sd 2, half-width
    t(0.975, 2) x 2 / sqrt(3) = 4.3027 x 1.1547 = 4.968: [37.03, 46.97]; x 0.5 (the tested range) =
    [18.5, 23.5] pp > 0: AMPD degrades -> reproduced. Its tokens/J x (1 + 0.1 f): +10 % per unit on every
    seed, x 0.5 = +5 % > 0 -> opposite (energy improves). cost: first attainment 0.95 - c_s f with c_s =
    0.1, 0.2, 0.3: slopes 10, 20, 30, mean 20, sd 10, half 4.3027 x 5.7735 = 24.84: [-4.84, +44.84]
    -> crosses 0 beyond the 3 pp margin -> inconclusive. Unchanged metrics: slope 0 [0, 0] -> no difference."""
    from harness.analysis.claims import claim_robustness
    rows = []
    for s in range(3):
        rows.append(row("conserve", rate=0.09, seed=s))
        for f in (0.0, 0.1, 0.3, 0.5):
            mis = {"scheduler.misroute_frac": f, "ampd_misrouted_frac": f}
            rows.append({**row("ampd_rd", rate=0.09, seed=s, slo_attainment_visible=0.9 - (0.40 + 0.02 * s) * f,
                               tokens_per_joule=60.0 * (1 + 0.1 * f)), **mis})
            rows.append({**row("ampd_cost", rate=0.09, seed=s, slo_attainment_first=0.95 - (0.1 + 0.1 * s) * f), **mis})
    md = claims_markdown(pd.DataFrame(rows))
    r = classify(pd.DataFrame(rows))
    lines, word, cells = claim_robustness(r, "a40_1p3d")
    got = {(c["mode"], c["metric"]): c for c in cells}
    assert {c["axis"] for c in cells} == {"decision error (misroute_frac)"} and len(cells) == 2 * 3
    vis = got["ampd_rd", "SLO violations visible"]
    assert vis["slope"] == pytest.approx(42.0) and vis["n"] == 3 and vis["k"] == 3
    assert vis["ci"][0] == pytest.approx(37.03, abs=0.01) and vis["ci"][1] == pytest.approx(46.97, abs=0.01)
    assert vis["verdict"] == "reproduced" and vis["r2"] == pytest.approx(1.0)
    tpj = got["ampd_rd", "tokens/J"]
    assert tpj["slope"] == pytest.approx(10.0) and tpj["verdict"] == "opposite"
    first = got["ampd_cost", "SLO violations first"]
    assert first["slope"] == pytest.approx(20.0)
    assert first["ci"][0] == pytest.approx(-4.84, abs=0.01) and first["ci"][1] == pytest.approx(44.84, abs=0.01)
    assert first["verdict"] == "inconclusive"
    for key in (("ampd_rd", "SLO violations first"), ("ampd_cost", "SLO violations visible"), ("ampd_cost", "tokens/J")):
        assert got[key]["slope"] == pytest.approx(0.0, abs=1e-9) and got[key]["verdict"] == "no difference"
    assert word.startswith("decision error (misroute_frac): depends on")
    # the arm rows: the realised share and the paired change at misroute 0.5 on remote_default, visible:
    # 100 x 0.5 x (0.40, 0.42, 0.44) = 20, 21, 22 pp, mean 21, sd 1, half 4.3027 / sqrt(3) = 2.484
    arm = next(l for l in lines if l.startswith("| AMPD remote_default | misroute 0.5 |"))
    assert "| 0.500 |" in arm and "+21.0 pp [+18.5, +23.5] (n=3, 3 of 3 > 0)" in arm
    assert "| C5 AMPD's SLO violations grow" in md and "ConServe (predicts nothing" in md
    # the summary's word from the matrix: remote_default's visible violations grow (reproduced) while cost's
    # first-turn ones are inconclusive and its tokens/J do not move: both the rule and the metric flip it
    c5 = next(l for l in md.splitlines() if l.startswith("| C5"))
    assert c5.endswith("| depends on AMPD rule, metric |"), c5


def test_c4_is_model_dependent_only_when_a_power_constant_flips_it():
    """C4 cells that the rate alone flips (+1.4 % at 0.03 reads 'same direction, smaller', +20 % at 0.09
    'reproduced' against the paper's +22.75 %: half is 11.4 %), with no constant moved, read 'depends on
    rate (conv/s)', not the power model's word; idle_w flipping it does give that word."""
    from harness.analysis.claims import C4_MODEL_DEPENDENT, sensitivity_matrix
    c4 = [{"rate": 0.03, "verdict": "same direction, smaller", "mean": 1.4, "ci": (1.1, 1.7), "n": 3},
          {"rate": 0.09, "verdict": "reproduced", "mean": 20.0, "ci": (15.0, 25.0), "n": 10}]
    _, overall = sensitivity_matrix({"C4": c4}, {})
    assert overall["C4"] == "depends on rate (conv/s)"
    # idle_w=60 takes seed 0's C4 from +20 % to +1 % at 0.09: the cell's [15, 25] % x 1.01/1.20 -> [-3.2, +5.2]
    arms = {"rate": 0.09, "seed": 0, "cols": ["C4"], "base": [20.0], "arms": {"idle_w=60": [1.0]}}
    _, overall = sensitivity_matrix({"C4": c4}, arms)
    assert overall["C4"] == C4_MODEL_DEPENDENT


def test_w2_and_the_twin_table_by_hand(tmp_path):
    """W2 (WAIT-CP / Sarathi-like - 1 of e2e_central_mean_s) and twin.md's agreement words on a table built by
    hand: on the real side WAIT-CP takes exactly half of Sarathi-like's time on each of 3 seeds (-50 %, a
    zero-width interval: beyond half the paper's -70 %, so "reproduced"), the control equals Sarathi-like;
    on the simulated side WAIT-CP equals Sarathi-like on every seed (0 % inside the 3 % margin: "no
    difference"). WAIT-CP / control is -50 % on the real side too. Conversations: the same on both sides."""
    import pandas as pd
    from harness.analysis.claims import claim_wait, classify
    from harness.analysis.twin import agreement, twin_markdown
    rows = []
    for b in ("vllm", "sim"):
        for s in range(3):
            base = 1.0 + 0.25 * s
            for name, f in (("collocated", 1.0), ("wait_cp_control", 1.0), ("wait_cp", 0.5 if b == "vllm" else 1.0)):
                run = f"{b}_{name}_{s}"
                d = tmp_path / run
                d.mkdir()
                pd.DataFrame({"conversation_id": ["a", "b"], "arrival_s": [0.0, 0.1 * s]}).to_parquet(d / "conversations.parquet")
                rows.append({"run": run, "backend.name": b, "scheduler.name": name, "cluster.name": "cpu_1x",
                             "workload.rate_per_s": 8.0, "workload.seed": s, "e2e_central_mean_s": base * f})
    runs = pd.DataFrame(rows)
    _, word, cells = claim_wait(classify(runs[runs["backend.name"] == "vllm"]))
    by = {c["vs"]: c for c in cells}
    assert by["WAIT-CP / Sarathi-like"]["mean"] == pytest.approx(-50.0)
    assert by["WAIT-CP / Sarathi-like"]["verdict"] == "reproduced" and by["WAIT-CP / control"]["verdict"] == "reproduced"
    text = twin_markdown(runs, {r: tmp_path / r for r in runs.run})
    rows_w2 = [line for line in text.splitlines() if line.startswith("| W2")]
    assert len(rows_w2) == 2 and all(r.rstrip(" |").endswith("| disagree") for r in rows_w2), rows_w2
    assert all("| reproduced |" in r and "| no difference |" in r for r in rows_w2)
    # 3 variants x 3 seeds run on both backends
    assert "9 of 9 cells run on both backends have the same conversation ids and arrival times" in text
    # the simulator priced with another profile than the one the real runs recorded (the real side uses none
    # of it): each side is judged alone, so the simulated cells are still its claim cells, not a sensitivity arm
    runs["hardware.cpu.prefill_efficiency"] = [0.5 if b == "vllm" else 0.9 for b in runs["backend.name"]]
    again = [line for line in twin_markdown(runs, {r: tmp_path / r for r in runs.run}).splitlines()
             if line.startswith("| W2")]
    assert again == rows_w2
    # the words themselves
    dec = {"verdict": "reproduced", "n": 3, "mean": -50.0}
    und = {"verdict": "inconclusive", "n": 1, "mean": -10.0}
    assert agreement(dec, dict(dec)) == "agree" and agreement(dec, und) == "undecided on one side"
    assert agreement(und, und) == "undecided on both sides"
    assert agreement({"verdict": "no data", "n": 0, "mean": float("nan")}, dec) == "no data on the real side"


def test_the_twins_pd_legs_by_hand(tmp_path):
    """twin.md's P/D legs on runs built by hand (3 seeds, both sides). Each run has two conversations whose turn 0
    is disaggregated: the prefiller's leg is 40 and 60 ms (median 50 ms), the decoder's 10 ms. Turn 1 is local
    under ConServe (TTFT 30 ms) and remote under AMPD remote_default (TTFT 90 ms). On the real side AMPD's turn 0
    takes twice ConServe's on every seed: ConServe / AMPD - 1 of the median turn-0 TTFT is exactly -50 % (zero
    width interval, 3 of 3). The simulated sides are equal: 0 %."""
    import pandas as pd
    from harness.analysis.twin import pd_legs, twin_markdown
    rows = []
    for b in ("vllm", "sim"):
        for s in range(3):
            for name, mode in (("conserve", None), ("ampd", "remote_default")):
                f = 2.0 if (b == "vllm" and name == "ampd") else 1.0
                run = f"{b}_{name}_{s}"
                d = tmp_path / run
                d.mkdir()
                pd.DataFrame({"conversation_id": ["a", "b"], "arrival_s": [0.0, 0.1 * s]}).to_parquet(d / "conversations.parquet")
                p = [0.040 * f, 0.060 * f]
                remote = name == "ampd"
                pd.DataFrame({"conversation_id": ["a", "b", "a"], "turn": [0, 0, 1], "status": ["ok"] * 3,
                              "disaggregated": [True, True, remote], "start_s": [0.0, 1.0, 5.0],
                              "prefill_done_s": [p[0], 1.0 + p[1], 5.0 + (0.08 if remote else 0.03)],
                              "first_token_s": [p[0] + 0.01 * f, 1.0 + p[1] + 0.01 * f, 5.0 + (0.09 if remote else 0.03)],
                              }).to_parquet(d / "turns.parquet")
                rows.append({"run": run, "backend.name": b, "scheduler.name": name, "scheduler.mode": mode,
                             "cluster.name": "cpu_1p1d", "workload.rate_per_s": 8.0, "workload.seed": s,
                             "ttfet_first_p95_s": 0.1 * f, "ttfet_visible_p95_s": 1.0})
    runs = pd.DataFrame(rows)
    dirs = {r: tmp_path / r for r in runs.run}
    from harness.analysis.claims import classify
    legs = pd_legs(classify(runs), dirs)
    assert len(legs) == 12
    cs = legs[(legs.backend == "vllm") & (legs._variant == "conserve")]
    assert cs.prefiller_leg_s.tolist() == pytest.approx([0.050] * 3)
    assert cs.decoder_leg_s.tolist() == pytest.approx([0.010] * 3) and cs.remote_frac.tolist() == [0.0] * 3
    am = legs[(legs.backend == "vllm") & (legs._variant == "ampd_rd")]
    assert am.ttft0_s.tolist() == pytest.approx([0.120] * 3) and am.remote_frac.tolist() == [1.0] * 3
    assert am.remote_ttft_s.tolist() == pytest.approx([0.090] * 3) and am.local_ttft_s.isna().all()
    text = twin_markdown(runs, dirs)
    assert "| real | conserve | 8 | 3 | 50.0 ms | 10.0 ms | 60.0 ms | 0.0% | n/a | 30.0 ms |" in text
    assert "| real | ampd_rd | 8 | 3 | 100.0 ms | 20.0 ms | 120.0 ms | 100.0% | 90.0 ms | n/a |" in text
    assert "- real, 8, vs AMPD remote_default: -50.0 % [-50.0, -50.0] (n=3, 3 of 3)" in text
    assert "- sim, 8, vs AMPD remote_default: +0.0 % [+0.0, +0.0] (n=3, 0 of 3)" in text


def test_on_seed_pairs_runs_as_the_merge_does():
    """``claims.on_seed``: the runs of both sides with the same seed, in the left side's order, by hand; on unique seeds
    (the fast path) and on a repeated or NaN seed (the merge: every pairing, NaN matching NaN) the same rows, order,
    names and dtypes as ``pandas.merge(on="_seed")``."""
    import numpy as np

    a = pd.DataFrame({"_seed": [5, 1, 3, 9], "m": [50.0, 10.0, 30.0, 90.0]}, index=[7, 8, 9, 10])
    b = pd.DataFrame({"_seed": [3, 4, 5, 1], "m": [3.0, 4.0, 5.0, 1.0]})
    seeds, xa, xb = on_seed(a, b, "m")
    assert seeds.tolist() == [5, 1, 3] and xa.tolist() == [50.0, 10.0, 30.0] and xb.tolist() == [5.0, 1.0, 3.0]
    assert (xa.name, xb.name) == ("m_a", "m_b") and xa.index.tolist() == [0, 1, 2]
    cases = [(a, b), (a.iloc[:0], b), (a, b.iloc[:0]),
             (a.assign(_seed=[5.0, 1.0, 5.0, 9.0]), b.assign(_seed=[5.0, 4.0, 5.0, 1.0])),   # repeated seeds
             (a.assign(_seed=[5.0, np.nan, 3.0, 9.0]), b.assign(_seed=[np.nan, 4.0, 5.0, 3.0])),   # NaN seeds
             (a, b.assign(_seed=b._seed.astype(float)))]   # int against float seeds
    for left, right in cases:
        m = left[["_seed", "m"]].merge(right[["_seed", "m"]], on="_seed", suffixes=("_a", "_b"))
        seeds, xa, xb = on_seed(left, right, "m")
        np.testing.assert_array_equal(seeds, m["_seed"].to_numpy())
        assert seeds.dtype == m["_seed"].dtype
        pd.testing.assert_series_equal(xa, m["m_a"])
        pd.testing.assert_series_equal(xb, m["m_b"])
