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
