"""WAIT's cost per call, sixth round (issue 54): a timeout-paced step priced through a per-batch pricer
(``StepModel.decode_pricer``), the observer's folded ticks read as columns (``Engine.observe_cols``,
``SimBackend.observe_at``) and written in one comprehension (``Recorder.sample_at``), and a paced run's end adding
only the steps no observer summed (``Engine._step_end`` from ``_busy_sums``). Seventh round (2026-12-07): a paced
step priced inline from ``StepModel.decode_affine`` (``_paced_one_steps``, ``_paced_free_steps``,
``_paced_two_steps``), a read's KV blocks from ``_paced_kv_steps``, the folded samples from ``Engine.sample_cols``,
the rule's timers at a run's end in one pass (``_paced_timer_state``). Each must give what the path it replaces
gave: checked here against values worked out by hand, against the path it replaces (kept in a test where it is
gone) and against one event per step (the rule's ``timer_groups`` stripped); ``tests/test_fold_ticks.py`` and
``tests/test_wait_speed.py`` check the whole runs.
"""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.core.backend import InstanceInfo, InstanceState
from harness.core.profiles import HardwareConfig, ModelConfig
from harness.core.recorder import Recorder
from harness.sim.perf import PerfModel
from harness.sim.step_model import StepCost
from tests.test_batching import StubPerf
from tests.test_wait_speed import _three_types

ROOT = Path(__file__).resolve().parents[1]


def _load(cls, path: Path):
    raw = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if k != "defaults"}
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), raw))


@pytest.mark.parametrize("cap_w", [None, 150.0])
def test_the_pricer_prices_a_step_as_decode_one_by_hand(cap_w):
    """``PerfModel.decode_pricer(b)(ctx)`` is ``decode_run_total(b, ctx, 1, inf)`` of one step bit for bit, with the
    power cap free (the plain step, bound per batch) and binding (150 W under the A40's 300 W TDP: the general
    loop); where plain, by hand: time ``base_s + kv_s * (ctx + b)``, energy ``idle_w * time + (tdp - idle) *
    (busy0 + memory_power_frac * kv_s * (ctx + b))``. One pricer per batch size (memoised)."""
    a40 = _load(HardwareConfig, ROOT / "conf" / "hardware" / "a40.yaml")
    llama = _load(ModelConfig, ROOT / "conf" / "model" / "llama2_7b.yaml")
    perf = PerfModel(dataclasses.replace(a40, power_cap_w=cap_w), llama)
    for b, ctx in [(1, 0), (1, 10), (3, 4000), (64, 123_457)]:
        price = perf.decode_pricer(b)
        assert perf.decode_pricer(b) is price
        ends, energy = perf.decode_run_total(b, ctx, 1, math.inf)
        assert price(ctx) == (ends[0], energy) == perf.decode_one(b, ctx)
        _, base_s, busy0, plain = perf._run_terms(b)
        assert plain == (cap_w is None)
        if plain:
            hw = perf.hw
            kv_m = perf._kv_s_per_token * (ctx + b)
            step = base_s + kv_m
            assert price(ctx) == (step, hw.idle_w * step + (hw.tdp_w - hw.idle_w) * (busy0 + hw.memory_power_frac * kv_m))


def test_a_step_model_without_a_pricer_prices_through_decode_one():
    """``StepModel.decode_pricer`` by default: ``decode_one`` with the batch bound; a stand-in step model of step
    time ``0.25 + 0.01 * context`` (s, no energy) gives (0.25 + 0.01 * 40, 0) for 3 requests at 40 tokens."""
    price = StubPerf(0.25, 0.01).decode_pricer(3)
    assert price(40) == (0.25 + 0.01 * 40, 0.0)


def _infos():
    return (InstanceInfo(0, "e0", "collocated", "a40", 1000), InstanceInfo(1, "e1", "collocated", "a40", 2000))


def test_the_folded_samples_are_rows_by_hand():
    """``Recorder.sample_at`` of two instances at 1, 2, 3 s from columns (KV tokens and energy per time, the counts
    once): per time, e0's row then e1's, KV as a fraction of capacity (100 / 1000 = 0.1, ...), the power given; the
    same ``instances.parquet`` bytes as one ``Recorder.sample`` per time of those states; a column that does not
    hold one value per time is refused (ValueError naming the instance)."""
    times = [1.0, 2.0, 3.0]
    cols = [([100, 200, 300], 2, 1, [10.0, 20.0, 30.0]), ([0, 500, 0], 0, 3, [5.0, 5.5, 6.0])]
    folded, flat = Recorder(lambda c, t: True), Recorder(lambda c, t: True)
    folded.sample_at(times, _infos(), cols, [math.nan, 7.0])
    for k, t in enumerate(times):
        flat.sample(t, _infos(), [InstanceState(kv[k], r, w, e[k]) for kv, r, w, e in cols], [math.nan, 7.0])
    rows = folded.samples
    assert [(r["t_s"], r["instance"], r["kv_used_tokens"], r["kv_capacity_tokens"], r["kv_used_frac"],
             r["num_running"], r["num_waiting"], r["energy_j"], r["role"], r["hardware"]) for r in rows] == [
        (1.0, "e0", 100, 1000, 0.1, 2, 1, 10.0, "collocated", "a40"), (1.0, "e1", 0, 2000, 0.0, 0, 3, 5.0, "collocated", "a40"),
        (2.0, "e0", 200, 1000, 0.2, 2, 1, 20.0, "collocated", "a40"), (2.0, "e1", 500, 2000, 0.25, 0, 3, 5.5, "collocated", "a40"),
        (3.0, "e0", 300, 1000, 0.3, 2, 1, 30.0, "collocated", "a40"), (3.0, "e1", 0, 2000, 0.0, 0, 3, 6.0, "collocated", "a40")]
    assert [math.isnan(r["power_w"]) for r in rows] == [True, False] * 3 and rows[1]["power_w"] == 7.0
    out = []
    for rec in (folded, flat):
        buf = io.BytesIO()
        rec.instances_frame().to_parquet(buf, index=False)
        out.append(buf.getvalue())
    assert out[0] == out[1]
    with pytest.raises(ValueError, match="instance e1"):
        folded.sample_at(times, _infos(), [cols[0], ([0, 500], 0, 3, [5.0, 5.5, 6.0])], [math.nan, 7.0])


class _Joules(StubPerf):
    """``StubPerf`` with energy: every decode step 0.1 s and 0.3 J (neither a binary fraction: a sum's rounding
    depends on its order)."""

    def __init__(self):
        super().__init__(0.1)

    def decode_run(self, b, ctx, kmax, limit_s):
        ends, _ = super().decode_run(b, ctx, kmax, limit_s)
        e, energy = 0.0, []
        for _ in ends:
            e += 0.3
            energy.append(e)
        return ends, energy

    def step(self, *a, **k):
        c = super().step(*a, **k)
        return StepCost(c.time_s, 0.3, 0.0, 0.0)


@pytest.mark.parametrize("looks", [(), (0.55, 0.65, 0.9, 1.35, 1.6, 2.05)])
def test_a_paced_run_ends_with_the_counters_of_one_event_per_step(monkeypatch, looks):
    """``tests/test_wait_speed.py``'s three types (0.1-s, 0.3-J steps here), the timer groups' run against the run
    with them stripped (one event per step), read by observers mid-run or not (their running sums then reused at
    the run's end): the same steps, and busy time and energy the sums of 0.1 s and 0.3 J added one step at a time
    from 0 (by hand: a loop of float additions), bit for bit. With 0.1-s steps no two types share a step: A 0.5 ->
    0.6, B 0.6 -> 0.7, C 0.7 -> 0.8, A 1.1 -> 1.2, ..., B's last 1.8 -> 1.9, C 1.9 -> 2.0, A's last 2.3 -> 2.4, C 2.5 ->
    2.6 and 3.1 -> 3.2: 12 steps; paused steps (the residents each step leaves out) 8 x 2 + 1 + 1 + 0 + 0 = 18 either
    way; the run with the timer groups in fewer events."""
    import tests.test_wait_speed as tw
    monkeypatch.setattr(tw, "StubPerf", lambda a: _Joules())
    on, _, tokens_on, seen_on = _three_types(True, looks=looks)
    off, _, tokens_off, seen_off = _three_types(False, looks=looks)
    assert tokens_on == tokens_off and seen_on == seen_off
    busy = energy = 0.0
    for _ in range(on.steps):
        busy += 0.1
        energy += 0.3
    assert on.steps == off.steps and (on.busy_s, on.energy_busy_j) == (off.busy_s, off.energy_busy_j) == (busy, energy)
    assert on.steps == 12 and on.paused_steps == off.paused_steps == 18 and on.clock.events < off.clock.events


def test_the_blocks_a_paced_run_takes_as_steps_by_hand():
    """``Engine._paced_kv_steps`` (seventh round, 2026-12-07: one bisect per read instead of a division per request and
    read): block size 4; group 0 = r0 (5 tokens in 2 blocks) run by steps 0, 2, 4, 6; group 1 = r1 (8 tokens in 2
    blocks) and r2 (3 tokens in 2 blocks) run by steps 1, 3, 5. By hand: r0 holds ceil((5 + c) / 4) blocks after c
    of its steps, a third at c = 4 (step 6); r1 a third at c = 1 (step 1); r2 none within 3 steps (ceil(6 / 4) = 2);
    so the entries [1, 6], and ``used_blocks_now``'s count at step j is ``bisect_right([1, 6], j)``: the same as
    adding ``max(0, ceil((computed + c) / 4) - blocks)`` per request at every j (the read it replaces). A request
    holding fewer blocks than its tokens (10 tokens in 1 block) counts its two missing blocks at its group's first
    step and a third at its third (ceil(13 / 4) = 4)."""
    import types
    from bisect import bisect_right
    from harness.sim.engine import Engine

    def req(computed, blocks):
        return types.SimpleNamespace(computed=computed, kv=types.SimpleNamespace(blocks=blocks))

    def per_read(groups, steps_of, j, bs):
        used = 0
        for reqs, steps in zip(groups, steps_of):
            c = bisect_right(steps, j)
            if c:
                for r in reqs:
                    used += max(0, -(-(r.computed + c) // bs) - r.kv.blocks)
        return used

    groups = [[req(5, 2)], [req(8, 2), req(3, 2)]]
    steps_of = [[0, 2, 4, 6], [1, 3, 5]]
    eng = types.SimpleNamespace(bs=4, _paced_groups=groups, _paced_steps_of=steps_of, _paced_kv=None)
    assert Engine._paced_kv_steps(eng) == [1, 6] and eng._paced_kv == [1, 6]
    assert [bisect_right([1, 6], j) for j in range(8)] == [0, 1, 1, 1, 1, 1, 2, 2] == \
        [per_read(groups, steps_of, j, 4) for j in range(8)]
    short = types.SimpleNamespace(bs=4, _paced_groups=[[req(10, 1)], [req(1, 1)]], _paced_steps_of=[[0, 1, 2], []],
                                  _paced_kv=None)
    assert Engine._paced_kv_steps(short) == [0, 0, 2]
    assert [per_read(short._paced_groups, short._paced_steps_of, j, 4) for j in range(3)] == [2, 2, 3]


@pytest.mark.parametrize("cap_w", [None, 150.0])
def test_the_affine_terms_are_the_pricers_by_hand(cap_w):
    """``PerfModel.decode_affine(b)`` (seventh round: a paced step priced inline) states the plain step's terms
    ``(kv_s, base_s, busy0, tdp - idle, idle, memory_power_frac)``; the pricer's values are those terms' formula
    (``0.0 + (base_s + kv_s * (ctx + b))`` s, ``0.0 + (idle * step + dyn_w * (busy0 + mpf * kv_m))`` J) bit for bit;
    where the power cap can bind (150 W on the A40) there are none (``None``: the engine calls the pricer). A step
    model without them (a stand-in) states none."""
    a40 = _load(HardwareConfig, ROOT / "conf" / "hardware" / "a40.yaml")
    llama = _load(ModelConfig, ROOT / "conf" / "model" / "llama2_7b.yaml")
    perf = PerfModel(dataclasses.replace(a40, power_cap_w=cap_w), llama)
    for b, ctx in [(1, 0), (2, 3001), (3, 4000), (64, 123_457)]:
        aff = perf.decode_affine(b)
        if cap_w is not None:
            assert aff is None
            continue
        kv_s, base_s, busy0, dyn_w, idle, mpf = aff
        assert (kv_s, dyn_w, idle, mpf) == (perf._kv_s_per_token, a40.tdp_w - a40.idle_w, a40.idle_w,
                                            a40.memory_power_frac)
        assert (base_s, busy0) == perf._run_terms(b)[1:3]
        kv_m = kv_s * (ctx + b)
        step = base_s + kv_m
        assert perf.decode_pricer(b)(ctx) == (0.0 + step, 0.0 + (idle * step + dyn_w * (busy0 + mpf * kv_m)))
    assert StubPerf(0.25, 0.01).decode_affine(3) is None


@pytest.mark.parametrize("sched", ["wait", "nested_wait"])
def test_paced_steps_priced_inline_are_the_pricers_steps(monkeypatch, sched):
    """A small WAIT / Nested WAIT run (8 conversations, 5 turns each, 1-s samples) on the A40 roofline model, whose
    paced steps are priced inline from ``decode_affine``, against the same run with ``decode_affine`` stating
    nothing (every step through ``decode_pricer``, the sixth round's path): the turns, ``instances.parquet``'s
    bytes and the events the same (checked: a step time off by one part in 1e9 in either inline loop,
    ``_paced_free_steps`` or ``_paced_one_steps``, fails it for WAIT; in the one-group loop for both)."""
    from harness.run.session import session_input, simulate
    from tests.conftest import compose_run
    from tests.test_invariants import workload
    cfg = compose_run([f"scheduler={sched}", "engine.activation_reserve_bytes=268435456"])
    convs, stats = workload(cfg, n=8, rate=0.05, max_turns=5, max_context=20000)
    own, asked = PerfModel.decode_affine, []

    def affine(self, b):
        asked.append(b)
        return own(self, b)
    out = {}
    for inline in (True, False):
        monkeypatch.setattr(PerfModel, "decode_affine", affine if inline else (lambda self, b: None))
        res = simulate(session_input(cfg), convs, stats, sched, cfg.scheduler, sample_interval_s=1.0)
        assert not res.error
        buf = io.BytesIO()
        res.recorder.instances_frame().to_parquet(buf, index=False)
        out[inline] = (buf.getvalue(), res.recorder.turns_frame(), res.events)
    assert asked and out[True][0] == out[False][0] and out[True][1].equals(out[False][1])
    assert out[True][2] == out[False][2]


def _timer_state_stepwise(begins, ends, wakes, ta, now):
    """The rule's timers after a paced run, stated step by step (the sixth round's loop, kept as the oracle): at an
    idle gap a timer due by the previous end fired, the stated empty plan arms the next begin unless a timer
    already falls in the gap, a timer due by a step's begin fires, and a step's plan arms its wake time unless a
    timer already falls before it. Returns the final timer (None: none) and the times armed, in order."""
    armed = []
    for k in range(1, len(ends)):
        e, b = ends[k - 1], begins[k]
        if b > e:
            if ta is not None and ta <= e:
                ta = None
            if not (ta is not None and e < ta <= b):
                ta = b
                armed.append(b)
        if ta is not None and ta <= b:
            ta = None
        w = wakes[k]
        if w != math.inf and not (ta is not None and b < ta <= w):
            ta = w
            armed.append(w)
    return (None if ta is not None and ta <= now else ta), armed


def test_the_timers_a_paced_run_leaves_are_those_stated_step_by_step():
    """``Engine._paced_timer_state`` (seventh round: one pass over the steps with no per-step ``None`` tests) against
    the step-by-step statement on 400 random runs whose times fall on a 0.25-s grid (so that ties occur: a begin at
    the previous end, a wake time at a begin or at the armed timer, a timer at the run's end): the same
    ``_timer_at`` and the same timers queued (those armed after ``now``, in order, each firing ``_timer_fire`` at its
    time); a cut between steps keeps one begin more than the ends. Some runs leave a timer, some queue several."""
    import random
    import types
    from harness.sim.engine import Engine
    left = several = 0
    for seed in range(400):
        rng = random.Random(seed)
        n = rng.randint(2, 12)
        begins, ends, wakes = [], [], []
        t = 0.0
        for _ in range(n):
            b = t + rng.choice([0.0, 0.0, 0.25, 0.5, 1.0])
            e = b + rng.choice([0.25, 0.5])
            begins.append(b)
            ends.append(e)
            wakes.append(rng.choice([math.inf, b + 0.25, b + 0.5, b + 0.75, b + 1.0, b + 3.0]))
            t = e
        if seed % 3 == 0:
            begins.append(t + 0.5)
        ta0 = rng.choice([None, 0.0, 0.25, begins[1], ends[-1] + 0.25, 100.0])
        now = ends[-1]
        queued = []
        clock = types.SimpleNamespace(call_at=lambda t, fn, arg, priority: queued.append((t, arg)))
        eng = types.SimpleNamespace(_paced_begins=begins, _run_ends=ends, _paced_wakes=wakes, _paced_ta0=ta0,
                                    _paced_own_timers=True, _paced_groups=[[1], [2]], clock=clock,
                                    _timer_fire=None, _timer_at="unset")
        Engine._paced_timer_state(eng, now)
        want, armed = _timer_state_stepwise(begins, ends, wakes, ta0, now)
        assert eng._timer_at == want and not eng._paced_own_timers, seed
        assert queued == [(t, t) for t in armed if t > now], seed
        left += want is not None
        several += len(queued) > 1
    assert left > 50 and several > 20


def test_the_samples_columns_are_the_reads_in_tokens_and_joules_by_hand():
    """``Engine.sample_cols(times, idle_w)`` (seventh round: one loop per engine for the folded samples) is
    ``observe_cols`` in tokens and ``harness.sim.backend._energy`` at each time: ``tests/test_wait_speed.py``'s
    three-type run read at 0.6 for 0.6, 0.8, 1.2, 1.5, 2.4 (block size 1: 13, 15, 15, 18, 21 tokens; busy 0, 0.25,
    0.5, 0.75, 1.25 s, no step energy: 7 W x (t - busy) J at 7 W idle), at 0.6 for 0.6 alone, and idle at 5.0 for
    5.0, 6.0, 9.5 (2.25 s busy)."""
    from harness.sim.backend import _energy
    times = [0.6, 0.8, 1.2, 1.5, 2.4]
    got = []

    def read(ts):
        return lambda e: got.append((ts, e.sample_cols(ts, 7.0), e.observe_cols(ts)))
    _three_types(True, looks=times, calls=[(0.6, read(times)), (0.6, read(times[:1])), (5.0, read([5.0, 6.0, 9.5]))])
    busy = [0.0, 0.25, 0.5, 0.75, 1.25]
    assert got[0][1] == ([13, 15, 15, 18, 21], [7.0 * (t - b) for t, b in zip(times, busy)])
    assert got[1][1] == ([13], [7.0 * 0.6]) and got[2][1] == ([0] * 3, [7.0 * (t - 2.25) for t in (5.0, 6.0, 9.5)])
    for ts, (toks, energy), (used, bb, ee) in got:
        assert toks == used and energy == [_energy(b, j, 7.0, t) for t, b, j in zip(ts, bb, ee)]


@pytest.mark.parametrize("horizon", [math.inf, 3.0])
def test_the_fast_group_loops_give_the_checking_loops_steps(horizon):
    """The paced group loops without KV checks (seventh round: ``Engine._paced_free_steps``, and for two groups
    ``_paced_two_steps`` with their state in local variables, the A40 roofline's steps priced inline) against the
    loop that checks each step's blocks (``_paced_group_steps`` with the growth not known to fit, blocks to spare:
    no check binds), on 300 random runs of 2 and 3 groups (ready times on a 10-ms grid, so groups become ready
    together and steps begin at the previous end; sizes, contexts and steps left random; parts of 32 steps, then
    twice as many as held): the same begins, ends, times, energies, wake times, batch sizes, steps per group, the
    same pauses, and the groups' ready times and contexts left alike; some runs serve two groups in one step."""
    import functools
    import random
    import types
    from harness.sim.engine import Engine
    a40 = _load(HardwareConfig, ROOT / "conf" / "hardware" / "a40.yaml")
    llama = _load(ModelConfig, ROOT / "conf" / "model" / "llama2_7b.yaml")
    perf = PerfModel(a40, llama)

    def run(fits, ready, ctxs, left, sizes, reqs_of):
        eng = types.SimpleNamespace(horizon_s=horizon, bs=16, _end_s=0.0, perf=perf, _after_idle=None,
                                    _paced_growth_fits=lambda requests, avail: fits)
        eng._paced_free_steps = functools.partial(Engine._paced_free_steps, eng)
        eng._paced_two_steps = functools.partial(Engine._paced_two_steps, eng)
        out = [[] for _ in range(6)]
        steps_of = [[] for _ in ready]
        lim, pauses = [32], []
        for _ in Engine._paced_group_steps(eng, reqs_of, ready, ctxs, left, sizes, 10 ** 9, 0.5, 0.0, *out,
                                           steps_of, lim):
            pauses.append(len(out[0]))
            lim[0] = 2 * len(out[0])
        return out, steps_of, pauses, ready, ctxs

    merged = 0
    for seed in range(300):
        rng = random.Random(seed)
        n = 2 if seed % 3 else 3
        ready = [0.0] + [rng.choice([0.0, 0.01, 0.02, 0.25, 0.49, 0.5, 0.7]) for _ in range(n - 1)]
        ctxs = [rng.randint(0, 20000) for _ in range(n)]
        left = [rng.choice([1, 5, 40, 300]) for _ in range(n)]
        sizes = [rng.randint(1, 3) for _ in range(n)]
        reqs_of = [[types.SimpleNamespace(computed=0, kv=types.SimpleNamespace(blocks=10 ** 6))] * s for s in sizes]
        fast = run(True, list(ready), list(ctxs), left, sizes, reqs_of)
        slow = run(False, list(ready), list(ctxs), left, sizes, reqs_of)
        assert fast == slow, seed
        merged += sum(b > max(sizes) for b in fast[0][5])
    assert merged > 0
