"""Laws that hold for every scheduler variant: token and KV conservation, determinism, and that
coalescing identical decode steps does not change results."""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest

from harness.core.schedulers import registered
from harness.run.runner import execute
from harness.run.session import session_input, simulate
from harness.sim.engine import Engine
from harness.core.trace import load_trace
from harness.workload.workload import WorkloadConfig, build_workload, truncate_turns
from tests.conftest import NEEDS_PD, compose_run

# A small, memory-starved cluster so that eviction and preemption happen: 5 % of 48 GB minus 1.19 GB of
# weights and a 256 MiB reserve leaves ~8k tokens of KV per instance, against contexts of several thousand.
TIGHT = ["engine.gpu_memory_utilization=0.05", "engine.activation_reserve_bytes=268435456"]


def workload(run, n=12, rate=0.5, max_turns=12, seed=3, max_context=5000):
    """n real conversations (first max_turns turns) whose contexts stay under max_context tokens."""
    recs = [truncate_turns(r, max_turns) for r in load_trace(run.trace_path)]
    recs = [r for r in recs if max(t.prompt_tokens + t.output_tokens for t in r.turns) <= max_context]
    wcfg = WorkloadConfig(num_conversations=n, rate_per_s=rate, max_turns=max_turns, seed=seed)
    return build_workload(recs, wcfg)


def check_engine(e: Engine) -> None:
    # blocks private to running requests (shared cached blocks are counted once, in the pool's check)
    held = sum(r.kv.blocks - r.kv.hashed for r in e.running)
    assert 0 <= e.free <= e.capacity_blocks
    e.kv.check()                                     # the block pool's own bookkeeping
    assert e.used_blocks >= held                     # + LOADING and HELD requests' blocks
    assert e.free + e.cached_total + e.used_blocks == e.capacity_blocks
    assert e.used_blocks <= e.capacity_blocks       # KV used never exceeds capacity
    for r in e.running:                              # every running request has its tokens' blocks
        assert r.blocks * e.bs >= r.computed


@pytest.fixture
def checked_engines(monkeypatch):
    engines = []
    orig_end, orig_init = Engine._step_end, Engine.__init__

    def init(self, *a, **k):
        orig_init(self, *a, **k)
        engines.append(self)

    def end(self, version):
        orig_end(self, version)
        check_engine(self)

    monkeypatch.setattr(Engine, "__init__", init)
    monkeypatch.setattr(Engine, "_step_end", end)
    return engines


@pytest.mark.parametrize("scheduler", registered())
def test_conservation_policy_matrix(scheduler, checked_engines):
    cluster = "a40_1p3d" if scheduler in NEEDS_PD else "a40_4x"
    run = compose_run([f"scheduler={scheduler}", f"cluster={cluster}", *TIGHT])
    convs, stats = workload(run)
    res = simulate(session_input(run), convs, stats, scheduler, run.scheduler)
    assert not res.error
    t = pd.DataFrame(res.turns)
    # every turn of every conversation ran exactly once and produced exactly its requested tokens
    expected = {(r.conversation_id, k): tr.output_tokens for _, r in convs for k, tr in enumerate(r.turns)}
    assert len(t) == len(expected) and (t.status == "ok").all()
    got = {(c, k): o for c, k, o in zip(t.conversation_id, t.turn, t.output_tokens)}
    assert got == expected
    # engines sampled exactly those tokens, once each (+1 throwaway token per P/D prefill, max_tokens=1)
    sampled = sum(e.decode_tokens for e in checked_engines)
    assert sampled == sum(expected.values()) + int(t.disaggregated.sum())
    # the tight memory made the engines evict and preempt (so the laws above were exercised)
    assert t.cached_tokens.sum() < t.prompt_tokens.sum()
    # causality per turn
    assert (t.first_token_s >= t.submit_s).all() and (t.finish_s >= t.first_token_s).all()
    # closed loop: turn k+1 submitted at turn k's finish + tool time
    tool = {(r.conversation_id, k): tr.tool_time_s for _, r in convs for k, tr in enumerate(r.turns)}
    t = t.set_index(["conversation_id", "turn"]).sort_index()
    for (cid, k), row in t.iterrows():
        if k > 0:
            prev = t.loc[(cid, k - 1)]
            assert row.submit_s == pytest.approx(prev.finish_s + tool[(cid, k - 1)], abs=1e-9)


def test_preemption_happens_under_tight_memory(checked_engines):
    run = compose_run(["scheduler=collocated", "cluster=a40_4x", *TIGHT])
    convs, stats = workload(run, n=20, rate=2.0)
    res = simulate(session_input(run), convs, stats, "collocated", run.scheduler)
    assert not res.error and res.preemptions > 0


@pytest.mark.parametrize(("scheduler", "n", "mem", "ctx"), [
    ("conserve", 8, "0.05", 5000), ("collocated", 8, "0.05", 5000),
    ("disaggregated", 40, "0.1", 20000), ("ampd", 40, "0.1", 20000)])
def test_coalescing_does_not_change_results(scheduler, n, mem, ctx):
    """Coalesced decode runs give the step-by-step results, also under preemption (a step that preempts
    is not coalesced) and for policies reading KV usage mid-run (``Engine.used_blocks_now``)."""
    run = compose_run([f"scheduler={scheduler}", f"engine.gpu_memory_utilization={mem}",
                       "engine.activation_reserve_bytes=268435456"])
    convs, stats = workload(run, n=n, rate=1.0, max_turns=12, max_context=ctx)
    cfg = run.scheduler
    a = pd.DataFrame(simulate(session_input(run), convs, stats, scheduler, cfg, max_coalesce_s=0.25).turns)
    b = pd.DataFrame(simulate(session_input(run), convs, stats, scheduler, cfg, max_coalesce_s=0.0).turns)
    pd.testing.assert_frame_equal(a.sort_values(["conversation_id", "turn"]).reset_index(drop=True),
                                  b.sort_values(["conversation_id", "turn"]).reset_index(drop=True),
                                  rtol=1e-9, atol=1e-9)


def test_same_seed_same_bytes(tmp_path):
    overrides = ["workload.num_conversations=15", "workload.rate_per_s=0.2", "logger.progress=false"]
    digests = []
    for d in ("a", "b"):
        run = compose_run(overrides)
        execute(run, tmp_path / d)
        digests.append({f: hashlib.sha256((tmp_path / d / f).read_bytes()).hexdigest()
                        for f in ("turns.parquet", "conversations.parquet", "instances.parquet",
                                  "decisions.parquet")})
    assert digests[0] == digests[1]
    run = compose_run(overrides + ["workload.seed=1"])
    execute(run, tmp_path / "c")
    other = hashlib.sha256((tmp_path / "c" / "turns.parquet").read_bytes()).hexdigest()
    assert other != digests[0]["turns.parquet"]


def test_request_larger_than_kv_fails_cleanly():
    """A turn that can never fit is recorded as failed (its conversation too); the others finish."""
    run = compose_run(["scheduler=conserve", "engine.gpu_memory_utilization=0.035",
                       "engine.activation_reserve_bytes=268435456"])
    convs, stats = workload(run, n=6, max_turns=6, max_context=10**9)
    res = simulate(session_input(run), convs, stats, "conserve", run.scheduler)
    assert not res.error
    t = pd.DataFrame(res.turns)
    failed = t[t.status == "failed"]
    assert len(failed) > 0 and failed.error.str.contains("KV blocks").all()
    assert all(c.done for c in res.convs)
    assert {c.record.conversation_id for c in res.convs if c.failed} == set(failed.conversation_id)
