"""harness.tools.calibrate on synthetic observations: step times generated from known coefficients by the
roofline written out by hand below (not by harness.sim.perf), then fitted back; the reconstruction of
step observations from hand-made token timestamps; the engine-side per-request deltas; the written YAML
loads as a hardware profile."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from harness.tools.calibrate import (FITTED, Observations, _engine_requests, fit, load_profile, observations,
                               profile_yaml, FitResult)
from harness.core.profiles import HardwareConfig, ModelConfig

# The tiny model (conf/model/tiny.yaml): 2 layers, hidden 256, 4 heads / 2 KV heads x 64, MLP 512, vocab 4096.
TINY = ModelConfig(name="tiny", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                   intermediate_size=512, vocab_size=4096, tied_embeddings=True, dtype_bytes=2)
# By hand: linear params per layer = q 256*256 + k,v 2*256*128 + o 256*256 + MLP 3*256*512 = 589,824
LIN_FLOPS_PER_TOKEN = 2 * 2 * 589_824           # 2 FLOP per MAC x 2 layers
HEAD_FLOPS_PER_SEQ = 2 * 256 * 4096              # LM head
ATTN_FLOPS_PER_PAIR = 4 * 2 * 4 * 64             # 4 x layers x heads x head_dim
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 64 * 2          # K and V x layers x KV heads x head_dim x 2 bytes
WEIGHT_BYTES = (2 * 589_824 + 4096 * 256) * 2    # streamed per step: layers + (tied) LM head

PEAK, BW = 1.0e11, 2.0e10
BASE = HardwareConfig(name="cpu", peak_flops=PEAK, mem_bandwidth_bytes_per_s=BW, mem_bytes=8e9, tdp_w=100.0,
                      idle_w=10.0, prefill_efficiency=0.5, decode_efficiency=0.5, memory_efficiency=0.8)
TRUE = {"step_overhead_s": 2.5e-3, "prefill_efficiency": 0.27, "attention_efficiency": 0.12,
        "decode_efficiency": 0.17, "kv_memory_efficiency": 0.05}


def hand_step_s(b: int, ctx: int, n: int, p: int, c=TRUE) -> float:
    """One step by the formula of docs/calibration.md with the hard roofline (k = null), zero per-layer /
    per-sequence / per-token overheads, written out independently of harness.sim.perf."""
    lin_c = (LIN_FLOPS_PER_TOKEN * n + HEAD_FLOPS_PER_SEQ * (1 if n else 0)) / (PEAK * c["prefill_efficiency"]) \
        + (LIN_FLOPS_PER_TOKEN + HEAD_FLOPS_PER_SEQ) * b / (PEAK * c["decode_efficiency"])
    lin_m = WEIGHT_BYTES / (BW * 0.8)
    pairs = n * p + n * (n + 1) / 2
    attn = ATTN_FLOPS_PER_PAIR * pairs / (PEAK * c["attention_efficiency"])
    kv = KV_BYTES_PER_TOKEN * (p + n + ctx + b) / (BW * c["kv_memory_efficiency"])
    return max(lin_c, lin_m) + attn + kv + c["step_overhead_s"]


def synthetic_obs(noise: float = 0.0, outliers: int = 0, seed: int = 0) -> Observations:
    rng = np.random.default_rng(seed)
    obs = Observations()
    for b in range(1, 17):                      # decode steps: batch 1..16, contexts 100..1800 per sequence
        for per_seq in (100, 600, 1200, 1800):
            t = hand_step_s(b, b * per_seq, 0, 0) * math.exp(noise * rng.standard_normal())
            obs.add("decode_live", t, 1.0 / b, [(b, b * per_seq, 0, 0, 0.0, 0, 0)])
    for n in (32, 128, 384, 768, 1280, 1792):   # prefills alone and next to a decode batch
        for b in (0, 4):
            t = hand_step_s(b, b * 500, n, 0) * math.exp(noise * rng.standard_normal())
            obs.add("prefill_engine", t, 1.0, [(b, b * 500, n, 0, n * (n + 1) / 2, 1, 0)])
    for k in range(outliers):                   # delivery lag: 5x too slow
        obs.add("decode_live", 5 * hand_step_s(1 + k, 300, 0, 0), 1.0, [(1 + k, 300, 0, 0, 0.0, 0, 0)])
    return obs


def test_exact_observations_recover_the_coefficients():
    res = fit(synthetic_obs(), BASE, TINY)
    for k in FITTED:
        assert res.params[k] == pytest.approx(TRUE[k], rel=0.01), (k, res.params)
    assert res.at_bound == []
    assert np.abs(res.groups.rel_err).max() < 0.01
    assert res.hw.roofline_exponent is None and res.hw.layer_overhead_s == 0.0


def test_noisy_observations_with_outliers_stay_close():
    """10 % log-normal noise and 5 gross outliers (robust loss): every coefficient within 15 %, the
    intercept within 10 %."""
    res = fit(synthetic_obs(noise=0.10, outliers=5, seed=3), BASE, TINY)
    for k in FITTED:
        assert res.params[k] == pytest.approx(TRUE[k], rel=0.15), (k, res.params)
    assert res.params["step_overhead_s"] == pytest.approx(TRUE["step_overhead_s"], rel=0.10)


def test_a_multi_step_observation_is_the_mean_of_its_steps():
    """A per-request decode time is the mean over its steps: fitting only such groups (plus prefills)
    recovers the decode coefficients too."""
    obs = Observations()
    for b0 in range(1, 12):
        steps = [(b, b * 400 + 10 * j, 0, 0, 0.0, 0, 0) for j, b in enumerate(range(b0, b0 + 5))]
        t = float(np.mean([hand_step_s(s[0], s[1], 0, 0) for s in steps]))
        obs.add("decode_engine", t, 1.0, steps)
    for n in (64, 256, 1024, 1536, 1900):
        obs.add("prefill_engine", hand_step_s(0, 0, n, 0), 1.0, [(0, 0, n, 0, n * (n + 1) / 2, 1, 0)])
    res = fit(obs, BASE, TINY)
    for k in ("step_overhead_s", "decode_efficiency", "prefill_efficiency", "attention_efficiency"):
        assert res.params[k] == pytest.approx(TRUE[k], rel=0.03), (k, res.params)


def test_fit_refuses_without_prefill_observations():
    obs = Observations()
    obs.add("decode_live", 0.004, 1.0, [(1, 100, 0, 0, 0.0, 0, 0)])
    with pytest.raises(ValueError, match="prefill"):
        fit(obs, BASE, TINY)


def test_observations_from_hand_made_token_times():
    """Request A (prompt 100) alone: 10 tokens 10 ms apart; request B (prompt 50) after it: 5 tokens 20 ms
    apart, then a burst of 5 tokens 10 us apart. By hand: A gives 9 live decode steps of batch 1 with
    context 100 + j; B gives 4 (its 5th gap borders the burst), 5 gaps are dropped as the burst; both
    prefills ran alone with a live first token."""
    turns = pd.DataFrame({"conversation_id": ["a", "b"], "turn": [0, 0], "status": ["ok", "ok"],
                          "disaggregated": [False, False], "decode_instance": ["c0", "c0"],
                          "start_s": [0.0, 0.2], "prompt_tokens": [100, 50], "cached_tokens": [0, 0],
                          "output_tokens": [10, 10], "finish_s": [0.14, 0.35004]})
    ta = [0.05 + 0.01 * k for k in range(10)]
    tb = [0.25 + 0.02 * k for k in range(6)] + [0.35 + 1e-5 * k for k in range(1, 5)]
    tokens = pd.DataFrame({"conversation_id": ["a"] * 10 + ["b"] * 10, "turn": 0, "instance": "c0",
                           "token": list(range(10)) * 2, "t_s": ta + tb})
    obs, st = observations(turns, tokens, None, min_gap_s=1e-3)
    g, s = obs.frames()
    assert st["decode_gaps"] == 18 and st["decode_live"] == 13 and st["dropped_burst"] == 5
    assert st["dropped_mixed"] == 0 and st["prefill_client"] == 2
    live = s[s.group.isin(g.index[g.cls == "decode_live"])]
    assert (live.decode_seqs == 1).all()
    a_ctx = live.decode_ctx_tokens.to_numpy()[:9]
    assert a_ctx.tolist() == [100 + j for j in range(1, 10)]       # prompt + tokens already out at the gap's start
    assert g[g.cls == "decode_live"].time_s.to_numpy()[:9] == pytest.approx([0.01] * 9)
    pre = g[g.cls == "prefill_client"]
    assert pre.time_s.to_numpy() == pytest.approx([0.05, 0.05])
    assert s[s.group.isin(pre.index)].prefill_tokens.tolist() == [100, 50]


def test_engine_requests_take_single_finish_intervals():
    """Baseline (2 requests), then a snapshot after one more finished (3), then one after two more (5), listed
    out of order: only the 2 -> 3 interval
    is a request's own (its deltas, by hand)."""
    def snap(n, prompt, gen, pre, dec, q, comp, t):
        return {"instance": "c0", "t_end_s": t, "vllm:request_prompt_tokens": [prompt, n],
                "vllm:request_generation_tokens": [gen, n], "vllm:request_prefill_time_seconds": [pre, n],
                "vllm:request_decode_time_seconds": [dec, n], "vllm:request_queue_time_seconds": [q, n],
                "vllm:request_prefill_kv_computed_tokens": [comp, n]}
    sm = {"baseline": [snap(2, 64, 8, 0.1, 0.05, 0.0, 64, 0.0)],
          "per_finish": [snap(5, 64 + 500 + 300, 8 + 20 + 30, 0.5, 0.3, 0.02, 64 + 372 + 300, 2.0),
                         snap(3, 64 + 500, 8 + 20, 0.1 + 0.2, 0.05 + 0.1, 0.01, 64 + 372, 1.0)]}
    e = _engine_requests(sm)
    assert len(e) == 1
    r = e.iloc[0]
    assert (r.prompt, r.output, r.computed) == (500, 20, 372)
    assert r.prefill_s == pytest.approx(0.2) and r.decode_s == pytest.approx(0.1) and r.queue_s == pytest.approx(0.01)


def test_engine_requests_from_spans_are_matched_by_request_id():
    """server_metrics.json format 2: spans keyed by vLLM request id, each naming its turn. By hand: the two
    decode spans of completed turns with the turns' token counts are matched (the join is by id even where
    two turns have equal lengths, so no order or length rule decides); a P/D prefill span is not a decode
    row; a span whose output count differs from its turn's, and one of a failed turn, are left out."""
    from harness.tools.calibrate import match_engine_requests
    turns = pd.DataFrame({"conversation_id": ["a", "b", "c", "d"], "turn": [1, 0, 0, 0],
                          "status": ["ok", "ok", "ok", "failed"], "decode_instance": "c0",
                          "prompt_tokens": [200, 200, 64, 64], "cached_tokens": [128, 0, 0, 0],
                          "output_tokens": [8, 8, 4, 4], "finish_s": [3.0, 1.0, 2.0, 2.5]})

    def span(cid, turn, prompt, out, pre, dec, part="decode"):
        return {"instance": "c0", "conversation_id": cid, "turn": turn, "part": part, "prompt_tokens": prompt,
                "output_tokens": out, "prefill_s": pre, "decode_s": dec, "queue_s": 0.001, "ttft_s": pre + 0.01,
                "e2e_s": pre + dec + 0.02, "end_unix_s": 1.7e9}
    sm = {"format": 2, "engine_times": "spans", "instances": {}, "baseline": [],
          "spans": {"cmpl-hx-a-1-0": span("a", 1, 200, 8, 0.30, 0.70),
                    "cmpl-hx-b-0-0": span("b", 0, 200, 8, 0.50, 0.90),
                    "cmpl-hx-a-1p-0": span("a", 1, 200, 1, 0.40, 0.0, part="prefill"),
                    "cmpl-hx-c-0-0": span("c", 0, 64, 5, 0.1, 0.2),            # 5 != the turn's 4
                    "cmpl-hx-d-0-0": span("d", 0, 64, 4, 0.1, 0.2)}}           # failed turn
    e = _engine_requests(sm)
    assert len(e) == 4 and (e.computed == -1).all()                       # the prefill span is no decode row
    m = match_engine_requests(turns, e).sort_values("conversation_id")
    assert m[["conversation_id", "turn"]].values.tolist() == [["a", 1], ["b", 0]]
    assert m.prefill_s.tolist() == pytest.approx([0.30, 0.50]) and m.decode_s.tolist() == pytest.approx([0.70, 0.90])
    assert m.ttft_s.tolist() == pytest.approx([0.31, 0.51])
    # observations(): the matched spans become one prefill_engine and one decode_engine observation each,
    # at the span's times (decode per step: decode_s / (output - 1))
    tokens = pd.DataFrame([{"conversation_id": c, "turn": t, "instance": "c0", "token": k, "t_s": f + 0.1 * (k - n + 1)}
                           for c, t, n, f in (("a", 1, 8, 3.0), ("b", 0, 8, 1.0), ("c", 0, 4, 2.0))
                           for k in range(n)])
    turns["start_s"] = turns.finish_s - 1.0
    obs, st = observations(turns, tokens, sm)
    g, _ = obs.frames()
    assert st["engine_requests"] == 4 and st["engine_matched"] == 2
    assert sorted(g[g.cls == "prefill_engine"].time_s) == pytest.approx([0.30, 0.50])
    assert sorted(g[g.cls == "decode_engine"].time_s) == pytest.approx([0.70 / 7, 0.90 / 7])


def test_profile_yaml_loads_as_a_hardware_profile(tmp_path):
    res = fit(synthetic_obs(), BASE, TINY)
    report = {"run_dir": str(tmp_path), "config_sha256_16": "0" * 16, "backend": "vllm", "model": "tiny",
              "workload": "w", "counts": {}, "rel_se": res.rel_se, "at_bound": [], "server": {},
              "residuals": res.residuals()}
    p = tmp_path / "cpu_fit.yaml"
    p.write_text(profile_yaml(res.hw, report, "cpu"))
    hw = load_profile(str(p))
    for k in FITTED:
        assert getattr(hw, k) == pytest.approx(TRUE[k], rel=0.01)
    assert hw.peak_flops == PEAK and hw.roofline_exponent is None


def test_fidelity_compare_errors_and_verdict():
    """err = sim / real - 1 per metric; the verdict checks |err| against the field's 10 % (E2E, TPOT) and 20 %
    (TTFT);
    a missing or zero real value gives no error (NaN), never a pass."""
    from harness.tools.fidelity import compare
    real = {"e2e_mean_s": 1.0, "tpot_mean_s": 0.010, "ttft_mean_s": 0.200, "preemptions": 0.0,
            "_kv": np.array([0.1, 0.2, 0.3]), "server_itl_mean_s": 0.008}
    sim = {"e2e_mean_s": 1.09, "tpot_mean_s": 0.0084, "ttft_mean_s": 0.26, "preemptions": 3.0,
           "_kv": np.array([0.1, 0.25, 0.2, 0.9]), "itl_mean_s": 0.010}
    c = compare(real, sim)
    m = c["metrics"]
    assert m["e2e_mean_s"]["err"] == pytest.approx(0.09) and m["tpot_mean_s"]["err"] == pytest.approx(-0.16)
    assert m["ttft_mean_s"]["err"] == pytest.approx(0.30) and math.isnan(m["preemptions"]["err"])
    assert m["server_itl_mean_s"]["err"] == pytest.approx(0.25)            # vLLM's mean ITL vs the sim's
    v = c["verdict"]
    assert v["e2e_mean_s"]["met"] and not v["tpot_mean_s"]["met"] and not v["ttft_mean_s"]["met"]
    assert not c["all_met"]
    # KV series on the common span: |0|, |0.05|, |0.1| -> mean 0.05, max 0.1
    kv = c["kv_series"]
    assert kv["mean_abs_diff"] == pytest.approx(0.05) and kv["max_abs_diff"] == pytest.approx(0.1)


def test_sim_tokens_parquet_matches_the_turns(tmp_path):
    """logger.steps on the simulator: one tokens.parquet row per generated token; a turn's first token is at
    its first_token_s and its last at its finish_s; times never decrease within a turn."""
    from omegaconf import OmegaConf

    from harness.run.config import resolve
    from harness.run.runner import execute
    from tests.conftest import compose_cfg
    dcfg = compose_cfg(["model=tiny", "cluster=cpu_1x", "scheduler=collocated", "slo=absolute",
                        "engine.block_size=128", "workload.num_conversations=4", "workload.max_turns=3",
                        "workload.token_scale=0.1", "logger.steps=true", "logger.progress=false"])
    execute(resolve(dcfg), tmp_path, OmegaConf.to_yaml(dcfg))
    t = pd.read_parquet(tmp_path / "turns.parquet")
    tok = pd.read_parquet(tmp_path / "tokens.parquet")
    assert len(tok) == int(t.output_tokens.sum())
    g = tok.sort_values("token").groupby(["conversation_id", "turn"]).t_s
    j = t.set_index(["conversation_id", "turn"])
    first, last = g.first(), g.last()
    assert np.allclose(first.to_numpy(), j.loc[first.index, "first_token_s"].to_numpy())
    assert np.allclose(last.to_numpy(), j.loc[last.index, "finish_s"].to_numpy())
    assert all((np.diff(x.to_numpy()) >= 0).all() for _, x in g)


# per-prefill terms of issue 20: an intercept per prefilling request and a cost per cached prefix token
TRUE_PRE = {"prefill_seq_overhead_s": 4.0e-3, "cached_prefix_token_s": 2.5e-6}


def hand_step_pre_s(b: int, ctx: int, n: int, p: int) -> float:
    """``hand_step_s`` plus the per-prefill terms, by hand: + intercept per prompt prefilled in the step
    + cost per cached prefix token it reuses (docs: harness/sim/perf.py, T_pre)."""
    return hand_step_s(b, ctx, n, p) + (TRUE_PRE["prefill_seq_overhead_s"] if n else 0.0) \
        + TRUE_PRE["cached_prefix_token_s"] * p


def prefix_obs(noise: float = 0.0, seed: int = 0, cached_fracs=(0.0, 0.3, 0.6, 0.9)) -> Observations:
    """Decode steps as in ``synthetic_obs``; prefills of prompts 128..1792 tokens at cached fractions
    ``cached_fracs`` (multi-turn prefix reuse), alone and beside a decode batch of 4."""
    rng = np.random.default_rng(seed)
    obs = Observations()
    for b in range(1, 17):
        for per_seq in (100, 600, 1200, 1800):
            t = hand_step_pre_s(b, b * per_seq, 0, 0) * math.exp(noise * rng.standard_normal())
            obs.add("decode_live", t, 1.0 / b, [(b, b * per_seq, 0, 0, 0.0, 0, 0)])
    for prompt in (128, 384, 768, 1280, 1792):
        for f in cached_fracs:
            p = int(prompt * f) // 16 * 16
            n = prompt - p
            for b in (0, 4):
                t = hand_step_pre_s(b, b * 500, n, p) * math.exp(noise * rng.standard_normal())
                obs.add("prefill_engine", t, 1.0, [(b, b * 500, n, p, n * p + n * (n + 1) / 2, 1, 0)])
    return obs


def test_prefill_intercept_and_cached_prefix_cost_recovered():
    res = fit(prefix_obs(), BASE, TINY)
    for k, v in {**TRUE, **TRUE_PRE}.items():
        assert res.params[k] == pytest.approx(v, rel=0.02), (k, res.params)
    assert res.at_bound == []
    assert "fitted by harness.tools.calibrate" in res.hw.prefill_terms_source
    res.hw.validate("hw")


def test_prefill_terms_recovered_from_noisy_steps_with_the_mean_loss():
    """2 % log-normal noise, plain least squares (the loss of the reported means): the intercept within 15 %;
    the cached-prefix cost only within 50 % -- it trades off against the attention pairs ``n * p`` and the KV
    bytes of the prefix (measured here: +35 % at seed 7), so a real calibration needs many prefills per
    cached fraction (conf/workload/calibration_prefix_cpu.yaml)."""
    res = fit(prefix_obs(noise=0.02, seed=7), BASE, TINY, loss="linear")
    assert res.params["prefill_seq_overhead_s"] == pytest.approx(TRUE_PRE["prefill_seq_overhead_s"], rel=0.15)
    assert res.params["cached_prefix_token_s"] == pytest.approx(TRUE_PRE["cached_prefix_token_s"], rel=0.5)
    r = res.residuals()
    assert abs(r["prefill_engine"]["mean_time"]) < 0.02


def test_prefill_terms_not_identified_without_prefix_reuse_say_so():
    """No cached prefix in the calibration prefills (as conf/workload/calibration_cpu): the cached-prefix
    cost is 0 and the profile says it was not fitted for want of data; the intercept is still fitted."""
    res = fit(prefix_obs(cached_fracs=(0.0,)), BASE, TINY)
    assert res.hw.cached_prefix_token_s == 0.0 and "cached_prefix_token_s" not in res.params
    assert "cached_prefix_token_s: not fitted: no data" in res.hw.prefill_terms_source
    assert "prefill_seq_overhead_s" in res.params
    with pytest.raises(ValueError, match="loss"):
        fit(prefix_obs(), BASE, TINY, loss="huber")


def test_a_nonzero_prefill_term_needs_its_source():
    import dataclasses
    hw = dataclasses.replace(BASE, prefill_seq_overhead_s=1e-3)
    with pytest.raises(ValueError, match="hw.prefill_terms_source"):
        hw.validate("hw")
    dataclasses.replace(hw, prefill_terms_source="fitted by hand").validate("hw")


def test_efficiencies_above_the_stated_peaks_raise_the_peak_instead():
    """The formula steps (prefill / attention / decode efficiency 0.27 / 0.12 / 0.17 of PEAK) fitted against a
    base stating a peak of PEAK / 9: relative to it the efficiencies are 2.43 / 1.08 / 1.53. Capped at 1 the
    fit sits on the bound; with max_efficiency=4 it reaches them, and the written profile has peak_flops
    raised by the largest, 2.43 (to 0.27 PEAK), the efficiencies divided by it (prefill 1.0, decode
    0.17 / 0.27), the same step times, and validates."""
    import dataclasses
    obs = prefix_obs()
    low = dataclasses.replace(BASE, peak_flops=PEAK / 9.0)
    capped = fit(obs, low, TINY)
    assert {"prefill_efficiency", "decode_efficiency", "attention_efficiency"} & set(capped.at_bound)
    free = fit(obs, low, TINY, max_efficiency=4.0)
    assert free.params["decode_efficiency"] == pytest.approx(0.17 * 9, rel=0.02)
    assert free.params["prefill_efficiency"] == pytest.approx(0.27 * 9, rel=0.02)
    assert free.hw.peak_flops == pytest.approx(0.27 * PEAK, rel=0.02)
    assert free.hw.prefill_efficiency == pytest.approx(1.0)
    assert free.hw.decode_efficiency == pytest.approx(0.17 / 0.27, rel=0.02)
    free.hw.validate("hw")
    assert np.abs(free.groups.rel_err).max() < 0.01
