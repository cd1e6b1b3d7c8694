"""Hand-worked checks of baselines/wait/fluid.py (Ao et al., arXiv 2504.11320; docs/schedulers.md "WAIT and Nested WAIT").

Every expected number below is worked out by hand in the comments, not by calling the code.
Notation: w_j = (l'_j + 1)(l_j + l'_j/2) tokens, S = sum_j lambda_j w_j tokens/s.
"""

import math

import pytest

from baselines.wait.fluid import (
    FluidEquilibrium,
    NestedWaitPlan,
    PromptType,
    fluid_equilibrium,
    linear_iteration_coefficients,
    nested_wait_thresholds,
    stage_token_weight,
    wait_thresholds,
)

D0 = 0.01  # s
D1 = 1e-6  # s/token
BIG_C = 100_000.0  # tokens

# One type: lambda = 2/s, l = 512, l' = 20.
ONE = [PromptType(2.0, 512, 20)]
# Two types at total rate 5/s: 70% -> lambda = 3.5 (512/20), 30% -> lambda = 1.5 (512/50).
TWO = [PromptType(3.5, 512, 20), PromptType(1.5, 512, 50)]
# A type whose integer threshold is forced up several times by a slow, heavy type.
MULTI = [PromptType(100.0, 49, 1), PromptType(1.0, 1000, 10)]


def wait_ok(types, n, d0, d1, margin=0.0):
    """The paper's WAIT inequality, checked independently of the module."""
    m_pi = sum(nj * (t.output_tokens + 1) * (t.input_tokens + t.output_tokens / 2) for nj, t in zip(n, types))
    lhs = (1 + margin) * (d0 + d1 * m_pi)
    return m_pi, all(lhs <= nj / t.rate_per_s * (1 + 1e-12) for nj, t in zip(n, types))


# ------------------------------------------------------------------------------------------
# fluid equilibrium
# ------------------------------------------------------------------------------------------
def test_stage_token_weight():
    # w = (20 + 1) * (512 + 20/2) = 21 * 522 = 10962
    assert stage_token_weight(ONE[0]) == 10962.0
    # w = (50 + 1) * (512 + 25) = 51 * 537 = 27387
    assert stage_token_weight(TWO[1]) == 27387.0


def test_fluid_one_type():
    # S = 2 * 21 * (512 + 10) = 2 * 10962 = 21924 tokens/s
    # d1*S = 1e-6 * 21924 = 0.021924 ; 1 - d1*S = 0.978076
    # dT* = 0.01 / 0.978076 = 0.010224154360...  s
    # M*  = 0.01 * 21924 / 0.978076 = 219.24 / 0.978076 = 224.154360192... tokens
    # throughput = 2 * 20 = 40 tokens/s
    eq = fluid_equilibrium(ONE, D0, D1, BIG_C)
    assert isinstance(eq, FluidEquilibrium)
    assert eq.s_tokens == pytest.approx(21924.0, rel=1e-12)
    assert eq.delta_t_star_s == pytest.approx(0.010224154360192, rel=1e-10)
    assert eq.m_star_tokens == pytest.approx(224.154360192868, rel=1e-10)
    assert eq.throughput_tokens_per_s == pytest.approx(40.0)
    assert eq.stable and eq.reason == ""
    # identity M* = S * dT*
    assert eq.m_star_tokens == pytest.approx(eq.s_tokens * eq.delta_t_star_s, rel=1e-12)


def test_fluid_two_types():
    # w1 = 21 * 522 = 10962 ; w2 = 51 * 537 = 27387
    # S = 3.5 * 10962 + 1.5 * 27387 = 38367 + 41080.5 = 79447.5 tokens/s
    # d1*S = 0.0794475 ; 1 - d1*S = 0.9205525
    # dT* = 0.01 / 0.9205525 = 0.010863041488... s
    # M*  = 794.475 / 0.9205525 = 863.041488671... tokens
    # throughput = 3.5 * 20 + 1.5 * 50 = 70 + 75 = 145 tokens/s
    eq = fluid_equilibrium(TWO, D0, D1, BIG_C)
    assert eq.s_tokens == pytest.approx(79447.5, rel=1e-12)
    assert eq.delta_t_star_s == pytest.approx(0.010863041488671, rel=1e-10)
    assert eq.m_star_tokens == pytest.approx(863.041488671206, rel=1e-10)
    assert eq.throughput_tokens_per_s == pytest.approx(145.0)
    assert eq.stable


def test_fluid_overloaded():
    # d1 = 1e-4: d1*S = 1e-4 * 21924 = 2.1924 >= 1 -> no equilibrium
    eq = fluid_equilibrium(ONE, D0, 1e-4, BIG_C)
    assert not eq.stable
    assert math.isinf(eq.m_star_tokens) and math.isinf(eq.delta_t_star_s)
    assert "d1*S" in eq.reason
    assert eq.s_tokens == pytest.approx(21924.0)
    assert eq.throughput_tokens_per_s == pytest.approx(40.0)


def test_fluid_capacity_violation():
    # M* = 224.154... tokens > C = 200 -> unstable (memory); C = 224.2 -> stable
    eq = fluid_equilibrium(ONE, D0, D1, 200)
    assert not eq.stable
    assert "M*" in eq.reason and "kv_capacity_tokens" in eq.reason
    assert eq.m_star_tokens == pytest.approx(224.154360192868, rel=1e-10)
    assert fluid_equilibrium(ONE, D0, D1, 224.2).stable


def test_fluid_d1_zero():
    # d1 = 0: dT* = d0 = 0.01 s ; M* = d0*S = 0.01 * 21924 = 219.24 tokens
    eq = fluid_equilibrium(ONE, D0, 0.0, BIG_C)
    assert eq.delta_t_star_s == pytest.approx(0.01)
    assert eq.m_star_tokens == pytest.approx(219.24)


# ------------------------------------------------------------------------------------------
# WAIT
# ------------------------------------------------------------------------------------------
def test_wait_one_type():
    # T0 = dT* = 0.0102241... ; n = ceil(2 * 0.0102241) = ceil(0.0204483) = 1
    # M^pi = 1 * 10962 = 10962 ; d0 + d1*M^pi = 0.01 + 0.010962 = 0.020962 <= n/lambda = 0.5  OK
    n, m_pi = wait_thresholds(ONE, D0, D1, BIG_C)
    assert n == [1]
    assert m_pi == pytest.approx(10962.0)
    m_chk, ok = wait_ok(ONE, n, D0, D1)
    assert ok and m_chk == pytest.approx(m_pi)
    assert fluid_equilibrium(ONE, D0, D1, BIG_C).m_star_tokens <= m_pi <= BIG_C


def test_wait_two_types():
    # T0 = dT* = 0.0108630 s
    # n1 = ceil(3.5 * 0.0108630) = ceil(0.0380206) = 1 ; n2 = ceil(1.5 * 0.0108630) = ceil(0.0162946) = 1
    # M^pi = 10962 + 27387 = 38349 ; d0 + d1*M^pi = 0.01 + 0.038349 = 0.048349
    # n1/lambda1 = 1/3.5 = 0.2857 >= 0.048349 OK ; n2/lambda2 = 1/1.5 = 0.6667 OK
    n, m_pi = wait_thresholds(TWO, D0, D1, BIG_C)
    assert n == [1, 1]
    assert m_pi == pytest.approx(38349.0)
    assert wait_ok(TWO, n, D0, D1)[1]


def test_wait_multi_step():
    # wA = (1+1)(49 + 0.5) = 99 ; wB = (10+1)(1000 + 5) = 11055
    # S = 100*99 + 1*11055 = 9900 + 11055 = 20955 ; d1 = 1e-5 -> d1*S = 0.20955
    # T0 = 0.01 / 0.79045 = 0.0126510 s
    # step 0: nA = ceil(100*0.012651) = ceil(1.2651) = 2 ; nB = ceil(0.012651) = 1
    #         M = 2*99 + 11055 = 11253 ; need = 0.01 + 1e-5*11253 = 0.12253
    #         nA/lamA = 2/100 = 0.02 < 0.12253  FAIL
    # step 1: T = 0.12253 ; nA = ceil(12.253) = 13 ; nB = ceil(0.12253) = 1
    #         M = 13*99 + 11055 = 1287 + 11055 = 12342 ; need = 0.01 + 0.12342 = 0.13342
    #         nA/lamA = 0.13 < 0.13342  FAIL
    # step 2: T = 0.13342 ; nA = ceil(13.342) = 14 ; nB = 1
    #         M = 14*99 + 11055 = 1386 + 11055 = 12441 ; need = 0.01 + 0.12441 = 0.13441
    #         nA/lamA = 0.14 >= 0.13441 OK ; nB/lamB = 1 >= 0.13441 OK  -> n = [14, 1], M^pi = 12441
    n, m_pi = wait_thresholds(MULTI, D0, 1e-5, 20_000)
    assert n == [14, 1]
    assert m_pi == pytest.approx(12441.0)
    assert wait_ok(MULTI, n, D0, 1e-5)[1]
    # minimality: nA = 13 (with nB = 1) violates the condition (0.13 < 0.13342)
    assert not wait_ok(MULTI, [13, 1], D0, 1e-5)[1]
    # M* = 20955 * 0.0126510 = 265.1 tokens <= M^pi
    assert fluid_equilibrium(MULTI, D0, 1e-5, 20_000).m_star_tokens <= m_pi
    # C exactly M^pi is still feasible (M^pi <= C)
    assert wait_thresholds(MULTI, D0, 1e-5, 12441)[0] == [14, 1]


def test_wait_margin():
    # margin 0.1 -> k = 1.1 ; k*d1*S = 1.1 * 0.20955 = 0.230505
    # T0 = 1.1*0.01 / 0.769495 = 0.0142951
    # step 0: nA = ceil(1.42951) = 2, nB = 1 ; M = 11253 ; need = 1.1*0.12253 = 0.134783 ; 0.02 FAIL
    # step 1: nA = ceil(13.4783) = 14 ; M = 12441 ; need = 1.1*0.13441 = 0.147851 ; 0.14 FAIL
    # step 2: nA = ceil(14.7851) = 15 ; M = 15*99 + 11055 = 1485 + 11055 = 12540
    #         need = 1.1*(0.01 + 0.1254) = 1.1*0.1354 = 0.14894 ; 0.15 OK ; nB: 1 OK
    n, m_pi = wait_thresholds(MULTI, D0, 1e-5, 20_000, margin=0.1)
    assert n == [15, 1]
    assert m_pi == pytest.approx(12540.0)
    assert wait_ok(MULTI, n, D0, 1e-5, margin=0.1)[1]


def test_wait_overloaded_raises():
    # d1*S = 1e-4 * 21924 = 2.1924 >= 1
    with pytest.raises(ValueError, match="d1\\*S"):
        wait_thresholds(ONE, D0, 1e-4, BIG_C)
    # d1*S = 0.95 < 1 but (1 + 0.1) * 0.95 = 1.045 >= 1
    d1 = 0.95 / 21924
    wait_thresholds(ONE, D0, d1, 1e9)  # feasible without margin
    with pytest.raises(ValueError, match="margin"):
        wait_thresholds(ONE, D0, d1, 1e9, margin=0.1)


def test_wait_capacity_raises():
    # MULTI: M goes 11253 -> 12342 > C = 12000  -> infeasible (memory)
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        wait_thresholds(MULTI, D0, 1e-5, 12_000)
    # ONE: M^pi = 10962 > C = 5000 (M* = 224 fits, but the integer plan does not)
    with pytest.raises(ValueError, match="M\\^pi"):
        wait_thresholds(ONE, D0, D1, 5000)
    # ONE: M* = 224.15 > C = 200
    with pytest.raises(ValueError, match="M\\*"):
        wait_thresholds(ONE, D0, D1, 200)


# ------------------------------------------------------------------------------------------
# Nested WAIT
# ------------------------------------------------------------------------------------------
# Three types, input 100 each: lambda = 2, 1, 1 /s with outputs 10, 30, 60 (given unsorted).
NEST = [PromptType(1.0, 100, 60), PromptType(2.0, 100, 10), PromptType(1.0, 100, 30)]


def test_nested_three_types():
    # boundaries 10 < 30 < 60 ; Delta = 10, 20, 30
    # Lambda_1 = 2+1+1 = 4 ; Lambda_2 (out > 10) = 1+1 = 2 ; Lambda_3 (out > 30) = 1
    # p = (1, 2/4, 1/2) = (1, 0.5, 0.5) ; q = (1, 0.55, 0.55)
    # sum_k Delta_k prod q = 10 + 20*0.55 + 30*0.55*0.55 = 10 + 11 + 9.075 = 30.075
    # tl = 240.6 -> n1 = 240.6 / 30.075 = 8 ; n2 = 8*0.55 = 4.4 ; n3 = 4.4*0.55 = 2.42
    # check sum: 10*8 + 20*4.4 + 30*2.42 = 80 + 88 + 72.6 = 240.6
    # ints (half-up): 8, 4, 2
    # KV at cap (l = 100, stage s holds 100 + s):
    #   seg1 s=1..10 : 10*100 + 55 = 1055            -> 8 * 1055 = 8440
    #   seg2 s=11..30: 20*100 + (465 - 55) = 2410     -> 4 * 2410 = 9640
    #   seg3 s=31..60: 30*100 + (1830 - 465) = 4365   -> 2 * 4365 = 8730
    #   total 8440 + 9640 + 8730 = 26810 tokens ; iteration 0.01 + 1e-6*26810 = 0.03681 s
    plan = nested_wait_thresholds(NEST, D0, D1, 30_000, 240.6)
    assert isinstance(plan, NestedWaitPlan)
    assert plan.boundaries_tokens == (10, 30, 60)
    assert plan.segment_lengths == (10, 20, 30)
    assert plan.segment_rates_per_s == pytest.approx((4.0, 2.0, 1.0))
    assert plan.p == pytest.approx((1.0, 0.5, 0.5))
    assert plan.q == pytest.approx((1.0, 0.55, 0.55))
    assert plan.thresholds == pytest.approx((8.0, 4.4, 2.42), rel=1e-12)
    assert plan.thresholds_int == (8, 4, 2)
    assert sum(d * n for d, n in zip(plan.segment_lengths, plan.thresholds)) == pytest.approx(240.6)
    assert plan.kv_tokens_at_cap == pytest.approx(26810.0)
    assert plan.iteration_time_at_cap_s == pytest.approx(0.03681)
    assert plan.fits_capacity
    # paper check p_k < n_k/n_{k-1} < 1: 0.5 < 0.55 < 1 for k = 2, 3
    assert plan.ratio_check_ok and plan.ratio_violations == ()
    for k in (1, 2):
        assert plan.p[k] < plan.thresholds[k] / plan.thresholds[k - 1] < 1
    # C = 20000 < 26810 -> does not fit
    assert not nested_wait_thresholds(NEST, D0, D1, 20_000, 240.6).fits_capacity


def test_nested_default_eta_tl300():
    # same segments, tl = 300 -> n1 = 300 / 30.075 = 9.975062344...
    # n2 = 9.975062 * 0.55 = 5.486284 ; n3 = 5.486284 * 0.55 = 3.017456 ; ints 10, 5, 3
    plan = nested_wait_thresholds(NEST, D0, D1, 1e6, 300)
    assert plan.thresholds[0] == pytest.approx(9.975062344139650, rel=1e-12)
    assert plan.thresholds[1] == pytest.approx(5.486284289276808, rel=1e-12)
    assert plan.thresholds[2] == pytest.approx(3.017456359102244, rel=1e-12)
    assert plan.thresholds_int == (10, 5, 3)


def test_nested_equal_segments():
    # L = 2, l'_max = 60 -> boundaries ceil(60/2) = 30, 60 ; Delta = 30, 30
    # Lambda_1 (out > 0) = 4 ; Lambda_2 (out > 30) = 1 -> p2 = 1/4 = 0.25 ; q2 = 0.30
    # 30*n1 + 30*0.3*n1 = 39*n1 = 390 -> n1 = 10, n2 = 3
    plan = nested_wait_thresholds(NEST, D0, D1, 1e6, 390, num_segments=2)
    assert plan.boundaries_tokens == (30, 60)
    assert plan.segment_lengths == (30, 30)
    assert plan.p == pytest.approx((1.0, 0.25))
    assert plan.q == pytest.approx((1.0, 0.30))
    assert plan.thresholds == pytest.approx((10.0, 3.0), rel=1e-12)
    assert plan.thresholds_int == (10, 3)
    assert plan.ratio_check_ok


def test_nested_ceil_boundaries():
    # one type, l' = 10, L = 3 -> ceil(10/3) = 4, ceil(20/3) = 7, 10 ; Delta = 4, 3, 3
    plan = nested_wait_thresholds([PromptType(1.0, 5, 10)], D0, D1, 1e6, 10, num_segments=3)
    assert plan.boundaries_tokens == (4, 7, 10)
    assert plan.segment_lengths == (4, 3, 3)


def test_nested_ratio_violation_reported():
    # one type, l' = 60, L = 3 -> boundaries 20, 40, 60 ; nobody leaves early: p = (1, 1, 1)
    # q = (1, min(1.05, 0.99), 0.99) = (1, 0.99, 0.99)
    # 20 + 20*0.99 + 20*0.9801 = 20 + 19.8 + 19.602 = 59.402 -> tl = 59.402 gives n = 1, 0.99, 0.9801
    # check p_k < q_k fails (1 < 0.99 false) for k = 2 and 3 ; ints = 1, 1, 1
    plan = nested_wait_thresholds([PromptType(1.0, 100, 60)], D0, D1, 1e6, 59.402, num_segments=3)
    assert plan.boundaries_tokens == (20, 40, 60)
    assert plan.q == pytest.approx((1.0, 0.99, 0.99))
    assert plan.thresholds == pytest.approx((1.0, 0.99, 0.9801), rel=1e-12)
    assert plan.thresholds_int == (1, 1, 1)
    assert not plan.ratio_check_ok
    assert plan.ratio_violations == (2, 3)


def test_nested_eta_zero_violates_strict_check():
    # eta = 0 -> q_k = p_k, so p_k < n_k/n_{k-1} fails (equality) for k = 2, 3
    plan = nested_wait_thresholds(NEST, D0, D1, 1e6, 100, eta=0.0)
    assert plan.q == pytest.approx((1.0, 0.5, 0.5))
    assert plan.ratio_violations == (2, 3)


def test_nested_single_boundary():
    # one type l' = 20: one segment of 20 stages ; n1 = tl / 20 = 50 / 20 = 2.5 -> int 3 (half-up)
    plan = nested_wait_thresholds([PromptType(1.0, 10, 20)], D0, D1, 1e6, 50)
    assert plan.boundaries_tokens == (20,)
    assert plan.thresholds == pytest.approx((2.5,))
    assert plan.thresholds_int == (3,)
    assert plan.p == (1.0,) and plan.q == (1.0,)


# ------------------------------------------------------------------------------------------
# roofline coefficients
# ------------------------------------------------------------------------------------------
def test_linear_iteration_coefficients():
    # Qwen3-0.6B on an A40: weights 1.19e9 B, KV 114688 B/token, 696e9 B/s, eff 0.5, overhead 2 ms
    # bw*eff = 348e9 B/s
    # d0 = 1.19e9 / 348e9 + 0.002 = 0.003419540229885 + 0.002 = 0.005419540229885 s
    # d1 = 114688 / 348e9 = 3.29563218e-7 s/token
    d0, d1 = linear_iteration_coefficients(1.19e9, 114688, 696e9, 0.5, 0.002)
    assert d0 == pytest.approx(0.005419540229885, rel=1e-12)
    assert d1 == pytest.approx(3.29563218390805e-7, rel=1e-12)


@pytest.mark.parametrize(
    "args, name",
    [
        ((0, 1, 1, 0.5, 0), "weight_bytes"),
        ((1, -1, 1, 0.5, 0), "kv_bytes_per_token"),
        ((1, 1, math.inf, 0.5, 0), "mem_bw_bytes_per_s"),
        ((1, 1, 1, 1.5, 0), "mem_efficiency"),
        ((1, 1, 1, 0.0, 0), "mem_efficiency"),
        ((1, 1, 1, 0.5, -0.1), "overhead_s"),
        ((1, 1, 1, 0.5, math.nan), "overhead_s"),
        ((True, 1, 1, 0.5, 0), "weight_bytes"),
        (("1", 1, 1, 0.5, 0), "weight_bytes"),
    ],
)
def test_linear_iteration_coefficients_validation(args, name):
    with pytest.raises(ValueError, match=name):
        linear_iteration_coefficients(*args)


# ------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(rate_per_s=0.0, input_tokens=1, output_tokens=1), "rate_per_s"),
        (dict(rate_per_s=math.nan, input_tokens=1, output_tokens=1), "rate_per_s"),
        (dict(rate_per_s=1.0, input_tokens=-1, output_tokens=1), "input_tokens"),
        (dict(rate_per_s=1.0, input_tokens=1, output_tokens=math.inf), "output_tokens"),
        (dict(rate_per_s=1.0, input_tokens=False, output_tokens=1), "input_tokens"),
    ],
)
def test_prompt_type_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PromptType(**kwargs)


@pytest.mark.parametrize("fn", [fluid_equilibrium, wait_thresholds])
def test_model_param_validation(fn):
    with pytest.raises(ValueError, match="d0_s"):
        fn(ONE, 0.0, D1, BIG_C)
    with pytest.raises(ValueError, match="d1_s_per_token"):
        fn(ONE, D0, -1e-6, BIG_C)
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        fn(ONE, D0, D1, math.inf)
    with pytest.raises(ValueError, match="types"):
        fn([], D0, D1, BIG_C)
    with pytest.raises(ValueError, match="types"):
        fn([(2.0, 512, 20)], D0, D1, BIG_C)


def test_wait_margin_validation():
    with pytest.raises(ValueError, match="margin"):
        wait_thresholds(ONE, D0, D1, BIG_C, margin=-0.1)


def test_nested_validation():
    with pytest.raises(ValueError, match="total_cap_tl"):
        nested_wait_thresholds(NEST, D0, D1, BIG_C, 0)
    with pytest.raises(ValueError, match="eta"):
        nested_wait_thresholds(NEST, D0, D1, BIG_C, 100, eta=-0.01)
    with pytest.raises(ValueError, match="num_segments"):
        nested_wait_thresholds(NEST, D0, D1, BIG_C, 100, num_segments=0)
    with pytest.raises(ValueError, match="num_segments"):
        nested_wait_thresholds(NEST, D0, D1, BIG_C, 100, num_segments=61)  # l'_max = 60
    with pytest.raises(ValueError, match="num_segments"):
        nested_wait_thresholds(NEST, D0, D1, BIG_C, 100, num_segments=True)
    with pytest.raises(ValueError, match="output_tokens"):
        nested_wait_thresholds([PromptType(1.0, 10, 20.5)], D0, D1, BIG_C, 100)
    with pytest.raises(ValueError, match="output_tokens"):
        nested_wait_thresholds([PromptType(1.0, 10, 0)], D0, D1, BIG_C, 100)
    with pytest.raises(ValueError, match="d0_s"):
        nested_wait_thresholds(NEST, -1, D1, BIG_C, 100)
