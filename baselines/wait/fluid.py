"""Fluid model, WAIT and Nested WAIT thresholds for fluid-guided admission control.

Source: Ao, Luo, Simchi-Levi, Wang, "Optimizing LLM Inference: Fluid-Guided Online
Scheduling with Memory Constraints", arXiv 2504.11320 -- as summarised in
``docs/schedulers.md``, section "WAIT and Nested WAIT" (we cite that summary, not paper section
numbers).  The practical Nested WAIT parameterisation (segments, ``q_k``, total cap ``tl``) follows
the paper's experiments and the public Vidur fork ``Luoxiaogan/vidur_or``
(``general_nested_booking_limit_replica_scheduler.py``).

Model (single GPU).  Prompt types ``j`` arrive as Poisson streams with rate ``lambda_j``
(arrivals/s), input length ``l_j`` tokens and output length ``l'_j`` tokens.  A prompt is processed
in ``l'_j + 1`` iterations (one prefill stage, then one decode stage per output token after the
first; stage ``s = 0 .. l'_j``) and at stage ``s`` holds ``l_j + s`` KV tokens.  One iteration
(batch ``B``) takes::

    tau(B) = d0 + d1 * sum_{i in B} (l_i + s_i)        [s]

with ``d0`` in s and ``d1`` in s/token.  The KV cache holds ``C`` tokens.

Everything here is a pure function: no I/O, no global state, stdlib ``math`` only.

Units used throughout: time in seconds (s), lengths and memory in tokens, rates in 1/s
(arrivals/s) or tokens/s.  Every public function raises ``ValueError`` naming the offending
parameter and its value on invalid input (non-finite, non-numeric, bool, out of range).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

__all__ = [
    "PromptType",
    "FluidEquilibrium",
    "NestedWaitPlan",
    "fluid_equilibrium",
    "wait_thresholds",
    "nested_wait_thresholds",
    "linear_iteration_coefficients",
    "prefill_aware_cycle_s",
    "stage_token_weight",
]

# Relative float tolerance used when rounding lambda*T up to an integer and when checking
# the WAIT cycle inequality, so that e.g. 2 * 0.5 computed as 1.0000000000000002 is not
# rounded up to 2.
_REL_TOL = 1e-12

# Upper clamp on the Nested WAIT ratio q_k (paper's practical parameterisation).
_Q_MAX = 0.99


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------
def _real(name: str, value: object) -> float:
    """Return ``value`` as a finite float or raise ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return out


def _positive(name: str, value: object) -> float:
    out = _real(name, value)
    if out <= 0.0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return out


def _non_negative(name: str, value: object) -> float:
    out = _real(name, value)
    if out < 0.0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return out


def _check_types(types: object) -> tuple[PromptType, ...]:
    if isinstance(types, (str, bytes)) or not isinstance(types, Sequence):
        raise ValueError(f"types must be a non-empty sequence of PromptType, got {types!r}")
    if len(types) == 0:
        raise ValueError("types must be a non-empty sequence of PromptType, got an empty sequence")
    for i, t in enumerate(types):
        if not isinstance(t, PromptType):
            raise ValueError(f"types[{i}] must be a PromptType, got {t!r}")
    return tuple(types)


def _check_model(d0_s: object, d1_s_per_token: object, kv_capacity_tokens: object) -> tuple[float, float, float]:
    d0 = _positive("d0_s", d0_s)
    d1 = _non_negative("d1_s_per_token", d1_s_per_token)
    cap = _positive("kv_capacity_tokens", kv_capacity_tokens)
    return d0, d1, cap


# --------------------------------------------------------------------------------------------
# data types
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PromptType:
    """One prompt type of the fluid model (Ao et al., arXiv 2504.11320; docs/schedulers.md "WAIT and Nested WAIT").

    Attributes:
        rate_per_s: ``lambda_j``, Poisson arrival rate in arrivals/s; must be finite and > 0.
        input_tokens: ``l_j``, prompt (input) length in tokens; finite and >= 0.
        output_tokens: ``l'_j``, output length in tokens; finite and >= 0.  Floats are allowed
            for the fluid equilibrium and WAIT (e.g. trace means); Nested WAIT needs integers.

    Raises:
        ValueError: on construction, naming the field and value, when a field is not a finite
            real number or is out of range.
    """

    rate_per_s: float
    input_tokens: float
    output_tokens: float

    def __post_init__(self) -> None:
        _positive("rate_per_s", self.rate_per_s)
        _non_negative("input_tokens", self.input_tokens)
        _non_negative("output_tokens", self.output_tokens)


def stage_token_weight(t: PromptType) -> float:
    """KV token-iterations one prompt of type ``t`` accumulates over its whole life, in tokens.

    ``w_j = sum_{s=0}^{l'_j} (l_j + s) = (l'_j + 1)(l_j + l'_j / 2)``  (tokens x iterations;
    iterations are a dimensionless count).  This is the per-arrival term of ``S`` and of
    ``M^pi`` in Ao et al., arXiv 2504.11320 (docs/schedulers.md "WAIT and Nested WAIT").

    Raises:
        ValueError: if ``t`` is not a ``PromptType``.
    """
    if not isinstance(t, PromptType):
        raise ValueError(f"t must be a PromptType, got {t!r}")
    return (t.output_tokens + 1.0) * (t.input_tokens + t.output_tokens / 2.0)


@dataclass(frozen=True, slots=True)
class FluidEquilibrium:
    """Fluid equilibrium of the single-GPU model (Ao et al., arXiv 2504.11320; docs/schedulers.md "WAIT and Nested WAIT").

    Attributes:
        s_tokens: ``S = sum_j lambda_j (l'_j + 1)(l_j + l'_j/2)`` in tokens/s -- the rate at which
            arrivals bring KV token-iterations (tokens per iteration, summed over a prompt's
            ``l'_j + 1`` iterations, per second).  ``d1 * S`` is dimensionless.
        m_star_tokens: ``M* = d0 S / (1 - d1 S)``: KV tokens resident at equilibrium (tokens);
            ``math.inf`` when ``d1 S >= 1``.
        delta_t_star_s: ``dT* = d0 / (1 - d1 S)``: iteration time at equilibrium (s);
            ``math.inf`` when ``d1 S >= 1``.
        throughput_tokens_per_s: ``sum_j lambda_j l'_j``: output-token throughput benchmark
            (tokens/s).
        stable: ``d1 S < 1`` and ``M* <= C``.
        reason: why the equilibrium is unstable; ``''`` when stable.
    """

    s_tokens: float
    m_star_tokens: float
    delta_t_star_s: float
    throughput_tokens_per_s: float
    stable: bool
    reason: str


@dataclass(frozen=True, slots=True)
class NestedWaitPlan:
    """Nested WAIT segment plan (Ao et al., arXiv 2504.11320; docs/schedulers.md "WAIT and Nested WAIT").

    All tuples are indexed by segment ``k = 1..m`` (position ``k - 1``).  Segment ``k`` covers
    the decode stages ``(b_{k-1}, b_k]`` with ``b_0 = 0``.

    Attributes:
        boundaries_tokens: ``b_1 < ... < b_m`` (tokens of output).
        segment_lengths: ``Delta_k = b_k - b_{k-1}`` (decode stages, i.e. tokens).
        segment_rates_per_s: ``Lambda_k``: arrival rate of prompts that reach segment ``k``,
            i.e. whose output length exceeds ``b_{k-1}`` (arrivals/s).
        p: continuation probabilities ``p_k = Lambda_k / Lambda_{k-1}``, ``p_1 = 1``.
        q: ratios ``q_k = min(p_k + eta, 0.99)`` for ``k >= 2``; ``q_1 = 1`` by convention
            (segment 1 has no predecessor).  ``n_k / n_{k-1} = q_k``.
        thresholds: real per-stage thresholds ``n_k`` (prompts per stage), with
            ``sum_k Delta_k n_k = tl``.
        thresholds_int: ``max(1, round_half_up(n_k))`` (prompts per stage).
        total_cap_tl: the requested ``tl`` (prompts in a batch summed over all stages).
        kv_tokens_at_cap: KV tokens of a batch that fills every stage to ``thresholds_int``,
            taking for segment ``k`` the largest input length among the types that reach it:
            ``sum_k n_k^int sum_{s=b_{k-1}+1}^{b_k} (Lmax_k + s)`` (tokens).  Upper bound for
            the batch only; paused prompts and the entry queue are not counted.
        iteration_time_at_cap_s: ``d0 + d1 * kv_tokens_at_cap`` (s).
        fits_capacity: ``kv_tokens_at_cap <= C``.
        ratio_check_ok: whether ``p_k < n_k / n_{k-1} < 1`` holds for every ``k >= 2``
            (on the real thresholds).
        ratio_violations: segment indices ``k`` (1-based) where that check fails.
    """

    boundaries_tokens: tuple[int, ...]
    segment_lengths: tuple[int, ...]
    segment_rates_per_s: tuple[float, ...]
    p: tuple[float, ...]
    q: tuple[float, ...]
    thresholds: tuple[float, ...]
    thresholds_int: tuple[int, ...]
    total_cap_tl: float
    kv_tokens_at_cap: float
    iteration_time_at_cap_s: float
    fits_capacity: bool
    ratio_check_ok: bool
    ratio_violations: tuple[int, ...]


# --------------------------------------------------------------------------------------------
# fluid equilibrium
# --------------------------------------------------------------------------------------------
def fluid_equilibrium(
    types: Sequence[PromptType],
    d0_s: float,
    d1_s_per_token: float,
    kv_capacity_tokens: float,
) -> FluidEquilibrium:
    """Fluid equilibrium ``(S, M*, dT*, throughput)`` of the single-GPU model.

    Source: Ao et al., arXiv 2504.11320, fluid model (docs/schedulers.md "WAIT and Nested WAIT").

    Derivation.  In equilibrium every iteration takes ``dT``; in one iteration ``lambda_j dT``
    type-j prompts arrive, so each of the ``l'_j + 1`` stages of type j holds ``lambda_j dT``
    prompts and the resident KV is::

        M = sum_j lambda_j dT sum_{s=0}^{l'_j} (l_j + s) = dT * S,
        S = sum_j lambda_j (l'_j + 1)(l_j + l'_j / 2)                       [tokens/s]

    With ``dT = d0 + d1 M``: ``dT* = d0 / (1 - d1 S)`` (s) and ``M* = S dT* = d0 S / (1 - d1 S)``
    (tokens).  Output throughput ``sum_j lambda_j l'_j`` (tokens/s).

    Args:
        types: non-empty sequence of ``PromptType``.
        d0_s: fixed iteration time ``d0`` (s), > 0.
        d1_s_per_token: per-KV-token iteration time ``d1`` (s/token), >= 0.
        kv_capacity_tokens: KV capacity ``C`` (tokens), > 0.

    Returns:
        ``FluidEquilibrium``.  When ``d1 S >= 1`` there is no equilibrium: ``M*`` and ``dT*``
        are ``math.inf`` and ``stable`` is False.  When ``M* > C`` the numbers are finite but
        ``stable`` is False.  ``reason`` names the failed condition.

    Raises:
        ValueError: invalid ``types``, ``d0_s``, ``d1_s_per_token`` or ``kv_capacity_tokens``.
    """
    ts = _check_types(types)
    d0, d1, cap = _check_model(d0_s, d1_s_per_token, kv_capacity_tokens)
    s = math.fsum(t.rate_per_s * stage_token_weight(t) for t in ts)
    throughput = math.fsum(t.rate_per_s * t.output_tokens for t in ts)
    load = d1 * s
    if load >= 1.0:
        return FluidEquilibrium(
            s_tokens=s,
            m_star_tokens=math.inf,
            delta_t_star_s=math.inf,
            throughput_tokens_per_s=throughput,
            stable=False,
            reason=f"overloaded: d1*S = {load:.6g} >= 1 (no fluid equilibrium)",
        )
    dt = d0 / (1.0 - load)
    m = d0 * s / (1.0 - load)
    if m > cap:
        return FluidEquilibrium(
            s_tokens=s,
            m_star_tokens=m,
            delta_t_star_s=dt,
            throughput_tokens_per_s=throughput,
            stable=False,
            reason=f"memory: M* = {m:.6g} tokens > kv_capacity_tokens C = {cap:.6g}",
        )
    return FluidEquilibrium(
        s_tokens=s,
        m_star_tokens=m,
        delta_t_star_s=dt,
        throughput_tokens_per_s=throughput,
        stable=True,
        reason="",
    )


# --------------------------------------------------------------------------------------------
# WAIT
# --------------------------------------------------------------------------------------------
def _ceil_tol(x: float) -> int:
    """ceil(x) that ignores a relative float excess of ``_REL_TOL`` (x >= 0)."""
    return math.ceil(x * (1.0 - _REL_TOL))


def wait_thresholds(
    types: Sequence[PromptType],
    d0_s: float,
    d1_s_per_token: float,
    kv_capacity_tokens: float,
    margin: float = 0.0,
    d2_s_per_prefill_token: float = 0.0,
) -> tuple[list[int], float]:
    """WAIT thresholds ``n_j`` (prompts) for known output lengths, and their memory ``M^pi``.

    Source: Ao et al., arXiv 2504.11320, WAIT policy (docs/schedulers.md "WAIT and Nested WAIT").
    Conditions (paper)::

        d0 + d1 M^pi <= n_j / lambda_j   for all j,
        M^pi = sum_j n_j (l'_j + 1)(l_j + l'_j / 2),      M* <= M^pi <= C.

    ``n_j / lambda_j`` (s) is the time type j needs to accumulate ``n_j`` waiting prompts; it
    must cover one iteration of a full WAIT batch, ``d0 + d1 M^pi`` (s).

    Derivation.  Take ``n_j = lambda_j T`` for a common cycle time ``T`` (s).  Then
    ``M^pi = T S`` and every condition reads ``T >= d0 + d1 S T``, i.e.
    ``T >= d0 / (1 - d1 S) = dT*`` (and then ``M^pi = T S >= M*``).  Integer thresholds
    ``n_j = ceil(lambda_j T)`` push ``M^pi`` above ``T S``, so we raise ``T`` stepwise::

        T_0 = dT*,   n(T) = ceil(lambda_j T),   T_{i+1} = d0 + d1 M^pi(n(T_i))

    until ``n(T_i)`` satisfies every condition.  ``T_i`` is non-decreasing and bounded (because
    ``d1 S < 1``), the ``n_j`` are integers, so the loop ends; the result is the componentwise
    smallest feasible vector of the form ``ceil(lambda_j T)``: any feasible such vector ``n*``
    has ``T^ = min_j n*_j / lambda_j >= dT*`` with ``n(T^) = n*``, and by induction
    ``T_i <= T^`` so ``n(T_i) <= n*``.  Integer rounding uses a relative tolerance of 1e-12, so
    the inequalities hold up to that relative float tolerance.

    Prefill term (our extension, ``d2_s_per_prefill_token > 0``).  The paper's iteration time counts
    only resident KV tokens, so on hardware where a prompt's prefill is compute-bound (e.g. 512-token
    prompts of a 7B model on an A100: ~58 ms of matmuls against ~9 ms of weight reads) the fluid cycle
    comes out far too short and every threshold is 1.  With ``tau(B) = d0 + d1 * KV(B) + d2 * P(B)``,
    ``P(B)`` the prompt tokens prefilled in the batch, a full WAIT batch prefills ``sum_j n_j l_j``
    tokens and the conditions become ``d0 + d1 M^pi + d2 sum_j n_j l_j <= n_j / lambda_j``.  With
    ``n_j = lambda_j T`` this reads ``T >= d0 + (d1 S + d2 P) T``, ``P = sum_j lambda_j l_j``
    (prompt tokens/s), so ``T_0 = d0 / (1 - d1 S - d2 P)`` and the loop below is unchanged otherwise.
    ``d2 = 0`` is the paper's model.

    Args:
        types: non-empty sequence of ``PromptType``.
        d0_s: ``d0`` (s), > 0.
        d1_s_per_token: ``d1`` (s/token), >= 0.
        kv_capacity_tokens: ``C`` (tokens), > 0.
        d2_s_per_prefill_token: ``d2`` (s per prompt token prefilled), >= 0; see above.
        margin: relative headroom (dimensionless, >= 0) on the cycle condition: the thresholds
            satisfy ``n_j / lambda_j >= (1 + margin)(d0 + d1 M^pi)``; the start is then
            ``T_0 = (1 + margin) d0 / (1 - (1 + margin) d1 S)``.  ``0`` is the paper's condition.

    Returns:
        ``(n, M^pi)``: ``n[j]`` is the integer threshold (>= 1) of ``types[j]`` in input order
        (prompts); ``M^pi`` in tokens.

    Raises:
        ValueError: invalid inputs; or infeasible -- ``(1 + margin) d1 S >= 1`` (fluid overload,
            no finite cycle time), or ``M^pi > C`` (memory; this includes ``M* > C``).
    """
    ts = _check_types(types)
    d0, d1, cap = _check_model(d0_s, d1_s_per_token, kv_capacity_tokens)
    m = _non_negative("margin", margin)
    d2 = _non_negative("d2_s_per_prefill_token", d2_s_per_prefill_token)
    k = 1.0 + m
    weights = [stage_token_weight(t) for t in ts]
    rates = [t.rate_per_s for t in ts]
    inputs = [t.input_tokens for t in ts]
    s = math.fsum(r * w for r, w in zip(rates, weights))
    p_rate = math.fsum(r * li for r, li in zip(rates, inputs))
    load = k * (d1 * s + d2 * p_rate)
    if load >= 1.0:
        raise ValueError(
            f"WAIT infeasible: (1+margin)*(d1*S + d2*P) = {load:.6g} >= 1 "
            f"(S = {s:.6g} tokens/s, d1 = {d1:.6g} s/token, P = {p_rate:.6g} prompt tokens/s, "
            f"d2 = {d2:.6g} s/token, margin = {m:.6g}); "
            "the cycle condition d0 + d1*M^pi + d2*sum_j n_j l_j <= n_j/lambda_j cannot hold for any n"
        )
    m_star = d0 * s / (1.0 - d1 * s - d2 * p_rate)
    if m_star > cap:
        raise ValueError(
            f"WAIT infeasible: M^pi >= M* = {m_star:.6g} tokens > kv_capacity_tokens C = {cap:.6g}"
        )

    def required_cycle(n: list[int]) -> tuple[float, float]:
        mem = math.fsum(ni * w for ni, w in zip(n, weights))
        pre = math.fsum(ni * li for ni, li in zip(n, inputs))
        return mem, k * (d0 + d1 * mem + d2 * pre)

    t_cycle = k * d0 / (1.0 - load)
    n = [max(1, _ceil_tol(r * t_cycle)) for r in rates]
    while True:
        mem, req = required_cycle(n)
        if mem > cap:
            raise ValueError(
                f"WAIT infeasible: M^pi = {mem:.6g} tokens > kv_capacity_tokens C = {cap:.6g} "
                f"(smallest integer thresholds n = {n}; M* = {m_star:.6g})"
            )
        # condition n_j / lambda_j >= req, in the same rounded form as _ceil_tol
        failing = [j for j, r in enumerate(rates) if n[j] < r * req * (1.0 - _REL_TOL)]
        if not failing:
            return n, mem
        # any failing j has ceil(lambda_j req) > n_j, so req > t_cycle and n strictly grows
        t_cycle = max(t_cycle, req)
        n = [max(nj, 1, _ceil_tol(r * t_cycle)) for nj, r in zip(n, rates)]


# --------------------------------------------------------------------------------------------
# Nested WAIT
# --------------------------------------------------------------------------------------------
def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def nested_wait_thresholds(
    types: Sequence[PromptType],
    d0_s: float,
    d1_s_per_token: float,
    kv_capacity_tokens: float,
    total_cap_tl: float,
    num_segments: int | None = None,
    eta: float = 0.05,
) -> NestedWaitPlan:
    """Nested WAIT per-stage thresholds (unknown output lengths), practical parameterisation.

    Source: Ao et al., arXiv 2504.11320, Nested WAIT and its experimental parameterisation
    (docs/schedulers.md "WAIT and Nested WAIT"); segment construction as in the public Vidur fork
    ``Luoxiaogan/vidur_or`` (``general_nested_booking_limit_replica_scheduler.py``).

    Segments.  Boundaries ``b_1 < ... < b_m`` (tokens of output) are the sorted distinct output
    lengths ``l'_j`` (default), or, when ``num_segments = L`` is given, ``L`` equal segments of
    the largest output length ``l'_max``: ``b_k = ceil(k l'_max / L)`` (strictly increasing
    because ``L <= l'_max``).  Segment ``k`` covers decode stages ``(b_{k-1}, b_k]``, ``b_0 = 0``,
    i.e. ``Delta_k = b_k - b_{k-1}`` stages.

    Ratios.  ``Lambda_k = sum of lambda_j over types with l'_j > b_{k-1}`` (arrivals/s reaching
    segment ``k``; for distinct-length boundaries and types sorted by output length this is
    ``sum_{j >= k} lambda_j``).  Continuation probability ``p_k = Lambda_k / Lambda_{k-1}``,
    ``p_1 = 1``; ``q_k = min(p_k + eta, 0.99)`` for ``k >= 2`` and ``q_1 = 1`` (unused).
    Thresholds ``n_k = n_1 prod_{r=2}^{k} q_r``, so ``n_k / n_{k-1} = q_k``.  (docs/schedulers.md writes
    ``prod_{r<k} q_r``; with ``p_1 = 1`` that indexing would shift every ratio by one segment,
    so we index ``q`` so that the ratio into segment ``k`` uses ``p_k``, as the Vidur fork does.)
    The total cap fixes ``n_1``::

        sum_k Delta_k n_k = tl   =>   n_1 = tl / sum_k Delta_k prod_{r=2}^{k} q_r.

    Check (paper): ``p_k < n_k / n_{k-1} < 1`` for ``k >= 2``.  With ``q_k = min(p_k + eta, 0.99)``
    it holds iff ``eta > 0`` and ``p_k < 0.99``; it fails e.g. for equal segments that no type
    ends inside (``p_k = 1``).  Failures are reported in ``ratio_violations``, not raised.  Integer
    rounding of the thresholds can break the check; it is evaluated on the real ``n_k``.
    The paper's logarithmic memory safety buffer: :func:`nested_wait_safety_buffer`.

    Args:
        types: non-empty sequence of ``PromptType``; output lengths must be integers >= 1.
        d0_s: ``d0`` (s), > 0.
        d1_s_per_token: ``d1`` (s/token), >= 0.
        kv_capacity_tokens: ``C`` (tokens), > 0; only used for ``fits_capacity``.
        total_cap_tl: ``tl``, prompts per batch summed over all stages, > 0.
        num_segments: ``None`` (distinct output lengths) or an int ``L`` with
            ``1 <= L <= l'_max``.
        eta: ``eta`` (dimensionless), finite and >= 0; paper default 0.05.

    Returns:
        ``NestedWaitPlan``.

    Raises:
        ValueError: invalid inputs (including non-integer or zero output lengths, or
            ``num_segments`` not an int in ``[1, l'_max]``).
    """
    ts = _check_types(types)
    d0, d1, cap = _check_model(d0_s, d1_s_per_token, kv_capacity_tokens)
    tl = _positive("total_cap_tl", total_cap_tl)
    e = _non_negative("eta", eta)
    for i, t in enumerate(ts):
        if not float(t.output_tokens).is_integer() or t.output_tokens < 1:
            raise ValueError(
                f"types[{i}].output_tokens must be an integer >= 1 for Nested WAIT, "
                f"got {t.output_tokens!r}"
            )
    outs = [int(t.output_tokens) for t in ts]
    l_max = max(outs)
    if num_segments is None:
        bounds = sorted(set(outs))
    else:
        if isinstance(num_segments, bool) or not isinstance(num_segments, numbers.Integral):
            raise ValueError(f"num_segments must be an int or None, got {num_segments!r}")
        nseg = int(num_segments)
        if not 1 <= nseg <= l_max:
            raise ValueError(
                f"num_segments must be in [1, max output length = {l_max}], got {num_segments!r}"
            )
        bounds = [-((-k * l_max) // nseg) for k in range(1, nseg + 1)]  # ceil(k*l_max/L)

    prev = [0] + bounds[:-1]
    lengths = [b - a for a, b in zip(prev, bounds)]
    rates = [math.fsum(t.rate_per_s for t in ts if t.output_tokens > a) for a in prev]
    max_input = [max(t.input_tokens for t in ts if t.output_tokens > a) for a in prev]

    p = [1.0] + [rates[k] / rates[k - 1] for k in range(1, len(bounds))]
    q = [1.0] + [min(pk + e, _Q_MAX) for pk in p[1:]]
    cum = [1.0]
    for qk in q[1:]:
        cum.append(cum[-1] * qk)
    n1 = tl / math.fsum(d * c for d, c in zip(lengths, cum))
    n_real = [n1 * c for c in cum]
    n_int = [max(1, _round_half_up(x)) for x in n_real]

    violations = tuple(
        k + 1
        for k in range(1, len(bounds))
        if not (p[k] < n_real[k] / n_real[k - 1] < 1.0)
    )

    def stage_sum(a: int, b: int) -> int:  # sum_{s=a+1}^{b} s
        return (b * (b + 1) - a * (a + 1)) // 2

    kv = math.fsum(
        ni * (d * lin + stage_sum(a, b))
        for ni, d, lin, a, b in zip(n_int, lengths, max_input, prev, bounds)
    )
    return NestedWaitPlan(
        boundaries_tokens=tuple(bounds),
        segment_lengths=tuple(lengths),
        segment_rates_per_s=tuple(rates),
        p=tuple(p),
        q=tuple(q),
        thresholds=tuple(n_real),
        thresholds_int=tuple(n_int),
        total_cap_tl=tl,
        kv_tokens_at_cap=kv,
        iteration_time_at_cap_s=d0 + d1 * kv,
        fits_capacity=kv <= cap,
        ratio_check_ok=not violations,
        ratio_violations=violations,
    )


def boundary_drift_rate(n_prev: float, n_k: float, p_k: float) -> float:
    """``theta_k > 0``, the root of ``exp(-theta n_k) (1 - p_k + p_k e^theta)^{n_{k-1}} = 1`` (Ao et al., arXiv
    2504.11320, Theorem "Nested WAIT heavy traffic", eq. ``nested_wait_memory_total``; the paper's
    ``papers/unknown_type.tex`` in ``Luoxiaogan/vidur_or``): the exponential rate of the tail of segment ``k``'s
    boundary queue, whose input per threshold batch is binomial ``(n_{k-1}, p_k)`` and whose service is ``n_k``.

    In logs, ``g(theta) = n_{k-1} ln(1 - p + p e^theta) - theta n_k``: ``g(0) = 0``, ``g'(0) = p n_{k-1} - n_k``, ``g``
    convex and ``g -> (n_{k-1} - n_k) theta`` at infinity, so a positive root exists iff ``p n_{k-1} < n_k <
    n_{k-1}`` (the paper's drift condition ``p_k < n_k / n_{k-1} < 1``); found by bisection to 1e-12 relative.
    Checked by hand: ``n_{k-1} = 2, n_k = 1, p = 1/4`` gives ``(3/4 + x/4)^2 = x``, ``x = e^theta = 9``,
    ``theta = ln 9`` (``tests/test_wait_memory.py``). Dimensionless (per prompt of the boundary queue).

    Raises:
        ValueError: the drift condition fails (no finite buffer: the boundary queue does not drain), or an
            argument is not finite / out of range (``n`` > 0, ``0 < p < 1``).
    """
    a, b = _positive("n_prev", n_prev), _positive("n_k", n_k)
    p = _positive("p_k", p_k)
    if not p < 1.0:
        raise ValueError(f"p_k must be in (0, 1), got {p_k!r}")
    if not p * a < b < a:
        raise ValueError(f"drift condition p_k < n_k / n_(k-1) < 1 fails: n_(k-1) = {a:.6g}, n_k = {b:.6g}, "
                         f"p_k = {p:.6g} (ratio {b / a:.6g}): no finite safety buffer")

    def g(t: float) -> float:
        # ln(1 - p + p e^t) computed stably for large t: t + ln(p + (1 - p) e^-t)
        return a * (t + math.log(p + (1.0 - p) * math.exp(-t))) - t * b
    lo, hi = 0.0, 1.0
    while g(hi) <= 0.0:         # g < 0 just above 0 (g'(0) < 0); it grows without bound
        lo, hi = hi, hi * 2.0
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        if g(mid) > 0.0:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def nested_wait_safety_buffer(plan: NestedWaitPlan, types: Sequence[PromptType], d0_s: float, horizon_s: float,
                              delta: float, zeta: float = 1.0) -> tuple[float, tuple[float, ...]]:
    """Nested WAIT's memory safety buffer, tokens: the part of ``M_req`` beyond ``M^pi`` in the paper's
    Theorem "Nested WAIT heavy traffic" (Ao et al., arXiv 2504.11320, eq. ``nested_wait_memory_total``)::

        buffer = sum_{k=2}^m (l + l'_{k-1}) (n_k + theta_k^-1 ln(m (1 + zeta T / d0) / delta))

    with ``l'_{k-1}`` the boundary before segment ``k`` (``plan.boundaries_tokens[k-2]``), ``n_k`` the plan's real
    per-stage thresholds, ``theta_k`` from :func:`boundary_drift_rate` with the plan's ``p_k``, and ``l`` the
    prompt length (the paper's common prefill length; here the longest mean prompt among the types that reach
    segment ``k``, the plan's own convention). A segment with ``n_k >= n_{k-1}`` has a deterministically bounded
    boundary queue (the paper: "handled separately without this logarithmic tail term"): its term is
    ``(l + l'_{k-1}) n_k``. One segment: 0 (no boundary queue). The theorem's guarantee: with ``C >= M^pi +
    buffer``, no overflow over ``[0, T]`` with probability at least ``1 - delta``.

    Args:
        plan: :func:`nested_wait_thresholds`' plan. types: its prompt types. d0_s: ``d0`` (s), > 0.
        horizon_s: ``T`` (s), > 0. delta: failure probability, in (0, 1). zeta: the paper's scale, > 0
            (1: the unscaled system).

    Returns:
        ``(buffer_tokens, thetas)``: thetas per segment ``k >= 2`` (``inf`` where ``n_k >= n_{k-1}``).

    Raises:
        ValueError: a bad argument, or a segment whose drift condition ``p_k < n_k / n_{k-1}`` fails
            (:func:`boundary_drift_rate`: no finite buffer).
    """
    d0 = _positive("d0_s", d0_s)
    t = _positive("horizon_s", horizon_s)
    z = _positive("zeta", zeta)
    dl = _positive("delta", delta)
    if not dl < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    ts = _check_types(types)
    m = len(plan.boundaries_tokens)
    log_term = math.log(m * (1.0 + z * t / d0) / dl)
    total, thetas = 0.0, []
    for k in range(1, m):                      # 0-based: segment k + 1 of the paper, k + 1 >= 2
        prev_b = plan.boundaries_tokens[k - 1]
        l_in = max(x.input_tokens for x in ts if x.output_tokens > prev_b)
        n_prev, n_k = plan.thresholds[k - 1], plan.thresholds[k]
        if n_k >= n_prev:
            thetas.append(math.inf)
            total += (l_in + prev_b) * n_k
            continue
        th = boundary_drift_rate(n_prev, n_k, plan.p[k])
        thetas.append(th)
        total += (l_in + prev_b) * (n_k + log_term / th)
    return total, tuple(thetas)


# --------------------------------------------------------------------------------------------
# iteration-time coefficients from a roofline
# --------------------------------------------------------------------------------------------
def linear_iteration_coefficients(
    weight_bytes: float,
    kv_bytes_per_token: float,
    mem_bw_bytes_per_s: float,
    mem_efficiency: float,
    overhead_s: float,
) -> tuple[float, float]:
    """Map a memory-bound decode roofline to the paper's ``tau(B) = d0 + d1 sum_i (l_i + s_i)``.

    Source: iteration-time model of Ao et al., arXiv 2504.11320 (docs/schedulers.md "WAIT and
    Nested WAIT"); efficiency factors as in docs/hardware.md.  A memory-bound decode
    iteration reads all weights once plus every resident KV token once at effective bandwidth
    ``bw * eff``::

        d0 = weight_bytes / (bw * eff) + overhead_s        [s]
        d1 = kv_bytes_per_token / (bw * eff)               [s/token]

    Args:
        weight_bytes: model weight bytes read per iteration (B), > 0.
        kv_bytes_per_token: KV-cache bytes per token, all layers (B/token), > 0.
        mem_bw_bytes_per_s: peak memory bandwidth (B/s), > 0.
        mem_efficiency: fraction of peak reached, in (0, 1].
        overhead_s: fixed per-iteration overhead (s), >= 0.

    Returns:
        ``(d0_s, d1_s_per_token)``.

    Raises:
        ValueError: any argument non-finite, non-numeric or out of range (named with its value).
    """
    wb = _positive("weight_bytes", weight_bytes)
    kvb = _positive("kv_bytes_per_token", kv_bytes_per_token)
    bw = _positive("mem_bw_bytes_per_s", mem_bw_bytes_per_s)
    eff = _positive("mem_efficiency", mem_efficiency)
    if eff > 1.0:
        raise ValueError(f"mem_efficiency must be in (0, 1], got {mem_efficiency!r}")
    ov = _non_negative("overhead_s", overhead_s)
    eff_bw = bw * eff
    return wb / eff_bw + ov, kvb / eff_bw


def prefill_aware_cycle_s(
    types: Sequence[PromptType],
    d0_s: float,
    d1_s_per_token: float,
    d2_s_per_prefill_token: float,
) -> float:
    """Fluid iteration time with a prefill term, ``dT* = d0 / (1 - d1 S - d2 P)`` (s).

    ``S`` as in ``fluid_equilibrium`` (tokens/s), ``P = sum_j lambda_j l_j`` (prompt tokens/s); the
    derivation is the one in ``wait_thresholds`` (``d2 = 0`` gives the paper's ``dT*``).  Every stage of
    type ``j`` then holds ``lambda_j dT*`` prompts, so a batch holds
    ``dT* sum_j lambda_j (l'_j + 1)`` prompts (Little's law over the ``l'_j + 1`` stages).

    Raises:
        ValueError: invalid inputs, or ``d1 S + d2 P >= 1`` (overloaded: no finite cycle).
    """
    ts = _check_types(types)
    d0 = _positive("d0_s", d0_s)
    d1 = _non_negative("d1_s_per_token", d1_s_per_token)
    d2 = _non_negative("d2_s_per_prefill_token", d2_s_per_prefill_token)
    s = math.fsum(t.rate_per_s * stage_token_weight(t) for t in ts)
    p_rate = math.fsum(t.rate_per_s * t.input_tokens for t in ts)
    load = d1 * s + d2 * p_rate
    if load >= 1.0:
        raise ValueError(f"overloaded: d1*S + d2*P = {load:.6g} >= 1 (no finite fluid cycle)")
    return d0 / (1.0 - load)
