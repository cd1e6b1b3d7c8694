"""The real-vLLM client against a fake OpenAI-compatible server (no vLLM needed): ``/metrics`` is fetched and
parsed only in the poller's thread, never on the event loop that reads the streams; bodies are prepared
before their send time; stamps are on the run clock; the filtered parsers give what the full parse gives."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import aiohttp
import pytest
from aiohttp import web

from harness.backend import TurnJob
from harness.clock import AsyncioClock
from harness.policy import Placement
from harness.trace import ConversationRecord, TurnRecord
from harness.vllm import scrape
from harness.vllm.backend import ContextBook, Endpoint, VllmBackend
from harness.vllm.client import completion_body, encode_body
from harness.vllm.scrape import REQUEST_HISTOGRAMS, MetricsPoller, parse_histograms, parse_metrics


def _metrics_text(finished: int) -> str:
    """A vLLM-shaped exposition text after ``finished`` requests, each with prefill 0.25 s, 5 prompt tokens."""
    lines = ['# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig',
             '# TYPE vllm:cache_config_info gauge',
             'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0',
             '# TYPE vllm:num_requests_running gauge', 'vllm:num_requests_running{engine="0"} 2.0',
             '# TYPE vllm:kv_cache_usage_perc gauge', 'vllm:kv_cache_usage_perc{engine="0"} 0.5',
             'vllm:kv_cache_usage_perc{engine="1"} 0.25']
    for name, per in (("vllm:request_prefill_time_seconds", 0.25), ("vllm:request_prompt_tokens", 5.0),
                      ("vllm:time_to_first_token_seconds", 0.5)):
        lines.append(f"# TYPE {name} histogram")
        for le in ("0.1", "1.0", "10.0", "+Inf"):
            n = finished if float(le) >= per else 0
            lines.append(f'{name}_bucket{{engine="0",le="{le}"}} {float(n)}')
        lines += [f'{name}_sum{{engine="0"}} {per * finished}', f'{name}_count{{engine="0"}} {float(finished)}']
    return "\n".join(lines) + "\n"


def test_filtered_parsers_match_by_hand():
    text = _metrics_text(4)
    s = parse_metrics(text)
    assert s.get("num_requests_running") == 2.0
    assert s.get("kv_cache_usage_perc") == pytest.approx(0.375)       # a fraction: averaged over engines
    assert s.get("request_prefill_time_seconds_sum") == pytest.approx(1.0)
    h = parse_histograms(text, ("vllm:request_prefill_time_seconds", "vllm:request_prompt_tokens"))
    assert set(h) == {"vllm:request_prefill_time_seconds", "vllm:request_prompt_tokens"}
    p = h["vllm:request_prefill_time_seconds"]
    assert p["le"] == [0.1, 1.0, 10.0, float("inf")] and p["cumulative"] == [0.0, 4.0, 4.0, 4.0]
    assert (p["sum"], p["count"]) == (pytest.approx(1.0), 4.0)
    assert h["vllm:request_prompt_tokens"]["cumulative"] == [0.0, 0.0, 4.0, 4.0]


class FakeVllm:
    """``/metrics`` (request count = finished completions) and a streaming ``/v1/completions`` that sends
    ``max_tokens`` token chunks 20 ms apart, then a usage chunk."""

    def __init__(self):
        self.finished = 0
        self.bodies: list[bytes] = []
        self.request_ids: list[str] = []
        self.metrics_threads: list[str] = []

    async def metrics(self, request):
        return web.Response(text=_metrics_text(self.finished))

    async def completions(self, request):
        raw = await request.read()
        self.bodies.append(raw)
        self.request_ids.append(request.headers.get("X-Request-Id", ""))
        body = json.loads(raw)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = body["max_tokens"]
        for k in range(n):
            await asyncio.sleep(0.02)
            chunk = {"choices": [{"text": "x", "token_ids": [100 + k]}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.finished += 1
        usage = {"choices": [], "usage": {"completion_tokens": n, "prompt_tokens": len(body["prompt"]),
                                          "prompt_tokens_details": {"cached_tokens": 0}}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return resp


def test_backend_streams_while_the_poller_scrapes_in_its_thread(monkeypatch):
    fetch_threads: list[int] = []
    real_fetch = scrape.fetch_metrics

    def spy(url, timeout_s=10.0):
        fetch_threads.append(threading.get_ident())
        return real_fetch(url, timeout_s)
    monkeypatch.setattr(scrape, "fetch_metrics", spy)

    rec = ConversationRecord("conv/1", (TurnRecord(12, 0, 3, 0.05, True, 3), TurnRecord(4, 14, 2, 0.0, True, 2)),
                             "test")
    fake = FakeVllm()

    async def main():
        app = web.Application()
        app.router.add_get("/metrics", fake.metrics)
        app.router.add_post("/v1/completions", fake.completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        loop = asyncio.get_running_loop()
        errors: list[BaseException] = []
        clock = AsyncioClock(loop, errors.append)
        async with aiohttp.ClientSession() as session:
            backend = VllmBackend([Endpoint("i0", "mixed", url)], "m", clock, session,
                                  ContextBook(1000, seed=1, records=[rec]), on_error=errors.append)
            await backend.connect()
            assert backend.infos[0].kv_capacity_tokens == 1600                      # 100 blocks x 16
            assert backend.prepare_first_turns() == 1
            prepared_turn0 = backend._prepared[("conv/1", 0)][2]
            ticks: list[float] = []
            poller = MetricsPoller([url], ["i0"], clock.now, 0.05,
                                   on_scrape=lambda i, sc, d: backend.scrapes.__setitem__(i, sc),
                                   on_round=lambda: loop.call_soon_threadsafe(ticks.append, clock.now()))
            backend.poller, backend.finish_scrapes = poller, poller.finish_records
            clock.start()
            poller.start()
            done: list[TurnJob] = []
            finished = asyncio.Event()

            def job(turn: int) -> TurnJob:
                t = rec.turns[turn]
                return TurnJob("conv/1", turn, t.prompt_tokens, t.output_tokens, (0, 14), Placement(0, 0),
                               lambda j: None, lambda j: (done.append(j), finished.set()),
                               lambda j, why: errors.append(RuntimeError(why)))
            backend.start_turn(job(0))
            await finished.wait()
            finished.clear()
            assert ("conv/1", 1) in backend._prepared          # turn 1 prepared at turn 0's finish
            prepared_turn1 = backend._prepared[("conv/1", 1)][2]
            await asyncio.sleep(0.1)
            backend.start_turn(job(1))
            await finished.wait()
            await asyncio.to_thread(poller.stop, 5.0)
        await runner.cleanup()
        return errors, done, ticks, prepared_turn0, prepared_turn1, list(poller.finish_records)

    errors, done, ticks, prep0, prep1, finish = asyncio.run(main())
    assert errors == []
    # the bodies sent are exactly the ones prepared ahead, and turn 1's prompt is turn 0's context's first
    # 14 ids (12 prompt ids + 2 of the 3 generated 100, 101, 102) + 4 new ones
    assert fake.bodies == [prep0, prep1]
    p0, p1 = (json.loads(b)["prompt"] for b in fake.bodies)
    assert len(p0) == 12 and len(p1) == 18 and p1[:14] == p0 + [100, 101]
    assert fake.bodies[1] == encode_body(completion_body("m", p1, 2, True))
    assert [r.split("-", 1)[1] for r in fake.request_ids] == ["conv%2F1-0", "conv%2F1-1"]
    # stamps: first token after the send, at least 20 ms per token chunk, E2E ends at the last token chunk
    for j in done:
        assert j.start_s < j.first_token_s < j.finish_s
        assert j.token_s[0] == j.first_token_s and j.token_s[-1] == j.finish_s
        assert j.finish_s - j.first_token_s >= 0.02 * (j.output_tokens - 1) - 1e-3
    # every /metrics GET of the run came from the poller's thread, none from the loop's (main) thread
    main_thread = threading.main_thread().ident
    assert fetch_threads and main_thread not in fetch_threads
    assert len(ticks) >= 2
    # one finish record per finished turn, with the server's request count at its GET (1, then 2)
    assert [r["vllm:request_prefill_time_seconds"][1] for r in finish] == [1.0, 2.0]


def test_poller_finish_records_and_drain():
    """Finish GETs asked for before ``stop`` are all served; their counts are the server's at the GET."""
    fake = FakeVllm()

    async def main():
        app = web.Application()
        app.router.add_get("/metrics", fake.metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        t0 = time.perf_counter()
        poller = MetricsPoller([url], ["i0"], lambda: time.perf_counter() - t0, None).start()
        for k in range(3):
            fake.finished = k + 1
            poller.finish(0)
            await asyncio.sleep(0.2)      # the loop keeps serving while the thread GETs
        await asyncio.to_thread(poller.stop, 5.0)
        await runner.cleanup()
        return poller

    poller = asyncio.run(main())
    assert poller.failures == []
    counts = [r["vllm:request_prefill_time_seconds"] for r in poller.finish_records]
    assert counts == [[0.25, 1.0], [0.5, 2.0], [0.75, 3.0]]
    assert set(REQUEST_HISTOGRAMS) >= {k for k in poller.finish_records[0] if k.startswith("vllm:")}
    assert all(r["t_s"] <= r["t_end_s"] for r in poller.finish_records)


def test_otlp_receiver_decodes_vllm_request_spans():
    """A span built as vLLM's ``do_tracing`` builds it, exported over OTLP/HTTP, comes back per request id."""
    import urllib.request

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    from harness.vllm.otlp import SpanReceiver

    msg = ExportTraceServiceRequest()
    span = msg.resource_spans.add().scope_spans.add().spans.add()
    span.name = "llm_request"
    for k, v in (("gen_ai.request.id", AnyValue(string_value="cmpl-bench0-3-0")),
                 ("gen_ai.latency.time_to_first_token", AnyValue(double_value=0.0125)),
                 ("gen_ai.usage.prompt_tokens", AnyValue(int_value=128)),
                 ("gen_ai.request.top_p", AnyValue(double_value=1.0))):
        span.attributes.append(KeyValue(key=k, value=v))
    msg.resource_spans[0].scope_spans[0].spans.add().name = "no id"
    with SpanReceiver() as rx:
        req = urllib.request.Request(rx.endpoint, data=msg.SerializeToString(), method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
        assert urllib.request.urlopen(req, timeout=5).status == 200
        bad = urllib.request.Request(rx.endpoint, data=b"\xff\xff not protobuf", method="POST")
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(bad, timeout=5)
    assert rx.spans == {"cmpl-bench0-3-0": {"ttft_s": 0.0125, "prompt_tokens": 128}}
    assert rx.bad_posts == 1
