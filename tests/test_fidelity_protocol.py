"""harness.tools.fidelity's protocol verdict on hand-made errors and run-to-run spreads."""

from __future__ import annotations

import math

from harness.tools.fidelity import FIELD_TARGETS, protocol_rows, protocol_verdict


def test_verdict_within_noise_met_missed():
    assert protocol_verdict(0.04, 0.06, 0.10) == "within noise"     # |err| below the real side's own spread
    assert protocol_verdict(-0.08, 0.02, 0.10) == "met"              # above the noise, within the target
    assert protocol_verdict(0.25, 0.05, 0.20) == "missed"
    assert protocol_verdict(0.12, 0.30, 0.10) == "within noise"      # a miss the noise cannot tell apart
    assert protocol_verdict(0.10, 0.10, 0.10) == "met"               # equal to the spread is not below it
    assert protocol_verdict(0.05, math.nan, 0.10) == "met"           # no spread: judged on the target only
    assert protocol_verdict(math.nan, 0.1, 0.1) == "no data"


def test_rows_take_the_larger_error_and_the_real_spread():
    # real E2E 2.0 s then 2.1 s (spread 5 %); sim errors +3 % and -7 %: the larger (-7 %) is above the
    # noise and within 10 %: met. TTFT: real 0.100 then 0.150 (spread 50 %), errors +30 %/-13 %: within noise.
    # ITL: real 10 ms twice (spread 0), errors +12 %, +11 %: missed (target 10 %).
    first = {"server_e2e_mean_s": {"real": 2.0, "err": 0.03}, "server_ttft_mean_s": {"real": 0.100, "err": 0.30},
             "server_itl_mean_s": {"real": 0.010, "err": 0.12}}
    repeat = {"server_e2e_mean_s": {"real": 2.1, "err": -0.07}, "server_ttft_mean_s": {"real": 0.150, "err": -0.13},
              "server_itl_mean_s": {"real": 0.010, "err": 0.11}}
    rows = protocol_rows(first, repeat)
    assert abs(rows["server_e2e_mean_s"]["spread"] - 0.05) < 1e-12
    assert rows["server_e2e_mean_s"]["verdict"] == "met"
    assert abs(rows["server_ttft_mean_s"]["spread"] - 0.5) < 1e-12
    assert rows["server_ttft_mean_s"]["verdict"] == "within noise"
    assert rows["server_itl_mean_s"]["verdict"] == "missed"
    assert FIELD_TARGETS == {"server_e2e_mean_s": 0.10, "server_ttft_mean_s": 0.20, "server_itl_mean_s": 0.10}
