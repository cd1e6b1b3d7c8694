"""Collocated serving: every instance prefills and decodes; a conversation sticks to one instance.

Turn 0 goes to the least-loaded instance (lowest KV occupancy, then fewest conversations); later turns
go back to the same instance so prefix caching serves the shared context (PAPERS.md, "Collocated").
Instance roles are ignored: on a P/D cluster every instance serves as a collocated one.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.policy import AdmitAll, ClusterView, Placement, PolicyContext, TurnView, least_loaded, register


@dataclass
class CollocatedConfig:
    """No knobs besides the name."""

    name: str = "collocated"


def sticky_instance(turn: TurnView, view: ClusterView) -> tuple[int, str]:
    """The instance a collocated-style conversation runs on: its previous one, or the least loaded."""
    if turn.prev_decode_instance >= 0:
        return turn.prev_decode_instance, "sticky"
    i = least_loaded(view.instances)
    return i.index, f"least-loaded kv={i.kv_used_frac:.3f}"


class Collocated(AdmitAll):
    """Sticky collocated placement, no admission control."""

    name = "collocated"

    def place(self, turn: TurnView, view: ClusterView, now: float) -> Placement:
        i, why = sticky_instance(turn, view)
        return Placement(i, i, why)


@register("collocated", CollocatedConfig)
def make(cfg: CollocatedConfig, ctx: PolicyContext) -> Collocated:
    return Collocated()
