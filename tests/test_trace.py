"""Tests of the trace schema, loader/validator and writer (harness.core.trace)."""

from __future__ import annotations

import copy
import gzip
import json
import os
from pathlib import Path

import pytest

from harness.core.trace import ConversationRecord, TraceError, TurnRecord, load_trace, write_trace

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "traces" / "swebench_verified_mini_gemini3pro.jsonl.gz"


def _turn(new=10, reused=0, out=5, raw=None, tool=1.5, visible=False) -> dict:
    return {
        "new_input_tokens": new,
        "reused_tokens": reused,
        "output_tokens": out,
        "output_tokens_raw": out if raw is None else raw,
        "tool_time_s": tool,
        "visible": visible,
    }


def _conv(cid="c1") -> dict:
    """A valid 3-turn conversation: contexts 15, 15+20+7=42, ..."""
    return {
        "conversation_id": cid,
        "source": "test",
        "turns": [
            _turn(new=10, reused=0, out=5),
            _turn(new=20, reused=15, out=7, raw=9),
            _turn(new=3, reused=40, out=2, tool=0.0, visible=True),
        ],
    }


def _write_lines(path: Path, objs_or_lines) -> Path:
    lines = [o if isinstance(o, str) else json.dumps(o) for o in objs_or_lines]
    data = ("\n".join(lines) + "\n").encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def test_turn_record_prompt_tokens():
    t = TurnRecord(
        new_input_tokens=7, reused_tokens=100, output_tokens=3, tool_time_s=0.5, visible=False,
        output_tokens_raw=3,
    )
    assert t.prompt_tokens == 107
    with pytest.raises(AttributeError):
        t.reused_tokens = 1  # frozen


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_load_valid(tmp_path, name):
    p = _write_lines(tmp_path / name, [_conv("a"), _conv("b")])
    convs = load_trace(p)
    assert [c.conversation_id for c in convs] == ["a", "b"]
    c = convs[0]
    assert c.source == "test"
    assert c.turns[1] == TurnRecord(20, 15, 7, 1.5, False, 9)
    assert isinstance(c.turns[0].tool_time_s, float)
    assert [t.visible for t in c.turns] == [False, False, True]


def test_round_trip_and_byte_determinism(tmp_path):
    convs = [
        ConversationRecord(
            "x",
            (TurnRecord(5, 0, 2, 0.25, False, 3), TurnRecord(1, 7, 4, 0.0, True, 4)),
            "src",
        ),
        ConversationRecord("y", (TurnRecord(9, 0, 1, 0.0, True, 1),), "src"),
    ]
    for name in ("rt.jsonl", "rt.jsonl.gz"):
        p = tmp_path / name
        write_trace(p, convs)
        assert load_trace(p) == convs
        first = p.read_bytes()
        write_trace(p, iter(convs))
        assert p.read_bytes() == first
    raw = gzip.decompress((tmp_path / "rt.jsonl.gz").read_bytes()).decode()
    assert raw == (tmp_path / "rt.jsonl").read_text()
    line = raw.splitlines()[0]
    assert line.startswith('{"conversation_id":"x","source":"src","turns":[{"new_input_tokens":5,')
    assert (tmp_path / "rt.jsonl.gz").read_bytes()[4:8] == b"\0\0\0\0"  # gzip mtime 0


def test_write_rejects_invalid(tmp_path):
    bad = ConversationRecord("x", (TurnRecord(5, 3, 2, 0.0, True, 2),), "src")
    with pytest.raises(TraceError, match=r"out\.jsonl:1: turns\[0\]\.reused_tokens must be 0"):
        write_trace(tmp_path / "out.jsonl", [bad])
    assert not (tmp_path / "out.jsonl").exists()
    ok = ConversationRecord("x", (TurnRecord(5, 0, 2, 0.0, True, 2),), "src")
    with pytest.raises(TraceError, match=r"out\.jsonl:2: conversation_id 'x' is a duplicate"):
        write_trace(tmp_path / "out.jsonl", [ok, ok])
    with pytest.raises(TraceError, match="empty trace"):
        write_trace(tmp_path / "out.jsonl", [])


def _mut(fn):
    c = _conv("bad")
    fn(c)
    return c


# (case id, line 2 content, expected substring after "file:2: ")
MALFORMED = [
    ("not-json", '{"conversation_id": "bad",', "not valid JSON"),
    ("nan", json.dumps(_conv("bad")).replace("1.5", "NaN", 1), "not valid JSON"),
    ("not-object", "[1, 2]", "expected a JSON object, got list"),
    ("missing-key", _mut(lambda c: c.pop("source")), "conversation is missing key(s) 'source'"),
    ("extra-key", _mut(lambda c: c.update(extra=1)), "conversation has unexpected key(s) 'extra'"),
    ("id-type", _mut(lambda c: c.update(conversation_id=3)), "conversation_id must be a non-empty string, got 3"),
    ("source-type", _mut(lambda c: c.update(source=None)), "source must be a non-empty string, got None"),
    ("turns-type", _mut(lambda c: c.update(turns={})), "turns must be a list, got dict"),
    ("zero-turns", _mut(lambda c: c.update(turns=[])), "turns must have at least one turn"),
    ("turn-type", _mut(lambda c: c["turns"].__setitem__(1, 5)), "turns[1] must be an object, got int"),
    ("turn-missing", _mut(lambda c: c["turns"][1].pop("visible")), "turns[1] is missing key(s) 'visible'"),
    ("turn-extra", _mut(lambda c: c["turns"][2].update(foo=1)), "turns[2] has unexpected key(s) 'foo'"),
    ("output-neg", _mut(lambda c: c["turns"][1].update(output_tokens=-2)), "turns[1].output_tokens must be an int >= 1, got -2"),
    ("output-zero", _mut(lambda c: c["turns"][0].update(output_tokens=0)), "turns[0].output_tokens must be an int >= 1, got 0"),
    ("new-float", _mut(lambda c: c["turns"][1].update(new_input_tokens=2.0)), "turns[1].new_input_tokens must be an int >= 1, got 2.0"),
    ("new-zero", _mut(lambda c: c["turns"][1].update(new_input_tokens=0)), "turns[1].new_input_tokens must be an int >= 1, got 0"),
    ("reused-neg", _mut(lambda c: c["turns"][1].update(reused_tokens=-1)), "turns[1].reused_tokens must be an int >= 0, got -1"),
    ("reused-str", _mut(lambda c: c["turns"][1].update(reused_tokens="15")), "turns[1].reused_tokens must be an int >= 0, got '15'"),
    ("out-bool", _mut(lambda c: c["turns"][1].update(output_tokens=True)), "turns[1].output_tokens must be an int >= 1, got True"),
    ("raw-below", _mut(lambda c: c["turns"][1].update(output_tokens_raw=6)), "turns[1].output_tokens_raw must be >= output_tokens (7), got 6"),
    ("tool-neg", _mut(lambda c: c["turns"][0].update(tool_time_s=-0.5)), "turns[0].tool_time_s must be a finite number >= 0, got -0.5"),
    ("tool-str", _mut(lambda c: c["turns"][0].update(tool_time_s="1")), "turns[0].tool_time_s must be a finite number >= 0, got '1'"),
    ("tool-last", _mut(lambda c: c["turns"][2].update(tool_time_s=2.0)), "turns[2].tool_time_s must be 0.0 on the last turn, got 2.0"),
    ("visible-type", _mut(lambda c: c["turns"][0].update(visible=1)), "turns[0].visible must be a bool, got 1"),
    ("reused-turn0", _mut(lambda c: c["turns"][0].update(reused_tokens=3)), "turns[0].reused_tokens must be 0 on the first turn, got 3"),
    ("reused-exceeds", _mut(lambda c: c["turns"][1].update(reused_tokens=16)), "turns[1].reused_tokens must be <= the previous turn's prompt_tokens + output_tokens (15), got 16"),
    ("reused-exceeds-2", _mut(lambda c: c["turns"][2].update(reused_tokens=43)), "turns[2].reused_tokens must be <= the previous turn's prompt_tokens + output_tokens (42), got 43"),
    ("no-visible", _mut(lambda c: c["turns"][2].update(visible=False)), "turns: no turn has visible = true"),
    ("duplicate-id", _conv("good"), "conversation_id 'good' is a duplicate (first on line 1)"),
]


@pytest.mark.parametrize("case,line2,expected", MALFORMED, ids=[m[0] for m in MALFORMED])
@pytest.mark.parametrize("name", ["bad.jsonl", "bad.jsonl.gz"])
def test_malformed_names_file_line_field(tmp_path, name, case, line2, expected):
    p = _write_lines(tmp_path / name, [_conv("good"), line2])
    with pytest.raises(TraceError) as ei:
        load_trace(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}:2: "), msg
    assert expected in msg, msg


def test_line_numbers_count_blank_lines(tmp_path):
    bad = _mut(lambda c: c["turns"][1].update(output_tokens=-2))
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(_conv("a")) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:3: turns\[1\]\.output_tokens must be an int >= 1, got -2"):
        load_trace(p)


def test_missing_empty_and_unreadable_files(tmp_path):
    with pytest.raises(TraceError, match=r"nope\.jsonl\.gz: trace file not found"):
        load_trace(tmp_path / "nope.jsonl.gz")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(TraceError, match=r"empty\.jsonl: empty trace"):
        load_trace(empty)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n")
    with pytest.raises(TraceError, match="empty trace"):
        load_trace(blank)
    emptygz = tmp_path / "empty.jsonl.gz"
    emptygz.write_bytes(gzip.compress(b""))
    with pytest.raises(TraceError, match="empty trace"):
        load_trace(emptygz)
    notgz = tmp_path / "plain.jsonl.gz"
    notgz.write_text(json.dumps(_conv()) + "\n")
    with pytest.raises(TraceError, match=r"plain\.jsonl\.gz: cannot read trace file"):
        load_trace(notgz)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"conversation_id": "\xe9"}\n')
    with pytest.raises(TraceError, match="not UTF-8"):
        load_trace(latin)
    with pytest.raises(TraceError, match="is a directory"):
        load_trace(tmp_path)


def test_tool_time_int_accepted(tmp_path):
    c = _conv()
    c["turns"][0]["tool_time_s"] = 2
    (conv,) = load_trace(_write_lines(tmp_path / "t.jsonl", [c]))
    assert conv.turns[0].tool_time_s == 2.0 and isinstance(conv.turns[0].tool_time_s, float)


@pytest.fixture(scope="module")
def shipped():
    return load_trace(SHIPPED), None  # (its load time is a benchmark, not a test: benchmarks/sim_speed.py)


def test_shipped_trace_loads(shipped):
    convs, _ = shipped
    assert len(convs) == 500
    assert len({c.conversation_id for c in convs}) == 500
    assert [c.conversation_id for c in convs] == sorted(c.conversation_id for c in convs)
    assert all(c.source == "mini-swe-agent-1" for c in convs)
    for c in convs:
        vis = [k for k, t in enumerate(c.turns) if t.visible]
        assert vis == [len(c.turns) - 1], c.conversation_id
        assert c.turns[-1].tool_time_s == 0.0
    n_turns = sum(len(c.turns) for c in convs)
    assert n_turns == 20163  # = sum of api_calls (SOURCE.md)


def test_shipped_trace_invariants(shipped):
    convs, _ = shipped
    clipped = 0
    for c in convs:
        for prev, t in zip(c.turns, c.turns[1:]):
            # mini-swe-agent is append-only: each call reuses the whole previous context
            assert t.reused_tokens == prev.prompt_tokens + prev.output_tokens
        for t in c.turns:
            assert t.output_tokens == min(t.output_tokens_raw, 8192)
            clipped += t.output_tokens_raw > t.output_tokens
    assert clipped == 5


def test_shipped_trace_is_canonical(shipped, tmp_path):
    convs, _ = shipped
    out = tmp_path / "again.jsonl.gz"
    write_trace(out, copy.copy(convs))
    assert out.read_bytes() == SHIPPED.read_bytes()


def test_load_memo_parses_once_and_sees_an_edit_in_place(tmp_path, monkeypatch):
    """A trace loaded twice in one process is parsed once (a sweep's jobs share the parse), each call gets
    its own list, and a file rewritten in place -- same size, same mtime restored -- is parsed again: the
    memo is keyed by the file's content, not its stat."""
    import harness.core.trace as tr

    parses = []
    real = tr._parse_trace
    monkeypatch.setattr(tr, "_parse_trace", lambda *a: parses.append(a[0]) or real(*a))
    monkeypatch.setattr(tr, "_LOADED", {})
    for name in ("m.jsonl", "m.jsonl.gz"):
        parses.clear()
        p = _write_lines(tmp_path / name, [_conv("a"), _conv("b")])
        first = load_trace(p)
        first.reverse()   # a caller reordering its list must not change what the next caller gets
        second = load_trace(p)
        assert [c.conversation_id for c in second] == ["a", "b"]
        assert len(parses) == 1
        st = p.stat()
        edited = _conv("a")
        edited["turns"][1]["output_tokens"] = 8   # 7 -> 8: same digit count, same file size (plain text)
        edited["turns"][1]["output_tokens_raw"] = 9
        _write_lines(p, [edited, _conv("b")])
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        if not name.endswith(".gz"):
            assert p.stat().st_size == st.st_size and p.stat().st_mtime_ns == st.st_mtime_ns
        third = load_trace(p)
        assert len(parses) == 2
        assert third[0].turns[1] == TurnRecord(20, 15, 8, 1.5, False, 9)   # the edited turn, as written above
        _write_lines(p, ['{"conversation_id": "a", "source": "test"}'])   # now invalid: no turns
        with pytest.raises(TraceError, match=r"m\.jsonl(\.gz)?:1"):
            load_trace(p)


def test_load_memo_separates_paths_and_block_sizes(tmp_path, monkeypatch):
    """Two files with the same bytes are two entries (records name no path, but errors and the cache key
    do), and so is one request trace read with two ``hash_block_tokens``."""
    import harness.core.trace as tr

    monkeypatch.setattr(tr, "_LOADED", {})
    a = _write_lines(tmp_path / "a.jsonl", [_conv("a")])
    b = _write_lines(tmp_path / "b.jsonl", [_conv("a")])
    assert load_trace(a) == load_trace(b)
    assert len(tr._LOADED) == 2
    load_trace(a, hash_block_tokens=16)
    assert len(tr._LOADED) == 3
