"""Collocated serving: every instance prefills and decodes; a conversation sticks to one instance.

Turn 0 goes to the least-loaded instance (lowest KV occupancy, then fewest conversations); later turns
go back to the same instance so prefix caching serves the shared context (docs/schedulers.md, "collocated").
Instance roles are ignored: on a P/D cluster every instance serves as a collocated one.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.policy import PolicyContext, StickyCollocated, register


@dataclass
class CollocatedConfig:
    """No knobs besides the name."""

    name: str = "collocated"


class Collocated(StickyCollocated):
    """Sticky collocated placement, no admission control (``harness.core.policy.StickyCollocated``)."""

    name = "collocated"


@register("collocated", CollocatedConfig)
def make(cfg: CollocatedConfig, ctx: PolicyContext) -> Collocated:
    return Collocated()
