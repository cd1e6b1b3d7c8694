"""A stand-in for ``python -m vllm.entrypoints.openai.api_server`` in tests/test_vllm_faults.py (run by path,
aiohttp only; started by the real launcher under the real guard): the same command line (``--model``,
``--host``, ``--port``; ``--api-key`` or ``VLLM_API_KEY`` guards ``/v1/*`` with ``Authorization: Bearer``
as vLLM's ``AuthenticationMiddleware`` does, answering 401; other flags ignored), ``GET /health``, a
vLLM-shaped ``/metrics`` (``vllm:cache_config_info``: 64 blocks of 16 tokens), and a streaming
``/v1/completions`` that sends ``max_tokens`` token chunks ``--step-s`` apart (default 0.02 s), then the
usage chunk and ``[DONE]``. Like vLLM's API server spawning ``VLLM::EngineCore``, it starts a child that
ignores SIGTERM, so the guard of a server whose API process died waits its whole grace before the SIGKILL
(the window in which a run could be called complete while its server is dead).

Each request's ``X-Request-Id`` is appended to ``<--log-dir or cwd>/requests.<port>.txt`` as it arrives."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from aiohttp import web

IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def metrics_text(finished: int, running: int) -> str:
    return "\n".join([
        "# TYPE vllm:cache_config_info gauge",
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="64"} 1.0',
        "# TYPE vllm:num_requests_running gauge", f'vllm:num_requests_running{{engine="0"}} {float(running)}',
        "# TYPE vllm:num_requests_waiting gauge", 'vllm:num_requests_waiting{engine="0"} 0.0',
        "# TYPE vllm:kv_cache_usage_perc gauge", 'vllm:kv_cache_usage_perc{engine="0"} 0.0',
        "# TYPE vllm:request_success_total counter", f'vllm:request_success_total{{engine="0"}} {float(finished)}',
    ]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--step-s", type=float, default=0.02)
    ap.add_argument("--log-dir", default=".")
    a, _ = ap.parse_known_args()
    key = a.api_key or os.environ.get("VLLM_API_KEY")
    child = subprocess.Popen([sys.executable, "-c", IGNORE_TERM])
    log = Path(a.log_dir) / f"requests.{a.port}.txt"
    state = {"finished": 0, "running": 0}

    @web.middleware
    async def auth(request, handler):
        if key and request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def health(request):
        return web.Response(text="")

    async def metrics(request):
        return web.Response(text=metrics_text(state["finished"], state["running"]))

    async def completions(request):
        body = await request.json()
        with open(log, "a") as f:
            f.write(request.headers.get("X-Request-Id", "") + "\n")
        state["running"] += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(body["max_tokens"])
        try:
            for k in range(n):
                await asyncio.sleep(a.step_s)
                chunk = {"choices": [{"text": "x", "token_ids": [100 + k % 50]}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {"choices": [], "usage": {"completion_tokens": n, "prompt_tokens": len(body["prompt"]),
                                              "prompt_tokens_details": {"cached_tokens": 0}}}
            await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        finally:
            state["running"] -= 1
        state["finished"] += 1
        return resp

    app = web.Application(middlewares=[auth])
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics/", metrics)
    app.router.add_post("/v1/completions", completions)
    try:
        web.run_app(app, host=a.host, port=a.port, print=None, handle_signals=True)
    finally:
        child.kill()


if __name__ == "__main__":
    main()
