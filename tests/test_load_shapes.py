"""Load shapes (harness.workload.workload arrivals; harness.core.controller's concurrency gate and duration stop).

Hand-made conversations of two turns (5 output tokens each, 1 s of tool time between them) on the fake
backend of tests/test_pipeline.py (a turn's first token ``step_s`` after it starts, the last ``5 x step_s``
after it starts, nothing queues), so one conversation lasts D = 0.05 + 1 + 0.05 = 1.1 s, and:

* a closed population of 3 agents over 10 conversations starts them in waves at 0, D, 2D, 3D
  (3 + 3 + 3 + 1), never more than 3 active;
* a duration stop at 1.12 s catches wave 2 in its first turn (1.10-1.15 s): that turn finishes, the
  conversation is stopped at 1.15 s; at 1.5 s wave 2 is in tool time and is stopped at 1.5 s; either way
  3 completed, 3 stopped, 4 never started, and no turn submitted after the stop;
* a cap of 2 over constant arrivals every 0.1 s: the third conversation waits until the first ends (1.1 s).
Arrival processes by hand: constant gaps 1 / rate; vLLM's linear / exponential ramp rule.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from harness.run.runner import execute
from harness.workload.workload import WorkloadConfig, build_workload
from tests.conftest import compose_run, conversation
from tests.test_pipeline import FakeBackendConfig  # noqa: F401  (registers backend=fake)

STEP, D = 0.01, 1.1
BASE = ["scheduler=collocated", "cluster=a40_4x", "slo=absolute", "backend=fake", f"backend.step_s={STEP}",
        "logger.progress=false", "workload.sample=first"]


def _convs(n=10):
    return [conversation(f"c{i}", [(0, 100, 5, 1.0), (105, 20, 5, 0.0)]) for i in range(n)]


def _run(tmp_path, monkeypatch, overrides, n=10):
    import harness.run.runner as runner
    monkeypatch.setattr(runner, "load_trace", lambda path: _convs(n))
    s = execute(compose_run(BASE + overrides), tmp_path)
    return s, pd.read_parquet(tmp_path / "conversations.parquet"), pd.read_parquet(tmp_path / "turns.parquet")


def max_overlap(conv: pd.DataFrame) -> int:
    """Most conversations active at once, from the table alone: +1 at each start, -1 at each end (an end
    before a start at the same instant)."""
    ev = sorted([(a, 1) for a in conv.arrival_s] + [(f, -1) for f in conv.finish_s], key=lambda e: (e[0], e[1]))
    best = cur = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def test_closed_population_starts_the_next_conversation_when_one_ends(tmp_path, monkeypatch):
    s, conv, _ = _run(tmp_path, monkeypatch, ["workload.arrival=closed", "workload.concurrency=3"])
    assert sorted(conv.arrival_s.round(9)) == pytest.approx([0, 0, 0, D, D, D, 2 * D, 2 * D, 2 * D, 3 * D])
    assert max_overlap(conv) == 3 == s["max_active_conversations"]
    assert conv.completed.all() and s["num_conversations"] == 10 and s["num_conversations_not_started"] == 0
    assert "client_wait_mean_s" not in s


@pytest.mark.parametrize(("stop", "stopped_at"), [(1.12, 1.15), (1.5, 1.5)])
def test_duration_stop_accounts_for_the_partial_conversations(tmp_path, monkeypatch, stop, stopped_at):
    s, conv, turns = _run(tmp_path, monkeypatch, ["workload.arrival=closed", "workload.concurrency=3",
                                                  f"workload.duration_s={stop}"])
    assert s["num_conversations_started"] == 6 == len(conv) and s["num_conversations_not_started"] == 4
    assert s["num_conversations_stopped"] == 3 and s["num_conversations_completed"] == 3
    stopped = conv[~conv.completed]
    assert not stopped.failed.any() and (stopped.turns_done == 1).all()
    assert stopped.finish_s.to_numpy() == pytest.approx([stopped_at] * 3)
    assert (turns.submit_s <= stop + 1e-12).all() and len(turns) == 3 * 2 + 3
    assert s["window_s"] == pytest.approx(stopped_at) and s["duration_stop_s"] == stop
    assert max_overlap(conv) <= 3 and not s["partial"]
    # the SLO counts a stopped conversation as not met (it did not complete), as a failed one
    assert s["slo_attainment"] <= 3 / 6


def test_max_concurrency_caps_an_open_arrival_process(tmp_path, monkeypatch):
    s, conv, _ = _run(tmp_path, monkeypatch, ["workload.arrival=constant", "workload.rate_per_s=10",
                                              "workload.max_concurrency=2"], n=4)
    # arrivals 0, 0.1, 0.2, 0.3; c0 ends at 1.1, c1 at 1.2 -> c2 starts at 1.1 (waited 0.9), c3 at 1.2 (0.9)
    assert conv.set_index("conversation_id").arrival_s.to_dict() == pytest.approx(
        {"c0": 0.0, "c1": 0.1, "c2": D, "c3": 0.1 + D})
    assert s["client_wait_max_s"] == pytest.approx(0.9) and s["client_wait_mean_s"] == pytest.approx(0.45)
    assert max_overlap(conv) == 2 == s["max_active_conversations"]


def test_constant_and_ramp_arrivals_by_hand():
    recs = [conversation(f"c{i}", [(0, 10, 2, 0.0)]) for i in range(3)]
    def times(**kw):
        return [t for t, _ in build_workload(recs, WorkloadConfig(sample="first", **kw))[0]]
    assert times(arrival="constant", rate_per_s=2.0) == pytest.approx([0.0, 0.5, 1.0])
    # rates 1, 2, 3 (linear from 1 to 3): gaps 0 (the first at t = 0), 1/2, 1/3
    assert times(arrival="constant", rate_per_s=3.0, ramp="linear", ramp_start_rate_per_s=1.0) == pytest.approx(
        [0.0, 0.5, 0.5 + 1 / 3])
    # rates 1, sqrt(3), 3 (exponential)
    assert times(arrival="constant", rate_per_s=3.0, ramp="exponential", ramp_start_rate_per_s=1.0) == pytest.approx(
        [0.0, 1 / math.sqrt(3), 1 / math.sqrt(3) + 1 / 3])
    # a Poisson ramp: the same draws as the seed's standard exponentials, divided by each rate
    many = [conversation(f"c{i}", [(0, 10, 2, 0.0)]) for i in range(200)]
    cfg = WorkloadConfig(sample="first", arrival="poisson", rate_per_s=4.0, ramp="linear", ramp_start_rate_per_s=1.0)
    t = np.array([x for x, _ in build_workload(many, cfg)[0]])
    z = np.random.default_rng([0, 2]).standard_exponential(200)
    rates = 1.0 + 3.0 * np.arange(200) / 199
    assert np.diff(t) == pytest.approx((z / rates)[1:])


def test_normalized_span_by_hand():
    """``normalize_span``: the seed's Poisson times scaled by one factor so the last of n is at (n - 1) / rate
    (vLLM bench's normalisation, conf/README.md): the offered rate is exact, the gaps keep their ratios."""
    many = [conversation(f"c{i}", [(0, 10, 2, 0.0)]) for i in range(200)]
    raw = np.array([x for x, _ in build_workload(many, WorkloadConfig(sample="first", rate_per_s=4.0))[0]])
    t = np.array([x for x, _ in build_workload(many, WorkloadConfig(sample="first", rate_per_s=4.0,
                                                                     normalize_span=True))[0]])
    g = np.random.default_rng([0, 2]).exponential(0.25, 200)     # the seed's draws (_STREAM_ARRIVAL = 2)
    g[0] = 0.0
    assert raw == pytest.approx(np.cumsum(g))
    assert t[0] == 0.0 and t[-1] == pytest.approx(199 / 4.0)      # (n - 1) / rate, whatever the draws
    assert t == pytest.approx(np.cumsum(g) * (199 / 4.0) / np.cumsum(g)[-1])
    with pytest.raises(ValueError, match="workload.normalize_span applies to"):
        WorkloadConfig(arrival="constant", normalize_span=True).validate()


def test_same_seed_same_conversations_whatever_the_arrival():
    recs = [conversation(f"c{i}", [(0, 10, 2, 0.0)]) for i in range(20)]
    ids = {a: [r.conversation_id for _, r in build_workload(recs, WorkloadConfig(
        arrival=a, num_conversations=8, seed=3, **({"concurrency": 2} if a == "closed" else {})))[0]]
        for a in ("poisson", "constant", "closed")}
    assert ids["poisson"] == ids["constant"] == ids["closed"]


@pytest.mark.parametrize(("kw", "needle"), [
    ({"arrival": "closed"}, "workload.arrival=closed needs workload.concurrency"),
    ({"concurrency": 4}, "workload.concurrency applies only to workload.arrival=closed"),
    ({"arrival": "closed", "concurrency": 2, "max_concurrency": 3}, "max_concurrency does not apply"),
    ({"arrival": "fixed", "ramp": "linear", "ramp_start_rate_per_s": 1.0}, "workload.ramp needs"),
    ({"ramp": "linear"}, "ramp_start_rate_per_s must be"),
    ({"duration_s": 0}, "workload.duration_s must be"),
    ({"max_concurrency": 0}, "workload.max_concurrency must be an int >= 1"),
])
def test_bad_load_shapes_name_the_key(kw, needle):
    with pytest.raises(ValueError, match=needle):
        WorkloadConfig(**kw).validate()
