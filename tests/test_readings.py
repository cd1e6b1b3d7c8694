"""Both TTFET readings and per-reading SLOs (harness.analysis.metrics, harness.run.slo_baseline.unloaded_readings).

Expected values are written out from the step-time formulas of tests/test_handcalc.py (which restates
the A40 and Qwen3-0.6B constants), not read from the simulator.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from harness.run.config import scheduler_config
from harness.analysis.metrics import SloConfig, apply_slo, conversation_table, summarize
from harness.core.recorder import TURN_COLUMNS
from harness.run.session import session_input, simulate
from harness.run.slo_baseline import unloaded_readings
from harness.workload.workload import WorkloadConfig, build_workload
from tests.conftest import compose_run, conversation
from tests.test_handcalc import CONV, decode_step, prefill_step, transfer

NO_TURNS = pd.DataFrame(columns=TURN_COLUMNS)


def conv_frame(ids, ttfet_first, ttfet_visible) -> pd.DataFrame:
    """A ``conversations`` frame of completed conversations (headline reading: visible)."""
    n = len(ids)
    return pd.DataFrame({"conversation_id": ids, "ttfet_s": ttfet_visible, "ttfet_first_s": ttfet_first,
                         "ttfet_visible_s": ttfet_visible, "latency_s": ttfet_visible,
                         "last_turn_tpot_s": [0.01] * n, "completed": [True] * n, "failed": [False] * n})


# CONV: turn 0 = 1000 new tokens, 10 out, 5 s tool; turn 1 (the visible one) reuses 1010 + 200 new, 20 out


def test_two_readings_differ_by_hand_computed_amount():
    run = compose_run(["scheduler=collocated", "cluster=a40_4x"])
    convs, stats = build_workload([CONV], WorkloadConfig(arrival="fixed"))
    res = simulate(session_input(run), convs, stats, "collocated", scheduler_config("collocated", {"name": "collocated"}))
    assert not res.error
    conv = conversation_table(pd.DataFrame(res.turns), res.convs, "visible")
    first = prefill_step(1000, 0)                                  # the prefill step samples token 1
    turn0_decode = sum(decode_step(1000 + j) for j in range(9))    # tokens 2..10
    visible = first + turn0_decode + 5.0 + prefill_step(202, 1008)  # 5 s tool; 63 blocks cached
    row = conv.iloc[0]
    assert row.ttfet_first_s == pytest.approx(first, rel=1e-9)
    assert row.ttfet_visible_s == pytest.approx(visible, rel=1e-9)
    assert row.ttfet_visible_s - row.ttfet_first_s == pytest.approx(turn0_decode + 5.0 + prefill_step(202, 1008),
                                                                    rel=1e-9)
    assert row.ttfet_s == row.ttfet_visible_s                      # the headline follows ttfet_definition
    assert conversation_table(pd.DataFrame(res.turns), res.convs, "first").iloc[0].ttfet_s == row.ttfet_first_s


def test_unloaded_baseline_of_the_same_variant():
    """``slo.reference_scheduler=same``: ConServe's unloaded first-turn TTFET includes the P->D transfer
    and the decoder's first step; collocated's is one prefill step."""
    small = conversation("c1", [(0, 400, 5, 1.0), (405, 100, 8, 0.0)])
    run_same = compose_run(["scheduler=conserve", "cluster=a40_1p3d", "slo.reference_scheduler=same"])
    run_col = compose_run(["scheduler=conserve", "cluster=a40_1p3d"])    # reference: collocated
    convs, stats = build_workload([CONV, small], WorkloadConfig(arrival="fixed"))
    same = unloaded_readings(session_input(run_same), convs, stats)
    col = unloaded_readings(session_input(run_col), convs, stats)
    cs_first = prefill_step(1000, 0) + transfer(1000) + decode_step(1000)
    assert same["c0"]["first"] == pytest.approx(cs_first, rel=1e-9)
    assert col["c0"]["first"] == pytest.approx(prefill_step(1000, 0), rel=1e-9)
    assert same["c1"]["first"] == pytest.approx(prefill_step(400, 0) + transfer(400) + decode_step(400), rel=1e-9)

    # loaded first-turn TTFETs: c0 at 1.4 x its ConServe-unloaded value, c1 at 1.6 x
    conv = conv_frame(["c0", "c1"], [1.4 * same["c0"]["first"], 1.6 * same["c1"]["first"]], [300.0, 200.0])
    slo = SloConfig(reference_scheduler="same")          # relative 1.5 x, inherited by both readings
    out = apply_slo(conv.copy(), slo, same)
    assert list(out.slo_met_first) == [True, False]
    assert out.slo_ttfet_first_s.iloc[0] == pytest.approx(1.5 * cs_first, rel=1e-12)
    s = summarize(NO_TURNS,
                  out, [1.0], 1.0, 0)
    assert s["slo_attainment_first"] == 0.5
    # judged against collocated's unloaded value (no transfer, no decoder step) both fail:
    # 1.4 x (p + x + d) > 1.5 x p because x + d > p / 14
    p0 = prefill_step(1000, 0)
    assert 1.4 * cs_first > 1.5 * p0
    out_col = apply_slo(conv.copy(), SloConfig(), col)
    assert list(out_col.slo_met_first) == [False, False]
    assert summarize(NO_TURNS,
                     out_col, [1.0], 1.0, 0)["slo_attainment_first"] == 0.0


def test_per_reading_slo_modes():
    conv = conv_frame(["a", "b"], [0.2, 0.6], [10.0, 30.0])
    # absolute headline on 'visible' (20 s); 'first' has its own absolute threshold (0.5 s)
    slo = SloConfig(ttfet_mode="absolute", ttfet_s=20.0, ttfet_first_mode="absolute", ttfet_first_s=0.5)
    slo.validate()
    out = apply_slo(conv.copy(), slo, None)
    assert list(out.slo_met) == [True, False] and list(out.slo_met_visible) == [True, False]
    assert list(out.slo_met_first) == [True, False]
    # an absolute headline's seconds do not carry over to the other reading: no SLO -> NaN attainment
    out2 = apply_slo(conv.copy(), SloConfig(ttfet_mode="absolute", ttfet_s=20.0), None)
    assert out2.slo_met_first.isna().all()
    s = summarize(NO_TURNS,
                  out2, [1.0], 1.0, 0)
    assert math.isnan(s["slo_attainment_first"]) and s["slo_attainment_visible"] == 0.5
    assert not SloConfig(ttfet_mode="absolute", ttfet_s=20.0).needs_unloaded()
    assert SloConfig(ttfet_mode="absolute", ttfet_s=20.0, ttfet_first_mode="relative").needs_unloaded()
    with pytest.raises(ValueError, match="slo.ttfet_first_s"):
        SloConfig(ttfet_first_mode="absolute").validate()
    with pytest.raises(ValueError, match="slo.ttfet_visible_mode"):
        SloConfig(ttfet_visible_mode="sometimes").validate()


def test_central_window_mean_by_hand():
    """Eight turns submitted out of order: the central window is the 3rd..6th by submission time
    (positions 2..5 of 8); the failed one among them is left out of the mean."""
    from harness.analysis.metrics import _central_mean, central_window
    submit = [7.0, 0.0, 5.0, 1.0, 3.0, 2.0, 6.0, 4.0]
    e2e = [70.0, 0.5, 50.0, 10.0, 30.0, 20.0, 60.0, 40.0]
    status = ["ok", "ok", "ok", "ok", "failed", "ok", "ok", "ok"]
    t = pd.DataFrame({"submit_s": submit, "e2e_s": e2e, "status": status})
    # by submission: 0.0, 1.0, [2.0, 3.0, 4.0, 5.0], 6.0, 7.0 -> e2e 20, 30 (failed), 40, 50
    assert sorted(central_window(t).submit_s) == [2.0, 3.0, 4.0, 5.0]
    assert _central_mean(central_window(t), "e2e_s") == (20.0 + 40.0 + 50.0) / 3
    assert math.isnan(_central_mean(central_window(t.iloc[:0]), "e2e_s"))


# ---- the serving-only reading (visible TTFET minus the replayed tool and think time) ---------------------

def test_serving_ttfet_by_hand():
    """Arrival 10 s; turn 0 submitted at 10, finished at 15; 5 s tool; turn 1 submitted at 20, finished at 26;
    4 s tool; turn 2 (visible) submitted at 30, first token at 33. Visible TTFET 33 - 10 = 23 s, replayed
    tool time 5 + 4 = 9 s: serving-only 14 s = (15 - 10) + (26 - 20) + (33 - 30)."""
    from harness.analysis.metrics import serving_ttfet
    spans = {0: (10.0, 11.0, 15.0), 1: (20.0, 21.5, 26.0), 2: (30.0, 33.0, 40.0)}
    assert serving_ttfet(spans, 2) == pytest.approx(23.0 - 9.0)
    assert serving_ttfet(spans, 0) == pytest.approx(1.0)            # turn 0 visible: its TTFT
    assert math.isnan(serving_ttfet({0: spans[0], 2: spans[2]}, 2))  # turn 1 never completed


def test_serving_reading_is_visible_minus_the_tool_time():
    """CONV on an idle collocated A40 (fixed arrival): its serving-only TTFET is the visible TTFET less the
    5 s of replayed tool time, i.e. turn 0's E2E plus turn 1's prefill (tests/test_handcalc.py formulas);
    the unloaded baseline of the same conversation gives the same value, so a 1.5 x relative SLO is met."""
    run = compose_run(["scheduler=collocated", "cluster=a40_4x"])
    convs, stats = build_workload([CONV], WorkloadConfig(arrival="fixed"))
    res = simulate(session_input(run), convs, stats, "collocated", scheduler_config("collocated", {"name": "collocated"}))
    assert not res.error
    conv = conversation_table(pd.DataFrame(res.turns), res.convs, "visible")
    serving = prefill_step(1000, 0) + sum(decode_step(1000 + j) for j in range(9)) + prefill_step(202, 1008)
    row = conv.iloc[0]
    assert row.ttfet_serving_s == pytest.approx(serving, rel=1e-9)
    assert row.ttfet_visible_s - row.ttfet_serving_s == pytest.approx(5.0, rel=1e-9)
    unloaded = unloaded_readings(session_input(run), convs, stats, cache_dir="")
    cid = row.conversation_id
    assert unloaded[cid]["serving"] == pytest.approx(serving, rel=1e-9)
    out = apply_slo(conv.copy(), SloConfig(), unloaded)
    assert out.slo_ttfet_serving_s.iloc[0] == pytest.approx(1.5 * serving, rel=1e-9)
    assert out.slo_met_serving.iloc[0] is True


def test_serving_slo_and_percentiles_by_hand():
    """Two conversations, serving-only TTFET 4 s and 9 s against unloaded 3 s each and a 2 x multiple (6 s):
    one meets it (attainment 0.5); p50 = 6.5 s, p95 = 4 + 0.95 x 5 = 8.75 s (linear interpolation)."""
    conv = conv_frame(["a", "b"], [1.0, 1.0], [20.0, 30.0])
    conv["ttfet_serving_s"] = [4.0, 9.0]
    unloaded = {c: {"first": 1.0, "visible": 20.0, "serving": 3.0} for c in ("a", "b")}
    out = apply_slo(conv.copy(), SloConfig(ttfet_serving_multiple=2.0), unloaded)
    assert list(out.slo_met_serving) == [True, False]
    s = summarize(NO_TURNS, out, [1.0], 1.0, 0)
    assert s["slo_attainment_serving"] == 0.5
    assert s["ttfet_serving_p50_s"] == pytest.approx(6.5) and s["ttfet_serving_p95_s"] == pytest.approx(8.75)
    # a table without the column (a run stored before the reading existed): no SLO column, NaN keys
    old = apply_slo(conv_frame(["a"], [1.0], [20.0]), SloConfig(), unloaded)
    assert "slo_met_serving" not in old.columns
    s_old = summarize(NO_TURNS, old, [1.0], 1.0, 0)
    assert math.isnan(s_old["slo_attainment_serving"]) and math.isnan(s_old["ttfet_serving_p95_s"])


def test_ttfet_from_admission_by_hand():
    """Conversation a held 10 s at admission (turn 0 submitted at 0, admitted at 10), b not held: first-turn
    TTFET 15 s and 3 s from arrival are 5 s and 3 s from admission; p95 of (5, 3) = 3 + 0.95 x 2 = 4.9 s."""
    from harness.analysis.metrics import admission_readings
    turns = pd.DataFrame({"conversation_id": ["a", "a", "b"], "turn": [0, 1, 0], "submit_s": [0.0, 20.0, 1.0],
                          "admit_s": [10.0, 20.0, 1.0]})
    conv = conv_frame(["a", "b"], [15.0, 3.0], [40.0, 30.0])
    conv["ttfet_serving_s"] = [25.0, 8.0]
    got = admission_readings(turns, conv)
    assert got["ttfet_first_from_admission_p95_s"] == pytest.approx(4.9)
    assert got["ttfet_visible_from_admission_p95_s"] == pytest.approx(30.0)   # (40 - 10, 30 - 0)
    assert got["ttfet_serving_from_admission_p95_s"] == pytest.approx(8.0 + 0.95 * 7.0)   # (15, 8)
