"""What a session reads of the run config: :class:`SessionInput`, typed and frozen, built once per run by
:func:`session_input` from the resolved config (``harness.run.config.Resolved``). ``harness.run.config.resolve``
hands it to the backend's ``validate``, ``harness.run.runner.execute`` to the sessions and the backend's
``open``; no session and no backend reads the whole run config. (Its own module: the config module and the
session module both read it, and neither imports the other for it.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from harness.analysis.provenance import FingerprintInput
from harness.core.backend import BackendConfig
from harness.core.policy import InstanceHints
from harness.core.profiles import EngineConfig, HardwareConfig, LinkConfig, ModelConfig, prefill_iteration_coefficient

if TYPE_CHECKING:  # annotations only: the config module is read by the builder below, never imported
    from harness.run.config import Resolved
    from harness.sim.plugin import SimBackendConfig


def instance_hints(hw: HardwareConfig, model: ModelConfig) -> InstanceHints:
    """What a router may know of an instance before serving: the hardware profile's step model (the
    simulator's, ``harness.sim.perf.PerfModel``, evaluated on the profiles alone) for prefill throughput
    (2048-token chunk, tokens/s), an idle decode step (1 sequence, 1024-token context, s), and the WAIT
    fluid model's iteration line ``d0 + d1 * KV tokens`` (``PerfModel.decode_linear_coefficients``) with its
    prefill term ``d2`` (``harness.core.profiles.prefill_iteration_coefficient``: linear-layer FLOPs per token over
    peak x prefill efficiency)."""
    from harness.sim.perf import PerfModel
    perf = PerfModel(hw, model)
    d0, d1 = perf.decode_linear_coefficients()
    d2 = prefill_iteration_coefficient(2.0 * model.num_layers * model.linear_params_per_layer, hw.peak_flops,
                                       hw.prefill_efficiency)
    return InstanceHints(perf.prefill_tokens_per_s(), perf.idle_decode_step_s(), d0, d1, d2)


@dataclass(frozen=True)
class SessionInput:
    """What a session reads of the run config: built once per run by :func:`session_input` (frozen: a
    session cannot change it; the config objects it holds are the run's own, shared, and not copied).

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
    context_limit_tokens: the served context, tokens (:func:`context_limit`); ``None``: unlimited.
    hints: per instance, what a router may know of it before serving (:func:`instance_hints`: prefill
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
        ``supports_batch_rules``, ``check_batch_rules``); sim: the simulator's settings for the simulated
        sessions (the SLO replays, :func:`simulate`): the run's backend config when ``backend=sim``, else
        the simulator's defaults.
    max_active: the cap on active conversations (``workload.max_active()``: a closed population's
        ``concurrency`` or ``max_concurrency``; ``None``: no cap). duration_s: the duration stop
        (``workload.duration_s``, s; ``None``: none). log_steps: record every engine step where the backend
        can (``logger.steps``). A backend's ``validate`` and ``open`` read these with the rest of this input
        (``harness.core.backend``), never the run config.
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
    sim: "SimBackendConfig"
    workload_seed: int = 0
    max_active: Optional[int] = None
    duration_s: Optional[float] = None
    log_steps: bool = False

    @property
    def roles(self) -> tuple[str, ...]:
        """The role of each instance, in index order."""
        return tuple(r for _, r, _ in self.instances)


def session_input(run: "Resolved") -> SessionInput:
    """The :class:`SessionInput` of a resolved run (``harness.run.config.resolve``): the one place a session's
    input is read from the run config. The hints are evaluated here, once per run."""
    from harness.sim.plugin import SimBackendConfig
    cfg = run.cfg
    return SessionInput(
        instances=tuple(run.instances), model=cfg.model, engine=cfg.engine, link=cfg.cluster.link, seed=cfg.seed,
        shared_prefix_tokens=cfg.workload.effective_shared_prefix_tokens(), context_limit_tokens=context_limit(run),
        hints=tuple(instance_hints(hw, cfg.model) for _, _, hw in run.instances),
        scheduler_name=run.scheduler_name, scheduler=run.scheduler,
        reference_scheduler=cfg.slo.reference_scheduler, needs_reference=cfg.slo.needs_unloaded(),
        scale_reference=cfg.slo.scale_reference_name(), needs_scale_reference=cfg.slo.needs_scale_unloaded(),
        ttfet_definition=cfg.slo.ttfet_definition, backend_name=run.backend_name, backend=run.backend,
        sim=run.backend if isinstance(run.backend, SimBackendConfig) else SimBackendConfig(),
        workload_seed=cfg.workload.seed, max_active=cfg.workload.max_active(), duration_s=cfg.workload.duration_s,
        log_steps=bool(cfg.logger.steps))


def fingerprint_input(run: "Resolved") -> FingerprintInput:
    """What the run's fingerprint (``harness.analysis.provenance.fingerprint``) reads of the resolved run: its
    instances, model profile and trace file (``None`` for ``workload.kind=synthetic``)."""
    synthetic = run.cfg.workload.kind == "synthetic"
    return FingerprintInput(tuple(run.instances), run.cfg.model, None if synthetic else run.trace_path)


def context_limit(run: "Resolved") -> Optional[int]:
    """The served model's context of a resolved run, tokens: ``model.max_model_len`` (its ``config.json``),
    and on a backend that serves with a shorter one (``BackendConfig.context_limit``, e.g. vLLM's
    ``--max-model-len``), that. ``None`` when neither says. (A session reads it as
    ``SessionInput.context_limit_tokens``.)"""
    limits = [run.cfg.model.max_model_len or None]
    limits.append(run.backend.context_limit())
    limits = [x for x in limits if x]
    return min(limits) if limits else None
