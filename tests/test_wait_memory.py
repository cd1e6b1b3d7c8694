"""The WAIT paper's memory setting and Nested WAIT's safety buffer, each checked against a value derived by hand:
the KV capacity the paper states (numerical.tex: one A100 80 GB, Llama-2-7B, 0.5 MiB per KV token, "after model
weights and the baseline 1 % memory margin ... approximately 1.37e5 tokens") and the Figure F setting (Vidur's
memory margin 0.6); the boundary-queue drift rate ``theta_k`` of the paper's Theorem (a case whose root is exact);
the buffer on a two-segment plan; the buffer's effect on one step of a hand-built Nested WAIT state; the per-seed
capacity estimator of the WAIT table on a hand-made bisection."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from baselines.wait.fluid import PromptType, boundary_drift_rate, nested_wait_safety_buffer, nested_wait_thresholds
from baselines.wait.fluid_admission import NestedWaitRule, rule_from_spec
from harness.analysis.capacity import capacity_margin, capacity_summary, seed_capacities
from harness.core.batching import StepInput

GIB = 1024 ** 3


def _llama2_7b_weight_bytes() -> int:
    """Llama-2-7B (config.json: 32 layers, hidden 4096, 32 heads, MHA, intermediate 11008, vocab 32000, untied),
    fp16, written out: per layer q, k, v, o = 4 x 4096^2 and the gated MLP 3 x 4096 x 11008; embedding and LM
    head 2 x 32000 x 4096."""
    per_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008
    return 2 * (32 * per_layer + 2 * 32000 * 4096)


@pytest.mark.parametrize("util, blocks", [(0.99, 8531), (0.4, 2489), (0.6, 4537)])
def test_kv_capacity_of_the_papers_setup(util, blocks):
    """The wait_paper preset with the memory-bound arm: floor((80 GiB x util - weights) / (0.5 MiB x 16)) blocks.
    By hand: weights 13,476,298,752 B; 0.99 (the paper's 1 % margin): 71,564,053,708.8 B / 8,388,608 = 8,531.08 ->
    136,496 tokens, the paper's "approximately 1.37e5"; 0.4 (Figure F, Vidur's margin 0.6: total x (1 - 0.6)):
    2,489 blocks = 39,824 tokens; 0.6 (Figure F's docstring read as "60 % of the pool"): 4,537 blocks."""
    from harness.core.profiles import kv_capacity_blocks
    from harness.run.config import resolve
    from tests.conftest import compose_cfg

    assert _llama2_7b_weight_bytes() == 13_476_298_752
    assert math.floor((80 * GIB * util - 13_476_298_752) / (524_288 * 16)) == blocks
    run = resolve(compose_cfg(["+experiment=wait_paper", "+experiment/arm=wait_cp_memory", "workload=wait_long",
                               f"engine.gpu_memory_utilization={util}"]))
    cfg = run.cfg
    hw = run.instances[0][2]
    assert hw.mem_bytes == 80 * GIB
    assert cfg.model.weight_bytes == _llama2_7b_weight_bytes() and cfg.model.kv_bytes_per_token == 524_288
    assert kv_capacity_blocks(hw, cfg.model, cfg.engine) == blocks
    if util == 0.99:
        assert abs(blocks * 16 - 1.37e5) / 1.37e5 < 0.005


def test_boundary_drift_rate_exact_root():
    """n_(k-1) = 2, n_k = 1, p = 1/4: (3/4 + x/4)^2 = x with x = e^theta, i.e. x^2 - 10 x + 9 = 0, x = 9
    (x = 1 is theta = 0): theta = ln 9 = 2.1972."""
    assert boundary_drift_rate(2.0, 1.0, 0.25) == pytest.approx(math.log(9.0), rel=1e-9)
    # the paper's bound theta >= 8 (n_k - n_(k-1) p) / n_(k-1) is for its regime; here only the root is checked
    with pytest.raises(ValueError, match="drift condition"):
        boundary_drift_rate(2.0, 0.5, 0.25)       # n_k / n_(k-1) = p: the boundary queue does not drain
    with pytest.raises(ValueError, match="drift condition"):
        boundary_drift_rate(2.0, 2.0, 0.25)       # n_k = n_(k-1): no log term (the caller's case)


def _two_segment_plan():
    """Types 3/s of 10 + 2 tokens and 1/s of 10 + 4: boundaries 2, 4 (Delta 2, 2), p_2 = 1 / 4; eta 0.25 gives
    q_2 = 0.5, and tl = 6 = 2 n_1 + 2 n_2 gives n_1 = 2, n_2 = 1."""
    types = [PromptType(3.0, 10.0, 2.0), PromptType(1.0, 10.0, 4.0)]
    plan = nested_wait_thresholds(types, 0.01, 1e-6, 1e6, 6.0, eta=0.25)
    assert plan.boundaries_tokens == (2, 4) and plan.thresholds == pytest.approx((2.0, 1.0))
    assert plan.p == pytest.approx((1.0, 0.25))
    return types, plan


def test_safety_buffer_on_a_two_segment_plan():
    """buffer = (l + l'_1)(n_2 + ln(m (1 + T / d0) / delta) / theta_2) with l = 10, l'_1 = 2, m = 2, T / d0 =
    0.99 / 0.01 = 99, delta = 0.02: ln(2 x 100 / 0.02) = ln 10^4 = 9.21034, theta_2 = ln 9 = 2.19722:
    12 x (1 + 4.19181) = 62.302 tokens."""
    types, plan = _two_segment_plan()
    buf, thetas = nested_wait_safety_buffer(plan, types, 0.01, 0.99, 0.02)
    assert thetas == pytest.approx((math.log(9.0),))
    assert buf == pytest.approx(12 * (1 + math.log(1e4) / math.log(9.0)), rel=1e-9)
    assert buf == pytest.approx(62.302, abs=1e-3)
    # one segment: no boundary queue, no buffer
    one = nested_wait_thresholds([PromptType(1.0, 10.0, 4.0)], 0.01, 1e-6, 1e6, 4.0)
    assert nested_wait_safety_buffer(one, [PromptType(1.0, 10.0, 4.0)], 0.01, 0.99, 0.02) == (0.0, ())


def _fake(stage, admit_seq, prompt=4):
    return SimpleNamespace(conv=f"c{admit_seq}", turn=0, prompt=prompt, prefill_target=prompt,
                           computed=0 if stage == 0 else prompt + stage - 1, blocks=0, out_done=stage,
                           remote_kv=False, admit_seq=admit_seq, submit_s=float(admit_seq), idle_since_s=0.0,
                           stage=stage)


def _inp(waiting, free_blocks):
    # block size 1 (a token a block), 1,000-block capacity, no watermark, no chunk cap
    return StepInput(0.0, [], waiting, 10_000, free_blocks, 0, 1000, 1, 10_000, 0, lambda r: 0)


@pytest.mark.parametrize("reserve, free, admitted", [(0, 15, 2), (10, 15, 1), (10, 18, 2), (10, 13, 0)])
def test_reserve_stops_admission_at_the_buffer(reserve, free, admitted):
    """Segment 1 cap 2, three waiting prompts of 4 tokens (4 blocks each). Without a reserve two are admitted. With
    10 tokens reserved and 15 blocks free: 15 - 10 = 5 blocks for admissions, the first takes 4, the second would
    need 4 > 1: one admitted; 18 free: 8 = 4 + 4, two; 13 free: 3 < 4, none (and the plan is empty)."""
    rule = NestedWaitRule([2, 5], [[2, 2], [1, 1, 1]], max_wait_s=10.0, reserve_tokens=reserve)
    waiting = [_fake(0, -1 - i) for i in range(3)]
    plan = rule.plan(_inp(waiting, free))
    assert len(plan.admit) == admitted
    assert list(plan.admit) == sorted(waiting[:admitted], key=lambda r: r.submit_s)


def test_reserve_travels_in_the_spec():
    rule = NestedWaitRule([2, 5], [[2, 2], [1, 1, 1]], max_wait_s=10.0, reserve_tokens=62.5)
    spec = rule.to_spec()
    assert spec["reserve_tokens"] == 62.5 and rule_from_spec(spec).reserve_tokens == 62.5
    assert "reserve_tokens" not in NestedWaitRule([2, 5], [[2, 2], [1, 1, 1]], max_wait_s=10.0).to_spec()
    with pytest.raises(ValueError, match="reserve_tokens"):
        NestedWaitRule([2, 5], [[2, 2], [1, 1, 1]], max_wait_s=10.0, reserve_tokens=-1.0)


def test_per_seed_capacity_and_its_margin():
    """Seeds with capacities 21.3 and 22.1 prompts/s (bounded below, unbounded at or above), bisected on [19, 25]
    to 0.375: seed 0 tries 19, 25, 22, 20.5, 21.25, 21.625 -> [21.25, 21.625), midpoint 21.4375; seed 1 tries 19,
    25, 22, 23.5, 22.75, 22.375 -> [22, 22.375), midpoint 22.1875. Mean 21.8125, half-width t_{0.975,1} = 12.706 x
    sd 0.53033 / sqrt 2 = 4.7647. An arm 10 % faster on each seed: margin +10 % (interval of zero width)."""
    cap = {0: 21.3, 1: 22.1}
    br = seed_capacities(lambda r, s: r < cap[s], [0, 1], 19.0, 25.0, 0.375)
    assert br == {0: (21.25, 21.625), 1: (22.0, 22.375)}
    s = capacity_summary(br)
    assert s["points"] == {0: 21.4375, 1: 22.1875} and s["mean"] == pytest.approx(21.8125)
    assert s["half"] == pytest.approx(12.706 * math.sqrt(2 * 0.375 ** 2) / math.sqrt(2), rel=1e-3)
    fast = {k: (lo * 1.1, hi * 1.1) for k, (lo, hi) in br.items()}
    est, ci, n, k, word = capacity_margin(fast, br, 4.5)
    assert est == pytest.approx(10.0) and ci == pytest.approx((10.0, 10.0)) and (n, k) == (2, 2)
    assert word == "reproduced"
    # a seed outside the bracket is named, not averaged
    out = capacity_summary({0: (21.25, 21.625), 1: (25.0, math.inf)})
    assert out["outside"] == [1] and out["n"] == 1


def _wait_memory_script():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "wait_memory.py"
    spec = importlib.util.spec_from_file_location("wait_memory_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _probe(arm, rate, seed, ratio):
    return {"workload": "wait_long", "arm": arm, "memory": 0.99, "rate": rate, "seed": seed, "n": 2000,
            "growth_ratio": ratio}


def test_w6_capacity_bisection_on_stored_probes(tmp_path):
    """W6's capacity (scripts/wait_memory.py --capacity 1.5,2.5 --cap-tol 0.125) replayed on hand-made probes: a seed
    whose window grows (ratio 2.0 > 1.25) from 2.05 prompts/s up tries 1.5, 2.5, 2.0, 2.25, 2.125 -> [2.0, 2.125),
    midpoint 2.0625; one unbounded from 1.8 up tries 1.5, 2.5, 2.0, 1.75, 1.875 -> [1.75, 1.875), midpoint 1.8125.
    The script's bisection (run=False: only stored probes) and the results page's replay of capacity.csv give these
    brackets; the page's W6 load of 1.56 prompts/s is 1.56 / 2.0625 and 1.56 / 1.8125 averaged (0.8085)."""
    import pandas as pd

    from harness.analysis import results
    wm = _wait_memory_script()
    cap = {0: 2.05, 1: 1.8}
    rows = [_probe("sarathi", r, s, 2.0 if r >= cap[s] else 1.0)
            for s in cap for r in (1.5, 2.5, 2.0, 2.25, 2.125, 1.75, 1.875)]
    store = wm._Rows(tmp_path / "capacity.csv")
    for r in rows:
        store.done[wm._key(r)] = r
    got = wm.capacities(store, "wait_long", 0.99, ["sarathi"], [0, 1], 1.5, 2.5, 0.125, 2000, run=False)
    assert got == {"sarathi": {0: (2.0, 2.125), 1: (1.75, 1.875)}}
    # an incomplete bisection (a probe missing) is left out, not guessed
    del store.done[wm._key(_probe("sarathi", 2.125, 0, 1.0))]
    assert wm.capacities(store, "wait_long", 0.99, ["sarathi"], [0, 1], 1.5, 2.5, 0.125, 2000,
                         run=False) == {"sarathi": {1: (1.75, 1.875)}}
    caps = results.wait_memory_capacity(pd.DataFrame(rows))
    assert caps == {(0.99, "sarathi"): {0: (2.0, 2.125), 1: (1.75, 1.875)}}
    cells = pd.DataFrame([{**_probe(arm, 1.56, s, 1.0), "e2e_central_mean_s": e2e, "restart_rate_pct": 0.0,
                           "preemptions": 0} for s in (0, 1) for arm, e2e in (("sarathi", 30.0), ("wait_cp_long", 27.0))])
    got = results.wait_memory_cells(cells, results.W6, caps=caps)
    assert got and all(c["load"][0] == pytest.approx((1.56 / 2.0625 + 1.56 / 1.8125) / 2) for c in got)


def test_an_older_runs_csv_gains_the_growth_ratio_column(tmp_path):
    """A runs.csv written before the growth_ratio column keeps its rows (the new column empty) and is rewritten with
    the script's columns, so rows appended after it line up."""
    wm = _wait_memory_script()
    p = tmp_path / "runs.csv"
    old = [f for f in wm.FIELDS if f != "growth_ratio"]
    p.write_text(",".join(old) + "\n" + ",".join("wait_long" if f == "workload" else "sarathi" if f == "arm" else "1"
                                                 for f in old) + "\n")
    store = wm._Rows(p)
    assert len(store.done) == 1
    store.add({**{f: 2 for f in wm.FIELDS}, "workload": "wait_long", "arm": "vllm"})
    store.close()
    lines = p.read_text().splitlines()
    assert lines[0] == ",".join(wm.FIELDS) and len(lines) == 3
    assert all(len(x.split(",")) == len(wm.FIELDS) for x in lines)
