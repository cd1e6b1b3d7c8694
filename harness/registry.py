"""A registry of named plug-ins with their config dataclasses: the scheduler variants
(``harness.policy.register``) and the backends (``harness.backend.register_backend``) both use it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Spec:
    """A registered plug-in: its name, config dataclass and factory (a policy factory ``(cfg, ctx) ->
    Policy``, or a backend's ``open(run, run_dir, ...) -> ContextManager[Cluster]``)."""

    name: str
    config_cls: type
    factory: Callable[..., Any]

    @property
    def open(self) -> Callable[..., Any]:
        """The factory of a backend, by its usual name."""
        return self.factory


class Registry:
    """Plug-ins of one kind (``"scheduler"``, ``"backend"``) by name."""

    def __init__(self, kind: str):
        self.kind = kind
        self._specs: dict[str, Spec] = {}

    def register(self, name: str, config_cls: type):
        """Decorator adding ``factory`` under ``name`` with its config dataclass.

        Raises:
            ValueError: if ``name`` is already registered.
        """
        def deco(factory):
            if name in self._specs:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._specs[name] = Spec(name, config_cls, factory)
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
