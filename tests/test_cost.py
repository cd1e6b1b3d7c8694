"""What a run costs (``harness.analysis.cost``: the ``cost_*`` keys of ``summary.json``, the cost table per
variant, a sweep's expected CPU-hours) and WAIT's named infeasible fluid plan (``fluid_plan_infeasible``).

The expected values are derived independently: CPU bounds from the kernel's own accounting and the run's wall
time, a busy loop of known CPU inside the loop, peak RSS against ``/proc/self/status``'s ``VmHWM``, events per
call from ``turns.parquet``'s rows; the cost table and the estimate by hand; feasibility from the fluid model's
conditions as docs/wait.md ("Thresholds") states them."""

from __future__ import annotations

import math
import os
import resource
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from harness.analysis.cost import JobShape, cost_table, expected_cpu_s, MODEL_CPU_S_PER_CONVERSATION, \
    MODEL_FIXED_CPU_S, DEFAULT_CPU_S_PER_CONVERSATION
from harness.analysis.validity import ValidityConfig, verdict
from harness.core.policy import InstanceHints, PolicyContext
from harness.run.config import PROJECT_ROOT
from harness.run.runner import execute
from tests.conftest import compose_run

TINY = ["workload.num_conversations=4", "workload.max_turns=3", "logger.progress=false", "slo=absolute"]
BURN_S = 0.3   # CPU s the busy loop spends inside the simulation loop


def _cpu_now() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _vm_hwm_bytes() -> int:
    """Peak RSS from /proc/self/status (``VmHWM: <n> kB``, proc(5)): a second source beside getrusage."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no VmHWM in /proc/self/status")


def test_a_runs_cost_has_its_units_and_bounds(tmp_path, monkeypatch):
    """A busy loop of BURN_S CPU inside the simulation loop shows in ``cost_loop_cpu_s``; loop <= run <=
    process CPU, and run CPU <= wall x cores; peak RSS in bytes agrees with VmHWM; events per call =
    ``sim_events`` / the rows of turns.parquet."""
    from harness.core import clock
    real_run = clock.SimClock.run

    def burning_run(self, *a, **k):
        t0 = _cpu_now()
        while _cpu_now() - t0 < BURN_S:   # the known cost, counted by the kernel
            pass
        return real_run(self, *a, **k)
    monkeypatch.setattr(clock.SimClock, "run", burning_run)
    w0 = time.perf_counter()
    s = execute(compose_run(TINY), tmp_path)
    wall = time.perf_counter() - w0
    hwm = _vm_hwm_bytes()
    assert not s["partial"]
    assert s["cost_loop_cpu_s"] >= BURN_S
    assert s["cost_loop_cpu_s"] <= s["cost_run_cpu_s"] <= s["cost_process_cpu_s"]
    assert s["cost_run_cpu_s"] <= wall * (os.cpu_count() or 1) + 0.05   # CPU s cannot outrun wall x cores
    assert s["cost_children_cpu_s"] >= 0
    assert isinstance(s["cost_peak_rss_bytes"], int)
    assert 0.9 * hwm <= s["cost_peak_rss_bytes"] <= hwm * 1.001 + 4096   # bytes (ru_maxrss is KiB on Linux)
    assert s["cost_peak_rss_bytes"] > 50 * 2 ** 20                        # numpy + pandas alone exceed 50 MiB
    calls = len(pd.read_parquet(tmp_path / "turns.parquet"))
    assert calls == 12 and s["cost_events_per_call"] == pytest.approx(s["sim_events"] / calls)


def test_the_cost_table_per_variant_by_hand():
    """wait 30 + 10 CPU s, conserve 10: 40 and 10 of 50 (80.0 % / 20.0 %), 20 and 10 per run; an older run
    without a cost is counted under runs only."""
    rows = [("wait", {"cost_run_cpu_s": 30.0, "cost_loop_cpu_s": 25.0, "cost_events_per_call": 300.0,
                      "cost_peak_rss_bytes": 300 * 2 ** 20}),
            ("conserve", {"cost_run_cpu_s": 10.0, "cost_loop_cpu_s": 4.0, "cost_events_per_call": 10.0,
                          "cost_peak_rss_bytes": 200 * 2 ** 20}),
            ("wait", {"cost_run_cpu_s": 10.0, "cost_loop_cpu_s": 5.0, "cost_events_per_call": 100.0,
                      "cost_peak_rss_bytes": 250 * 2 ** 20}),
            ("conserve", {})]
    table = cost_table(rows)
    assert "| wait | 2 | 40.0 | 80.0% | 20 | 15 | 200 | 300 |" in table
    assert "| conserve | 2 (1 with a cost) | 10.0 | 20.0% | 10 | 4 | 10 | 200 |" in table
    assert "50.0 s in all" in table
    assert cost_table([("x", {})]) == ""


def test_the_expected_cpu_of_a_sweep_by_hand():
    """Same shape and rate: the median of 4 and 6 = 5; same shape at another rate: the median over every rate
    of 4, 6, 100 = 6; an unseen shape: the stated model, fixed + c(scheduler) x conversations."""
    def prior(rate, cpu):
        return {"scheduler": "wait", "cluster": "a40_1p3d", "model": "qwen", "workload": "t.jsonl",
                "workload_rate_per_s": rate, "num_conversations": 100, "cost_run_cpu_s": cpu}
    past = [prior(0.02, 4.0), prior(0.02, 6.0), prior(0.1, 100.0)]
    same = JobShape("wait", "a40_1p3d", "qwen", "t.jsonl", 0.02, 100)
    other_rate = JobShape("wait", "a40_1p3d", "qwen", "t.jsonl", 0.05, 100)
    unseen = JobShape("conserve", "a40_1p3d", "qwen", "t.jsonl", 0.02, 200)
    unknown = JobShape("my_policy", "a40_1p3d", "qwen", "t.jsonl", 0.02, 10)
    cpu, n_prior, n_model = expected_cpu_s([same, other_rate, unseen, unknown], past)
    model = (MODEL_FIXED_CPU_S + MODEL_CPU_S_PER_CONVERSATION["conserve"] * 200
             + MODEL_FIXED_CPU_S + DEFAULT_CPU_S_PER_CONVERSATION * 10)
    assert (n_prior, n_model) == (2, 2)
    assert cpu == pytest.approx(5.0 + 6.0 + model)


# ---- WAIT's infeasible fluid plan, named ------------------------------------------------------------------
# A hand-built instance: d0 = 10 ms, d1 = 1e-6 s/token, d2 = 1e-4 s per prompt token; one prompt type of
# l = 512 prompt tokens and o = 20 output tokens (l' = 19). docs/wait.md: w = (l' + 1)(l + l'/2) = 20 x 521.5
# = 10,430 tokens, S = lambda w, P = lambda l, the model is overloaded when d1 S + d2 P = lambda (0.01043 +
# 0.0512) = 0.06163 lambda >= 1 (lambda >= 16.23 prompts/s), and out of memory when M* = d0 S / (1 - d1 S -
# d2 P) > C, or when the smallest integer thresholds n = 1 reserve M^pi = w = 10,430 tokens > C.
D0, D1, D2 = 0.010, 1e-6, 1e-4


def _ctx(rate_per_s: float, kv_tokens: int = 1_000_000) -> PolicyContext:
    k = 50
    workload = SimpleNamespace(rate_per_s=rate_per_s, mean_turns=1.0, turn_output_tokens=np.full(k, 20.0),
                               turn_prompt_tokens=np.full(k, 512.0))
    hints = InstanceHints(prefill_tokens_per_s=1e4, decode_step_s=D0, fluid_d0_s=D0, fluid_d1_s_per_token=D1,
                          fluid_d2_s_per_token=D2)
    return PolicyContext(truth=lambda c, t: None, seed=0, cluster_roles=("collocated",), workload=workload,
                         hints=(hints,), kv_capacity_tokens=(kv_tokens,))


@pytest.mark.parametrize("scheduler", ["wait", "nested_wait"])
@pytest.mark.parametrize("thresholds", ["fluid", "tl"])
def test_an_overloaded_fluid_model_is_named_and_a_feasible_one_is_not(scheduler, thresholds):
    """lambda = 10: load 0.6163 < 1, M* = 0.01 x 104,300 / 0.3837 = 2,718 tokens and M^pi(n = 1) = 10,430 <=
    C: feasible. lambda = 20: load 1.2326 >= 1: infeasible, the reason says so with that load. In either
    thresholds mode (``tl`` does not use the plan; the flag still names the regime)."""
    from harness.run.session import make_policy
    from harness.run.config import scheduler_config
    cfg = scheduler_config(scheduler, {"name": scheduler, "thresholds": thresholds})
    ok = make_policy(scheduler, cfg, _ctx(10.0)).summary()
    assert ok == {"fluid_plan_infeasible": False, "fluid_plan_infeasible_reason": ""}
    bad = make_policy(scheduler, cfg, _ctx(20.0)).summary()
    assert bad["fluid_plan_infeasible"] is True
    assert "1.2326" in bad["fluid_plan_infeasible_reason"] and "instance 0 of 1" in bad["fluid_plan_infeasible_reason"]


def test_waits_plan_out_of_memory_is_named():
    """lambda = 10 with C = 2,000 tokens: M* = 2,718 > C, so WAIT's plan is infeasible by memory; with C =
    5,000 M* fits but the smallest integer plan (n = 1, M^pi = 10,430 tokens) does not: infeasible too;
    C = 10,430 holds it exactly: feasible."""
    from harness.run.session import make_policy
    from harness.run.config import scheduler_config
    cfg = scheduler_config("wait", {"name": "wait"})
    assert "M* = 2718" in make_policy("wait", cfg, _ctx(10.0, 2000)).summary()["fluid_plan_infeasible_reason"]
    assert "M^pi = 10430" in make_policy("wait", cfg, _ctx(10.0, 5000)).summary()["fluid_plan_infeasible_reason"]
    assert not make_policy("wait", cfg, _ctx(10.0, 10430)).summary()["fluid_plan_infeasible"]


def test_the_flag_is_in_the_validity_block_and_does_not_invalidate():
    conv = pd.DataFrame({"arrival_s": np.arange(200.0), "ttfet_s": np.ones(200), "slo_met": np.ones(200, bool)})
    base = {"num_conversations": 200, "num_conversations_failed": 0}
    flagged = verdict({**base, "fluid_plan_infeasible": True}, conv, ValidityConfig())
    assert flagged["valid"] is True and flagged["validity_flags"] == ["fluid_plan_infeasible"]
    assert verdict({**base, "fluid_plan_infeasible": False}, conv, ValidityConfig())["validity_flags"] == []


def test_a_sweep_prints_its_expected_cost_first_and_marks_cost_and_flags_in_comparison_md(tmp_path):
    """Two tiny jobs (collocated, wait on the shipped trace, whose long prompts make WAIT's smallest plan
    overflow the KV cache: flagged): the expected cost is printed before the first job is launched; comparison.md
    has the cost rows, the flag row and the cost table per variant."""
    sweep = tmp_path / "sweeps" / "s"
    r = subprocess.run([sys.executable, "run.py", "-m", "scheduler=collocated,wait", *TINY,
                        f"hydra.sweep.dir={sweep}"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "expected cost:" in r.stdout and "for 2 jobs (0 from 0 prior runs" in r.stdout
    assert r.stdout.index("expected cost:") < r.stdout.index("collocated on")   # before the first job's table
    text = (sweep / "comparison.md").read_text()
    assert "| CPU, run (s) |" in text and "| peak RSS (MiB) |" in text and "| events / LLM call |" in text
    assert "| fluid plan infeasible | - | yes ⚠ |" in text   # collocated has no fluid plan: no key
    assert "## Cost per variant" in text
    assert [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| collocated |")
            or line.startswith("| wait |")] == ["collocated", "wait"]
    shares = [float(line.split("|")[4].strip().rstrip("%")) for line in text.splitlines()
              if line.startswith(("| collocated |", "| wait |"))]
    assert sum(shares) == pytest.approx(100.0, abs=0.15) and all(s > 0 for s in shares)


def test_a_config_typo_exits_2_before_anything_heavy_is_imported():
    """``workload.bogus=1``: Hydra rejects the key before any job begins; exit status 2 (bad input, as the
    harness's own config errors), the key named, and neither pandas nor pyarrow imported (``-X importtime``)."""
    r = subprocess.run([sys.executable, "-X", "importtime", "run.py", "workload.bogus=1"], cwd=PROJECT_ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "bogus" in r.stderr and "Traceback" not in r.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "hydra" in imported                                     # the probe sees imports at all
    assert not {"pandas", "pyarrow", "scipy", "matplotlib"} & imported
