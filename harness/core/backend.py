"""Backends as plug-ins: what the session asks of an opened cluster, the job record of one turn, what a
backend reads of the run (:class:`SessionInput`, typed and frozen), and the registry of backends by name.

A backend plug-in registers ``(name, config dataclass, open)`` with :func:`register_backend`; ``open``
returns a context manager that yields a :class:`Cluster` (sim: engines on a virtual clock; vllm:
servers launched or connected, warmed up, torn down on exit whatever happens). A cluster executes
turns (local or P/D), reports events through the job's callbacks, reports the observable per-instance
state, and drives its clock until the controller is done or a limit is hit. ``harness.run.session`` is the
only place a cluster is put together with a controller, a policy and a recorder.

Built-in plug-ins: ``sim`` (``harness.sim.plugin``) and ``vllm`` (``harness.vllm.plugin``); another
package can add one through the ``agentic_harness.backends`` entry-point group (the entry point names a
module that calls :func:`register_backend` when imported).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional, Sequence

from harness.core.policy import InstanceHints, Placement
from harness.core.profiles import EngineConfig, HardwareConfig, LinkConfig, ModelConfig
from harness.core.registry import Registry, Spec


@dataclass(slots=True, eq=False)
class TurnJob:
    """One turn handed to a backend, and what the backend measured about it.

    Inputs: conversation_id, turn, prompt_tokens, output_tokens (the trace's, = ``max_tokens`` with
    ``ignore_eos``), reused (the conversation's per-turn reused-prefix tokens, for prefix validity),
    placement, and the callbacks ``on_prefill_done(job)``, ``on_finish(job)``, ``on_fail(job, reason)``.
    submit_s: when the turn became ready; admit_s: when admission released it (s).
    Outputs (s for times, tokens for counts): start_s, prefill_done_s, first_token_s, finish_s,
    cached_tokens (prefix-cache hit where the prompt was prefilled), decode_cached_tokens (P/D: prompt
    tokens the decoder did not compute: its own prefix hits, plus connector loads on real vLLM),
    transfer_tokens and transfer_s (KV moved P->D and the time the transfer took, incl. link queueing;
    -1 where not observable, i.e. on real vLLM), preemptions, itl_s (the gaps between the turn's
    successive output tokens on its decode instance, s; on real vLLM between stream chunks), token_s
    (the time each output token was observed, s on the run clock; empty: derived from first_token_s and
    itl_s by the recorder; on real vLLM the tokens of one stream chunk share the chunk's time), error.
    """

    conversation_id: str
    turn: int
    prompt_tokens: int
    output_tokens: int
    reused: tuple
    placement: Placement
    on_prefill_done: Callable[["TurnJob"], None]
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
    itl_s: Sequence[float] = ()
    token_s: Sequence[float] = ()
    error: str = ""
    engine_queued_s: Optional[float] = None
    engine_scheduled_s: Optional[float] = None


@dataclass(slots=True)
class InstanceState:
    """Observed state of one instance (vLLM ``/metrics`` names in brackets).

    kv_used_tokens [kv_cache_usage_perc x capacity], num_running [num_requests_running],
    num_waiting [num_requests_waiting], energy_j (cumulative since the run started, J; NaN if
    unknown), prefix_hit_tokens (cumulative prefix-cache hits, tokens).

    A snapshot: nothing changes one after it is made (the recorder reads it once per sample). Not a frozen
    dataclass because a frozen one costs ~4x as much to build (each field through ``object.__setattr__``:
    ~1.9 us against ~0.46 us), and the session builds one per instance per ``tick_s`` sample.
    """

    kv_used_tokens: int
    num_running: int
    num_waiting: int
    energy_j: float
    prefix_hit_tokens: int = 0


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """Static description of one instance: index, name, role, hardware profile name, KV capacity
    (tokens; simulated, or read from the server's ``/metrics``)."""

    index: int
    name: str
    role: str
    hardware: str
    kv_capacity_tokens: int


class ClusterBase:
    """An opened cluster: the execution side of a run. Every backend's cluster derives from it (as vLLM's
    ``SchedulerInterface`` declares every hook of a scheduler): the session and the controller call each
    hook below directly, never probe for one.

    Required (no default; a backend defines them): ``infos`` (a :class:`InstanceInfo` per instance, in
    index order), ``clock`` (``now()`` s and ``call_at(t, fn, *args)``; virtual time on the simulator, wall
    time since the measured window began on a real backend; ``harness.core.clock``), :meth:`start_turn`,
    :meth:`observe`, :meth:`drive`. Optional, with the default body stated: :meth:`observe_at`, :meth:`observe_load`,
    :meth:`set_batch_rule`, :meth:`progress`, :meth:`power_w`, :meth:`energy_j`, :meth:`preemptions`,
    :meth:`measured`.
    """

    infos: tuple[InstanceInfo, ...]
    clock: Any

    def start_turn(self, job: TurnJob) -> None:
        """Begin executing ``job`` now; the job's callbacks report progress.

        Raises:
            NotImplementedError: a backend that does not define it.
        """
        raise NotImplementedError(f"{type(self).__name__}.start_turn")

    def observe(self) -> tuple[InstanceState, ...]:
        """Current state of each instance.

        Raises:
            NotImplementedError: a backend that does not define it.
        """
        raise NotImplementedError(f"{type(self).__name__}.observe")

    def drive(self, start: Callable[[], None], done: Callable[[], bool], on_tick: Callable[[], None],
              tick_s: Optional[float]) -> str:
        """Set t = 0, call ``start()`` (the controller schedules its arrivals), then run the clock until
        ``done()`` or a limit, calling ``on_tick()`` every ``tick_s`` s of clock time (None: never; a real
        backend ticks after each ``/metrics`` scrape). A backend that can read its state ahead (the simulator,
        between two events: ``harness.sim.backend.SimBackend.drive``) may instead call ``on_tick(times)`` once
        for several ticks (``times``: s, ascending, the first now), where the session samples
        :meth:`observe_at` of them. Returns ``""`` when done, else why it stopped (a stall, a time limit).

        Raises:
            Exception: whatever the controller or a policy raised, at once (the run then ends).
            NotImplementedError: a backend that does not define it.
        """
        raise NotImplementedError(f"{type(self).__name__}.drive")

    def observe_at(self, times: Sequence[float]) -> Sequence[tuple]:
        """Per instance ``(kv_used_tokens, num_running, num_waiting, energy_j)`` at each of ``times`` (s,
        ascending, none before now) as :meth:`observe` would give them then, as columns: ``kv_used_tokens``
        (tokens) and ``energy_j`` (J) one value per time, the two counts (requests) the same at all of them
        (``Recorder.sample_at``): only a backend whose :meth:`drive` calls ``on_tick(times)`` needs it.

        Raises:
            NotImplementedError: by default (a backend that never calls ``on_tick(times)``).
        """
        raise NotImplementedError(f"{type(self).__name__}.observe_at")

    def observe_load(self) -> tuple[tuple[int, int, int], ...]:
        """Per instance ``(kv_used_tokens, num_running, num_waiting)`` as :meth:`observe` gives them, without
        the energy (the controller's view needs only these). Default: read from :meth:`observe`."""
        return tuple((s.kv_used_tokens, s.num_running, s.num_waiting) for s in self.observe())

    def set_batch_rule(self, instance_index: int, rule: Any) -> None:
        """Install a policy's engine batch rule (``harness.core.batching.BatchRule``) on instance
        ``instance_index``.

        Raises:
            ValueError: by default: this backend's engines take no batch rule (a backend whose config sets
                ``BackendConfig.supports_batch_rules`` overrides it).
        """
        raise ValueError(f"this backend ({type(self).__name__}) cannot take an engine batch rule")

    def progress(self) -> None:
        """The controller's note that the run may be done without a turn finishing (a duration stop), for a
        backend whose :meth:`drive` waits on events (a wall-clock loop). Default: nothing (a virtual clock
        re-checks ``done()`` after every event)."""

    def power_w(self) -> list[float]:
        """Current power draw per instance, W. Default: NaN for each (not observed)."""
        return [math.nan] * len(self.infos)

    def energy_j(self, end_s: float) -> list[float]:
        """Energy per instance over the measured window up to ``end_s`` (s), J. Default: NaN for each."""
        return [math.nan] * len(self.infos)

    def preemptions(self) -> int:
        """Preemptions over the run (all instances). Default: 0 (none observed)."""
        return 0

    def measured(self) -> dict:
        """Backend-specific measurements for ``summary.json`` (e.g. server start-up times). Default: none."""
        return {}


Cluster = ClusterBase
"""The name the session and the docs use for an opened cluster: :class:`ClusterBase`."""


class BackendConfig:
    """Base of every backend's config dataclass (the ``backend`` config node's schema), with the default
    hooks the run reads before anything is opened: a backend overrides those that apply to it."""

    supports_batch_rules: ClassVar[bool] = False
    """Its engines take a policy's batch rule (``harness.core.batching``; the simulator, launched vLLM servers)."""

    def validate(self, inp: "SessionInput") -> None:
        """Check the backend's own keys (``self``: the ``backend`` node, this dataclass) against the run's typed
        input ``inp`` (a :class:`SessionInput`: instances, model, engine, link, scheduler,
        workload shape, ``log_steps``); called by ``harness.run.config.resolve`` before anything runs.

        Raises:
            ValueError: naming the key (``backend.<key>``, or the other group's key it conflicts with).
                Default: nothing to check.
        """

    def context_limit(self) -> Optional[int]:
        """The context the backend serves with when shorter than the model's (e.g. vLLM's
        ``--max-model-len``), tokens; ``None``: the model's own (``model.max_model_len``)."""
        return None

    def check_batch_rules(self, inp: "SessionInput", rules: Sequence[Any]) -> None:
        """Raise ``ValueError`` if a rule of ``rules`` (the policy's, one per instance that has one) cannot run
        on this backend (``inp``: the run's ``SessionInput``). Default: every rule can (only
        read when ``supports_batch_rules``)."""


@dataclass(frozen=True)
class SessionInput:
    """What a session and a backend read of the run config, typed and frozen: built once per run by
    ``harness.run.config.session_input`` from the resolved config and handed to the backend's
    :meth:`BackendConfig.validate`, its ``open`` and every session; no session and no backend reads the whole
    run config. (It lives here, beside the interface it types, so that a backend types its ``open`` without
    importing the run layer.) Frozen: a session cannot change it; the config objects it holds are the run's
    own, shared, and not copied.

    instances: ``(name, role, HardwareConfig)`` per instance, in index order (``cluster.instances``
        expanded by ``harness.run.config.resolve``; the names are ``<role><k>``).
    model: the served model's profile (``model``); engine: the engine knobs every backend honours
        (``engine``: KV block size in tokens, batch limits, chunked prefill, ...); link: the KV-transfer
        interconnect between instances (``cluster.link``: bytes/s and s per transfer).
    seed: the run's seed (``seed``), given to every policy (``PolicyContext.seed``).
    workload_seed: the workload's seed (``workload.seed``), given to every policy
        (``PolicyContext.workload_seed``; AMPD's misroute draw reads it).
    shared_prefix_tokens: the workload's shared system prompt, tokens
        (``workload.effective_shared_prefix_tokens()``: ``shared_prefix_tokens`` x ``token_scale``).
    context_limit_tokens: the served context, tokens (``harness.run.config.context_limit``); ``None``: unlimited.
    hints: per instance, what a router may know of it before serving (``harness.run.config.instance_hints``: prefill
        tokens/s, idle decode step s, the fluid model's iteration coefficients).
    scheduler_name / scheduler: the run's scheduler variant (``scheduler.name``) and its config dataclass
        (the variant's own type, from the registry: ``harness.core.registry.SchedulerSpec.config_cls``).
    reference_scheduler: ``slo.reference_scheduler`` (``same``: the run's own variant), whose unloaded
        replays are the relative SLO's denominator; needs_reference: the SLO needs them
        (``SloConfig.needs_unloaded``).
    scale_reference: the SLO-scale curve's reference (``SloConfig.scale_reference_name``);
        needs_scale_reference: the curve needs its unloaded replays (``SloConfig.needs_scale_unloaded``).
    ttfet_definition: the headline TTFET reading, ``first`` / ``visible`` / ``last`` (``slo.ttfet_definition``).
    backend_name / backend: the backend plug-in (``backend.name``) and its config (its hooks:
        ``supports_batch_rules``, ``check_batch_rules``). (No simulator settings: the simulated sessions, the
        SLO replays, take theirs from ``backend`` when ``backend=sim``, else the simulator's defaults:
        ``harness.run.session.simulate``.)
    max_active: the cap on active conversations (``workload.max_active()``: a closed population's
        ``concurrency`` or ``max_concurrency``; ``None``: no cap). duration_s: the duration stop
        (``workload.duration_s``, s; ``None``: none). log_steps: record every engine step where the backend
        can (``logger.steps``). routes: ``workload.model_map`` resolved on the cluster
        (``harness.core.routing.ModelRoutes``; ``None``: every call on every instance). A backend's ``validate``
        and ``open`` read these with the rest of this input (``harness.core.backend``), never the run config.
    """

    instances: tuple[tuple[str, str, HardwareConfig], ...]
    model: ModelConfig
    engine: EngineConfig
    link: LinkConfig
    seed: int
    shared_prefix_tokens: int
    context_limit_tokens: Optional[int]
    hints: tuple[InstanceHints, ...]
    scheduler_name: str
    scheduler: Any
    reference_scheduler: str
    needs_reference: bool
    scale_reference: str
    needs_scale_reference: bool
    ttfet_definition: str
    backend_name: str
    backend: BackendConfig
    workload_seed: int = 0
    max_active: Optional[int] = None
    duration_s: Optional[float] = None
    log_steps: bool = False
    routes: Optional[Any] = None

    @property
    def roles(self) -> tuple[str, ...]:
        """The role of each instance, in index order."""
        return tuple(r for _, r, _ in self.instances)


BackendSpec = Spec
"""A registered backend (``harness.core.registry.Spec``): its name, config dataclass (a :class:`BackendConfig`
subclass: the ``backend`` config node's schema and its hooks) and
``open(inp, cfg, run_dir, *, conversations, ...) -> ContextManager[ClusterBase]``
(``inp``: the run's ``SessionInput``; ``cfg``: the backend's own config, an instance of its
config dataclass, already validated; ``run_dir``: the run's output directory, or None; ``conversations``: the
workload's ``(arrival_s, record)`` pairs, for what a backend derives from them, e.g. which KV blocks they
share). No backend reads the whole run config."""

_BACKENDS = Registry("backend")
_BUILTIN = ("harness.sim.plugin", "harness.vllm.plugin")
ENTRY_POINT_GROUP = "agentic_harness.backends"


def register_backend(name: str, config_cls: type):
    """Decorator registering ``open`` as backend ``name`` with its config dataclass (a
    :class:`BackendConfig` subclass).

    Raises:
        ValueError: if ``name`` is already registered. TypeError: ``config_cls`` does not derive from
        :class:`BackendConfig`.
    """
    if not (isinstance(config_cls, type) and issubclass(config_cls, BackendConfig)):
        raise TypeError(f"backend {name!r}: config class {config_cls!r} must derive from harness.core.backend.BackendConfig")
    return _BACKENDS.register(name, config_cls)


_loaded = False


def backends() -> dict[str, BackendSpec]:
    """Every registered backend by name (built-ins and entry points), loading them on first use (also
    when one plug-in module was imported directly before, e.g. ``harness.sim.plugin`` by ``simulate``)."""
    global _loaded
    if not _loaded:
        for mod in _BUILTIN:
            importlib.import_module(mod)
        from importlib.metadata import entry_points
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            importlib.import_module(ep.value.split(":")[0])
        _loaded = True
    return _BACKENDS.specs()


def get_backend(name: str) -> BackendSpec:
    """The registered backend ``name``.

    Raises:
        KeyError: listing the valid names, if ``name`` is unknown.
    """
    backends()
    return _BACKENDS.get(name)
