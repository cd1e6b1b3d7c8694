"""The policy interface: what a scheduler variant sees, what it decides, and the registry.

A policy is pure and synchronous: ``(turns, ClusterView, now) -> decision``. It never touches the
simulator or a server; it sees frozen snapshots that hold only what a production router can observe
(per-instance role, hardware, queue length, running count, KV tokens used and capacity, what the
controller itself sent where). The same policy objects drive the simulated and the real backends.

The oracle boundary lives in the types: a :class:`TurnView` carries the prompt's token counts (the
router sees the prompt) but not the true output length or tool time. A policy that needs those
(AMPD, WAIT) gets them from an explicit :class:`Predictor` whose error is injected by config.

Layering: this module imports only ``harness.core.profiles`` (the KV-transfer formula). ``baselines/``
imports only this module (and ``baselines.wait.fluid`` for the fluid model); the registry is filled by
importing ``baselines`` (``harness.core.schedulers``), never from here, so there is no import cycle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

from harness import LazyModule

from harness.core.profiles import kv_transfer_s
from harness.core.registry import Registry, SchedulerSpec

np = LazyModule("numpy", globals(), "np")   # imported on first use (a config error, --help: never), then bound here

ROLES = ("prefiller", "decoder", "collocated")


@dataclass(frozen=True, slots=True)
class TurnView:
    """One LLM call (turn) as a router sees it.

    Fields:
        conversation_id: the conversation; turn: 0-based index of the call in it.
        prompt_tokens: tokens of this call's prompt; reused_tokens: of which a prefix equal to the
            previous call's context (prompt + output), tokens; new_input_tokens: the rest, tokens.
        arrival_s: the conversation's arrival time; submit_s: when this turn became ready, s.
        prev_prefill_instance / prev_decode_instance: where the previous turn ran (-1 for turn 0).
        prev_output_tokens: tokens the previous turn generated (the router saw them stream), 0 for
            turn 0.
        cached_prefix: ``(instance index, tokens)`` for each instance that holds a prefix of this
            turn's prompt, from the controller's bookkeeping of where the conversation's turns ran (a
            decode instance holds the turn's prompt + output, a remote prefill instance the prompt),
            capped at ``reused_tokens`` (the part of the prompt equal to the previous context). An
            upper bound: the controller does not observe LRU eviction, and engines cache whole
            blocks only. Empty for turn 0.
    """

    conversation_id: str
    turn: int
    prompt_tokens: int
    reused_tokens: int
    new_input_tokens: int
    arrival_s: float
    submit_s: float
    prev_prefill_instance: int
    prev_decode_instance: int
    prev_output_tokens: int
    cached_prefix: tuple[tuple[int, int], ...] = ()

    def cached_on(self, instance: int) -> int:
        """Tokens of this turn's prompt that ``instance`` holds per :attr:`cached_prefix` (0 if none)."""
        for i, n in self.cached_prefix:
            if i == instance:
                return n
        return 0


@dataclass(frozen=True, slots=True)
class InstanceView:
    """Observable state of one serving instance at one moment.

    Fields:
        index: position in ``ClusterView.instances``; name: e.g. ``decoder1``.
        role: ``prefiller``, ``decoder`` or ``collocated``; hardware: profile name.
        kv_capacity_tokens: KV-cache capacity, tokens; kv_used_tokens: KV held by running or
            waiting-for-transfer requests, tokens (vLLM's ``kv_cache_usage_perc`` x capacity).
        num_running / num_waiting: requests in the engine's running batch / waiting queue.
        queued_prefill_tokens: prompt tokens sent to this instance and not yet prefilled, tokens
            (the controller's own bookkeeping of what it sent).
        num_conversations: conversations whose decode was placed here and have not finished.
        conversation_context_tokens: their current context lengths summed (last prompt + output, or
            the prompt of a turn in flight), tokens: the KV those conversations will come back for
            (held now, cached, or to be recomputed), from the controller's bookkeeping.
        conversations: ``(conversation_id, turn)`` of each of those conversations (its latest turn
            placed), in placement order.
        prefill_tokens_per_s: prefill throughput of the hardware, tokens/s (a hint from the hardware
            and model profiles, :class:`InstanceHints`, not a measurement).
        queued_uncached_prefill_tokens: of ``queued_prefill_tokens``, those the instance does not hold
            in its prefix cache per the controller's bookkeeping (:attr:`TurnView.cached_prefix` at
            launch): the prefill work actually queued, tokens.
        conversation_tokens: the context of each of ``conversations`` (same order), tokens.
        conversation_in_flight: for each of ``conversations``, True while its latest turn is being
            served (prefill, transfer or decode), False while it is in tool time.
    """

    index: int
    name: str
    role: str
    hardware: str
    kv_capacity_tokens: int
    kv_used_tokens: int
    num_running: int
    num_waiting: int
    queued_prefill_tokens: int
    num_conversations: int
    conversation_context_tokens: int
    conversations: tuple[tuple[str, int], ...]
    prefill_tokens_per_s: float
    queued_uncached_prefill_tokens: int = 0
    conversation_tokens: tuple[int, ...] = ()
    conversation_in_flight: tuple[bool, ...] = ()

    @property
    def kv_used_frac(self) -> float:
        """KV occupancy as a fraction of capacity, in [0, 1]."""
        return self.kv_used_tokens / self.kv_capacity_tokens


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Snapshot of the cluster for one decision.

    Fields:
        now_s: time of the snapshot, s; instances: one :class:`InstanceView` each.
        kv_bytes_per_token: of the served model, bytes; link_bandwidth_bytes_per_s, link_latency_s:
            the KV-transfer link.
        num_held: turns the controller is holding back (admission queue length).
    """

    now_s: float
    instances: tuple[InstanceView, ...]
    kv_bytes_per_token: int
    link_bandwidth_bytes_per_s: float
    link_latency_s: float
    num_held: int

    def by_role(self, *roles: str) -> list[InstanceView]:
        """Instances whose role is one of ``roles``."""
        return [i for i in self.instances if i.role in roles]

    def transfer_s(self, tokens: int) -> float:
        """Predicted KV-transfer time of ``tokens`` tokens over the link, s (the formula the simulator
        uses, :func:`harness.core.profiles.kv_transfer_s`)."""
        return kv_transfer_s(tokens, self.kv_bytes_per_token, self.link_bandwidth_bytes_per_s, self.link_latency_s)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one turn runs.

    ``prefill_instance`` == ``decode_instance`` means local (collocated-style) execution on one
    engine; otherwise the prompt is prefilled on ``prefill_instance`` (``max_tokens = 1``), its KV
    moved to ``decode_instance`` (only the blocks not already cached there), and decoded there.
    ``reason`` is free text for the decision log; ``candidates`` the ``(instance index, score)`` pairs
    the policy compared, where it has them (lower is better unless the reason says otherwise), also
    logged. ``misrouted``: the policy deliberately inverted its rule's remote/local choice (AMPD's
    ``misroute_frac``, error injected at the decision), logged as ``decisions.parquet``'s ``misrouted``.
    """

    prefill_instance: int
    decode_instance: int
    reason: str = ""
    candidates: tuple[tuple[int, float], ...] = ()
    misrouted: bool = False

    @property
    def disaggregated(self) -> bool:
        """True when prefill and decode run on different instances."""
        return self.prefill_instance != self.decode_instance


@dataclass(frozen=True, slots=True)
class Admission:
    """Which held turns to release now.

    ``admit``: indices into the queue passed to ``Policy.admit``; ``recheck_at``: ask to be polled
    again at this time (s) even if nothing else happens (e.g. a hold timeout); ``None`` = no timer.
    """

    admit: tuple[int, ...]
    reason: str = ""
    recheck_at: Optional[float] = None


@runtime_checkable
class Policy(Protocol):
    """A scheduler variant: admission (may hold turns back) and placement.

    ``admit`` is called with the controller's FIFO queue of held turns whenever a turn becomes ready
    or finishes; it returns the indices to release now (the rest stay held). ``place`` is called
    once per released turn. Both must be pure functions of their arguments (plus the predictor and a
    seeded generator given at construction).

    Hooks with defaults (:class:`PolicyBase`): ``batch_rule(instance) -> harness.core.batching.BatchRule |
    None`` (the policy forms each step's batch inside that engine, e.g. WAIT; only backends whose config
    has ``supports_batch_rules`` take it, and the variant must be registered with ``forms_batches=True``,
    which a backend that launches engines reads before the policy can be built:
    ``harness.run.session.check_policies``), ``plan_note`` (a string logged once as the ``plan`` decision),
    ``summary() -> dict`` (the policy's own counters for ``summary.json``).
    """

    name: str
    plan_note: str

    def admit(self, queue: Sequence[TurnView], view: ClusterView, now: float) -> Admission: ...

    def place(self, turn: TurnView, view: ClusterView, now: float) -> Placement: ...

    def batch_rule(self, instance_index: int) -> Any: ...

    def summary(self) -> dict: ...


class PolicyBase:
    """The default hooks of a :class:`Policy` (every variant derives from it, as vLLM's schedulers derive
    from ``SchedulerInterface``): no engine batch rule, no plan note, no own summary fields."""

    plan_note: str = ""

    def batch_rule(self, instance_index: int) -> Any:
        """The engine batch rule of instance ``instance_index`` (``harness.core.batching.BatchRule``), or None:
        the engine's own rule."""
        return None

    def summary(self) -> dict:
        """The policy's own counters merged into ``summary.json`` (e.g. AMPD's decision flips); ``{}``."""
        return {}


class AdmitAll(PolicyBase):
    """Admission mixin: release every held turn at once (no admission control)."""

    def admit(self, queue: Sequence[TurnView], view: ClusterView, now: float) -> Admission:
        return Admission(tuple(range(len(queue))), "admit-all")


@dataclass(frozen=True, slots=True)
class TurnTruth:
    """What an oracle knows about a turn: true output tokens, tool time after it (s), turns after it,
    and the KV growth still to come after it (new input + output tokens of the later turns)."""

    output_tokens: int
    tool_time_s: float
    remaining_turns: int
    remaining_kv_tokens: int


@dataclass
class PredictorConfig:
    """Hydra schema of a policy's ``predictor`` node: error mode ``lognormal`` (x exp(N(0, sigma))) or
    ``rate`` (a fraction ``error_rate`` of predictions off by ``error_factor``); seed of the errors."""

    mode: str = "lognormal"
    sigma: float = 0.0
    error_rate: float = 0.0
    error_factor: float = 2.0
    seed: int = 0


class Predictor:
    """Predictions of decode length and tool time: the true value times an injected error.

    Error models (``mode``):
      * ``lognormal``: multiply by ``exp(N(0, sigma))`` (sigma = 0 is the oracle);
      * ``rate``: with probability ``error_rate`` the value is wrong by ``error_factor`` (multiplied or
        divided, 50/50), otherwise exact.
    The random stream is seeded, and the error of one (conversation, turn) is the same whichever
    policy asks, so two variants see identical predictions.

    Raises:
        ValueError: unknown mode, negative sigma, error_rate outside [0, 1], error_factor < 1.
    """

    def __init__(self, truth: Callable[[str, int], TurnTruth], mode: str = "lognormal",
                 sigma: float = 0.0, error_rate: float = 0.0, error_factor: float = 2.0, seed: int = 0):
        if mode not in ("lognormal", "rate"):
            raise ValueError(f"predictor.mode must be 'lognormal' or 'rate', got {mode!r}")
        if not (sigma >= 0 and math.isfinite(sigma)):
            raise ValueError(f"predictor.sigma must be a finite number >= 0, got {sigma!r}")
        if not 0 <= error_rate <= 1:
            raise ValueError(f"predictor.error_rate must be in [0, 1], got {error_rate!r}")
        if not (error_factor >= 1 and math.isfinite(error_factor)):
            raise ValueError(f"predictor.error_factor must be a finite number >= 1, got {error_factor!r}")
        if not (isinstance(seed, int) and 0 <= seed < 2**63):
            raise ValueError(f"predictor.seed must be an int in [0, 2**63), got {seed!r}")
        self._truth, self.mode, self.sigma = truth, mode, sigma
        self.error_rate, self.error_factor, self.seed = error_rate, error_factor, seed
        self._cache: dict[tuple[str, int, int], float] = {}

    @classmethod
    def from_config(cls, truth: Callable[[str, int], "TurnTruth"], pc: PredictorConfig) -> "Predictor":
        """A predictor from a policy's ``predictor`` config node (same errors as ``__init__``)."""
        return cls(truth, pc.mode, pc.sigma, pc.error_rate, pc.error_factor, pc.seed)

    def _factor(self, conversation_id: str, turn: int, what: int) -> float:
        if self.exact:
            return 1.0
        key = (conversation_id, turn, what)
        f = self._cache.get(key)
        if f is None:
            rng = np.random.default_rng([self.seed, what, turn] + list(conversation_id.encode()))
            if self.mode == "lognormal":
                f = float(math.exp(rng.normal(0.0, self.sigma)))
            elif rng.random() < self.error_rate:
                f = self.error_factor if rng.random() < 0.5 else 1.0 / self.error_factor
            else:
                f = 1.0
            self._cache[key] = f
        return f

    @property
    def exact(self) -> bool:
        """True when no error is injected (the oracle arm)."""
        return (self.mode == "lognormal" and self.sigma == 0) or (self.mode == "rate" and self.error_rate == 0)

    def error_free(self) -> "Predictor":
        """A predictor on the same truth with no error (the oracle arm), e.g. to count decision flips."""
        return Predictor(self._truth, self.mode, 0.0, 0.0, self.error_factor, self.seed)

    def output_tokens(self, turn: TurnView) -> float:
        """Predicted output (decode) tokens of ``turn``, tokens (>= 1)."""
        return self.output_tokens_at(turn.conversation_id, turn.turn)

    def output_tokens_at(self, conversation_id: str, turn: int) -> float:
        """Predicted output tokens of turn ``turn`` of a conversation, tokens (>= 1)."""
        t = self._truth(conversation_id, turn)
        return max(1.0, t.output_tokens * self._factor(conversation_id, turn, 1))

    def tool_time_s(self, turn: TurnView) -> float:
        """Predicted tool time after ``turn``, s."""
        return self.tool_time_at(turn.conversation_id, turn.turn)

    def tool_time_at(self, conversation_id: str, turn: int) -> float:
        """Predicted tool time after turn ``turn`` of a conversation, s."""
        t = self._truth(conversation_id, turn)
        return t.tool_time_s * self._factor(conversation_id, turn, 2)

    def remaining_turns(self, turn: TurnView) -> float:
        """Predicted number of turns after ``turn``."""
        t = self._truth(turn.conversation_id, turn.turn)
        return t.remaining_turns * self._factor(turn.conversation_id, turn.turn, 3)

    def kv_growth(self, conversation_id: str, turn: int) -> float:
        """Predicted KV growth of a conversation from the end of ``turn`` to its end, tokens
        (new input + output of every later turn)."""
        t = self._truth(conversation_id, turn)
        return t.remaining_kv_tokens * self._factor(conversation_id, turn, 4)


# ---- registry -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class InstanceHints:
    """What a router may know of an instance's hardware before serving anything: estimates from the
    hardware and model profiles (``harness.core.profiles.instance_hints``), the same on every backend.

    prefill_tokens_per_s: steady prefill throughput, tokens/s; decode_step_s: an idle decode step
    (batch of one, 1024-token context), s; fluid_d0_s, fluid_d1_s_per_token: the memory-bound
    iteration-time line ``tau = d0 + d1 * KV tokens`` of the WAIT fluid model (s, s/token);
    fluid_d2_s_per_token: what one prompt token adds to an iteration when prefill is compute-bound, s/token.
    """

    prefill_tokens_per_s: float
    decode_step_s: float
    fluid_d0_s: float
    fluid_d1_s_per_token: float
    fluid_d2_s_per_token: float


@dataclass(frozen=True)
class PolicyContext:
    """Everything a policy factory may use besides its own config (given at construction).

    truth: ``(conversation_id, turn) -> TurnTruth``, the workload's oracle that a :class:`Predictor`
        wraps (a policy must not call it directly);
    seed: for the policy's own generator (the top-level ``seed``); workload_seed: ``workload.seed`` (what a
    preset sweeps; AMPD's misroute draw is keyed on it); cluster_roles: the role of each instance (validated by
    factories); workload: a description of the workload for planning
    (``harness.workload.workload.WorkloadStats``); hints: one :class:`InstanceHints` per instance;
    kv_capacity_tokens: per instance, tokens (the backend's: simulated, or read from ``/metrics``).
    """

    truth: Callable[[str, int], TurnTruth]
    seed: int
    cluster_roles: tuple[str, ...]
    workload: Any
    hints: tuple[InstanceHints, ...]
    kv_capacity_tokens: tuple[int, ...]
    workload_seed: int = 0


_SCHEDULERS = Registry("scheduler", SchedulerSpec)
PolicySpec = SchedulerSpec


def register(name: str, config_cls: type, *, roles: Sequence[str] = (), forms_batches: bool = False,
             reads_workload: bool = False):
    """Class/function decorator adding a policy factory ``(cfg, ctx) -> Policy`` to the registry under
    ``name``, with the variant's traits (``harness.core.registry.SchedulerSpec``): ``roles`` the cluster must
    have (each of :data:`ROLES`), ``forms_batches`` (its policy returns engine batch rules),
    ``reads_workload`` (its decisions read the workload statistics or the seed).
    ``harness.run.config.register_configs`` turns every registered config class into the Hydra option
    ``scheduler=<name>`` (a YAML file in ``conf/scheduler/`` is not needed).

    Raises:
        ValueError: if ``name`` is already registered, or a role is not one of :data:`ROLES`.
    """
    bad = [r for r in roles if r not in ROLES]
    if bad:
        raise ValueError(f"scheduler {name!r}: roles {bad} are not among {list(ROLES)}")
    return _SCHEDULERS.register(name, config_cls, roles=tuple(roles), forms_batches=bool(forms_batches),
                                reads_workload=bool(reads_workload))


def registry() -> dict[str, PolicySpec]:
    """The specs registered so far (``harness.core.schedulers`` loads the plug-ins to fill it)."""
    return _SCHEDULERS.specs()


def require_roles(name: str, roles: Sequence[str], need: Sequence[str]) -> None:
    """Raise ``ValueError`` if ``roles`` (the cluster's) lacks any of ``need`` (for variant ``name``)."""
    for r in need:
        if r not in roles:
            raise ValueError(f"scheduler {name!r} needs at least one instance with role {r!r}; "
                             f"cluster roles are {sorted(set(roles))}")


# ---- shared policy helpers (one rule each, used by several variants) ------------------------------

def occupancy(i: InstanceView) -> float:
    """Observed KV occupancy of an instance, as a fraction of capacity: the larger of the KV held now
    and the context of the conversations booked on it (which they come back for after tool calls)."""
    return max(i.kv_used_tokens, i.conversation_context_tokens) / i.kv_capacity_tokens


def pool_occupancy(instances: Sequence[InstanceView]) -> float:
    """:func:`occupancy` of a pool of instances taken together: summed tokens over summed capacity."""
    used = sum(max(i.kv_used_tokens, i.conversation_context_tokens) for i in instances)
    return used / sum(i.kv_capacity_tokens for i in instances)


def least_loaded(instances: Sequence[InstanceView]) -> InstanceView:
    """The instance with the lowest :func:`occupancy`, then fewest conversations, then lowest index."""
    return min(instances, key=lambda i: (occupancy(i), i.num_conversations, i.num_running + i.num_waiting,
                                         i.index))


def prefill_queue_s(i: InstanceView) -> float:
    """Prefill work queued on an instance, s: queued prefill tokens / its prefill throughput."""
    return i.queued_prefill_tokens / i.prefill_tokens_per_s


def pick_prefiller(view: ClusterView) -> InstanceView:
    """The prefiller with the least queued prefill work (:func:`prefill_queue_s`), then lowest index:
    the one rule every P/D variant uses (on identical prefillers: the fewest queued tokens)."""
    return min(view.by_role("prefiller"), key=lambda i: (prefill_queue_s(i), i.index))


def sticky_instance(turn: TurnView, view: ClusterView) -> tuple[int, str]:
    """The instance a collocated-style conversation runs on: its previous one, or the least loaded
    (:func:`least_loaded`) at turn 0. Returns ``(index, reason)``."""
    if turn.prev_decode_instance >= 0:
        return turn.prev_decode_instance, "sticky"
    i = least_loaded(view.instances)
    return i.index, f"least-loaded kv={i.kv_used_frac:.3f}"


class StickyCollocated(AdmitAll):
    """Admit-all with sticky collocated placement: turn 0 on the least-loaded instance
    (:func:`sticky_instance`), every later turn back on the same one (its prefix cache); roles ignored.
    ``collocated`` (baselines/collocated.py) is this policy; :class:`BatchRulePolicy` adds engine batch rules."""

    def place(self, turn: TurnView, view: ClusterView, now: float) -> Placement:
        i, why = sticky_instance(turn, view)
        cands = () if turn.prev_decode_instance >= 0 else tuple((v.index, occupancy(v)) for v in view.instances)
        return Placement(i, i, why, cands)


class BatchRulePolicy(StickyCollocated):
    """The generic one-rule-per-engine policy: admit-all, sticky collocated placement, and one engine batch
    rule per instance (``harness.core.batching.BatchRule``; WAIT, Nested WAIT, WAIT-CP and a new rule's
    variant, docs/extending.md). ``rules``: one per instance, in index order; ``plan_note``: the line the
    run log prints about the rules' plan."""

    name = "batch_rule"

    def __init__(self, rules: Sequence, plan_note: str):
        self.rules, self.plan_note = list(rules), plan_note

    def batch_rule(self, instance_index: int):
        """The batch rule for instance ``instance_index`` (``harness.core.batching.BatchRule``)."""
        return self.rules[instance_index]
