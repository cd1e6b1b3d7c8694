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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.metrics import SloConfig
from harness.policy import ROLES, get_spec
from harness.profiles import ClusterConfig, EngineConfig, HardwareConfig, ModelConfig
from harness.workload import WorkloadConfig

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class ConfigError(ValueError):
    """A config value or cross-reference is invalid; the message names the key."""


@dataclass
class BackendConfig:
    """``backend`` group: ``sim`` (the simulated cluster)."""

    name: str = "sim"


@dataclass
class LoggerConfig:
    """``logger`` group. parquet results are always written.

    log_decisions: write ``decisions.parquet``; metrics_interval_s: sampling period of
    ``instances.parquet`` (s); progress: show a progress bar.
    """

    name: str = "parquet"
    log_decisions: bool = True
    metrics_interval_s: float = 1.0
    progress: bool = True


@dataclass
class RunConfig:
    """The whole run (see ``conf/README.md`` for every group and key)."""

    hardware: dict[str, HardwareConfig] = field(default_factory=dict)
    model: ModelConfig = field(default_factory=ModelConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    scheduler: Any = None
    backend: BackendConfig = field(default_factory=BackendConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0


def register_configs() -> None:
    """Register ``run_schema`` in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name="run_schema", node=RunConfig)


@dataclass
class Resolved:
    """A validated run: typed config objects plus the expanded instance list.

    instances: ``(name, role, HardwareConfig)`` in index order; scheduler: the policy's own config
    dataclass instance; trace_path: absolute path of the trace file.
    """

    cfg: RunConfig
    instances: list[tuple[str, str, HardwareConfig]]
    scheduler_name: str
    scheduler: Any
    trace_path: Path


def resolve_path(p: str) -> Path:
    """A relative path is looked up in the working directory, then under the project root."""
    path = Path(p)
    if path.is_absolute():
        return path
    cwd = Path(os.getcwd()) / path
    return cwd if cwd.exists() else PROJECT_ROOT / path


def scheduler_config(name: str, node: Any) -> Any:
    """The scheduler's config dataclass filled from ``node`` (a dict/DictConfig).

    Raises:
        ConfigError: unknown scheduler (listing the valid ones) or an unknown/mistyped key.
    """
    try:
        spec = get_spec(name)
    except KeyError as e:
        raise ConfigError(f"scheduler.name: {e.args[0]}") from None
    try:
        merged = OmegaConf.merge(OmegaConf.structured(spec.config_cls), node)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(f"scheduler ({name}): {e}".splitlines()[0]) from None


def resolve(dcfg: DictConfig) -> Resolved:
    """Validate a composed config and expand the cluster.

    Raises:
        ConfigError: naming the key of the first invalid value.
    """
    try:
        cfg: RunConfig = OmegaConf.to_object(dcfg)
    except OmegaConfBaseException as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    try:
        for key, hw in cfg.hardware.items():
            hw.validate(f"hardware.{key}")
        cfg.model.validate("model")
        cfg.engine.validate("engine")
        cfg.workload.validate("workload")
        cfg.slo.validate("slo")
        cfg.cluster.link.validate("cluster.link")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.backend.name != "sim":
        raise ConfigError(f"backend.name must be 'sim' (the real-vLLM backend is not built yet), got {cfg.backend.name!r}")
    if not cfg.logger.metrics_interval_s > 0:
        raise ConfigError(f"logger.metrics_interval_s must be > 0, got {cfg.logger.metrics_interval_s!r}")
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
        for _ in range(g.count):
            k = counts.get(g.role, 0)
            counts[g.role] = k + 1
            instances.append((f"{g.role}{k}", g.role, cfg.hardware[g.hardware]))
    sched = cfg.scheduler
    if not isinstance(sched, dict) or "name" not in sched:
        raise ConfigError("scheduler must be a mapping with a 'name' key (choose an option: scheduler=<name>)")
    name = sched["name"]
    sched_obj = scheduler_config(name, sched)
    if cfg.slo.ttfet_mode == "relative":
        get_spec(cfg.slo.reference_scheduler)
    trace = resolve_path(cfg.workload.trace)
    if not trace.is_file():
        raise ConfigError(f"workload.trace: file not found: {cfg.workload.trace} (looked for {trace})")
    return Resolved(cfg, instances, name, sched_obj, trace)
