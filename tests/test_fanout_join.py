"""Fan-out and join in the closed loop (harness.core.controller), timing knobs (harness.workload.workload), and
TTFET per user message (harness.analysis.metrics.message_table), on hand-made session families.

A parent P of three calls spawns two children A and B after its call 0 (both joined); its call 1 must be
submitted only when both children have finished, plus its think time (tool_time_s after call 0 = 2 s). The
times are read back from turns.parquet and checked by hand: child turn 0 submitted at P's call-0 finish;
P's call 1 submitted at max(finish of A's and B's last calls) + 2 s; B (two calls, 0.5 s between) ends
later than A (one call), so the join waits for B. Runs on the simulator (backend=sim: the same controller
as real vLLM).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from harness.core.trace import ConversationRecord, TraceError, TurnRecord, load_trace, write_trace
from harness.run.runner import execute
from harness.workload.workload import WorkloadConfig, build_workload, cap_idle_gaps
from tests.conftest import compose_run

THINK = 2.0
BASE = ["scheduler=collocated", "cluster=a40_4x", "slo=absolute", "logger.progress=false", "workload.sample=first",
        "workload.arrival=fixed", "model=qwen3_0_6b"]


def turn(new, reused, out, tool, visible=False, um=False, send=None):
    return TurnRecord(new_input_tokens=new, reused_tokens=reused, output_tokens=out, tool_time_s=tool,
                      visible=visible, output_tokens_raw=out, user_message=um, send_s=send)


def family():
    """P (3 calls, a second user message at call 2), children A (1 call) and B (2 calls) after P's call 0."""
    p = ConversationRecord("P", (turn(500, 0, 20, THINK, um=True, send=0.0),
                                 turn(100, 520, 30, 5.0, visible=True, send=40.0),
                                 turn(50, 650, 10, 0.0, visible=True, um=True, send=100.0)), "t")
    a = ConversationRecord("P/A", (turn(300, 0, 40, 0.0, visible=True, send=1.0),), "t", parent_id="P",
                           spawn_after_turn=0)
    b = ConversationRecord("P/B", (turn(300, 0, 40, 0.5, send=1.0), turn(60, 340, 80, 0.0, visible=True, send=9.0)),
                           "t", parent_id="P", spawn_after_turn=0)
    return [p, a, b]


def _run(tmp_path, monkeypatch, overrides=(), recs=None):
    import harness.run.runner as runner
    monkeypatch.setattr(runner, "load_trace", lambda path: recs or family())
    s = execute(compose_run(BASE + list(overrides)), tmp_path)
    return (s, pd.read_parquet(tmp_path / "turns.parquet"), pd.read_parquet(tmp_path / "conversations.parquet"),
            pd.read_parquet(tmp_path / "messages.parquet"))


def row(turns, cid, k):
    r = turns[(turns.conversation_id == cid) & (turns.turn == k)]
    assert len(r) == 1, (cid, k)
    return r.iloc[0]


def test_parent_waits_for_both_children_plus_its_think_time(tmp_path, monkeypatch):
    s, turns, conv, msgs = _run(tmp_path, monkeypatch)
    assert not s["partial"] and s["num_conversations"] == 1          # the children are part of P's session
    p0, p1, p2 = (row(turns, "P", k) for k in range(3))
    a0, b0, b1 = row(turns, "P/A", 0), row(turns, "P/B", 0), row(turns, "P/B", 1)
    # spawn: both children's first calls become ready when P's call 0 has finished
    assert a0.submit_s == pytest.approx(p0.finish_s, abs=1e-9)
    assert b0.submit_s == pytest.approx(p0.finish_s, abs=1e-9)
    # B's own think time between its calls
    assert b1.submit_s == pytest.approx(b0.finish_s + 0.5, abs=1e-9)
    # join: P's call 1 waits for the later child (B) and then its think time; B ends after A here
    assert b1.finish_s > a0.finish_s
    assert p1.submit_s == pytest.approx(max(a0.finish_s, b1.finish_s) + THINK, abs=1e-9)
    # after the join the loop goes on as usual: call 2 after call 1's 5 s
    assert p2.submit_s == pytest.approx(p1.finish_s + 5.0, abs=1e-9)
    # children's rows carry their parent; the parent's the messages (call 2 starts message 1)
    assert list(turns[turns.conversation_id.str.startswith("P/")].parent_id.unique()) == ["P"]
    assert (turns[turns.conversation_id == "P"].parent_id == "").all()
    assert list(turns[turns.conversation_id == "P"].sort_values("turn").message) == [0, 0, 1]
    # TTFET per user message, by hand from the turn times
    assert list(msgs.message) == [0, 1]
    m0, m1 = msgs.iloc[0], msgs.iloc[1]
    assert m0.ttfet_first_s == pytest.approx(p0.first_token_s - p0.submit_s, abs=1e-9)
    assert m0.ttfet_visible_s == pytest.approx(p1.first_token_s - p0.submit_s, abs=1e-9)  # spans the join
    assert m1.ttfet_first_s == pytest.approx(p2.first_token_s - p2.submit_s, abs=1e-9)
    assert m1.ttfet_visible_s == pytest.approx(p2.first_token_s - p2.submit_s, abs=1e-9)
    assert s["num_user_messages"] == 2
    # the session aggregate: mean over P's two messages
    assert s["ttfet_session_visible_mean_s"] == pytest.approx((m0.ttfet_visible_s + m1.ttfet_visible_s) / 2)


def test_original_timing_sends_at_the_recorded_times_after_the_join(tmp_path, monkeypatch):
    s, turns, _, _ = _run(tmp_path, monkeypatch, ["workload.timing=original"])
    p0, p1, p2 = (row(turns, "P", k) for k in range(3))
    a0, b0, b1 = row(turns, "P/A", 0), row(turns, "P/B", 0), row(turns, "P/B", 1)
    t0 = p0.submit_s                                   # the session's start (its arrival)
    assert t0 == 0.0
    assert a0.submit_s == pytest.approx(max(p0.finish_s, 1.0), abs=1e-9)        # recorded start 1 s
    assert b1.submit_s == pytest.approx(max(b0.finish_s, 9.0), abs=1e-9)
    assert p1.submit_s == pytest.approx(max(a0.finish_s, b1.finish_s, 40.0), abs=1e-9)
    assert p2.submit_s == pytest.approx(max(p1.finish_s, 100.0), abs=1e-9)


def test_idle_gap_cap_by_hand():
    p, a, b = cap_idle_gaps(family(), 1.0)
    assert [t.tool_time_s for t in p.turns] == [1.0, 1.0, 0.0]
    # send times move earlier by the excess removed before them: P: 0, 40 - 1, 100 - 1 - 4
    assert [t.send_s for t in p.turns] == [0.0, 39.0, 95.0]
    # children inherit the parent's excess up to their spawn point (after call 0: 1 s) plus their own (0)
    assert [t.send_s for t in b.turns] == [0.0, 8.0]
    assert a.turns[0].send_s == 0.0


def test_families_are_sampled_as_one(tmp_path):
    extra = ConversationRecord("Q", (turn(10, 0, 5, 0.0, visible=True, send=0.0),), "t")
    recs = family() + [extra]
    cfg = WorkloadConfig(trace="x", sample="first", arrival="fixed", num_conversations=1)
    convs, _ = build_workload(recs, cfg)
    assert [r.conversation_id for _, r in convs] == ["P", "P/A", "P/B"]     # one session = its family
    cfg = WorkloadConfig(trace="x", sample="with_replacement", arrival="fixed", num_conversations=4, seed=3)
    convs, _ = build_workload(recs, cfg)
    ids = {r.conversation_id: r for _, r in convs}
    for cid, r in ids.items():
        if r.parent_id is not None:
            assert r.parent_id in ids and ids[r.parent_id].parent_id is None
    # a context limit that the child B's second call (340 + 60 + 80 = 480 tokens) exceeds drops the family
    cfg = WorkloadConfig(trace="x", sample="first", arrival="fixed", context_overflow="drop")
    convs, st = build_workload(recs, cfg, max_context_tokens=479)
    assert [r.conversation_id for _, r in convs] == ["Q"] and st.context_dropped == 1
    # truncate: P keeps what fits (calls 0-1: 620 + 30 = 650 tokens; call 2 needs 710); its children spawn
    # after call 0, before the new last call, and fit (B: 480 tokens), so they stay
    cfg = WorkloadConfig(trace="x", sample="first", arrival="fixed", context_overflow="truncate")
    convs, st = build_workload(recs, cfg, max_context_tokens=700)
    assert [(r.conversation_id, len(r.turns)) for _, r in convs] == [("P", 2), ("P/A", 1), ("P/B", 2), ("Q", 1)]
    assert st.context_truncated == 1


def test_session_trace_round_trip_and_bad_links(tmp_path):
    f = tmp_path / "s.jsonl"
    write_trace(f, family())
    back = load_trace(f)
    assert back == family()
    assert back[0].message_of() == (0, 0, 1)
    bad = [family()[1], family()[0]]                 # a child before its parent
    with pytest.raises(TraceError, match="parent_id 'P' is not a conversation before it"):
        write_trace(tmp_path / "b.jsonl", bad)
    p, a, _ = family()
    late = ConversationRecord("P/C", a.turns, "t", parent_id="P", spawn_after_turn=2)
    with pytest.raises(TraceError, match="spawn_after_turn 2 must be < the parent's last turn"):
        write_trace(tmp_path / "c.jsonl", [p, late])
    text = f.read_text().replace('"send_s":0.0', '"send_s":-1', 1)
    (tmp_path / "d.jsonl").write_text(text)
    with pytest.raises(TraceError, match=r"d.jsonl:1: turns\[0\].send_s must be a finite number >= 0"):
        load_trace(tmp_path / "d.jsonl")


def test_bad_timing_knobs_name_the_key():
    with pytest.raises(ValueError, match="workload.timing must be one of think, original"):
        WorkloadConfig(timing="replay").validate()
    with pytest.raises(ValueError, match="workload.max_idle_gap_s must be a finite number > 0"):
        WorkloadConfig(max_idle_gap_s=0).validate()
    assert math.isfinite(WorkloadConfig(max_idle_gap_s=10).max_idle_gap_s)


def test_the_claude_code_preset_prints_both_readings_per_user_message(tmp_path, capsys):
    """``+experiment=claude_code`` on the shipped trace (2 sessions, 2 at a time): messages.parquet has a row per
    user message of the replayed sessions, both readings, visible >= first (the loop's end_turn response is
    never before its first call's first token), and the printed table lists them."""
    from harness.core.trace import load_trace
    from harness.run.cli import message_lines
    run = compose_run(["+experiment=claude_code", "workload.num_conversations=2", "workload.concurrency=2"])
    s = execute(run, tmp_path)
    assert not s["partial"], s["error"]
    msgs = pd.read_parquet(tmp_path / "messages.parquet")
    turns = pd.read_parquet(tmp_path / "turns.parquet")
    recs = {r.conversation_id: r for r in load_trace(run.trace_path)}
    # one row per user message of each replayed root, counted from the (possibly truncated) replayed turns
    roots = turns[turns.parent_id == ""].conversation_id.unique()
    want = sum(sum(1 for k, t in enumerate(recs[c].turns[:int(turns[turns.conversation_id == c].turn.max()) + 1])
                   if k == 0 or t.user_message) for c in roots)
    assert len(msgs) == want == s["num_user_messages"] > 2
    ok = msgs.dropna()
    assert (ok.ttfet_visible_s >= ok.ttfet_first_s - 1e-9).all()
    text = message_lines(tmp_path / "messages.parquet", s)
    assert f"| {msgs.conversation_id.iloc[0]} | 0 |" in text and "visible p50" in text


def test_real_run_limit_covers_the_sub_agents():
    """harness.vllm.cluster.run_limit_s: P's span = max(its tool times 2 + 5 = 7 s, its last recorded send
    100 s) + its children's tool times (B: 0.5 s) + the margin; the children are no spans of their own."""
    from types import SimpleNamespace
    from harness.vllm.cluster import run_limit_s
    b = SimpleNamespace(max_run_s=None, max_run_margin_s=60.0)
    convs = [(3.0, r) for r in family()]
    assert run_limit_s(b, convs) == pytest.approx(3.0 + 100.0 + 0.5 + 60.0)
    assert run_limit_s(b, convs, max_active=1) == pytest.approx(3.0 + 100.0 + 0.5 + 60.0)
