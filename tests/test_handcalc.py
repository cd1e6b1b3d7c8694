"""One conversation on an idle simulated cluster: TTFT, TPOT and KV-transfer time computed by hand.

Everything expected here is written out from the roofline formulas (harness/sim/perf.py docstring) and
the datasheet constants (NVIDIA A40: 149.7 TFLOP/s FP16 dense, 696 GB/s; Qwen3-0.6B config.json;
PCIe 4.0 x16 31.5 GB/s), not taken from the simulator.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from harness.config import scheduler_config
from harness.session import simulate
from harness.workload import WorkloadConfig, build_workload
from tests.conftest import compose_run, conversation

# --- datasheet / config constants, restated -------------------------------------------------------
PEAK = 149.7e12                 # A40 dense FP16 tensor FLOP/s
BW = 696e9 * 0.8                # A40 bytes/s x memory efficiency (conf/hardware/a40.yaml)
EFF_P, EFF_D = 0.32, 0.08       # prefill / decode MFU (conf/hardware/a40.yaml)
OVH = 0.001                     # step overhead, s
L, H, KVH, D, HID, INTER, V = 28, 16, 8, 128, 1024, 3072, 151936   # Qwen3-0.6B
KVB = 2 * L * KVH * D * 2       # = 114,688 bytes/token (docs/hardware.md)
LIN = L * (HID * H * D + 2 * HID * KVH * D + H * D * HID + 3 * HID * INTER)  # matmul params
WEIGHT_BYTES = (LIN + V * HID) * 2                                            # tied embeddings
LINK_BW, LINK_LAT = 31.5e9, 1e-5


def prefill_step(n: int, prefix: int) -> float:
    """One prefill chunk of n tokens after a cached prefix, alone in the batch (s)."""
    flops = 2 * LIN * n + 4 * L * H * D * (n * prefix + n * (n + 1) / 2) + 2 * HID * V
    mem = WEIGHT_BYTES + (prefix + n) * KVB
    return max(flops / (PEAK * EFF_P), mem / BW) + OVH


def decode_step(ctx: int) -> float:
    """One decode step of a single sequence whose KV holds ctx tokens (s)."""
    flops = 2 * LIN + 2 * HID * V + 4 * L * H * D * ctx
    mem = WEIGHT_BYTES + (ctx + 1) * KVB
    return max(flops / (PEAK * EFF_D), mem / BW) + OVH


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
    res = simulate(run, convs, stats, scheduler, cfg)
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
    flops = 2 * LIN * 1000 + 4 * L * H * D * (1000 * 1001 / 2) + 2 * HID * V
    comp, mem = flops / (PEAK * EFF_P), (WEIGHT_BYTES + 1000 * KVB) / BW
    step = max(comp, mem) + OVH
    demand = 270 * min(step, comp + 0.55 * mem) / step          # dynamic W (tdp 300 - idle 30)
    f = ((200 - 30) / demand) ** (1 / 3)
    assert t.loc[0, "ttft_s"] == pytest.approx(max(comp / f, mem) + OVH, rel=1e-9)
    # decode: 30 + 270 * (0.55 * mem_s + comp_s) / step_s < 200 W -> unthrottled
    assert t.loc[0, "tpot_s"] == pytest.approx(sum(decode_step(1000 + j) for j in range(9)) / 9, rel=1e-9)
