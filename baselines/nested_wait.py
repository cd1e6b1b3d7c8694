"""Nested WAIT: threshold admission with unknown output lengths (Ao et al., arXiv 2504.11320;
docs/schedulers.md "wait", "nested_wait"), per instance, with collocated placement.

The decode horizon is split into segments at the workload's output-length bins (``output_bins``);
``harness.fluid.nested_wait_thresholds`` gives per-stage thresholds ``n_k`` with ratios ``q_k`` from the
continuation probabilities and ``sum_k Delta_k n_k = total_cap_tl``. New turns enter segment 1: they are
released to an instance when ``n_1`` of them are held for it (or after ``max_wait_s``), and the instance's
running batch is capped at ``sum_k Delta_k n_k`` (the plan's active set, = tl up to rounding). No output length is used or predicted.

Not modelled (stated, left for later): pausing running requests of later segments when a segment misses
its threshold (that needs an engine-side hook), and the paper's logarithmic memory safety buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from baselines.fluid_admission import ThresholdAdmission, check_knobs, instance_coefficients, prompt_types
from harness.fluid import nested_wait_thresholds
from harness.policy import PolicyContext, register


@dataclass
class NestedWaitConfig:
    """output_bins: segment boundaries (tokens of output); total_cap_tl: the paper's system-wide batch
    cap tl; eta: q_k slack; max_wait_s: hold timeout, s."""

    name: str = "nested_wait"
    output_bins: list[int] = field(default_factory=lambda: [64, 256, 1024])
    total_cap_tl: float = 256.0
    eta: float = 0.05
    max_wait_s: float = 0.5


class NestedWait(ThresholdAdmission):
    """Nested WAIT admission + sticky collocated placement."""

    name = "nested_wait"


@register("nested_wait", NestedWaitConfig)
def make(cfg: NestedWaitConfig, ctx: PolicyContext) -> NestedWait:
    edges = check_knobs(cfg.output_bins, cfg.max_wait_s)
    if not cfg.total_cap_tl > 0:
        raise ValueError(f"scheduler.total_cap_tl must be > 0, got {cfg.total_cap_tl!r}")
    if not 0 <= cfg.eta < 1:
        raise ValueError(f"scheduler.eta must be in [0, 1), got {cfg.eta!r}")
    n_inst = len(ctx.cluster_roles)
    types, _ = prompt_types(ctx, edges, n_inst)  # a config problem (no arrival rate) is an error
    types = [replace(t, output_tokens=float(max(1, round(t.output_tokens)))) for t in types]
    thresholds, caps, notes = [], [], []
    for i in range(n_inst):
        try:
            d0, d1 = instance_coefficients(ctx, i)
            plan = nested_wait_thresholds(types, d0, d1, ctx.kv_capacity_tokens[i], cfg.total_cap_tl,
                                          eta=cfg.eta)
            thresholds.append({0: plan.thresholds_int[0]})
            caps.append(sum(d * n for d, n in zip(plan.segment_lengths, plan.thresholds_int)))
            notes.append(f"n_k={list(plan.thresholds_int)} q={[round(q, 3) for q in plan.q]}")
        except ValueError as e:  # the fluid model is infeasible here: no batching (plan_note says why)
            thresholds.append({})
            caps.append(256)
            notes.append(f"fluid model infeasible, thresholds 1: {e}")
    return NestedWait(thresholds, lambda t: 0, cfg.max_wait_s, min(caps), notes[0])
