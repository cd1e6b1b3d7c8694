"""vLLM's request events in the simulated engine (issue 49, one clock): a request is QUEUED at the first engine step
boundary at or after it reaches the engine (vLLM's engine core adds requests only between steps), SCHEDULED by the
step that first schedules it; the API front end (``HardwareConfig.api_frontend_s``) delays its arrival at the engine.
The times expected are the step boundaries the engine's own first-token and finish stamps show, by the event rules,
not the step model's prices."""

from __future__ import annotations

import dataclasses

import pytest

from harness.core.clock import SimClock
from harness.core.profiles import EngineConfig
from harness.sim.engine import Engine, Request
from harness.sim.perf import PerfModel
from harness.tools.inputs import load_profile
from tests.test_fidelity_steps import TINY


def make_engine(clock):
    perf = PerfModel(load_profile("cpu"), TINY)
    return Engine(0, "e0", clock, perf, EngineConfig(block_size=16), 10_000, lambda r, why: None)


def req(name, prompt=256, out=4):
    return Request(name, 0, prompt, out, (0,), on_first_token=lambda r: None, on_finish=lambda r: None)


def test_queued_at_the_first_step_boundary_at_or_after_arrival():
    clock = SimClock()
    eng = make_engine(clock)
    a, b, c, d = req("a"), req("b"), req("c"), req("d")
    clock.call_at(0.0, eng.submit, a)           # an idle engine: queued at once, and its step starts now
    clock.call_at(0.0, eng.submit, b)           # the same instant, after that step began: queued at that boundary
    clock.call_at(1e-4, eng.submit, c)          # during a's prefill step: queued when that step ends
    clock.run(60.0, 10**6)
    assert a.queued_s == a.scheduled_s == 0.0
    assert b.queued_s == 0.0
    # a's prefill step ends at a's first token; c (and b, left out of a step already begun) are scheduled by the
    # next step, which begins at that boundary
    assert c.queued_s == pytest.approx(a.first_token_s) and c.queued_s > 1e-4
    assert b.scheduled_s == c.scheduled_s == c.queued_s
    # much later, the engine idle again: queued on arrival
    t = a.finish_s + 1.0
    clock.call_at(t, eng.submit, d)
    clock.run(120.0, 10**6)
    assert d.queued_s == d.scheduled_s == t
    assert all(r.first_token_s > r.scheduled_s for r in (a, b, c, d))


def test_the_api_front_end_delays_the_arrival_at_the_engine(tmp_path):
    from harness.core.backend import TurnJob
    from harness.core.profiles import LinkConfig
    from harness.sim.backend import SimBackend
    from types import SimpleNamespace
    hw = dataclasses.replace(load_profile("cpu"), api_frontend_s=0.005)
    be = SimBackend([("e0", "collocated", hw)], TINY, EngineConfig(block_size=16), LinkConfig())
    done = []
    job = TurnJob("c0", 0, 256, 4, (0,), SimpleNamespace(disaggregated=False, decode_instance=0, prefill_instance=0),
                  on_prefill_done=lambda j: None, on_finish=done.append, on_fail=lambda j, w: None)
    be.clock.call_at(0.25, be.start_turn, job)
    be.clock.run(60.0, 10**6)
    assert done == [job] and job.start_s == 0.25
    # an idle engine: queued and scheduled the moment the front end hands it over
    assert job.engine_queued_s == job.engine_scheduled_s == pytest.approx(0.255)
    assert job.first_token_s > job.engine_scheduled_s


def test_the_busy_timeline_terms_lengthen_the_steps_they_name():
    """``between_step_s`` is added to every step (a decode step and a prefill step alike); ``after_idle_s[k]`` to the
    first step after an idle gap in band k (``AFTER_IDLE_BANDS_S``: 30 ms is in [10 ms, 50 ms), 0.2 s in
    [50 ms, 0.5 s)), not to a step that follows another at once."""
    from harness.core.profiles import AFTER_IDLE_BANDS_S
    assert AFTER_IDLE_BANDS_S[:2] == (0.01, 0.05)
    base = load_profile("cpu")
    plain, timed = PerfModel(base, TINY), PerfModel(dataclasses.replace(base, between_step_s=1.5e-4), TINY)
    assert timed.decode_step(3, 900).time_s - plain.decode_step(3, 900).time_s == pytest.approx(1.5e-4)
    assert timed.step(100, 5050.0, 0, 1, 2, 600).time_s - plain.step(100, 5050.0, 0, 1, 2, 600).time_s == \
        pytest.approx(1.5e-4)

    def first_step_after(gap_s, after):
        clock = SimClock()
        hw = dataclasses.replace(base, after_idle_s=after)
        eng = Engine(0, "e0", clock, PerfModel(hw, TINY), EngineConfig(block_size=16), 10_000, lambda r, w: None)
        a, b = req("a"), req("b")
        clock.call_at(0.0, eng.submit, a)
        clock.run(60.0, 10**6)
        clock.call_at(a.finish_s + gap_s, eng.submit, b)
        clock.run(120.0, 10**6)
        return b.first_token_s - b.scheduled_s, a.token_times[2] - a.token_times[1]

    ref, ref_dec = first_step_after(0.03, [])
    t, dec = first_step_after(0.03, [1e-3, 2e-3])
    assert t - ref == pytest.approx(1e-3) and dec == pytest.approx(ref_dec)   # a busy decode step: no extra
    t, _ = first_step_after(0.2, [1e-3, 2e-3])
    assert t - ref == pytest.approx(2e-3)
    t, _ = first_step_after(0.005, [1e-3, 2e-3])     # under the first band
    assert t == pytest.approx(ref)
