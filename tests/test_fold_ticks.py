"""The observer's ticks folded (issue 54, WAIT's cost per call): ``SimBackend.drive`` samples the grid points
before the clock's next event in one call (``on_tick(times)``, ``SimBackend.observe_at``, ``Engine.observe_at``,
``Recorder.sample_at``) instead of one event per tick. The samples must be those of one event per tick
(``SimBackend.fold_ticks = False``): the same times, values and parquet bytes, the same event count; checked
by hand on an engine's timeout-paced run and on the drive's grid (an event at a grid point ends the fold, ticks
run after the events at their instant, none past ``max_sim_time_s``), and against the unfolded path on small
WAIT, Nested WAIT and ConServe runs.
"""

from __future__ import annotations

import io
import math

import pytest

from harness.core.clock import Priority
from harness.core.profiles import EngineConfig, LinkConfig
from harness.sim.backend import SimBackend
from harness.tools.inputs import load_profile
from tests.test_fidelity_steps import TINY
from tests.test_wait_speed import _three_types


def test_an_engine_reads_a_paced_run_ahead_by_hand():
    """``tests/test_wait_speed.py``'s three-type run by hand (block size 1, 12 blocks held at 0.5, 0.25-s steps:
    A 0.5 -> 0.75, B+C 0.75 -> 1.0, A 1.25 -> 1.5, B+C 1.5 -> 1.75, A 2.0 -> 2.25, B+C 2.25 -> 2.5, one event
    for the six; the plan's timer at 0.5625 the last event before the run's end at 2.5). Read at 0.6 for 0.6,
    0.8, 1.2, 1.5, 2.4 (``Engine.observe_at``: KV blocks = 12 + the tokens of the steps begun, busy s = 0.25 a
    step ended, no energy in the stub model): (13, 0), (15, 0.25), (15, 0.5), (18, 0.75) -- A's step from 1.25
    and B and C's from 1.5 begun --, (21, 1.25); the same as one read at each instant, and what it reads at
    0.6 for 0.6 alone."""
    times = [0.6, 0.8, 1.2, 1.5, 2.4]
    got = []
    eng, _, _, seen = _three_types(True, looks=times, calls=[(0.6, lambda e: got.append(e.observe_at(times))),
                                                             (0.6, lambda e: got.append(e.observe_at(times[:1])))])
    assert got[0] == [(13, 0.0, 0.0), (15, 0.25, 0.0), (15, 0.5, 0.0), (18, 0.75, 0.0), (21, 1.25, 0.0)]
    assert [(u, b) for u, b, _ in got[0]] == [(kv, busy) for _, kv, busy, _ in seen]
    assert got[1] == got[0][:1]


def test_an_idle_engine_reads_the_same_at_every_instant():
    """Outside a run (no step in flight: the engine idle after the three-type run ended at 4.0 s) nothing moves:
    the blocks held and the counters (2.25 s busy: 9 steps of 0.25 s) at every time."""
    got = []
    _three_types(True, calls=[(5.0, lambda e: got.append(e.observe_at([5.0, 6.0, 9.5])))])
    assert got == [[(0, 2.25, 0.0)] * 3]


def _grid_run(fold: bool, until: float = math.inf):
    """A one-engine cluster (the CPU profile, an idle engine whose run reports an event every 0.5 s, as a
    timeout-paced run's steps do, so that no grid point is skipped) ticked every 1 s; controller events at 3.0
    (state 1, at a grid point: before the tick there), 4.5 (state 2) and 6.0 (state 3, the last: done). Returns
    the samples ``(t, state, energy J)``, the ``on_tick`` calls' sizes, the clock's events, the drive's reason
    and the instance's idle power (W)."""
    hw = load_profile("cpu")
    be = SimBackend([("e0", "collocated", hw)], TINY, EngineConfig(block_size=16), LinkConfig(), max_sim_time_s=until)
    be.fold_ticks = fold
    be.engines[0].paced_event_after = lambda now: now + 0.5
    clock, state, samples, sizes = be.clock, [0], [], []

    def on_tick(times=None):
        if times is None:
            sizes.append(0)
            samples.append((clock.now(), state[0], be.observe()[0].energy_j))
            return
        sizes.append(len(times))
        samples.extend((t, state[0], e) for t, e in zip(times, be.observe_at(times)[0][3], strict=True))

    def start():
        for t, s in ((3.0, 1), (4.5, 2), (6.0, 3)):
            clock.call_at(t, state.__setitem__, 0, s, priority=Priority.CONTROL)
    reason = be.drive(start, lambda: state[0] == 3, on_tick, 1.0)
    return samples, sizes, clock.events, reason, hw.idle_w


@pytest.mark.parametrize("until", [math.inf, 4.5, 1.5])
def test_the_drive_folds_the_ticks_before_the_next_event_by_hand(until):
    """By hand: the tick at 0 takes 1 and 2 (before the event at 3.0), not 3 (the event's instant: the tick
    there runs after it, state 1); the one at 3 takes 4 (before 4.5), not 5; the one at 5 takes nothing more (6
    is the next event's instant: it samples alone); the one at 6, after it, sees the run done and samples alone. Samples (t,
    state): (0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 2), (6, 3); the idle energy idle_w x t. 10 events (3 of
    the controller, 7 ticks) counted either way; folded, 4 ``on_tick`` calls. With ``max_sim_time_s`` 4.5 the
    ticks stop at 4 (the one at 5 is past it; the event at 4.5 runs), and the drive says so; with 1.5 the tick at
    0 takes 1, not 2 (before the next event, but past the limit)."""
    flat, sizes0, events0, reason0, idle_w = _grid_run(False, until)
    folded, sizes, events, reason, _ = _grid_run(True, until)
    expect = [(0.0, 0), (1.0, 0), (2.0, 0), (3.0, 1), (4.0, 1), (5.0, 2), (6.0, 3)]
    if until == 4.5:
        expect = expect[:5]
        assert reason.startswith("simulated time reached backend.max_sim_time_s=4.5")
        assert sizes == [3, 2] and events == 5 + 2      # 5 ticks, the events at 3.0 and 4.5
    elif until == 1.5:
        expect = expect[:2]
        assert reason.startswith("simulated time reached backend.max_sim_time_s=1.5")
        assert sizes == [2] and events == 2
    else:
        assert reason == ""
        assert sizes == [3, 2, 0, 0] and events == 10    # (a tick that folds nothing samples through observe)
    assert [(t, s) for t, s, _ in folded] == expect and [e for _, _, e in folded] == [idle_w * t for t, _ in expect]
    assert folded == flat and (events, reason) == (events0, reason0) and set(sizes0) == {0}


@pytest.mark.parametrize("sched", ["wait", "nested_wait", "conserve"])
def test_folded_ticks_write_the_samples_of_one_event_per_tick(monkeypatch, sched):
    """A small run (8 conversations, 5 turns each, 0.05 conv/s, 1-s samples) with the ticks folded and with one
    event per tick: ``instances.parquet``'s bytes, the turns and the event count the same; WAIT's and Nested
    WAIT's timeout-paced runs fold ticks (some ``on_tick`` takes several times)."""
    from harness.run.session import session_input, simulate
    from tests.conftest import compose_run
    from tests.test_invariants import workload
    cfg = compose_run([f"scheduler={sched}", "engine.activation_reserve_bytes=268435456"])
    convs, stats = workload(cfg, n=8, rate=0.05, max_turns=5, max_context=20000)
    own_at, sizes = SimBackend.observe_at, []

    def observe_at(self, times):
        sizes.append(len(times))
        return own_at(self, times)
    monkeypatch.setattr(SimBackend, "observe_at", observe_at)
    out = {}
    for fold in (True, False):
        monkeypatch.setattr(SimBackend, "fold_ticks", fold)
        res = simulate(session_input(cfg), convs, stats, sched, cfg.scheduler, sample_interval_s=1.0)
        assert not res.error
        buf = io.BytesIO()
        frame = res.recorder.instances_frame()
        frame.to_parquet(buf, index=False)
        out[fold] = (buf.getvalue(), res.recorder.turns_frame(), res.events, len(frame))
    assert out[True][0] == out[False][0] and out[True][1].equals(out[False][1]) and out[True][2:] == out[False][2:]
    assert out[True][3] > 100
    if sched != "conserve":
        assert max(sizes) > 1
