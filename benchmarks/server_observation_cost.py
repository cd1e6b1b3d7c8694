"""What observing a vLLM server costs the server: its API-server process's CPU time per ``/metrics`` GET (the
full text and the restricted text of the periodic scrape) and per request with and without its OpenTelemetry
span export (``backend.engine_times=spans``; docs/metrics.md).

Usage::

    python benchmarks/server_observation_cost.py [--gets 100] [--requests 60] [--rounds 1] [--port 8510]
                                                 [--cpu 1] [--out DIR]

Per round, two fresh tiny-model servers (the harness's own ``instance_specs``, pinned to core ``--cpu``), one
after the other: without spans, then exporting its spans to a receiver in this process. On the first,
``--gets`` GETs of ``/metrics`` and of ``harness.vllm.scrape.OBSERVE_PATH`` (alternating blocks); on each,
``--requests`` sequential streaming requests of 128 prompt tokens and 32 output tokens (``ignore_eos``) after
5 warm-ups. The API server's CPU time (utime + stime of its process, ``/proc/<pid>/stat``, clock ticks) over
each block, divided by its GETs or requests, in ms; GET wall times (p50, min) beside. The load average is
printed with each line: on a machine with other work the CPU times are still the server's own, but
contention inflates them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.run.config import PROJECT_ROOT, register_configs, resolve  # noqa: E402
from harness.vllm.cluster import instance_specs, model_path  # noqa: E402
from harness.run.session import session_input  # noqa: E402


def _specs(run, *args):
    """``instance_specs`` of a resolved run: the typed session input and the backend's own config."""
    return instance_specs(session_input(run), run.backend, *args)

from harness.vllm.launcher import Launcher  # noqa: E402
from harness.vllm.otlp import SpanReceiver  # noqa: E402
from harness.vllm.scrape import OBSERVE_PATH  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
COMMON = ["backend=vllm", "model=tiny", "cluster=cpu_1x", "scheduler=collocated", "slo=absolute",
          "engine.block_size=128"]


def cpu_s(pid: int) -> float:
    """utime + stime of process ``pid``, s."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def api_server_pid(guard_pid: int) -> int:
    """The API server of a launched server: the child of its guard (``harness/vllm/guard.py`` runs
    ``python -m vllm.entrypoints.openai.api_server`` as its one child; the engine core and workers are the
    API server's children). Only this server's tree is looked at: other servers on the machine are not.

    Raises:
        RuntimeError: the guard has no child.
    """
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == guard_pid:
                return int(p)
    raise RuntimeError(f"no child of the guard {guard_pid}")


def spec_for(args, otlp_endpoint, work: Path):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=COMMON + [f"backend.port_base={args.port}",
                                                                f"backend.cpu_bind_offset={args.cpu}"])
    return _specs(resolve(cfg), model_path("tiny"), work, otlp_endpoint)[0]


def gets(url: str, path: str, n: int, api: int) -> dict:
    walls = []
    c0 = cpu_s(api)
    size = 0
    for _ in range(n):
        t = time.perf_counter()
        with urllib.request.urlopen(url + path, timeout=10) as r:
            size = len(r.read())
        walls.append(time.perf_counter() - t)
    c1 = cpu_s(api)
    walls.sort()
    return {"bytes": size, "cpu_ms_per_get": 1e3 * (c1 - c0) / n, "wall_p50_ms": 1e3 * walls[n // 2],
            "wall_min_ms": 1e3 * walls[0], "loadavg_1min": os.getloadavg()[0]}


def requests(url: str, model: str, n: int, api: int, tag: str) -> dict:
    def one(i: int) -> None:
        body = json.dumps({"model": model, "prompt": list(range(10 + i, 138 + i)), "max_tokens": 32,
                           "ignore_eos": True, "stream": True}).encode()
        r = urllib.request.Request(url + "/v1/completions", data=body,
                                   headers={"Content-Type": "application/json", "X-Request-Id": f"{tag}-{i}"})
        urllib.request.urlopen(r, timeout=120).read()
    for i in range(5):
        one(10_000 + i)
    time.sleep(3)
    c0 = cpu_s(api)
    for i in range(n):
        one(i)
    time.sleep(3)                      # the last span batch (exported every second) counts too
    return {"cpu_ms_per_request": 1e3 * (cpu_s(api) - c0) / n, "loadavg_1min": os.getloadavg()[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gets", type=int, default=100)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--port", type=int, default=8510, help="the server's port; the span receiver takes port + 1")
    ap.add_argument("--cpu", type=int, default=1, help="core the server is pinned to")
    ap.add_argument("--out", type=Path, default=Path("/tmp/server_observation_cost"))
    args = ap.parse_args(argv)
    for k in ("gets", "requests", "rounds"):
        if not getattr(args, k) > 0:
            ap.error(f"--{k} must be > 0")
    rows = []
    for r in range(args.rounds):
        for spans in (False, True):
            work = args.out / f"r{r}-{'spans' if spans else 'nospans'}"
            work.mkdir(parents=True, exist_ok=True)
            with SpanReceiver(args.port + 1) as rx:
                spec = spec_for(args, rx.endpoint if spans else None, work)
                with Launcher([spec], work / "logs", 600) as launcher:
                    api = api_server_pid(launcher.procs[spec.name].pid)
                    if not spans:
                        for path, name in (("/metrics", "GET /metrics (full)"), (OBSERVE_PATH, "GET OBSERVE_PATH"),
                                           ("/metrics", "GET /metrics (full)"), (OBSERVE_PATH, "GET OBSERVE_PATH")):
                            g = gets(spec.url, path, args.gets, api)
                            rows.append({"round": r, "what": name, **g})
                            print(f"round {r} {name:22s} {g['bytes']:6d} B  API-server CPU {g['cpu_ms_per_get']:6.2f} ms/GET  "
                                  f"wall p50 {g['wall_p50_ms']:6.2f} ms min {g['wall_min_ms']:6.2f} ms  "
                                  f"load {g['loadavg_1min']:.1f}", flush=True)
                    q = requests(spec.url, spec.model, args.requests, api, f"hcost{r}{int(spans)}")
                    name = "requests, spans on" if spans else "requests, spans off"
                    got = sum(k.startswith(f"cmpl-hcost{r}{int(spans)}-") for k in rx.spans)
                    rows.append({"round": r, "what": name, "spans_received": got, **q})
                    print(f"round {r} {name:22s} API-server CPU {q['cpu_ms_per_request']:6.2f} ms/request  "
                          f"spans received {got}  load {q['loadavg_1min']:.1f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "server_observation_cost.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
