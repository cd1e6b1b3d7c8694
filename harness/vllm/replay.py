"""Drive a real-vLLM run: launch (or connect to) servers, replay conversations closed-loop through the
same controller and policies as the simulator, and return the same ``SimResult`` the runner writes.

Warm-up: ``backend.warmup_requests`` short requests per instance before t = 0, not recorded.
Failures (an instance dies, a request errors or returns the wrong token count) fail that turn and its
conversation; the run goes on and finishes. A wall-clock limit (``backend.max_run_s``) ends a run that
cannot finish; the unfinished conversations are then reported in the result's ``error``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import aiohttp

from harness.clock import AsyncioClock
from harness.config import PROJECT_ROOT, Resolved
from harness.controller import ConversationState, Controller
from harness.metrics import turn_row
from harness.sim.perf import PerfModel
from harness.trace import ConversationRecord
from harness.vllm.backend import ContextBook, Endpoint, VllmBackend
from harness.vllm.client import completion_body, stream_completion
from harness.vllm.launcher import InstanceSpec, Launcher

log = logging.getLogger(__name__)

CPU_ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}


def model_path(spec: str) -> str:
    """Resolve ``backend.model``: ``tiny`` builds (once) and returns the offline tiny model's directory."""
    if spec != "tiny":
        return spec
    path = PROJECT_ROOT / "results" / "models" / "tiny"
    if not (path / "config.json").exists():
        from harness.vllm.tiny_model import build
        log.info("building the tiny test model in %s", path)
        build(path)
    return str(path)


def vocab_size(model_dir: str) -> int:
    """The served model's vocabulary size (from its ``config.json``)."""
    return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])


def instance_specs(run: Resolved, model: str, run_dir: Path) -> list[InstanceSpec]:
    """One ``InstanceSpec`` per cluster instance: ports, CPU/GPU placement, KV connector roles."""
    b = run.cfg.backend
    specs = []
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    for i, (name, role, _hw) in enumerate(run.instances):
        args = list(b.extra_args)
        env: dict[str, str] = {}
        kv = None
        if role in ("prefiller", "decoder"):
            kv_role = "kv_producer" if role == "prefiller" else "kv_consumer"
            if b.kv_connector == "ExampleConnector":
                kv = {"kv_connector": "ExampleConnector", "kv_role": kv_role,
                      "kv_connector_extra_config": {"shared_storage_path": str(run_dir / "kv_store")}}
                if role == "prefiller":  # chunked prefill breaks ExampleConnector (VLLM_CPU.md)
                    args += ["--max-num-batched-tokens", "4096"]
            else:
                kv = {"kv_connector": "NixlConnector", "kv_role": kv_role,
                      **({"kv_buffer_device": "cpu"} if b.device == "cpu" else {})}
                env.update({"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(b.port_base + 500 + i)})
        device = None
        if b.device == "cpu":
            env.update(CPU_ENV)
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(i % ncpu)
            args += ["--kv-cache-memory-bytes", str(b.kv_cache_bytes)]
        else:
            device = str(i)
        specs.append(InstanceSpec(name, role, b.port_base + i, model, args, env, kv, device))
    return specs


async def _warmup(backend: VllmBackend, n: int) -> None:
    for e in backend.endpoints:
        for k in range(n):
            body = completion_body(backend.model, list(range(10 + k, 42 + k)), 4, True)
            res = await stream_completion(backend.session, e.url, body, timeout_s=backend.timeout_s)
            if res.error:
                raise RuntimeError(f"warm-up request to {e.name} failed: {res.error}")


async def _replay(run: Resolved, endpoints: list[Endpoint], model: str,
                  conversations: Sequence[tuple[float, ConversationRecord]], stats, on_conversation,
                  hooks: Sequence[tuple[float, Callable[[], None]]]):
    from harness.runner import SimResult, make_policy
    cfg, b = run.cfg, run.cfg.backend
    loop = asyncio.get_running_loop()
    clock = AsyncioClock(loop)
    rows: list[dict] = []
    samples: list[dict] = []
    names = [e.name for e in endpoints]
    by_id = {r.conversation_id: r for _, r in conversations}
    done = asyncio.Event()
    perf = [PerfModel(hw, cfg.model) for _, _, hw in run.instances]
    async with aiohttp.ClientSession() as session:
        contexts = ContextBook(vocab_size(model) if Path(model).is_dir() else cfg.model.vocab_size, cfg.workload.seed,
                               records=by_id.values(), shared_prefix_tokens=cfg.workload.effective_shared_prefix_tokens())
        pd_params = {"do_remote_decode": True} if b.kv_connector == "NixlConnector" else None
        backend = VllmBackend(endpoints, model, clock, session, contexts,
                              [pm.prefill_tokens_per_s() for pm in perf], [pm.idle_decode_step_s() for pm in perf],
                              pd_params, b.request_timeout_s)
        await backend.connect()
        await _warmup(backend, b.warmup_requests)

        def conv_done(c: ConversationState):
            if on_conversation:
                on_conversation(c)
            if controller.finished:
                done.set()

        controller = Controller(clock, backend, None, conversations,
                                link_bandwidth_bytes_per_s=cfg.cluster.link.bandwidth_bytes_per_s,
                                link_latency_s=cfg.cluster.link.latency_s, kv_bytes_per_token=cfg.model.kv_bytes_per_token,
                                on_turn=lambda job: rows.append(turn_row(job, names, by_id[job.conversation_id].turns[job.turn].visible)),
                                on_conversation=conv_done, log_decisions=cfg.logger.log_decisions)
        controller.policy = make_policy(run, run.scheduler_name, run.scheduler, controller, perf,
                                        [i.kv_capacity_tokens for i in backend.infos], stats)
        stop = asyncio.Event()
        preempt0 = [int(sc.get("num_preemptions_total", 0)) if sc else 0 for sc in backend.scrapes]
        clock.start()
        backend.energy.start()
        scraper = asyncio.create_task(backend.scrape_loop(b.scrape_interval_s, samples, stop))
        controller.start()
        for t, fn in hooks:
            clock.call_at(t, fn)
        t0 = time.perf_counter()
        error = ""
        try:
            await asyncio.wait_for(done.wait(), b.max_run_s)
        except asyncio.TimeoutError:
            error = f"max_run_s={b.max_run_s} reached: {len(conversations) - controller.num_done} conversations unfinished"
        wall = time.perf_counter() - t0
        end = clock.now()
        energy = backend.energy.energy_j()  # exactly the measured window
        stop.set()
        await scraper
        for task in list(backend.tasks):
            task.cancel()
        await asyncio.gather(*backend.tasks, return_exceptions=True)
        await asyncio.gather(*(backend.scrape_one(i) for i in range(len(endpoints))))
        preempt1 = [int(sc.get("num_preemptions_total", 0)) if sc else 0 for sc in backend.scrapes]
        scrape_s = sorted(backend.scrape_s)
    res = SimResult(rows, controller.convs, samples, controller.decisions, energy, 0.0, end, 0, clock.events, wall, error)
    res.extra = {"energy_reason": backend.energy.reason, "token_count_mismatches": backend.mismatches,
                 "scrape_p50_s": scrape_s[len(scrape_s) // 2] if scrape_s else math.nan,
                 "scrape_max_s": scrape_s[-1] if scrape_s else math.nan,
                 "preemptions_server": sum(b1 - b0 for b0, b1 in zip(preempt0, preempt1))}
    res.preemptions = res.extra["preemptions_server"]
    return res


def replay(run: Resolved, conversations: Sequence[tuple[float, ConversationRecord]], stats, run_dir: Path,
           on_conversation: Optional[Callable[[ConversationState], None]] = None,
           hooks: Sequence[tuple[float, Callable[[], None]]] = (), launcher_out: Optional[list] = None):
    """Replay on real vLLM servers; returns a ``harness.runner.SimResult`` (with ``extra`` measurements).

    ``hooks``: ``(t_s, fn)`` called at run time t (e.g. fault injection); ``launcher_out``: receives the
    ``Launcher`` (to kill an instance from a hook). Raises RuntimeError if servers cannot start.
    """
    b = run.cfg.backend
    model = model_path(b.model)
    if not b.launch:
        eps = [Endpoint(n, r, u.rstrip("/"), hw.name) for (n, r, hw), u in zip(run.instances, b.endpoints)]
        return asyncio.run(_replay(run, eps, model, conversations, stats, on_conversation, hooks))
    specs = instance_specs(run, model, run_dir)
    launcher = Launcher(specs, run_dir / "logs", b.startup_timeout_s)
    if launcher_out is not None:
        launcher_out.append(launcher)
    with launcher:
        log.info("servers healthy: %s", {k: round(v, 1) for k, v in launcher.startup_s.items()})
        eps = [Endpoint(s.name, s.role, s.url, hw.name, s.device) for s, (_, _, hw) in zip(specs, run.instances)]
        res = asyncio.run(_replay(run, eps, model, conversations, stats, on_conversation, hooks))
        res.extra["startup_s"] = dict(launcher.startup_s)
    return res
