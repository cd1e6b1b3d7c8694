"""WAIT's timer-driven steps with fewer events and plans, results unchanged (issue 21):

* a rule timer's step runs inline (``Engine._timer_fire``: its ``wake()`` is the event's last act, as at a
  step's end), when nothing else is due at that instant;
* a rule's statement of its next, empty plan (``StepPlan.idle_after``): the engine skips that plan after a
  step that ran exactly as planned and only arms the timer the plan would have armed.

* Nested WAIT with ``stage_caps=rotate``: the first rotation offset at which something runs, found from
  the rotation formula (``NestedWaitRule._first_opening``) instead of planning every offset in turn.

* a rule's statement that its plan after that timer is the same again (``StepPlan.idle_repeat_steps``): the
  engine runs such timeout-paced steps, idle gaps included, as one run (``Engine._plan_paced_run``), cut
  where anything reaches the engine (``Engine._cut_paced``).

Each is checked by hand on a tiny case (events and plans counted from the trace in the docstring) and on
simulations against the same run with the mechanism off (exact frames).
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from baselines.wait.fluid_admission import NestedWaitRule, WaitRule
from harness.core.clock import SimClock
from harness.sim.engine import DONE, Engine, Request
from tests.test_batching import StubPerf, make_engine, resident


def _old_timer_fire(self, t):
    """``Engine._timer_fire`` before the inline path: its step is always an event of its own."""
    if self._timer_at == t:
        self._timer_at = None
    self.wake()


class Counted:
    """A rule wrapper counting plans; ``state=False`` strips ``idle_after`` (the statement off), ``paced=False``
    ``idle_repeat_steps`` (timeout-paced runs off)."""

    def __init__(self, rule, state=True, paced=True):
        self.rule, self.state, self.paced, self.plans, self.name = rule, state, paced, 0, rule.name

    def plan(self, inp):
        self.plans += 1
        p = self.rule.plan(inp)
        if not self.state:
            return dataclasses.replace(p, idle_after=None, idle_repeat_steps=0, timer_groups=None)
        return p if self.paced else dataclasses.replace(p, idle_repeat_steps=0, timer_groups=None)


def _tiny(monkeypatch, inline_timer: bool, state: bool, arrival_at=None, nested=False, paced=False, out=3,
          max_coalesce_s=0.0):
    """One engine (1 s steps), WAIT with one type, n = 2, max_wait_s = 0.5 (``nested``: Nested WAIT with one
    segment of 3 stages, caps 2, the same timeout: the same decisions here); request A (prompt 4, ``out``
    output tokens) submitted at t = 0; optionally B (prompt 4, 3 output tokens) submitted at ``arrival_at``.
    ``paced``: the rule's ``idle_repeat_steps`` kept (the engine uses it only with ``max_coalesce_s > 0``)."""
    if not inline_timer:
        monkeypatch.setattr(Engine, "_timer_fire", _old_timer_fire)
    eng = make_engine(1000, max_coalesce_s=max_coalesce_s)
    rule = Counted(NestedWaitRule([3], [[2, 2, 2]], 0.5) if nested else WaitRule([2], lambda r: 0, 0.5), state, paced)
    eng.set_rule(rule)
    reqs = [Request("A", 0, 4, out, (0,), on_finish=lambda r: None, on_first_token=lambda r: None)]
    eng.submit(reqs[0])
    if arrival_at is not None:
        reqs.append(Request("B", 0, 4, 3, (0,), on_finish=lambda r: None, on_first_token=lambda r: None))
        eng.clock.call_at(arrival_at, eng.submit, reqs[1], priority=1)
    eng.clock.run()
    assert all(r.state == DONE for r in reqs)
    return eng, rule, [(r.token_times.tolist(), r.finish_s) for r in reqs]


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize(("inline_timer", "state", "events", "plans", "skipped"), [
    (False, False, 10, 7, 0), (True, False, 7, 7, 0), (False, True, 10, 5, 2), (True, True, 7, 5, 2)])
def test_timer_steps_by_hand(monkeypatch, inline_timer, state, events, plans, skipped, nested):
    """A alone, below its threshold, advances one step per timeout. By hand (1 s steps, max_wait_s 0.5):
    t = 0 the submit's step begin (an event): A is 1 < n = 2 at stage 0, waited 0 s: empty plan, timer at
    0.5. t = 0.5 the timer: A waited 0.5 s: a step (its prefill, A admitted) ending at 1.5 (A's first
    token). t = 1.5: the step's end; the plan after it (inline) is empty (A at stage 1 since 1.5), timer at
    1.5 + 0.5 = 2.0. Then the same at 2.0 (decode, ends 3.0, timer 3.5) and 3.5 (ends 4.5, A finishes;
    the plan after it is computed: A finished, nothing left, no timer).

    Plain: events = 1 step begin at 0 + 3 timers + 3 timer step begins + 3 step ends = 10; plans = 1 + 3
    (timers) + 3 (after each end) = 7. The timer's step inline: the 3 timer step begins are not events
    (7 events). The statement: the plans after the ends at 1.5 and 3.0 are skipped (2), the last one
    not (A finished): 5 plans. Token times 1.5, 3.0, 4.5 in every case. Nested WAIT (one segment, caps 2)
    decides the same: segment 1's gate is its stage-0 count 1 < 2 or the timeout."""
    eng, rule, out = _tiny(monkeypatch, inline_timer, state, nested=nested)
    assert out == [([1.5, 3.0, 4.5], 4.5)]
    assert eng.clock.events == events and rule.plans == plans and eng.plans_skipped == skipped
    assert eng._timer_at is None and eng.clock.pending() == 0


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize(("inline_timer", "paced", "events", "plans"), [
    (False, False, 10, 5), (True, False, 7, 5), (False, True, 7, 4), (True, True, 5, 4)])
def test_timeout_paced_run_by_hand(monkeypatch, inline_timer, paced, events, plans, nested):
    """The case of ``test_timer_steps_by_hand`` with coalescing on (``max_coalesce_s`` 0.25 s). At 2.0 the
    timer's plan runs A alone (stage 1, every resident, nothing waiting, by its timeout): WAIT states that
    the plan at its timer after the step is the same (``idle_repeat_steps``; Nested WAIT: A's group of 1 fits
    the cap 2 of every later stage). Paced: one run of A's two decodes, 2.0 -> 3.0, idle to 3.5, 3.5 -> 4.5,
    one end event at 4.5 instead of the end at 3.0, the timer at 3.5 (and its step begin, without the inline
    timer): events 10 - 3 = 7 (7 - 2 = 5 inline); plans: the one at 3.5 not computed (5 - 1 = 4); the plan
    after 3.0 still counted as skipped (2). Token times and the finish the same: 1.5, 3.0, 4.5."""
    eng, rule, out = _tiny(monkeypatch, inline_timer, True, nested=nested, paced=paced, max_coalesce_s=0.25)
    assert out == [([1.5, 3.0, 4.5], 4.5)]
    assert eng.clock.events == events and rule.plans == plans and eng.plans_skipped == 2
    assert eng._timer_at is None and eng.clock.pending() == 0 and eng.steps == 3 and eng.busy_s == 3.0


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize(("arrival_at", "a_times", "b_times"), [
    (3.2, [1.5, 3.0, 4.5, 6.0, 7.5], [4.5, 6.0, 7.5]),
    (4.0, [1.5, 3.0, 4.5, 5.5, 7.0], [5.5, 7.0, 8.5]),
    (3.5, [1.5, 3.0, 4.5, 5.5, 7.0], [5.5, 7.0, 8.5])])
def test_an_arrival_cuts_a_timeout_paced_run(monkeypatch, arrival_at, a_times, b_times, nested):
    """A (5 output tokens) paced from 2.0: steps 2.0-3.0, 3.5-4.5, 5.0-6.0, 6.5-7.5 as one run; B (3 tokens)
    arrives. By hand, one event per step:

    * at 3.2, between two steps: A ended its step at 3.0 (timer 3.5). B's step at 3.2 plans nothing (B 1 < 2 at
      stage 0, the oldest A since 3.0 + 0.5 > 3.2); at 3.5 the timer: A decodes, B's prefill, -> 4.5; the
      plan after is skipped (timer 5.0); 5.0 -> 6.0 and 6.5 -> 7.5 both decode; both finish at 7.5.
    * at 4.0, inside the step 3.5 -> 4.5 (and at 3.5, the instant that step begins: the timer's step runs
      first): the arrival drops the statement; at 4.5 the plan (B waiting since its arrival, 0.5 s at 4.5 for
      4.0) runs A's decode and B's prefill -> 5.5; 6.0 -> 7.0 (A finishes); B alone from 7.5 -> 8.5.

    The paced run gives exactly these times (cut between two steps: the steps ended so far end as their own
    events; inside one: that step is the run's last), with fewer events than without it."""
    res = {}
    for paced in (False, True):
        eng, rule, out = _tiny(monkeypatch, True, True, arrival_at, nested, paced, out=5, max_coalesce_s=0.25)
        res[paced] = eng.clock.events
        assert out == [(a_times, a_times[-1]), (b_times, b_times[-1])]
        assert eng.steps == (5 if arrival_at == 3.2 else 6)
    assert res[True] < res[False]


def test_observers_see_a_timeout_paced_run_step_by_step():
    """Two residents at stage 1 (prompt 4, 1 token out, 6 to go: KV of 4 tokens each, block size 1), idle since
    0, paced from 0.5 with 1 s steps: steps 0.5-1.5, 2.0-3.0, 3.5-4.5, ... . The KV blocks in use read
    mid-run count the steps begun: 2 x 5 = 10 during the first step (its token's block allocated at its
    start), 10 in the gap after it, 12 once the second has begun; busy time counts the steps ended: 0 during
    the first, 1.0 after it, 1.0 in the second, 2.0 after it. The next event one event per step would have:
    after 1.0 the first step's end (1.5), after 1.6 the second step's timer (2.0), after 2.1 its end (3.0),
    after 3.2 the third's timer (3.5). Both finish at 9.0, the run's one end event."""
    eng = make_engine(1000, max_coalesce_s=0.25)
    eng.set_rule(WaitRule([2], lambda r: 0, 0.5))
    rs = [resident(eng, f"r{i}", 4, 1, out_target=7) for i in range(2)]
    eng.clock._now = 0.5
    eng.wake()
    seen = []

    def look():
        now = eng.clock.now()
        seen.append((now, eng.used_blocks_now(), eng.busy_energy_now()[0], eng.paced_event_after(now)))
    for t in (1.0, 1.6, 2.1, 3.2):
        eng.clock.call_at(t, look, priority=2)
    eng.clock.run()
    assert seen == [(1.0, 10, 0.0, 1.5), (1.6, 10, 1.0, 2.0), (2.1, 12, 1.0, 3.0), (3.2, 12, 2.0, 3.5)]
    assert [r.token_times.tolist() for r in rs] == [[1.5, 3.0, 4.5, 6.0, 7.5, 9.0]] * 2
    assert eng.clock.events == 2 + 4 and eng.steps == 6      # the step begin at 0.5, the run's end; 4 looks


def test_an_arrival_during_the_step_cancels_the_statement(monkeypatch):
    """B arrives at 1.0, inside A's prefill step (0.5 -> 1.5), which stated an empty plan after it: the
    arrival drops the statement, so the plan at 1.5 is computed. By hand: t = 1.5: A at stage 1, B waiting
    (1 < n = 2 at stage 0), oldest = B's submission 1.0, 1.0 + 0.5 <= 1.5: a step (A decodes, B's
    prefill) 1.5 -> 2.5. t = 2.5: both advanced at 2.5, nothing arrived: the stated empty plan (timer at
    3.0) is skipped. t = 3.0: both decode -> 4.0: A's third token, A finishes (the plan after it is
    computed: B at stage 2 since 4.0, timer 4.5). t = 4.5: B decodes -> 5.5 and finishes. Plans with the
    statement off: at 0, 0.5, 1.5, 2.5, 3.0, 4.0, 4.5, 5.5 = 8; on: 7 (the one at 2.5 skipped)."""
    on = _tiny(monkeypatch, True, True, arrival_at=1.0)
    off = _tiny(monkeypatch, True, False, arrival_at=1.0)
    assert on[2] == off[2] == [([1.5, 2.5, 4.0], 4.0), ([2.5, 4.0, 5.5], 5.5)]
    assert off[1].plans == 8 and on[1].plans == 7 and on[0].plans_skipped == 1


def test_residents_left_out_keep_their_wake_time():
    """Three residents at stage 1 (idle since 0), n = 2, max_wait_s = 0.5; the engine starts at 0.5: the
    type is eligible by its timeout (1 < 2 at stage 0): the step takes the first two (1 s). The statement:
    the third's idle time 0 gives w = 0 + 0.5 and no ``T`` term (a resident was left out); at the step's
    end T = 1.5, W = 0.5 <= T, so the plan is computed (not skipped) and serves the third at once."""
    eng = make_engine(1000)
    eng.set_rule(WaitRule([2], lambda r: 0, 0.5))
    rs = [resident(eng, f"r{i}", 4, 1, out_target=3) for i in range(3)]
    eng.clock._now = 0.5
    inp = dataclasses.replace(eng._inp, now_s=0.5)
    p = WaitRule([2], lambda r: 0, 0.5).plan(inp)      # (a rule of its own: the engine's plans as it runs)
    assert [r for r, _ in p.run] == rs[:2] and p.idle_after == (0.5, None)
    eng.wake()
    eng.clock.run(until=1.5)
    assert eng.plans_skipped == 0 and rs[2].token_times.tolist() == []
    eng.clock.run(until=2.5)
    assert rs[2].token_times.tolist() == [2.5]


def _frames(res):
    return pd.DataFrame(res.turns).sort_values(["conversation_id", "turn"]).reset_index(drop=True)


@pytest.mark.parametrize(("scheduler", "extra"), [
    ("wait", ["engine.gpu_memory_utilization=0.1"]), ("wait", []), ("nested_wait", ["engine.gpu_memory_utilization=0.1"]),
    ("nested_wait", []), ("wait", ["scheduler.idle_policy=decode_residents", "engine.gpu_memory_utilization=0.1"])])
def test_simulations_equal_with_timeout_paced_runs_off(monkeypatch, scheduler, extra):
    """Real trace conversations at a low rate (the timeout-driven regime), tight memory (preemptions) or not:
    every turn, decision and instance sample (1-s ticks) with timeout-paced runs is exactly what the same run
    gives with the rules' ``idle_repeat_steps`` stripped, with fewer events where the rule states it."""
    from harness.run.session import session_input, simulate
    from tests.conftest import compose_run
    from tests.test_invariants import workload
    out = {}
    for on in (True, False):
        with monkeypatch.context() as m:
            cls = WaitRule if scheduler == "wait" else NestedWaitRule
            orig = cls.plan

            def plan(self, inp, orig=orig, on=on):
                p = orig(self, inp)
                return p if on else dataclasses.replace(p, idle_repeat_steps=0, timer_groups=None)
            m.setattr(cls, "plan", plan)
            cfg = compose_run([f"scheduler={scheduler}", "engine.activation_reserve_bytes=268435456", *extra])
            convs, stats = workload(cfg, n=8, rate=0.05, max_turns=5, max_context=20000)
            res = simulate(session_input(cfg), convs, stats, scheduler, cfg.scheduler, sample_interval_s=1.0,
                           log_decisions=True)
            assert not res.error and len(res.turns) == sum(len(r.turns) for _, r in convs)
            out[on] = (res.events, _frames(res), res.recorder.instances_frame(), res.recorder.decisions_frame(),
                       res.energy_j, res.preemptions)
    for a, b in zip(out[True][1:4], out[False][1:4]):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert out[True][4:] == out[False][4:]
    if "scheduler.idle_policy=decode_residents" in extra:
        assert out[True][0] == out[False][0]
    else:
        assert out[True][0] < out[False][0]


@pytest.mark.parametrize(("scheduler", "mem"), [("wait", "0.1"), ("wait", "0.9"), ("nested_wait", "0.1"),
                                              ("nested_wait", "0.9")])
def test_simulations_equal_with_the_mechanisms_off(monkeypatch, scheduler, mem):
    """Real trace conversations: the turns with the inline timer steps and the rule's statements are
    exactly those with both off (the old ``_timer_fire``, ``idle_after`` stripped), with fewer events
    and fewer plans."""
    from harness.run.session import session_input, simulate
    from tests.conftest import compose_run
    from tests.test_invariants import workload
    counts = {}

    def run(on: bool):
        with monkeypatch.context() as m:
            cls = WaitRule if scheduler == "wait" else NestedWaitRule
            orig = cls.plan
            n = {"plans": 0}

            def plan(self, inp):
                n["plans"] += 1
                p = orig(self, inp)
                return p if on else dataclasses.replace(p, idle_after=None)
            m.setattr(cls, "plan", plan)
            if not on:
                m.setattr(Engine, "_timer_fire", _old_timer_fire)
            cfg = compose_run([f"scheduler={scheduler}", f"engine.gpu_memory_utilization={mem}",
                               "engine.activation_reserve_bytes=268435456"])
            convs, stats = workload(cfg, n=20, rate=1.0, max_turns=8, max_context=20000)
            res = simulate(session_input(cfg), convs, stats, scheduler, cfg.scheduler)
            assert not res.error and len(res.turns) == sum(len(r.turns) for _, r in convs)
            counts[on] = (res.events, n["plans"])
            return _frames(res)

    pd.testing.assert_frame_equal(run(True), run(False), check_exact=True)
    assert counts[True][0] < counts[False][0] and counts[True][1] < counts[False][1]


# ---- Nested WAIT, stage_caps=rotate: the first opening offset from the rotation formula ------------------

def test_rotate_first_opening_by_hand():
    """One segment of 4 stages with B = 1 (caps rotate: base 0, rem 1): at step index t the stage at offset
    i has cap 1 iff (i + t) mod 4 = 0, so stage 0's cap is 1 only at t = 0 mod 4. One resident at stage 2,
    nothing waiting, no timeout (max_wait_s 10 s at now 0): segment 1's gate passes (0 >= cap) only where
    stage 0's cap is 0 (t' != 0 mod 4), and the resident runs where (2 + t') mod 4 = 0, t' = 2 mod 4. From
    t = 0 the first opening is offset 2; from t = 3, offset 3 (t' = 6); from t = 2, offset 0 (t' = 2: the
    plan keeps its horizon rules). With max_wait_s = 0 (timed out) the gate always passes: the same offsets
    (t' = 2 mod 4 is the resident's only opening)."""
    for mw in (10.0, 0.0):
        for t, off in ((0, 2), (3, 3), (2, 0), (1, 1)):
            eng = make_engine(1000)
            rule = NestedWaitRule([4], [[0, 0, 0, 1]], mw, rotate=True)
            a = resident(eng, "a", 4, 2)
            inp = dataclasses.replace(eng._inp, now_s=0.0, step_index=t)
            rule._index.sync(inp.running, ())
            sg = rule._index.groups
            assert rule._first_opening(inp, sg) == rule._first_opening_linear(inp, sg) == off
            p = rule.plan(inp)
            assert [(r.conv, n) for r, n in p.run] == [("a", 1)] and not p.admit
    # nothing can open: a resident at stage 1 of a segment whose caps are all 0 (B = 0); the gate passes
    # (0 >= cap 0), so no timeout is asked for either (no wake): the last offset's empty plan
    eng = make_engine(1000)
    rule = NestedWaitRule([4], [[0, 0, 0, 0]], 10.0, rotate=True)
    resident(eng, "b", 4, 1)
    inp = dataclasses.replace(eng._inp, now_s=0.0)
    rule._index.sync(inp.running, ())
    assert rule._first_opening(inp, rule._index.groups) is None
    p = rule.plan(inp)
    assert not p.run and not p.admit and p.wake_at_s is None


@pytest.mark.parametrize("extra", [["engine.gpu_memory_utilization=0.1", "engine.activation_reserve_bytes=268435456",
                                    "scheduler.idle_policy=decode_residents"],
                                   []])
def test_rotate_first_opening_equals_trying_every_offset(monkeypatch, extra):
    """At every plan of Nested WAIT rotate simulations (real trace conversations; both idle policies), the
    direct first opening equals the offset found by planning each offset in turn, and the plans move the
    rotation on often (so the search is exercised). (A third case, 0.1 of the GPU memory with 256 MiB reserved
    and the default idle policy, was dropped on 2026-12-06: the memory does not bind at these 5 conversations,
    and its run was the default memory's to the bit -- the same 11,995 plans, 2,618 of them moving the rotation,
    the same sequence of (time, step, opening) and the same turn finish times -- at ~20 CPU s a case, 17 s of
    them the linear search.) The conversations' first 4 turns (8 until 2026-12-06): 3,793 and 6,731 plans,
    1,384 and 1,459 of them moving the rotation (7,437 / 2,919 and 11,995 / 2,618 with 8 turns), 14.5 CPU s for
    both cases instead of 25.6 s, the linear search most of it; each of three one-character errors of
    ``_first_opening`` (``<=`` for ``<`` in stage 0's raised-cap offsets, ``>`` for ``>=`` in its entry gate,
    ``<`` for ``<=`` in its timeout) fails the test, as with 8 turns (3 conversations of 4 turns missed the
    first)."""
    from harness.run.session import session_input, simulate
    from tests.conftest import compose_run
    from tests.test_invariants import workload
    seen = {"plans": 0, "moved": 0}
    orig = NestedWaitRule._first_opening

    def checked(self, inp, sg):
        a = orig(self, inp, sg)
        assert a == self._first_opening_linear(inp, sg), (inp.now_s, inp.step_index)
        seen["plans"] += 1
        seen["moved"] += bool(a)
        return a
    monkeypatch.setattr(NestedWaitRule, "_first_opening", checked)
    run = compose_run(["scheduler=nested_wait", "scheduler.stage_caps=rotate", *extra])
    convs, stats = workload(run, n=5, rate=1.0, max_turns=4, max_context=20000)
    res = simulate(session_input(run), convs, stats, "nested_wait", run.scheduler)
    assert len(res.turns) > 0
    assert seen["plans"] > 1000 and seen["moved"] > 100


# ---- several timer groups with different phases (StepPlan.timer_groups) ----------------------------------

def _three_types(groups_on: bool, arrival_at=None, looks=(), c_idle=0.125, capacity=1000, only="ABC",
                 arrival_priority=1, look_priority=2, calls=()):
    """One engine (block size 1, 0.25-s steps whatever the batch), WAIT with three types (by the request's
    first letter: A 0, B 1, C 2, D 0), n = 2 each, max_wait_s = 0.5, coalescing on. Residents at stage 1
    (prompt 4, 4 tokens of KV): A (5 outputs) idle since 0, B (4) since 0.0625, C (6) since ``c_idle``; the engine
    starts at 0.5. ``groups_on=False`` strips the rule's ``timer_groups`` (the runs of one group that main
    had stay). Optionally D (prompt 4, 2 outputs) arrives at ``arrival_at``; at each time of ``looks`` an
    observer reads (now, KV blocks in use, busy s, the next engine event: the clock's, observers' left out, or
    the run's: ``Engine.paced_event_after``). ``capacity``: KV blocks (of 1 token). ``only``: the residents
    placed (a subset of A, B, C). ``arrival_priority``: D's submit event's (0: ``Priority.ENGINE``, queued at the
    start, before the engine's own events at that instant). ``look_priority``: the observers' events' (2: ``TICK``,
    after every other event at their instant; 0: queued at the start, before the engine's own). ``calls``: ``(t, fn)``
    pairs, ``fn(engine)`` called by an event at ``t`` (s) of the observers' priority."""
    eng = make_engine(capacity, StubPerf(0.25), max_coalesce_s=0.25)
    types = {"A": 0, "B": 1, "C": 2, "D": 0}
    rule = Counted(WaitRule([2, 2, 2], lambda r: types[r.conv[0]], 0.5), paced=True)
    if not groups_on:
        orig = rule.plan
        rule.plan = lambda inp: dataclasses.replace(orig(inp), timer_groups=None)
    eng.set_rule(rule)
    res = {}
    for name, out, idle in (("A", 5, 0.0), ("B", 4, 0.0625), ("C", 6, c_idle)):
        if name not in only:
            continue
        r = res[name] = resident(eng, name, 4, 1, out_target=out)
        r.idle_since_s = idle
    if arrival_at is not None:
        res["D"] = Request("D", 0, 4, 2, (0,), on_finish=lambda r: None, on_first_token=lambda r: None)
        eng.clock.call_at(arrival_at, eng.submit, res["D"], priority=arrival_priority)
    seen = []

    def look():
        now = eng.clock.now()
        nxt = min([e[0] for e in eng.clock._q if e[3] is not look] + [eng.paced_event_after(now)])
        seen.append((now, eng.used_blocks_now(), eng.busy_energy_now()[0], nxt))
    for t in looks:
        eng.clock.call_at(t, look, priority=look_priority)
    for t, fn in calls:
        eng.clock.call_at(t, fn, eng, priority=look_priority)
    eng.clock._now = 0.5
    eng.wake()
    eng.clock.run()
    assert all(r.state == DONE for r in res.values())
    return eng, rule, {k: (r.token_times.tolist(), r.finish_s) for k, r in res.items()}, seen


def test_timer_groups_by_hand():
    """Three timers with different phases, by hand (0.25-s steps, max_wait_s 0.5): at 0.5 A is ready (0 + 0.5),
    B (0.5625) and C (0.625) not: A runs 0.5 -> 0.75; both B and C became ready during it: B and C run together
    0.75 -> 1.0; nothing is ready at 1.0 (A at 1.25, B and C at 1.5): idle, A's timer at 1.25: A 1.25 -> 1.5;
    B and C ready at 1.5 = the end: 1.5 -> 1.75; idle to 2.0: A 2.0 -> 2.25, B and C 2.25 -> 2.5 (B's third
    token: B finishes). At 2.5 A is ready at 2.75, C at 3.0: A 2.75 -> 3.0 (A's fourth: finishes), C 3.0 -> 3.25,
    idle to 3.75, C 3.75 -> 4.0 (its fifth: finishes). 9 steps, 2.25 s busy, 12 tokens; the steps' (batch,
    context) are (1, 4), (2, 8), (1, 5), (2, 10), (1, 6), (2, 12), (1, 7), (1, 7), (1, 8).

    Events with the timer groups: the step begin at 0.5 (one run of 6 steps to B's finish), the timer its plan
    armed for B at 0.5625 (ignored inside the run), the run's end at 2.5, A's timer at 2.75 (its step: one
    step, A finishes; its plan arms C's timer at 3.0, which fires just before that step's end), its end at
    3.0, and the end at 4.0 of C's run of 2 steps: 7. Without them (one timer group at a time only, as main):
    the same times and steps, more events."""
    times = {"A": ([0.75, 1.5, 2.25, 3.0], 3.0), "B": ([1.0, 1.75, 2.5], 2.5), "C": ([1.0, 1.75, 2.5, 3.25, 4.0], 4.0)}
    calls = [(1, 4), (2, 8), (1, 5), (2, 10), (1, 6), (2, 12), (1, 7), (1, 7), (1, 8)]
    out = {}
    for on in (True, False):
        eng, rule, res, _ = _three_types(on)
        assert res == times
        assert [(c[2], c[3]) for c in eng.perf.calls] == calls
        assert eng.steps == 9 and eng.busy_s == 2.25 and eng.decode_tokens == 12 and eng.preemptions == 0
        assert eng._timer_at is None and eng.clock.pending() == 0 and not eng._paced_own_timers
        out[on] = (eng.clock.events, rule.plans)
    assert out[True][0] == 7 and out[False][0] > 7 and out[True][1] < out[False][1]


@pytest.mark.parametrize("c_idle", [0.125, 0.3])
@pytest.mark.parametrize("arrival_at", [1.1, 1.3, 1.5, 2.4, 0.5625])
def test_an_arrival_cuts_a_timer_groups_run(arrival_at, c_idle):
    """D (type 0, 2 outputs) arrives between two steps of the run (1.1: idle between 1.0 and A's timer at
    1.25), inside one (1.3, 2.4), at a step's begin (1.5) and at the instant of a timer the run had armed
    (0.5625): every token time, step, and what an observer reads at 0.1-s ticks (KV blocks in use, busy time,
    the engine's next event) are those of the run without timer groups; no more events, fewer where the run got
    past its first steps. With C idle since 0.3 its timer (0.8) falls inside B's step 0.75 -> 1.0, an event of its own that
    the run's observers must see (``paced_event_after``)."""
    looks = [round(0.55 + 0.1 * i, 2) for i in range(40)]
    a = _three_types(True, arrival_at, looks, c_idle)
    b = _three_types(False, arrival_at, looks, c_idle)
    assert a[2] == b[2] and a[3] == b[3] and len(a[3]) == len(looks)
    assert (a[0].steps, a[0].busy_s, a[0].decode_tokens) == (b[0].steps, b[0].busy_s, b[0].decode_tokens)
    assert a[0].clock.events <= b[0].clock.events and (arrival_at < 1 or a[0].clock.events < b[0].clock.events)


def test_an_engine_event_before_a_timer_step_of_the_run():
    """An ``ENGINE``-priority event (a KV transfer landing, another engine's step end) due at the instant one of
    the run's steps begins, queued before: one event per step runs it before that step begins, whichever of it
    and the engine's timer was queued first (a timer or step end with an ``ENGINE`` event due at its instant
    queues the step's begin after it instead of running it inline), so the run treats that step as not begun.

    D (type 0, prompt 4, 2 outputs) arrives at 2.0 by such an event, queued at the start (before A's timer at
    2.0, which the step ending at 1.75 armed). By hand (``test_timer_groups_by_hand``'s steps up to B+C
    1.5 -> 1.75): at 2.0 D is submitted to the idle engine, then A's timer fires, then the step begins: type 0 is
    eligible by A's timeout (idle since 1.5), so A decodes and D's prefill runs, 2.0 -> 2.25 (A's third token,
    D's first); B and C are ready at 1.75 + 0.5 = 2.25: 2.25 -> 2.5 (B's third: finishes); A and D ready at
    2.75, C at 3.0: A+D 2.75 -> 3.0 (both finish), C 3.0 -> 3.25, idle, 3.75 -> 4.0 (C finishes). 9 steps,
    2.25 s busy, 14 tokens sampled. (With D's submit after A's timer, priority 1, A's step 2.0 -> 2.25 runs alone
    and D's first token waits for 2.75: A finishes at 2.75; the run treated this case so before, whatever the
    priority.)

    Observers of the same priority, queued at the start, read at 2.0 the KV blocks of the steps begun before
    that step -- 12 held + A's 2 tokens (steps from 0.5, 1.25) + B's and C's 2 each (0.75, 1.5) = 18 -- and at
    1.5, where A's step ends and B and C's begins, 12 + 2 (A: 0.5, 1.25) + 2 (B, C: 0.75) = 16, whichever of
    them and the end event runs first (after it, the end queues the next begin instead of running it
    inline); at priority 2 (after the engine's events) the steps beginning at their instant counted too:
    16 + 2 (B and C from 1.5) = 18 and 18 + 1 (A from 2.0) = 19. Each the same with and without timer groups."""
    times = {"A": ([0.75, 1.5, 2.25, 3.0], 3.0), "B": ([1.0, 1.75, 2.5], 2.5),
             "C": ([1.0, 1.75, 2.5, 3.25, 4.0], 4.0), "D": ([2.25, 3.0], 3.0)}
    for on in (True, False):
        eng, _, res, _ = _three_types(on, 2.0, arrival_priority=0)
        assert res == times
        assert eng.steps == 9 and eng.busy_s == 2.25 and eng.decode_tokens == 14
    for prio, kv in ((0, [16, 18]), (2, [18, 19])):
        for on in (True, False):
            seen = _three_types(on, looks=[1.5, 2.0], look_priority=prio)[3]
            assert [k for _, k, _, _ in seen] == kv


@pytest.mark.parametrize("capacity", [16, 18, 20])
def test_a_timer_groups_run_stops_at_the_kv_blocks(capacity):
    """The case of ``test_timer_groups_by_hand`` with 16-20 blocks of 1 token: the residents hold 12 and need 12
    more for their tokens (A 4, B 3, C 5), so some step cannot get its blocks and preempts (the last admitted, C,
    first); the run stops before the step whose growth exceeds the blocks available, and that step preempts as
    one event per step does: the same token times, steps and preemptions as without timer groups."""
    a = _three_types(True, capacity=capacity)
    b = _three_types(False, capacity=capacity)
    assert a[2] == b[2]
    assert (a[0].steps, a[0].busy_s, a[0].preemptions) == (b[0].steps, b[0].busy_s, b[0].preemptions)
    assert a[0].preemptions > 0 and a[0].clock.events <= b[0].clock.events


@pytest.mark.parametrize("capacity", [1000, 8])
def test_one_timer_group_by_hand(monkeypatch, capacity):
    """One type's residents only (A: 5 outputs, idle since 0; 0.25-s steps, max_wait_s 0.5): the rule states one
    timer group; A runs 0.5 -> 0.75, then every 0.75 s (0.5 idle + the step): 1.25 -> 1.5, 2.0 -> 2.25, 2.75 -> 3.0
    (its fourth token: finishes). With 1000 blocks of 1 token the run's growth (at most 256 tokens) fits whatever
    the steps: the engine runs the group as its one-group loop (no KV check, ``_paced_group_steps`` not called);
    with 8 blocks (4 held, 4 available, exactly A's 4 tokens) it checks each step's blocks
    (``_paced_group_steps``). Either way the same steps, and observers at 1.0, 2.0, 2.5 and 3.0 (after the
    engine's events at that instant) read, by hand, (KV blocks = 4 + steps begun, busy s = 0.25 x steps ended):
    (5, 0.25), (7, 0.5) (the step beginning at 2.0 counted), (7, 0.75), (0, 1.0) (A finished at 3.0, its
    blocks freed); and the same as the run without timer groups."""
    from harness.sim.engine import Engine
    grouped = []
    orig = Engine._paced_group_steps

    def spy(self, *a):
        grouped.append(1)
        return orig(self, *a)
    monkeypatch.setattr(Engine, "_paced_group_steps", spy)
    looks = [1.0, 2.0, 2.5, 3.0]
    eng, _, res, seen = _three_types(True, looks=looks, capacity=capacity, only="A")
    assert res == {"A": ([0.75, 1.5, 2.25, 3.0], 3.0)}
    assert [(now, kv, busy) for now, kv, busy, _ in seen] == [(1.0, 5, 0.25), (2.0, 7, 0.5), (2.5, 7, 0.75),
                                                            (3.0, 0, 1.0)]
    assert eng.steps == 4 and eng.busy_s == 1.0 and eng.decode_tokens == 4 and bool(grouped) == (capacity == 8)
    off = _three_types(False, looks=looks, capacity=capacity, only="A")
    assert off[2] == res and off[3] == seen


@pytest.mark.parametrize("fold", [False, True])
def test_a_sample_reads_the_loads_the_controller_reads_and_the_energy_to_its_instant(monkeypatch, fold):
    """``SimBackend.observe`` (the 1-s samples one event per tick; it reads each engine in one pass) and, with the
    ticks folded, ``SimBackend.observe_at`` at a tick's own instant give, at every tick of a WAIT run in the
    timeout-paced regime, the ``(kv_used_tokens, num_running, num_waiting)`` that ``observe_load`` (the
    controller's view) gives at the same instant and ``instance_energy_j`` up to that instant. (The folded grid
    points after it: ``tests/test_fold_ticks.py``.)"""
    from harness.run.session import session_input, simulate
    from harness.sim.backend import SimBackend
    from tests.conftest import compose_run
    from tests.test_invariants import workload
    own, own_at = SimBackend.observe, SimBackend.observe_at
    seen = []

    def check(self, states):
        now = self.clock.now()
        loads = [tuple(s[:3]) for s in states]
        assert loads == list(map(tuple, self.observe_load()))
        assert [s[3] for s in states] == [self.instance_energy_j(i, now) for i in range(len(states))]
        seen.append(sum(s[1] for s in states))

    def observe(self):
        states = own(self)
        check(self, [(s.kv_used_tokens, s.num_running, s.num_waiting, s.energy_j) for s in states])
        return states

    def observe_at(self, times):
        columns = own_at(self, times)
        assert times[0] == self.clock.now()
        check(self, [(kv[0], running, waiting, energy[0]) for kv, running, waiting, energy in columns])
        return columns
    monkeypatch.setattr(SimBackend, "observe", observe)
    monkeypatch.setattr(SimBackend, "observe_at", observe_at)
    monkeypatch.setattr(SimBackend, "fold_ticks", fold)
    cfg = compose_run(["scheduler=wait", "engine.activation_reserve_bytes=268435456"])
    convs, stats = workload(cfg, n=8, rate=0.05, max_turns=5, max_context=20000)
    res = simulate(session_input(cfg), convs, stats, "wait", cfg.scheduler, sample_interval_s=1.0)
    assert not res.error and len(seen) > 100 and max(seen) > 0    # ticks inside runs, with requests running
