"""Per-request engine-side times from vLLM's OpenTelemetry spans (a minimal OTLP/HTTP trace receiver).

vLLM 0.32 started with ``--otlp-traces-endpoint http://HOST:PORT/v1/traces`` and
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`` exports one span per finished request
(``vllm/v1/engine/output_processor.py``, ``do_tracing``) whose attributes carry, per request,
``gen_ai.request.id`` (``cmpl-<X-Request-Id>-<prompt index>`` for ``/v1/completions``) and, in s,
``gen_ai.latency.time_to_first_token`` (the same ``first_token_latency`` that vLLM's
``vllm:time_to_first_token_seconds`` histogram observes: from the front end's arrival stamp to the first
token's output), ``gen_ai.latency.e2e``, ``gen_ai.latency.time_in_queue``,
``gen_ai.latency.time_in_model_prefill`` / ``_decode`` / ``_inference``, and the token counts
``gen_ai.usage.prompt_tokens`` / ``completion_tokens``. The histograms give these only as sums over many
requests; the spans give them per request, which a client leg (client TTFT - vLLM TTFT) per request needs
(``benchmarks/client_overhead.py``) and the calibration's engine-side observations use
(``harness.tools.calibrate``): a replay with ``logger.steps`` keeps them in ``server_metrics.json`` (``spans``,
docs/metrics.md) instead of one ``/metrics`` GET per finished turn, which made vLLM's API server render its
~60 KB text on the event loop that streams the tokens (issue 20).

The values are exactly what the histograms observe (``vllm/v1/metrics/stats.py``: the same
``first_token_latency``, ``e2e_latency = iteration_timestamp - arrival_time``, ``scheduled_ts - queued_ts``,
...), so binning the spans of a run gives the run's histogram delta bucket for bucket.
"""

from __future__ import annotations

import threading
import time
import zlib
from typing import Any, Callable, Iterable, Optional

SPAN_KEYS = {"gen_ai.latency.time_to_first_token": "ttft_s", "gen_ai.latency.e2e": "e2e_s",
             "gen_ai.latency.time_in_queue": "queue_s", "gen_ai.latency.time_in_model_prefill": "prefill_s",
             "gen_ai.latency.time_in_model_decode": "decode_s",
             "gen_ai.latency.time_in_model_inference": "inference_s",
             "gen_ai.usage.prompt_tokens": "prompt_tokens", "gen_ai.usage.completion_tokens": "output_tokens"}


# The environment a launched server exports its spans with (vllm/tracing/otel.py reads the protocol;
# the OpenTelemetry SDK's resource detector the service name; its BatchSpanProcessor the delay).
# OTEL_BSP_SCHEDULE_DELAY: ms between the exporter's batches (the SDK's default 5000 ms); 1000 ms keeps the
# end-of-run wait for the last spans short. The export's cost was within the noise of a measurement on this
# machine (``benchmarks/server_observation_cost.py``: the API server's CPU time per request, tiny model, 60
# sequential requests of 128 + 32 tokens, load average 8-11, 3 rounds): 30.2 / 23.2 / 28.0 ms without spans,
# 35.2 / 21.8 / 29.2 ms with them (docs/metrics.md).
SPAN_EXPORT_DELAY_MS = 1000


def span_env(service_name: str) -> dict[str, str]:
    """The environment of a server exporting its request spans to a :class:`SpanReceiver` over
    OTLP/HTTP: protobuf protocol (vLLM's default is gRPC, which this receiver does not speak), the
    resource's ``service.name`` = ``service_name`` (the instance), batches every
    :data:`SPAN_EXPORT_DELAY_MS` ms."""
    return {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": service_name,
            "OTEL_BSP_SCHEDULE_DELAY": str(SPAN_EXPORT_DELAY_MS)}


def vllm_request_id(x_request_id: str) -> str:
    """The id vLLM 0.32 gives the engine request of a ``/v1/completions`` POST with header
    ``X-Request-Id: x_request_id`` and one prompt: ``cmpl-<x_request_id>-0``
    (``vllm/entrypoints/openai/completion/serving.py``: ``cmpl-<base id>``, then ``-<prompt index>``), the
    ``gen_ai.request.id`` of its span."""
    return f"cmpl-{x_request_id}-0"


ENGINE_TIMES = ("auto", "spans", "scrape", "off")


def engine_times_mode(backend: Any, steps: bool) -> tuple[str, str]:
    """The per-request engine-time source of a run (``backend``: a ``harness.vllm.config.VllmBackendConfig``),
    ``(mode, why)``: ``mode`` is ``spans``, ``scrape`` or
    ``off`` (``backend.engine_times`` with ``auto`` resolved); ``why`` says, for ``auto`` resolved to
    ``off``, why and what to set (logged once), else ``""``. Without ``logger.steps`` nothing is recorded:
    ``off``."""
    if not steps:
        return "off", ""
    mode = backend.engine_times
    if mode != "auto":
        return mode, ""
    if backend.launch or backend.otlp_port is not None:
        return "spans", ""
    return "off", ("backend.launch=false and no backend.otlp_port: vLLM's per-request spans cannot reach this run, so "
                   "server_metrics.json holds the run's histograms only, no per-request engine times. Start each server "
                   "with --otlp-traces-endpoint http://<this host>:PORT/v1/traces and "
                   "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf and set backend.otlp_port=PORT, or set "
                   "backend.engine_times=scrape (one /metrics GET per finished turn, which delays the server's "
                   "token streams; docs/metrics.md)")


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def spans_from_export(payload: bytes) -> dict[str, dict]:
    """Decode one OTLP ``ExportTraceServiceRequest`` (protobuf bytes): ``{gen_ai.request.id: {ttft_s, e2e_s,
    queue_s, prefill_s, decode_s, inference_s (s), prompt_tokens, output_tokens, service, start_unix_s,
    end_unix_s}}`` for every span that has a request id (other attributes are dropped; an absent one is
    absent from the row). ``service``: the resource's ``service.name`` (``OTEL_SERVICE_NAME``; the SDK's
    ``unknown_service`` when unset); ``start_unix_s`` / ``end_unix_s``: the span's start (vLLM: the
    request's arrival) and end (its finish), s since the epoch on the server's clock.

    Raises:
        google.protobuf.message.DecodeError: the bytes are not such a message.
    """
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(payload)
    out: dict[str, dict] = {}
    for rs in msg.resource_spans:
        service = next((_value(a.value) for a in rs.resource.attributes if a.key == "service.name"), None)
        for ss in rs.scope_spans:
            for span in ss.spans:
                attrs = {a.key: _value(a.value) for a in span.attributes}
                rid = attrs.get("gen_ai.request.id")
                if rid is None:
                    continue
                row = {SPAN_KEYS[k]: v for k, v in attrs.items() if k in SPAN_KEYS}
                if service is not None:
                    row["service"] = str(service)
                if span.start_time_unix_nano:
                    row["start_unix_s"] = span.start_time_unix_nano / 1e9
                if span.end_time_unix_nano:
                    row["end_unix_s"] = span.end_time_unix_nano / 1e9
                out[str(rid)] = row
    return out


# The receiver's limits (what one POST may take of the harness). vLLM's exporter (the OpenTelemetry SDK's
# BatchSpanProcessor, at most 512 spans a batch, OTEL_BSP_MAX_EXPORT_BATCH_SIZE) sends one span of ~0.5-1 KB
# per request, so a batch is < 1 MB before compression; the caps leave 4x / 16x room above that.
MAX_BODY_BYTES = 4 << 20        # bytes of body as sent (compressed or not); more: 413 without reading it
MAX_DECODED_BYTES = 16 << 20    # bytes after inflating a gzip / deflate body; more: 413, inflation stopped there
RECEIVE_TIMEOUT_S = 10.0        # s for a whole body (and each read of the request line and headers); then 408
MAX_CONCURRENT_POSTS = 2        # bodies read and decoded at once; a further POST waits up to the timeout, then 503
# So the receiver's own memory stays under MAX_CONCURRENT_POSTS x (MAX_BODY_BYTES + 2 x MAX_DECODED_BYTES) = 72 MiB
# (the decoded bytes and the parsed message), whatever is posted (tests/test_otlp_limits.py measures it).
_INFLATE_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS}


class BodyTooLarge(ValueError):
    """A body (as sent, or inflated) over the receiver's cap (answered 413)."""


class UnsupportedEncoding(ValueError):
    """A ``Content-Encoding`` the receiver does not inflate (answered 415)."""


def inflate(body: bytes, encoding: str, max_bytes: int = MAX_DECODED_BYTES, chunk: int = 1 << 16) -> "bytes | bytearray":
    """``body`` decoded by its ``Content-Encoding`` (``gzip``, of one or more members, RFC 1952; ``deflate``,
    zlib format as the OpenTelemetry exporter's ``Compression.Deflate`` sends it; ``identity`` / ``""``: as is),
    inflated ``chunk`` bytes at a time (``zlib.decompressobj``'s ``max_length``), so at most ``max_bytes`` + one
    chunk are ever held.

    Raises:
        BodyTooLarge: the inflated body exceeds ``max_bytes`` (inflation stops there).
        UnsupportedEncoding: an encoding other than these (answered 415).
        zlib.error: the bytes are not of that encoding (answered 400).
    """
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        if len(body) > max_bytes:
            raise BodyTooLarge(f"body of {len(body)} bytes over the cap of {max_bytes}")
        return body
    if enc not in _INFLATE_WBITS:
        raise UnsupportedEncoding(f"Content-Encoding {encoding!r} not supported (gzip, deflate, identity)")
    out = bytearray()
    data = body
    while data:
        d = zlib.decompressobj(_INFLATE_WBITS[enc])
        while data and not d.eof:
            out += d.decompress(data, chunk)
            data = d.unconsumed_tail
            if len(out) > max_bytes:
                raise BodyTooLarge(f"inflated body over the cap of {max_bytes} bytes")
        while not d.eof:                       # all input consumed: drain what the inflater still holds
            piece = d.decompress(b"", chunk)
            if not piece:
                raise zlib.error("truncated compressed body")
            out += piece
            if len(out) > max_bytes:
                raise BodyTooLarge(f"inflated body over the cap of {max_bytes} bytes")
        data = d.unused_data                   # gzip: the next member
        if data and enc == "deflate":
            raise zlib.error("bytes after the end of the deflate stream")
    return out


class SpanReceiver:
    """An OTLP/HTTP receiver on ``host:port`` (port 0: any free port) in a thread of its own: every POST to
    ``/v1/traces`` is decoded by :func:`spans_from_export` into ``spans`` (request id -> times). Use as a
    context manager; ``endpoint`` is what ``--otlp-traces-endpoint`` takes. A body that does not decode
    is answered 400 and counted in ``bad_posts``. ``accept(request_id)`` (settable; default: every id)
    decides which spans are kept; the others are only counted in ``other_spans`` (a server shared with
    other clients sends theirs too). Work per POST: one protobuf decode, in the receiver's thread.

    What a POST may take is bounded (``rejected`` counts the refusals by HTTP status): a ``Content-Length``
    that is missing (411), not a non-negative integer (400) or over ``max_body_bytes`` (413, the body never
    read); a body inflated past ``max_decoded_bytes`` (413, inflation stopped at the cap: :func:`inflate`);
    an encoding other than gzip / deflate / identity (415); a body not received within ``timeout_s`` s in
    all, or a request line / header read stalled that long (408); more than :data:`MAX_CONCURRENT_POSTS`
    bodies at once, waited for ``timeout_s`` s (503). Every refusal closes the connection.

    Args:
        port: TCP port (0: any free one). host: address to bind (``127.0.0.1``: this machine only).
        max_body_bytes, max_decoded_bytes: bytes (defaults :data:`MAX_BODY_BYTES`, :data:`MAX_DECODED_BYTES`).
        timeout_s: s (default :data:`RECEIVE_TIMEOUT_S`).

    Raises:
        OSError: ``host:port`` cannot be bound (e.g. in use).
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", max_body_bytes: int = MAX_BODY_BYTES,
                 max_decoded_bytes: int = MAX_DECODED_BYTES, timeout_s: float = RECEIVE_TIMEOUT_S):
        self.spans: dict[str, dict] = {}
        self.bad_posts = 0
        self.posts = 0
        self.other_spans = 0
        self.rejected: dict[int, int] = {}
        self.max_body_bytes, self.max_decoded_bytes, self.timeout_s = max_body_bytes, max_decoded_bytes, timeout_s
        self.accept: Callable[[str], bool] = lambda rid: True
        # imported here, not at the top: the module is imported with every backend's config (``harness.vllm.config``
        # re-exports ``engine_times_mode``), and ``http.server`` (~10 ms) is needed only by a receiver
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        self._cond = threading.Condition()
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT_POSTS)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            timeout = timeout_s            # each read of the request line and headers (socket timeout)

            def _answer(self, status: int, close: bool = False) -> None:
                if status != 200:
                    with owner._cond:
                        owner.rejected[status] = owner.rejected.get(status, 0) + 1
                self.send_response(status)
                if status == 200:
                    self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                if close:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()

            def _read_body(self, n: int) -> Optional[bytes]:
                """``n`` bytes of body within ``timeout_s`` s in all (a slow sender is cut off: None)."""
                deadline = time.monotonic() + owner.timeout_s
                parts, got = [], 0
                while got < n:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    self.connection.settimeout(left)
                    try:
                        piece = self.rfile.read1(min(n - got, 1 << 16))
                    except (TimeoutError, OSError):
                        return None
                    if not piece:          # the client closed early
                        return None
                    parts.append(piece)
                    got += len(piece)
                return b"".join(parts)

            def do_POST(self):  # noqa: N802 -- http.server's name
                raw = self.headers.get("Content-Length")
                if raw is None:
                    return self._answer(411, close=True)
                if not raw.strip().isdigit():      # negative, signed, fractional or not a number
                    return self._answer(400, close=True)
                n = int(raw)
                if n > owner.max_body_bytes:
                    return self._answer(413, close=True)
                if not owner._slots.acquire(timeout=owner.timeout_s):
                    return self._answer(503, close=True)
                try:
                    body = self._read_body(n)
                    if body is None:
                        return self._answer(408, close=True)
                    try:
                        body = inflate(body, self.headers.get("Content-Encoding", ""), owner.max_decoded_bytes)
                        got = spans_from_export(body)
                    except BodyTooLarge:
                        return self._answer(413, close=True)
                    except UnsupportedEncoding:
                        return self._answer(415, close=True)
                    except Exception:  # noqa: BLE001 -- answered 400 and counted, never dropped silently
                        got = None
                    del body
                finally:
                    owner._slots.release()
                if got is None:
                    with owner._cond:
                        owner.bad_posts += 1
                    return self._answer(400)
                with owner._cond:
                    owner.posts += 1
                    for rid, row in got.items():
                        if owner.accept(rid):
                            owner.spans[rid] = row
                        else:
                            owner.other_spans += 1
                    owner._cond.notify_all()
                self._answer(200)

            def log_message(self, *args):  # quiet
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host = host
        self.port = self._server.server_address[1]
        self.endpoint = f"http://{host}:{self.port}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    def get(self, request_id: str) -> Optional[dict]:
        """The span row of ``request_id`` (a copy), or None (thread-safe)."""
        with self._cond:
            row = self.spans.get(request_id)
            return dict(row) if row is not None else None

    def snapshot(self) -> dict[str, dict]:
        """A copy of every span kept so far (thread-safe)."""
        with self._cond:
            return {k: dict(v) for k, v in self.spans.items()}

    def wait_for(self, request_ids: Iterable[str], timeout_s: float) -> set[str]:
        """Block until a span of every id in ``request_ids`` arrived, or ``timeout_s`` s passed; returns the ids
        still missing (empty: all arrived). Blocking: call it from a thread (``asyncio.to_thread``)."""
        want = set(request_ids)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                missing = want - self.spans.keys()
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return missing
                self._cond.wait(left)

    def __enter__(self) -> "SpanReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread.ident is not None:   # shutdown() waits for serve_forever: only once it runs
            self._server.shutdown()
        self._server.server_close()
