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
    loop stops at B's finish, before 8). Four events more than priced whole (7 -> 11: the two extensions and the
    two end events they moved, each popped once), the
    same 9 steps priced (none in vain: nothing cuts the run), the same token times, and observers at 0.6, 0.8,
    1.2, 1.5, 2.4 (after the engine's events there) read the same (KV blocks 12 + the tokens of the steps
    begun, busy 0.25 s a step ended): (13, 0), (15, 0.25), (15, 0.5), (18, 0.75) -- A's step from 1.25 and
    B and C's from 1.5 begun --, (21, 1.25)."""
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
    assert (whole[0].clock.events, parts[0].clock.events) == (7 + len(looks), 11 + len(looks))


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
