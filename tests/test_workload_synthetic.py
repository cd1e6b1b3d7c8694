"""Synthetic workloads (``workload.kind=synthetic``): single-turn conversations of given prompt types, drawn
with the seed in proportion to their weights; validation names the key; the shipped WAIT workloads run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from harness.run.runner import execute
from harness.core.trace import ConversationRecord
from harness.workload.workload import PromptTypeConfig, WorkloadConfig, build_workload
from tests.conftest import compose_run

TWO_TYPES = [PromptTypeConfig(512, 20, 0.7), PromptTypeConfig(512, 50, 0.3)]


def synthetic(**kw) -> WorkloadConfig:
    base = dict(name="syn", kind="synthetic", prompt_types=list(TWO_TYPES), num_conversations=2000,
                arrival="poisson", rate_per_s=4.0, seed=0)
    base.update(kw)
    return WorkloadConfig(**base)


def test_single_turn_conversations_of_the_given_types():
    convs, stats = build_workload([], synthetic())
    assert len(convs) == 2000
    arrivals = [t for t, _ in convs]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    for _, rec in convs:
        assert isinstance(rec, ConversationRecord) and rec.source == "synthetic"
        (turn,) = rec.turns
        assert turn.visible and turn.reused_tokens == 0 and turn.tool_time_s == 0.0
        assert (turn.new_input_tokens, turn.output_tokens) in {(512, 20), (512, 50)}
        assert rec.conversation_id.endswith("-t0" if turn.output_tokens == 20 else "-t1")
    share = Counter(rec.turns[0].output_tokens for _, rec in convs)[20] / 2000
    assert abs(share - 0.7) < 0.035  # 3.4 standard deviations of a binomial(2000, 0.7) share
    assert stats.mean_turns == 1.0 and stats.rate_per_s == 4.0
    assert set(stats.turn_prompt_tokens) == {512} and set(stats.turn_output_tokens) == {20, 50}
    assert len({rec.conversation_id for _, rec in convs}) == 2000


def test_same_seed_same_workload_other_seed_other_workload():
    a, _ = build_workload([], synthetic(num_conversations=200))
    b, _ = build_workload([], synthetic(num_conversations=200))
    c, _ = build_workload([], synthetic(num_conversations=200, seed=1))
    assert a == b
    assert [r.conversation_id for _, r in a] != [r.conversation_id for _, r in c]
    # the arrival times do not depend on the prompt-type draw (separate random streams)
    d, _ = build_workload([], synthetic(num_conversations=200, prompt_types=[PromptTypeConfig(100, 5, 1.0)]))
    assert [t for t, _ in a] == [t for t, _ in d]


@pytest.mark.parametrize(("kw", "needle"), [
    (dict(num_conversations=None), "workload.num_conversations"),
    (dict(prompt_types=[]), "workload.prompt_types"),
    (dict(prompt_types=[PromptTypeConfig(0, 20, 1.0)]), "workload.prompt_types[0].input_tokens"),
    (dict(prompt_types=[PromptTypeConfig(512, 20, 1.0), PromptTypeConfig(512, -1, 1.0)]),
     "workload.prompt_types[1].output_tokens"),
    (dict(prompt_types=[PromptTypeConfig(512, 20, 0.0)]), "workload.prompt_types[0].weight"),
    (dict(kind="trace"), "workload.prompt_types"),
    (dict(kind="replay"), "workload.kind"),
])
def test_invalid_synthetic_config_names_the_key(kw, needle):
    with pytest.raises(ValueError) as e:
        synthetic(**kw).validate()
    assert needle in str(e.value), str(e.value)


@pytest.mark.parametrize("workload", ["wait_single", "wait_two_types", "wait_long"])
def test_shipped_wait_workloads_run_on_one_a100(workload, tmp_path: Path):
    run = compose_run([f"workload={workload}", "cluster=a100_1x", "model=llama2_7b", "scheduler=collocated",
                       "workload.num_conversations=12", "logger.progress=false"])
    s = execute(run, tmp_path)
    assert s["num_conversations"] == 12 and s["num_turns"] == 12 and not s["partial"]
    import pandas as pd
    turns = pd.read_parquet(tmp_path / "turns.parquet").set_index("conversation_id")
    conv = pd.read_parquet(tmp_path / "conversations.parquet").set_index("conversation_id")
    # one turn each: TTFET is that turn's TTFT (its submission is the conversation's arrival)
    assert (conv.ttfet_s - turns.loc[conv.index, "ttft_s"]).abs().max() < 1e-9
    assert set(turns.prompt_tokens) == {512}


def test_multi_turn_prompt_types_reuse_the_stated_prefix():
    """A 4-call type of 1000-token prompts at cached_fraction 0.6: by hand, calls 2-4 reuse
    round(0.6 x 1000) = 600 tokens of the previous call's context (1000 prompt + 30 output) and add 400;
    the first call adds all 1000; tool time 0.5 s after each call but the last, which is the visible one."""
    wl = synthetic(prompt_types=[PromptTypeConfig(1000, 30, 1.0, turns=4, cached_fraction=0.6, tool_time_s=0.5)],
                   num_conversations=3)
    convs, stats = build_workload([], wl)
    for _, rec in convs:
        assert [(t.reused_tokens, t.new_input_tokens) for t in rec.turns] == [(0, 1000)] + [(600, 400)] * 3
        assert [t.prompt_tokens for t in rec.turns] == [1000] * 4
        assert [t.tool_time_s for t in rec.turns] == [0.5, 0.5, 0.5, 0.0]
        assert [t.visible for t in rec.turns] == [False, False, False, True]
    assert stats.mean_turns == 4.0


@pytest.mark.parametrize("kw, needle", [
    (dict(turns=0), "prompt_types[0].turns"),
    (dict(turns=2, cached_fraction=0.99), "prompt_types[0].cached_fraction"),
    (dict(cached_fraction=0.5), "needs turns > 1"),
    (dict(turns=2, tool_time_s=-1.0), "prompt_types[0].tool_time_s")])
def test_invalid_multi_turn_type_names_the_key(kw, needle):
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        synthetic(prompt_types=[PromptTypeConfig(512, 20, 1.0, **kw)]).validate()


def test_calibration_prefix_workload_spans_cached_fractions_in_the_simulator(tmp_path: Path):
    """The shipped calibration_prefix_cpu on the simulated cpu profile: later calls hit the prefix cache in
    whole 128-token blocks, at cached fractions from 0 up to at least 80 %."""
    run = compose_run(["workload=calibration_prefix_cpu", "workload.num_conversations=24", "cluster=cpu_1x",
                       "model=tiny", "scheduler=collocated", "slo=absolute", "engine.block_size=128",
                       "logger.progress=false"])
    execute(run, tmp_path)
    import pandas as pd
    t = pd.read_parquet(tmp_path / "turns.parquet")
    assert (t.status == "ok").all() and len(t) == 96
    later = t[t.turn > 0]
    frac = later.cached_tokens / later.prompt_tokens
    assert (t[t.turn == 0].cached_tokens == 0).all()
    assert frac.min() == 0.0 and frac.max() >= 0.8 and (later.cached_tokens % 128 == 0).all()
