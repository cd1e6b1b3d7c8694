"""The declared step-model interface (``harness.sim.step_model.StepModel``) and the step models by name
(``harness.core.registry.register_step_model``): a new step model is one subclass with ``step`` and a
registration; the engine runs it through the base's defaults; ``engine.step_model`` validates against the
registry."""

from __future__ import annotations

import pytest

from harness.core.clock import SimClock
from harness.core.profiles import EngineConfig
from harness.core.registry import _STEP_MODELS, make_step_model, register_step_model, step_models
from harness.sim.engine import Engine, Request
from harness.sim.perf import PerfModel, StepCost, VidurProfilePerfModel
from harness.sim.step_model import StepModel

A, B, C, W = 0.02, 1e-6, 5e-5, 100.0   # s, s per KV token read, s per prefill token, W


class LineModel(StepModel):
    """Step time ``A + C * prefill tokens + B * KV tokens read`` (s) at ``W`` watts; nothing else defined."""

    def __init__(self, hw=None, model=None):
        self.hw, self.model = hw, model

    def step(self, p_tok, p_pairs, p_ctx, p_samp, dec, dec_ctx, p_seqs=0, p_cached=0, first=0):
        t = A + C * p_tok + B * (p_ctx + dec_ctx)
        return StepCost(t, W * t, 0.0, 0.0)


def test_the_shipped_step_models_are_registered_subclasses():
    specs = step_models()
    assert specs["roofline"].factory is PerfModel and specs["vidur_profile"].factory is VidurProfilePerfModel
    assert all(issubclass(s.factory, StepModel) for s in specs.values())


def test_defaults_by_hand():
    """The base's defaults from ``step`` alone, against the line above by hand."""
    m = LineModel()
    assert m.decode_step(3, 300).time_s == pytest.approx(A + B * 300)
    ends, energy = m.decode_run(2, 100, 3, 1e9)   # contexts 100, 102, 104
    want = [A + B * 100, 2 * A + B * 202, 3 * A + B * 306]
    assert ends == pytest.approx(want) and energy == pytest.approx([W * x for x in want])
    assert m.decode_run_total(2, 100, 3, 1e9)[1] == pytest.approx(W * want[-1])
    ends, durs, _ = m.decode_steps(2, 100, 10, 5.0, A + B * 100)   # stops after the step reaching 5 s + limit
    assert len(ends) == 1 and ends[0] == pytest.approx(5.0 + A + B * 100)
    # a chunk of 2048 tokens with no prefix, alone: A + 2048 C
    assert m.prefill_tokens_per_s() == pytest.approx(2048 / (A + 2048 * C))
    assert m.idle_decode_step_s() == pytest.approx(A + B * 1024)
    d0, d1 = m.decode_linear_coefficients()
    assert (d0, d1) == (pytest.approx(A), pytest.approx(B))
    assert m.prefill_token_s() == pytest.approx(C)
    assert m.after_idle(10.0) == 0.0 and m.cpu_step_s() == 0.0 and not m.wants_batch and not m.has_decode_start


def test_a_registered_step_model_runs_by_name_in_the_engine():
    """A model registered under a new name validates as ``engine.step_model``, is built by name, and runs in
    the engine on the defaults: one request of a 4-token prompt and 3 output tokens, block 16 -> a prefill step
    (A + 4 C), then decode steps at contexts 4 and 5 (A + 4 B, A + 5 B)."""
    register_step_model("line_test")(LineModel)
    try:
        EngineConfig(step_model="line_test").validate("engine")
        with pytest.raises(ValueError, match="registered twice"):
            register_step_model("line_test")(LineModel)
        perf = make_step_model("line_test", None, None)
        assert type(perf) is LineModel
        clock = SimClock()
        eng = Engine(0, "e0", clock, perf, EngineConfig(block_size=16), 100, lambda r, why: None, 100.0)
        done = []
        req = Request("c", 0, 4, 3, (0,), on_finish=done.append)
        eng.submit(req)
        clock.run()
        assert done == [req]
        assert req.finish_s == pytest.approx((A + 4 * C) + (A + 4 * B) + (A + 5 * B))
    finally:
        _STEP_MODELS._specs.pop("line_test", None)
    with pytest.raises(ValueError, match=r"^engine\.step_model must be one of \(.*'roofline'.*\), got 'line_test'"):
        EngineConfig(step_model="line_test").validate("engine")


def test_step_is_required():
    with pytest.raises(NotImplementedError, match="StepModel.step"):
        StepModel().decode_step(1, 10)
