"""The converter with any ``tokenizer.json`` (harness.workload.convert.load_tokenizer) and the Llama 3 chat template.

Two word-level tokenizers built here with ``tokenizers`` (whitespace split, so every word is one token and
whitespace is none) make every count a hand count:

* ChatML: ``<|im_start|>user\\nfix the bug<|im_end|>\\n`` = <|im_start|> user fix the bug <|im_end|> = 6
  tokens; the generation prompt ``<|im_start|>assistant\\n`` = 2; an output ``done the bug<|im_end|>`` = 4.
* Llama 3: ``<|start_header_id|>user<|end_header_id|>\\n\\nfix the bug<|eot_id|>`` = 7; the BOS = 1 per
  prompt; the generation prompt = 3; the output ``done the bug<|eot_id|>`` = 4.
"""

from __future__ import annotations

import json

import pytest

from harness.workload import convert as cv

WORDS = ["[UNK]", "system", "user", "assistant", "fix", "the", "bug", "done"]
CHATML = ["<|im_start|>", "<|im_end|>"]
LLAMA3 = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def word_tokenizer(path, specials):
    from tokenizers import AddedToken, Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


CALLS = [
    cv.Call((("system", "fix"), ("user", "fix the bug")), "done the bug", 2.0),
    cv.Call((("system", "fix"), ("user", "fix the bug"), ("assistant", "done the bug"), ("user", "fix")), "done",
            0.0),
]


def test_chatml_counts_by_hand(tmp_path):
    tok = cv.load_tokenizer(word_tokenizer(tmp_path / "tokenizer.json", CHATML))
    cv.check_template(tok, cv.CHAT_TEMPLATES["chatml"])
    turns, clipped = cv.calls_to_turns(CALLS, cv.TokenCounter(tok, "chatml"))
    # call 0: system 4 (<|im_start|> system fix <|im_end|>) + user 6 + generation 2 = 12; output 3 + 1
    assert (turns[0].new_input_tokens, turns[0].reused_tokens, turns[0].output_tokens) == (12, 0, 4)
    # call 1: 4 + 6 + assistant 6 + user 4 + 2 = 22; reused = system + user + the previous generation prompt
    # and output (<|im_start|> assistant done the bug <|im_end|>) = 4 + 6 + 6 = 16
    assert (turns[1].reused_tokens, turns[1].new_input_tokens, turns[1].output_tokens) == (16, 6, 2)
    assert clipped == 0 and [t.tool_time_s for t in turns] == [2.0, 0.0]


def test_llama3_counts_by_hand(tmp_path):
    tok = cv.load_tokenizer(word_tokenizer(tmp_path / "t" / "tokenizer.json", LLAMA3).parent)  # a folder
    padded = [cv.Call(tuple((r, f"  {c} ") for r, c in CALLS[0].prompt), CALLS[0].output, 2.0), CALLS[1]]
    turns, _ = cv.calls_to_turns(padded, cv.TokenCounter(tok, "llama3"))
    # call 0: BOS 1 + system 5 + user 7 (content stripped) + generation 3 = 16; output 3 + <|eot_id|>
    assert (turns[0].new_input_tokens, turns[0].reused_tokens, turns[0].output_tokens) == (16, 0, 4)
    # call 1: 1 + 5 + 7 + assistant 7 + user 5 + 3 = 28; the whole previous context (16 + 4) is reused
    assert (turns[1].reused_tokens, turns[1].new_input_tokens) == (20, 8)


def test_a_template_whose_tokens_the_tokenizer_lacks_is_refused(tmp_path):
    tok = cv.load_tokenizer(word_tokenizer(tmp_path / "tokenizer.json", LLAMA3))
    with pytest.raises(cv.ConvertError, match=r"chatml template's <\|im_start\|> is not one token"):
        cv.check_template(tok, cv.CHAT_TEMPLATES["chatml"])
    with pytest.raises(cv.ConvertError, match="tokenizer file not found"):
        cv.load_tokenizer(tmp_path / "missing.json")
    with pytest.raises(cv.ConvertError, match="--chat-template must be one of"):
        cv.TokenCounter(tok, "llama2")


def test_cli_with_a_tokenizer_json_and_with_a_model_config(tmp_path, capsys):
    from tests.test_convert import _swe_fixture
    from harness.core.trace import load_trace
    (tmp_path / "a.traj").write_text(json.dumps(_swe_fixture()))
    tj = word_tokenizer(tmp_path / "tokenizer.json", LLAMA3)
    out = tmp_path / "o.jsonl"
    assert cv.main(["swe-agent", str(tmp_path / "a.traj"), "-o", str(out), "--tokenizer", str(tj),
                    "--chat-template", "llama3", "--jobs", "1", "--no-progress", "--quiet"]) == 0
    calls = cv.swe_agent_calls(_swe_fixture(), "a")
    want, _ = cv.calls_to_turns(calls, cv.TokenCounter(cv.load_tokenizer(tj), "llama3"))
    assert load_trace(out)[0].turns == want
    # --model names the template; Llama's tokenizer.json is not shipped: a clear error, before any work
    assert cv.main(["swe-agent", str(tmp_path / "a.traj"), "-o", str(out), "--model", "llama3_1_8b",
                    "--no-progress"]) == 2
    assert "names no tokenizer" in capsys.readouterr().err
    assert cv.model_tokenizer("llama3_1_8b") == ("", "llama3")
    # the shipped Qwen BPE stays the default: --model qwen3_0_6b, the folder and nothing give the same trace
    outs = []
    for extra in ([], ["--model", "qwen3_0_6b"], ["--tokenizer", str(cv.DEFAULT_TOKENIZER_DIR)]):
        o = tmp_path / f"q{len(outs)}.jsonl"
        assert cv.main(["swe-agent", str(tmp_path / "a.traj"), "-o", str(o), "--jobs", "1", "--no-progress",
                        "--quiet", *extra]) == 0
        outs.append(o.read_bytes())
    assert outs[0] == outs[1] == outs[2]
