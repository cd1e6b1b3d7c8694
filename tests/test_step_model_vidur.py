"""engine.step_model=vidur_profile (harness.sim.perf.VidurProfilePerfModel) against Vidur's own predictions
and against a step composed by hand from the shipped profile rows (docs/data/SOURCE.md, docs/simulator.md).

The reference table ``tests/data/vidur_step_predictions.csv`` is Vidur's execution-time predictor
(microsoft/vidur@7d47513, random forests; ``scripts/vidur_reference_predictions.py``) trained on the same
shipped rows and asked for 15 batch compositions (run with Vidur's own code in a separate environment,
forests seeded with ``--forest-seed 0``: Vidur's own are unseeded, and against the earlier unseeded table
this one moves WAIT-CP's 508-token mixed step by 2.4 %, the pooled KV-write value there resting on one
decode row). Our model interpolates where Vidur's forests step; the largest gaps are the 128-sequence
decode at KV 1,300 (-1.9 %) and the 512-token chunk after 2,048 cached tokens with 8 decodes (+1.9 %).
Every composition is within 5 %.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.core.profiles import EngineConfig, HardwareConfig, ModelConfig
from harness.sim.perf import PerfModel, VidurProfilePerfModel, make_step_model

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests" / "data" / "vidur_step_predictions.csv"


def _load(cls, path: Path):
    raw = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if k != "defaults"}
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), raw))


@pytest.fixture(scope="module")
def a100():
    hw = _load(HardwareConfig, ROOT / "conf" / "hardware" / "a100.yaml")
    hw.name = "a100"
    return hw


@pytest.fixture(scope="module")
def llama3():
    return _load(ModelConfig, ROOT / "conf" / "model" / "llama3_8b.yaml")


def _chunks(s: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in (x.split("@") for x in s.split(";") if x)]


def _decode(s: str) -> list[int]:
    out: list[int] = []
    for g in (x for x in s.split(";") if x):
        n, kv = g.split("x")
        out += [int(kv)] * int(n)
    return out


def test_matches_vidur_predictor_within_5_percent(a100, llama3):
    perf = VidurProfilePerfModel(a100, llama3)
    rows = list(csv.DictReader(open(TABLE, newline="")))
    kinds = {r["kind"] for r in rows}
    assert len(rows) >= 10 and {"decode-only", "prefill-only", "mixed", "chunked-long-prefix"} <= kinds
    worst = 0.0
    for r in rows:
        ours_ms = perf.step_time_s(_chunks(r["prefill_chunks"]), _decode(r["decode"])) * 1e3
        rel = ours_ms / float(r["vidur_ms"]) - 1.0
        assert abs(rel) <= 0.05, f"{r['name']}: ours {ours_ms:.3f} ms vs Vidur {r['vidur_ms']} ms ({rel:+.1%})"
        worst = max(worst, abs(rel))
    assert worst > 0.0   # not a copy of the table


def _rows(name: str) -> list[dict]:
    return list(csv.DictReader(open(ROOT / "docs" / "data" / name, newline="")))


def test_decode_step_by_hand_from_the_profile_rows(a100, llama3):
    """32 decode sequences of 530 KV tokens: Vidur's mean KV 530 rounds up to 576 (granularity 64); the
    step has 32 tokens (a multiple of 8). Per layer: the nine linear/elementwise operators at 32 tokens +
    attn_kv_cache_save at 32 tokens (mean of every attention row with max(chunk, batch) = 32) +
    attn_decode(32, 576) x 1.1 (GQA batching overhead, batch > 1); x 32 layers."""
    ops = ("attn_pre_proj", "attn_post_proj", "attn_rope", "input_layernorm", "post_attention_layernorm",
           "mlp_up_proj", "mlp_down_proj", "mlp_act", "add")
    lin = [sum(float(r[o]) for o in ops) for r in _rows("vidur_llama3_8b_a100_mlp_ms.csv") if r["num_tokens"] == "32"]
    attn = _rows("vidur_llama3_8b_a100_attention_ms.csv")
    save = [float(r["attn_kv_cache_save_ms"]) for r in attn
            if max(int(r["batch_size"]), int(r["prefill_chunk_size"])) == 32]
    dec = [float(r["attn_decode_ms"]) for r in attn
           if r["prefill_chunk_size"] == "0" and r["batch_size"] == "32" and r["kv_cache_size"] == "576"]
    assert len(lin) == 1 and len(dec) == 1 and save
    layer_ms = lin[0] + sum(save) / len(save) + dec[0] * 1.1
    want_s = 32 * layer_ms * 1e-3
    perf = VidurProfilePerfModel(a100, llama3)
    assert perf.step_time_s([], [530] * 32) == pytest.approx(want_s, rel=1e-12)
    # a decode run: step j has mean KV 530 + j (576 until 576, then 640: interpolated towards 1344)
    ends, energy = perf.decode_run(32, 32 * 530, 3, math.inf)
    assert ends[0] == pytest.approx(want_s, rel=1e-12) and len(ends) == 3 and energy[2] > energy[0] > 0


def test_prefill_chunks_aggregate_as_vidur(a100, llama3):
    """Two prefill chunks of 256 after KV 0 and 256 (rounded up to 64: 256): Vidur prices prefill attention
    once, at KV 0 + 256 and chunk round(sqrt(256**2 + 256**2)) = 362, x 1.1 (more than one chunk)."""
    perf = VidurProfilePerfModel(a100, llama3)
    p = perf.profile
    attn = p.prefill_ms(256, 362) * 1.1
    want = 32 * (p.linear_ms(512) + p.kv_save_ms(512) + attn) * 1e-3
    assert perf.step_time_s([(256, 256), (256, 0)], []) == pytest.approx(want, rel=1e-12)
    # prefill_ms at a profiled (chunk, KV) is the profiled median
    assert p.prefill_ms(512, 512) == pytest.approx(0.086)      # attention.csv: chunk 512, KV 512
    assert p.prefill_ms(0, 256) == pytest.approx(0.022)        # chunk 256, KV 0


def test_per_request_kv_write_follows_the_longest_chunk(a100, llama3):
    """engine.step_model=vidur_profile_per_request (the FlashInfer generation Vidur profiled: one thread block
    per request): WAIT-CP's mixed step (chunks 256 after 256 and 228 after 0, 24 decodes at KV 540) differs from
    vidur_profile only in the KV write: 32 layers x (mean of the prefill rows at chunk 256 - Vidur's pooled
    value at 508 tokens, interpolated between the pooled means at 504 and 512), both read from the CSV here."""
    attn = _rows("vidur_llama3_8b_a100_attention_ms.csv")
    req256 = [float(r["attn_kv_cache_save_ms"]) for r in attn if r["prefill_chunk_size"] == "256"]

    def pooled(n):
        v = [float(r["attn_kv_cache_save_ms"]) for r in attn
             if max(int(r["batch_size"]), int(r["prefill_chunk_size"])) == n]
        return sum(v) / len(v)
    assert len(req256) == 60
    pooled508 = pooled(504) + (pooled(512) - pooled(504)) * 4 / 8
    pooled_m = VidurProfilePerfModel(a100, llama3)
    per_req = make_step_model(a100, llama3, "vidur_profile_per_request")
    chunks, dec = [(256, 256), (228, 0)], [540] * 24
    want = 32 * (sum(req256) / len(req256) - pooled508) * 1e-3
    assert per_req.step_time_s(chunks, dec) - pooled_m.step_time_s(chunks, dec) == pytest.approx(want, rel=1e-9)


def test_per_request_kv_write_has_no_512_token_cliff(a100, llama3):
    """The pooled model prices a 512-token chunk with the prefill rows' KV write and a 504-token one with the
    single decode row at batch 504 (a cliff of 32 x (pooled(512) - pooled(504)) ms a step); per request, one
    chunk of c tokens is the prefill rows' mean at c, linear between chunk sizes 256 and 512, so 504 tokens
    cost 32 x (r256 + (r512 - r256) x 248/256) ms, and 2 chunks of 256 cost one chunk's r256 (in parallel)."""
    attn = _rows("vidur_llama3_8b_a100_attention_ms.csv")

    def req(c):
        v = [float(r["attn_kv_cache_save_ms"]) for r in attn if r["prefill_chunk_size"] == str(c)]
        return sum(v) / len(v)
    per_req = make_step_model(a100, llama3, "vidur_profile_per_request")
    p = per_req.profile
    assert per_req._kv_write_ms(512, 512, 0) == pytest.approx(req(512), rel=1e-12)
    assert per_req._kv_write_ms(504, 504, 0) == pytest.approx(req(256) + (req(512) - req(256)) * 248 / 256, rel=1e-12)
    assert per_req._kv_write_ms(512, 256, 0) == pytest.approx(req(256), rel=1e-12)
    # pooled: the cliff between 504 and 512 tokens is most of a 512-token chunk's write
    assert p.kv_save_ms(512) - p.kv_save_ms(504) > 0.5 * req(512)
    # decode-only: the decode rows at that batch size (0.005 ms at 512 sequences in the profile)
    dec512 = [float(r["attn_kv_cache_save_ms"]) for r in attn
              if r["prefill_chunk_size"] == "0" and r["batch_size"] == "512"]
    assert per_req._kv_write_ms(512, 0, 512) == pytest.approx(sum(dec512) / len(dec512), rel=1e-12)


def test_step_cost_energy_is_the_rooflines_power(a100, llama3):
    perf = VidurProfilePerfModel(a100, llama3)
    roof = PerfModel(a100, llama3)
    c = perf.step(512, 512 * 513 / 2, 0, 1, 0, 0)
    r = roof.step(512, 512 * 513 / 2, 0, 1, 0, 0)
    assert c.energy_j / c.time_s == pytest.approx(r.energy_j / r.time_s, rel=1e-12)
    assert c.time_s == pytest.approx(perf.step_time_s([(512, 0)], []), rel=1e-12)


def test_bad_input_names_the_key(a100, llama3):
    with pytest.raises(ValueError, match=r"^engine\.step_model must be one of"):
        EngineConfig(step_model="vidurr").validate("engine")
    with pytest.raises(ValueError, match=r"^engine\.step_model must be one of"):
        make_step_model(a100, llama3, "vidurr")
    a40 = dataclasses.replace(a100, name="a40")
    with pytest.raises(ValueError, match=r"^engine\.step_model=vidur_profile: no Vidur profile for model"):
        make_step_model(a40, llama3, "vidur_profile")
    small = dataclasses.replace(llama3, name="other", intermediate_size=11008)
    with pytest.raises(ValueError, match=r"^engine\.step_model=vidur_profile: no Vidur profile for model 'other'"):
        make_step_model(a100, small, "vidur_profile")
    assert type(make_step_model(a100, llama3)) is PerfModel


def test_run_with_vidur_profile_first_prompt_ttft():
    """A simulated run (Figure B's workload, Sarathi-like arm, Llama-3-8B on one A100): the first prompt
    arrives to an idle engine, so its TTFT is one prefill step of 512 tokens under the profiled model."""
    from tests.conftest import compose_run
    import harness.run.session as session
    from harness.workload.workload import build_workload
    run = compose_run(["+experiment=wait_paper", "+experiment/arm=wait_sarathi_llama3",
                       "+experiment/wait_point=wait_single_r22", "workload.num_conversations=40",
                       "engine.step_model=vidur_profile"])
    convs, stats = build_workload([], run.cfg.workload)
    res = session.simulate(session.session_input(run), convs, stats, run.scheduler_name, run.scheduler)
    assert not res.error
    first = min(res.turns, key=lambda t: t["submit_s"])
    hw, = {id(h): h for _, _, h in run.instances}.values()
    want = VidurProfilePerfModel(hw, run.cfg.model).step_time_s([(512, 0)], [])
    assert first["first_token_s"] - first["submit_s"] == pytest.approx(want, rel=1e-9)


def test_router_hints_are_the_configured_step_models_prices():
    """Under ``engine.step_model=vidur_profile`` the hints a policy reads (its ``PolicyContext``, as the session
    builds it) are that model's own prices, each from the model's step function at the hint's defining inputs:
    prefill throughput = 2048 tokens over a step of one 2048-token chunk after no prefix; the idle decode step =
    a step of one decode sequence at a 1024-token context; WAIT's line ``d0 + d1 * KV`` through one sequence's
    decode steps at 1024 and 8192 tokens; ``d2`` the slope of a no-prefix prefill step from 1024 to 2048 tokens.
    The roofline prices the same 2048-token chunk over 10 % faster, so a roofline hint would fail here."""
    from tests.conftest import compose_run
    import harness.run.session as session
    run = compose_run(["+experiment=wait_paper", "+experiment/arm=wait_sarathi_llama3",
                       "+experiment/wait_point=wait_single_r22", "engine.step_model=vidur_profile"])
    h = session.policy_context(session.session_input(run), None, None, [1]).hints[0]
    hw, = {id(x): x for _, _, x in run.instances}.values()
    vidur = VidurProfilePerfModel(hw, run.cfg.model)
    pre, pre_half = vidur.step_time_s([(2048, 0)], []), vidur.step_time_s([(1024, 0)], [])
    dec, dec_long = vidur.step_time_s([], [1024]), vidur.step_time_s([], [8192])
    assert h.prefill_tokens_per_s == pytest.approx(2048 / pre, rel=1e-12)
    assert h.decode_step_s == pytest.approx(dec, rel=1e-12)
    d1 = (dec_long - dec) / (8192 - 1024)
    assert h.fluid_d1_s_per_token == pytest.approx(d1, rel=1e-9)
    assert h.fluid_d0_s == pytest.approx(dec - d1 * 1024, rel=1e-9)
    assert h.fluid_d2_s_per_token == pytest.approx((pre - pre_half) / 1024, rel=1e-9)
    roof = PerfModel(hw, run.cfg.model).step(2048, 2048 * 2049 / 2, 0, 1, 0, 0, 1, 0, 0).time_s
    assert roof < 0.9 * pre


def test_vllm_backend_rejects_the_profiled_step_model():
    from harness.run.config import ConfigError
    from tests.conftest import compose_run
    with pytest.raises(ConfigError, match=r"engine\.step_model"):
        compose_run(["backend=vllm", "model=tiny", "slo=absolute", "cluster=cpu_1x", "engine.block_size=128",
                     "engine.step_model=vidur_profile"])
