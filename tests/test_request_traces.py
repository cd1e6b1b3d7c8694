"""Request traces (Mooncake / Dynamo / AIPerf ``hash_ids`` JSONL): importer, open-loop arrivals, trace
statistics and prefix sharing in the simulator. Expected values are derived by hand in the comments."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest

from harness.run.config import scheduler_config
from harness.run.session import session_input, simulate
from harness.core.trace import TraceError, load_trace
from harness.tools.tracestats import ideal_hit_ratio, main as stats_main
from harness.workload.workload import WorkloadConfig, build_workload
from tests.conftest import SHARED, compose_run, conversation


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- the 5-line trace -------------------------------------------------------------------------------
# hash blocks of 16 tokens = one KV block of 16 tokens each.
FIVE = [
    {"timestamp": 0, "input_length": 48, "output_length": 8, "hash_ids": [1, 2, 3]},
    {"timestamp": 1000, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 4]},
    {"timestamp": 2000, "input_length": 48, "output_length": 1, "hash_ids": [1, 2, 3]},
    {"timestamp": 3000, "input_length": 20, "output_length": 1, "hash_ids": [5, 6]},
    {"timestamp": 4000, "input_length": 50, "output_length": 1, "hash_ids": [1, 2, 3, 7]},
]
# Infinite cache, one request at a time, hit <= prompt - 1 tokens, whole blocks:
#  1: nothing cached -> 0
#  2: ids 1, 2 cached, then 4 (after 1, 2) is new -> 2 blocks = 32
#  3: ids 1, 2, 3 cached, but at most (48 - 1) // 16 = 2 blocks -> 32
#  4: 5 is new -> 0
#  5: 1, 2, 3 cached, (50 - 1) // 16 = 3 -> 48
# hit ratio = (0 + 32 + 32 + 0 + 48) / (48 + 40 + 48 + 20 + 50) = 112 / 206.
# LRU cache of 4 blocks (64 tokens): request 1 needs ceil(56/16) = 4 blocks (3 hashed: ids 1, 2, 3; the
# partial 4th is unhashed) -> after it: 1 free, LRU queue [3, 2, 1] (tail first). Request 2 (3 blocks)
# touches 1, 2, takes the free block; released: free 1, queue [3, 2, 1]. Request 3 (4 blocks) touches
# 1, 2, needs 2 more: the free one and the LRU block 3 (evicted), re-hashes block 3; released: free 1,
# queue [3, 2, 1]. Request 4 (2 blocks): the free one + evicts 3; hashes 5; queue [2, 1, 5]. Request 5:
# 1, 2 cached, 3 is gone -> 32. Ratio (0 + 32 + 32 + 0 + 32) / 206 = 96 / 206.


def test_ideal_hit_ratio_of_a_five_line_trace(tmp_path):
    recs = load_trace(write_jsonl(tmp_path / "five.jsonl", FIVE), hash_block_tokens=16)
    assert ideal_hit_ratio(recs, 16) == (112 / 206, 0)
    assert ideal_hit_ratio(recs, 16, cache_tokens=64) == (96 / 206, 0)
    # a cache of 3 blocks (48 tokens) cannot hold requests 1 (ceil(56/16) = 4 blocks), 3 (ceil(49/16) = 4)
    # or 5 (ceil(51/16) = 4): misses, not cached. Request 2 (3 blocks) finds nothing; request 4 neither.
    assert ideal_hit_ratio(recs, 16, cache_tokens=48) == (0.0, 3)


def test_stats_cli(tmp_path, capsys):
    path = write_jsonl(tmp_path / "five.jsonl", FIVE)
    assert stats_main(["stats", str(path), "--cache-tokens", "64", "--block-size", "16",
                       "--hash-block-tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert "requests: 5" in out and "sessions: 5" in out
    assert "duration: 4.0 s" in out and "rate: 1.250 requests/s" in out       # 5 requests over 4 s
    assert f"infinite cache (block 16): {112 / 206:.4f}" in out                  # 0.5437
    assert f"(4 blocks): {96 / 206:.4f}" in out                                  # 0.4660
    assert "p50 48" in out                                                       # inputs 20 40 48 48 50
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"timestamp": 0, "input_length": 0, "output_length": 1}])
    assert stats_main(["stats", str(bad)]) == 2
    assert "bad.jsonl:1: input_length must be an int >= 1" in capsys.readouterr().err


def test_stats_cli_on_the_shipped_conversation_trace(capsys):
    assert stats_main(["stats", "traces/swebench_verified_mini_gemini3pro.jsonl.gz"]) == 0
    out = capsys.readouterr().out
    # traces/README.md: 20,163 calls in 500 conversations; reused 290,663,238 of 297,028,215 prompt
    # tokens (97.9%); with 16-token blocks the ideal hit is a little lower (block-aligned)
    assert "requests: 20,163" in out and "sessions: 500" in out and "n/a (no timestamps" in out
    line = [x for x in out.splitlines() if "infinite cache" in x][0]
    assert 0.97 < float(line.rsplit(" ", 1)[1]) <= 290_663_238 / 297_028_215


# ---- importer -------------------------------------------------------------------------------------
def test_request_trace_importer(tmp_path):
    rows = [{"timestamp": 500, "input_length": 600, "output_length": 7, "hash_ids": [3, 4]},
            {"session_id": "s1", "timestamp": 100, "input_length": 30, "output_length": 5, "hash_ids": [9]},
            {"session_id": "s1", "delay": 2500, "input_length": 20, "output_length": 3, "hash_ids": [10]},
            {"session_id": "s1", "delay": 0, "input_length": 10, "output_length": 2, "hash_ids": [11]}]
    recs = load_trace(write_jsonl(tmp_path / "t.jsonl", rows))
    assert [r.conversation_id for r in recs] == ["req000000", "s1"]
    a, s = recs
    assert a.arrival_s == 0.5 and a.hash_block_tokens == 512 and len(a.turns) == 1
    t = a.turns[0]
    assert (t.new_input_tokens, t.reused_tokens, t.output_tokens, t.visible, t.hash_ids) == (600, 0, 7, True, (3, 4))
    # the session: history (prompt + output) reused, delay (ms) after the previous turn = its tool time
    assert s.arrival_s == 0.1
    assert [(t.reused_tokens, t.new_input_tokens, t.tool_time_s) for t in s.turns] == \
        [(0, 30, 2.5), (35, 20, 0.0), (58, 10, 0.0)]
    assert all(t.visible for t in s.turns)


@pytest.mark.parametrize("row, msg", [
    ({"timestamp": 0, "input_length": 600, "output_length": 7, "hash_ids": [3]},
     "hash_ids has 1 blocks of 512 tokens, fewer than input_length=600"),
    ({"timestamp": 0, "input_length": 6, "output_length": 0}, "output_length must be an int >= 1"),
    ({"timestamp": -1, "input_length": 6, "output_length": 1}, "timestamp must be a finite number >= 0"),
    ({"timestamp": 0, "input_length": 6, "output_length": 1, "text": "x"}, "unsupported key(s) 'text'"),
    ({"timestamp": 0, "input_length": 6, "output_length": 1, "delay": 5}, "delay is only allowed on a session's later rows"),
    ({"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [1.5]}, "hash_ids must be a list of ints"),
])
def test_request_trace_errors_name_file_line_and_field(tmp_path, row, msg):
    path = write_jsonl(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 1, "output_length": 1}, row])
    with pytest.raises(TraceError, match=rf"t\.jsonl:2: .*{msg[:30].replace('(', '.').replace(')', '.')}"):
        load_trace(path)


def test_mixed_timestamps_rejected(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 1, "output_length": 1},
                                              {"input_length": 1, "output_length": 1}])
    with pytest.raises(TraceError, match=r"t\.jsonl:2: timestamp: some conversations"):
        load_trace(path)


def test_shipped_mooncake_trace():
    recs = load_trace("traces/mooncake/conversation_trace.jsonl.gz")
    assert len(recs) == 12_031                                         # traces/mooncake/SOURCE.md
    assert sum(t.prompt_tokens for r in recs for t in r.turns) / 12_031 == pytest.approx(12_035, abs=1)
    first = recs[0]                                                    # line 1 of the file
    assert (first.arrival_s, first.turns[0].new_input_tokens, first.turns[0].output_tokens) == (0.0, 6758, 500)
    assert first.turns[0].hash_ids == tuple(range(14))
    raw = SHARED / "data" / "mooncake" / "conversation_trace.jsonl"
    if raw.is_file():                                                  # the shipped copy is unchanged
        with gzip.open("traces/mooncake/conversation_trace.jsonl.gz", "rb") as f:
            assert f.read() == raw.read_bytes()


# ---- open-loop arrivals -----------------------------------------------------------------------------
def test_trace_arrivals_window_and_time_scale(tmp_path):
    rows = [{"timestamp": ts, "input_length": 10, "output_length": 1} for ts in (4000, 0, 1000, 2500, 9000)]
    recs = load_trace(write_jsonl(tmp_path / "t.jsonl", rows))
    cfg = WorkloadConfig(arrival="trace", sample="first", time_scale=2.0, window_start_s=1.0, window_duration_s=3.5)
    convs, stats = build_workload(recs, cfg)
    # window [1.0, 4.5) s of trace time holds 1.0, 2.5, 4.0 (rows 3, 4, 1); shifted by -1.0 s, halved
    assert [c.conversation_id for _, c in convs] == ["req000002", "req000003", "req000000"]
    assert [t for t, _ in convs] == [0.0, 0.75, 1.5]
    assert stats.rate_per_s == pytest.approx(2 / 1.5)                   # 3 arrivals over 1.5 s
    convs, _ = build_workload(recs, WorkloadConfig(arrival="trace", sample="first", num_conversations=2))
    assert [(t, c.conversation_id) for t, c in convs] == [(0.0, "req000001"), (1.0, "req000002")]


@pytest.mark.parametrize("kw, msg", [
    (dict(arrival="trace", sample="shuffle"), "workload.sample must be 'first' with workload.arrival=trace"),
    (dict(arrival="trace", sample="first", time_scale=0.0), "workload.time_scale must be a finite number > 0"),
    (dict(arrival="poisson", window_start_s=5.0), "apply only to workload.arrival=trace"),
    (dict(arrival="trace", sample="first", window_start_s=100.0), "no conversation arrives in that window"),
    (dict(shared_prefix_tokens=-1), "workload.shared_prefix_tokens must be an int >= 0"),
])
def test_trace_arrival_errors(tmp_path, kw, msg):
    recs = load_trace(write_jsonl(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 10, "output_length": 1}]))
    with pytest.raises(ValueError, match=msg.replace("(", r"\(")):
        build_workload(recs, WorkloadConfig(**kw))


def test_trace_arrivals_need_timestamps():
    with pytest.raises(ValueError, match="workload.arrival=trace needs timestamps"):
        build_workload([conversation("c", [(0, 10, 1, 0.0)])], WorkloadConfig(arrival="trace", sample="first"))


# ---- the simulator ----------------------------------------------------------------------------------
def _sim(recs, overrides=(), shared_prefix=0, arrival="trace"):
    run = compose_run(["cluster=a100_1x", "scheduler=collocated", "slo=absolute",
                       f"workload.shared_prefix_tokens={shared_prefix}", *overrides])
    wcfg = WorkloadConfig(arrival=arrival, sample="first", shared_prefix_tokens=shared_prefix,
                          **({} if arrival == "trace" else {"rate_per_s": 0.01}))
    convs, stats = build_workload(recs, wcfg)
    res = simulate(session_input(run), convs, stats, "collocated", scheduler_config("collocated", {"name": "collocated"}))
    assert not res.error
    return {(r["conversation_id"], r["turn"]): r for r in res.turns}


def test_sim_hits_three_requests_sharing_0_1_2_leading_blocks(tmp_path):
    # 512-token hash blocks on 16-token engine blocks (32 engine blocks per id), 10 s apart (each runs
    # alone). B shares ids 1, 2 with A -> 1024 tokens hit; C shares id 1 -> 512; D none -> 0.
    rows = [{"timestamp": 10_000 * i, "input_length": 1536, "output_length": 10, "hash_ids": ids}
            for i, ids in enumerate([[1, 2, 3], [1, 2, 9], [1, 7, 8], [4, 5, 6]])]
    turns = _sim(load_trace(write_jsonl(tmp_path / "t.jsonl", rows)))
    assert [turns[(f"req{i:06d}", 0)]["cached_tokens"] for i in range(4)] == [0, 1024, 512, 0]


def test_sim_shared_system_prompt_across_conversations():
    # two SWE-bench-like conversations with a common 1000-token system prompt: conversation b's first
    # turn hits floor(1000 / 16) = 62 blocks = 992 tokens of it (both arrive at t = 0 and are admitted
    # in the same step: vLLM hashes the first one's blocks when it schedules them). Turn 1 reuses the
    # turn-0 KV: prompt + output - 1 tokens (the last sampled token is never fed back), in whole blocks:
    # a: floor(1209 / 16) * 16 = 1200, b: floor(1519 / 16) * 16 = 1504. Without the shared prefix: 0.
    a = conversation("a", [(0, 1200, 10, 1.0), (1210, 100, 5, 0.0)])
    b = conversation("b", [(0, 1500, 20, 1.0), (1520, 50, 5, 0.0)])
    for shared, hit0 in ((1000, 992), (0, 0)):
        turns = _sim([a, b], shared_prefix=shared, arrival="fixed")
        first = min(("a", "b"), key=lambda c: turns[(c, 0)]["start_s"])
        other = "b" if first == "a" else "a"
        assert turns[(first, 0)]["cached_tokens"] == 0
        assert turns[(other, 0)]["cached_tokens"] == hit0
        assert turns[("b", 1)]["cached_tokens"] == 1504 and turns[("a", 1)]["cached_tokens"] == 1200


def test_sim_mooncake_hits_match_trace_stats():
    # the first 400 requests of the shipped Mooncake trace on one A100 (Qwen3-0.6B): a single KV cache
    # serving them in arrival order at low load, so the simulated hit fraction equals the ideal one
    # computed by harness.tools.tracestats for the same cache size within 1 point (concurrency: requests in
    # flight hold blocks the ideal replay would have free)
    recs = load_trace("traces/mooncake/conversation_trace.jsonl.gz")[:400]
    run = compose_run(["cluster=a100_1x", "scheduler=collocated", "slo=absolute"])
    convs, stats = build_workload(recs, WorkloadConfig(arrival="trace", sample="first"))
    res = simulate(session_input(run), convs, stats, "collocated", scheduler_config("collocated", {"name": "collocated"}))
    assert not res.error
    from harness.sim.backend import SimBackend
    cap = SimBackend(run.instances, run.cfg.model, run.cfg.engine, run.cfg.cluster.link).infos[0].kv_capacity_tokens
    sim = sum(r["cached_tokens"] for r in res.turns) / sum(r["prompt_tokens"] for r in res.turns)
    ideal, _ = ideal_hit_ratio(recs, 16, cap)
    assert abs(sim - ideal) < 0.01, (sim, ideal, cap)
    assert not math.isclose(ideal, ideal_hit_ratio(recs, 16)[0])  # the cache size matters here
    assert np.isfinite(sim)


# ---- the real-vLLM client's prompts -----------------------------------------------------------------
def _blocks(ids, bs):
    """vLLM-style chained block hashes of the full blocks of a token-id list."""
    out, parent = [], None
    for j in range(len(ids) // bs):
        parent = hash((parent, tuple(ids[j * bs:(j + 1) * bs])))
        out.append(parent)
    return out


def test_context_book_follows_hash_ids(tmp_path):
    from harness.vllm.backend import ContextBook
    rows = [{"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [1, 2, 3]},
            {"timestamp": 1, "input_length": 48, "output_length": 2, "hash_ids": [1, 2, 9]},
            {"timestamp": 2, "input_length": 20, "output_length": 2, "hash_ids": [7, 2]},
            {"session_id": "s", "timestamp": 3, "input_length": 16, "output_length": 2, "hash_ids": [1]},
            {"session_id": "s", "delay": 0, "input_length": 16, "output_length": 2, "hash_ids": [1]}]
    recs = load_trace(write_jsonl(tmp_path / "t.jsonl", rows), hash_block_tokens=16)
    book = ContextBook(1000, seed=3, records=recs)
    a = book.prompt("req000000", 0, 0, 40)
    b = book.prompt("req000001", 0, 0, 48)
    c = book.prompt("req000002", 0, 0, 20)
    assert len(a) == 40 and len(b) == 48 and len(c) == 20
    assert a[:32] == b[:32] and a[32:40] != b[32:40]         # ids 1, 2 shared; 3 vs 9 differ
    assert c[16:20] != a[16:20]                              # id 2 after 7 is not id 2 after 1 (chained)
    s0 = book.prompt("s", 0, 0, 16)
    assert s0 == a[:16]                                      # a session's first turn shares id 1
    book.extend("s", [5, 6])
    s1 = book.prompt("s", 1, 18, 16)
    assert s1[:18] == s0 + [5, 6] and s1[18:] != a[:16]      # later turn: history + private blocks
    # same book, same chain -> the same ids again (a repeat of request 0)
    assert ContextBook(1000, seed=3, records=recs).prompt("req000000", 0, 0, 40) == a


def test_context_book_blocks_give_the_simulators_hits():
    # the first 300 Mooncake requests, scaled by 1/32 (512-token hash blocks -> 16 ids): hashing the
    # token ids the client sends, block by block as vLLM does, gives the same ideal hits (infinite cache)
    # as the simulator's content model
    from harness.vllm.backend import ContextBook
    from harness.workload.workload import scale_tokens
    recs = [scale_tokens(r, 1 / 32) for r in load_trace("traces/mooncake/conversation_trace.jsonl.gz")[:300]]
    assert recs[0].hash_block_tokens == 16
    book = ContextBook(50_000, seed=0, records=recs)
    seen: set = set()
    hits = prompts = 0
    for r in recs:
        t = r.turns[0]
        ids = book.prompt(r.conversation_id, 0, 0, t.new_input_tokens)
        blocks = _blocks(ids, 16)
        h = 0
        while h < min(len(blocks), (len(ids) - 1) // 16) and blocks[h] in seen:
            h += 1
        hits += 16 * h
        prompts += len(ids)
        seen.update(blocks)
    ideal, _ = ideal_hit_ratio(recs, 16)
    assert hits / prompts == ideal and ideal > 0.05   # (0.081: sharing is there to be found)


def test_context_book_shared_system_prompt():
    from harness.vllm.backend import ContextBook
    a = conversation("a", [(0, 300, 5, 1.0), (305, 10, 5, 0.0)])
    b = conversation("b", [(0, 200, 5, 0.0)])
    book = ContextBook(1000, seed=0, records=[a, b], shared_prefix_tokens=124)
    pa, pb = book.prompt("a", 0, 0, 300), book.prompt("b", 0, 0, 200)
    assert pa[:124] == pb[:124] and pa[124:200] != pb[124:200]
    assert ContextBook(1000, seed=0, records=[a, b]).prompt("a", 0, 0, 300)[:124] != pb[:124]


def test_write_trace_rejects_request_traces(tmp_path):
    from harness.core.trace import write_trace
    recs = load_trace(write_jsonl(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 1,
                                                          "hash_ids": [1]}]))
    with pytest.raises(TraceError, match=r"out\.jsonl:1: 'req000000' has hash_ids"):
        write_trace(tmp_path / "out.jsonl", recs)
