"""Per-instance threshold admission shared by WAIT and Nested WAIT (fluid-guided admission control).

Placement is collocated-style (sticky; least-loaded at turn 0). Held turns are grouped by their target
instance and a class (WAIT: the prompt type, by predicted output length; Nested WAIT: one entry class).
A group is released when it holds at least its threshold ``n`` turns (the first ``n`` go; WAIT's batch
takes ``min(n_j, count)`` of a type), when its oldest turn has waited ``max_wait_s`` (a finite trace
needs flushing; the paper's model has infinite horizons), and only while the instance's running batch
stays under ``max_active`` (the policy's cap on its active set). KV is guarded by vLLM itself
(preemption) in this harness, as in the paper's baselines.

The fluid coefficients of an instance are its hardware hints (``PolicyContext.hints``: the memory-bound
decode step ``d0 + d1 * KV tokens`` of the hardware profile's step model: weights and fixed overheads,
KV reads at the KV-cache bandwidth efficiency).
Arrival rates per instance: turns/s of the workload (conversation rate x mean turns) split evenly over
the instances.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from baselines.collocated import Collocated
from harness.fluid import PromptType
from harness.policy import Admission, ClusterView, PolicyContext, TurnView, sticky_instance


def instance_coefficients(ctx: PolicyContext, i: int) -> tuple[float, float]:
    """``(d0_s, d1_s_per_token)`` of instance ``i``: its hardware hints (from the hardware and model
    profiles)."""
    h = ctx.hints[i]
    return h.fluid_d0_s, h.fluid_d1_s_per_token


def prompt_types(ctx: PolicyContext, edges: Sequence[int], num_instances: int
                 ) -> tuple[list[PromptType], np.ndarray]:
    """Fluid prompt types from the workload: one per output-length bin (``edges``, tokens).

    Returns the types (rate per instance, mean prompt tokens, mean output tokens; empty bins are
    dropped) and the bin index of each kept type. Raises ValueError for an open (fixed-arrival)
    workload, which has no rate.
    """
    w = ctx.workload
    if not np.isfinite(w.rate_per_s):
        raise ValueError("fluid thresholds need an arrival rate (workload.arrival=poisson or gamma)")
    turn_rate = w.rate_per_s * w.mean_turns / num_instances
    bins = np.searchsorted(np.asarray(edges), w.turn_output_tokens, side="left")
    types, kept = [], []
    for b in range(len(edges) + 1):
        m = bins == b
        if m.any():
            types.append(PromptType(turn_rate * m.mean(), float(w.turn_prompt_tokens[m].mean()),
                                    float(w.turn_output_tokens[m].mean())))
            kept.append(b)
    return types, np.asarray(kept)


def check_knobs(output_bins: Sequence[int], max_wait_s: float) -> list[int]:
    """Validate the knobs WAIT and Nested WAIT share; returns the bins as a list.

    Raises:
        ValueError: naming ``scheduler.output_bins`` or ``scheduler.max_wait_s``.
    """
    edges = list(output_bins)
    if sorted(edges) != edges or any(e < 1 for e in edges):
        raise ValueError(f"scheduler.output_bins must be increasing positive token counts, got {edges}")
    if not max_wait_s >= 0:
        raise ValueError(f"scheduler.max_wait_s must be >= 0, got {max_wait_s!r}")
    return edges


class ThresholdAdmission(Collocated):
    """Base: group held turns by (instance, class) and release groups that reach their threshold;
    placement is :class:`~baselines.collocated.Collocated`'s (sticky)."""

    name = "threshold"

    def __init__(self, thresholds: list[dict[int, int]], classify: Callable[[TurnView], int],
                 max_wait_s: float, max_active: int, plan_note: str):
        self.thresholds, self.classify = thresholds, classify
        self.max_wait_s, self.max_active, self.plan_note = max_wait_s, max_active, plan_note

    def admit(self, queue: Sequence[TurnView], view: ClusterView, now: float) -> Admission:
        groups: dict[tuple[int, int], list[int]] = {}
        for qi, t in enumerate(queue):
            inst, _ = sticky_instance(t, view)
            groups.setdefault((inst, self.classify(t)), []).append(qi)
        admit: list[int] = []
        active = {i.index: i.num_running for i in view.instances}
        next_deadline = None
        for (inst, cls), idx in groups.items():
            n = self.thresholds[inst].get(cls, 1)
            deadline = queue[idx[0]].submit_s + self.max_wait_s
            timed_out = now >= deadline     # the same float as the timer set below, so the timer releases
            if len(idx) >= n or timed_out:
                take = idx if timed_out else idx[:n]
                room = max(0, self.max_active - active[inst])
                take = take[:room]
                active[inst] += len(take)
                admit.extend(take)
            elif next_deadline is None or deadline < next_deadline:
                # below its threshold: poll again when its oldest turn times out. A group held only for
                # lack of room needs no timer: every finish polls again.
                next_deadline = deadline
        reason = f"{self.name}: {self.plan_note}"
        return Admission(tuple(sorted(admit)), reason, next_deadline)

