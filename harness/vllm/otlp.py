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
(``benchmarks/client_overhead.py``).
"""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SPAN_KEYS = {"gen_ai.latency.time_to_first_token": "ttft_s", "gen_ai.latency.e2e": "e2e_s",
             "gen_ai.latency.time_in_queue": "queue_s", "gen_ai.latency.time_in_model_prefill": "prefill_s",
             "gen_ai.latency.time_in_model_decode": "decode_s",
             "gen_ai.latency.time_in_model_inference": "inference_s",
             "gen_ai.usage.prompt_tokens": "prompt_tokens", "gen_ai.usage.completion_tokens": "output_tokens"}


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def spans_from_export(payload: bytes) -> dict[str, dict]:
    """Decode one OTLP ``ExportTraceServiceRequest`` (protobuf bytes): ``{gen_ai.request.id: {ttft_s, e2e_s,
    queue_s, prefill_s, decode_s, inference_s (s), prompt_tokens, output_tokens}}`` for every span that has a
    request id (other attributes are dropped; an absent one is absent from the row).

    Raises:
        google.protobuf.message.DecodeError: the bytes are not such a message.
    """
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(payload)
    out: dict[str, dict] = {}
    for rs in msg.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                attrs = {a.key: _value(a.value) for a in span.attributes}
                rid = attrs.get("gen_ai.request.id")
                if rid is None:
                    continue
                out[str(rid)] = {SPAN_KEYS[k]: v for k, v in attrs.items() if k in SPAN_KEYS}
    return out


class SpanReceiver:
    """An OTLP/HTTP receiver on ``127.0.0.1:port`` (0: any free port) in a thread of its own: every POST to
    ``/v1/traces`` is decoded by :func:`spans_from_export` into ``spans`` (request id -> times). Use as a
    context manager; ``endpoint`` is what ``--otlp-traces-endpoint`` takes. A body that does not decode
    is answered 400 and counted in ``bad_posts``."""

    def __init__(self, port: int = 0):
        self.spans: dict[str, dict] = {}
        self.bad_posts = 0
        lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 -- http.server's name
                n = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(n)
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                try:
                    got = spans_from_export(body)
                except Exception:  # noqa: BLE001 -- answered 400 and counted, never dropped silently
                    with lock:
                        owner.bad_posts += 1
                    self.send_response(400)
                    self.end_headers()
                    return
                with lock:
                    owner.spans.update(got)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    def __enter__(self) -> "SpanReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
