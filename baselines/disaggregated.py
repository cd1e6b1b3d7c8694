"""Fully disaggregated serving (vLLM's P/D proxy): every turn's prompt is prefilled on a prefiller and its
KV moved to a decoder, which pulls only the blocks it does not already hold in its prefix cache.

Prefiller: the one with the least queued prefill work (``harness.core.policy.pick_prefiller``). Decoder (``decoder_choice``):
``least_kv`` (lowest KV occupancy each turn, so a conversation may move and re-pull its whole context)
or ``sticky`` (turn 0 least-loaded, then the same decoder, so only new blocks move).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.policy import (AdmitAll, ClusterView, Placement, PolicyContext, TurnView, least_loaded, occupancy,
                            pick_prefiller, register)


@dataclass
class DisaggregatedConfig:
    """decoder_choice: ``least_kv`` | ``sticky``."""

    name: str = "disaggregated"
    decoder_choice: str = "least_kv"


class Disaggregated(AdmitAll):
    """Per-turn P/D disaggregation."""

    name = "disaggregated"

    def __init__(self, decoder_choice: str):
        self.decoder_choice = decoder_choice

    def place(self, turn: TurnView, view: ClusterView, now: float) -> Placement:
        p = pick_prefiller(view).index
        if self.decoder_choice == "sticky" and turn.prev_decode_instance >= 0:
            return Placement(p, turn.prev_decode_instance, "sticky decoder")
        decoders = view.by_role("decoder")
        d = least_loaded(decoders)
        return Placement(p, d.index, f"least-kv decoder kv={d.kv_used_frac:.3f}",
                         tuple((i.index, occupancy(i)) for i in decoders))


@register("disaggregated", DisaggregatedConfig, roles=("prefiller", "decoder"))
def make(cfg: DisaggregatedConfig, ctx: PolicyContext) -> Disaggregated:
    if cfg.decoder_choice not in ("least_kv", "sticky"):
        raise ValueError(f"scheduler.decoder_choice must be 'least_kv' or 'sticky', got {cfg.decoder_choice!r}")
    return Disaggregated(cfg.decoder_choice)
