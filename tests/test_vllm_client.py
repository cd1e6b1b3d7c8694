"""The real-vLLM client against a fake OpenAI-compatible server (no vLLM needed): ``/metrics`` is fetched and
parsed only in the poller's thread, never on the event loop that reads the streams; bodies are prepared
before their send time; stamps are on the run clock; the filtered parsers give what the full parse gives."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time

import aiohttp
import pytest
from aiohttp import web

from harness.run.session import session_input
from harness.core.backend import TurnJob
from harness.core.clock import AsyncioClock
from harness.core.policy import Placement
from harness.core.trace import ConversationRecord, TurnRecord
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

    def spy(url, *args):
        fetch_threads.append(threading.get_ident())
        return real_fetch(url, *args)
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
    assert rx.bad_posts == 1 and rx.posts == 1


def _export(spans: list[tuple[str, dict]], service: str = "i0") -> bytes:
    """An OTLP export as vLLM's ``do_tracing`` + the SDK build it: one resource (``service.name``), one span per
    ``(request id, {attribute: value})``, start/end times in ns."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    msg = ExportTraceServiceRequest()
    rs = msg.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value=service)))
    ss = rs.scope_spans.add()
    for rid, attrs in spans:
        span = ss.spans.add()
        span.name = "llm_request"
        span.start_time_unix_nano, span.end_time_unix_nano = 1_700_000_000_000_000_000, 1_700_000_000_500_000_000
        span.attributes.append(KeyValue(key="gen_ai.request.id", value=AnyValue(string_value=rid)))
        for k, v in attrs.items():
            val = AnyValue(int_value=v) if isinstance(v, int) else AnyValue(double_value=v)
            span.attributes.append(KeyValue(key=k, value=val))
    return msg.SerializeToString()


def test_receiver_keeps_service_times_filters_and_waits():
    import gzip
    import urllib.request

    from harness.vllm.otlp import SpanReceiver, span_env, vllm_request_id

    assert vllm_request_id("habc-c%2F1-0") == "cmpl-habc-c%2F1-0-0"
    assert span_env("collocated0")["OTEL_SERVICE_NAME"] == "collocated0"
    with SpanReceiver() as rx:
        rx.accept = lambda rid: rid.startswith("cmpl-hx-")
        missing: list = []
        waiter = threading.Thread(target=lambda: missing.append(rx.wait_for(["cmpl-hx-a-0-0"], 10.0)))
        waiter.start()
        time.sleep(0.1)
        body = gzip.compress(_export([("cmpl-hx-a-0-0", {"gen_ai.latency.e2e": 0.75}),
                                      ("cmpl-other-0", {"gen_ai.latency.e2e": 1.0})]))
        req = urllib.request.Request(rx.endpoint, data=body, method="POST",
                                     headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
        assert urllib.request.urlopen(req, timeout=5).status == 200
        waiter.join(5)
        assert missing == [set()]
        t0 = time.monotonic()
        assert rx.wait_for(["cmpl-hx-a-0-0", "cmpl-hx-b-0-0"], 0.3) == {"cmpl-hx-b-0-0"}
        assert time.monotonic() - t0 >= 0.29
    assert rx.snapshot() == {"cmpl-hx-a-0-0": {"e2e_s": 0.75, "service": "i0", "start_unix_s": 1.7e9,
                                               "end_unix_s": 1.7e9 + 0.5}}
    assert rx.other_spans == 1


class SpanningVllm(FakeVllm):
    """:class:`FakeVllm` that also serves the restricted ``/metrics/?name[]=`` text (as prometheus_client's ASGI
    app does on vLLM) and, when ``otlp`` is set, exports one span per finished request with an
    ``X-Request-Id`` (``cmpl-<id>-0``, TTFT = its own arrival-to-first-chunk time) to it."""

    def __init__(self, otlp=None):
        super().__init__()
        self.otlp = otlp
        self.full_gets = 0
        self.restricted_gets = 0
        self.sent: dict[str, float] = {}
        self.frozen: list[int] = []        # gc.get_freeze_count() as each turn arrives (one process)

    async def metrics(self, request):
        self.full_gets += 1
        return await super().metrics(request)

    async def restricted(self, request):
        self.restricted_gets += 1
        names = request.query.getall("name[]", [])
        text = _metrics_text(self.finished)
        keep = [ln for ln in text.split("\n") if any(ln.startswith(n + "{") for n in names)]
        return web.Response(text="\n".join(keep) + "\n")

    async def completions(self, request):
        t0 = time.perf_counter()
        rid = request.headers.get("X-Request-Id")
        if rid:
            self.frozen.append(gc.get_freeze_count())
        resp = await super().completions(request)
        if rid and self.otlp:
            ttft = 0.02 + 1e-4 * len(self.sent)           # distinct per request
            self.sent[f"cmpl-{rid}-0"] = ttft
            body = _export([(f"cmpl-{rid}-0", {"gen_ai.latency.time_to_first_token": ttft,
                                               "gen_ai.latency.e2e": time.perf_counter() - t0,
                                               "gen_ai.usage.completion_tokens": 3})])
            async with aiohttp.ClientSession() as s:
                await s.post(self.otlp, data=body, headers={"Content-Type": "application/x-protobuf"})
        return resp


def _serve_in_thread(fake: SpanningVllm):
    """Run ``fake`` on a loop of its own thread; returns (url, stop)."""
    ready = threading.Event()
    box: dict = {}

    def main():
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_get("/metrics", fake.metrics)
        app.router.add_get("/metrics/", fake.restricted)
        app.router.add_post("/v1/completions", fake.completions)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        box["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        box["loop"] = loop
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    th = threading.Thread(target=main, daemon=True)
    th.start()
    ready.wait(10)

    def stop():
        box["loop"].call_soon_threadsafe(box["loop"].stop)
        th.join(10)
    return box["url"], stop


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replay(url: str, out, extra=()):
    from harness.run.runner import execute
    from tests.conftest import compose_run
    run = compose_run(["backend=vllm", "backend.launch=false", f"backend.endpoints=[{url}]", "backend.model=fake",
                       "model=tiny", "cluster=cpu_1x", "scheduler=collocated", "slo=absolute", "engine.block_size=128",
                       "logger.steps=true", "logger.progress=false", "backend.warmup_requests=1",
                       "backend.scrape_interval_s=0.05", "workload=calibration_cpu", "workload.num_conversations=4",
                       "workload.prompt_types=[{input_tokens:12,output_tokens:3,weight:1.0}]",
                       "workload.arrival=poisson", "workload.rate_per_s=20", "workload.seed=3", *extra])
    execute(run, out)
    return json.loads((out / "server_metrics.json").read_text())


def test_spans_replace_the_per_turn_scrape(tmp_path):
    """``backend.engine_times`` default with ``otlp_port`` on a server that exports spans: server_metrics.json keys
    one span per completed turn by vLLM's request id, with that turn's conversation and turn; /metrics is read in
    full only before and after the run (connect, start and end histograms, the final scrape), the periodic scrape
    takes the restricted text."""
    import pandas as pd
    port = _free_port()
    fake = SpanningVllm(otlp=f"http://127.0.0.1:{port}/v1/traces")
    url, stop = _serve_in_thread(fake)
    try:
        sm = _replay(url, tmp_path, [f"backend.otlp_port={port}"])
    finally:
        stop()
    t = pd.read_parquet(tmp_path / "turns.parquet")
    assert (t.status == "ok").all() and len(t) == 4
    assert sm["format"] == 2 and sm["engine_times"] == "spans" and "per_finish" not in sm
    assert sm["spans_missing"] == []
    assert len(sm["spans"]) == 4 and set(sm["spans"]) == set(fake.sent)     # the warm-up (no id) is not kept
    for rid, row in sm["spans"].items():
        assert rid == f"cmpl-{rid[5:].rsplit('-', 1)[0]}-0" and rid.startswith("cmpl-h")
        assert rid.endswith(f"-{row['conversation_id']}-{row['turn']}-0".replace("/", "%2F"))
        assert row["ttft_s"] == pytest.approx(fake.sent[rid]) and row["service"] == "i0"
        assert row["instance"] == "collocated0" and row["part"] == "decode" and row["output_tokens"] == 3
    assert sorted((r["conversation_id"], r["turn"]) for r in sm["spans"].values()) == \
        sorted(zip(t.conversation_id, t.turn))
    # full /metrics: connect, the histograms before t = 0 and after the last turn, the final scrape -- none per turn
    assert fake.full_gets == 4, fake.full_gets
    assert fake.restricted_gets >= 2                      # connect's probe + the periodic scrapes
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["engine_times"] == "spans" and s["observe_restricted"] == 1
    # the start-up heap is frozen while the turns stream (no generation-2 pass over it), and thawed after
    assert len(fake.frozen) == 4 and min(fake.frozen) > 0 and gc.get_freeze_count() == 0


def test_a_server_without_spans_does_not_break_the_run(tmp_path, monkeypatch, caplog):
    """Spans expected (``otlp_port`` set) but the server sends none: the run completes, one warning names the
    instance, server_metrics.json lists every turn in ``spans_missing``; with ``engine_times=scrape`` the old
    per-turn GET comes back; with no port and ``launch=false`` (auto) nothing per request, said once."""
    import logging

    from harness.vllm import cluster
    monkeypatch.setattr(cluster, "SPAN_SILENCE_S", 0.2)
    monkeypatch.setattr(cluster, "SPAN_DRAIN_S", 0.5)
    fake = SpanningVllm(otlp=None)
    url, stop = _serve_in_thread(fake)
    try:
        with caplog.at_level(logging.WARNING, logger="harness.vllm.cluster"):
            sm = _replay(url, tmp_path / "a", [f"backend.otlp_port={_free_port()}"])
        warned = [r for r in caplog.records if "no vLLM span" in r.getMessage()]
        assert len(warned) == 1 and "collocated0" in warned[0].getMessage()
        assert sm["engine_times"] == "spans" and sm["spans"] == {} and len(sm["spans_missing"]) == 4
        assert "collocated0" in sm["spans_receiver"]["instances_without_spans"]
        assert "vllm:time_to_first_token_seconds" in sm["instances"]["collocated0"]   # the run's histograms stay

        fake.full_gets = 0
        sm = _replay(url, tmp_path / "b", ["backend.engine_times=scrape"])
        assert sm["engine_times"] == "scrape" and len(sm["per_finish"]) == 4 and "spans" not in sm
        assert fake.full_gets == 4 + 4                    # + one per finished turn

        caplog.clear()
        fake.full_gets = 0
        with caplog.at_level(logging.WARNING, logger="harness.vllm.cluster"):
            sm = _replay(url, tmp_path / "c")
        assert sm["engine_times"] == "off" and "spans" not in sm and "per_finish" not in sm
        assert fake.full_gets == 4
        assert len([r for r in caplog.records if "backend.otlp_port" in r.getMessage()]) == 1
    finally:
        stop()


def test_engine_times_config_is_checked():
    from harness.vllm.plugin import engine_times_mode
    from tests.conftest import compose_run
    base = ["backend=vllm", "model=tiny", "cluster=cpu_1x", "scheduler=collocated", "slo=absolute",
            "engine.block_size=128"]
    for bad, key in ((["backend.engine_times=sometimes"], "backend.engine_times"),
                     (["backend.otlp_port=80"], "backend.otlp_port"),
                     (["backend.launch=false", "backend.endpoints=[http://x:1]", "backend.engine_times=spans"],
                      "backend.otlp_port"),
                     (["backend.extra_args=[--otlp-traces-endpoint,http://x:1/v1/traces]"], "--otlp-traces-endpoint")):
        with pytest.raises(ValueError, match=key.replace("[", r"\[")):
            compose_run(base + bad)
    b = compose_run(base).backend
    assert engine_times_mode(b, steps=True) == ("spans", "")
    assert engine_times_mode(b, steps=False) == ("off", "")
    b2 = compose_run(base + ["backend.launch=false", "backend.endpoints=[http://x:1]"]).backend
    mode, why = engine_times_mode(b2, steps=True)
    assert mode == "off" and "backend.otlp_port" in why and "engine_times=scrape" in why
    b3 = compose_run(base + ["backend.launch=false", "backend.endpoints=[http://x:1]", "backend.otlp_port=4318"]).backend
    assert engine_times_mode(b3, steps=True) == ("spans", "")


def test_launched_servers_are_told_where_to_send_their_spans(tmp_path):
    from harness.vllm.cluster import instance_specs
    from tests.conftest import compose_run
    run = compose_run(["backend=vllm", "model=tiny", "cluster=cpu_1p1d", "scheduler=collocated", "slo=absolute",
                       "engine.block_size=128"])
    plain = instance_specs(session_input(run), run.backend, "m", tmp_path)
    assert all("--otlp-traces-endpoint" not in s.args and "OTEL_SERVICE_NAME" not in s.env for s in plain)
    specs = instance_specs(session_input(run), run.backend, "m", tmp_path, "http://127.0.0.1:4318/v1/traces")
    for s in specs:
        cmd = s.command()
        assert cmd[cmd.index("--otlp-traces-endpoint") + 1] == "http://127.0.0.1:4318/v1/traces"
        assert s.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"   # vLLM's default is gRPC
        assert s.env["OTEL_SERVICE_NAME"] == s.name
    assert len({s.name for s in specs}) == 2                      # one service name per instance


def test_a_taken_otlp_port_is_refused_naming_the_key(tmp_path):
    import socket

    from harness.vllm.cluster import open_cluster
    from tests.conftest import compose_run
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        sk.listen()
        port = sk.getsockname()[1]
        run = compose_run(["backend=vllm", "backend.launch=false", "backend.endpoints=[http://127.0.0.1:9]",
                           "backend.model=fake", "model=tiny", "cluster=cpu_1x", "scheduler=collocated", "slo=absolute",
                           "engine.block_size=128", "logger.steps=true", f"backend.otlp_port={port}"])
        with pytest.raises(RuntimeError, match=f"backend.otlp_port={port}"):
            with open_cluster(session_input(run), run.backend, tmp_path):
                pass
