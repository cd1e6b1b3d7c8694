"""KV-capacity and admission pressure in ``summary.json`` (``harness.analysis.metrics.pressure_metrics``, issue 18):
hand-made turns and instance samples, every expected number computed by hand in the comments."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from harness.analysis.metrics import pressure_metrics


def test_admission_holds_and_time_weighted_decoder_kv_by_hand():
    # turn 0 of a: no hold; b: submitted 1 s, admitted 3 s (2 s); c: 2 -> 7 s (5 s); b's turn 1 waits
    # 10 s but later turns are not admission holds of a conversation
    turns = pd.DataFrame({"conversation_id": ["a", "b", "c", "b"], "turn": [0, 0, 0, 1],
                          "submit_s": [0.0, 1.0, 2.0, 20.0], "admit_s": [0.0, 3.0, 7.0, 30.0]})
    # decoder0: 0.2 on [0, 1), 0.6 on [1, 3), 0.4 on [3, 4]; decoder1: 0.1 on [0, 2), 0.9 on [2, 4];
    # the prefiller (1.0) and decoder0's sample at 5 s (outside the window [0, 4]) do not count
    inst = pd.DataFrame({"t_s": [0.0, 1.0, 3.0, 5.0, 0.0, 2.0, 0.0],
                         "instance": ["decoder0"] * 4 + ["decoder1"] * 2 + ["prefiller0"],
                         "role": ["decoder"] * 6 + ["prefiller"],
                         "kv_used_frac": [0.2, 0.6, 0.4, 1.0, 0.1, 0.9, 1.0]})
    m = pressure_metrics(turns, inst, (0.0, 4.0))
    assert m["admission_held_conversations"] == 2
    assert m["admission_hold_s_total"] == pytest.approx(7.0)
    # numpy's linear percentile of [2, 5] at 95 %: 2 + 0.95 x 3 = 4.85
    assert m["admission_hold_p95_s"] == pytest.approx(4.85) and m["admission_hold_max_s"] == 5.0
    assert m["decoder_kv_peak_frac"] == 0.9
    # (0.2 x 1 + 0.6 x 2 + 0.4 x 1 + 0.1 x 2 + 0.9 x 2) / (4 + 4) = 3.8 / 8
    assert m["decoder_kv_mean_frac"] == pytest.approx(0.475)


def test_nothing_held_and_no_samples_give_zero_and_nan():
    turns = pd.DataFrame({"conversation_id": ["a"], "turn": [0], "submit_s": [1.0], "admit_s": [1.0]})
    m = pressure_metrics(turns, pd.DataFrame(columns=["t_s", "instance", "role", "kv_used_frac"]), (0.0, 1.0))
    assert m["admission_held_conversations"] == 0 and m["admission_hold_s_total"] == 0.0
    assert all(math.isnan(m[k]) for k in ("admission_hold_p95_s", "admission_hold_max_s",
                                          "decoder_kv_peak_frac", "decoder_kv_mean_frac"))
