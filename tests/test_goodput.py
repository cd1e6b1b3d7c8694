"""Per-request goodput (harness.analysis.goodput): vLLM's and AIPerf's ``--goodput`` semantics, counted by hand.

* A hand-made turns table whose TTFT/TPOT/E2E sit on either side of the thresholds: the good turns are
  listed by hand, for vLLM's rule (a 1-token turn's TPOT is 0) and AIPerf's (a 1-token turn has no ITL and
  fails a TPOT threshold); failed turns are never good.
* A small run on the fake backend (tests/test_pipeline.py: a turn's first token comes ``step_s`` after its
  start and every further token ``step_s`` later, nothing queues), so a turn's E2E is
  ``output_tokens x step_s``: with an E2E threshold between two output lengths the good turns are the
  workload's turns with at most that many output tokens, counted from the trace, not from the run.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from harness.run.config import ConfigError
from harness.analysis.goodput import good_turns, goodput_summary, parse_goodput
from harness.run.runner import execute
from harness.run.session import context_limit
from harness.core.trace import load_trace
from harness.workload.workload import build_workload
from tests.conftest import compose_run
from tests.test_pipeline import SMALL  # noqa: F401  (also registers backend=fake)


def test_parse_accepts_vllm_and_aiperf_forms_and_names_bad_fields():
    assert parse_goodput("ttft:200 tpot:50 e2el:2000") == {"ttft": 200.0, "tpot": 50.0, "e2el": 2000.0}
    assert parse_goodput("e2el:1000,ttft:5") == {"ttft": 5.0, "e2el": 1000.0}
    assert parse_goodput({"time_to_first_token": 100, "inter_token_latency": 3.4}) == {"ttft": 100.0, "tpot": 3.4}
    assert parse_goodput(None) == {} and parse_goodput("") == {}
    for bad, needle in (("ttft:0", "slo.goodput.ttft must be > 0"), ("itl:3", "unknown goodput key 'itl'"),
                        ("ttft", "is not KEY:VALUE"), ("ttft:1 time_to_first_token:2", "given twice"),
                        ("ttft:abc", "must be a number of ms")):
        with pytest.raises(ValueError, match=needle):
            parse_goodput(bad)


def test_config_error_names_slo_goodput():
    with pytest.raises(ConfigError, match="slo.goodput: unknown goodput key 'foo'"):
        compose_run(["slo.goodput='ttft:200 foo:3'"])
    assert compose_run(["slo.goodput={ttft:200,tpot:50}"]).cfg.slo.goodput_thresholds_ms() == {"ttft": 200.0,
                                                                                               "tpot": 50.0}


def _turns():
    # ttft_s, tpot_s, e2e_s, output_tokens, status
    rows = [
        (0.100, 0.040, 1.0, 10, "ok"),       # 0: meets all
        (0.300, 0.040, 1.0, 10, "ok"),       # 1: TTFT too slow
        (0.100, 0.060, 1.0, 10, "ok"),       # 2: TPOT too slow
        (0.100, 0.040, 2.5, 10, "ok"),       # 3: E2E too slow
        (0.150, math.nan, 0.15, 1, "ok"),    # 4: 1 token: vLLM good (TPOT 0), AIPerf not (no ITL)
        (0.100, 0.040, 1.0, 0, "failed"),    # 5: failed: never good
        (0.200, 0.050, 2.0, 5, "ok"),        # 6: exactly on every threshold: good (<=)
    ]
    return pd.DataFrame(rows, columns=["ttft_s", "tpot_s", "e2e_s", "output_tokens", "status"])


def test_good_turns_by_hand():
    t = _turns()
    th = {"ttft": 200.0, "tpot": 50.0, "e2el": 2000.0}
    assert list(np.flatnonzero(good_turns(t, th, "vllm"))) == [0, 4, 6]
    assert list(np.flatnonzero(good_turns(t, th, "aiperf"))) == [0, 6]
    # without a TPOT threshold the two rules agree: 0, 2 (TPOT no longer checked), 4, 6
    assert list(np.flatnonzero(good_turns(t, {"ttft": 200, "e2el": 2000}, "aiperf"))) == [0, 2, 4, 6]
    s = goodput_summary(t, th, window_s=10.0)
    assert s["good_request_count"] == 3 and s["request_goodput_per_s"] == pytest.approx(0.3)
    assert s["good_request_count_aiperf"] == 2 and s["request_goodput_aiperf_per_s"] == pytest.approx(0.2)
    assert s["good_request_frac"] == pytest.approx(3 / 7)
    assert goodput_summary(t, {}, 10.0) == {}
    assert math.isnan(goodput_summary(t, th, 0.0)["request_goodput_per_s"])


def test_small_run_goodput_equals_a_hand_count(tmp_path):
    step = 0.01
    base = SMALL + ["scheduler=collocated", "cluster=a40_4x", "slo=absolute", "backend=fake",
                    f"backend.step_s={step}"]
    run = compose_run(base)
    convs, _ = build_workload(load_trace(run.trace_path), run.cfg.workload, context_limit(run))
    outs = sorted(t.output_tokens for _, rec in convs for t in rec.turns)
    assert len(set(outs)) > 2
    cut = outs[len(outs) // 2]  # a threshold between `cut` and the next longer output
    longer = [o for o in outs if o > cut]
    e2el_ms = (cut + 0.5) * step * 1e3 if not longer else (cut + min(longer)) / 2 * step * 1e3
    expected = sum(o <= cut for o in outs)
    out = tmp_path / "run"
    execute(compose_run(base + [f"slo.goodput='ttft:{1.5 * step * 1e3} e2el:{e2el_ms}'"]), out)
    s = json.loads((out / "summary.json").read_text())
    t = pd.read_parquet(out / "turns.parquet")
    assert len(t) == len(outs) and (t.status == "ok").all()
    assert s["good_request_count"] == expected == s["good_request_count_aiperf"]
    window = t.finish_s.max() - min(a for a, _ in convs)
    assert s["window_s"] == pytest.approx(window, rel=1e-9)
    assert s["request_goodput_per_s"] == pytest.approx(expected / window, rel=1e-9)
    assert s["goodput_thresholds_ms"] == {"ttft": 1.5 * step * 1e3, "e2el": e2el_ms}
    # a TTFT threshold below the first token's step: no turn is good
    out2 = tmp_path / "run2"
    execute(compose_run(base + [f"slo.goodput=ttft:{0.5 * step * 1e3}"]), out2)
    assert json.loads((out2 / "summary.json").read_text())["good_request_count"] == 0


def _agreement_module():
    import importlib.util
    from harness.run.config import PROJECT_ROOT
    spec = importlib.util.spec_from_file_location("goodput_agreement", PROJECT_ROOT / "benchmarks" / "goodput_agreement.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_goodput_agreement_rule_and_shifted_recount_by_hand():
    """benchmarks/goodput_agreement.py's rule: agree when |mean G_h - mean G_b| <= spread + overhead.
    harness 1.0, 0.8 / bench 0.7, 0.75 req/s, overhead 0.05: difference 0.9 - 0.725 = 0.175 <= spread
    max(0.2, 0.05) + 0.05 = 0.25 -> agree; harness 1.0, 1.0 / bench 0.5, 0.5, overhead 0.1: 0.5 > 0 + 0.1 ->
    disagree. The shifted recount: TTFT 100 / 160 / 200 ms, E2E 500 / 900 / 1050 ms, ``ttft:150 e2el:1000``,
    window 2 s: 1 good -> 0.5 req/s; shifted by -20 ms (TTFT 80 / 140 / 180, E2E 480 / 880 / 1030): 2 good ->
    1.0 req/s; by +60 ms: TTFT 160 fails the first -> 0 req/s."""
    m = _agreement_module()
    a = m.agreement([1.0, 0.8], [0.7, 0.75], [0.05, 0.05])
    assert a["verdict"] == "agree" and a["spread_per_s"] == pytest.approx(0.2)
    assert a["difference_per_s"] == pytest.approx(0.175) and a["allowed_per_s"] == pytest.approx(0.25)
    assert m.agreement([1.0, 1.0], [0.5, 0.5], [0.1, 0.1])["verdict"] == "disagree"
    with pytest.raises(ValueError, match="one goodput per round"):
        m.agreement([1.0], [1.0, 0.9], [0.0])
    t = pd.DataFrame({"status": ["ok"] * 3, "ttft_s": [0.10, 0.16, 0.20], "e2e_s": [0.5, 0.9, 1.05],
                      "tpot_s": [0.01] * 3, "output_tokens": [32] * 3})
    th = {"ttft": 150.0, "e2el": 1000.0}
    assert m.shifted_goodput(t, th, 0.0, 2.0) == pytest.approx(0.5)
    assert m.shifted_goodput(t, th, 20.0, 2.0) == pytest.approx(1.0)
    assert m.shifted_goodput(t, th, -60.0, 2.0) == pytest.approx(0.0)
