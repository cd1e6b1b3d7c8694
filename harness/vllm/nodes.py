"""The node side of a remote launcher: one vLLM server started on the node it runs on.

Used by the Ray launcher (inside a Ray actor placed on a node, ``harness.vllm.ray_launcher``) and by the
Slurm launcher (``python -m harness.vllm.nodes ...`` run by ``srun`` on an allocated node,
``harness.vllm.slurm_launcher``). On that node it

* binds the server to the node's own address (``backend.host=node``: the address the node's hostname
  resolves to, or the Ray node's IP) or to ``127.0.0.1`` (``backend.host=loopback``: every node on one
  machine, as in the tests), and points NIXL's side channel (``VLLM_NIXL_SIDE_CHANNEL_HOST``) at the same
  address, so KV transfer between nodes uses each node's own address;
* never touches ``CUDA_VISIBLE_DEVICES``: Slurm (``--gres=gpu:N``) or Ray (``num_gpus``) set it for the
  GPUs the instance was given; ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA number them as NVML does;
* reads NVML energy of exactly those GPUs by UUID (``harness.vllm.energy``);
* runs the server under a guard (``harness/vllm/guard.py``) in its own process group, owned by this
  process: if it dies the guard stops the server's whole tree (engine core and workers included); and
  stops the group (SIGTERM, then SIGKILL) when told to, when it is signalled, or -- the Slurm agent --
  when the harness stops renewing its lease file (a harness killed with SIGKILL leaves nothing running
  for longer than ``lease_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

from harness.vllm.energy import local_counters
from harness.vllm.launcher import GUARD, GUARD_GRACE_S, InstanceSpec, port_free


def node_address(mode: str, node_ip: Optional[str] = None) -> str:
    """The address a server on this node binds to: ``loopback`` -> ``127.0.0.1``; ``node`` -> ``node_ip``
    when given (Ray's node IP), else the address this node's hostname resolves to.

    Raises:
        ValueError: an unknown mode.
    """
    if mode == "loopback":
        return "127.0.0.1"
    if mode == "node":
        return node_ip or socket.gethostbyname(socket.gethostname())
    raise ValueError(f"backend.host must be 'loopback' or 'node', got {mode!r}")


class NodeServer:
    """One vLLM server on this node.

    Args:
        spec: the instance (``InstanceSpec`` fields as a dict); its ``host`` is replaced by ``host``.
        log_path: the server's log file (on the node; a shared filesystem brings it back).
        host: the address to bind to (:func:`node_address`).
    """

    def __init__(self, spec: dict, log_path: str, host: str):
        self.spec = InstanceSpec(**spec)
        self.spec.host = host
        if "VLLM_NIXL_SIDE_CHANNEL_PORT" in self.spec.env:
            self.spec.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = host
        self.log_path = Path(log_path)
        self.proc: Optional[subprocess.Popen] = None
        self.counters = None

    def start(self) -> dict:
        """Start the server (not waiting for health); returns where it runs: ``host``, ``port``, ``url``,
        ``pid``, ``node`` (hostname), ``cuda_visible_devices`` (as Slurm/Ray set it, unchanged),
        ``gpu_uuids``, ``energy_reason``, and the Slurm job and step ids when run by ``srun``.

        Raises:
            RuntimeError: the port is taken on this node.
        """
        s = self.spec
        if not port_free(s.port, s.host):
            raise RuntimeError(f"instance {s.name}: port {s.port} on {socket.gethostname()} ({s.host}) is in use")
        env = {**os.environ, **s.env}
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if visible:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")
        try:
            # under the guard (harness/vllm/guard.py), owned by this process (the Ray actor / Slurm agent): when it
            # dies, the server's whole tree (engine core, workers) is stopped, not just the API server
            self.proc = subprocess.Popen([sys.executable, str(GUARD), "--owner", str(os.getpid()), "--grace",
                                          str(GUARD_GRACE_S), "--", *s.command()], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        finally:
            log.close()
        self.counters = local_counters(visible)
        return {"name": s.name, "host": s.host, "port": s.port, "url": s.url, "pid": self.proc.pid,
                "node": socket.gethostname(), "cuda_visible_devices": visible, "gpu_uuids": self.counters.uuids,
                "energy_reason": self.counters.reason, "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                "slurm_step_id": os.environ.get("SLURM_STEP_ID")}

    def returncode(self) -> Optional[int]:
        """The server's exit code, None while it runs."""
        return None if self.proc is None else self.proc.poll()

    def energy(self) -> dict:
        """NVML counters of this instance's GPUs (``harness.vllm.energy.NvmlCounters.read``)."""
        return self.counters.read() if self.counters is not None else {"reason": "not started"}

    def kill(self) -> None:
        """SIGKILL the server's process group at once."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the server's process group, wait up to ``grace_s``, then SIGKILL it. Idempotent."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # the group may hold the engine core and workers even after the API server exited


def _serve_energy(server: NodeServer, host: str, port: int) -> ThreadingHTTPServer:
    """``GET /energy`` on ``host:port``: the instance's NVML counters as JSON (the harness gathers them)."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = json.dumps(server.energy() if self.path == "/energy" else {"reason": "unknown path"}).encode()
            self.send_response(200 if self.path == "/energy" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def agent_main(argv: Optional[list[str]] = None) -> int:
    """The Slurm node agent (run by ``srun``): start the server described by ``--spec``, write where it
    runs to ``--out`` (atomically), serve ``/energy`` on ``--agent-port``, and wait; stop the server and
    exit on SIGTERM/SIGINT/SIGHUP, when the server exits (its exit code), or when ``--lease`` was not
    renewed for ``--lease-s`` seconds. Returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m harness.vllm.nodes")
    ap.add_argument("--spec", required=True, help="InstanceSpec as JSON (a file)")
    ap.add_argument("--out", required=True, help="where to write the placement JSON")
    ap.add_argument("--log", required=True)
    ap.add_argument("--host-mode", default="loopback", choices=["loopback", "node"])
    ap.add_argument("--agent-port", type=int, required=True)
    ap.add_argument("--lease", default="", help="a file the harness touches while it runs")
    ap.add_argument("--lease-s", type=float, default=60.0)
    a = ap.parse_args(argv)
    host = node_address(a.host_mode)
    server = NodeServer(json.loads(Path(a.spec).read_text()), a.log, host)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    try:
        info = server.start()
        httpd = _serve_energy(server, host, a.agent_port)
        info["agent_url"] = f"http://{host}:{a.agent_port}"
        tmp = Path(a.out + ".tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, a.out)
        code = 0
        while not stop.wait(1.0):
            rc = server.returncode()
            if rc is not None:
                code = rc or 1
                break
            if a.lease:
                try:
                    age = time.time() - os.stat(a.lease).st_mtime
                except OSError:
                    age = float("inf")
                if age > a.lease_s:
                    print(f"lease {a.lease} not renewed for {age:.0f} s: stopping", file=sys.stderr)
                    break
        httpd.shutdown()
        return code
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(agent_main())
