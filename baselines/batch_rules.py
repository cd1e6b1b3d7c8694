"""Every engine batch rule of ``baselines`` rebuilt from its JSON spec (``to_spec()``), by its ``rule``
key: ``wait`` / ``nested_wait`` (``baselines.fluid_admission``) and ``wait_cp`` / ``wait_cp_control``
(``baselines.wait_cp``). The real-vLLM scheduler (``harness.vllm.wait_scheduler``) loads rules through
this one function, so neither rule module imports the other."""

from __future__ import annotations

from typing import Callable, Optional

from baselines.fluid_admission import rule_from_spec as fluid_rule_from_spec
from baselines.wait_cp import cp_rule_from_spec

CP_RULES = ("wait_cp", "wait_cp_control")


def rule_from_spec(spec: dict, classify: Optional[Callable] = None):
    """The rule a spec describes.

    ``classify``: WAIT's ``request -> bin`` (``baselines.fluid_admission.rule_from_spec``; WAIT-CP's rules
    classify from their own spec).

    Raises:
        ValueError: an unknown ``rule`` or a bad parameter (naming it).
    """
    if spec.get("rule") in CP_RULES:  # the WAIT authors' WAIT-CP and its same-budget control
        return cp_rule_from_spec(spec)
    return fluid_rule_from_spec(spec, classify)
