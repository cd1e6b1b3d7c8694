"""Plug-in facts on the registry (issue 24, item 2): scheduler traits, the batch-rule registry by name, the
backend-config base class, and the vLLM backend's start-up check of batch rules through the registry."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from harness.core.backend import BackendConfig, register_backend
from harness.core.policy import ROLES
from harness.core.registry import Registry, SchedulerSpec, register_rule, rule_from_spec, rules
from harness.core.schedulers import get_spec, registered


def test_the_shipped_variants_traits_are_what_their_papers_need():
    """By hand from docs/schedulers.md: the three P/D variants prefill on a prefiller and decode on a decoder;
    the WAIT family forms its batches inside the engine and plans from the workload statistics (the fluid
    thresholds, WAIT-CP's batch_est); the rest read neither."""
    pd = {"conserve", "ampd", "disaggregated"}
    engine = {"wait", "nested_wait", "wait_cp", "wait_cp_control"}
    for n in pd | engine | {"collocated"}:   # the shipped ones (a new variant needs no edit here)
        s = get_spec(n)
        assert s.roles == (("prefiller", "decoder") if n in pd else ()), n
        assert s.forms_batches == s.reads_workload == (n in engine), n
    assert all(set(get_spec(n).roles) <= set(ROLES) for n in registered())


def test_registry_refuses_a_second_name_and_an_unknown_trait():
    reg = Registry("scheduler", SchedulerSpec)
    reg.register("x", dict, roles=("decoder",))(lambda c, x: None)
    assert reg.get("x").roles == ("decoder",) and reg.get("x").forms_batches is False
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("x", dict)(lambda c, x: None)
    with pytest.raises(TypeError, match="unknown trait.*'batches'"):
        reg.register("y", dict, batches=True)
    with pytest.raises(KeyError, match="valid: \\['x'\\]"):
        reg.get("z")


def test_a_role_outside_the_roles_is_refused_at_registration():
    from harness.core.policy import register
    with pytest.raises(ValueError, match="'prefill'"):
        register("typo_variant", dict, roles=("prefill",))


def test_every_shipped_rule_round_trips_by_name():
    """Each engine rule of a shipped variant, built by its policy, survives ``to_spec`` -> JSON ->
    ``rule_from_spec`` with the same class and the same spec (what a vLLM server rebuilds)."""
    from harness.run import session
    from harness.workload.workload import WorkloadConfig, build_workload
    from tests.conftest import compose_run
    from tests.test_config import CONVS
    convs, stats = build_workload(CONVS, WorkloadConfig(arrival="poisson", rate_per_s=1.0))
    assert set(rules()) >= {"wait", "nested_wait", "wait_cp", "wait_cp_control"}
    for name in registered():
        if not get_spec(name).forms_batches:
            continue
        run = compose_run([f"scheduler={name}", "cluster=a40_4x", "slo=absolute"])
        ctx = session.policy_context(inp := session.session_input(run), stats, None, session.estimated_capacities(inp))
        rule = session.make_policy(name, run.scheduler, ctx).batch_rule(0)
        spec = json.loads(json.dumps(rule.to_spec()))
        again = rule_from_spec(spec)
        assert type(again) is type(rule) and again.to_spec() == rule.to_spec(), name


def test_an_unknown_rule_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown rule 'fifo'; registered: \[.*'wait'.*\]"):
        rule_from_spec({"rule": "fifo"})
    with pytest.raises(ValueError, match="JSON object"):
        rule_from_spec(["wait"])


class _Sent:
    name = "sent"

    def __init__(self, spec):
        self.spec = spec

    def to_spec(self):
        return self.spec


def test_vllm_refuses_a_rule_it_cannot_rebuild_before_launch():
    """``VllmBackendConfig.check_batch_rules``: a rule without ``to_spec`` and a spec naming no registered
    builder are refused; a registered builder is accepted."""
    from harness.vllm.config import VllmBackendConfig
    cfg = VllmBackendConfig()

    class NoSpec:
        name = "nospec"

    with pytest.raises(ValueError, match="'nospec' cannot be sent to a vLLM server: no to_spec"):
        cfg.check_batch_rules(None, [NoSpec()])
    with pytest.raises(ValueError, match="unknown rule 'sent_test_rule'"):
        cfg.check_batch_rules(None, [_Sent({"rule": "sent_test_rule"})])
    if "sent_test_rule" not in rules():
        register_rule("sent_test_rule")(lambda spec: _Sent(spec))
    cfg.check_batch_rules(None, [_Sent({"rule": "sent_test_rule", "k": 1})])


def test_a_backend_config_must_derive_from_the_base():
    @dataclass
    class Plain:
        name: str = "plain"

    with pytest.raises(TypeError, match="must derive from harness.core.backend.BackendConfig"):
        register_backend("plain_test", Plain)
    base = BackendConfig()
    assert base.supports_batch_rules is False and base.context_limit() is None
    assert base.validate(None) is None and base.check_batch_rules(None, []) is None
