"""The span receiver (harness.vllm.otlp.SpanReceiver) under abuse: a gzip bomb, a body over the cap, a
negative / missing / non-numeric ``Content-Length``, a stalled and a dripping (slowloris) body, an unknown
encoding. Each is answered with its HTTP status (RFC 9110: 400, 408, 411, 413, 415), the process's resident
memory stays within the stated bound, and valid spans posted afterwards are still received. No vLLM needed
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
    """The stated bound: a POST costs the receiver at most ``MAX_BODY_BYTES + 2 x MAX_DECODED_BYTES``
    (36 MiB); the bomb alone would cost 1 GiB. Peak RSS growth (``VmHWM`` after a reset) while the bomb and a
    body just under the cap are posted stays under that bound plus 16 MiB for the interpreter's own churn."""
    bomb = _bomb()
    assert len(bomb) < 1.1 * MiB and len(gzip.decompress(bomb[:len(bomb) // 1024])) == MiB
    bound_kib = (otlp.MAX_BODY_BYTES + 2 * otlp.MAX_DECODED_BYTES + 16 * MiB) // 1024
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
