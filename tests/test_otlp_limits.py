"""The span receiver (harness.vllm.otlp.SpanReceiver) under abuse: a gzip bomb, a body over the cap, a
negative / missing / non-numeric ``Content-Length``, a stalled and a dripping (slowloris) body, an unknown
encoding, 60 concurrent bodies at the limits. Each is answered with its HTTP status (RFC 9110: 400, 408, 411,
413, 415, 503), the process's resident memory stays within the stated bound, and valid spans posted afterwards
are still received. No vLLM needed
(opentelemetry-proto builds the spans)."""

from __future__ import annotations

import gzip
import http.client
import socket
import time
import zlib
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.proto", reason="opentelemetry-proto not installed")

from harness.vllm import otlp
from harness.vllm.otlp import SpanReceiver, inflate
from tests.test_vllm_client import _export

MiB = 1 << 20


def _status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> bool:
    """Reset this process's peak RSS (``VmHWM``): ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0,
    Documentation/filesystems/proc.rst). False where that is refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _bomb(members: int = 1024) -> bytes:
    """A gzip body of ``members`` members of 1 MiB of zeros each (RFC 1952: a gzip file is a series of
    members; ``gzip.decompress`` inflates them all): ~1 KB each, so 1024 of them are ~1 MB that inflate to
    1 GiB."""
    return gzip.compress(b"\0" * MiB, 9) * members


def _post(rx: SpanReceiver, body: bytes, headers: dict, skip_length: bool = False) -> int:
    conn = http.client.HTTPConnection(rx.host, rx.port, timeout=30)
    try:
        conn.putrequest("POST", "/v1/traces", skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        if not skip_length and "Content-Length" not in headers:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        try:
            conn.send(body)
        except (BrokenPipeError, ConnectionResetError):   # the receiver refused before reading it all
            pass
        return conn.getresponse().status
    finally:
        conn.close()


def _raw(rx: SpanReceiver, head: bytes, drip: bytes = b"", gap_s: float = 0.0) -> bytes:
    """Send ``head``, then ``drip`` one byte every ``gap_s`` s while the receiver keeps the connection
    open; return what it answered (b"" if nothing)."""
    with socket.create_connection((rx.host, rx.port), timeout=30) as s:
        s.sendall(head)
        s.settimeout(gap_s or 30)
        for b in drip:
            try:
                s.sendall(bytes([b]))
                got = s.recv(4096)           # an answer (or a close) before the body is done
                return got
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        s.settimeout(30)
        try:
            return s.recv(4096)
        except (TimeoutError, ConnectionResetError):
            return b""


def _valid(rx: SpanReceiver, rid: str) -> int:
    body = gzip.compress(_export([(rid, {"gen_ai.latency.e2e": 0.5})]))
    return _post(rx, body, {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})


def test_inflate_stops_at_the_cap_and_reads_every_member():
    one = gzip.compress(b"abc" * 1000)
    assert inflate(one + one, "gzip") == b"abc" * 2000                     # two members, as gzip.decompress
    assert inflate(zlib.compress(b"xyz" * 10), "deflate") == b"xyz" * 10    # the OTel exporter's Deflate
    assert inflate(b"plain", "") == b"plain" and inflate(b"plain", "identity") == b"plain"
    with pytest.raises(otlp.BodyTooLarge):
        inflate(gzip.compress(b"\0" * 5000), "gzip", max_bytes=4096, chunk=1024)
    assert len(inflate(gzip.compress(b"\0" * 4096), "gzip", max_bytes=4096, chunk=1000)) == 4096   # at the cap: kept
    with pytest.raises(otlp.UnsupportedEncoding):
        inflate(b"x", "br")
    with pytest.raises(zlib.error):
        inflate(gzip.compress(b"abc" * 1000)[:-30], "gzip")                  # truncated


def test_receiver_refuses_abuse_within_its_memory_bound_and_still_receives(monkeypatch):
    """The stated bound: a POST costs the receiver at most its decoder's share of ``otlp.MEMORY_BOUND_BYTES``
    (``MAX_BODY_BYTES + MAX_DECODED_BYTES`` + one span's decode + the rows' cap: 25 MiB); the bomb alone would
    cost 1 GiB. Peak RSS growth (``VmHWM`` after a reset) while the bomb and a body just under the cap are
    posted stays under that bound plus 16 MiB for the interpreter's own churn."""
    bomb = _bomb()
    assert len(bomb) < 1.1 * MiB and len(gzip.decompress(bomb[:len(bomb) // 1024])) == MiB
    bound_kib = (otlp.MEMORY_BOUND_BYTES // otlp.MAX_CONCURRENT_POSTS + 16 * MiB) // 1024
    with SpanReceiver(timeout_s=1.0) as rx:
        assert rx.host == "127.0.0.1"
        peak = _reset_peak()
        rss0 = _status_kib("VmHWM" if peak else "VmRSS")
        assert _post(rx, bomb, {"Content-Encoding": "gzip"}) == 413
        # a body over the compressed cap: refused from its length alone, never read
        over = f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: {otlp.MAX_BODY_BYTES + 1}\r\n\r\n".encode()
        assert _raw(rx, over + b"\0" * 1000).startswith(b"HTTP/1.0 413")
        grown_kib = _status_kib("VmHWM" if peak else "VmRSS") - rss0
        print(f"RSS growth while refusing the bomb: {grown_kib} KiB (bound {bound_kib} KiB; peak measured: {peak})")
        assert grown_kib < bound_kib
        # lengths: negative, missing, not a number -> 400 / 411 / 400, at once (never waiting for a body)
        assert _raw(rx, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n").startswith(b"HTTP/1.0 400")
        assert _raw(rx, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.0 411")
        assert _raw(rx, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1e3\r\n\r\n").startswith(b"HTTP/1.0 400")
        assert _post(rx, b"abc", {"Content-Encoding": "br"}) == 415
        assert _post(rx, gzip.compress(b"not protobuf at all")[:-4], {"Content-Encoding": "gzip"}) == 400
        # a stalled body (5 of 1000 bytes sent, then nothing) and a dripping one (a byte every 0.2 s: each read
        # is quick, the whole body is not): both cut off after timeout_s = 1 s in all with 408
        head = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        assert _raw(rx, head + b"12345").startswith(b"HTTP/1.0 408")
        assert _raw(rx, head, drip=b"x" * 100, gap_s=0.2).startswith(b"HTTP/1.0 408")
        # and valid spans afterwards are received
        assert _valid(rx, "cmpl-after-0") == 200
        assert rx.wait_for(["cmpl-after-0"], 5.0) == set()
    assert rx.spans["cmpl-after-0"]["e2e_s"] == 0.5
    assert rx.rejected == {413: 2, 400: 3, 411: 1, 415: 1, 408: 2}   # 400: two lengths, one bad body
    assert rx.bad_posts == 1 and rx.posts == 1



def test_the_receiver_binds_loopback_unless_servers_may_run_elsewhere():
    from types import SimpleNamespace as B

    from harness.vllm.cluster import receiver_host
    from harness.vllm.nodes import node_address
    node = node_address("node")
    assert receiver_host(B(host="loopback", launch=True, launcher="slurm")) == "127.0.0.1"
    assert receiver_host(B(host="node", launch=True, launcher="local")) == "127.0.0.1"   # local servers: loopback
    assert receiver_host(B(host="node", launch=True, launcher="ray")) == node
    assert receiver_host(B(host="node", launch=False, launcher="local")) == node          # servers of someone else's


# ---- the receiving process's memory under 60 concurrent abusive bodies (issue 50) ---------------------------

_RECEIVER = """
import json, sys
from harness.vllm.otlp import SpanReceiver
rx = SpanReceiver(timeout_s=20.0)
rx.accept = lambda rid: rid.startswith("cmpl-run-")     # as a run's receiver: its own requests only
with rx:
    print(rx.port, flush=True)
    for line in sys.stdin:
        if line.strip() == "stats":
            with rx._cond:
                print(json.dumps({"rejected": rx.rejected, "posts": rx.posts, "bad_posts": rx.bad_posts,
                                  "other_spans": rx.other_spans, "kept": sorted(rx.spans)}), flush=True)
        else:
            break
"""


def _proc_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _abusive_bodies() -> dict[str, tuple[bytes, int]]:
    """Four kinds of body, each at a limit, with the status each must get: zeros inflating to 1 KiB under
    MAX_DECODED_BYTES (not protobuf: 400); one valid span carrying an attribute of 4 KiB under that (a span
    over MAX_SPAN_BYTES: counted, 200); MAX_SPANS_PER_POST small valid spans of other clients (200);
    incompressible bytes of 1 byte under MAX_BODY_BYTES, a gzip stream cut there (400)."""
    import os

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    junk = ExportTraceServiceRequest()
    span = junk.resource_spans.add().scope_spans.add().spans.add()
    span.attributes.append(KeyValue(key="gen_ai.request.id", value=AnyValue(string_value="cmpl-run-junk-0")))
    span.attributes.append(KeyValue(key="x", value=AnyValue(string_value="y" * (otlp.MAX_DECODED_BYTES - 4096))))
    many = _export([(f"cmpl-other-{i}-0", {"gen_ai.latency.e2e": 0.5, "gen_ai.usage.prompt_tokens": 100})
                    for i in range(otlp.MAX_SPANS_PER_POST)])
    rand = gzip.compress(os.urandom(otlp.MAX_BODY_BYTES), 1)[:otlp.MAX_BODY_BYTES - 1]
    return {"zeros": (gzip.compress(b"\0" * (otlp.MAX_DECODED_BYTES - 1024), 9), 400),
            "junk": (gzip.compress(junk.SerializeToString(), 9), 200),
            "many": (gzip.compress(many, 6), 200),
            "random": (rand, 400)}


def test_the_receiving_process_stays_within_its_bound_under_60_concurrent_abusive_bodies():
    """The receiver in a process of its own, 60 clients at once (15 of each kind of :func:`_abusive_bodies`),
    each posting again after a 503 until answered otherwise (as an exporter retries). The process's peak
    RSS (``VmHWM`` after a reset) stays within ``otlp.MEMORY_BOUND_BYTES`` (the per-body limits x the decoder
    pool, 50 MiB) + 16 MiB for the interpreter's own churn above its baseline, and what stays resident
    afterwards within the bound; every body got its status and a valid span afterwards is kept. Before
    (a thread per connection): 219 MiB resident afterwards for the zeros alone, 543 MB in the issue."""
    import json
    import os
    import subprocess
    import sys
    import threading

    from harness.core.paths import PROJECT_ROOT
    bodies = _abusive_bodies()
    assert all(len(b) < otlp.MAX_BODY_BYTES for b, _ in bodies.values())
    p = subprocess.Popen([sys.executable, "-c", _RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(PROJECT_ROOT)), cwd=PROJECT_ROOT)
    try:
        port = int(p.stdout.readline())
        rx = type("Rx", (), {"host": "127.0.0.1", "port": port})
        assert _valid(rx, "cmpl-run-warm-0") == 200                # the decode path once (modules imported)
        rss0 = _proc_kib(p.pid, "VmRSS")
        Path(f"/proc/{p.pid}/clear_refs").write_text("5")           # reset its peak (VmHWM) to its RSS now
        got: dict[str, list] = {k: [] for k in bodies}

        def client(kind: str) -> None:
            body, _ = bodies[kind]
            for _ in range(2000):
                try:
                    status = _post(rx, body, {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
                except (ConnectionError, http.client.HTTPException):   # refused before the body was read
                    status = 503
                if status != 503:
                    got[kind].append(status)
                    return
                time.sleep(0.05)
        clients = [threading.Thread(target=client, args=(k,)) for k in bodies for _ in range(15)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        peak_kib, after_kib = _proc_kib(p.pid, "VmHWM") - rss0, _proc_kib(p.pid, "VmRSS") - rss0
        assert _valid(rx, "cmpl-run-after-0") == 200
        p.stdin.write("stats\n")
        p.stdin.flush()
        stats = json.loads(p.stdout.readline())
    finally:
        p.stdin.close()
        p.wait(timeout=60)
    bound_kib = otlp.MEMORY_BOUND_BYTES // 1024
    print(f"receiver RSS {rss0} KiB at rest; peak growth {peak_kib} KiB, resident afterwards +{after_kib} KiB "
          f"(bound {bound_kib} KiB + 16 MiB churn); refusals {stats['rejected']}")
    assert {k: v for k, v in got.items()} == {k: [s] * 15 for k, (_, s) in bodies.items()}
    assert stats["kept"] == ["cmpl-run-after-0", "cmpl-run-warm-0"]
    assert stats["other_spans"] == 15 * (1 + otlp.MAX_SPANS_PER_POST)    # the junk span and the others' spans
    assert stats["bad_posts"] == 30
    assert peak_kib < bound_kib + 16 * 1024
    assert after_kib < bound_kib


def test_the_export_is_read_span_by_span_as_the_whole_message_reads():
    """The wire-format walk (``otlp._span_slices``) finds every span of every resource and scope, with its
    resource's service name, as the protobuf message itself lists them (two resources, a scope with a name and
    version, a span without a request id, an unknown top-level field); garbage is a DecodeError."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from harness.vllm.otlp import spans_from_export
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(_export([("cmpl-a-0", {"gen_ai.latency.e2e": 0.5, "gen_ai.usage.prompt_tokens": 7})], "i0")
                        + _export([("cmpl-b-0", {"gen_ai.latency.time_to_first_token": 0.25}), ("cmpl-c-0", {})], "i1"))
    msg.resource_spans[1].scope_spans[0].scope.name, msg.resource_spans[1].scope_spans[0].scope.version = "vllm", "0.32"
    msg.resource_spans[1].scope_spans[0].spans.add().name = "no request id"
    payload = msg.SerializeToString() + bytes([0x98, 0x06, 0x01])   # field 99, varint 1: unknown, skipped
    t0, t1 = 1_700_000_000.0, 1_700_000_000.5
    assert spans_from_export(payload) == {
        "cmpl-a-0": {"e2e_s": 0.5, "prompt_tokens": 7, "service": "i0", "start_unix_s": t0, "end_unix_s": t1},
        "cmpl-b-0": {"ttft_s": 0.25, "service": "i1", "start_unix_s": t0, "end_unix_s": t1},
        "cmpl-c-0": {"service": "i1", "start_unix_s": t0, "end_unix_s": t1}}
    assert otlp._rows(payload, keep=lambda rid: rid != "cmpl-b-0")[1] == 1
    with pytest.raises(otlp.TooManySpans):
        otlp._rows(payload, max_spans=3)
    for bad in (b"\xff\xff not protobuf", b"\0" * 64, payload[:-5]):
        with pytest.raises(DecodeError):
            spans_from_export(bad)
