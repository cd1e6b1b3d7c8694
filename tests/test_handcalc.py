"""One conversation on an idle simulated cluster: TTFT, TPOT and KV-transfer time computed by hand.

Everything expected here is written out from the step-time formulas (harness/sim/perf.py docstring,
docs/calibration.md) and the constants of conf/hardware/a40.yaml restated below (NVIDIA A40: 149.7
TFLOP/s FP16 dense, 696 GB/s; fitted efficiencies from Vidur's A40 profiles; Qwen3-0.6B config.json;
PCIe 4.0 x16 31.5 GB/s), not taken from the simulator.
"""

from __future__ import annotations


import pandas as pd
import pytest

from harness.run.config import scheduler_config
from harness.run.session import session_input, simulate
from harness.workload.workload import WorkloadConfig, build_workload
from tests.conftest import compose_run, conversation

# --- datasheet / config constants, restated (conf/hardware/a40.yaml) -------------------------------
PEAK = 149.7e12                 # A40 dense FP16 tensor FLOP/s
BW_W = 696e9 * 0.772            # A40 bytes/s x memory_efficiency (weight streaming)
BW_KV = 696e9 * 0.915           # A40 bytes/s x kv_memory_efficiency (paged attention)
EFF_LIN = 0.69                  # prefill_efficiency = decode_efficiency (GEMM MFU)
EFF_ATT = 0.444                 # attention_efficiency (prefill attention MFU)
K = 1.48                        # roofline_exponent
LAYER = 2.77e-5                 # layer_overhead_s
SEQ = 1.97e-6 * 8 / 32         # attention_seq_overhead_s x KV heads / 32 (per layer)
TOK = 2.63e-7 * 16 * 128 / 4096 # attention_token_overhead_s x query width / 4096 (per layer)
OVH = 0.001                     # step_overhead_s
MPF = 0.80                      # memory_power_frac (docs/calibration.md "Power")
L, H, KVH, D, HID, INTER, V = 28, 16, 8, 128, 1024, 3072, 151936   # Qwen3-0.6B
KVB = 2 * L * KVH * D * 2       # = 114,688 bytes/token (docs/hardware.md)
LIN = L * (HID * H * D + 2 * HID * KVH * D + H * D * HID + 3 * HID * INTER)  # matmul params
WEIGHT_BYTES = (LIN + V * HID) * 2                                            # tied embeddings
LINK_BW, LINK_LAT = 31.5e9, 1e-5


def linear(flops: float) -> float:
    """The linear layers' time (s): soft roofline (c^K + m^K)^(1/K) of their FLOPs and the weights."""
    c, m = flops / (PEAK * EFF_LIN), WEIGHT_BYTES / BW_W
    return (c ** K + m ** K) ** (1 / K)


def prefill_step(n: int, prefix: int) -> float:
    """One prefill chunk of n tokens after a cached prefix, alone in the batch (s)."""
    lin = linear(2 * LIN * n + 2 * HID * V)                     # GEMMs on n tokens + LM head on 1 row
    attn = 4 * L * H * D * (n * prefix + n * (n + 1) / 2) / (PEAK * EFF_ATT)
    kv = (prefix + n) * KVB / BW_KV                             # prefix read + new KV written
    return lin + attn + kv + L * TOK * n + L * LAYER + OVH


def decode_step(ctx: int) -> float:
    """One decode step of a single sequence whose KV holds ctx tokens (s)."""
    lin = linear(2 * LIN + 2 * HID * V)
    kv = (ctx + 1) * KVB / BW_KV
    return lin + kv + L * SEQ + L * LAYER + OVH


def transfer(tokens: int) -> float:
    return LINK_LAT + tokens * KVB / LINK_BW


def test_constants_match_papers_md():
    assert KVB == 114_688
    assert abs(WEIGHT_BYTES / 1e9 - 1.19) < 0.01     # "~1.19 GB of weights"


# turn 0: 1000 new tokens, 10 out, 5 s tool; turn 1 reuses all 1010 context tokens + 200 new, 20 out
CONV = conversation("c0", [(0, 1000, 10, 5.0), (1010, 200, 20, 0.0)])


def run_one(scheduler: str, overrides=(), **sched):
    run = compose_run([f"scheduler={scheduler}", "cluster=a40_1p3d", *overrides])
    convs, stats = build_workload([CONV], WorkloadConfig(arrival="fixed"))
    cfg = scheduler_config(scheduler, {"name": scheduler, **sched})
    res = simulate(session_input(run), convs, stats, scheduler, cfg)
    assert not res.error
    return pd.DataFrame(res.turns).set_index("turn")


@pytest.mark.parametrize("coalesce", [0.25, 0.0])
def test_conserve_single_conversation_by_hand(coalesce):
    t = run_one("conserve", [f"backend.max_coalesce_s={coalesce}"])
    # turn 0: prefill on the prefiller, KV of 1000 tokens moved once, first token from the decoder
    p0 = prefill_step(1000, 0)
    x0 = transfer(1000)
    ttft0 = p0 + x0 + decode_step(1000)
    assert t.loc[0, "prefill_instance"] == "prefiller0" and t.loc[0, "decode_instance"] == "decoder0"
    assert t.loc[0, "transfer_tokens"] == 1000
    assert t.loc[0, "transfer_s"] == pytest.approx(x0, rel=1e-9)
    assert t.loc[0, "ttft_s"] == pytest.approx(ttft0, rel=1e-9)
    # decode tokens 2..10: the context grows by one token per step from 1001
    tpot0 = sum(decode_step(1000 + j) for j in range(1, 10)) / 9
    assert t.loc[0, "tpot_s"] == pytest.approx(tpot0, rel=1e-9)
    # ITL on the decoder: its first token is its first decode step; the 9 later gaps are decode steps at
    # contexts 1001..1009, in whatever runs the coalescing made of them
    assert t.loc[0, "itl_max_s"] == pytest.approx(decode_step(1009), rel=1e-9)
    assert t.loc[0, "itl_p50_s"] == pytest.approx(decode_step(1005), rel=1e-9)
    # turn 1: pinned, local append-prefill; the decoder cached floor(1010/16) = 63 blocks = 1008 tokens
    assert t.loc[1, "prefill_instance"] == "decoder0" and t.loc[1, "transfer_tokens"] == 0
    assert t.loc[1, "cached_tokens"] == 1008
    assert t.loc[1, "ttft_s"] == pytest.approx(prefill_step(1210 - 1008, 1008), rel=1e-9)
    tpot1 = sum(decode_step(1210 + j) for j in range(0, 19)) / 19
    assert t.loc[1, "tpot_s"] == pytest.approx(tpot1, rel=1e-9)
    # closed loop: turn 1 is submitted exactly when turn 0 finished + 5 s of tool time
    assert t.loc[1, "submit_s"] == pytest.approx(t.loc[0, "finish_s"] + 5.0, rel=1e-12)


def test_collocated_single_conversation_by_hand():
    t = run_one("collocated")
    assert t.loc[0, "ttft_s"] == pytest.approx(prefill_step(1000, 0), rel=1e-9)
    # collocated: the prefill step samples token 1, so decode steps 2..10 see contexts 1000..1008
    assert t.loc[0, "tpot_s"] == pytest.approx(sum(decode_step(1000 + j) for j in range(9)) / 9, rel=1e-9)
    # ITL: tokens 2..10 come one decode step apart, with contexts 1000..1008 (increasing step times), so
    # the 9 gaps sorted are decode_step(1000..1008): p50 is the 5th, p99 interpolates the 8th and 9th at
    # rank 8 x 0.99 = 7.92, the max is the last
    gaps = [decode_step(1000 + j) for j in range(9)]
    assert t.loc[0, "itl_p50_s"] == pytest.approx(gaps[4], rel=1e-9)
    assert t.loc[0, "itl_p99_s"] == pytest.approx(gaps[7] + 0.92 * (gaps[8] - gaps[7]), rel=1e-9)
    assert t.loc[0, "itl_max_s"] == pytest.approx(gaps[8], rel=1e-9)
    # KV after turn 0 = 1000 + 9 computed tokens -> 63 full blocks cached
    assert t.loc[1, "cached_tokens"] == 1008
    assert t.loc[1, "ttft_s"] == pytest.approx(prefill_step(202, 1008), rel=1e-9)


def test_disaggregated_pulls_only_missing_blocks():
    t = run_one("disaggregated", decoder_choice="sticky")
    # turn 1: the prefiller cached floor(1000/16) = 62 blocks of turn 0's prompt -> computes 218 tokens;
    # the decoder holds 63 blocks (1008 tokens) -> only 1210 - 1008 = 202 tokens of KV move
    assert t.loc[1, "cached_tokens"] == 992
    assert t.loc[1, "transfer_tokens"] == 202
    ttft1 = prefill_step(218, 992) + transfer(202) + decode_step(1210)
    assert t.loc[1, "ttft_s"] == pytest.approx(ttft1, rel=1e-9)


def test_power_cap_slows_prefill_not_decode():
    """200 W cap: a compute-bound prefill is throttled by ((cap-idle)/(demand-idle))^(1/3); decode is not."""
    t = run_one("collocated", ["cluster=a40_4x", "hardware.a40.power_cap_w=200"])
    lin_c = (2 * LIN * 1000 + 2 * HID * V) / (PEAK * EFF_LIN)          # FLOP times
    attn_c = 4 * L * H * D * (1000 * 1001 / 2) / (PEAK * EFF_ATT)
    lin_m, kv_m = WEIGHT_BYTES / BW_W, 1000 * KVB / BW_KV              # byte times
    fixed = L * TOK * 1000 + L * LAYER + OVH

    def step(c_lin: float, c_attn: float) -> float:
        return (c_lin ** K + lin_m ** K) ** (1 / K) + c_attn + kv_m + fixed

    s = step(lin_c, attn_c)
    demand = 270 * min(s, lin_c + attn_c + MPF * (lin_m + kv_m)) / s   # dynamic W (tdp 300 - idle 30)
    assert demand > 170                                                  # above the cap's 200 - 30 W
    f = ((200 - 30) / demand) ** (1 / 3)
    assert t.loc[0, "ttft_s"] == pytest.approx(step(lin_c / f, attn_c / f), rel=1e-9)
    # decode: 30 + 270 * (comp_s + MPF * mem_s) / step_s < 200 W -> unthrottled
    assert t.loc[0, "tpot_s"] == pytest.approx(sum(decode_step(1000 + j) for j in range(9)) / 9, rel=1e-9)


def test_fluid_coefficients_by_hand():
    """WAIT's tau = d0 + d1 * KV tokens on an A40 x Qwen3-0.6B: weights at the weight-streaming
    efficiency + fixed overheads, KV at the KV-cache efficiency."""
    from harness.sim.perf import PerfModel
    run = compose_run(["cluster=a40_1p3d"])
    d0, d1 = PerfModel(run.cfg.hardware["a40"], run.cfg.model).decode_linear_coefficients()
    assert d0 == pytest.approx(WEIGHT_BYTES / BW_W + L * LAYER + OVH, rel=1e-12)
    assert d1 == pytest.approx(KVB / BW_KV, rel=1e-12)
