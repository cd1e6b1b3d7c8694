"""``python -m harness.vllm.api_server ARGS``: vLLM's OpenAI API server, ``python -m vllm.entrypoints.openai.api_server
ARGS`` (vLLM 0.32), with its engine core process, and where it can be bound as vLLM binds it its worker too,
*forked* instead of spawned.

vLLM's CPU platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` unconditionally while it checks the engine config
(``vllm/platforms/cpu.py``, ``CpuPlatform.check_and_update_config``), so on a CPU build each of the server's three
processes (API server, ``EngineCore``, its ``Worker``) starts a fresh interpreter and imports vLLM, torch and
transformers again: ~16-18 CPU s each, ~48-53 CPU s a start-up, nearly all imports (measured for the tiny model,
2026-12-06, ``--enforce-eager`` and an explicit KV size; py-spy over one start-up, 2026-12-06: 97 % of the API
server's samples and 88 % of the spawned worker's in imports). Forked, a process inherits what the API server
imported. Fork is vLLM's own default start method where no platform or CUDA forbids it
(``vllm/utils/system_utils.py``, ``get_mp_context``; vLLM forks its GPU workers from the engine core).

Where the worker is forked, its OpenMP threads must be set up by hand: vLLM 0.32 binds a CPU worker's threads only
through the environment it spawns it with (``vllm/utils/ompmultiprocessing.py``, ``OMPProcessManager.
configure_omp_envs``: ``OMP_NUM_THREADS`` and ``GOMP_CPU_AFFINITY`` or ``OMP_PLACES``), which OpenMP reads once
when it is loaded: in a forked worker it was loaded by the API server, unbound, with a thread per core, so those
variables did nothing, and the worker served ~2.4-4.5x as dear (two OpenMP threads spinning over both cores instead
of one bound to its core; 15 requests of 512 + 32 tokens, 16.7 against 7.0 CPU s, 2026-12-06). The forked worker
therefore binds itself as the environment would have (:func:`bind_forked_worker`: its CPU affinity, torch's
thread count), and serves as the spawned one does (7.0 against 7.0 CPU s for the same 15; 30 requests in 5
alternated pairs, medians 16.4 against 16.6 CPU s, within the pairs' spread). That is exact where each
worker's OpenMP binding is one CPU (``VLLM_CPU_OMP_THREADS_BIND`` naming one CPU per rank, as
``harness.vllm.cluster.instance_specs`` sets it: the worker runs one thread, on that core) and vLLM's
``--numa-bind`` (a ``numactl`` wrapper of the spawned command) is off; elsewhere the worker is spawned
(:func:`worker_start_method`).

Start-up of the tiny model, CPU s of the server's process tree (docs/vllm_cpu.md, "Start-up"): ~48-53 all spawned,
~37-38 with the engine core forked (``backend.cpu_start_method=fork_engine``), ~21 with the worker forked too
(``fork``, the default).

The launcher runs this module for ``backend.device=cpu`` where ``backend.cpu_start_method`` is ``fork`` or
``fork_engine`` (given to this module as :data:`START_METHOD_ENV`; ``harness.vllm.cluster.instance_specs``);
``spawn`` runs vLLM's module unchanged. On other platforms this module changes nothing and runs vLLM's server as
it is.
"""

from __future__ import annotations

import os
import runpy
import sys
from contextlib import contextmanager
from typing import Optional, Sequence

VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
FORKED_LINE = "harness.vllm.api_server: the engine core starts with VLLM_WORKER_MULTIPROC_METHOD=fork"   # in the log
WORKER_LINE = "harness.vllm.api_server: the worker starts with VLLM_WORKER_MULTIPROC_METHOD="            # + method, why
BOUND_LINE = "harness.vllm.api_server: forked worker bound to CPUs"                                      # + list, threads
START_METHOD_ENV = "HARNESS_CPU_START_METHOD"   # fork (engine core and worker) or fork_engine (engine core only)
START_METHODS = ("fork", "fork_engine")

_worker_method: list[str] = ["spawn"]       # the method the forked engine core starts its workers with
_worker_cpus: list[int] = []               # in the engine core, while it forks a worker: that worker's CPUs
_worker_said: list[str] = []               # the method the log was last told of (WORKER_LINE)


def worker_start_method(requested: str, omp_threads_bind: Optional[str], numa_bind: bool) -> tuple[str, str]:
    """How the forked engine core starts its workers: ``(method, why)``, ``method`` ``fork`` or ``spawn``.

    ``requested``: ``fork`` or ``fork_engine`` (:data:`START_METHOD_ENV`); ``omp_threads_bind``: vLLM's
    ``VLLM_CPU_OMP_THREADS_BIND`` (``None``/``""``: vLLM's default, ``auto``); ``numa_bind``: vLLM's
    ``--numa-bind``. ``fork`` only where ``requested`` is ``fork``, numa binding is off, and every rank's entry of
    the bind list (``|``-separated, as ``OMPProcessManager._parse_omp_threads_bind_env`` splits it) names one CPU
    (a single integer): the binding :func:`bind_forked_worker` reproduces exactly; ``auto``, ``nobind`` and
    lists or ranges of CPUs keep the spawned worker.
    """
    if requested != "fork":
        return "spawn", f"backend.cpu_start_method={requested}"
    if numa_bind:
        return "spawn", "vLLM's --numa-bind wraps the spawned worker in numactl"
    entries = (omp_threads_bind or "auto").split("|")
    if not all(e.strip().isdigit() for e in entries):
        return "spawn", (f"VLLM_CPU_OMP_THREADS_BIND={omp_threads_bind or 'auto'} does not name one CPU per worker "
                         f"(a forked worker is bound to one CPU only)")
    return "fork", f"VLLM_CPU_OMP_THREADS_BIND={omp_threads_bind}: one CPU per worker"


def fork_engine_processes(requested: str = "fork") -> None:
    """Make vLLM's CPU platform leave ``VLLM_WORKER_MULTIPROC_METHOD=fork`` after its config check (which sets it
    to ``spawn``): wraps ``CpuPlatform.check_and_update_config`` (vLLM 0.32) so the engine core is forked
    (``get_mp_context`` reads the variable when it starts a process), prints :data:`FORKED_LINE` to stderr (the
    server's log) where it replaced another method, decides how the engine core starts its worker
    (:func:`worker_start_method` for ``requested``, ``fork`` or ``fork_engine``; :data:`WORKER_LINE` in the log),
    wraps vLLM's ``OMPProcessManager.configure_omp_envs`` so a forked worker learns its CPUs
    (:func:`bind_forked_worker`), and registers :func:`in_forked_child` to run in every process this one forks.
    Does nothing on a vLLM without the CPU platform class or its method.

    Raises:
        ValueError: ``requested`` is neither ``fork`` nor ``fork_engine``.
    """
    if requested not in START_METHODS:
        raise ValueError(f"{START_METHOD_ENV} must be one of {', '.join(START_METHODS)}, got {requested!r}")
    try:
        from vllm.platforms import cpu
    except ImportError:   # a build without the CPU platform: nothing forces spawn there
        return
    check = getattr(cpu.CpuPlatform, "check_and_update_config", None)
    if check is None or getattr(check, "_harness_fork", False):
        return
    inner = check.__func__

    def check_and_update_config(cls, vllm_config):
        inner(cls, vllm_config)
        if os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") != "fork":
            print(f"{FORKED_LINE} (the CPU platform set {os.environ.get('VLLM_WORKER_MULTIPROC_METHOD')})",
                  file=sys.stderr, flush=True)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
        parallel = getattr(vllm_config, "parallel_config", None)
        method, why = worker_start_method(requested, os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
                                          bool(getattr(parallel, "numa_bind", False)))
        if method == "fork":
            _record_worker_cpus()
        if _worker_said != [method]:
            print(f"{WORKER_LINE}{method} ({why})", file=sys.stderr, flush=True)
        _worker_method[:] = _worker_said[:] = [method]
    check_and_update_config._harness_fork = True
    cpu.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    os.register_at_fork(after_in_child=in_forked_child)


def _record_worker_cpus() -> None:
    """Wrap vLLM 0.32's ``OMPProcessManager.configure_omp_envs`` (the context in which the engine core starts
    worker ``local_rank`` with its OpenMP environment) so that, inside it, :data:`_worker_cpus` holds that worker's
    CPUs (``cpu_lists[local_rank]``) for :func:`in_forked_child`. Once; a vLLM without the class leaves nothing to
    bind (the worker keeps what it inherits)."""
    try:
        from vllm.utils import ompmultiprocessing
    except ImportError:
        return
    manager = getattr(ompmultiprocessing, "OMPProcessManager", None)
    inner = getattr(manager, "configure_omp_envs", None)
    if inner is None or getattr(inner, "_harness_fork", False):
        return

    @contextmanager
    def configure_omp_envs(self, rank, local_rank):
        with inner(self, rank, local_rank):
            lists = getattr(self, "cpu_lists", None) or []
            skip = getattr(self, "skip_setup", True)
            _worker_cpus[:] = [] if skip or local_rank >= len(lists) else list(lists[local_rank])
            try:
                yield
            finally:
                _worker_cpus.clear()
    configure_omp_envs._harness_fork = True
    manager.configure_omp_envs = configure_omp_envs


def in_forked_child() -> None:
    """In every process forked from the API server or its descendants: ``VLLM_WORKER_MULTIPROC_METHOD`` set to the
    method :func:`fork_engine_processes` chose for the worker (the engine core reads it when it starts its worker);
    in a worker forked while :data:`_worker_cpus` is set (inside ``configure_omp_envs``), :func:`bind_forked_worker`
    on those CPUs (and the list cleared: processes the worker forks later keep its binding)."""
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = _worker_method[0]
    if _worker_cpus:
        cpus = list(_worker_cpus)
        _worker_cpus.clear()
        bind_forked_worker(cpus)


def bind_forked_worker(cpus: Sequence[int]) -> None:
    """What the OpenMP environment of a spawned worker does when OpenMP loads (``OMP_NUM_THREADS=len(cpus)``,
    ``GOMP_CPU_AFFINITY`` / ``OMP_PLACES`` of ``cpus``: vLLM 0.32's ``configure_omp_envs``), done at run time in a
    forked one, whose OpenMP the API server loaded: this thread (the only one after ``fork``; the threads it starts
    inherit it) bound to ``cpus`` (``sched_setaffinity``), and torch's intra-op thread count set to ``len(cpus)``
    where torch is imported (``torch.set_num_threads``, i.e. ``omp_set_num_threads``). For one CPU, the binding a
    spawned worker gets (one thread, on that core); :func:`worker_start_method` forks no other. Says so in the
    server's log (:data:`BOUND_LINE`)."""
    cpus = [int(c) for c in cpus]
    os.sched_setaffinity(0, cpus)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(len(cpus))
    threads = torch.get_num_threads() if torch is not None else "-"
    print(f"{BOUND_LINE} {cpus} (torch threads {threads})", file=sys.stderr, flush=True)


def main() -> None:
    """Run vLLM's API server module as ``python -m`` would, with :func:`fork_engine_processes` applied (for
    :data:`START_METHOD_ENV`, default ``fork``); the arguments are vLLM's (``sys.argv[1:]``).

    Raises:
        ValueError: :data:`START_METHOD_ENV` holds another value (before vLLM is imported).
    """
    fork_engine_processes(os.environ.get(START_METHOD_ENV, "fork"))
    runpy.run_module(VLLM_SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
