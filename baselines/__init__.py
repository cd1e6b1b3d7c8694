"""The scheduler variants, one small module each, registered by name (``harness.core.policy.register``).

Importing this package imports every module in it (``harness.core.registry.load_plugins`` imports the package by
name), so a new variant is its module (with its ``@register(name, ConfigClass, roles=..., forms_batches=...,
reads_workload=...)`` factory) plus one row in ``docs/schedulers.md``; the registry makes it the Hydra option
``scheduler=<name>``. Each module imports only the policy interface and its shared helpers
(``harness.core.policy``), the registry (``harness.core.registry``: ``register_rule`` for an engine batch rule),
``harness.LazyModule`` (numpy imported on first use: ``run.py --help`` and a config error never load it) and,
for WAIT, the engine batch-rule interface (``harness.core.batching``) and the fluid model (``baselines.wait.fluid``). The
variants, their rules and their sources: ``docs/schedulers.md``; how to add one: ``docs/extending.md``.
"""

import importlib
import pkgutil

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_m}")
