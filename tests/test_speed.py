"""Speed work that must not change results: array-evaluated decode runs, the on-disk unloaded-TTFET cache,
inline engine steps and the controller's incremental bookkeeping, each checked against the plain
step-by-step definition (no wall-clock assertions)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from harness.core.profiles import HardwareConfig, ModelConfig
from harness.sim.perf import PerfModel

ROOT = Path(__file__).resolve().parents[1]


def _load(cls, path: Path):
    raw = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if k != "defaults"}
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), raw))


@pytest.fixture(scope="module")
def a40() -> HardwareConfig:
    return _load(HardwareConfig, ROOT / "conf" / "hardware" / "a40.yaml")


@pytest.fixture(scope="module")
def llama() -> ModelConfig:
    return _load(ModelConfig, ROOT / "conf" / "model" / "llama2_7b.yaml")


def step_by_step(perf: PerfModel, b: int, ctx: int, max_steps: int, limit_s: float):
    """The definition: step j costs ``decode_step(b, ctx + j * b)``; cumulative sums one step at a time;
    stop after the step that reaches ``limit_s``."""
    ends, energy, t, e = [], [], 0.0, 0.0
    for j in range(max_steps):
        c = perf.decode_step(b, ctx + j * b)
        t += c.time_s
        e += c.energy_j
        ends.append(t)
        energy.append(e)
        if t >= limit_s:
            break
    return ends, energy


def assert_same_run(perf: PerfModel, b: int, ctx: int, max_steps: int, limit_s: float) -> int:
    ends, energy = perf.decode_run(b, ctx, max_steps, limit_s)
    ref_t, ref_e = step_by_step(perf, b, ctx, max_steps, limit_s)
    assert len(ends) == len(ref_t)
    # decode_step adds the same terms in another order (last-bit differences per step only)
    assert ends == pytest.approx(ref_t, rel=1e-12, abs=0)
    assert energy == pytest.approx(ref_e, rel=1e-12, abs=0)
    # the Python loop (short runs) and the array path (long runs) are bit-identical
    lin_c = (perf._lin_flops_per_token + perf._head_flops_per_seq) * b / perf._decode_flops_rate
    base_s = perf._lin(lin_c, perf._weights_s) + perf._seq_s * b + perf._fixed_s
    loop_t, loop_e = perf._decode_run_loop(b, lin_c, base_s, ctx, len(ends), limit_s)
    assert ends == loop_t and energy == loop_e
    # the engine's hot path: the same ends and the last cumulative energy, bit for bit; a run cut after j
    # steps has the energy decode_run gives for j steps
    tot_t, tot_e = perf.decode_run_total(b, ctx, max_steps, limit_s)
    assert tot_t == ends and tot_e == energy[-1]
    for j in {1, (len(ends) + 1) // 2, len(ends)}:
        assert perf.decode_run(b, ctx, j, math.inf)[1][-1] == energy[j - 1]
    return len(ends)


@pytest.mark.parametrize("b,ctx,max_steps,limit_s", [
    (1, 0, 5, math.inf), (3, 1000, 24, math.inf), (7, 5000, 25, math.inf), (64, 20_000, 3000, math.inf),
    (16, 100, 10_000, 0.25), (200, 300_000, 10_000, 2.0), (1, 10, 1 << 30, 1.0)])
def test_decode_run_matches_step_by_step(a40, llama, b, ctx, max_steps, limit_s):
    perf = PerfModel(a40, llama)
    k = assert_same_run(perf, b, ctx, max_steps, limit_s)
    if limit_s < math.inf:      # it stopped after the step that reached the limit, not before, not later
        ends, _ = perf.decode_run(b, ctx, max_steps, limit_s)
        assert ends[-1] >= limit_s and (k == 1 or ends[-2] < limit_s)


def test_decode_run_across_the_busy_time_switch(a40, llama):
    """Hard roofline, no fixed overheads, 256 sequences: the GEMMs are compute-bound (lin_c > lin_m), the
    busy time ``compute + 0.55 x memory`` exceeds the step at a short context (power = TDP) and falls
    under it as the KV grows (power < TDP): the energy's ``min(busy, step)`` changes branch mid-run."""
    hw = dataclasses.replace(a40, roofline_exponent=None, layer_overhead_s=0.0, step_overhead_s=0.0,
                             attention_seq_overhead_s=0.0, memory_power_frac=0.55)   # 0.55: the switch happens
    perf = PerfModel(hw, llama)
    b, steps = 256, 500
    first, last = perf.decode_step(b, 0), perf.decode_step(b, (steps - 1) * b)
    assert first.compute_s > perf._weights_s                      # compute-bound GEMMs
    assert first.energy_j / first.time_s == pytest.approx(hw.tdp_w)   # busy >= step: full power
    assert last.energy_j / last.time_s < hw.tdp_w - 10            # busy < step later in the same run
    assert assert_same_run(perf, b, 0, steps, math.inf) == steps


def test_decode_run_across_the_power_cap(a40, llama):
    """A40 capped at 200 W, 64 sequences: the first steps demand more than the cap (throttled, drawing
    exactly 200 W), the later ones (KV-bound) less; the run crosses the cap mid-run."""
    a40 = dataclasses.replace(a40, memory_power_frac=0.55)   # 0.55: the run crosses the cap
    hw = dataclasses.replace(a40, power_cap_w=200.0)
    perf = PerfModel(hw, llama)
    b, steps = 64, 2000
    first, last = perf.decode_step(b, 0), perf.decode_step(b, (steps - 1) * b)
    uncapped = PerfModel(a40, llama).decode_step(b, 0)
    assert first.energy_j / first.time_s == pytest.approx(200.0) and first.time_s > uncapped.time_s
    assert last.energy_j / last.time_s < 199.0
    assert assert_same_run(perf, b, 0, steps, math.inf) == steps
    assert_same_run(perf, b, 0, steps, 3.0)


@pytest.mark.parametrize("cap_w,mpf", [(None, 0.8), (200.0, 0.8), (None, 1.0), (150.0, 0.3)])
def test_decode_run_total_with_and_without_the_power_cap(a40, llama, cap_w, mpf):
    """``decode_run_total`` takes a branch-free loop when the cap cannot bind (cap = TDP) and busy never
    exceeds the step (memory_power_frac <= 1); under a 150-200 W cap (below the A40's 300 W TDP) it takes
    the general loop. Either way: decode_run's ends and last energy, bit for bit, at short and long runs."""
    hw = dataclasses.replace(a40, power_cap_w=cap_w, memory_power_frac=mpf)
    perf = PerfModel(hw, llama)
    assert perf._run_terms(8)[3] == (cap_w is None)
    for b, ctx, max_steps, limit_s in [(1, 10, 40, 0.25), (8, 4000, 96, math.inf), (8, 4000, 300, 0.5),
                                       (256, 0, 30, math.inf), (3, 100, 1 << 30, 0.25)]:
        assert_same_run(perf, b, ctx, max_steps, limit_s)


@pytest.mark.parametrize("cap_w", [None, 150.0])
def test_decode_one_is_a_run_of_one_step(a40, llama, cap_w):
    """``PerfModel.decode_one`` (a timeout-paced run's price per step) is ``decode_run_total`` of one step bit for
    bit, with the cap free (its inline plain step) and binding (150 W under the A40's 300 W TDP: the general loop);
    and by hand where plain: time ``base_s + kv_s * (ctx + b)``, energy ``idle_w * time + (tdp - idle) * busy`` with
    ``busy = busy0 + memory_power_frac * kv_s * (ctx + b)`` (``PerfModel._run_terms``)."""
    perf = PerfModel(dataclasses.replace(a40, power_cap_w=cap_w), llama)
    for b, ctx in [(1, 0), (1, 10), (3, 4000), (64, 123_457)]:
        ends, energy = perf.decode_run_total(b, ctx, 1, math.inf)
        assert perf.decode_one(b, ctx) == (ends[0], energy)
        assert perf.decode_one(b, ctx) == (perf.decode_run_total(b, ctx, 1, 0.0)[0][0], energy)   # any limit
        if cap_w is None:
            _, base_s, busy0, plain = perf._run_terms(b)
            kv_m = perf._kv_s_per_token * (ctx + b)
            hw = perf.hw
            dyn_j = (hw.tdp_w - hw.idle_w) * (busy0 + hw.memory_power_frac * kv_m)
            assert plain and perf.decode_one(b, ctx) == (base_s + kv_m, hw.idle_w * (base_s + kv_m) + dyn_j)


# ---- the unloaded-TTFET baseline on disk ---------------------------------------------------------------

def _tiny():
    from tests.conftest import compose_run, conversation
    from harness.workload.workload import WorkloadConfig, build_workload
    convs = [conversation("c0", [(0, 300, 20, 0.5), (320, 40, 10, 0.2), (370, 30, 5, 0.0)]),
             conversation("c1", [(0, 500, 30, 1.0), (530, 50, 8, 0.0)])]
    conversations, stats = build_workload(convs, WorkloadConfig(arrival="poisson", rate_per_s=1.0))
    return compose_run(["scheduler=collocated"]), conversations, stats


def test_unloaded_ttfet_disk_cache_round_trips_exactly(tmp_path, monkeypatch):
    from harness.run import session, slo_baseline
    run, conversations, stats = _tiny()
    monkeypatch.setattr(slo_baseline, "_UNLOADED_CACHE", {})
    fresh = slo_baseline.unloaded_ttfet(session.session_input(run), conversations, stats, cache_dir=tmp_path)
    shards = list(tmp_path.glob("unloaded_ttfet/*/*.json"))
    assert len(shards) == 1
    # a new process (empty memo) reads the shard and replays nothing
    monkeypatch.setattr(slo_baseline, "_UNLOADED_CACHE", {})

    def no_replay(*a, **k):
        raise AssertionError("replayed although cached on disk")
    monkeypatch.setattr(slo_baseline, "simulate", no_replay)
    again = slo_baseline.unloaded_ttfet(session.session_input(run), conversations, stats, cache_dir=tmp_path)
    assert again == fresh                     # exact: floats written with repr
    # the in-process memo alone (no disk) also replays nothing
    assert slo_baseline.unloaded_ttfet(session.session_input(run), conversations, stats, cache_dir="off") == fresh


def test_unloaded_ttfet_disk_cache_is_keyed_by_setup_and_conversation(tmp_path, monkeypatch):
    from harness.run import session, slo_baseline
    from tests.conftest import compose_run
    run, conversations, stats = _tiny()
    monkeypatch.setattr(slo_baseline, "_UNLOADED_CACHE", {})
    slo_baseline.unloaded_ttfet(session.session_input(run), conversations[:1], stats, cache_dir=tmp_path)
    monkeypatch.setattr(slo_baseline, "_UNLOADED_CACHE", {})
    # another conversation is replayed (a second shard), the cached one is not
    calls = []
    real = slo_baseline.simulate
    monkeypatch.setattr(slo_baseline, "simulate", lambda run, convs, *a, **k: calls.append(convs[0][1].conversation_id)
                        or real(run, convs, *a, **k))
    slo_baseline.unloaded_ttfet(session.session_input(run), conversations, stats, cache_dir=tmp_path)
    assert calls == [conversations[1][1].conversation_id]
    assert len(list(tmp_path.glob("unloaded_ttfet/*/*.json"))) == 2
    # another engine setup: another directory, everything replayed
    monkeypatch.setattr(slo_baseline, "_UNLOADED_CACHE", {})
    calls.clear()
    other = compose_run(["scheduler=collocated", "engine.max_num_batched_tokens=512"])
    slo_baseline.unloaded_ttfet(session.session_input(other), conversations, stats, cache_dir=tmp_path)
    assert len(calls) == 2 and len(list(tmp_path.glob("unloaded_ttfet/*"))) == 2


def test_unloaded_ttfet_cache_dir_from_environment(tmp_path, monkeypatch):
    from harness.run import session, slo_baseline
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "c"))
    assert slo_baseline.cache_root() == tmp_path / "c"
    monkeypatch.setenv("HARNESS_CACHE_DIR", "off")
    assert slo_baseline.cache_root() is None
    run, conversations, stats = _tiny()
    monkeypatch.setattr(slo_baseline, "_UNLOADED_CACHE", {})
    slo_baseline.unloaded_ttfet(session.session_input(run), conversations, stats)
    assert not (tmp_path / "c").exists()


# ---- inline engine steps ---------------------------------------------------------------------------------

def test_nothing_due_now_follows_the_heap_order():
    """An event scheduled now at priority p runs next iff nothing is due now at priority <= p (ties at
    equal time and priority go to the earlier one, which is already queued)."""
    from harness.core.clock import SimClock
    c = SimClock()
    assert c.nothing_due_now(0)
    c.call_at(1.0, lambda: None, priority=0)
    assert c.nothing_due_now(0)                   # due later, not now
    c.call_at(0.0, lambda: None, priority=1)
    assert c.nothing_due_now(0) and not c.nothing_due_now(1)
    c.call_at(0.0, lambda: None, priority=0)
    assert not c.nothing_due_now(0)


def test_priority_now_is_the_running_events():
    """``SimClock.priority_now``: inside an event, that event's priority; outside ``run`` (before it, after it),
    ``CONTROL`` (1)."""
    from harness.core.clock import SimClock
    c = SimClock()
    seen = []
    for p in (2, 0, 1):
        c.call_at(1.0, lambda: seen.append(c.priority_now()), priority=p)
    c.call_at(0.5, lambda: seen.append(c.priority_now()), priority=2)
    assert c.priority_now() == 1
    c.run()
    assert seen == [2, 0, 1, 2] and c.priority_now() == 1


def test_inline_steps_keep_results_and_save_events():
    """One engine, two requests submitted at t = 0 (each with its own 100-token prompt, 5 output tokens):
    the run's token times equal a run where every step is its own event (max_coalesce_s = 0 and the
    inline path disabled), with fewer clock events."""
    from harness.core.clock import SimClock
    from harness.core.profiles import EngineConfig
    from harness.sim.engine import Engine, Request

    def run(inline: bool):
        class PlainClock(SimClock):
            def nothing_due_now(self, priority):
                return False
        clock = SimClock() if inline else PlainClock()
        hw = _load(HardwareConfig, ROOT / "conf" / "hardware" / "a40.yaml")
        m = _load(ModelConfig, ROOT / "conf" / "model" / "llama2_7b.yaml")
        eng = Engine(0, "e", clock, PerfModel(hw, m), EngineConfig(block_size=16), 1000, lambda r, w: None, 0.0)
        done = []
        for i in range(2):
            clock.call_at(0.0, eng.submit, Request(f"c{i}", 0, 100, 5, (0,), on_finish=done.append,
                                                    on_first_token=lambda r: None), priority=0)
        clock.run()
        return [(r.conv, r.first_token_s, r.finish_s, list(r.itl_gaps())) for r in done], clock.events

    a, ev_inline = run(True)
    b, ev_plain = run(False)
    assert a == b and len(a) == 2
    # both submits (priority 0) precede the first step: 5 steps (1 prefill of both + 4 decode) and a last
    # step begin that finds nothing to do. Plain: 2 submits + 6 begins + 5 ends; inline: only the first
    # begin (scheduled by a submit) is an event of its own
    assert ev_plain == 2 + 6 + 5 and ev_inline == 2 + 1 + 5


# ---- the conversation table, column-wise -----------------------------------------------------------------

def test_conversation_table_by_hand():
    """c0 (3 turns, turn 1 visible -> TTFET turn 1) arrived at 10 s: turn 1 has a failed row, then an ok row
    with first token at 15.5 s (TTFET 5.5 s); its last turn finished at 30 s with TPOT 0.02 s (latency
    20 s); 3 ok turns. c1 (2 turns, none visible -> the last) arrived at 0 s, only turn 0 ran (ok): TTFET,
    latency and TPOT NaN, 1 turn done. c2 has no rows."""
    import pandas as pd
    from types import SimpleNamespace as NS
    from harness.analysis.metrics import CONVERSATION_COLUMNS, conversation_table

    def conv(cid, arrival, visible, finish, failed=False, done=True):
        return NS(record=NS(conversation_id=cid, parent_id=None, turns=[NS(visible=v) for v in visible]),
                  arrival_s=arrival,
                  finish_s=finish, failed=failed, done=done)
    convs = [conv("c0", 10.0, [False, True, False], 30.0), conv("c1", 0.0, [False, False], 8.0, failed=True),
             conv("c2", 1.0, [True], math.nan, done=False)]
    turns = pd.DataFrame([
        ("c1", 0, "ok", 0.0, 1.0, 2.0, 0.1), ("c0", 0, "ok", 10.0, 11.0, 12.0, 0.01),
        ("c0", 1, "failed", 13.0, 14.0, 14.5, 0.5), ("c0", 1, "ok", 14.0, 15.5, 16.0, 0.03),
        ("c0", 2, "ok", 20.0, 25.0, 30.0, 0.02), ("zz", 0, "ok", 0.0, 1.0, 1.0, 0.0)],
        columns=["conversation_id", "turn", "status", "submit_s", "first_token_s", "finish_s", "tpot_s"])
    t = conversation_table(turns, convs, "first_visible").set_index("conversation_id")
    assert list(conversation_table(turns, convs, "first_visible").columns) == CONVERSATION_COLUMNS
    assert t.loc["c0", "ttfet_s"] == 5.5 and t.loc["c0", "latency_s"] == 20.0
    assert t.loc["c0", "ttfet_serving_s"] == (12.0 - 10.0) + (15.5 - 14.0)   # turn 0's E2E + turn 1's TTFT
    assert t.loc["c0", "last_turn_tpot_s"] == 0.02 and t.loc["c0", "turns_done"] == 3
    assert t.loc["c1", "turns_done"] == 1 and math.isnan(t.loc["c1", "ttfet_s"]) and math.isnan(t.loc["c1", "latency_s"])
    assert t.loc["c2", "turns_done"] == 0 and math.isnan(t.loc["c2", "ttfet_s"])
    assert list(t.failed) == [False, True, False] and list(t.completed) == [True, False, False]
    assert list(t.num_turns) == [3, 2, 1]
    # "first": turn 0 of c0 -> 1 s; "last": c0's turn 2 -> 15 s, c1's turn 1 never ran
    assert conversation_table(turns, convs, "first").set_index("conversation_id").loc["c0", "ttfet_s"] == 1.0
    last = conversation_table(turns, convs, "last").set_index("conversation_id")
    assert last.loc["c0", "ttfet_s"] == 15.0 and math.isnan(last.loc["c1", "ttfet_s"])
    empty = conversation_table(turns.iloc[:0], convs, "first")
    assert list(empty.turns_done) == [0, 0, 0] and empty.ttfet_s.isna().all()


# ---- the controller's incremental held queue and per-instance books -----------------------------------

def test_controller_held_queue_and_books_after_a_non_head_release():
    """Conversations a-e arrive at t = 0..4 (one 10-token turn each). The policy holds everything except at
    t = 3, when it releases queue positions 1 and 3 (b, d), placing b on instance 0 and d on instance 1.
    So the queues it sees are [a], [a b], [a b c], [a b c d], then [a c e] at t = 4; b's placement view
    holds 2 turns and empty books, d's holds 2 turns and instance 0's book (b, turn 0, 10 tokens, in
    flight); the t = 4 view shows both books."""
    import math as _m
    from harness.core.backend import ClusterBase, InstanceInfo, InstanceState
    from harness.core.clock import SimClock
    from harness.core.controller import Controller
    from harness.core.policy import Admission, InstanceHints, Placement
    from harness.core.recorder import Recorder
    from harness.core.trace import ConversationRecord, TurnRecord

    class Stub(ClusterBase):
        def __init__(self):
            self.clock = SimClock()
            self.infos = tuple(InstanceInfo(i, f"i{i}", "collocated", "a40", 1000) for i in range(2))
            self.jobs = []

        def start_turn(self, job):
            self.jobs.append(job)

        def observe(self):
            return tuple(InstanceState(0, 0, 0, _m.nan) for _ in self.infos)

    seen, views = [], {}

    class Policy:
        name = "script"

        def admit(self, queue, view, now):
            seen.append([t.conversation_id for t in queue])
            views[now] = view
            return Admission((1, 3) if now == 3.0 else ())

        def place(self, turn, view, now):
            views[turn.conversation_id] = view
            i = 0 if turn.conversation_id == "b" else 1
            return Placement(i, i)

    cluster = Stub()
    convs = [(float(k), ConversationRecord(cid, (TurnRecord(10, 0, 5, 0.0, True, 5),), "test"))
             for k, cid in enumerate("abcde")]
    hint = InstanceHints(1e4, 0.01, 0.01, 1e-6, 1e-5)
    ctl = Controller(cluster, Policy(), convs, Recorder(lambda c, t: True), (hint, hint),
                     link_bandwidth_bytes_per_s=1e9, link_latency_s=0.0, kv_bytes_per_token=1)
    ctl.start()
    cluster.clock.run()
    assert seen == [["a"], ["a", "b"], ["a", "b", "c"], ["a", "b", "c", "d"], ["a", "c", "e"]]
    assert [j.conversation_id for j in cluster.jobs] == ["b", "d"]
    vb, vd, v4 = views["b"], views["d"], views[4.0]
    assert vb.num_held == 2 and vb.instances[0].conversations == () and vb.instances[1].conversations == ()
    assert vd.num_held == 2 and vd.instances[0].conversations == (("b", 0),)
    assert vd.instances[0].conversation_tokens == (10,) and vd.instances[0].conversation_in_flight == (True,)
    assert vd.instances[0].num_conversations == 1 and vd.instances[0].conversation_context_tokens == 10
    assert v4.num_held == 3 and v4.instances[1].conversations == (("d", 0),)
    assert v4.instances[0].queued_prefill_tokens == 10 and v4.instances[1].queued_prefill_tokens == 10


def test_itl_gaps_from_single_steps_and_runs():
    """Token times: a prefill step ending at 1.0 s, a single decode step ending at 2.5 s, then a run of
    three decode steps started at 3.0 s ending 0.5, 1.0, 1.5 s later -> times 1.0, 2.5, 3.5, 4.0, 4.5 s,
    gaps 1.5, 1.0, 0.5, 0.5 s (all exact in binary)."""
    from array import array
    from harness.sim.engine import Request

    r = Request("c", 0, 10, 5, (0,))
    r.token_times = array("d", [1.0, 2.5, 3.5, 4.0, 4.5])
    assert r.itl_gaps().tolist() == [1.5, 1.0, 0.5, 0.5]
    assert Request("c", 0, 10, 1, (0,)).itl_gaps().tolist() == []
    one = Request("c", 0, 10, 1, (0,))
    one.token_times.append(7.0)
    assert one.itl_gaps().tolist() == [] and one.itl_gaps().dtype == np.float64


def test_engine_token_times_of_a_single_step_and_a_run():
    """The engine's token times (hence ITL gaps) by hand: a step model whose steps last 1, 2, 3, ... s
    (step j of a run costs j + 1 s: cumulative ends 1, 3, 6, ...) and 0.5 s for a prefill step. One request
    of prompt 4, 4 output tokens, ``max_coalesce_s`` = 100: the prefill step ends at 0.5 s (token 1), then
    a decode run of 3 steps started at 0.5 s ends at 0.5 + 1, 0.5 + 3, 0.5 + 6 -> token times 0.5, 1.5, 3.5,
    6.5 s, gaps 1.0, 2.0, 3.0 s; the run's energy is the sum of its steps' (10 J + 20 + 30) and a cut run's
    energy that of its steps run so far."""
    from harness.core.clock import SimClock
    from harness.core.profiles import EngineConfig
    from harness.sim.engine import Engine, Request

    class Cost:
        def __init__(self, t, e):
            self.time_s, self.energy_j = t, e

    from harness.sim.step_model import StepModel

    class Perf(StepModel):
        def step(self, *a):
            return Cost(0.5, 5.0)

        def decode_run(self, b, ctx, kmax, limit_s):
            ends, energy, t, e = [], [], 0.0, 0.0
            for j in range(kmax):
                t += j + 1.0
                e += 10.0 * (j + 1)
                ends.append(t)
                energy.append(e)
                if t >= limit_s:
                    break
            return ends, energy

    clock = SimClock()
    eng = Engine(0, "e", clock, Perf(), EngineConfig(block_size=16), 100, lambda r, why: None, max_coalesce_s=100.0)
    done = []
    req = Request("c", 0, 4, 4, (0,), on_finish=done.append)
    eng.submit(req)
    clock.run()
    assert done == [req] and req.finish_s == 6.5
    assert req.token_times.tolist() == [0.5, 1.5, 3.5, 6.5]
    assert req.itl_gaps().tolist() == [1.0, 2.0, 3.0]
    assert eng.energy_busy_j == 5.0 + 60.0 and eng.busy_s == 6.5 and eng.steps == 4
    # the same run cut by a submission at 2.0 s (inside its second step): the run ends after that step
    # (3.5 s, 5 + 10 + 20 J), the next run (1 step, ctx grown) ends at 3.5 + 1 = 4.5 s
    clock = SimClock()
    eng = Engine(0, "e", clock, Perf(), EngineConfig(block_size=16), 100, lambda r, why: None, max_coalesce_s=100.0)
    req = Request("c", 0, 4, 4, (0,), on_finish=lambda r: None)
    eng.submit(req)
    clock.call_at(2.0, eng.wake)
    clock.run(until=3.5)
    assert req.token_times.tolist() == [0.5, 1.5, 3.5] and eng.energy_busy_j == 5.0 + 30.0
    clock.run()
    assert req.token_times.tolist() == [0.5, 1.5, 3.5, 4.5] and eng.energy_busy_j == 5.0 + 30.0 + 10.0
    # a run shortened for KV blocks: block size 2, 7 blocks, two such requests. The prefill step (both prompts,
    # 2 blocks each) ends at 0.5 s; the decode run's first step holds 3 blocks each (5 tokens), 1 block is
    # left, and 3 steps would need 1 more each (7 tokens: 4 blocks) -> the run is one step (1 s, 10 J): at
    # 1.5 s the energy is 5 + 10 J, not the 60 J of the 3-step run the step model first returned
    clock = SimClock()
    eng = Engine(0, "e", clock, Perf(), EngineConfig(block_size=2), 7, lambda r, why: None, max_coalesce_s=100.0)
    reqs = [Request(c, 0, 4, 4, (0,), on_finish=lambda r: None) for c in "ab"]
    for r in reqs:
        eng.submit(r)
    clock.run(until=1.5)
    assert [r.token_times.tolist() for r in reqs] == [[0.5, 1.5]] * 2 and eng.energy_busy_j == 5.0 + 10.0
    assert eng.steps == 2 and eng.busy_s == 1.5


# ---- rule-declared horizons: merged WAIT / Nested WAIT / WAIT-CP plans equal step-by-step ----------------

@pytest.mark.parametrize(("scheduler", "extra"), [("wait", []), ("nested_wait", [])])
def test_merged_rule_plans_equal_step_by_step(scheduler, extra):
    """A batch rule's declared horizon (``StepPlan.repeat_steps``) lets the engine run its repeated
    decode-only plans as one event; the turns must be exactly (bit for bit) those of one event per step
    (``max_coalesce_s = 0``), with fewer events. 30 real trace conversations on the default cluster
    with 10 % of its memory for the engine, so that admissions fail for KV (WAIT repeats a decode-only
    plan only then) and residents pause."""
    from tests.test_invariants import workload
    from harness.run.session import session_input, simulate
    from tests.conftest import compose_run
    run = compose_run([f"scheduler={scheduler}", "engine.gpu_memory_utilization=0.1",
                       "engine.activation_reserve_bytes=268435456", *extra])
    convs, stats = workload(run, n=30, rate=1.0, max_turns=8, max_context=20000)
    merged = simulate(session_input(run), convs, stats, scheduler, run.scheduler, max_coalesce_s=0.25)
    plain = simulate(session_input(run), convs, stats, scheduler, run.scheduler, max_coalesce_s=0.0)
    assert not merged.error and not plain.error
    a = pd.DataFrame(merged.turns).sort_values(["conversation_id", "turn"]).reset_index(drop=True)
    b = pd.DataFrame(plain.turns).sort_values(["conversation_id", "turn"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert len(a) == sum(len(r.turns) for _, r in convs)
    assert merged.events < plain.events


def test_sim_clock_rejects_past_and_non_finite_times():
    """``SimClock.call_at``: a time before now, NaN or infinite is an error naming the time; now itself and
    a later finite time are accepted, and events run in time order."""
    from harness.core.clock import SimClock

    clock = SimClock()
    seen = []
    clock.call_at(2.0, seen.append, 2.0)
    clock.call_at(1.0, seen.append, 1.0)
    clock.run(until=1.5)               # the event at 1.0 ran: now is 1.0
    assert seen == [1.0] and clock.now() == 1.0
    clock.call_at(1.0, seen.append, 1.5)
    for bad in (0.5, -math.inf, math.nan, math.inf):
        with pytest.raises(ValueError, match="call_at: time"):
            clock.call_at(bad, seen.append, bad)
    clock.run()
    assert seen == [1.0, 1.5, 2.0]


def test_merged_nested_wait_rotate_plans_equal_step_by_step():
    """Nested WAIT with ``stage_caps=rotate``: merged plans (its horizons with rotating caps) give exactly the
    turns of one event per step. 5 conversations (a rotate plan was O(segment length x stages) per step
    before its caps were computed per looked-at stage: 30 conversations did not finish in 150 s; now
    about 5 s per simulation). At this size no rotate horizon outlasts one step (a rotation offset or a
    changed entry cap ends it), so the event counts may be equal; never more."""
    from tests.test_invariants import workload
    from harness.run.session import session_input, simulate
    from tests.conftest import compose_run
    run = compose_run(["scheduler=nested_wait", "engine.gpu_memory_utilization=0.1",
                       "engine.activation_reserve_bytes=268435456", "scheduler.stage_caps=rotate"])
    convs, stats = workload(run, n=5, rate=1.0, max_turns=8, max_context=20000)
    merged = simulate(session_input(run), convs, stats, "nested_wait", run.scheduler, max_coalesce_s=0.25)
    plain = simulate(session_input(run), convs, stats, "nested_wait", run.scheduler, max_coalesce_s=0.0)
    assert not merged.error and not plain.error
    a = pd.DataFrame(merged.turns).sort_values(["conversation_id", "turn"]).reset_index(drop=True)
    b = pd.DataFrame(plain.turns).sort_values(["conversation_id", "turn"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert len(a) == sum(len(r.turns) for _, r in convs)
    assert merged.events <= plain.events
