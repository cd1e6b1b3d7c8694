"""The claims' workload axis (harness.analysis.claims.workload_words) and agents at SLO
(harness.analysis.agents_at_slo), on hand-made runs tables whose verdicts follow from the numbers by hand.

Workload "swebench" (Poisson, 0.06 conv/s): ConServe's p95 TTFET is half AMPD's on every seed (ratios 0.50,
0.49, 0.51: the interval of the geometric mean, about -50 % +- 2.5 %, excludes 0 and reaches past half the
paper's -51.08 %: *reproduced*). Workload "claude_code" (closed population N = 8): the ratios are 1.001, 0.999,
1.000 (inside the +-5 % equivalence margin: *no difference*). C1's word across workloads is therefore
"depends on workload". Agents at SLO: with the SLO holding up to N = 11 exactly, the integer bisection on
[2, 16] ends at (11, 12).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from harness.analysis.agents_at_slo import agents_from_rows, bisect_agents, slo_holds
from harness.analysis.claims import DEPENDS_ON_WORKLOAD, claims_markdown, workload_frame, workload_words


def runs_table() -> pd.DataFrame:
    rows = []
    for w, ratios, arrival in (("swebench", (0.50, 0.49, 0.51), "poisson"),
                               ("claude_code", (1.001, 0.999, 1.000), "closed")):
        for seed, q in enumerate(ratios):
            for name, mode, p95 in (("conserve", None, 10.0 * q), ("ampd", "remote_default", 10.0)):
                rows.append({"scheduler.name": name, "scheduler.mode": mode, "cluster.name": "h100_1p3d",
                             "workload.name": w, "workload.arrival": arrival,
                             "workload.concurrency": 8 if arrival == "closed" else None,
                             "workload.rate_per_s": 0.06 if arrival == "poisson" else 0.05, "workload.seed": seed,
                             "ttfet_first_p95_s": p95, "ttfet_visible_p95_s": p95, "slo_attainment_first": 1.0,
                             "slo_attainment_visible": 1.0, "tokens_per_joule": 5.0, "num_conversations": 200})
    return pd.DataFrame(rows)


def test_the_load_of_a_closed_population_is_its_n():
    r = workload_frame(runs_table())
    assert set(r[r._workload == "claude_code"]._rate) == {8.0}
    assert set(r[r._workload == "swebench"]._rate) == {0.06}
    assert set(r._timing) == {"think"}


def test_a_word_that_differs_between_workloads_depends_on_workload():
    lines, overall, per, cells = workload_words(runs_table())
    assert per["C1"] == {"claude_code": "no difference", "swebench": "reproduced"}
    assert overall["C1"] == DEPENDS_ON_WORKLOAD
    # no violation on either workload, 600 conversations each (the pooled Clopper-Pearson bound, 3.7 / 600 = 0.6 pp,
    # inside the 3 pp margin): C2 reproduced everywhere, one word
    assert per["C2"] == {"claude_code": "reproduced", "swebench": "reproduced"} and overall["C2"] == "reproduced"
    # C1's swebench cells (two readings): the geometric mean of the ratios, by hand
    gm = math.exp(sum(math.log(x) for x in (0.50, 0.49, 0.51)) / 3) * 100 - 100
    c = [c for c in cells["C1"] if c["workload"] == "swebench" and c["reading"] == "first"][0]
    assert c["mean"] == pytest.approx(gm) and c["n"] == 3
    md = claims_markdown(runs_table())
    assert "## The workload axis: C1-C3 per workload" in md
    assert f"| C1 p95 TTFET vs AMPD | -51.08 % | {DEPENDS_ON_WORKLOAD} |" in md


def test_one_workload_has_no_axis_section():
    one = runs_table()
    one = one[one["workload.name"] == "swebench"]
    assert "workload axis" not in claims_markdown(one)
    assert workload_words(one)[1]["C1"] == "reproduced"


def test_slo_holds_on_the_mean_over_seeds():
    assert slo_holds([0.9, 0.9], 0.9) and not slo_holds([1.0, 0.79], 0.9)
    with pytest.raises(ValueError, match="attainment"):
        slo_holds([], 0.9)
    with pytest.raises(ValueError, match="target"):
        slo_holds([0.5], 0.0)


def test_integer_bisection_finds_the_largest_n_that_holds():
    asked = []

    def holds(n):
        asked.append(n)
        return n <= 11
    assert bisect_agents(holds, 2, 16)[:2] == (11, 12)
    assert len(asked) == len(set(asked)) <= 6          # 2, 16, then halving a 14-wide bracket: 4 more at most
    assert bisect_agents(lambda n: False, 2, 16)[:2] == (None, 2)
    assert bisect_agents(lambda n: True, 2, 16)[:2] == (16, None)
    with pytest.raises(ValueError):
        bisect_agents(lambda n: True, 4, 4)


def test_agents_at_slo_replayed_on_stored_runs():
    # attainment 1.0 up to N = 6, 0.85 (below 0.9) from N = 7, two seeds each; N = 9 never needed
    rows = [{"scheduler.name": "conserve", "scheduler.mode": None, "workload.arrival": "closed",
             "workload.concurrency": n, "workload.seed": s, "workload.timing": "think",
             "workload.max_idle_gap_s": None, "slo_attainment_first": 1.0 if n <= 6 else 0.85}
            for n in (4, 5, 6, 7, 8, 10) for s in (0, 1)]
    ok, bad, tried = agents_from_rows(rows, "conserve", "first", 0.9, 4, 10, (0, 1))
    assert (ok, bad) == (6, 7) and tried[6] and not tried[7]
    with pytest.raises(KeyError, match="ampd_rd at N=4"):
        agents_from_rows(rows, "ampd_rd", "first", 0.9, 4, 10, (0, 1))


def test_one_claude_code_cell_on_the_results_page_by_hand():
    """C1 at N = 8 (think), first reading, ConServe vs AMPD remote_default on the shipped runs: the geometric mean
    over the ten seeds of the p95 ratios and its 95 % t-interval (t_{0.975, 9} = 2.262) written out with numpy,
    found on docs/results/conserve.md as the generator prints it."""
    import numpy as np

    from harness.analysis import results
    from harness.core.paths import PROJECT_ROOT
    runs = pd.read_csv(PROJECT_ROOT / results.CLAUDE_CODE)
    base = runs[(runs["workload.concurrency"] == 8) & (runs["workload.timing"] == "think")
                & runs["workload.max_idle_gap_s"].isna() & (runs["workload.arrival"] == "closed")]
    cs = base[base["scheduler.name"] == "conserve"].set_index("workload.seed").ttfet_first_p95_s
    am = base[(base["scheduler.name"] == "ampd") & (base["scheduler.mode"] == "remote_default")
              ].set_index("workload.seed").ttfet_first_p95_s
    assert sorted(cs.index) == sorted(am.index) == list(range(10))
    x = np.log((cs / am).to_numpy())
    half = 2.262 * x.std(ddof=1) / np.sqrt(len(x))
    est, lo, hi = (np.exp(v) * 100 - 100 for v in (x.mean(), x.mean() - half, x.mean() + half))
    word = ("no difference" if -3 <= lo and hi <= 3 else "inconclusive" if lo <= 0 <= hi else None)
    assert word is not None     # the shipped data decides it one of these two ways (the paper's side is < 0)
    page = (PROJECT_ROOT / "docs" / "results" / "conserve.md").read_text()
    assert f"8 sessions, first, AMPD remote_default, think: {est:+.1f} % [{lo:+.1f}, {hi:+.1f}] (n=10) {word}" in page
