"""WAIT-CP (baselines/wait/wait_cp.py) against hand-worked examples from the authors' formulas
(``Luoxiaogan/vidur_or@011fe971a7cd``, ``general_nested_chunked_replica_scheduler.py``; docs/wait.md).
Every expected number is derived in the docstrings from those formulas, not from running the code. The
engine is the real ``harness.sim.engine.Engine`` with 1 s stub steps (tests/test_batching.py's helpers).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from baselines.wait.wait_cp import BudgetCapRule, CpType, Segment, WaitCpRule, wait_cp_constants
from harness.sim.engine import Request
from tests.test_batching import fake, make_engine, resident, step_input

SINGLE = [CpType(512.0, 20, 1.0)]


def test_constants_single_type_512_20():
    """512/20, tl 21, cs 256: K = ceil(512/256) = 2; D = 2 + 20 = 22; P = 21/22 = 0.954545...;
    pi = 2 P = 1.909090...; batch_est = ceil((21 - 1.90909) + 1.90909 x 256) = ceil(19.0909 + 488.7273)
    = ceil(507.818) = 508. One segment, stages 0..19 (d_1 = 20), total round(21/20 x 20) = 21."""
    c = wait_cp_constants(SINGLE, 21, 256)
    assert c.K == (2,)
    assert c.D == pytest.approx(22.0)
    assert c.P == pytest.approx(21 / 22)
    assert c.pi == pytest.approx(42 / 22)
    assert c.batch_est == 508
    assert c.segments == (Segment(0, 19, 21),)


def test_constants_two_types_and_rotation():
    """0.7 x 512/20 + 0.3 x 512/50, tl 30, cs 128 (the authors' W3 ``cs128_tl30``): K = 4 for both;
    D = 0.7 (4 + 20) + 0.3 (4 + 50) = 16.8 + 16.2 = 33; P = 30/33; pi = 4 P = 3.6364;
    batch_est = ceil(26.3636 + 465.4545) = ceil(491.818) = 492. Segments 20 | 30 stages, p = 0.3,
    q = 0.3 (seg_margin 0), n_1 = 30 / (20 + 0.3 x 30) = 30/29 = 1.0345; B_1 = round(20.69) = 21,
    B_2 = round(1.0345 x 0.3 x 30 = 9.31) = 9. Segment 2's limit: 9 // 30 = 0, 9 % 30 = 9, so 1 at steps
    with t mod 30 < 9, else 0; segment 1: 1, and 2 at t mod 20 == 0."""
    c = wait_cp_constants([CpType(512.0, 20, 0.7), CpType(512.0, 50, 0.3)], 30, 128)
    assert c.K == (4, 4)
    assert c.D == pytest.approx(33.0)
    assert c.P == pytest.approx(30 / 33)
    assert c.batch_est == 492
    assert c.segments == (Segment(0, 19, 21), Segment(20, 49, 9))
    s1, s2 = c.segments
    assert [s1.limit(t) for t in (0, 1, 19, 20, 21, 40)] == [2, 1, 1, 2, 1, 2]
    assert [s2.limit(t) for t in (0, 8, 9, 29, 30, 38, 39)] == [1, 1, 0, 0, 1, 1, 0]
    # seg_margin 0.2: q = 0.5, n_1 = 30 / (20 + 15) = 0.857; B_1 = round(17.14) = 17, B_2 = round(12.86) = 13
    c = wait_cp_constants([CpType(512.0, 20, 0.7), CpType(512.0, 50, 0.3)], 30, 128, seg_margin=0.2)
    assert [s.total for s in c.segments] == [17, 13]


def run_steps(eng, n_steps):
    """Run the engine, recording per step ``(prefill chunks by name, decoders by name)``; stops after
    ``n_steps`` steps."""
    log = []
    orig = eng._step_begin

    def begin(version):
        orig(version)
        if eng.busy and len(log) < n_steps:
            log.append(({r.conv: n for r, n in eng._run_prefill}, sorted(r.conv for r in eng._run_decode)))

    eng._step_begin = begin
    eng.clock.run(until=float(n_steps) - 0.5)
    return log


def cp_rule(tl=21, cs=256, **kw):
    return WaitCpRule(wait_cp_constants(SINGLE, tl, cs), tl, cs, **kw)


def test_iteration_by_iteration_five_prompts():
    """Five 512/20 prompts A-E at t = 0, tl 21, cs 256, batch_est 508 (above), limit 2 at step 0, 1 at
    steps 1..19. By hand (a prompt samples its first token in the step that completes its prefill):
    t0 (limit 2): admit A 256, B min(512, 256, 508 - 256) = 252                           -> 508
    t1 (limit 1): A 256, B min(260, 256, 252) = 252; budget spent, no admission            -> 508
    t2: A decodes 1; B min(8, 256, 507) = 8; admit C min(512, 256, 499) = 256              -> 265
    t3: A, B decode 2; C 256; admit D min(512, 256, 508 - 258) = 250                        -> 508
    t4: A, B, C decode 3 (C's prefill ended at t3); D min(262, 256, 505) = 256;
        admit E min(512, 256, 508 - 259) = 249                                              -> 508
    t5: A, B, C decode 3; D 6 (its last); E min(263, 256, 499) = 256                         -> 265
    t6: A, B, C, D decode 4; E 7 left: 7                                                    -> 11
    """
    eng = make_engine(200_000, max_num_batched_tokens=16384)
    eng.set_rule(cp_rule())
    for name in "ABCDE":
        eng.clock.call_at(0.0, eng.submit, Request(name, 0, 512, 20, (0,), on_finish=lambda r: None,
                                                   on_first_token=lambda r: None), priority=0)
    log = run_steps(eng, 7)
    assert log[0] == ({"A": 256, "B": 252}, [])
    assert log[1] == ({"A": 256, "B": 252}, [])
    assert log[2] == ({"B": 8, "C": 256}, ["A"])
    assert log[3] == ({"C": 256, "D": 250}, ["A", "B"])
    assert log[4] == ({"D": 256, "E": 249}, ["A", "B", "C"])
    assert log[5] == ({"D": 6, "E": 256}, ["A", "B", "C"])
    assert log[6] == ({"E": 7}, ["A", "B", "C", "D"])
    totals = [sum(p.values()) + len(d) for p, d in log]
    assert totals == [508, 508, 265, 508, 508, 265, 11]
    assert all(n <= 256 for p, _ in log for n in p.values())


def test_rotation_step_admits_two_and_tl_caps_it():
    """19 residents decoding (stages 1..19, one each), 3 prompts of 512 waiting, at step 40
    (40 mod 20 = 0 < 21 mod 20 = 1: limit 2): tl - 19 = 2 room, so two are admitted: decodes 19 tokens,
    then min(512, 256, 508 - 19 = 489) = 256 and min(512, 256, 233) = 233 -> 19 + 489 = 508. At step 41 the
    limit is 1: one admission, 256 -> 275. With 20 residents at step 40 only tl - 20 = 1 fits."""
    for steps, n_res, want in ((40, 19, {"W0": 256, "W1": 233}), (41, 19, {"W0": 256}), (40, 20, {"W0": 256})):
        eng = make_engine(200_000, max_num_batched_tokens=16384)
        eng.set_rule(cp_rule())
        for s in range(1, n_res + 1):
            resident(eng, f"R{s:02d}", 512, min(s, 19), out_target=20)
        for i in range(3):
            eng.clock.call_at(0.0, eng.submit, Request(f"W{i}", 0, 512, 20, (0,), on_finish=lambda r: None,
                                                       on_first_token=lambda r: None), priority=0)
        eng.steps = steps
        log = run_steps(eng, 1)
        pre, dec = log[0]
        assert pre == want, (steps, n_res)
        assert len(dec) == n_res
        assert sum(pre.values()) + len(dec) == n_res + sum(want.values())


def test_gate_off_and_wait_gate():
    """gate off (WAIT_CP_GATE=off): batch_est bounds nothing, each prefill is min(remaining, cs): two
    admissions at step 0 get 256 each (512 > 508). wait_gate on, one segment (total 21, limit 1 at step
    1): 2 residents decoding, none at stage 0 and nothing waiting: 2 < 21 and 0 < 1, so the segment is
    frozen (its decodes paused, a wake-up at idle + max_wait_s); after max_wait_s they run."""
    r = cp_rule(gate=False)
    plan = r.plan(replace(step_input([], [fake(0, prompt=512), fake(0, prompt=512)]), free_blocks=100_000,
                          capacity_blocks=100_000))
    assert len(plan.admit) == 2 and plan.admit_budget is None and plan.admit_chunk_cap == 256
    r = cp_rule(wait_gate=True, max_wait_s=0.5)
    res = [fake(3, idle=1.0, admit_seq=0), fake(5, idle=1.0, admit_seq=1)]
    plan = r.plan(replace(step_input(res, [], now=1.2), step_index=1))
    assert plan.run == () and plan.wake_at_s == pytest.approx(1.5)
    plan = r.plan(step_input(res, [], now=1.6))
    assert len(plan.run) == 2


def test_control_same_budget_and_cap():
    """The control with budget 508 and cap 2: V1's step with 508 tokens: A admitted with min(512, 508) =
    508 (no per-request chunk); t1: A 4, B min(512, 504) = 504; C waits (2 hold KV = the cap)."""
    eng = make_engine(200_000, max_num_batched_tokens=16384)
    eng.set_rule(BudgetCapRule(508, 2))
    for name in "ABC":
        eng.clock.call_at(0.0, eng.submit, Request(name, 0, 512, 20, (0,), on_finish=lambda r: None,
                                                   on_first_token=lambda r: None), priority=0)
    log = run_steps(eng, 3)
    assert log[0] == ({"A": 508}, [])
    assert log[1] == ({"A": 4, "B": 504}, [])
    assert log[2] == ({"B": 8}, ["A"])


def test_nested_wait_stage_caps_paper_totals_rotate():
    """Nested WAIT's ``stage_caps``: the paper's two-type example, tl 30, segments 20 | 30, q = 0.3:
    n_1 = 30/29, B_2 = round(9.31) = 9 over 30 stages. ``raised``: 30 caps of 1 (up to 30 per step);
    ``rotate``: caps 0 with 9 ones, which rotate: at step t the stage at offset i has cap 1 iff
    (i + t) mod 30 < 9. With one resident at each stage 20..49 (offsets 0..29) and segment 1 empty but for
    an open gate (stage 0's cap is 1 = B_1 // 20 with B_1 = 21: offsets with (i + t) mod 20 < 1 get 2),
    at t = 0 segment 2 runs offsets 0..8 (stages 20..28): 9; at t = 25 offsets i with (i + 25) mod 30 < 9:
    i = 5..13 (stages 25..33): 9."""
    from baselines.wait.fluid_admission import NestedWaitRule, segment_stage_caps
    n1 = 30 / 29
    raw = segment_stage_caps([20, 30], [n1, 0.3 * n1], raise_zero=False)
    assert raw[1] == [0] * 21 + [1] * 9 and sum(raw[0]) == 21
    assert segment_stage_caps([20, 30], [n1, 0.3 * n1])[1] == [1] * 30
    with pytest.raises(ValueError, match="rotate"):
        NestedWaitRule([20, 50], raw, 1.0)
    rule = NestedWaitRule([20, 50], raw, max_wait_s=0.0, rotate=True)
    res = [fake(s, admit_seq=s) for s in range(20, 50)]
    for t, want in ((0, list(range(20, 29))), (25, list(range(25, 34)))):
        plan = rule.plan(replace(step_input(res, [], now=1.0), step_index=t))
        assert sorted(r.stage for r, _ in plan.run) == want, t
    fixed = NestedWaitRule([20, 50], segment_stage_caps([20, 30], [n1, 0.3 * n1]), max_wait_s=0.0)
    assert len(fixed.plan(step_input(res, [], now=1.0)).run) == 30
    assert NestedWaitRule(**{"boundaries": [20, 50], "stage_caps": raw, "max_wait_s": 0.0, "rotate": True}
                          ).to_spec()["rotate"] is True


def test_rotation_moves_on_when_a_step_would_run_nothing():
    """Two types 512/9 and 512/30 (equal rates), tl 21, cs 256: segments 0..8 and 9..29; q = 0.5,
    n_1 = 21 / (9 + 0.5 x 21) = 1.0769, B_1 = round(9.69) = 10, B_2 = round(11.31) = 11 over 21 stages:
    segment 2's entry limit is 1 when t mod 21 < 11, else 0. One resident at stage 9 (segment 2's entry),
    nothing else, at step 15: limit 0, nothing would run; the rotation moves on to t = 21 (21 mod 21 = 0
    < 11), where the entry admits 1: the request decodes."""
    c = wait_cp_constants([CpType(512.0, 9, 1.0), CpType(512.0, 30, 1.0)], 21, 256)
    assert c.segments == (Segment(0, 8, 10), Segment(9, 29, 11))
    rule = WaitCpRule(c, 21, 256)
    r = fake(9, admit_seq=0)
    assert c.segments[1].limit(15) == 0
    plan = rule.plan(replace(step_input([r], []), step_index=15))
    assert [(x, n) for x, n in plan.run] == [(r, 1)]
    assert rule._plan_at(replace(step_input([r], []), step_index=15), 15).run == ()


def test_coalescing_never_skips_a_rotation_window():
    """512/1000-like: B_1 = 21 over 1000 stages gives a limit of 1 only at t mod 1000 < 21, else 0. At a
    step with limit 0, a prompt waiting and room under tl, the plan admits nothing now but would at a later
    step index, so it must not be repeatable (a coalesced run would jump past the window)."""
    c = wait_cp_constants([CpType(512.0, 1000, 1.0)], 21, 256)
    assert c.segments == (Segment(0, 999, 21),)
    rule = WaitCpRule(c, 21, 256)
    res = [fake(5, admit_seq=0)]
    plan = rule.plan(replace(step_input(res, [fake(0, prompt=512)]), step_index=500))
    assert plan.admit == () and not plan.repeatable
    plan = rule.plan(replace(step_input(res, [fake(0, prompt=512)]), step_index=1000))
    assert len(plan.admit) == 1
    full = [fake(5, admit_seq=k) for k in range(21)]       # tl reached: no admission at any step index
    assert rule.plan(replace(step_input(full, [fake(0, prompt=512)]), step_index=500)).repeatable


def test_not_repeatable_while_a_resident_can_cross_into_a_later_segment():
    """Two types 512/20 and 512/50 (segments 0..19, 20..49): a decode-only plan with a resident at stage
    5 (segment 1) is not repeatable, since after 15 more steps it meets segment 2's entry limit (0 at 21
    of every 30 steps), which a coalesced run would not apply; with every resident past stage 20 it is
    (nothing waiting)."""
    c = wait_cp_constants([CpType(512.0, 20, 0.7), CpType(512.0, 50, 0.3)], 30, 128)
    rule = WaitCpRule(c, 30, 128)
    plan = rule.plan(replace(step_input([fake(5, admit_seq=0)], []), step_index=3))
    assert len(plan.run) == 1 and not plan.repeatable
    plan = rule.plan(replace(step_input([fake(25, admit_seq=0)], []), step_index=3))
    assert len(plan.run) == 1 and plan.repeatable
