"""The replay client: OpenAI-compatible ``/v1/completions`` with prompts as token ids (aiohttp).

One streaming function serves every case (local turns, the decode half of P/D) and one non-streaming
function the prefill half of P/D (``max_tokens = 1``, ``kv_transfer_params`` as in vLLM's P/D proxy).
Errors are returned on the result, never raised mid-run (as ``vllm bench serve`` does).

What runs on the event loop while tokens stream is kept to reading a chunk, one ``time.perf_counter()``
stamp where it arrives, and the JSON decode of that chunk (more would add to the measured TTFT): bodies can be
serialised before their send time (:func:`encode_body`, handed over as ``bytes``), and ``/metrics`` is scraped in
a thread (``harness.vllm.scrape.MetricsPoller``), never on this loop during a run.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import aiohttp


@dataclass
class CompletionResult:
    """What one request returned.

    first_token_s / finish_s: ``time.perf_counter()`` stamps of the first and last token chunk (s), taken
    when the chunk's line arrived, before it was decoded;
    itl_s: gaps between token chunks (s); chunk_s / chunk_tokens: ``time.perf_counter()`` stamp (s) and
    token count of every chunk that carried tokens (a server that falls behind sends several tokens in one
    chunk; tokens.parquet gives each of them the chunk's time); num_tokens: completion tokens reported by the server's
    ``usage`` (or counted from ``token_ids`` if no usage came); token_ids: generated ids;
    cached_tokens: ``usage.prompt_tokens_details.cached_tokens`` (prefix-cache hit), or -1 if absent;
    kv_transfer_params: from a P/D prefill response; error: '' if ok.
    """

    first_token_s: float = float("nan")
    finish_s: float = float("nan")
    itl_s: list[float] = field(default_factory=list)   # for ITL analyses; bursty on busy CPUs
    chunk_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    num_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = -1
    kv_transfer_params: Optional[dict] = None
    error: str = ""


def completion_body(model: str, prompt_ids: list[int], max_tokens: int, stream: bool,
                    kv_transfer_params: Optional[dict] = None) -> dict:
    """The JSON body: greedy, ``ignore_eos`` so exactly ``max_tokens`` tokens come back."""
    body: dict[str, Any] = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "ignore_eos": True,
                            "temperature": 0.0, "stream": stream, "return_token_ids": True}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = kv_transfer_params
    return body


def encode_body(body: dict) -> bytes:
    """A completion body as the bytes POSTed (compact JSON, UTF-8): serialise it before its send time
    (a prompt of 10k token ids takes about a millisecond) and hand the bytes to :func:`stream_completion`."""
    return json.dumps(body, separators=(",", ":")).encode()


JSON_HEADERS = {"Content-Type": "application/json"}


async def stream_completion(session: aiohttp.ClientSession, base_url: str, body: "dict | bytes",
                            on_first_token: Optional[Callable[[float], None]] = None,
                            timeout_s: float = 600.0, request_id: Optional[str] = None) -> CompletionResult:
    """POST a streaming completion and read it to the end (SSE ``data:`` lines until ``[DONE]``).

    Args:
        body: the :func:`completion_body` dict, or its :func:`encode_body` bytes (prepared earlier).
        on_first_token: called with the first token chunk's ``time.perf_counter()`` stamp (s), right
            after it was taken.
        request_id: sent as ``X-Request-Id`` (vLLM then names the request ``cmpl-<id>``, its engine
            request ``cmpl-<id>-0``, e.g. in its OpenTelemetry spans); None: vLLM draws one.
    """
    res = CompletionResult()
    last = None
    headers = dict(JSON_HEADERS)
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    data = body if isinstance(body, bytes) else encode_body(body)
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_read=min(timeout_s, 120.0))
        async with session.post(base_url + "/v1/completions", data=data, headers=headers, timeout=timeout) as r:
            if r.status != 200:
                res.error = f"HTTP {r.status}: {(await r.text())[:300]}"
                return res
            async for raw in r.content:
                now = time.perf_counter()   # where the line arrived, before anything is parsed
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):  # an error reported mid-stream ends the request
                    err = chunk["error"]
                    res.error = f"server error mid-stream: {err.get('message', err) if isinstance(err, dict) else err}"
                    break
                if chunk.get("usage"):
                    u = chunk["usage"]
                    res.num_tokens = int(u.get("completion_tokens", 0))
                    res.prompt_tokens = int(u.get("prompt_tokens", 0))
                    det = u.get("prompt_tokens_details") or {}
                    if det.get("cached_tokens") is not None:
                        res.cached_tokens = int(det["cached_tokens"])
                for ch in chunk.get("choices") or []:
                    ids = ch.get("token_ids") or []
                    if ids or ch.get("text"):
                        if last is None:
                            res.first_token_s = now
                            if on_first_token is not None:
                                on_first_token(now)
                        else:
                            res.itl_s.append(now - last)
                        last = now
                        res.token_ids.extend(ids)
                        res.chunk_s.append(now)
                        res.chunk_tokens.append(len(ids) if ids else 1)
        res.finish_s = last if last is not None else float("nan")
        if res.num_tokens == 0:
            res.num_tokens = len(res.token_ids)
    except (aiohttp.ClientError, TimeoutError, ConnectionError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


async def prefill_only(session: aiohttp.ClientSession, base_url: str, model: str, prompt_ids: list[int],
                       kv_transfer_params: Optional[dict], timeout_s: float = 600.0,
                       request_id: Optional[str] = None) -> CompletionResult:
    """The P/D prefill request: non-streaming, ``max_tokens = 1``; returns the response's
    ``kv_transfer_params`` for the decode request (``request_id``: as in :func:`stream_completion`)."""
    res = CompletionResult()
    body = encode_body(completion_body(model, prompt_ids, 1, False, kv_transfer_params))
    headers = dict(JSON_HEADERS)
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    try:
        async with session.post(base_url + "/v1/completions", data=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                res.error = f"HTTP {r.status}: {(await r.text())[:300]}"
                return res
            out = await r.json()
        res.finish_s = time.perf_counter()
        res.kv_transfer_params = out.get("kv_transfer_params")
        u = out.get("usage") or {}
        res.num_tokens = int(u.get("completion_tokens", 0))
        det = u.get("prompt_tokens_details") or {}
        if det.get("cached_tokens") is not None:
            res.cached_tokens = int(det["cached_tokens"])
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res
