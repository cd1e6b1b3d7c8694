"""Collocated serving: every instance prefills and decodes; a conversation sticks to one instance.

Turn 0 goes to the least-loaded instance (lowest KV occupancy, then fewest conversations); later turns
go back to the same instance so prefix caching serves the shared context (docs/schedulers.md, "collocated").
Instance roles are ignored: on a P/D cluster every instance serves as a collocated one.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.policy import AdmitAll, ClusterView, Placement, PolicyContext, TurnView, occupancy, register, sticky_instance


@dataclass
class CollocatedConfig:
    """No knobs besides the name."""

    name: str = "collocated"


class Collocated(AdmitAll):
    """Sticky collocated placement, no admission control."""

    name = "collocated"

    def place(self, turn: TurnView, view: ClusterView, now: float) -> Placement:
        i, why = sticky_instance(turn, view)
        cands = () if turn.prev_decode_instance >= 0 else tuple((v.index, occupancy(v)) for v in view.instances)
        return Placement(i, i, why, cands)


@register("collocated", CollocatedConfig)
def make(cfg: CollocatedConfig, ctx: PolicyContext) -> Collocated:
    return Collocated()
