"""One run session: the only place a controller, a policy, a cluster and a recorder are put together.

``run_session`` is used for every run on every backend (the main run on the simulator or on real vLLM,
each conversation's unloaded replay for the SLO baseline, the tests' fake backends). ``make_policy`` is
the only place a policy is built, from a :class:`harness.core.policy.PolicyContext` that holds everything it
may use: the workload's oracle (behind a ``Predictor``), hardware hints from the hardware and model
profiles, KV capacities; ``check_policies`` builds the run's policies the same way before anything runs
(no cluster needed), so a policy that rejects its config fails first.

Every function here takes a :class:`SessionInput`: the part of the run config a session reads, typed and
frozen, defined beside the backend interface (``harness.core.backend``) and built once per run by
:func:`session_input` from the resolved config (``harness.run.config``; ``harness.run.runner.execute`` builds it). Nothing here reads the whole run config. The relative SLO's
unloaded-TTFET baseline (a :func:`simulate` session per conversation, and its caches) is
``harness.run.slo_baseline``.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from harness.core.backend import Cluster
from harness.core.controller import ConversationState, Controller
from harness.core.policy import Policy, PolicyContext
from harness.core.profiles import kv_capacity_blocks
from harness.core.recorder import PlanDecision, Recorder
from harness.core.trace import ConversationRecord
from harness.core.backend import SessionInput  # noqa: F401 -- re-exported
from harness.run.config import context_limit, instance_hints, session_input  # noqa: F401 -- re-exported
from harness.workload.workload import Oracle, WorkloadStats

log = logging.getLogger(__name__)


def batch_rules(policy: Policy, n: int) -> list:
    """The policy's engine batch rule per instance (``None``: the engine's default rule)."""
    return [policy.batch_rule(i) for i in range(n)]


def policy_context(inp: SessionInput, stats: WorkloadStats, oracle: Callable, kv_capacity_tokens: Sequence[int]
                   ) -> PolicyContext:
    """The context a policy of the session ``inp`` is built with (``kv_capacity_tokens``: per instance, tokens)."""
    return PolicyContext(truth=oracle, seed=inp.seed, cluster_roles=inp.roles, workload=stats, hints=inp.hints,
                         kv_capacity_tokens=tuple(kv_capacity_tokens), workload_seed=inp.workload_seed)


def make_policy(name: str, sched_cfg: Any, ctx: PolicyContext) -> Policy:
    """Build the registered scheduler ``name`` from its config dataclass and the context.

    Raises:
        KeyError: unknown scheduler. ValueError: the cluster lacks a role the variant is registered with
        (``roles``), or the factory rejects the config or the cluster.
    """
    from harness.core.policy import require_roles
    from harness.core.schedulers import get_spec
    spec = get_spec(name)
    require_roles(name, ctx.cluster_roles, spec.roles)
    return spec.factory(sched_cfg, ctx)


def estimated_capacities(inp: SessionInput) -> list[int]:
    """KV capacity per instance as the hardware profile sizes it, tokens (for checks before a cluster
    exists; a real backend reads the servers' own)."""
    e = inp.engine
    return [kv_capacity_blocks(hw, inp.model, e) * e.block_size for _, _, hw in inp.instances]


@dataclass
class SessionResult:
    """What one session produced.

    recorder: the rows (turns, decisions, instance samples); convs: the controller's conversation
    states; energy_j: per instance over the measured window, J; window_start_s / window_end_s: first
    arrival and last finish, s; preemptions; events (clock callbacks); wall_s: wall time of the drive, s;
    error: ``""`` or why the run ended early (``"<Type>: <message>"`` for an exception);
    error_traceback: the exception's traceback; extra: backend measurements, the policy plan, the drive's
    CPU (``cost_loop_cpu_s``, s: ``time.process_time``, every thread of this process) and the policy's own
    summary (``policy.summary() -> dict``, when it has one), merged into ``summary.json``.
    """

    recorder: Recorder
    convs: list[ConversationState]
    energy_j: list[float]
    window_start_s: float
    window_end_s: float
    preemptions: int
    events: int
    wall_s: float
    error: str = ""
    error_traceback: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def turns(self) -> list[dict]:
        """``turns.parquet`` rows."""
        return self.recorder.turns


def run_session(cluster: Cluster, inp: SessionInput, conversations: Sequence[tuple[float, ConversationRecord]],
                stats: WorkloadStats, scheduler_name: str, sched_cfg: Any, recorder: Recorder, *,
                oracle: Optional[Oracle] = None, tick_s: Optional[float] = None,
                on_conversation: Optional[Callable[[ConversationState], None]] = None,
                max_active: Optional[int] = None, stop_s: Optional[float] = None,
                pinned: Optional[Mapping[tuple[str, int], float]] = None,
                timing: str = "think") -> SessionResult:
    """Replay ``conversations`` on an opened ``cluster`` (of the session ``inp``) under scheduler
    ``scheduler_name`` with its config ``sched_cfg``.

    The policy is built here (``make_policy``) with the cluster's KV capacities; the controller is built
    here and nowhere else; every row goes to ``recorder``; ``tick_s``: instance-sample period (s of the
    cluster's clock; None: no samples). An exception raised by the controller or a policy ends the run
    at once on every backend; it is returned in ``error`` (with its traceback), never swallowed
    silently, and what was measured until then is kept. ``max_active``, ``stop_s``: the load shapes of
    the main run (``harness.core.controller.Controller``; ``workload.max_active()``, ``workload.duration_s``);
    with them, ``extra`` gets ``num_conversations_started`` / ``_stopped`` / ``_not_started``,
    ``max_active_conversations``, ``client_wait_mean_s`` / ``client_wait_max_s`` (s) and ``duration_stop_s``,
    and the conversations never started are left out of ``convs``. ``pinned``: each turn's recorded arrival
    (``harness.workload.replay``, ``workload.arrivals_from_run``); ``extra`` then gets ``pinned_turns`` (turns
    after the first with a recorded time), ``pinned_turns_late`` / ``pinned_late_max_s`` (made ready at their
    previous turn's finish, after their time; the largest lateness, s) and ``pinned_turns_missing``.
    ``timing``: ``workload.timing`` (``think``
    or ``original``, ``harness.core.controller.Controller``).
    """
    oracle = oracle or Oracle(conversations)
    ctx = policy_context(inp, stats, oracle, [i.kv_capacity_tokens for i in cluster.infos])
    policy = make_policy(scheduler_name, sched_cfg, ctx)
    for i, rule in enumerate(batch_rules(policy, len(cluster.infos))):  # engine-level batch formation (WAIT)
        if rule is not None:
            cluster.set_batch_rule(i, rule)   # ValueError where it cannot (ClusterBase's default: no backend rule)
    recorder.bind([i.name for i in cluster.infos])
    plan = policy.plan_note
    if plan:  # a policy's plan (e.g. WAIT's fluid thresholds), once, at t = 0
        recorder.decision(PlanDecision(0.0, plan))
    controller = Controller(cluster, policy, conversations, recorder, ctx.hints,
                            link_bandwidth_bytes_per_s=inp.link.bandwidth_bytes_per_s,
                            link_latency_s=inp.link.latency_s, kv_bytes_per_token=inp.model.kv_bytes_per_token,
                            on_conversation=on_conversation or (lambda c: None),
                            max_context_tokens=inp.context_limit_tokens, max_active=max_active, stop_s=stop_s,
                            pinned=pinned, timing=timing, routes=inp.routes)

    def tick(times=None):
        if times is None:
            recorder.sample(cluster.clock.now(), cluster.infos, cluster.observe(), cluster.power_w())
        else:   # the simulator's folded ticks (harness.sim.backend.SimBackend.drive): the samples at each of times
            recorder.sample_at(times, cluster.infos, cluster.observe_at(times), cluster.power_w())

    t0, c0 = time.perf_counter(), time.process_time()
    error = tb = ""
    try:
        reason = cluster.drive(controller.start, lambda: controller.finished, tick, tick_s)
        if reason:
            error = f"{reason}: {len(conversations) - controller.num_done} conversations unfinished"
    except (Exception, KeyboardInterrupt) as e:  # keep what was measured; the caller marks the run partial
        error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        tb = traceback.format_exc()
        log.error("run ended by an error: %s", error)
    wall, loop_cpu = time.perf_counter() - t0, time.process_time() - c0
    convs = controller.convs
    shaped = max_active is not None or stop_s is not None
    if shaped:
        convs = [c for c in convs if not c.not_started]
    end = max([c.finish_s for c in convs if c.done] or [cluster.clock.now()])
    start = min((t for t, _ in conversations), default=0.0)
    extra = dict(cluster.measured())
    extra["cost_loop_cpu_s"] = loop_cpu   # harness.analysis.cost: the drive's CPU, every thread of this process
    if shaped:
        roots = [c for c in convs if c.parent is None]     # sub-agents are part of their session
        waits = [c.client_wait_s for c in roots if c.begun]
        extra.update({"num_conversations_started": sum(c.begun for c in roots),
                      "num_conversations_stopped": sum(c.stopped for c in roots),
                      "num_conversations_not_started": sum(c.parent is None for c in controller.convs) - len(roots),
                      "max_active_conversations": controller.max_active_seen,
                      "max_active_limit": max_active, "duration_stop_s": stop_s,
                      "client_wait_mean_s": sum(waits) / len(waits) if waits else math.nan,
                      "client_wait_max_s": max(waits) if waits else math.nan})
    if pinned is not None:
        ids = {c.record.conversation_id for c in controller.convs}
        extra.update({"pinned_turns": sum(1 for (cid, k) in pinned if k > 0 and cid in ids),
                      "pinned_turns_late": controller.pinned_late, "pinned_late_max_s": controller.pinned_late_max_s,
                      "pinned_turns_missing": controller.pinned_missing})
    if plan:
        extra["policy_plan"] = plan
    extra.update(policy.summary())  # a policy's own counters (e.g. AMPD's decision flips), backend-neutral
    return SessionResult(recorder, convs, cluster.energy_j(end), start, end, cluster.preemptions(),
                         cluster.clock.events, wall, error, tb, extra)


def simulate(inp: SessionInput, conversations: Sequence[tuple[float, ConversationRecord]], stats: WorkloadStats,
             scheduler_name: str, sched_cfg: Any, *, sample_interval_s: Optional[float] = None,
             log_decisions: bool = False, max_coalesce_s: Optional[float] = None,
             on_conversation: Optional[Callable[[ConversationState], None]] = None) -> SessionResult:
    """``run_session`` on a fresh simulated cluster of ``inp`` (its instances, model, engine, link) with the
    simulator's settings (:func:`sim_settings`; ``max_coalesce_s`` overrides their ``max_coalesce_s``, s), whose
    KV block pools know which blocks ``conversations`` share (``harness.workload.prefix.BlockContent``: each
    conversation's own prefix and the shared system prompt: ``harness.sim.plugin.open_sim``, as for a run). No
    engine steps are recorded."""
    from harness.sim.plugin import open_sim
    oracle = Oracle(conversations)
    recorder = Recorder(oracle.visible, log_decisions, info=oracle.info)
    with open_sim(inp, sim_settings(inp), None, conversations=conversations, max_coalesce_s=max_coalesce_s,
                  record_steps=False) as cluster:
        return run_session(cluster, inp, conversations, stats, scheduler_name, sched_cfg, recorder,
                           tick_s=sample_interval_s, on_conversation=on_conversation)


def sim_settings(inp: SessionInput) -> Any:
    """The simulator's settings (``harness.sim.plugin.SimBackendConfig``: event coalescing, s; time and event
    limits) for a simulated session of ``inp`` (:func:`simulate`: the SLO baseline's unloaded replays, the
    tools' replays): the run's own ``backend`` node when ``backend=sim``, else the simulator's defaults (a run
    on another backend has no simulator settings of its own)."""
    from harness.sim.plugin import SimBackendConfig
    return inp.backend if isinstance(inp.backend, SimBackendConfig) else SimBackendConfig()


def check_policies(inp: SessionInput, conversations: Sequence[tuple[float, ConversationRecord]], stats: WorkloadStats) -> None:
    """Build the run's policy (and the SLO reference policy) once, with capacities estimated from the
    profiles and no cluster, so a policy that rejects its config or the cluster's roles fails before
    anything runs.

    Raises:
        ConfigError: naming the scheduler and the factory's message.
    """
    from harness.run.config import ConfigError
    from harness.core.schedulers import get_spec
    names = [(inp.scheduler_name, inp.scheduler)]
    if inp.needs_reference and inp.reference_scheduler != "same":
        names.append(reference_policy(inp))
    if inp.needs_scale_reference and inp.scale_reference not in ("same", inp.scheduler_name):
        names.append(reference_policy(inp, inp.scale_reference))
    ctx = policy_context(inp, stats, Oracle(conversations), estimated_capacities(inp))
    for name, sched_cfg in names:
        try:
            policy = make_policy(name, sched_cfg, ctx)
            rules = [r for r in batch_rules(policy, len(inp.instances)) if r is not None]
            if rules and not inp.backend.supports_batch_rules:
                raise ValueError(f"forms batches inside the engine (a batch rule); backend={inp.backend_name} cannot "
                                 f"take one")
            if rules and not get_spec(name).forms_batches:
                raise ValueError(f"returns batch rules, but it is not registered with forms_batches=True (a backend "
                                 f"that launches engines reads it before the policy can be built)")
            if rules:
                inp.backend.check_batch_rules(inp, rules)
        except ValueError as e:
            what = ("scheduler" if name == inp.scheduler_name else "slo.reference_scheduler"
                    if name == inp.reference_scheduler else "slo.scale_reference")
            raise ConfigError(f"{what} ({name}): {e}") from None


def reference_policy(inp: SessionInput, reference: Optional[str] = None) -> tuple[str, Any]:
    """The relative SLO's reference scheduler: ``(name, config)``; ``slo.reference_scheduler=same`` is
    the run's own scheduler with its own config (each variant judged against itself). ``reference``:
    another scheduler name (or ``same``) instead of ``slo.reference_scheduler`` (the SLO-scale curve's
    ``slo.scale_reference``)."""
    from harness.run.config import scheduler_config
    ref = inp.reference_scheduler if reference is None else reference
    if ref == "same":
        return inp.scheduler_name, inp.scheduler
    return ref, scheduler_config(ref, {"name": ref})
