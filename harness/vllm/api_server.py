"""``python -m harness.vllm.api_server ARGS``: vLLM's OpenAI API server, ``python -m vllm.entrypoints.openai.api_server
ARGS`` (vLLM 0.32), with its engine core process *forked* from the API server process instead of spawned.

vLLM's CPU platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` unconditionally while it checks the engine config
(``vllm/platforms/cpu.py``, ``CpuPlatform.check_and_update_config``), so on a CPU build each of the server's three
processes (API server, ``EngineCore``, its ``Worker``) starts a fresh interpreter and imports vLLM, torch and
transformers again: ~16 CPU s each, ~48-53 CPU s a start-up, nearly all imports (measured for the tiny model,
2026-12-06, ``--enforce-eager`` and an explicit KV size). Forked, the engine core inherits what the API server
imported; the worker, which runs the model, is still spawned (:func:`spawn_in_forked_children`: forked too, it
served ~4.5x slower). A start-up then costs ~38 CPU s instead of ~50 (one start-up each, side by side on the shared
2-core machine at load ~8: 38.3 against 50.2 CPU s; 37.5 against 48.1-53.5 in an earlier pair; serving 15
requests 10.9 against 10.7 CPU s; docs/vllm_cpu.md, "Serving"). Fork is vLLM's own default start method where no
platform or CUDA forbids it (``vllm/utils/system_utils.py``, ``get_mp_context``); what the CPU platform does after
its spawn line (OpenMP thread binding, ``VLLM_CPU_OMP_THREADS_BIND``) is done in the worker either way.

The launcher runs this module for ``backend.device=cpu`` where ``backend.cpu_start_method=fork`` (the default;
``harness.vllm.cluster.instance_specs``); ``spawn`` runs vLLM's module unchanged. On other platforms this module
changes nothing and runs vLLM's server as it is.
"""

from __future__ import annotations

import os
import runpy
import sys

VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
FORKED_LINE = "harness.vllm.api_server: the engine core starts with VLLM_WORKER_MULTIPROC_METHOD=fork"   # in the log


def fork_engine_processes() -> None:
    """Make vLLM's CPU platform leave ``VLLM_WORKER_MULTIPROC_METHOD=fork`` after its config check (which sets it
    to ``spawn``): wraps ``CpuPlatform.check_and_update_config`` (vLLM 0.32) so the engine core is forked
    (``get_mp_context`` reads the variable when it starts a process), prints :data:`FORKED_LINE` to stderr (the
    server's log) where it replaced another method, and registers :func:`spawn_in_forked_children` to run in
    every process this one forks (the engine core then spawns its worker). Does nothing on a vLLM without the CPU
    platform class or its method.
    """
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
    check_and_update_config._harness_fork = True
    cpu.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    os.register_at_fork(after_in_child=spawn_in_forked_children)


def spawn_in_forked_children() -> None:
    """In a process forked from the API server (the engine core): ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` again, so
    the worker it starts is spawned as vLLM's CPU platform has it. With the worker forked from the engine core the
    server served ~4.5x slower (15 requests of 512 prompt and 32 output tokens: 55.8 CPU s against 12.5 with the
    worker spawned, 2026-12-06), so only the engine core, which runs no model, is forked."""
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"


def main() -> None:
    """Run vLLM's API server module as ``python -m`` would, with :func:`fork_engine_processes` applied; the
    arguments are vLLM's (``sys.argv[1:]``)."""
    fork_engine_processes()
    runpy.run_module(VLLM_SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
