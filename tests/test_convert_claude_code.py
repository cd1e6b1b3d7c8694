"""The Claude Code converter (harness.workload.claude_code) against an independent reading of the raw JSON.

The counts (sessions, calls, user messages, end_turn responses, sub-agents and their calls, tokens in and out)
are recounted here from the raw session files with plain ``json`` and loops, and compared with the
converter's report and with the shipped trace; the infinite-cache leading-prefix hit ratio is computed by
brute force (every earlier call of the session, pairwise common prefix of ``hash_ids``) on three files.
Tests that read ``../shared`` skip where it is absent; the shipped-trace checks run everywhere.
"""

from __future__ import annotations

import gzip
import json

import pytest

from harness.core.paths import PROJECT_ROOT
from harness.core.trace import load_trace
from harness.workload.claude_code import convert_session, convert_sessions, main

RAW = PROJECT_ROOT.parent / "shared" / "data" / "claude-code-traces" / "traces"
SHIPPED = PROJECT_ROOT / "traces" / "claude_code" / "kv_cache_tester_sessions.jsonl.gz"
needs_raw = pytest.mark.skipif(not RAW.is_dir(), reason="../shared/data/claude-code-traces absent")

# plain session, two with sub-agents (three spawned at one point in 0254 and in 0010), one with unrecorded
# stops, one with background (async_launched) sub-agents
FILES = ["trace_0001", "trace_0010", "trace_0043", "trace_0254", "trace_0295"]


def raw(name):
    with gzip.open(RAW / f"{name}.json.gz", "rt") as f:
        return json.load(f)


def count_by_hand(d):
    """Counts from the raw JSON: the parent's calls are the requests that are not sub-agents; a user
    message is a call whose input_types hold 'text' and not 'tool_result' (or the first call); a
    sub-agent is kept when a parent call comes before and after it."""
    reqs = d["requests"]
    calls = [r for r in reqs if r["type"] != "subagent"]
    msgs = 0
    for i, r in enumerate(calls):
        if i == 0 or ("text" in r["input_types"] and "tool_result" not in r["input_types"]):
            msgs += 1
    subs = []
    for i, r in enumerate(reqs):
        if r["type"] == "subagent":
            before = any(q["type"] != "subagent" for q in reqs[:i])
            after = any(q["type"] != "subagent" for q in reqs[i + 1:])
            if before and after:
                subs.append(r)
    sub_calls = [q for s in subs for q in s["requests"]]
    every = calls + sub_calls
    return {"calls": len(calls), "user_messages": msgs, "end_turn": sum(r["stop"] == "end_turn" for r in calls),
            "subagents": len(subs), "subagent_calls": len(sub_calls),
            "tokens_in": sum(r["in"] for r in every), "tokens_out": sum(r["out"] for r in every)}


def ideal_by_hand(d):
    """Infinite cache, brute force: per call, 64 x the longest common leading run of its hash_ids with any
    earlier call of the session (parent and sub-agents in file order); over the sum of input tokens."""
    seq = []
    for r in d["requests"]:
        if r["type"] == "subagent":
            seq.extend(r["requests"])
        else:
            seq.append(r)
    hit = 0
    for i, r in enumerate(seq):
        best = 0
        for q in seq[:i]:
            n = 0
            for x, y in zip(q["hash_ids"], r["hash_ids"]):
                if x != y:
                    break
                n += 1
            best = max(best, n)
        hit += 64 * best
    return hit, sum(r["in"] for r in seq)


@needs_raw
@pytest.mark.parametrize("name", FILES)
def test_counts_equal_an_independent_reading(name):
    d = raw(name)
    want = count_by_hand(d)
    convs, rep = convert_session(d, name)
    for k, v in want.items():
        assert getattr(rep, k) == v, k
    assert rep.sessions == 1 and len(convs) == 1 + want["subagents"]
    # the records carry the same calls and tokens (a recorded out = 0 is replayed as 1 token)
    assert sum(len(c.turns) for c in convs) == want["calls"] + want["subagent_calls"]
    assert sum(t.prompt_tokens for c in convs for t in c.turns) == want["tokens_in"]
    assert sum(t.output_tokens for c in convs for t in c.turns) == want["tokens_out"] + rep.out_zero
    assert sum(t.user_message for t in convs[0].turns) == want["user_messages"]


@needs_raw
def test_sub_agents_spawn_after_the_parent_call_before_them():
    d = raw("trace_0254")
    convs, rep = convert_session(d, "s")
    reqs = d["requests"]
    spawn = []
    for i, r in enumerate(reqs):
        if r["type"] == "subagent":
            spawn.append(sum(q["type"] != "subagent" for q in reqs[:i]) - 1)
    assert [c.spawn_after_turn for c in convs[1:]] == spawn
    assert all(c.parent_id == "s" and c.join for c in convs[1:])       # status completed: joined
    # 0295's async_launched sub-agents are not joined
    convs, _ = convert_session(raw("trace_0295"), "t")
    status = [r["status"] for r in raw("trace_0295")["requests"] if r["type"] == "subagent"]
    assert [c.join for c in convs[1:]] == [s == "completed" for s in status]


@needs_raw
@pytest.mark.parametrize("name", ["trace_0001", "trace_0010", "trace_0043"])
def test_ideal_prefix_hit_ratio_by_hand(name):
    d = raw(name)
    hit, total = ideal_by_hand(d)
    _, rep = convert_session(d, name)
    assert rep.ideal_hit_tokens == hit
    assert rep.tokens_in == total
    # the replayed reuse (previous call of the same conversation) never exceeds the ideal
    assert rep.reused_tokens <= hit


@needs_raw
def test_the_shipped_trace_holds_the_same_sessions():
    shipped = {c.conversation_id: c for c in load_trace(SHIPPED)}
    for name in FILES:
        d = raw(name)
        want = count_by_hand(d)
        fam = [c for cid, c in shipped.items() if cid == name or c.parent_id == name]
        assert len(fam) == 1 + want["subagents"]
        assert sum(len(c.turns) for c in fam) == want["calls"] + want["subagent_calls"]
        assert sum(t.prompt_tokens for c in fam for t in c.turns) == want["tokens_in"]


def test_shipped_trace_loads_with_its_families():
    convs = load_trace(SHIPPED)
    roots = [c for c in convs if c.parent_id is None]
    assert len(roots) == 710
    ids = {c.conversation_id for c in convs}
    assert all(c.parent_id in ids for c in convs if c.parent_id is not None)
    assert all(t.send_s is not None and t.model for c in convs for t in c.turns)


def test_bad_input_exits_2(tmp_path, capsys):
    f = tmp_path / "trace_x.json"
    f.write_text(json.dumps({"block_size": 64, "requests": [{"t": 0, "type": "n", "in": 10, "out": 1,
                                                              "hash_ids": [1, 2, 3]}]}))
    assert main([str(f), "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "hash_ids: 3 blocks of 64 tokens exceed in=10" in capsys.readouterr().err
    f.write_text(json.dumps({"block_size": 16, "requests": []}))
    assert main([str(f), "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "block_size must be 64" in capsys.readouterr().err
    assert main([str(tmp_path / "missing"), "-o", str(tmp_path / "o.jsonl")]) == 2


def test_hand_made_session(tmp_path):
    """Two user messages; a sub-agent after call 0 joined before call 1; a pair; think times by hand."""
    ids = list(range(1, 11))
    d = {"block_size": 64, "requests": [
        {"t": 0.0, "type": "n", "model": "m1", "in": 640, "out": 5, "hash_ids": ids, "input_types": ["text"],
         "stop": "tool_use", "api_time": 2.0, "think_time": 0.0},
        {"t": 3.0, "type": "subagent", "status": "completed", "duration_ms": 1000, "agent_id": "a",
         "requests": [{"t": 0.0, "type": "n", "model": "h", "in": 100, "out": 7, "hash_ids": [99],
                       "input_types": ["text"], "stop": "end_turn", "api_time": 0.5, "think_time": 0.0}]},
        {"t": 7.0, "type": "n", "model": "m1", "in": 700, "out": 9, "hash_ids": ids, "input_types": ["tool_result"],
         "stop": "end_turn", "api_time": 1.0, "think_time": 5.0},
        {"t": 20.0, "type": "s", "model": "m2", "in": 800, "out": 3, "hash_ids": ids + [11, 12],
         "input_types": ["text"], "stop": "", "think_time": 12.0},
        {"t": 21.0, "type": "n", "model": "m2", "in": 800, "out": 4, "hash_ids": ids + [11, 12],
         "input_types": ["text"], "stop": "end_turn", "api_time": 1.0, "think_time": 50.0},
    ]}
    convs, rep = convert_session(d, "s")
    root, child = convs
    assert [t.user_message for t in root.turns] == [True, False, True, True]
    assert rep.user_messages == 3 and rep.pairs == 1
    # reuse: 64 x common leading blocks with the previous call, capped at in - 1
    assert [t.reused_tokens for t in root.turns] == [0, 640, 640, 768]
    # think: after the join, the gap after the sub-agent's recorded end (t=3): 7 - 3 = 4 s, not think_time 5;
    # call 3 by its think_time (12 s = 20 - 7 - 1); call 4's recorded 50 s exceeds the recorded gap since
    # call 3 (t 21 - 20 - api_time none = 1 s): the gap is used
    assert [t.tool_time_s for t in root.turns] == [4.0, 12.0, 1.0, 0.0]
    assert rep.think_clamped == 1 and rep.think_missing == 0
    assert [t.send_s for t in root.turns] == [0.0, 7.0, 20.0, 21.0]
    assert child.turns[0].send_s == 2.0 and child.spawn_after_turn == 0 and child.join
    assert [t.model for t in root.turns] == ["m1", "m1", "m2", "m2"]
    # visible: call 1 (end_turn); call 2 (no stop, but the next is a user message: its loop's end); call 3
    assert [t.visible for t in root.turns] == [False, True, True, True]
    _, rep2 = convert_session(d, "s", unrecorded_stop="unknown")
    assert rep2.unrecorded_end == 0 and rep.unrecorded_end == 1
    convs3, rep3 = convert_session(d, "s", pairs="first")
    assert len(convs3[0].turns) == 3 and rep3.pairs_dropped == 1
    f = tmp_path / "s.json"
    f.write_text(json.dumps(d))
    out = tmp_path / "o.jsonl.gz"
    assert main([str(f), "-o", str(out), "--quiet"]) == 0
    assert load_trace(out) == convs                  # the session id is the file's name without .json


def test_max_sessions_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="--max-sessions must be >= 1"):
        convert_sessions([tmp_path], max_sessions=0)
