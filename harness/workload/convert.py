"""Convert agent trajectories (mini-swe-agent, SWE-agent) into a harness trace.

Usage::

    python -m harness.workload.convert claude-code SESSIONS... -o OUT.jsonl.gz [--pairs both|first]
        (Claude Code session traces: ``harness.workload.claude_code``)
    python -m harness.workload.convert {mini-swe-agent,swe-agent} INPUT... -o OUT.jsonl.gz \
        [--tokenizer-dir DIR | --tokenizer TOKENIZER_JSON | --model NAME] \
        [--chat-template chatml|llama3] [--max-output-tokens 8192] [--jobs N] \
        [--provider-ttft-s 1.0] [--provider-decode-tok-s 120]

INPUT may be files or directories; directories are searched recursively for
``*.traj.json.gz``, ``*.traj.json`` and ``*.traj`` (optionally ``.gz``).

Every LLM call of a trajectory becomes one :class:`harness.core.trace.TurnRecord`.
Tokens are counted with the Qwen2/Qwen2.5/Qwen3 byte-level BPE (shipped in
``traces/tokenizer/qwen2.5/``) on prompts rendered with the Qwen (ChatML) chat
template:

* each message is ``<|im_start|>{role}\\n{content}<|im_end|>\\n``;
* a call's prompt is its messages followed by the generation prompt
  ``<|im_start|>assistant\\n``;
* a call's output is the assistant content followed by ``<|im_end|>``.

``reused_tokens`` of a call is the token-level longest common prefix (LCP) of
its prompt with the previous call's context (previous prompt + previous output
clipped to ``max_output_tokens``), i.e. what a prefix-caching engine (vLLM
automatic prefix caching, SGLang RadixAttention) could serve from the KV cache
of the same conversation; ``new_input_tokens`` is the rest of the prompt. See
``traces/README.md`` for the tool-time rules of each format and the clipping
rule.

Other tokenizers: ``--tokenizer PATH`` loads any Hugging Face ``tokenizer.json`` (a file, or a folder
holding one) with ``tokenizers.Tokenizer.from_file``, and ``--chat-template`` renders the prompts with
``chatml`` (above; Qwen) or ``llama3`` (Meta's Llama 3 / 3.1 template: ``<|begin_of_text|>`` once, then per
message ``<|start_header_id|>{role}<|end_header_id|>\n\n{content, stripped}<|eot_id|>``, generation prompt
``<|start_header_id|>assistant<|end_header_id|>\n\n``, output ``{content}<|eot_id|>``; from the
``chat_template`` of meta-llama/Llama-3.1-8B-Instruct's ``tokenizer_config.json``). ``--model NAME`` takes
both from ``conf/model/NAME.yaml`` (``tokenizer``, ``chat_template``; an empty ``tokenizer`` = the shipped
Qwen BPE). Per-message counting stays exact for any tokenizer whose template boundaries are added tokens
(checked: each of the template's special tokens must encode to one id).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core.paths import shipped
from harness.core.trace import ConversationRecord, TurnRecord, write_trace

__all__ = [
    "ConvertError",
    "Call",
    "ConvertResult",
    "DEFAULT_TOKENIZER_DIR",
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "DEFAULT_PROVIDER_TTFT_S",
    "DEFAULT_PROVIDER_DECODE_TOK_S",
    "GENERATION_PROMPT",
    "QWEN2_PRETOKENIZE_REGEX",
    "QWEN2_SPECIAL_TOKENS",
    "load_qwen2_tokenizer",
    "load_tokenizer",
    "model_tokenizer",
    "check_template",
    "ChatTemplate",
    "CHAT_TEMPLATES",
    "content_text",
    "render_message",
    "render_prompt",
    "render_output",
    "TokenCounter",
    "provider_latency_s",
    "mini_swe_agent_calls",
    "swe_agent_calls",
    "calls_to_turns",
    "read_trajectory",
    "convert_file",
    "discover_inputs",
    "convert",
    "trace_statistics",
    "main",
]

#: Tokenizer files shipped with the project (Apache-2.0, see its SOURCE.md).
DEFAULT_TOKENIZER_DIR = shipped("traces/tokenizer/qwen2.5")   # the checkout's, or the installed wheel's

#: Cap on generated tokens per call (tokens). 8192 is a common ``max_tokens``
#: for agent calls (e.g. the default output cap of many OpenAI-compatible
#: agent configs), and it cuts the runaway generations of the shipped trace
#: (one mini-swe-agent call produced 64,137 Qwen tokens; the provider reported
#: 65,536 completion tokens, its hard limit).
DEFAULT_MAX_OUTPUT_TOKENS = 8192

#: Provider time to first token assumed for mini-swe-agent timing (s). An
#: assumption calibrated on the shipped trajectories: for calls with < 100
#: completion tokens the 1st percentile of the gap between consecutive
#: ``created`` stamps (model + tool + agent overhead) is 2 s, which bounds
#: TTFT + tool time from above; see traces/README.md.
DEFAULT_PROVIDER_TTFT_S = 1.0

#: Provider decode rate assumed for mini-swe-agent timing (tokens/s). Public
#: figure: BridgeBench SpeedBench measured ~122 tok/s median output throughput
#: for google/gemini-3.1-pro-preview (the successor of the Gemini 3 Pro
#: preview in the trajectories); consistent with the trajectories themselves,
#: whose 65,536-token runaway call took 587 s (112 tok/s end to end).
DEFAULT_PROVIDER_DECODE_TOK_S = 120.0

#: Pre-tokenizer regex of Qwen2 / Qwen2.5 / Qwen3 (from their tokenizer.json).
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: The special tokens of the Qwen2 tokenizer and their ids.
QWEN2_SPECIAL_TOKENS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
#: Appended after the prompt's messages (``add_generation_prompt=True``).
GENERATION_PROMPT = IM_START + "assistant\n"

Message = tuple[str, str]  # (role, content)


@dataclass(frozen=True)
class ChatTemplate:
    """How a chat is rendered to text before counting tokens.

    ``message`` (a format string with ``{role}`` and ``{content}``), ``generation_prompt`` (after the
    prompt's messages), ``output_suffix`` (after the generated content), ``bos`` (once at the start of
    every prompt, "" for none), ``strip_content`` (the template trims each message's content),
    ``special_tokens`` (the boundaries that must be single added tokens of the tokenizer).
    """

    name: str
    message: str
    generation_prompt: str
    output_suffix: str
    bos: str = ""
    strip_content: bool = False
    special_tokens: tuple[str, ...] = ()

    def render_message(self, role: str, content: str) -> str:
        """One rendered message."""
        return self.message.format(role=role, content=content.strip() if self.strip_content else content)


#: The chat templates the converter renders (module docstring). ``chatml`` is the default (Qwen).
CHAT_TEMPLATES: dict[str, ChatTemplate] = {
    "chatml": ChatTemplate("chatml", "<|im_start|>{role}\n{content}<|im_end|>\n", "<|im_start|>assistant\n",
                           "<|im_end|>", special_tokens=("<|im_start|>", "<|im_end|>")),
    "llama3": ChatTemplate("llama3", "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>",
                           "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>",
                           bos="<|begin_of_text|>", strip_content=True,
                           special_tokens=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                           "<|eot_id|>")),
}
_BOS_MESSAGE: tuple[str, str] = ("\x00bos", "")  # the prompt's leading BOS as a pseudo-message (cached like one)


class ConvertError(ValueError):
    """A trajectory cannot be converted; the message names the file and the field."""


# --------------------------------------------------------------------------- tokenizer


def load_qwen2_tokenizer(tokenizer_dir: str | os.PathLike | None = None):
    """Build the exact Qwen2 tokenizer pipeline with HF ``tokenizers``.

    Pipeline (as in Qwen2's ``tokenizer.json``): NFC normalizer; pre-tokenizer
    = Split on :data:`QWEN2_PRETOKENIZE_REGEX` (behavior ``isolated``) then
    ByteLevel(add_prefix_space=False, use_regex=False); BPE model from
    ``vocab.json`` + ``merges.txt``; ByteLevel decoder; special tokens
    ``<|endoftext|>`` 151643, ``<|im_start|>`` 151644, ``<|im_end|>`` 151645.

    Args:
        tokenizer_dir: folder with ``vocab.json`` and ``merges.txt``
            (default :data:`DEFAULT_TOKENIZER_DIR`).

    Returns:
        A ``tokenizers.Tokenizer``.

    Raises:
        ConvertError: a file is missing or the special tokens do not get
            their Qwen2 ids (wrong vocabulary).
    """
    try:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
        from tokenizers.models import BPE
    except ImportError:
        raise ConvertError("the converter needs Hugging Face 'tokenizers': pip install -e '.[convert]'") from None

    d = Path(tokenizer_dir) if tokenizer_dir is not None else DEFAULT_TOKENIZER_DIR
    vocab, merges = d / "vocab.json", d / "merges.txt"
    for f in (vocab, merges):
        if not f.is_file():
            raise ConvertError(f"{f}: tokenizer file not found (--tokenizer-dir {d})")
    tok = Tokenizer(BPE.from_file(str(vocab), str(merges)))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(s, special=True, normalized=False) for s in QWEN2_SPECIAL_TOKENS]
    )
    for s, want in QWEN2_SPECIAL_TOKENS.items():
        got = tok.token_to_id(s)
        if got != want:
            raise ConvertError(f"{d}: special token {s} got id {got}, expected {want}")
    return tok


def load_tokenizer(spec: str | os.PathLike | None = None):
    """A ``tokenizers.Tokenizer`` from ``spec``: None / ``""`` (the shipped Qwen2 BPE,
    :func:`load_qwen2_tokenizer`), a ``tokenizer.json`` file or a folder holding one
    (``Tokenizer.from_file``), or a folder with ``vocab.json`` + ``merges.txt`` (the Qwen2 pipeline on them).

    Raises:
        ConvertError: nothing loadable at ``spec``, or ``tokenizers`` rejects the file.
    """
    if spec is None or str(spec) == "":
        return load_qwen2_tokenizer()
    p = Path(spec)
    if p.is_dir() and not (p / "tokenizer.json").is_file():
        return load_qwen2_tokenizer(p)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise ConvertError(f"{f}: tokenizer file not found (--tokenizer / model.tokenizer)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConvertError("the converter needs Hugging Face 'tokenizers': pip install -e '.[convert]'") from None
    try:
        return Tokenizer.from_file(str(f))
    except Exception as e:  # tokenizers raises its own Exception type
        raise ConvertError(f"{f}: not a tokenizer.json ({e})") from None


def model_tokenizer(model: str) -> tuple[str, str]:
    """``(tokenizer, chat_template)`` named by ``conf/model/<model>.yaml`` (``tokenizer``: a path, relative
    to the project root unless absolute, or "" for the shipped Qwen BPE; ``chat_template``, default chatml).

    Raises:
        ConvertError: no such model config.
    """
    from harness.core.paths import PROJECT_ROOT as root
    f = root / "conf" / "model" / f"{model}.yaml"
    if not f.is_file():
        names = ", ".join(sorted(x.stem for x in (root / "conf" / "model").glob("*.yaml")))
        raise ConvertError(f"--model {model!r}: no conf/model/{model}.yaml (choose: {names})")
    from omegaconf import OmegaConf
    d = OmegaConf.to_container(OmegaConf.load(f))
    tok = str(d.get("tokenizer") or "")
    if tok and not Path(tok).is_absolute():
        tok = str(root / tok)
    return tok, str(d.get("chat_template") or "chatml")


def check_template(tok, template: ChatTemplate, where: str = "tokenizer") -> None:
    """Every special token of ``template`` must be one added token of ``tok`` (so that per-message counting
    is exact and the boundaries are counted as the model sees them).

    Raises:
        ConvertError: naming the token and ``--chat-template``.
    """
    for s in template.special_tokens:
        got = tok.encode(s, add_special_tokens=False).ids
        if len(got) != 1 or tok.token_to_id(s) is None:
            raise ConvertError(f"{where}: the {template.name} template's {s} is not one token of this tokenizer "
                               f"(got {len(got)} ids); choose --chat-template (one of {', '.join(CHAT_TEMPLATES)})")


# --------------------------------------------------------------------------- rendering


def content_text(content: object, where: str = "content") -> str:
    """The text of an OpenAI-style message ``content``.

    Accepts a string, ``None`` (empty) or a list of ``{"type": "text",
    "text": ...}`` parts (concatenated without separator).

    Raises:
        ConvertError: any other type, or a non-text part.
    """
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(
                part.get("text"), str
            ):
                texts.append(part["text"])
            else:
                raise ConvertError(f"{where}[{j}]: only text parts are supported, got {part!r:.80}")
        return "".join(texts)
    raise ConvertError(f"{where}: must be a string or a list of text parts, got {type(content).__name__}")


def render_message(role: str, content: str) -> str:
    """One message in the Qwen chat template: ``<|im_start|>{role}\\n{content}<|im_end|>\\n``."""
    return f"{IM_START}{role}\n{content}{IM_END}\n"


def render_prompt(messages: Iterable[Message]) -> str:
    """A call's full prompt text: the rendered messages + ``<|im_start|>assistant\\n``."""
    return "".join(render_message(r, c) for r, c in messages) + GENERATION_PROMPT


def render_output(content: str) -> str:
    """A call's generated text: the assistant content + ``<|im_end|>``."""
    return content + IM_END


class TokenCounter:
    """Token ids of rendered messages and outputs, cached per message.

    Tokenizing message by message is exact: every rendered message starts
    with the special token ``<|im_start|>`` and ends with ``<|im_end|>\\n``,
    and special tokens split the text before pre-tokenization, so no BPE
    merge or pre-token crosses a message boundary. The sum over messages
    equals tokenizing the whole rendered prompt (checked in the tests).
    """

    def __init__(self, tokenizer, template: ChatTemplate | str = "chatml") -> None:
        self._tok = tokenizer
        if isinstance(template, str):
            if template not in CHAT_TEMPLATES:
                raise ConvertError(f"--chat-template must be one of {', '.join(CHAT_TEMPLATES)}, got {template!r}")
            template = CHAT_TEMPLATES[template]
        self.template = template
        self._cache: dict[Message, list[int]] = {}
        self.generation_prompt_ids: list[int] = self.text_ids(template.generation_prompt)

    def prompt_messages(self, messages: tuple[Message, ...]) -> tuple[Message, ...]:
        """The messages of a prompt as counted: with the template's BOS as a leading pseudo-message."""
        return ((_BOS_MESSAGE,) + tuple(messages)) if self.template.bos else tuple(messages)

    def output_ids(self, content: str) -> list[int]:
        """Token ids of a call's generated text (content + the template's end-of-turn token)."""
        return self.text_ids(content + self.template.output_suffix)

    def text_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens recognized, none added)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def message_ids(self, message: Message) -> list[int]:
        """Token ids of one rendered message (cached by ``(role, content)``)."""
        ids = self._cache.get(message)
        if ids is None:
            text = self.template.bos if message == _BOS_MESSAGE else self.template.render_message(*message)
            ids = self.text_ids(text)
            self._cache[message] = ids
        return ids

    def clear(self) -> None:
        """Drop the cache (call between conversations to bound memory)."""
        self._cache.clear()


# --------------------------------------------------------------------------- trajectories


@dataclass(frozen=True, slots=True)
class Call:
    """One LLM call extracted from a trajectory, before tokenization.

    Attributes:
        prompt: the messages sent, as ``(role, content)`` in order.
        output: the assistant content generated (without ``<|im_end|>``).
        tool_time_s: tool / environment time after this call before the next
            call is sent (s); 0.0 for the last call.
    """

    prompt: tuple[Message, ...]
    output: str
    tool_time_s: float


def provider_latency_s(completion_tokens: int, ttft_s: float, decode_tok_s: float) -> float:
    """Estimated end-to-end provider latency of one call (s).

    ``ttft_s + completion_tokens / decode_tok_s``; ``completion_tokens`` is the
    provider's usage count (tokens, reasoning included), ``decode_tok_s`` in
    tokens/s.
    """
    return ttft_s + completion_tokens / decode_tok_s


def _get(obj: object, key: str, where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise ConvertError(f"{where}: missing key {key!r}")
    return obj[key]


def mini_swe_agent_calls(
    data: dict,
    where: str,
    *,
    provider_ttft_s: float = DEFAULT_PROVIDER_TTFT_S,
    provider_decode_tok_s: float = DEFAULT_PROVIDER_DECODE_TOK_S,
) -> list[Call]:
    """Calls of a mini-swe-agent trajectory (``trajectory_format: "mini-swe-agent-1"``).

    ``messages`` is append-only; each assistant message is one call whose
    prompt is every message before it. Messages after the last assistant
    message (the submitted diff) were never sent to the model and are dropped.

    Tool time: the only clock is ``extra.response.created`` (Unix s, 1 s
    resolution, stamped when the provider receives the request), so
    ``tool_time_s(k) = max(0, created(k+1) - created(k) - latency(k))`` with
    ``latency(k) = provider_ttft_s + completion_tokens(k) / provider_decode_tok_s``
    (:func:`provider_latency_s`; ``completion_tokens`` from
    ``extra.response.usage``), rounded to 1 ms; 0.0 for the last call.

    Raises:
        ConvertError: wrong format, no assistant message, or a missing
            ``created`` / ``usage.completion_tokens``.
    """
    fmt = data.get("trajectory_format")
    if fmt != "mini-swe-agent-1":
        raise ConvertError(f"{where}: trajectory_format must be 'mini-swe-agent-1', got {fmt!r}")
    raw = _get(data, "messages", where)
    if not isinstance(raw, list):
        raise ConvertError(f"{where}: messages must be a list")
    messages: list[Message] = []
    for j, m in enumerate(raw):
        w = f"{where}: messages[{j}]"
        role = _get(m, "role", w)
        if not isinstance(role, str):
            raise ConvertError(f"{w}.role must be a string, got {role!r}")
        messages.append((role, content_text(m.get("content"), f"{w}.content")))
    assistant = [j for j, (role, _) in enumerate(messages) if role == "assistant"]
    if not assistant:
        raise ConvertError(f"{where}: messages: no assistant message (no model call)")

    created, completion = [], []
    for j in assistant:
        w = f"{where}: messages[{j}].extra.response"
        resp = _get(_get(raw[j], "extra", f"{where}: messages[{j}]"), "response", f"{where}: messages[{j}].extra")
        c = _get(resp, "created", w)
        usage = _get(resp, "usage", w)
        n = _get(usage, "completion_tokens", f"{w}.usage")
        if not isinstance(c, (int, float)) or isinstance(c, bool):
            raise ConvertError(f"{w}.created must be a number, got {c!r}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ConvertError(f"{w}.usage.completion_tokens must be an int >= 0, got {n!r}")
        created.append(float(c))
        completion.append(n)

    calls = []
    for k, j in enumerate(assistant):
        if k + 1 < len(assistant):
            gap = created[k + 1] - created[k]
            latency = provider_latency_s(completion[k], provider_ttft_s, provider_decode_tok_s)
            tool = round(max(0.0, gap - latency), 3)
        else:
            tool = 0.0
        calls.append(Call(tuple(messages[:j]), messages[j][1], tool))
    return calls


def _swe_messages(raw: object, where: str) -> tuple[Message, ...]:
    if not isinstance(raw, list):
        raise ConvertError(f"{where}: must be a list of messages")
    out = []
    for j, m in enumerate(raw):
        role = _get(m, "role", f"{where}[{j}]")
        if not isinstance(role, str):
            raise ConvertError(f"{where}[{j}].role must be a string, got {role!r}")
        out.append((role, content_text(m.get("content"), f"{where}[{j}].content")))
    return tuple(out)


PHANTOM_EXIT_TEXT = "Exit due to context window"


def is_phantom_exit_step(step: object) -> bool:
    """Whether a SWE-agent trajectory step is the synthetic context-window exit, not a model call.

    When the query for the next call exceeds the model's context window, SWE-agent 1.0
    (``sweagent/agent/agents.py``: ``except ContextWindowExceededError`` ->
    ``handle_error_with_autosubmission("exit_context", "Exit due to context window")``) appends a
    step whose ``thought`` and ``response`` are that message and autosubmits; the model never
    served that query (it is not counted in ``info.model_stats.api_calls``, which then equals the
    number of steps - 1). Its prompt, the query that did not fit, must not be replayed.

    Returns True when the step's ``response`` or ``thought`` starts with
    ``"Exit due to context window"``.
    """
    if not isinstance(step, dict):
        return False
    for key in ("response", "thought"):
        v = step.get(key)
        if isinstance(v, str) and v.strip().startswith(PHANTOM_EXIT_TEXT):
            return True
    return False


def swe_agent_calls(data: dict, where: str) -> list[Call]:
    """Calls of a SWE-agent 1.0 ``.traj`` trajectory.

    Call ``i``'s prompt is ``trajectory[i].query`` when present (later
    SWE-agent versions), else ``history[:2]`` for ``i = 0`` and
    ``trajectory[i-1].messages`` (the history after step ``i-1`` with the
    history processors applied) for ``i > 0``. Its output is
    ``trajectory[i].response``, or, when that is absent, the last assistant
    message of ``trajectory[i].messages``. Tool time is
    ``trajectory[i].execution_time`` (s); 0.0 for the last call. The history
    processors (e.g. ``last_n_observations``) rewrite old observations, so the
    prompts are not append-only; :func:`calls_to_turns` handles that through
    the token-level common prefix. Model calls that are not trajectory steps
    (re-queries after format errors) are not in the file and are not counted.

    A final step that SWE-agent synthesised after the model's context window
    was exceeded (:func:`is_phantom_exit_step`) is not a model call and is
    dropped: the previous step becomes the last (visible) call.

    Raises:
        ConvertError: missing ``trajectory`` / ``history``, an empty
            trajectory, or an unusable step.
    """
    traj = _get(data, "trajectory", where)
    history = _get(data, "history", where)
    if not isinstance(traj, list) or not traj:
        raise ConvertError(f"{where}: trajectory must be a non-empty list of steps")
    if not isinstance(history, list) or len(history) < 2:
        raise ConvertError(f"{where}: history must be a list with the system prompt and the task")
    if len(traj) > 1 and is_phantom_exit_step(traj[-1]):
        traj = traj[:-1]  # the previous (served) call becomes the last, visible one
    calls = []
    for i, step in enumerate(traj):
        w = f"{where}: trajectory[{i}]"
        if not isinstance(step, dict):
            raise ConvertError(f"{w}: must be an object")
        if isinstance(step.get("query"), list) and step["query"]:
            prompt = _swe_messages(step["query"], f"{w}.query")
        elif i == 0:
            prompt = _swe_messages(history[:2], f"{where}: history")
        else:
            prompt = _swe_messages(
                _get(traj[i - 1], "messages", f"{where}: trajectory[{i - 1}]"),
                f"{where}: trajectory[{i - 1}].messages",
            )
        response = step.get("response")
        if isinstance(response, str):
            output = response
        else:
            msgs = _swe_messages(_get(step, "messages", w), f"{w}.messages")
            outs = [c for r, c in msgs if r == "assistant"]
            if not outs:
                raise ConvertError(f"{w}: no response and no assistant message")
            output = outs[-1]
        if i + 1 < len(traj):
            t = step.get("execution_time", 0.0)
            if t is None:
                t = 0.0
            if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
                raise ConvertError(f"{w}.execution_time must be a number, got {t!r}")
            tool = round(max(0.0, float(t)), 6)
        else:
            tool = 0.0
        calls.append(Call(prompt, output, tool))
    return calls


# --------------------------------------------------------------------------- token accounting


def _token_lcp(a_parts: Sequence[Sequence[int]], b_parts: Sequence[Sequence[int]]) -> int:
    """Length of the common prefix of two token streams given as lists of parts."""
    total = 0
    ai = bi = a_off = b_off = 0
    while ai < len(a_parts) and bi < len(b_parts):
        a, b = a_parts[ai], b_parts[bi]
        n = min(len(a) - a_off, len(b) - b_off)
        if a[a_off : a_off + n] == b[b_off : b_off + n]:
            total += n
            a_off += n
            b_off += n
        else:
            for j in range(n):
                if a[a_off + j] != b[b_off + j]:
                    return total + j
        if a_off == len(a):
            ai, a_off = ai + 1, 0
        if b_off == len(b):
            bi, b_off = bi + 1, 0
    return total


def calls_to_turns(
    calls: Sequence[Call],
    counter: TokenCounter,
    *,
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
) -> tuple[tuple[TurnRecord, ...], int]:
    """Token accounting of a conversation's calls.

    For call ``k``: ``prompt_tokens`` = tokens of the rendered prompt;
    ``output_tokens_raw`` = tokens of ``output + <|im_end|>``;
    ``output_tokens = min(raw, max_output_tokens)``; ``reused_tokens`` = the
    longest common token prefix of prompt(k) and prompt(k-1) + clipped
    output(k-1) (compared message by message, then token by token inside the
    first differing message), at most ``prompt_tokens - 1`` so that every call
    prefills at least one token (as a serving engine recomputes at least the
    last prompt token); ``new_input_tokens = prompt_tokens - reused_tokens``.
    Clipping models a model stopped at ``max_tokens``: the next call reuses at
    most the clipped context, and the rest of the original assistant message
    (still in the next prompt) becomes new input. Only the last call is
    visible.

    Returns:
        ``(turns, n_clipped)`` where ``n_clipped`` counts calls with raw
        output above ``max_output_tokens``.

    Raises:
        ConvertError: ``calls`` is empty or ``max_output_tokens < 1``.
    """
    if not calls:
        raise ConvertError("a conversation needs at least one call")
    if max_output_tokens < 1:
        raise ConvertError(f"max_output_tokens must be >= 1, got {max_output_tokens}")
    gen = counter.generation_prompt_ids
    turns = []
    n_clipped = 0
    prev_msgs: tuple[Message, ...] = ()
    prev_ids: list[list[int]] = []
    prev_out: list[int] = []
    last = len(calls) - 1
    for k, call in enumerate(calls):
        prompt = counter.prompt_messages(call.prompt)
        ids = [counter.message_ids(m) for m in prompt]
        prompt_tokens = sum(map(len, ids)) + len(gen)
        out_ids = counter.output_ids(call.output)
        raw = len(out_ids)
        out = min(raw, max_output_tokens)
        n_clipped += raw > out
        if k == 0:
            reused = 0
        else:
            i = reused = 0
            n = min(len(prev_msgs), len(prompt))
            while i < n and prev_msgs[i] == prompt[i]:
                reused += len(ids[i])
                i += 1
            reused += _token_lcp(prev_ids[i:] + [gen, prev_out], ids[i:] + [gen])
            reused = min(reused, prompt_tokens - 1)
        turns.append(
            TurnRecord(
                new_input_tokens=prompt_tokens - reused,
                reused_tokens=reused,
                output_tokens=out,
                tool_time_s=0.0 if k == last else float(call.tool_time_s),
                visible=k == last,
                output_tokens_raw=raw,
            )
        )
        prev_msgs, prev_ids, prev_out = prompt, ids, out_ids[:out]
    return tuple(turns), n_clipped


# --------------------------------------------------------------------------- files

FORMATS = ("mini-swe-agent", "swe-agent")
_SUFFIXES = (".traj.json.gz", ".traj.json", ".traj.gz", ".traj")


def read_trajectory(path: str | os.PathLike) -> dict:
    """Parse a trajectory file (JSON; gzip-compressed when the name ends in ``.gz``).

    Raises:
        ConvertError: the file is missing, unreadable or not a JSON object.
    """
    p = os.fspath(path)
    try:
        opener = gzip.open if p.endswith(".gz") else open
        with opener(p, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{p}: file not found") from None
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{p}: cannot read trajectory: {e}") from e
    if not isinstance(data, dict):
        raise ConvertError(f"{p}: a trajectory must be a JSON object, got {type(data).__name__}")
    return data


def _default_id(path: str | os.PathLike) -> str:
    name = Path(path).name
    for s in _SUFFIXES + (".json.gz", ".json", ".gz"):
        if name.endswith(s):
            return name[: -len(s)]
    return name


def convert_file(
    path: str | os.PathLike,
    fmt: str,
    counter: TokenCounter,
    *,
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
    provider_ttft_s: float = DEFAULT_PROVIDER_TTFT_S,
    provider_decode_tok_s: float = DEFAULT_PROVIDER_DECODE_TOK_S,
) -> tuple[ConversationRecord, int]:
    """Convert one trajectory file to a conversation.

    The conversation id is the mini-swe-agent ``instance_id`` (else the file
    name without its suffix); ``source`` is ``"mini-swe-agent-1"`` or
    ``"swe-agent"``.

    Returns:
        ``(conversation, n_clipped)``.

    Raises:
        ConvertError: unknown format or an unusable file.
    """
    p = os.fspath(path)
    data = read_trajectory(p)
    if fmt == "mini-swe-agent":
        calls = mini_swe_agent_calls(
            data, p, provider_ttft_s=provider_ttft_s, provider_decode_tok_s=provider_decode_tok_s
        )
        cid = data.get("instance_id") if isinstance(data.get("instance_id"), str) else None
        cid = cid or _default_id(p)
        source = "mini-swe-agent-1"
    elif fmt == "swe-agent":
        calls = swe_agent_calls(data, p)
        cid = _default_id(p)
        source = "swe-agent"
    else:
        raise ConvertError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    try:
        turns, n_clipped = calls_to_turns(calls, counter, max_output_tokens=max_output_tokens)
    finally:
        counter.clear()
    return ConversationRecord(cid, turns, source), n_clipped


def discover_inputs(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """Expand files and directories into trajectory files.

    Directories are searched recursively for ``*.traj.json.gz``,
    ``*.traj.json``, ``*.traj.gz`` and ``*.traj``; files are taken as given.
    Returns them sorted and without duplicates.

    Raises:
        ConvertError: an input does not exist, or nothing was found.
    """
    found: set[Path] = set()
    for inp in inputs:
        p = Path(inp)
        if p.is_dir():
            for f in p.rglob("*"):
                if f.is_file() and f.name.endswith(_SUFFIXES):
                    found.add(f)
        elif p.is_file():
            found.add(p)
        else:
            raise ConvertError(f"{p}: no such file or directory")
    if not found:
        raise ConvertError("no trajectory files found in: " + ", ".join(map(str, inputs)))
    return sorted(found)


@dataclass(frozen=True, slots=True)
class ConvertResult:
    """Outcome of :func:`convert`.

    Attributes:
        conversations: sorted by ``conversation_id``.
        n_clipped: calls whose output was clipped to ``max_output_tokens``.
        wall_s: conversion wall time (s), writing included.
    """

    conversations: tuple[ConversationRecord, ...]
    n_clipped: int
    wall_s: float


_WORKER_COUNTER: TokenCounter | None = None


def _init_worker(tokenizer_dir: str | None, template: str = "chatml") -> None:
    global _WORKER_COUNTER
    tok = load_tokenizer(tokenizer_dir)
    check_template(tok, CHAT_TEMPLATES[template], str(tokenizer_dir or DEFAULT_TOKENIZER_DIR))
    _WORKER_COUNTER = TokenCounter(tok, template)


def _convert_in_worker(args: tuple) -> tuple[ConversationRecord, int, str]:
    path, fmt, kw = args
    assert _WORKER_COUNTER is not None
    conv, n = convert_file(path, fmt, _WORKER_COUNTER, **kw)
    return conv, n, path


def _progress(iterable, total: int, enabled: bool):
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:  # progress bar is optional
        return iterable
    return tqdm(iterable, total=total, unit="traj", desc="converting", file=sys.stderr)


def convert(
    fmt: str,
    inputs: Iterable[str | os.PathLike],
    out: str | os.PathLike,
    *,
    tokenizer_dir: str | os.PathLike | None = None,
    chat_template: str = "chatml",
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
    jobs: int | None = None,
    provider_ttft_s: float = DEFAULT_PROVIDER_TTFT_S,
    provider_decode_tok_s: float = DEFAULT_PROVIDER_DECODE_TOK_S,
    progress: bool = True,
) -> ConvertResult:
    """Convert trajectory files into one trace file (see :func:`harness.core.trace.write_trace`).

    Files are converted in ``jobs`` worker processes (default
    ``os.cpu_count()``), largest first; the conversations are sorted by
    ``conversation_id``, so the output is byte-identical for any ``jobs``.
    ``tokenizer_dir``: anything :func:`load_tokenizer` takes (default: the shipped Qwen BPE);
    ``chat_template``: a key of :data:`CHAT_TEMPLATES`.

    Raises:
        ConvertError: bad arguments, an unusable file, or two files with the
            same conversation id.
        harness.core.trace.TraceError: the result violates the trace schema
            (should not happen).
    """
    if fmt not in FORMATS:
        raise ConvertError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if max_output_tokens < 1:
        raise ConvertError(f"--max-output-tokens must be >= 1, got {max_output_tokens}")
    if chat_template not in CHAT_TEMPLATES:
        raise ConvertError(f"--chat-template must be one of {', '.join(CHAT_TEMPLATES)}, got {chat_template!r}")
    tdir = None if tokenizer_dir is None else str(tokenizer_dir)
    _init_worker(tdir, chat_template)  # load and check the tokenizer here, before any worker starts
    if provider_decode_tok_s <= 0 or provider_ttft_s < 0:
        raise ConvertError("--provider-decode-tok-s must be > 0 and --provider-ttft-s >= 0")
    t0 = time.perf_counter()
    files = discover_inputs(inputs)
    files.sort(key=lambda f: (-f.stat().st_size, str(f)))  # largest first: better balance
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(files)))
    kw = dict(
        max_output_tokens=max_output_tokens,
        provider_ttft_s=provider_ttft_s,
        provider_decode_tok_s=provider_decode_tok_s,
    )
    tasks = [(str(f), fmt, kw) for f in files]
    results = []
    if jobs == 1:
        for task in _progress(tasks, len(tasks), progress):
            results.append(_convert_in_worker(task))
    else:
        with multiprocessing.Pool(jobs, initializer=_init_worker, initargs=(tdir, chat_template)) as pool:
            it = pool.imap_unordered(_convert_in_worker, tasks, chunksize=1)
            for r in _progress(it, len(tasks), progress):
                results.append(r)
    results.sort(key=lambda r: r[0].conversation_id)
    for a, b in zip(results, results[1:]):
        if a[0].conversation_id == b[0].conversation_id:
            raise ConvertError(
                f"conversation id {a[0].conversation_id!r} comes from both {a[2]} and {b[2]}"
            )
    conversations = tuple(r[0] for r in results)
    write_trace(out, conversations)
    return ConvertResult(conversations, sum(r[1] for r in results), time.perf_counter() - t0)


# --------------------------------------------------------------------------- statistics


def _quantile(sorted_vals: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default method) of sorted values."""
    if not sorted_vals:
        return float("nan")
    pos = (len(sorted_vals) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def trace_statistics(conversations: Sequence[ConversationRecord], max_output_tokens: int | None = None) -> str:
    """A Markdown table of a trace's per-turn statistics (min / median / p95 / max).

    Rows: turns per conversation; per-turn new input, reused and prompt tokens,
    output tokens (clipped and raw) and tool time (s; over all turns but the
    last of each conversation, whose tool time is 0 by definition); context at
    the last call; and counts of conversations, turns and clipped turns.
    """
    turns = [t for c in conversations for t in c.turns]
    rows = [
        ("turns per conversation", [len(c.turns) for c in conversations]),
        ("new_input_tokens per turn", [t.new_input_tokens for t in turns]),
        ("reused_tokens per turn", [t.reused_tokens for t in turns]),
        ("prompt_tokens per turn", [t.prompt_tokens for t in turns]),
        ("output_tokens per turn (clipped)", [t.output_tokens for t in turns]),
        ("output_tokens_raw per turn", [t.output_tokens_raw for t in turns]),
        ("tool_time_s per turn (all but last)", [t.tool_time_s for c in conversations for t in c.turns[:-1]]),
        (
            "context at last call (prompt + output), tokens",
            [c.turns[-1].prompt_tokens + c.turns[-1].output_tokens for c in conversations],
        ),
    ]

    def fmt(v: float, is_float: bool) -> str:
        return f"{v:.2f}" if is_float else (f"{v:.0f}" if v == int(v) else f"{v:.1f}")

    lines = ["| metric | n | min | median | p95 | max |", "|---|---|---|---|---|---|"]
    for name, vals in rows:
        s = sorted(vals)
        is_float = "_s " in name
        qs = [s[0], _quantile(s, 0.5), _quantile(s, 0.95), s[-1]]
        lines.append(f"| {name} | {len(s)} | " + " | ".join(fmt(v, is_float) for v in qs) + " |")
    n_clip = sum(t.output_tokens_raw > t.output_tokens for t in turns)
    n_zero = sum(t.tool_time_s == 0 for c in conversations for t in c.turns[:-1])
    n_tool = sum(len(c.turns) - 1 for c in conversations)
    cap = f" > {max_output_tokens}" if max_output_tokens else ""
    lines += [
        "",
        f"- conversations: {len(conversations)}; turns: {len(turns)}; "
        f"visible turns: {sum(t.visible for t in turns)}",
        f"- turns clipped (output_tokens_raw{cap}): {n_clip}",
        f"- turns with tool_time_s = 0 (all but last): {n_zero} of {n_tool}",
        f"- total tokens: new input {sum(t.new_input_tokens for t in turns)}, "
        f"reused {sum(t.reused_tokens for t in turns)}, output {sum(t.output_tokens for t in turns)}",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 ok, 2 bad input). ``claude-code`` (Claude Code
    session traces) has its own options: :func:`harness.workload.claude_code.main`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "claude-code":
        from harness.workload.claude_code import main as claude_code_main
        return claude_code_main(argv[1:])
    ap = argparse.ArgumentParser(
        prog="python -m harness.workload.convert",
        description="Convert agent trajectories into a harness trace (JSON Lines, gzip by .gz). Claude Code "
                    "session traces: python -m harness.workload.convert claude-code --help.",
        epilog="Exit status: 0 written; 2 bad input (a missing or malformed trajectory, a bad argument).",
    )
    ap.add_argument("format", choices=FORMATS, help="trajectory format")
    ap.add_argument("inputs", nargs="+", metavar="INPUT", help="trajectory files or directories")
    ap.add_argument("-o", "--output", required=True, help="output trace, e.g. traces/x.jsonl.gz")
    ap.add_argument(
        "--tokenizer-dir",
        default=None,
        help=f"folder with vocab.json and merges.txt (default {DEFAULT_TOKENIZER_DIR})",
    )
    ap.add_argument(
        "--tokenizer",
        default=None,
        help="a Hugging Face tokenizer.json (file or folder) to count with, e.g. Llama 3's",
    )
    ap.add_argument(
        "--model",
        default=None,
        help="take tokenizer and chat_template from conf/model/MODEL.yaml (e.g. llama3_1_8b)",
    )
    ap.add_argument(
        "--chat-template",
        default=None,
        choices=sorted(CHAT_TEMPLATES),
        help="prompt rendering (default: the model's, else chatml)",
    )
    ap.add_argument(
        "--max-output-tokens",
        type=int,
        default=DEFAULT_MAX_OUTPUT_TOKENS,
        help="clip generated tokens per call to this (tokens; default %(default)s)",
    )
    ap.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPU count)")
    ap.add_argument(
        "--provider-ttft-s",
        type=float,
        default=DEFAULT_PROVIDER_TTFT_S,
        help="mini-swe-agent: assumed provider TTFT (s; default %(default)s)",
    )
    ap.add_argument(
        "--provider-decode-tok-s",
        type=float,
        default=DEFAULT_PROVIDER_DECODE_TOK_S,
        help="mini-swe-agent: assumed provider decode rate (tokens/s; default %(default)s)",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--quiet", action="store_true", help="do not print the statistics table")
    args = ap.parse_args(argv)
    try:
        if args.tokenizer and args.tokenizer_dir:
            raise ConvertError("give --tokenizer or --tokenizer-dir, not both")
        tokenizer, template = args.tokenizer or args.tokenizer_dir, "chatml"
        if args.model:
            m_tok, template = model_tokenizer(args.model)
            tokenizer = tokenizer or m_tok or None
            if template != "chatml" and not tokenizer:
                raise ConvertError(f"conf/model/{args.model}.yaml names no tokenizer (its chat_template is "
                                   f"{template}): pass --tokenizer path/to/tokenizer.json or set model.tokenizer")
        template = args.chat_template or template
        result = convert(
            args.format,
            args.inputs,
            args.output,
            tokenizer_dir=tokenizer,
            chat_template=template,
            max_output_tokens=args.max_output_tokens,
            jobs=args.jobs,
            provider_ttft_s=args.provider_ttft_s,
            provider_decode_tok_s=args.provider_decode_tok_s,
            progress=not args.no_progress,
        )
    except ValueError as e:  # ConvertError, TraceError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"wrote {args.output}: {len(result.conversations)} conversations, "
        f"{sum(len(c.turns) for c in result.conversations)} turns, "
        f"{result.n_clipped} clipped, {result.wall_s:.1f} s",
        file=sys.stderr,
    )
    if not args.quiet:
        print(trace_statistics(result.conversations, args.max_output_tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
