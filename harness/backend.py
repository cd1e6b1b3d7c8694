"""What the controller asks of a backend, and the job record it hands over for one turn.

A backend executes turns (local or P/D), reports events through the job's callbacks, and reports the
observable per-instance state. ``harness.sim.backend.SimBackend`` implements it over the event
simulator; a real backend implements the same methods over ``vllm serve`` instances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol

from harness.policy import Placement


@dataclass(slots=True, eq=False)
class TurnJob:
    """One turn handed to a backend, and what the backend measured about it.

    Inputs: conversation_id, turn, prompt_tokens, output_tokens (the trace's, = ``max_tokens`` with
    ``ignore_eos``), reused (the conversation's per-turn reused-prefix tokens, for prefix validity),
    placement, and the callbacks ``on_prefill_done(job)``, ``on_first_token(job)``,
    ``on_finish(job)``, ``on_fail(job, reason)``.
    submit_s: when the turn became ready; admit_s: when admission released it (s).
    Outputs (s for times, tokens for counts): start_s, prefill_done_s, first_token_s, finish_s,
    cached_tokens (prefix-cache hit where the prompt was prefilled), decode_cached_tokens (P/D: prompt
    tokens the decoder did not compute: its own prefix hits, plus connector loads on real vLLM),
    transfer_tokens and transfer_s (KV moved P->D and the time the transfer took, incl. link queueing;
    -1 where not observable, i.e. on real vLLM), preemptions, error.
    """

    conversation_id: str
    turn: int
    prompt_tokens: int
    output_tokens: int
    reused: tuple
    placement: Placement
    on_prefill_done: Callable[["TurnJob"], None]
    on_first_token: Callable[["TurnJob"], None]
    on_finish: Callable[["TurnJob"], None]
    on_fail: Callable[["TurnJob", str], None]
    submit_s: float = 0.0
    admit_s: float = 0.0
    start_s: float = 0.0
    prefill_done_s: Optional[float] = None
    first_token_s: Optional[float] = None
    finish_s: Optional[float] = None
    cached_tokens: int = 0
    decode_cached_tokens: int = 0
    prefill_computed_tokens: int = 0
    transfer_tokens: int = 0
    transfer_s: float = 0.0
    preemptions: int = 0
    error: str = ""


@dataclass(frozen=True, slots=True)
class InstanceState:
    """Observed state of one instance (vLLM ``/metrics`` names in brackets).

    kv_used_tokens [kv_cache_usage_perc x capacity], num_running [num_requests_running],
    num_waiting [num_requests_waiting], energy_j (cumulative since the run started, J; NaN if
    unknown), prefix_hit_tokens (cumulative prefix-cache hits, tokens).
    """

    kv_used_tokens: int
    num_running: int
    num_waiting: int
    energy_j: float
    prefix_hit_tokens: int = 0


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """Static description of one instance: name, role, hardware profile name, KV capacity (tokens),
    prefill throughput (tokens/s) and idle decode step time (s) estimates."""

    index: int
    name: str
    role: str
    hardware: str
    kv_capacity_tokens: int
    prefill_tokens_per_s: float
    decode_step_s: float
    power_cap_w: float = float("nan")


class Backend(Protocol):
    """The execution side of a run."""

    infos: tuple[InstanceInfo, ...]

    def start_turn(self, job: TurnJob) -> None:
        """Begin executing ``job`` now; callbacks report progress."""

    def observe(self) -> tuple[InstanceState, ...]:
        """Current state of each instance."""

    def run(self) -> None:
        """Drive the clock until no work is left."""
