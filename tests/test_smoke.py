"""The smoke preset (conf/experiment/smoke.yaml) and the size-scaled verdict (harness.analysis.validity).

* The floor by hand: ``min(100, max(1, ceil(0.5 x n x 0.8)))`` -> 7 for 16 conversations, 1 for 2, 100 for
  1000; unset, the fixed 100.
* ``+experiment=smoke`` on the simulator is VALID; the same preset is INVALID when the backend fails turns
  (the fake backend of tests/test_pipeline.py failing every 5th turn) and when a conversation is dropped
  for the context (one hand-made conversation longer than the model's context).
"""

from __future__ import annotations

import json

import pytest

from harness.run.runner import execute
from harness.analysis.validity import ValidityConfig
from tests.conftest import compose_run, conversation
from tests.test_pipeline import FakeBackendConfig, FakeCluster
from harness.core.backend import backends, register_backend

SMOKE = ["+experiment=smoke"]


def test_steady_floor_by_hand():
    v = ValidityConfig(min_conversations_frac=0.5)
    assert v.steady_floor(16) == 7 and v.steady_floor(2) == 1 and v.steady_floor(1000) == 100
    assert v.steady_floor(250) == 100 and v.steady_floor(249) == 100 and v.steady_floor(200) == 80
    assert ValidityConfig().steady_floor(16) == 100
    with pytest.raises(ValueError, match="validity.min_conversations_frac"):
        ValidityConfig(min_conversations_frac=0.0).validate()
    with pytest.raises(ValueError, match="validity.max_dropped_frac"):
        ValidityConfig(max_dropped_frac=2).validate()


def test_smoke_is_valid_when_healthy(tmp_path):
    s = execute(compose_run(SMOKE), tmp_path)
    assert s["num_conversations"] == 16 and s["num_conversations_failed"] == 0
    assert s["steady_conversations_needed"] == 7 and s["steady_conversations"] >= 7
    assert s["valid"] is True, s["invalid_reasons"]
    assert json.loads((tmp_path / "summary.json").read_text())["valid"] is True


class FailingCluster(FakeCluster):
    """Every 5th turn started fails at once (as a server answering HTTP 500 would)."""

    def __init__(self, inp, step_s):
        super().__init__(inp, step_s)
        self.n = 0

    def start_turn(self, job):
        self.n += 1
        if self.n % 5:
            return super().start_turn(job)
        job.start_s = self.clock.now()

        def fail():
            job.error = "injected: HTTP 500"
            job.on_fail(job, job.error)
        self.clock.call_at(self.clock.now() + self.step_s, fail, priority=0)


if "failing" not in backends():
    import contextlib
    from dataclasses import dataclass

    @dataclass
    class FailingBackendConfig(FakeBackendConfig):
        name: str = "failing"

    @register_backend("failing", FailingBackendConfig)
    @contextlib.contextmanager
    def open_failing(inp, cfg, run_dir=None, *, conversations=()):
        yield FailingCluster(inp, cfg.step_s)


def test_smoke_is_invalid_when_the_backend_fails_turns(tmp_path):
    base = SMOKE + ["scheduler=collocated", "cluster=a40_4x"]
    ok = execute(compose_run(base + ["backend=fake"]), tmp_path / "fake")
    assert ok["valid"] is True, ok["invalid_reasons"]
    s = execute(compose_run(base + ["backend=failing"]), tmp_path / "failing")
    assert s["num_conversations_failed"] > 0 and s["failed_turns_by_reason"].get("injected", 0) > 0
    assert s["valid"] is False
    assert any("conversations failed (> validity.max_failed_frac=0.0)" in r for r in s["invalid_reasons"])


def test_smoke_is_invalid_when_a_conversation_is_dropped_for_the_context(tmp_path, monkeypatch):
    import harness.run.runner as runner
    convs = [conversation(f"c{i}", [(0, 200, 10, 1.0), (210, 50, 10, 0.0)]) for i in range(15)]
    convs.append(conversation("huge", [(0, 100_000, 10, 0.0)]))  # > Qwen3-0.6B's 40,960-token context
    monkeypatch.setattr(runner, "load_trace", lambda path: convs)
    s = execute(compose_run(SMOKE + ["scheduler=collocated", "cluster=a40_4x", "workload.sample=first"]), tmp_path)
    assert s["num_conversations_context_dropped"] == 1 and s["num_conversations"] == 15
    assert s["valid"] is False
    assert any("1 of 16 conversations dropped" in r and "workload.token_scale" in r for r in s["invalid_reasons"])
