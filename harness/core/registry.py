"""Registries of named plug-ins with their config dataclasses and traits: the scheduler variants
(``harness.core.policy.register``), the backends (``harness.core.backend.register_backend``), the engine batch
rules (:func:`register_rule`) and the simulator's step models (:func:`register_step_model`), which all use
:class:`Registry`.

A plug-in's facts live on its registration, not in name lists elsewhere: a scheduler declares the roles it
needs, whether it forms batches inside the engine and whether its decisions read the workload statistics
(:class:`SchedulerSpec`); config validation, the SLO baseline's cache key, the vLLM backend and the tests
read them from here. The modules that register the built-in variants and rules (:data:`PLUGIN_PACKAGES`,
plus the ``agentic_harness.schedulers`` entry points) are imported by :func:`load_plugins`, by name, so a
module that only reads a registry (a backend, e.g. ``harness.vllm.wait_scheduler`` rebuilding a batch rule
from its spec) never imports a variant.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

PLUGIN_PACKAGES = ("baselines",)
"""Packages imported by :func:`load_plugins`: every module in them registers its variants and rules."""
SCHEDULER_ENTRY_POINT_GROUP = "agentic_harness.schedulers"
"""Entry-point group of installed packages holding more variants (the value names a module to import)."""


@dataclass(frozen=True)
class Spec:
    """A registered plug-in: its name, config dataclass and factory (a policy factory ``(cfg, ctx) ->
    Policy``, a backend's ``open(run, run_dir, ...) -> ContextManager[Cluster]``, or a batch rule's
    ``from_spec(spec: dict) -> rule``)."""

    name: str
    config_cls: type
    factory: Callable[..., Any]

    @property
    def open(self) -> Callable[..., Any]:
        """The factory of a backend, by its usual name."""
        return self.factory


@dataclass(frozen=True)
class SchedulerSpec(Spec):
    """A registered scheduler variant with its traits.

    roles: instance roles the cluster must have at least one of each (e.g. ``("prefiller", "decoder")``
        for a variant that prefills on a prefiller and decodes on a decoder); checked by config validation
        (``harness.run.config.resolve``) and by ``harness.run.session.make_policy`` before the factory runs.
    forms_batches: the variant's policy returns an engine batch rule per instance (``Policy.batch_rule``),
        so a backend that launches engines (vLLM) starts them with the rule-running scheduler before the
        policy exists, and a backend that cannot take rules refuses the run at start-up.
    reads_workload: the policy's decisions read the workload statistics or the run's seed
        (``PolicyContext.workload`` / ``seed``); the SLO baseline's cache key then includes them
        (``harness.run.slo_baseline._unloaded_cache_key``).
    """

    roles: tuple[str, ...] = ()
    forms_batches: bool = False
    reads_workload: bool = False


class Registry:
    """Plug-ins of one kind (``"scheduler"``, ``"backend"``, ``"batch rule"``) by name; ``spec_cls``: the
    :class:`Spec` subclass its entries are (its extra fields are the traits ``register`` takes)."""

    def __init__(self, kind: str, spec_cls: type = Spec):
        self.kind = kind
        self.spec_cls = spec_cls
        self._specs: dict[str, Spec] = {}

    def register(self, name: str, config_cls: type, **traits: Any):
        """Decorator adding ``factory`` under ``name`` with its config dataclass and traits (fields of
        ``spec_cls``).

        Raises:
            ValueError: if ``name`` is already registered. TypeError: a trait ``spec_cls`` does not have.
        """
        spec_fields = set(self.spec_cls.__dataclass_fields__) - {"name", "config_cls", "factory"}
        unknown = set(traits) - spec_fields
        if unknown:
            raise TypeError(f"{self.kind} {name!r}: unknown trait(s) {sorted(unknown)}; valid: {sorted(spec_fields)}")

        def deco(factory):
            if name in self._specs:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._specs[name] = self.spec_cls(name, config_cls, factory, **traits)
            return factory
        return deco

    def specs(self) -> dict[str, Spec]:
        """The registered specs by name (a copy)."""
        return dict(self._specs)

    def get(self, name: str) -> Spec:
        """The spec of ``name``.

        Raises:
            KeyError: listing the valid names, if ``name`` is unknown.
        """
        if name not in self._specs:
            raise KeyError(f"unknown {self.kind} {name!r}; valid: {sorted(self._specs)}")
        return self._specs[name]


_plugins_loaded = False


def load_plugins() -> None:
    """Import every module of :data:`PLUGIN_PACKAGES` (each registers its scheduler variants and batch rules)
    and of the :data:`SCHEDULER_ENTRY_POINT_GROUP` entry points; once per process. An import error
    propagates (a broken plug-in is never skipped silently)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    for pkg in PLUGIN_PACKAGES:
        importlib.import_module(pkg)   # the package's __init__ imports its modules
    from importlib.metadata import entry_points
    for ep in entry_points(group=SCHEDULER_ENTRY_POINT_GROUP):
        importlib.import_module(ep.value.split(":")[0])
    _plugins_loaded = True


# ---- engine batch rules by name ----------------------------------------------------------------------

_RULES = Registry("batch rule")


def register_rule(name: str):
    """Decorator registering ``from_spec(spec: dict) -> rule`` as the builder of batch rule ``name``: the
    rule a JSON spec ``{"rule": name, ...}`` (the rule's ``to_spec()``) describes. A backend that runs rules
    in another process (``harness.vllm.wait_scheduler``) rebuilds them through :func:`rule_from_spec`, so a
    new engine rule is its module (``harness.core.batching.BatchRule`` with ``to_spec``, registered here) and
    runs on every backend that takes rules.

    Raises:
        ValueError: if ``name`` is already registered.
    """
    return _RULES.register(name, dict)


def rule_from_spec(spec: dict):
    """The batch rule ``spec`` describes, built by the builder registered under ``spec["rule"]`` (the
    plug-ins are loaded first if that name is not registered yet).

    Raises:
        ValueError: ``spec`` is not a mapping, names no registered rule (listing the valid ones), or the
            builder rejects a parameter (naming it).
    """
    if not isinstance(spec, dict):
        raise ValueError(f"batch rule spec must be a JSON object, got {type(spec).__name__}")
    name = spec.get("rule")
    if name not in _RULES.specs():
        load_plugins()
    if name not in _RULES.specs():
        raise ValueError(f"batch rule spec: unknown rule {name!r}; registered: {sorted(_RULES.specs())}")
    return _RULES.get(name).factory(spec)


def rules() -> dict[str, Spec]:
    """The registered batch rules by name (after loading the plug-ins)."""
    load_plugins()
    return _RULES.specs()


# ---- simulator step models by name ---------------------------------------------------------------------

STEP_MODEL_MODULES = ("harness.sim.perf",)
"""Modules that register the built-in step models (imported by name by :func:`step_models`: this module imports
nothing from the simulator)."""
_STEP_MODELS = Registry("step model")


def register_step_model(name: str):
    """Class decorator registering a step model (a ``harness.sim.step_model.StepModel`` subclass whose
    constructor takes ``(hw: HardwareConfig, model: ModelConfig)``) as the value ``name`` of ``engine.step_model``.

    Raises:
        ValueError: if ``name`` is already registered.
    """
    return _STEP_MODELS.register(name, dict)


def step_models(name: str | None = None) -> dict[str, Spec]:
    """The registered step models by name: those of :data:`STEP_MODEL_MODULES`, plus the plug-ins' (loaded by
    :func:`load_plugins`) when ``name`` is given and not among them (a step model a plug-in module registers)."""
    for mod in STEP_MODEL_MODULES:
        importlib.import_module(mod)
    if name is not None and name not in _STEP_MODELS.specs():
        load_plugins()
    return _STEP_MODELS.specs()


def make_step_model(name: str, hw: Any, model: Any):
    """The step model ``name`` (``engine.step_model``) of one engine: ``hw`` x ``model``.

    Raises:
        ValueError: ``engine.step_model must be one of ...`` for an unregistered name (after loading the
            plug-ins); the model's own ``ValueError`` (e.g. no profile for ``hw`` x ``model``).
    """
    specs = step_models(name)
    if name not in specs:
        raise ValueError(f"engine.step_model must be one of {tuple(specs)}, got {name!r}")
    return specs[name].factory(hw, model)
