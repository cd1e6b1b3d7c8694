"""Hydra structured configs and start-up validation.

The schema (``RunConfig``) is registered in Hydra's ConfigStore as ``run_schema``; ``conf/config.yaml``
extends it, so a misspelt key or a wrong type fails when Hydra composes the config. ``resolve`` then
checks every value and cross-reference (cluster -> hardware profiles, roles, scheduler registry and the
roles it needs, the trace file) before anything expensive starts; each error names the config key (or
the file and line).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.core.backend import SessionInput, backends, get_backend
from harness.analysis.metrics import SloConfig
from harness.analysis.provenance import FingerprintInput
from harness.core.paths import PROJECT_ROOT, data_path  # noqa: F401  (PROJECT_ROOT re-exported)
from harness.core.policy import ROLES, InstanceHints
from harness.core.profiles import ClusterConfig, EngineConfig, HardwareConfig, ModelConfig, kv_capacity_blocks
from harness.core.schedulers import get_spec, registered
from harness.analysis.validity import ValidityConfig
from harness.workload.workload import WorkloadConfig


class ConfigError(ValueError):
    """A config value or cross-reference is invalid; the message names the key."""


@dataclass
class LoggerConfig:
    """``logger`` group: ``parquet`` (the run directory only) or ``wandb`` (also a Weights & Biases run,
    ``harness.run.loggers``). parquet results are always written.

    log_decisions: write ``decisions.parquet``; metrics_interval_s: sampling period of
    ``instances.parquet`` (s); progress: show a progress bar.
    W&B only: project, entity (``None``: the account's default), mode (``offline``: local files under
    ``dir``, sync later with ``wandb sync``; ``online``; ``disabled``), group (``None``: the sweep
    directory's name in a multirun), tags, dir (``None``: ``$WANDB_DIR``, else the run directory),
    log_tables (per-turn / per-conversation / instance tables), log_figures, max_table_rows (rows per
    table; the parquet files keep them all), max_history_points (instance time-series points per run).
    percentiles: the percentiles of TTFT, TPOT, E2E and ITL in ``summary.json`` (``harness.analysis.validity``).
    steps: write the per-step / per-token observations (opt-in; they are large): ``steps.parquet`` (the
    simulator: one row per engine step, ``harness.sim.steps``), ``tokens.parquet`` (every output token's
    time, on every backend) and, on real vLLM, ``server_metrics.json`` (each server's ``/metrics``
    histograms over the run: iteration tokens, prefill / decode / queue time, TTFT, ITL; per-request
    engine times as ``backend.engine_times`` says, by default vLLM's per-request spans), the input of
    ``python -m harness.tools.calibrate``. Off: nothing is recorded.
    """

    name: str = "parquet"
    log_decisions: bool = True
    metrics_interval_s: float = 1.0
    progress: bool = True
    project: str = "agentic-serving"
    entity: Optional[str] = None
    mode: str = "offline"
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    dir: Optional[str] = None
    log_tables: bool = True
    log_figures: bool = True
    max_table_rows: int = 100_000
    max_history_points: int = 2000
    percentiles: list[float] = field(default_factory=lambda: [50.0, 90.0, 95.0, 99.0])
    steps: bool = False

    def validate(self, where: str = "logger") -> None:
        """Raise ``ValueError`` naming ``logger.<field>`` for the first invalid value."""
        if self.name not in ("parquet", "wandb"):
            raise ValueError(f"{where}.name must be 'parquet' or 'wandb', got {self.name!r}")
        if self.mode not in ("offline", "online", "disabled"):
            raise ValueError(f"{where}.mode must be offline, online or disabled, got {self.mode!r}")
        if not self.metrics_interval_s > 0:
            raise ValueError(f"{where}.metrics_interval_s must be > 0, got {self.metrics_interval_s!r}")
        if self.max_table_rows < 1:
            raise ValueError(f"{where}.max_table_rows must be >= 1, got {self.max_table_rows!r}")
        if self.max_history_points < 1:
            raise ValueError(f"{where}.max_history_points must be >= 1, got {self.max_history_points!r}")
        if not self.percentiles or not all(isinstance(q, (int, float)) and 0 <= q <= 100 for q in self.percentiles):
            raise ValueError(f"{where}.percentiles must be a non-empty list of numbers in [0, 100], "
                             f"got {self.percentiles!r}")
        if not isinstance(self.steps, bool):
            raise ValueError(f"{where}.steps must be true or false, got {self.steps!r}")


@dataclass
class RunConfig:
    """The whole run (see ``conf/README.md`` for every group and key)."""

    hardware: dict[str, HardwareConfig] = field(default_factory=dict)
    model: ModelConfig = field(default_factory=ModelConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    scheduler: Any = None
    backend: Any = None
    slo: SloConfig = field(default_factory=SloConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    validity: ValidityConfig = field(default_factory=ValidityConfig)
    seed: int = 0


def register_configs() -> None:
    """Register ``run_schema`` in Hydra's ConfigStore, and every registered scheduler and backend config
    class as the options of the ``scheduler`` and ``backend`` groups (``scheduler=<name>``,
    ``backend=<name>``: no YAML file needed); and the ``${pid:}`` resolver (this process's id) that the
    run directories use. Idempotent."""
    # run directories: two runs started in the same second differ. Cached per config, as Hydra's ${now:}: a sweep's
    # job configs get the resolved value of the sweep's config (Hydra's load_sweep_config copies its resolver cache),
    # so a job run in another process (a pool worker, a Slurm or Ray task) writes into the sweep directory the
    # submitting process made, not one named by its own pid
    if not OmegaConf.has_resolver("pid"):
        OmegaConf.register_new_resolver("pid", os.getpid, use_cache=True)
    if not OmegaConf.has_resolver("harness_config_groups"):  # --help (conf/config.yaml hydra.help.template)
        OmegaConf.register_new_resolver("harness_config_groups", config_groups_help)
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    for name in registered():
        cs.store(group="scheduler", name=name, node=get_spec(name).config_cls)
    for name, spec in backends().items():
        cs.store(group="backend", name=name, node=spec.config_cls)


def config_groups_help() -> str:
    """The config groups ``--help`` lists (``group: option, ...``, one line each): the YAML options of every
    group under ``conf/`` (the checkout's, else the installed package's), the registered schedulers and
    backends; the generated experiment sub-groups (``experiment/arm``, ``experiment/cell``,
    ``experiment/wait_point``: hundreds of names) by their count only. Hydra's own groups (``hydra/...``)
    are left out, as Hydra's ``$APP_CONFIG_GROUPS`` leaves them."""
    from harness.core.paths import PACKAGE_DIR, in_checkout
    conf = PROJECT_ROOT / "conf" if in_checkout() else PACKAGE_DIR / "conf"
    groups: dict[str, list[str]] = {}
    for p in conf.rglob("*.yaml"):
        rel = p.relative_to(conf)
        if len(rel.parts) >= 2 and rel.parts[0] != "hydra":
            groups.setdefault("/".join(rel.parts[:-1]), []).append(p.stem)
    groups["scheduler"] = registered()
    groups["backend"] = list(backends())
    lines = []
    for g in sorted(groups):
        opts = sorted(groups[g])
        if "/" in g:   # generated sub-groups of the experiment presets
            lines.append(f"{g}: {len(opts)} generated options (conf/{g}/*.yaml; chosen by +experiment=...)")
        else:
            lines.append(f"{g}: {', '.join(opts)}")
    return "\n".join(lines)


@dataclass
class Resolved:
    """A validated run: typed config objects plus the expanded instance list.

    instances: ``(name, role, HardwareConfig)`` in index order; scheduler: the policy's own config
    dataclass instance; backend: the backend plug-in's config dataclass instance; trace_path: absolute
    path of the trace file.
    """

    cfg: RunConfig
    instances: list[tuple[str, str, HardwareConfig]]
    scheduler_name: str
    scheduler: Any
    trace_path: Path
    backend_name: str = "sim"
    backend: Any = None


def resolve_path(p: str) -> Path:
    """A relative path is looked up in the working directory, then under the project root, then in the
    installed package (``harness.core.paths.data_path``)."""
    return data_path(p)


def scheduler_config(name: str, node: Any) -> Any:
    """The scheduler's config dataclass filled from ``node`` (a dict/DictConfig).

    Raises:
        ConfigError: unknown scheduler (listing the valid ones) or an unknown/mistyped key.
    """
    try:
        spec = get_spec(name)
    except KeyError as e:
        raise ConfigError(f"scheduler {name!r}: {e.args[0]}") from None
    return _plugin_config(spec.config_cls, node, "scheduler.")


def backend_config(name: str, node: Any) -> Any:
    """The backend plug-in's config dataclass filled from ``node``.

    Raises:
        ConfigError: unknown backend (listing the valid ones) or an unknown/mistyped key.
    """
    try:
        spec = get_backend(name)
    except KeyError as e:
        raise ConfigError(f"backend.name: {e.args[0]}") from None
    return _plugin_config(spec.config_cls, node, "backend.")


def _plugin_choice(node: Any, group: str, build) -> tuple[str, Any]:
    """``(name, config object)`` of the chosen option of a plug-in group (``scheduler`` or ``backend``):
    the group's structured option as composed, or a mapping with a ``name`` key.

    Raises:
        ConfigError: no option chosen, or the option's config rejects a key.
    """
    if dataclasses.is_dataclass(node):  # a registered option, typed by Hydra: re-checked as the registry's
        node = dataclasses.asdict(node)
    if not isinstance(node, dict) or "name" not in node:
        raise ConfigError(f"{group} must be a mapping with a 'name' key (choose an option: {group}=<name>)")
    return node["name"], build(node["name"], node)


def _plugin_config(cls: type, node: Any, prefix: str) -> Any:
    try:
        if isinstance(node, DictConfig):
            node = OmegaConf.to_container(node, resolve=True)
        return OmegaConf.to_object(OmegaConf.merge(_schema(cls), node))
    except OmegaConfBaseException as e:
        raise ConfigError(_omegaconf_message(e, prefix)) from None


_SCHEMAS: dict = {}   # _schema's memo: config dataclass -> OmegaConf.structured(cls)


def _schema(cls: type) -> DictConfig:
    """``OmegaConf.structured(cls)`` of a plug-in's config dataclass, made once per class and process (~5 ms each;
    :func:`resolve` builds four a run -- the scheduler, the backend, the SLO's reference schedulers -- and a sweep
    resolves each job twice, in its validation and in the job). Never handed out: ``OmegaConf.merge`` deep-copies
    its first argument, so each merge starts from the class's defaults (the registered classes' default factories
    make constant values)."""
    s = _SCHEMAS.get(cls)
    if s is None:
        s = _SCHEMAS[cls] = OmegaConf.structured(cls)
    return s


def _omegaconf_message(e: OmegaConfBaseException, prefix: str = "") -> str:
    """One line naming the full key of an OmegaConf error, e.g. ``scheduler.kv_admit_frac: Value 'x' ...``."""
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    key = getattr(e, "full_key", None)
    return f"{prefix}{key}: {first}" if key else f"{prefix.rstrip('.')}: {first}"


def _reject_unknown_keys(node: Any, path: str) -> None:
    """Raise ConfigError for a key under a schema-typed node that its dataclass does not declare (Hydra's
    ``+key=value`` adds keys past the struct check)."""
    if isinstance(node, DictConfig):
        typ = OmegaConf.get_type(node)
        known = {f.name for f in dataclasses.fields(typ)} if dataclasses.is_dataclass(typ) else None
        for key in node.keys():
            where = f"{path}.{key}" if path else str(key)
            if known is not None and key not in known:
                raise ConfigError(f"{where}: unknown key (not a field of {typ.__name__}; a typo?)")
            _reject_unknown_keys(node._get_node(key), where)
    elif isinstance(node, ListConfig) and not node._is_none():   # a typed list left at null has no items
        for i, item in enumerate(node):
            _reject_unknown_keys(item, f"{path}[{i}]")


_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+=-]{0,127}$")


def _check_names(cfg: RunConfig) -> None:
    """Names that become parts of run-directory paths must be plain file names (no ``/``, no ``..``).

    Raises:
        ConfigError: naming the key.
    """
    named = {"cluster.name": cfg.cluster.name, "model.name": cfg.model.name, "workload.name": cfg.workload.name,
             "slo.name": cfg.slo.name, "logger.name": cfg.logger.name,
             **{f"hardware.{k} (its key)": k for k in cfg.hardware}}
    for key, v in named.items():
        if not (isinstance(v, str) and _SAFE_NAME.match(v) and ".." not in v):
            raise ConfigError(f"{key} must be a plain name (letters, digits, _ . + = -; no '/' or '..'), got {v!r}")


def resolve(dcfg: DictConfig) -> Resolved:
    """Validate a composed config and expand the cluster.

    Raises:
        ConfigError: naming the key of the first invalid value.
    """
    _reject_unknown_keys(dcfg, "")
    try:
        cfg: RunConfig = OmegaConf.to_object(dcfg)
    except OmegaConfBaseException as e:
        raise ConfigError(_omegaconf_message(e)) from None
    _check_names(cfg)
    for key, hw in cfg.hardware.items():
        hw.name = key  # the key a profile is composed under is its name
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise ConfigError(f"seed must be an integer >= 0 (it seeds numpy generators, which take no negative "
                          f"seed), got {cfg.seed!r}")
    try:
        for key, hw in cfg.hardware.items():
            hw.validate(f"hardware.{key}")
        cfg.model.validate("model")
        cfg.engine.validate("engine")
        cfg.workload.validate("workload")
        cfg.slo.validate("slo")
        cfg.cluster.link.validate("cluster.link")
        cfg.logger.validate("logger")
        cfg.validity.validate("validity")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not cfg.cluster.instances:
        raise ConfigError("cluster.instances must list at least one instance group")
    instances: list[tuple[str, str, HardwareConfig]] = []
    counts: dict[str, int] = {}
    for gi, g in enumerate(cfg.cluster.instances):
        where = f"cluster.instances[{gi}]"
        if g.role not in ROLES:
            raise ConfigError(f"{where}.role must be one of {list(ROLES)}, got {g.role!r}")
        if g.hardware not in cfg.hardware:
            raise ConfigError(f"{where}.hardware: unknown hardware profile {g.hardware!r}; "
                              f"known: {sorted(cfg.hardware)}")
        if not (isinstance(g.count, int) and g.count >= 1):
            raise ConfigError(f"{where}.count must be an int >= 1, got {g.count!r}")
        if g.name is not None and not (isinstance(g.name, str) and g.name):
            raise ConfigError(f"{where}.name must be a non-empty string or null (an instance group's name, "
                              f"which workload.model_map sends calls to), got {g.name!r}")
        for _ in range(g.count):
            k = counts.get(g.role, 0)
            counts[g.role] = k + 1
            instances.append((f"{g.role}{k}", g.role, cfg.hardware[g.hardware]))
        try:  # every backend: the policies' hints and capacity estimates come from these profiles
            kv_capacity_blocks(cfg.hardware[g.hardware], cfg.model, cfg.engine)
        except ValueError as e:
            raise ConfigError(f"{where}.hardware: {e}") from None
    name, sched_obj = _plugin_choice(cfg.scheduler, "scheduler", scheduler_config)
    try:
        model_routes(cfg, [r for _, r, _ in instances], get_spec(name).roles)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.slo.needs_unloaded() and cfg.slo.reference_scheduler != "same":
        try:
            scheduler_config(cfg.slo.reference_scheduler, {"name": cfg.slo.reference_scheduler})
        except ConfigError as e:
            raise ConfigError(f"slo.reference_scheduler: {e}") from None
    if cfg.slo.needs_scale_unloaded() and cfg.slo.scale_reference_name() != "same":
        try:
            scheduler_config(cfg.slo.scale_reference_name(), {"name": cfg.slo.scale_reference_name()})
        except ConfigError as e:
            raise ConfigError(f"slo.scale_reference: {e}") from None
    trace = resolve_path(cfg.workload.trace)
    if cfg.workload.kind == "trace" and not trace.is_file():
        why = "is a directory, not a trace file" if trace.is_dir() else "file not found"
        raise ConfigError(f"workload.trace: {why}: {cfg.workload.trace} (looked for {trace})")
    backend_name, backend_obj = _plugin_choice(cfg.backend, "backend", backend_config)
    run = Resolved(cfg, instances, name, sched_obj, trace, backend_name, backend_obj)
    try:
        backend_obj.validate(session_input(run))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return run


# ---- what a session and a backend read of the resolved run ------------------------------------------------

def instance_hints(hw: HardwareConfig, model: ModelConfig, step_model: str = "roofline") -> InstanceHints:
    """What a router may know of an instance before serving: the prices of the configured step model
    (``engine.step_model``, ``harness.sim.step_model.StepModel``; the simulator's, evaluated on the profiles
    alone): prefill throughput (one 2048-token chunk, tokens/s), an idle decode step (1 sequence, 1024-token
    context, s), and the WAIT fluid model's iteration line ``d0 + d1 * KV tokens``
    (``StepModel.decode_linear_coefficients``) with its prefill term ``d2`` (``StepModel.prefill_token_s``; the
    roofline's: ``harness.core.profiles.prefill_iteration_coefficient``, linear-layer FLOPs per token over
    peak x prefill efficiency). Raises ``ValueError`` naming ``engine.step_model`` (unknown; no profile)."""
    from harness.sim.perf import make_step_model
    perf = make_step_model(hw, model, step_model)
    d0, d1 = perf.decode_linear_coefficients()
    return InstanceHints(perf.prefill_tokens_per_s(), perf.idle_decode_step_s(), d0, d1, perf.prefill_token_s())


def model_routes(cfg: RunConfig, roles: list[str], needed_roles: tuple[str, ...] = ()) -> Any:
    """``workload.model_map`` resolved on ``cluster.instances`` (``harness.core.routing.resolve_routes``): the
    group name of each instance, in index order, from its ``cluster.instances`` entry's ``name``; ``roles``
    the role of each instance; ``needed_roles`` the scheduler's. ``None`` without a map.

    Raises:
        ValueError: naming ``workload.model_map[<pattern>]`` (a group the cluster does not declare; a pool
            without a role the scheduler needs)."""
    from harness.core.routing import resolve_routes
    groups = [g.name for g in cfg.cluster.instances for _ in range(g.count)]
    return resolve_routes(cfg.workload.model_map, groups, roles, needed_roles, cluster=cfg.cluster.name)


def session_input(run: Resolved) -> SessionInput:
    """The ``harness.core.backend.SessionInput`` of a resolved run (:func:`resolve`): the one place a session's
    and a backend's input is read from the run config. The hints are evaluated here, once per run."""
    cfg = run.cfg
    return SessionInput(
        instances=tuple(run.instances), model=cfg.model, engine=cfg.engine, link=cfg.cluster.link, seed=cfg.seed,
        shared_prefix_tokens=cfg.workload.effective_shared_prefix_tokens(), context_limit_tokens=context_limit(run),
        hints=tuple(instance_hints(hw, cfg.model, cfg.engine.step_model) for _, _, hw in run.instances),
        scheduler_name=run.scheduler_name, scheduler=run.scheduler,
        reference_scheduler=cfg.slo.reference_scheduler, needs_reference=cfg.slo.needs_unloaded(),
        scale_reference=cfg.slo.scale_reference_name(), needs_scale_reference=cfg.slo.needs_scale_unloaded(),
        ttfet_definition=cfg.slo.ttfet_definition, backend_name=run.backend_name, backend=run.backend,
        workload_seed=cfg.workload.seed, max_active=cfg.workload.max_active(), duration_s=cfg.workload.duration_s,
        log_steps=bool(cfg.logger.steps),
        routes=model_routes(cfg, [r for _, r, _ in run.instances], get_spec(run.scheduler_name).roles))


def fingerprint_input(run: Resolved) -> FingerprintInput:
    """What the run's fingerprint (``harness.analysis.provenance.fingerprint``) reads of the resolved run: its
    instances, model profile and trace file (``None`` for ``workload.kind=synthetic``)."""
    synthetic = run.cfg.workload.kind == "synthetic"
    return FingerprintInput(tuple(run.instances), run.cfg.model, None if synthetic else run.trace_path)


def context_limit(run: Resolved) -> Optional[int]:
    """The served model's context of a resolved run, tokens: ``model.max_model_len`` (its ``config.json``),
    and on a backend that serves with a shorter one (``BackendConfig.context_limit``, e.g. vLLM's
    ``--max-model-len``), that. ``None`` when neither says. (A session reads it as
    ``SessionInput.context_limit_tokens``.)"""
    return served_context(run.cfg.model, run.backend)


def served_context(model: ModelConfig, backend: Any) -> Optional[int]:
    """:func:`context_limit` of a model config and a backend plug-in's config (``BackendConfig``), tokens: the
    shorter of ``model.max_model_len`` and ``backend.context_limit()``; ``None`` when neither says."""
    limits = [x for x in (model.max_model_len or None, backend.context_limit()) if x]
    return min(limits) if limits else None


def compose_run(overrides: Any) -> tuple[Resolved, DictConfig]:
    """The project's config composed with the Hydra ``overrides`` (one point, no sweep: ``["backend=vllm",
    "workload.rate_per_s=2"]``) and validated, as ``run.py`` would run it: ``(Resolved, the composed config)``;
    nothing is run. The tools that start runs call it to refuse bad overrides before the first run
    (``harness.tools.fidelity`` ``--launch`` / ``protocol``).

    Raises:
        ConfigError: an override that does not compose (an unknown key or option, a malformed override: Hydra's
            message on one line) or a value :func:`resolve` refuses (naming the key).
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    from harness.core.paths import PACKAGE_DIR
    register_configs()
    GlobalHydra.instance().clear()
    conf = PROJECT_ROOT / "conf"   # a checkout's, else the installed wheel's copy (as harness.run.cli.config_path)
    conf = conf if (conf / "config.yaml").is_file() else PACKAGE_DIR / "conf"
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            dcfg = compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:   # an unknown key or option, a malformed override
        raise ConfigError(" ".join(str(e).split())) from None
    return resolve(dcfg), dcfg
