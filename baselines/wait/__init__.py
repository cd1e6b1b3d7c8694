"""WAIT, Nested WAIT and WAIT-CP (Ao et al., arXiv 2504.11320; docs/wait.md): the fluid model, the engine
batch rules and the variants, in one package of ``baselines``.

* ``fluid`` -- the fluid model: WAIT's and Nested WAIT's thresholds, the prefill-aware cycle, prompt types.
* ``fluid_admission`` -- the engine batch rules (``WaitRule``, ``NestedWaitRule``) and the output classifiers,
  registered as batch rules by name; the variants are ``harness.core.policy.BatchRulePolicy`` (admit-all, sticky
  collocated, one rule per engine).
* ``wait`` / ``nested_wait`` / ``wait_cp`` -- the variants (``scheduler=wait``, ``nested_wait``, ``wait_cp``,
  ``wait_cp_control``).

Importing this package imports every module in it (as ``baselines`` does), so every variant and rule is
registered when the plug-ins load (``harness.core.registry.load_plugins``).
"""

import importlib
import pkgutil

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_m}")
