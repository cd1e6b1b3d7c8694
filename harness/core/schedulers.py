"""The scheduler registry, filled: importing this module loads the plug-ins (``harness.core.registry.load_plugins``:
``baselines`` and the ``agentic_harness.schedulers`` entry points; every variant registers itself with
``harness.core.policy.register``). Kept apart from ``harness.core.policy`` so that the policy interface never imports
the variants built on it (no import cycle)."""

from __future__ import annotations

from harness.core.policy import _SCHEDULERS, PolicySpec
from harness.core.registry import load_plugins

load_plugins()  # fills the registry


def get_spec(name: str) -> PolicySpec:
    """The registered spec of scheduler ``name``.

    Raises:
        KeyError: listing the valid names, if ``name`` is unknown.
    """
    return _SCHEDULERS.get(name)


def registered() -> list[str]:
    """Names of all registered variants, sorted."""
    return sorted(_SCHEDULERS.specs())

