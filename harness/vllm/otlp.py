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
~60 KB text on the event loop that streams the tokens.

The values are exactly what the histograms observe (``vllm/v1/metrics/stats.py``: the same
``first_token_latency``, ``e2e_latency = iteration_timestamp - arrival_time``, ``scheduled_ts - queued_ts``,
...), so binning the spans of a run gives the run's histogram delta bucket for bucket.
"""

from __future__ import annotations

import threading
import time
import zlib
from typing import Any, Callable, Iterable, Iterator, Optional

SPAN_KEYS = {"gen_ai.latency.time_to_first_token": "ttft_s", "gen_ai.latency.e2e": "e2e_s",
             "gen_ai.latency.time_in_queue": "queue_s", "gen_ai.latency.time_in_model_prefill": "prefill_s",
             "gen_ai.latency.time_in_model_decode": "decode_s",
             "gen_ai.latency.time_in_model_inference": "inference_s",
             "gen_ai.usage.prompt_tokens": "prompt_tokens", "gen_ai.usage.completion_tokens": "output_tokens"}


MAX_ID_CHARS = 256   # characters of a request id / service name in a span; longer: not vLLM's (not kept)
MAX_SPAN_BYTES = 64 << 10   # encoded bytes of one span (or resource); larger: not vLLM's, counted, never decoded

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


class TooManySpans(ValueError):
    """An export with more spans than the receiver takes in one POST (answered 413)."""


def _varint(buf: memoryview, i: int, end: int) -> tuple[int, int]:
    """The protobuf varint at ``buf[i:]`` (at most 10 bytes, not past ``end``) and the index after it."""
    value = shift = 0
    while True:
        if i >= end or shift > 63:
            raise _decode_error("truncated or overlong varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _decode_error(why: str) -> Exception:
    from google.protobuf.message import DecodeError
    return DecodeError(why)


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """``(field number, value start, value end)`` of every length-delimited field of the protobuf message at
    ``buf[start:end]`` (the protobuf encoding: a varint key ``number << 3 | wire type``; wire types 0
    varint, 1 fixed 64-bit, 2 length-delimited, 5 fixed 32-bit; others skipped, as unknown fields are).

    Raises:
        google.protobuf.message.DecodeError: a truncated field, field number 0, or a group (wire types 3, 4).
    """
    i = start
    while i < end:
        key, i = _varint(buf, i, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _decode_error("field number 0")
        if wire == 0:
            _, i = _varint(buf, i, end)
            continue
        if wire == 2:
            n, i = _varint(buf, i, end)
            j = i + n
        elif wire in (1, 5):
            j = i + (8 if wire == 1 else 4)
        else:
            raise _decode_error(f"wire type {wire}")
        if j > end:
            raise _decode_error("truncated field")
        if wire == 2:
            yield number, i, j
        i = j


def _span_slices(buf: memoryview) -> Iterator[tuple[Optional[tuple[int, int]], tuple[int, int]]]:
    """``(resource, span)`` byte ranges of every span of an ``ExportTraceServiceRequest`` in ``buf``, read from
    the wire format without building the message (opentelemetry-proto ``trace_service.proto`` / ``trace.proto``:
    ``resource_spans`` = 1; in each, ``resource`` = 1 and ``scope_spans`` = 2; in each of those, ``spans`` = 2).
    ``resource``: the last ``Resource`` of the span's ``ResourceSpans`` (None when there is none)."""
    for number, a, b in _fields(buf, 0, len(buf)):
        if number != 1:
            continue
        resource, scopes = None, []
        for n2, a2, b2 in _fields(buf, a, b):
            if n2 == 1:
                resource = (a2, b2)
            elif n2 == 2:
                scopes.append((a2, b2))
        for sa, sb in scopes:
            for n3, a3, b3 in _fields(buf, sa, sb):
                if n3 == 2:
                    yield resource, (a3, b3)


_MAX_VALUE_BYTES = 4 * MAX_ID_CHARS + 16   # encoded bytes of an attribute value converted at most (UTF-8: <= 4 a char)
_TOO_LONG = object()


def _rows(payload: Any, keep: Optional[Callable[[str], bool]] = None,
          max_spans: Optional[int] = None) -> tuple[dict[str, dict], int]:
    """The rows of one export (:func:`spans_from_export`) whose request id ``keep`` accepts, and the number of
    the others. The export is walked in its wire format (:func:`_span_slices`) and each span decoded alone
    (``Span``), never the whole message at once: a message of many small spans takes several times its
    encoded size once decoded (measured: 120,000 two-attribute spans, 11.8 MB encoded, about 100 MB). Only the
    attributes kept become Python objects (an attribute of megabytes of junk never does); a span (or resource)
    of more than :data:`MAX_SPAN_BYTES` encoded bytes, or a request id or a service name longer than
    :data:`MAX_ID_CHARS`, is not vLLM's: the span is counted among the others (never decoded).

    Raises:
        google.protobuf.message.DecodeError: ``payload`` is not such a message.
        TooManySpans: more than ``max_spans`` spans (counted before any span is decoded).
    """
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import Span
    buf = memoryview(payload).cast("B")
    if max_spans is not None:
        n = sum(1 for _ in _span_slices(buf))
        if n > max_spans:
            raise TooManySpans(f"{n} spans in one export, over the cap of {max_spans}")
    out: dict[str, dict] = {}
    other = 0
    services: dict[Optional[tuple[int, int]], Optional[str]] = {None: None}
    for res, (a, b) in _span_slices(buf):
        if b - a > MAX_SPAN_BYTES:      # not vLLM's (one span is ~0.5-1 KB): counted, never decoded
            other += 1
            continue
        if res not in services and res[1] - res[0] > MAX_SPAN_BYTES:
            services[res] = None
        if res not in services:
            attr = next((x.value for x in Resource.FromString(buf[res[0]:res[1]]).attributes
                         if x.key == "service.name"), None)
            name = _value(attr) if attr is not None and attr.ByteSize() <= _MAX_VALUE_BYTES else None
            services[res] = str(name) if name is not None and len(str(name)) <= MAX_ID_CHARS else None
        span = Span.FromString(buf[a:b])
        rid, row = None, {}
        for x in span.attributes:
            if x.key != "gen_ai.request.id" and x.key not in SPAN_KEYS:
                continue
            v = _value(x.value) if x.value.ByteSize() <= _MAX_VALUE_BYTES else _TOO_LONG   # never a huge str
            if x.key == "gen_ai.request.id":
                rid = v
            elif v is not _TOO_LONG:
                row[SPAN_KEYS[x.key]] = v
        if rid is None:
            continue
        rid = "" if rid is _TOO_LONG else str(rid)
        if not rid or len(rid) > MAX_ID_CHARS or (keep is not None and not keep(rid)):
            other += 1
            continue
        if services[res] is not None:
            row["service"] = services[res]
        if span.start_time_unix_nano:
            row["start_unix_s"] = span.start_time_unix_nano / 1e9
        if span.end_time_unix_nano:
            row["end_unix_s"] = span.end_time_unix_nano / 1e9
        out[rid] = row
    return out, other


def spans_from_export(payload: bytes) -> dict[str, dict]:
    """Decode one OTLP ``ExportTraceServiceRequest`` (protobuf bytes, or any bytes-like object): ``{gen_ai.request.id:
    {ttft_s, e2e_s, queue_s, prefill_s, decode_s, inference_s (s), prompt_tokens, output_tokens, service,
    start_unix_s, end_unix_s}}`` for every span of at most :data:`MAX_SPAN_BYTES` encoded bytes that has a
    request id of at most :data:`MAX_ID_CHARS` characters (other attributes are dropped; an absent one is absent
    from the row; the export is read one span at a time, :func:`_rows`). ``service``: the resource's
    ``service.name`` (``OTEL_SERVICE_NAME``; the SDK's ``unknown_service`` when unset); ``start_unix_s`` /
    ``end_unix_s``: the span's start (vLLM: the request's arrival) and end (its finish), s since the epoch on
    the server's clock.

    Raises:
        google.protobuf.message.DecodeError: the bytes are not such a message.
    """
    return _rows(payload)[0]


# The receiver's limits (what one POST may take of the harness). vLLM's exporter (the OpenTelemetry SDK's
# BatchSpanProcessor, at most 512 spans a batch, OTEL_BSP_MAX_EXPORT_BATCH_SIZE) sends one span of ~0.5-1 KB
# per request, so a batch is < 1 MB before compression; the caps leave 4x / 16x / 8x room above that.
MAX_BODY_BYTES = 4 << 20        # bytes of body as sent (compressed or not); more: 413 without reading it
MAX_DECODED_BYTES = 16 << 20    # bytes after inflating a gzip / deflate body; more: 413, inflation stopped there
MAX_SPANS_PER_POST = 4096       # spans in one export; more: 413 before any row is built
RECEIVE_TIMEOUT_S = 10.0        # s for a whole body (and each read of the request line and headers); then 408
MAX_CONCURRENT_POSTS = 2        # bodies read and decoded at once: the decoder threads, each with its buffers
CONNECTION_WORKERS = 4          # threads that read request lines and headers and answer (a fixed pool)
PENDING_CONNECTIONS = 16        # accepted connections waiting for a worker; more: 503 at once, connection closed
# Every allocation that scales with a body happens in one of the MAX_CONCURRENT_POSTS decoder threads: into two
# buffers each maps once and reuses (MAX_BODY_BYTES as sent, MAX_DECODED_BYTES inflated; their pages given back
# after each body), the decode of one span at a time (at most MAX_SPAN_BYTES encoded; a decoded span takes up to
# ~8x its encoding: 16x allowed) and the rows of at most MAX_SPANS_PER_POST spans (1 KiB each allowed). So what
# the receiver makes its process hold stays under MEMORY_BOUND_BYTES = 2 x (4 + 16 + 1 + 4) MiB = 50 MiB above
# the process's baseline, whatever and however many at once are posted, besides the spans it keeps (the run's
# own requests: ``accept``). A thread per connection (and the malloc arena each new thread may get), the whole
# export decoded at once and every attribute converted are what let 60 concurrent bodies keep 543 MB resident
# before this bound. tests/test_otlp_limits.py measures it in a process of its own.
MEMORY_BOUND_BYTES = MAX_CONCURRENT_POSTS * (MAX_BODY_BYTES + MAX_DECODED_BYTES + 16 * MAX_SPAN_BYTES
                                             + MAX_SPANS_PER_POST * 1024)
_INFLATE_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS}
_IN_CHUNK = 1 << 16             # bytes of compressed input handed to the inflater at a time


class BodyTooLarge(ValueError):
    """A body (as sent, or inflated) over the receiver's cap (answered 413)."""


class UnsupportedEncoding(ValueError):
    """A ``Content-Encoding`` the receiver does not inflate (answered 415)."""


def inflate(body: Any, encoding: str, max_bytes: int = MAX_DECODED_BYTES, chunk: int = 1 << 16,
            into: Any = None) -> Any:
    """``body`` (bytes-like) decoded by its ``Content-Encoding`` (``gzip``, of one or more members, RFC 1952;
    ``deflate``, zlib format as the OpenTelemetry exporter's ``Compression.Deflate`` sends it; ``identity`` /
    ``""``: as is), inflated ``chunk`` bytes at a time (``zlib.decompressobj``'s ``max_length``) from
    ``_IN_CHUNK`` bytes of input at a time, so at most ``max_bytes`` + one chunk are ever held and the input is
    never copied whole. ``into``: a writable buffer (``bytearray``, ``mmap``) of at least ``max_bytes`` bytes to
    inflate into (the receiver's, reused; a ``memoryview`` of its filled part is returned), else a new
    ``bytearray``.

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
    if into is not None and len(into) < max_bytes:
        raise ValueError(f"inflate: a buffer of {len(into)} bytes for up to {max_bytes}")
    out = into if into is not None else bytearray()
    size = 0

    def put(piece: bytes) -> None:
        nonlocal size
        if size + len(piece) > max_bytes:
            raise BodyTooLarge(f"inflated body over the cap of {max_bytes} bytes")
        if into is not None:
            into[size:size + len(piece)] = piece
        else:
            out.extend(piece)
        size += len(piece)

    view = memoryview(body).cast("B")
    pos, pending, d = 0, b"", None     # pending: input given to the inflater d and not consumed yet
    while True:
        if not pending:
            if pos >= len(view):
                break
            pending, pos = view[pos:pos + _IN_CHUNK], pos + _IN_CHUNK
        if d is None:
            d = zlib.decompressobj(_INFLATE_WBITS[enc])
        put(d.decompress(pending, chunk))
        pending = d.unconsumed_tail
        if d.eof:
            pending = d.unused_data           # gzip: the next member starts here
            if enc == "deflate" and (pending or pos < len(view)):
                raise zlib.error("bytes after the end of the deflate stream")
            d = None
    while d is not None and not d.eof:         # all input consumed: drain what the inflater still holds
        piece = d.decompress(b"", chunk)
        if not piece:
            raise zlib.error("truncated compressed body")
        put(piece)
    return memoryview(into)[:size] if into is not None else out


class _Job:
    """One body handed from a connection worker to a decoder: ``result`` is ``(status, rows, other spans)``."""

    def __init__(self, handler: Any, length: int, encoding: str):
        self.handler, self.length, self.encoding = handler, length, encoding
        self.state = "queued"          # -> "running" (a decoder took it) or "cancelled" (nobody did in time)
        self.result: tuple[int, dict, int] = (500, {}, 0)
        self.done = threading.Event()


class SpanReceiver:
    """An OTLP/HTTP receiver on ``host:port`` (port 0: any free port): every POST to ``/v1/traces`` is decoded
    into ``spans`` (request id -> times, :func:`spans_from_export`). Use as a context manager; ``endpoint`` is
    what ``--otlp-traces-endpoint`` takes. A body that does not decode is answered 400 and counted in
    ``bad_posts``. ``accept(request_id)`` (settable; default: every id) decides which spans are kept; the
    others are only counted in ``other_spans`` (a server shared with other clients sends theirs too).

    Threads, all started once (never one per connection): the accepting thread; :data:`CONNECTION_WORKERS`
    workers that read a request's line and headers and answer it (at most :data:`PENDING_CONNECTIONS`
    accepted connections wait for one; a further one is answered 503 at once); :data:`MAX_CONCURRENT_POSTS`
    decoders that read a body, inflate it into their own reused buffers and decode it. So what the process
    holds for the receiver stays under :data:`MEMORY_BOUND_BYTES` (50 MiB) whatever and however many at once
    are posted (besides the spans it keeps).

    What a POST may take is bounded (``rejected`` counts the refusals by HTTP status): a ``Content-Length``
    that is missing (411), not a non-negative integer (400) or over ``max_body_bytes`` (413, the body never
    read); a body inflated past ``max_decoded_bytes`` (413, inflation stopped at the cap: :func:`inflate`);
    more than :data:`MAX_SPANS_PER_POST` spans (413); an encoding other than gzip / deflate / identity (415); a
    body not received within ``timeout_s`` s in all, or a request line / header read stalled that long (408);
    a body no decoder took within ``timeout_s`` s, or a connection beyond the pending ones (503). Every
    refusal closes the connection.

    Args:
        port: TCP port (0: any free one). host: address to bind (``127.0.0.1``: this machine only).
        max_body_bytes, max_decoded_bytes: bytes (defaults :data:`MAX_BODY_BYTES`, :data:`MAX_DECODED_BYTES`).
        timeout_s: s (default :data:`RECEIVE_TIMEOUT_S`).

    Raises:
        OSError: ``host:port`` cannot be bound (e.g. in use).
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", max_body_bytes: int = MAX_BODY_BYTES,
                 max_decoded_bytes: int = MAX_DECODED_BYTES, timeout_s: float = RECEIVE_TIMEOUT_S):
        import queue
        self.spans: dict[str, dict] = {}
        self.bad_posts = 0
        self.posts = 0
        self.other_spans = 0
        self.rejected: dict[int, int] = {}
        self.max_body_bytes, self.max_decoded_bytes, self.timeout_s = max_body_bytes, max_decoded_bytes, timeout_s
        self.accept: Callable[[str], bool] = lambda rid: True
        # imported here, not at the top: the module is imported with every backend's config (``harness.vllm.config``
        # re-exports ``engine_times_mode``), and ``http.server`` (~10 ms) is needed only by a receiver
        from http.server import BaseHTTPRequestHandler, HTTPServer
        self._cond = threading.Condition()
        self._jobs: "queue.Queue[Optional[_Job]]" = queue.Queue()
        self._conns: "queue.Queue[Optional[tuple]]" = queue.Queue(PENDING_CONNECTIONS)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            timeout = timeout_s            # each read of the request line and headers (socket timeout)

            def _answer(self, status: int, close: bool = False) -> None:
                if status != 200:
                    owner._count(status)
                self.send_response(status)
                if status == 200:
                    self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                if close:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()

            def do_POST(self):  # noqa: N802 -- http.server's name
                raw = self.headers.get("Content-Length")
                if raw is None:
                    return self._answer(411, close=True)
                if not raw.strip().isdigit():      # negative, signed, fractional or not a number
                    return self._answer(400, close=True)
                n = int(raw)
                if n > owner.max_body_bytes:
                    return self._answer(413, close=True)
                job = _Job(self, n, self.headers.get("Content-Encoding", ""))
                owner._jobs.put(job)
                if not job.done.wait(owner.timeout_s):
                    with owner._cond:
                        if job.state == "queued":      # no decoder took it in time
                            job.state = "cancelled"
                    if job.state == "cancelled":
                        return self._answer(503, close=True)
                    job.done.wait()                     # a decoder has it: its own timeout bounds the wait
                status, got, other = job.result
                if status == 400:
                    with owner._cond:
                        owner.bad_posts += 1
                    return self._answer(400)
                if status != 200:
                    return self._answer(status, close=True)
                with owner._cond:
                    owner.posts += 1
                    owner.other_spans += other
                    owner.spans.update(got)
                    owner._cond.notify_all()
                self._answer(200)

            def log_message(self, *args):  # quiet
                pass

        class Server(HTTPServer):
            request_queue_size = 64        # the listen backlog: a burst of connections is queued, not reset

            def process_request(self, request, client_address):   # the accepting thread: hand over, never block
                try:
                    owner._conns.put_nowait((request, client_address))
                except queue.Full:
                    owner._count(503)
                    try:
                        request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                        b"Connection: close\r\n\r\n")
                    except OSError:
                        pass
                    self.shutdown_request(request)

        self._server = Server((host, port), Handler)
        self.host = host
        self.port = self._server.server_address[1]
        self.endpoint = f"http://{host}:{self.port}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._threads = ([threading.Thread(target=self._work, name=f"otlp-conn{i}", daemon=True)
                          for i in range(CONNECTION_WORKERS)]
                         + [threading.Thread(target=self._decode_loop, name=f"otlp-decode{i}", daemon=True)
                            for i in range(MAX_CONCURRENT_POSTS)])

    def _count(self, status: int) -> None:
        with self._cond:
            self.rejected[status] = self.rejected.get(status, 0) + 1

    def _work(self) -> None:
        """A connection worker: serve accepted connections one at a time until told to stop (None)."""
        while (item := self._conns.get()) is not None:
            request, address = item
            try:
                self._server.finish_request(request, address)
            except Exception:  # noqa: BLE001 -- as socketserver's own threads: the connection is dropped
                pass
            finally:
                self._server.shutdown_request(request)

    def _decode_loop(self) -> None:
        """A decoder: its two buffers, anonymous memory maps allocated once and reused for every body; after
        each body their pages are given back (``madvise(MADV_DONTNEED)``: they read as zeros again and are no
        longer resident), so an idle receiver holds none of them."""
        import mmap
        raw, decoded = mmap.mmap(-1, max(self.max_body_bytes, 1)), mmap.mmap(-1, max(self.max_decoded_bytes, 1))
        while (job := self._jobs.get()) is not None:
            with self._cond:
                if job.state == "cancelled":
                    continue
                job.state = "running"
            try:
                job.result = self._decode(job, raw, decoded)
            except Exception:  # noqa: BLE001 -- answered 400 and counted, never dropped silently
                job.result = (400, {}, 0)
            finally:
                job.done.set()
                for m in (raw, decoded):
                    try:
                        m.madvise(mmap.MADV_DONTNEED)
                    except (AttributeError, OSError, ValueError):   # no madvise here: the pages stay, reused
                        pass

    def _decode(self, job: _Job, raw: Any, decoded: Any) -> tuple[int, dict, int]:
        """Read ``job``'s body within ``timeout_s`` s in all (a slow sender is cut off: 408) into ``raw``,
        inflate it into ``decoded`` and decode its spans: ``(status, rows kept, other spans)``."""
        n, conn, rfile = job.length, job.handler.connection, job.handler.rfile
        view = memoryview(raw)
        deadline = time.monotonic() + self.timeout_s
        got = 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                return 408, {}, 0
            conn.settimeout(left)
            try:
                k = rfile.readinto1(view[got:n])
            except (TimeoutError, OSError):
                return 408, {}, 0
            if not k:          # the client closed early
                return 408, {}, 0
            got += k
        try:
            body = inflate(view[:n], job.encoding, self.max_decoded_bytes, into=decoded)
            rows, other = _rows(body, self.accept, MAX_SPANS_PER_POST)
        except (BodyTooLarge, TooManySpans):
            return 413, {}, 0
        except UnsupportedEncoding:
            return 415, {}, 0
        return 200, rows, other

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
        for t in self._threads:
            t.start()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread.ident is not None:   # shutdown() waits for serve_forever: only once it runs
            self._server.shutdown()
        # the connection workers first (each ends its connection within the timeout), then the decoders, so that
        # no body is handed to a decoder already gone
        for queue_, prefix in ((self._conns, "otlp-conn"), (self._jobs, "otlp-decode")):
            started = [t for t in self._threads if t.name.startswith(prefix) and t.ident is not None]
            for _ in started:
                queue_.put(None)
            for t in started:
                t.join(2 * self.timeout_s + 1.0)
        self._server.server_close()
