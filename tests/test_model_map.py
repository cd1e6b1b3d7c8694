"""``workload.model_map`` (harness.core.routing): calls sent to an instance group by their recorded model.

A session P whose calls alternate between a "big" and a "small" model spawns a child whose calls are all
"small" (as Claude Code's Haiku sub-agents). On four collocated A40s whose last two form the group ``small``
(``cluster.instances[1].name``), with ``{small-*: small}`` every small call must run on collocated2/3 and every
other call on collocated0/1 (the unnamed default pool), read back from turns.parquet against the trace's models;
without a map the same calls may go anywhere (the default: one served model). A group the cluster does not
declare, a pool without the scheduler's roles, and a call no pool serves are refused before the run, naming
the field.
"""

from __future__ import annotations

import pandas as pd
import pytest

from harness.core.routing import resolve_routes
from harness.core.trace import ConversationRecord, TurnRecord
from harness.run.config import ConfigError
from harness.run.runner import execute
from tests.conftest import compose_run

GROUPS = "cluster.instances=[{role:collocated,hardware:a40,count:2},{role:collocated,hardware:a40,count:2,name:small}]"
BASE = ["scheduler=collocated", "cluster=a40_4x", GROUPS, "slo=absolute", "logger.progress=false",
        "workload.sample=first", "workload.arrival=fixed", "model=qwen3_0_6b"]
MAP = "++workload.model_map={small-*:small}"


def turn(new, reused, out, model, visible=False):
    return TurnRecord(new_input_tokens=new, reused_tokens=reused, output_tokens=out, tool_time_s=0.5,
                      visible=visible, output_tokens_raw=out, user_message=False, send_s=None, model=model)


def family():
    """P: big, small, big, small calls (each reusing its whole previous context); child P/A (two small calls)
    spawned after P's call 0 and joined; Q: two big calls."""
    p = ConversationRecord("P", (turn(400, 0, 20, "big-1"), turn(50, 420, 20, "small-a"),
                                 turn(50, 490, 20, "big-1"), turn(50, 560, 20, "small-b", visible=True)), "t")
    a = ConversationRecord("P/A", (turn(300, 0, 30, "small-a"), turn(40, 330, 30, "small-a", visible=True)), "t",
                           parent_id="P", spawn_after_turn=0)
    q = ConversationRecord("Q", (turn(600, 0, 20, "big-2"), turn(60, 620, 20, "big-2", visible=True)), "t")
    return [p, a, q]


def _run(tmp_path, monkeypatch, overrides=()):
    import harness.run.runner as runner
    monkeypatch.setattr(runner, "load_trace", lambda path: family())
    s = execute(compose_run(BASE + list(overrides)), tmp_path)
    return s, pd.read_parquet(tmp_path / "turns.parquet")


def test_calls_land_on_the_group_their_model_maps_to(tmp_path, monkeypatch):
    s, turns = _run(tmp_path, monkeypatch, [MAP])
    assert not s["partial"] and s["num_conversations_failed"] == 0
    models = {(r.conversation_id, k): t.model for r in family() for k, t in enumerate(r.turns)}
    assert len(turns) == len(models) == 8
    for row in turns.itertuples():
        m = models[(row.conversation_id, row.turn)]
        want = {"collocated2", "collocated3"} if m.startswith("small-") else {"collocated0", "collocated1"}
        assert row.prefill_instance in want and row.decode_instance in want, (row.conversation_id, row.turn, m)
    # both pools were used, and P switched pools between its calls (a small call never pinned to a big instance)
    p = turns[turns.conversation_id == "P"].sort_values("turn")
    assert p.decode_instance.iloc[0] in {"collocated0", "collocated1"}
    assert p.decode_instance.iloc[1] in {"collocated2", "collocated3"}


def test_no_map_is_one_served_model_on_every_instance(tmp_path, monkeypatch):
    # the default: no routes, one served model; collocated keeps a conversation on its first instance (sticky),
    # so P's small calls stay where its big call 0 ran, which the map above forbids
    s, turns = _run(tmp_path, monkeypatch)
    assert not s["partial"]
    assert compose_run(BASE).cfg.workload.model_map == {}
    p = turns[turns.conversation_id == "P"].sort_values("turn")
    assert p.decode_instance.nunique() == 1 and len(p) == 4


def test_a_group_the_cluster_does_not_declare_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"workload\.model_map\['small-\*'\]: instance group 'haiku' is not in "
                                          r"cluster a40_4x .*declares \['small'\]"):
        compose_run(BASE + ["++workload.model_map={small-*:haiku}"])
    with pytest.raises(ConfigError, match=r"declares no named group"):
        compose_run(BASE[:2] + BASE[3:] + ["++workload.model_map={small-*:small}"])


def test_a_pool_without_the_schedulers_roles_is_refused():
    # conserve needs a prefiller and a decoder in every pool; the small group is two collocated instances
    with pytest.raises(ConfigError, match=r"workload\.model_map\['small-\*'\]: instance group 'small' has no "
                                          r"prefiller instance"):
        compose_run(["scheduler=conserve", "cluster=a40_1p3d",
                     "cluster.instances=[{role:prefiller,hardware:a40,count:1},{role:decoder,hardware:a40,count:2},"
                     "{role:collocated,hardware:a40,count:1,name:small}]", "++workload.model_map={small-*:small}"])


def test_a_call_no_pool_serves_is_refused_before_the_run(tmp_path, monkeypatch):
    named = ("cluster.instances=[{role:collocated,hardware:a40,count:2,name:big},"
             "{role:collocated,hardware:a40,count:2,name:small}]")
    with pytest.raises(ConfigError, match=r"workload\.model_map: call 0 of conversation 'Q' \(model 'big-2'\) matches "
                                          r"no pattern"):
        _run(tmp_path, monkeypatch, [named, "++workload.model_map={small-*:small,big-1:big}"])
    assert not (tmp_path / "turns.parquet").exists()


def test_first_matching_pattern_wins_and_unmatched_calls_go_to_the_unnamed_groups():
    r = resolve_routes({"claude-haiku-*": "haiku", "claude-*": "main"}, [None, "main", "haiku", "haiku"],
                       ["collocated"] * 4)
    assert r.pool_of("claude-haiku-4-5-20251001") == (2, 3)
    assert r.pool_of("claude-opus-4-6") == (1,)
    assert r.pool_of("gpt-x") == (0,) and r.pool_of(None) == (0,)
    assert resolve_routes({}, [None], ["collocated"]) is None and resolve_routes(None, [None], ["collocated"]) is None
