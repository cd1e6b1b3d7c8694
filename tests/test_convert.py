"""Tests of the trajectory converter (harness.workload.convert).

Counts are checked against the tokenizer applied directly to the full rendered
prompt strings, which the test builds itself (not with the module's helpers).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from harness.workload import convert as cv
from harness.core.trace import load_trace

SHARED = Path(__file__).resolve().parents[2] / "shared"
MINI_DIR = SHARED / "data" / "swebench-trajectories" / "mini-swe-agent-v1.15_gemini-3-pro-preview" / "trajs"
needs_shared = pytest.mark.skipif(not MINI_DIR.is_dir(), reason="../shared trajectories not present")

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


@pytest.fixture(scope="module")
def tok():
    return cv.load_qwen2_tokenizer()


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def rendered(messages) -> str:
    """The test's own rendering of the Qwen chat template (prompt + generation prompt)."""
    return "".join(f"{IM_START}{r}\n{c}{IM_END}\n" for r, c in messages) + f"{IM_START}assistant\n"


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_reference_ids(tok):
    assert ids(tok, "Hello world") == [9707, 1879]
    assert ids(tok, "12345") == [16, 17, 18, 19, 20]
    assert ids(tok, "<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]
    assert ids(tok, "你好") == [108386]
    assert ids(tok, "<|endoftext|>") == [151643]
    for s in ["Hello world", "12345", "你好", "  x = f(1)\n\n\tdef g():\r\n", "café ñ 🙂"]:
        assert tok.decode(ids(tok, s)) == s


def test_tokenizer_dir_errors(tmp_path):
    with pytest.raises(cv.ConvertError, match="vocab.json: tokenizer file not found"):
        cv.load_qwen2_tokenizer(tmp_path)


def test_per_message_counting_is_exact(tok):
    """Tokenizing message by message sums to tokenizing the whole rendered prompt."""
    messages = [
        ("system", "You are a helpful assistant."),
        ("user", "\n\nleading newlines and trailing spaces   "),
        ("assistant", " leading space, digits 12345 and\r\nCRLF"),
        ("user", "<returncode>0</returncode>\n<output>\n  indented\n\n\n</output>"),
        ("assistant", "literal <|im_end|> inside content, unicode: naïve café 你好"),
        ("user", ""),
    ]
    counter = cv.TokenCounter(tok)
    per_message = sum(len(counter.message_ids(m)) for m in messages) + len(counter.generation_prompt_ids)
    assert per_message == len(ids(tok, rendered(messages)))
    assert counter.generation_prompt_ids == [151644, 77091, 198]
    assert cv.render_prompt(messages) == rendered(messages)


def test_content_text():
    assert cv.content_text("abc") == "abc"
    assert cv.content_text(None) == ""
    assert cv.content_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "ab"
    with pytest.raises(cv.ConvertError, match=r"content\[0\]: only text parts"):
        cv.content_text([{"type": "image_url", "image_url": {}}])
    with pytest.raises(cv.ConvertError, match="must be a string"):
        cv.content_text(5)


# ----------------------------------------------------------------------------- real mini-swe-agent files


def _independent_mini(tok, path: Path, max_out: int):
    """Prompt / output token counts and reuse of a mini-swe-agent file, computed directly."""
    data = json.load(gzip.open(path))
    msgs = [(m["role"], m["content"]) for m in data["messages"]]
    asst = [j for j, m in enumerate(msgs) if m[0] == "assistant"]
    prompts = [ids(tok, rendered(msgs[:j])) for j in asst]
    outputs = [ids(tok, msgs[j][1] + IM_END) for j in asst]
    reused = [0] + [
        lcp(prompts[k], prompts[k - 1] + outputs[k - 1][:max_out]) for k in range(1, len(asst))
    ]
    return data, msgs, asst, prompts, outputs, reused


@needs_shared
@pytest.mark.parametrize(
    "name,max_out",
    [("astropy__astropy-12907", 8192), ("sympy__sympy-23413", 8192), ("astropy__astropy-12907", 40)],
)
def test_mini_counts_match_direct_tokenization(tok, name, max_out):
    path = MINI_DIR / f"{name}.traj.json.gz"
    conv, n_clipped = cv.convert_file(path, "mini-swe-agent", cv.TokenCounter(tok), max_output_tokens=max_out)
    data, msgs, asst, prompts, outputs, reused = _independent_mini(tok, path, max_out)
    assert conv.conversation_id == name and conv.source == "mini-swe-agent-1"
    assert len(conv.turns) == len(asst) == data["info"]["model_stats"]["api_calls"]
    assert [t.prompt_tokens for t in conv.turns] == [len(p) for p in prompts]
    assert [t.output_tokens_raw for t in conv.turns] == [len(o) for o in outputs]
    assert [t.output_tokens for t in conv.turns] == [min(len(o), max_out) for o in outputs]
    assert [t.reused_tokens for t in conv.turns] == reused
    assert n_clipped == sum(len(o) > max_out for o in outputs)
    assert [t.visible for t in conv.turns] == [False] * (len(asst) - 1) + [True]
    # the trailing submission message is never part of a prompt
    assert msgs[-1][0] == "user" and asst[-1] == len(msgs) - 2


@needs_shared
def test_mini_append_only_invariant(tok):
    """mini-swe-agent prompts are append-only: each call reuses the whole previous context."""
    path = MINI_DIR / "sympy__sympy-23413.traj.json.gz"
    data = json.load(gzip.open(path))
    calls = cv.mini_swe_agent_calls(data, str(path))
    for prev, call in zip(calls, calls[1:]):
        n = len(prev.prompt)
        assert call.prompt[:n] == prev.prompt
        assert call.prompt[n] == ("assistant", prev.output)
        assert [r for r, _ in call.prompt[n + 1 :]] == ["user"]
    turns, n_clipped = cv.calls_to_turns(calls, cv.TokenCounter(tok))
    assert n_clipped == 1  # one 10,966-token output in this file
    for k in range(1, len(turns)):
        prev, t = turns[k - 1], turns[k]
        assert t.reused_tokens == prev.prompt_tokens + prev.output_tokens
        # the new input is the rest of the assistant message (beyond the clip), its
        # "<|im_end|>" if clipped, "\n", the observation and the generation prompt
        obs = ids(tok, f"{IM_START}user\n{call_content(calls[k])}{IM_END}\n")
        clipped_rest = prev.output_tokens_raw - prev.output_tokens
        assert t.new_input_tokens == clipped_rest + 1 + len(obs) + 3


def call_content(call: cv.Call) -> str:
    return call.prompt[-1][1]


@needs_shared
def test_mini_tool_time_on_real_file(tok):
    path = MINI_DIR / "astropy__astropy-12907.traj.json.gz"
    data = json.load(gzip.open(path))
    resp = [m["extra"]["response"] for m in data["messages"] if m["role"] == "assistant"]
    conv, _ = cv.convert_file(path, "mini-swe-agent", cv.TokenCounter(tok))
    for k, t in enumerate(conv.turns[:-1]):
        gap = resp[k + 1]["created"] - resp[k]["created"]
        latency = 1.0 + resp[k]["usage"]["completion_tokens"] / 120.0
        assert t.tool_time_s == pytest.approx(max(0.0, gap - latency), abs=5e-4)
    assert conv.turns[-1].tool_time_s == 0.0


# ----------------------------------------------------------------------------- hand-made mini fixtures


def _mini_fixture(assistant_texts, created, completion, trailing=True) -> dict:
    msgs = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "<pr_description>Fix the bug.</pr_description>"},
    ]
    for k, (text, c, n) in enumerate(zip(assistant_texts, created, completion)):
        msgs.append(
            {
                "role": "assistant",
                "content": text,
                "extra": {"response": {"created": c, "usage": {"completion_tokens": n}}},
            }
        )
        if k < len(assistant_texts) - 1 or trailing:
            msgs.append({"role": "user", "content": f"<returncode>0</returncode>\n<output>out {k}</output>"})
    return {"trajectory_format": "mini-swe-agent-1", "instance_id": "fix__bug-1", "info": {}, "messages": msgs}


def test_mini_tool_time_rule_by_hand():
    data = _mini_fixture(
        ["THOUGHT: a\n```bash\nls\n```", "THOUGHT: b", "THOUGHT: c", "THOUGHT: submit"],
        created=[1000, 1010, 1013, 1014],
        completion=[240, 60, 600, 5],
    )
    calls = cv.mini_swe_agent_calls(data, "fx", provider_ttft_s=1.0, provider_decode_tok_s=120.0)
    # gap - (TTFT + completion / rate): 10 - (1 + 2) = 7; 3 - (1 + 0.5) = 1.5; 1 - (1 + 5) < 0 -> 0
    assert [c.tool_time_s for c in calls] == [7.0, 1.5, 0.0, 0.0]
    calls = cv.mini_swe_agent_calls(data, "fx", provider_ttft_s=0.5, provider_decode_tok_s=60.0)
    assert [c.tool_time_s for c in calls] == [5.5, 1.5, 0.0, 0.0]  # 10-(0.5+4), 3-(0.5+1)
    # the trailing user message (submission) is dropped; prompts are all messages before each call
    assert len(calls) == 4
    assert len(calls[-1].prompt) == len(data["messages"]) - 2
    assert calls[0].prompt == (("system", "You are a helpful assistant."), ("user", "<pr_description>Fix the bug.</pr_description>"))
    assert calls[1].prompt[-2:] == (("assistant", "THOUGHT: a\n```bash\nls\n```"), ("user", "<returncode>0</returncode>\n<output>out 0</output>"))


def test_mini_errors():
    data = _mini_fixture(["a", "b"], [1, 2], [1, 1])
    with pytest.raises(cv.ConvertError, match="trajectory_format must be 'mini-swe-agent-1'"):
        cv.mini_swe_agent_calls({**data, "trajectory_format": "x"}, "f.traj.json")
    with pytest.raises(cv.ConvertError, match="no assistant message"):
        cv.mini_swe_agent_calls({**data, "messages": data["messages"][:2]}, "f.traj.json")
    del data["messages"][2]["extra"]["response"]["created"]
    with pytest.raises(cv.ConvertError, match=r"f\.traj\.json: messages\[2\]\.extra\.response: missing key 'created'"):
        cv.mini_swe_agent_calls(data, "f.traj.json")


def test_clipping_by_hand(tok):
    long_text = "THOUGHT: " + "lorem ipsum dolor " * 40 + "\n```bash\nls\n```"
    data = _mini_fixture(["THOUGHT: short", long_text, "THOUGHT: done"], [0, 5, 100], [10, 2000, 10])
    calls = cv.mini_swe_agent_calls(data, "fx")
    turns, n_clipped = cv.calls_to_turns(calls, cv.TokenCounter(tok), max_output_tokens=50)
    raw1 = len(ids(tok, long_text + IM_END))
    assert raw1 > 50 and n_clipped == 1
    assert (turns[1].output_tokens, turns[1].output_tokens_raw) == (50, raw1)
    assert turns[0].output_tokens == turns[0].output_tokens_raw == len(ids(tok, "THOUGHT: short" + IM_END))
    # next call reuses only the clipped context; the rest of the assistant message is new input
    p1 = ids(tok, rendered(calls[1].prompt))
    p2 = ids(tok, rendered(calls[2].prompt))
    assert turns[2].reused_tokens == len(p1) + 50
    assert turns[2].new_input_tokens == len(p2) - len(p1) - 50
    assert turns[2].reused_tokens == lcp(p2, p1 + ids(tok, long_text + IM_END)[:50])
    # without clipping the whole previous context is reused
    turns_nc, n_nc = cv.calls_to_turns(calls, cv.TokenCounter(tok))
    assert n_nc == 0 and turns_nc[2].reused_tokens == len(p1) + raw1
    assert turns_nc[2].prompt_tokens == turns[2].prompt_tokens


def test_boundary_retokenization(tok):
    """An output starting with newlines re-tokenizes differently after "assistant\\n":
    the token-level common prefix stops there instead of assuming append-only."""
    data = _mini_fixture(["\n\nTHOUGHT: x", "THOUGHT: y"], [0, 5], [1, 1])
    calls = cv.mini_swe_agent_calls(data, "fx")
    turns, _ = cv.calls_to_turns(calls, cv.TokenCounter(tok))
    p0 = ids(tok, rendered(calls[0].prompt))
    o0 = ids(tok, calls[0].output + IM_END)
    p1 = ids(tok, rendered(calls[1].prompt))
    assert turns[1].reused_tokens == lcp(p1, p0 + o0) < len(p0) + len(o0)
    assert turns[1].reused_tokens == len(p0) - 1  # "\n" + "\n\n" merge into one "\n\n\n" token
    assert turns[1].prompt_tokens == len(p1)


# ----------------------------------------------------------------------------- SWE-agent .traj


def _swe_fixture() -> dict:
    """A 4-step SWE-agent 1.0 trajectory with last_n_observations(n=2).

    History: system, task, then (action k, observation k) for k = 0..3. Before call 3
    the processor replaces observation 0 with "Old environment output: ...".
    """
    system = {"role": "system", "content": "SETTING: You are an autonomous programmer.", "agent": "main", "message_type": "system_prompt"}
    task = {"role": "user", "content": [{"type": "text", "text": "<uploaded_files>\n/testbed\n</uploaded_files>\n"}, {"type": "text", "text": "Fix issue 42."}], "agent": "main", "message_type": "observation"}
    actions = [
        "Let me look.\n\n<function=bash>\n<parameter=command>ls</parameter>\n</function>",
        "Open the file.\n\n<function=str_replace_editor>\n<parameter=command>view</parameter>\n<parameter=path>/testbed/a.py</parameter>\n</function>",
        "Fix it.\n\n<function=str_replace_editor>\n<parameter=command>str_replace</parameter>\n</function>",
        "Done.\n\n<function=submit>\n</function>",
    ]
    observations = [
        "OBSERVATION:\nREADME.md\na.py\nsetup.py",
        "OBSERVATION:\nHere's the result of running `cat -n` on /testbed/a.py:\n     1\tdef f():\n     2\t    return 1",
        "OBSERVATION:\nThe file /testbed/a.py has been edited.",
        "OBSERVATION:\ndiff --git a/a.py b/a.py",
    ]
    old = "Old environment output: (3 lines omitted)"

    def act(k):
        return {"role": "assistant", "content": actions[k], "agent": "main", "message_type": "action", "thought": "", "action": "", "tool_calls": None}

    def obs(k, text=None):
        return {"role": "user", "content": text or observations[k], "agent": "main", "message_type": "observation"}

    history = [system, task]
    for k in range(4):
        history += [act(k), obs(k)]
    steps = []
    for k in range(4):
        messages = [system, task]
        for j in range(k + 1):
            keep = j >= k + 1 - 2  # last 2 observations are kept
            messages += [act(j), obs(j) if keep else obs(j, old)]
        steps.append(
            {
                "action": "", "observation": observations[k], "response": actions[k], "thought": "",
                "execution_time": [0.25, 1.5, 0.125, 3.0][k], "state": {}, "messages": messages, "extra_info": {},
            }
        )
    return {"trajectory": steps, "history": history, "info": {"exit_status": "submitted"}, "replay_config": "{}", "environment": "main"}


def test_swe_agent_fixture_by_hand(tok, tmp_path):
    data = _swe_fixture()
    path = tmp_path / "repo__issue-42.traj"
    path.write_text(json.dumps(data))
    conv, n_clipped = cv.convert_file(path, "swe-agent", cv.TokenCounter(tok))
    assert conv.conversation_id == "repo__issue-42" and conv.source == "swe-agent" and n_clipped == 0
    assert len(conv.turns) == 4
    assert [t.tool_time_s for t in conv.turns] == [0.25, 1.5, 0.125, 0.0]
    assert [t.visible for t in conv.turns] == [False, False, False, True]

    def msgs(raw):
        return [(m["role"], cv.content_text(m["content"])) for m in raw]

    prompts = [msgs(data["history"][:2])] + [msgs(s["messages"]) for s in data["trajectory"][:-1]]
    p = [ids(tok, rendered(m)) for m in prompts]
    o = [ids(tok, a + IM_END) for a in (s["response"] for s in data["trajectory"])]
    assert [t.prompt_tokens for t in conv.turns] == [len(x) for x in p]
    assert [t.output_tokens for t in conv.turns] == [len(x) for x in o]
    # calls 1 and 2 are append-only: whole previous context reused
    for k in (1, 2):
        assert conv.turns[k].reused_tokens == len(p[k - 1]) + len(o[k - 1])
    # before call 3 observation 0 (message 3) was rewritten: the common prefix is the
    # system, task and action-0 messages plus "<|im_start|>", "user", "\n" of message 3
    head = ids(tok, rendered(prompts[3][:3]))[:-3]  # drop the generation prompt
    assert ids(tok, "<|im_start|>user\n") == [151644, 872, 198]
    expected = len(head) + 3
    assert conv.turns[3].reused_tokens == expected == lcp(p[3], p[2] + o[2])
    assert conv.turns[3].new_input_tokens == len(p[3]) - expected
    assert conv.turns[3].reused_tokens < len(p[2]) + len(o[2])


def test_swe_agent_query_and_missing_response(tok):
    data = _swe_fixture()
    for k, s in enumerate(data["trajectory"]):
        s["query"] = [{"role": "system", "content": "q"}, {"role": "user", "content": f"query {k}"}]
    del data["trajectory"][1]["response"]
    calls = cv.swe_agent_calls(data, "fx")
    assert calls[2].prompt == (("system", "q"), ("user", "query 2"))  # "query" wins when present
    assert calls[1].output == data["trajectory"][1]["messages"][-2]["content"]  # last assistant message
    with pytest.raises(cv.ConvertError, match=r"fx: trajectory must be a non-empty list"):
        cv.swe_agent_calls({**data, "trajectory": []}, "fx")
    with pytest.raises(cv.ConvertError, match=r"fx: missing key 'history'"):
        cv.swe_agent_calls({"trajectory": data["trajectory"]}, "fx")


def test_convert_cli_swe_agent_dir(tmp_path, capsys):
    d = tmp_path / "trajs" / "repo__issue-42"
    d.mkdir(parents=True)
    (d / "repo__issue-42.traj").write_text(json.dumps(_swe_fixture()))
    with gzip.open(tmp_path / "trajs" / "other__issue-7.traj.json.gz", "wt") as f:
        json.dump(_swe_fixture(), f)
    (tmp_path / "trajs" / "notes.json").write_text("{}")  # not a trajectory name: ignored
    out = tmp_path / "out.jsonl.gz"
    rc = cv.main(["swe-agent", str(tmp_path / "trajs"), "-o", str(out), "--jobs", "1", "--no-progress"])
    assert rc == 0
    assert "| turns per conversation | 2 |" in capsys.readouterr().out
    convs = load_trace(out)
    assert [c.conversation_id for c in convs] == ["other__issue-7", "repo__issue-42"]
    assert convs[0].turns == convs[1].turns
    rc = cv.main(["mini-swe-agent", str(tmp_path / "trajs"), "-o", str(out), "--jobs", "1", "--no-progress"])
    assert rc == 2
    assert "trajectory_format must be 'mini-swe-agent-1'" in capsys.readouterr().err


@needs_shared
def test_convert_jobs_deterministic(tmp_path):
    files = [MINI_DIR / f"{n}.traj.json.gz" for n in ("astropy__astropy-12907", "sympy__sympy-23413", "django__django-11099")]
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    ra = cv.convert("mini-swe-agent", files, a, jobs=1, progress=False)
    rb = cv.convert("mini-swe-agent", list(reversed(files)), b, jobs=2, progress=False)
    assert a.read_bytes() == b.read_bytes()
    assert [c.conversation_id for c in ra.conversations] == sorted(f.name.split(".")[0] for f in files)
    assert ra.n_clipped == rb.n_clipped == 1
    # the shipped trace holds the same records for these conversations
    shipped = {c.conversation_id: c for c in load_trace(Path(__file__).resolve().parents[1] / "traces" / "swebench_verified_mini_gemini3pro.jsonl.gz")}
    for c in ra.conversations:
        assert shipped[c.conversation_id] == c


def test_convert_duplicate_ids(tmp_path):
    data = _mini_fixture(["a", "b"], [1, 2], [1, 1])
    for name in ("x.traj.json", "y.traj.json"):
        (tmp_path / name).write_text(json.dumps(data))
    with pytest.raises(cv.ConvertError, match="conversation id 'fix__bug-1' comes from both"):
        cv.convert("mini-swe-agent", [tmp_path], tmp_path / "o.jsonl", jobs=1, progress=False)
    with pytest.raises(cv.ConvertError, match="no such file or directory"):
        cv.convert("mini-swe-agent", [tmp_path / "missing"], tmp_path / "o.jsonl", jobs=1, progress=False)


def test_swe_agent_phantom_context_window_exit_dropped(tok, tmp_path):
    """SWE-agent appends a synthetic step when the next query exceeds the context window: 5 steps,
    4 API calls (``api_calls`` = steps - 1), last step "Exit due to context window". The converter
    must give the 4 served calls only, the 4th becoming the visible one with no tool time after it."""
    data = _swe_fixture()
    last = data["trajectory"][-1]
    # the query that did not fit: the whole history after step 3 (with its observation)
    phantom = {"action": "exit_context", "observation": "", "response": "Exit due to context window",
               "thought": "Exit due to context window", "execution_time": 0.0, "state": {},
               "messages": last["messages"], "extra_info": {}}
    data["trajectory"][-1] = {**last, "execution_time": 3.0}
    data["trajectory"].append(phantom)
    data["info"] = {"exit_status": "submitted (exit_context)", "model_stats": {"api_calls": 4}}
    assert len(data["trajectory"]) == 5
    path = tmp_path / "repo__issue-42.traj"
    path.write_text(json.dumps(data))
    conv, _ = cv.convert_file(path, "swe-agent", cv.TokenCounter(tok))
    assert len(conv.turns) == 4
    assert [t.visible for t in conv.turns] == [False, False, False, True]
    assert [t.tool_time_s for t in conv.turns] == [0.25, 1.5, 0.125, 0.0]
    # the same turns as the 4-step trajectory without the phantom step (computed by hand above)
    base = _swe_fixture()
    path2 = tmp_path / "base.traj"
    path2.write_text(json.dumps(base))
    conv2, _ = cv.convert_file(path2, "swe-agent", cv.TokenCounter(tok))
    assert conv.turns == conv2.turns
    assert cv.is_phantom_exit_step(phantom) and not cv.is_phantom_exit_step(last)
