"""Nested WAIT: threshold batching with unknown output lengths (Ao et al., arXiv 2504.11320,
Algorithm 2; docs/wait.md), run by each engine as its batch rule, with collocated placement.

The decode horizon is split into segments at the workload's output lengths: the mean output tokens of
each non-empty ``output_bins`` bin (``num_segments = 0``), or ``num_segments`` equal segments of the
longest one. Per-stage thresholds follow the paper's practical parameterisation
(``baselines.wait.fluid.nested_wait_thresholds``): ``q_k = min(p_k + eta, 0.99)`` from the continuation
probabilities, ``n_k = n_1 prod q``, ``sum_k Delta_k n_k = tl``; each segment's cap ``Delta_k n_k`` is
rounded and spread over its stages (``segment_stage_caps``); ``stage_caps`` chooses what a stage cap that
computes to 0 does: ``raised`` (default, ours) raises it to 1, so a segment with ``B_k < Delta_k`` takes up
to ``Delta_k`` per step (30 for the two-type workload's segment 2, where ``B_2 = 9``); ``rotate`` keeps
the paper's totals ``B_k`` and rotates the extra ones over the stages from step to step, as the authors'
code does (``NestedWaitRule(rotate=True)``). ``thresholds`` chooses ``tl``:

* ``tl``: ``total_cap_tl`` as given (the paper's experiments tune it on a grid);
* ``fluid``: ``tl = dT* sum_j lambda_j (l'_j + 1)``, the prompts in service at the fluid equilibrium
  (Little's law), with the prefill-aware cycle ``dT* = d0 / (1 - d1 S - d2 P)``
  (``baselines.wait.fluid.prefill_aware_cycle_s``); ``total_cap_tl`` if the fluid model is overloaded.

No output length is used at run time. The rule is :class:`baselines.wait.fluid_admission.NestedWaitRule`.

The memory safety buffer (``safety_buffer``): the paper's Theorem "Nested WAIT heavy traffic" requires
``C >= M^pi + buffer`` with ``buffer = sum_{k>=2} (l + l'_{k-1}) (n_k + theta_k^-1 ln(m (1 + T / d0) / delta))``
(``baselines.wait.fluid.nested_wait_safety_buffer``); its experiments tune ``tl`` and state no buffer, so how
a finite engine uses it is open, a named knob with both options reported (docs/wait.md):

* ``off`` (default; the paper's experiments): admissions as Algorithm 2; on KV overflow the engine evicts
  paused residents, most recently admitted first;
* ``reserve``: the buffer's tokens are held free: a step admits a waiting prompt only while the free KV
  left after it stays at or above the buffer (``NestedWaitRule(reserve_tokens=...)``), ``delta =
  safety_delta``, ``T = safety_horizon_s`` (default: the trace's arrival span, prompts / rate), ``d0`` the
  instance's fluid coefficient.
"""

from __future__ import annotations


from dataclasses import dataclass, field, replace
from typing import Optional

from baselines.wait.fluid_admission import (STAGE_CAP_RULES, NestedWaitRule, check_knobs, fluid_flag,
                                       fluid_reason, instance_coefficients, paper_types, prefill_coefficient, prompt_types,
                                       segment_stage_caps)
from baselines.wait.fluid import nested_wait_safety_buffer, nested_wait_thresholds, prefill_aware_cycle_s
from harness.core.policy import BatchRulePolicy, PolicyContext, register


@dataclass
class NestedWaitConfig:
    """output_bins: where segment boundaries come from (tokens of output); thresholds: ``tl`` or
    ``fluid``; total_cap_tl: the paper's ``tl``; eta: q_k slack; num_segments: 0 = one segment per
    non-empty bin, else equal segments; max_wait_s: finite-horizon timeout, s; idle_policy: ``wait``
    (Algorithm 2) or ``decode_residents``; stage_caps: ``raised`` (a cap of 0 becomes 1) or ``rotate``
    (the segment totals kept, the extra ones rotating from step to step); safety_buffer: ``off`` (the paper's
    experiments) or ``reserve`` (the Theorem's memory safety buffer held free at admission, module docstring);
    safety_delta: its failure probability ``delta``, in (0, 1); safety_horizon_s: its horizon ``T``, s
    (``None``: the trace's arrival span, prompts / arrival rate)."""

    name: str = "nested_wait"
    output_bins: list[int] = field(default_factory=lambda: [64, 256, 1024])
    thresholds: str = "tl"
    total_cap_tl: float = 256.0
    eta: float = 0.05
    num_segments: int = 0
    max_wait_s: float = 0.5
    idle_policy: str = "wait"
    stage_caps: str = "raised"
    safety_buffer: str = "off"
    safety_delta: float = 0.05
    safety_horizon_s: Optional[float] = None


SAFETY_BUFFERS = ("off", "reserve")


class NestedWait(BatchRulePolicy):
    """Nested WAIT batching in every engine + sticky collocated placement, no admission hold.
    ``fluid_infeasible``: per instance, ``""`` or why its fluid cycle (``thresholds=fluid``'s
    ``prefill_aware_cycle_s``, computed in either mode) does not exist; :meth:`summary` names it."""

    name = "nested_wait"

    def __init__(self, rules, plan_note: str, fluid_infeasible=()):
        super().__init__(rules, plan_note)
        self.fluid_infeasible = list(fluid_infeasible)

    def summary(self) -> dict:
        """``fluid_plan_infeasible`` and its reason (docs/metrics.md, "Validity")."""
        return fluid_flag(self.fluid_infeasible)


def _arrival_span_s(ctx: PolicyContext) -> float:
    """The trace's arrival span, s: its turns over its turn arrival rate (``len(turn_output_tokens) /
    (rate_per_s x mean_turns)``), the safety buffer's default horizon ``T``."""
    w = ctx.workload
    return len(w.turn_output_tokens) / (w.rate_per_s * w.mean_turns)


@register("nested_wait", NestedWaitConfig, forms_batches=True, reads_workload=True)
def make(cfg: NestedWaitConfig, ctx: PolicyContext) -> NestedWait:
    edges = check_knobs(cfg.output_bins, cfg.max_wait_s, cfg.thresholds, cfg.total_cap_tl, cfg.idle_policy)
    if not 0 <= cfg.eta < 1:
        raise ValueError(f"scheduler.eta must be in [0, 1), got {cfg.eta!r}")
    if cfg.stage_caps not in STAGE_CAP_RULES:
        raise ValueError(f"scheduler.stage_caps must be one of {STAGE_CAP_RULES}, got {cfg.stage_caps!r}")
    if cfg.safety_buffer not in SAFETY_BUFFERS:
        raise ValueError(f"scheduler.safety_buffer must be one of {SAFETY_BUFFERS}, got {cfg.safety_buffer!r}")
    if not 0 < cfg.safety_delta < 1:
        raise ValueError(f"scheduler.safety_delta must be in (0, 1), got {cfg.safety_delta!r}")
    if cfg.safety_horizon_s is not None and not cfg.safety_horizon_s > 0:
        raise ValueError(f"scheduler.safety_horizon_s must be > 0 or null, got {cfg.safety_horizon_s!r}")
    if not (isinstance(cfg.num_segments, int) and cfg.num_segments >= 0):
        raise ValueError(f"scheduler.num_segments must be an int >= 0, got {cfg.num_segments!r}")
    n_inst = len(ctx.cluster_roles)
    types, _ = prompt_types(ctx, edges, n_inst)  # a config problem (no arrival rate) is an error
    types = [replace(t, output_tokens=float(max(1, round(t.output_tokens)))) for t in types]
    longest = int(max(t.output_tokens for t in types))
    if cfg.num_segments > longest:
        raise ValueError(f"scheduler.num_segments must be <= the longest mean output ({longest}), "
                         f"got {cfg.num_segments}")
    rules, notes, infeasible = [], [], []
    for i in range(n_inst):
        d0, d1 = instance_coefficients(ctx, i)
        tl, how = cfg.total_cap_tl, f"tl={cfg.total_cap_tl:g}"
        if cfg.thresholds == "fluid":
            try:
                dt = prefill_aware_cycle_s(paper_types(types), d0, d1, prefill_coefficient(ctx, i))
                tl = dt * sum(t.rate_per_s * t.output_tokens for t in types)
                how = f"fluid tl={tl:.2f} (cycle {dt * 1e3:.1f} ms)"
                infeasible.append("")
            except ValueError as e:
                how = f"fluid infeasible, tl={tl:g}: {e}"
                infeasible.append(str(e))
        else:   # the fluid model's verdict on this workload, not used by the tl plan
            infeasible.append(fluid_reason(lambda: prefill_aware_cycle_s(paper_types(types), d0, d1,
                                                                          prefill_coefficient(ctx, i))))
        plan = nested_wait_thresholds(types, d0, d1, ctx.kv_capacity_tokens[i], tl,
                                      num_segments=cfg.num_segments or None, eta=cfg.eta)
        rotate = cfg.stage_caps == "rotate"
        caps = segment_stage_caps(plan.segment_lengths, plan.thresholds, raise_zero=not rotate)
        reserve, buf_note = 0.0, ""
        if cfg.safety_buffer == "reserve":
            horizon = cfg.safety_horizon_s or _arrival_span_s(ctx)
            try:
                reserve, thetas = nested_wait_safety_buffer(plan, types, d0, horizon, cfg.safety_delta)
            except ValueError as e:
                raise ValueError(f"scheduler.safety_buffer=reserve: {e}") from None
            longest_prompt = max(t.input_tokens for t in types)
            if reserve + longest_prompt > ctx.kv_capacity_tokens[i]:
                raise ValueError(f"scheduler.safety_buffer=reserve: the buffer ({reserve:.0f} tokens) and the longest "
                                 f"mean prompt ({longest_prompt:.0f}) exceed instance {i}'s KV capacity "
                                 f"({ctx.kv_capacity_tokens[i]} tokens): nothing could be admitted")
            buf_note = (f"; safety buffer {reserve:.0f} tokens reserved (delta={cfg.safety_delta:g}, T={horizon:.1f} s, "
                        f"theta={[round(x, 4) for x in thetas]})")
        rules.append(NestedWaitRule(plan.boundaries_tokens, caps, cfg.max_wait_s, cfg.idle_policy, rotate=rotate,
                                    reserve_tokens=reserve))
        notes.append(f"{how}; boundaries={list(plan.boundaries_tokens)} n_k={[round(x, 3) for x in plan.thresholds]} "
                     f"segment caps={[sum(c) for c in caps]}{' (rotating)' if rotate else ''} q={[round(q, 3) for q in plan.q]}"
                     + buf_note)
    return NestedWait(rules, notes[0], infeasible)
