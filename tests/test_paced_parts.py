"""A timeout-paced run priced in parts (issue 54): ``Engine._plan_paced_run`` prices the first
``PACED_FIRST_STEPS`` steps of a run; at the begin of its last priced step (``Engine._paced_extend``) the run's
step loop goes on for twice as many, so a run that an arrival cuts leaves fewer steps priced in vain. The
steps, token times and what observers read are those of the run priced whole (and of the run without timer
groups); checked by hand on the three-type case of ``tests/test_wait_speed.py`` with parts of 2 steps.
"""

from __future__ import annotations

import pytest

import harness.sim.engine as engine_mod
from tests.test_wait_speed import _three_types

TIMES = {"A": ([0.75, 1.5, 2.25, 3.0], 3.0), "B": ([1.0, 1.75, 2.5], 2.5), "C": ([1.0, 1.75, 2.5, 3.25, 4.0], 4.0)}


def test_a_run_priced_in_parts_by_hand(monkeypatch):
    """``test_timer_groups_by_hand``'s run of 6 steps from 0.5 (A 0.5 -> 0.75, B+C 0.75 -> 1.0, A 1.25 -> 1.5,
    B+C 1.5 -> 1.75, A 2.0 -> 2.25, B+C 2.25 -> 2.5: B finishes) priced 2 steps at a time: the first 2 at 0.5;
    at 0.75 (the begin of the last priced step) 2 more (the part doubles to 4 steps); at 1.5 the last 2 (the
    loop stops at B's finish, before 8), where the run's end event (2.5) is queued, its last step known. Two
    events more than priced whole (7 -> 9: the two extensions), the same 9 steps priced (none in vain: nothing
    cuts the run), the same token times, and observers at 0.6, 0.8, 1.2, 1.5, 2.4 (after the engine's events
    there) read the same (KV blocks 12 + the tokens of the steps begun, busy 0.25 s a step ended): (13, 0),
    (15, 0.25), (15, 0.5), (18, 0.75) -- A's step from 1.25 and B and C's from 1.5 begun --, (21, 1.25)."""
    looks = [0.6, 0.8, 1.2, 1.5, 2.4]
    whole = _three_types(True, looks=looks)
    monkeypatch.setattr(engine_mod, "PACED_FIRST_STEPS", 2)
    parts = _three_types(True, looks=looks)
    for eng, _, res, seen in (whole, parts):
        assert res == TIMES
        assert [(now, kv, busy) for now, kv, busy, _ in seen] == [(0.6, 13, 0.0), (0.8, 15, 0.25), (1.2, 15, 0.5),
                                                                (1.5, 18, 0.75), (2.4, 21, 1.25)]
        assert eng.steps == 9 and eng.busy_s == 2.25 and len(eng.perf.calls) == 9
    assert whole[3] == parts[3]
    assert (whole[0].clock.events, parts[0].clock.events) == (7 + len(looks), 9 + len(looks))


@pytest.mark.parametrize(("arrival_at", "arrival_priority"), [
    (0.6, 1), (0.75, 0), (0.75, 1), (1.1, 1), (1.5, 0), (1.5, 1), (1.6, 1), (2.0, 0), (2.0, 1), (2.25, 1)])
def test_an_arrival_cuts_a_run_priced_in_parts(monkeypatch, arrival_at, arrival_priority):
    """D (type 0, 2 outputs) arrives inside the first part (0.6), at the instants of the extensions (0.75, 1.5:
    with priority 0 queued before them, so the cut comes first and nothing more is priced; with priority 1
    after them), between steps (1.1), at A's timer (2.0: with priority 0 before the step it begins,
    ``tests/test_wait_speed.py::test_an_engine_event_before_a_timer_step_of_the_run``; with 1 after it) and inside
    a step of the second and third part (1.6,
    2.25): token
    times, steps, busy time and what observers read at 0.1-s ticks equal the run without timer groups; the
    run priced whole prices at least as many steps. By hand at 1.1 (between B+C's step ending at 1.0 and A's
    timer at 1.25; the run's first two steps kept): priced whole, its 6 steps were priced (4 in vain); in
    parts, 4 (2 in vain: the part priced at 0.75): 2 steps fewer."""
    looks = [round(0.55 + 0.1 * i, 2) for i in range(40)]
    whole = _three_types(True, arrival_at, looks, arrival_priority=arrival_priority)
    monkeypatch.setattr(engine_mod, "PACED_FIRST_STEPS", 2)
    parts = _three_types(True, arrival_at, looks, arrival_priority=arrival_priority)
    off = _three_types(False, arrival_at, looks, arrival_priority=arrival_priority)
    for eng, _, res, seen in (whole, parts):
        assert res == off[2] and seen == off[3] and len(seen) == len(looks)
        assert (eng.steps, eng.busy_s, eng.decode_tokens) == (off[0].steps, off[0].busy_s, off[0].decode_tokens)
    assert len(parts[0].perf.calls) <= len(whole[0].perf.calls)
    if arrival_at == 1.1:
        assert len(whole[0].perf.calls) - len(parts[0].perf.calls) == 2


def _two_types(monkeypatch, groups_on: bool, out: int = 300):
    """Two residents of two WAIT types (n = 2 each, max_wait_s 0.5; block size 1, 10,000 blocks, 0.25-s steps
    whatever the batch), at stage 1 (prompt 4): A idle since 0, B since 0.0625, ``out`` outputs each; the engine
    starts at 0.5. Returns the engine, the token times of A and B, and each ``_paced_extend`` call's (time, steps
    priced before, after). ``groups_on=False`` strips the rule's ``timer_groups``."""
    import dataclasses

    from baselines.wait.fluid_admission import WaitRule
    from harness.sim.engine import Engine
    from tests.test_batching import StubPerf, make_engine, resident
    calls = []
    orig = Engine._paced_extend

    def spy(self, version):
        n0 = len(self._run_ends)
        orig(self, version)
        if version == self._version:
            calls.append((self.clock.now(), n0, len(self._run_ends)))
    monkeypatch.setattr(Engine, "_paced_extend", spy)
    eng = make_engine(10_000, StubPerf(0.25), max_coalesce_s=0.25)
    rule = WaitRule([2, 2], lambda r: 0 if r.conv == "A" else 1, 0.5)
    if not groups_on:
        plan = rule.plan
        rule.plan = lambda inp: dataclasses.replace(plan(inp), timer_groups=None)
    eng.set_rule(rule)
    a, b = (resident(eng, name, 4, 1, out_target=out) for name in "AB")
    b.idle_since_s = 0.0625
    eng.clock._now = 0.5
    eng.wake()
    eng.clock.run()
    return eng, a.token_times.tolist(), b.token_times.tolist(), calls


def test_a_run_of_the_most_steps_is_priced_in_three_extensions(monkeypatch):
    """A run of ``PACED_GROUP_STEPS`` = 256 steps is priced as 32 + 32 + 64 + 128 steps: at the begins of its steps
    32, 64 and 128 (the last priced), and no extension at step 256's begin (the loop's last step: nothing more to
    price; the run's end event is queued there where the step is known). By hand: A runs 0.5 -> 0.75, B (ready
    at 0.5625) 0.75 -> 1.0, then each every 0.75 s (A ready at its end + 0.5 = 1.25, B at 1.5): step ``j`` of the
    run begins at 0.5 + 0.75 i (A, j = 2i) or 0.75 + 0.75 i (B, j = 2i + 1); the extensions at steps 31, 63, 127
    (B's, i = 15, 31, 63): 12.0, 24.0, 48.0. The run ends with step 255 (B, 96.0 -> 96.25); A's timer at 96.5
    begins the next run, whose first extension is at its step 31 (B, i = 143): 108.0. A's 299 tokens at
    0.75 + 0.75 i, B's at 1.0 + 0.75 i (exact binary fractions): the same with ``timer_groups`` stripped."""
    eng, a, b, calls = _two_types(monkeypatch, True)
    assert a == [0.75 + 0.75 * i for i in range(299)] and b == [1.0 + 0.75 * i for i in range(299)]
    assert calls[:4] == [(12.0, 32, 64), (24.0, 64, 128), (48.0, 128, 256), (108.0, 32, 64)]
    assert eng.steps == 598 and eng.busy_s == 598 * 0.25
    off = _two_types(monkeypatch, False)
    assert off[1:3] == (a, b) and off[0].steps == eng.steps and off[0].clock.events > eng.clock.events
