"""Agentic conversation traces: schema, loader/validator and writer.

A trace is a list of multi-turn agent conversations. Each turn is one LLM call
(one prefill of the prompt plus one decode of the output) followed by a tool
/ environment step whose duration is ``tool_time_s``. The token counts are
what a serving engine with prefix caching would see:

* ``reused_tokens`` -- the longest token prefix of this call's prompt that
  equals a prefix of the previous call's context (previous prompt + previous
  output), i.e. the part of the prompt whose KV cache the engine could keep
  from the previous call of the same conversation;
* ``new_input_tokens`` -- the rest of the prompt, which must be prefilled
  even with a perfect prefix cache;
* ``output_tokens`` -- generated (decoded) tokens.

On disk a trace is JSON Lines (gzip-compressed when the name ends in
``.gz``), one conversation per line::

    {"conversation_id": str, "source": str,
     "turns": [{"new_input_tokens": int, "reused_tokens": int,
                "output_tokens": int, "output_tokens_raw": int,
                "tool_time_s": float, "visible": bool}, ...]}

``traces/README.md`` documents the schema, its invariants and how the shipped
trace was produced (``harness.workload.convert``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

__all__ = [
    "TurnRecord",
    "ConversationRecord",
    "TraceError",
    "load_trace",
    "write_trace",
    "dumps_conversation",
    "HASH_BLOCK_TOKENS",
    "check_families",
    "TIMINGS",
]


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One LLM call of an agent conversation, followed by its tool step.

    Attributes:
        new_input_tokens: tokens appended to the context for this call, i.e.
            prompt tokens that are not a prefix of the previous call's context
            (tokens; >= 1, a call always prefills at least one token).
        reused_tokens: tokens of this call's prompt that equal a prefix of the
            previous call's context (previous prompt + previous output); the
            part a prefix-caching engine can serve from the KV cache of the
            same conversation (tokens; 0 on turn 0).
        output_tokens: generated tokens after clipping to the converter's
            ``max_output_tokens`` (tokens; >= 1).
        tool_time_s: tool / environment time after this turn's output is
            complete and before the next call is sent (s; 0.0 on the last
            turn).
        visible: whether this turn's output is user-visible, i.e. counts for
            the time to first externally visible token (TTFET).
        output_tokens_raw: generated tokens before clipping (tokens;
            >= ``output_tokens``).
        hash_ids: request traces only (``None`` otherwise): ids of the
            ``ConversationRecord.hash_block_tokens``-token blocks of this
            call's new input, in order (equal leading ids = equal token
            prefix, across conversations; see ``harness.workload.prefix``).
        user_message: session traces (Claude Code, ``harness.workload.claude_code``): this call is the
            first of an agent loop started by a new user message (turn 0 of a root conversation always
            is). Conversations without the key have one message, started by turn 0.
        model: session traces: the model the recorded call used (e.g. ``claude-opus-4-5-20251101``;
            ``None``: not recorded). Every call is served by the run's one model unless mapped.
        send_s: session traces: when the recorded call was sent, s from the start of the root session
            (children included), for ``workload.timing=original`` (``None``: not recorded).
    """

    new_input_tokens: int
    reused_tokens: int
    output_tokens: int
    tool_time_s: float
    visible: bool
    output_tokens_raw: int
    hash_ids: Optional[tuple[int, ...]] = None
    user_message: bool = False
    model: Optional[str] = None
    send_s: Optional[float] = None

    @property
    def prompt_tokens(self) -> int:
        """Prompt length of this call (tokens) = reused + new input."""
        return self.reused_tokens + self.new_input_tokens


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    """One agent conversation (e.g. one SWE-bench instance solved by an agent).

    Attributes:
        conversation_id: unique id within the trace (e.g. the instance id).
        turns: the LLM calls in order (at least one).
        source: the trajectory format it was converted from, e.g.
            ``"mini-swe-agent-1"``.
        arrival_s: request traces only: when the conversation's first call
            was sent, from the trace's ``timestamp`` (s from the trace's
            start; ``None``: the trace has no timestamps).
        hash_block_tokens: request traces only: tokens per ``hash_ids`` block
            (512 in Mooncake's traces; 0: no ``hash_ids``).
        parent_id: session traces: a child conversation (a sub-agent) names the conversation that
            spawns it (``None``: a root conversation, started by the workload's arrivals).
        spawn_after_turn: a child only: it starts when its parent's turn ``spawn_after_turn`` has
            finished (its first call is then ready after its own first ``send`` gap, see
            ``harness.core.controller``); ``-1`` for a root.
        join: a child only: the parent's next call waits until this child has finished (a sub-agent the
            parent waits for); ``False``: a background sub-agent the parent does not wait for.
    """

    conversation_id: str
    turns: tuple[TurnRecord, ...]
    source: str
    arrival_s: Optional[float] = None
    hash_block_tokens: int = 0
    parent_id: Optional[str] = None
    spawn_after_turn: int = -1
    join: bool = True

    @property
    def is_child(self) -> bool:
        """Whether this conversation is spawned by another (``parent_id`` set)."""
        return self.parent_id is not None

    def message_of(self) -> tuple[int, ...]:
        """Per turn, the 0-based index of the user message whose agent loop it belongs to (turn 0 is in
        message 0; a turn with ``user_message`` starts the next message)."""
        out, m = [], 0
        for k, t in enumerate(self.turns):
            if k and t.user_message:
                m += 1
            out.append(m)
        return tuple(out)


#: ``workload.timing``: when a conversation's next call is sent (``harness.core.controller.Controller``):
#: ``think`` (the previous response's end + the recorded think / tool time) or ``original`` (the recorded send
#: time, ``TurnRecord.send_s``, or the previous response's end if later).
TIMINGS = ("think", "original")

HASH_BLOCK_TOKENS = 512  # tokens per hash_ids block in Mooncake's FAST'25 traces (and AIPerf's default)


class TraceError(ValueError):
    """A trace file is missing, unreadable or violates the schema.

    The message names the file, the 1-based line number when the problem is
    on a line, and the offending field, e.g.
    ``traces/x.jsonl.gz:17: turns[3].output_tokens must be an int >= 1, got -2``.
    """


_CONV_KEYS = frozenset(("conversation_id", "source", "turns"))
# optional keys of a session trace (Claude Code): a conversation's parent link, a turn's message / model / time
_CONV_OPT_KEYS = frozenset(("parent_id", "spawn_after_turn", "join"))
_TURN_OPT_KEYS = frozenset(("user_message", "model", "send_s"))
_TURN_KEYS = frozenset(
    (
        "new_input_tokens",
        "reused_tokens",
        "output_tokens",
        "output_tokens_raw",
        "tool_time_s",
        "visible",
    )
)
# Fields of a turn in the order they are checked; (name, minimum) for ints.
# The largest token count one field of a trace may hold (tokens): 2^31 - 1, some 200x the longest context of
# any model (10^7 tokens), so a value above it is a corrupt or mistyped trace; it also keeps every count and
# every sum of counts over a trace well inside the int64 columns the workload and the metrics use (a larger
# Python int made numpy raise OverflowError deep in a run).
MAX_TOKENS = 2**31 - 1

_TURN_INT_FIELDS = (
    ("new_input_tokens", 1),
    ("reused_tokens", 0),
    ("output_tokens", 1),
    ("output_tokens_raw", 1),
)


def _is_gzip_path(path: str | os.PathLike) -> bool:
    return os.fspath(path).endswith(".gz")


def _keys_problem(obj: dict, expected: frozenset[str], what: str,
                  optional: frozenset[str] = frozenset()) -> str | None:
    keys = obj.keys()
    if keys == expected:
        return None
    missing = sorted(expected - keys)
    extra = sorted(keys - expected - optional)
    parts = []
    if missing:
        parts.append(f"{what} is missing key(s) {', '.join(map(repr, missing))}")
    if extra:
        parts.append(f"{what} has unexpected key(s) {', '.join(map(repr, extra))}")
    return "; ".join(parts)


def _parse_conversation(obj: object, where: str) -> ConversationRecord:
    """Validate one decoded JSON line and build its record.

    Raises:
        TraceError: with ``where`` ("file:line") and the field in the message.
    """
    if type(obj) is not dict:
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    problem = _keys_problem(obj, _CONV_KEYS, "conversation", _CONV_OPT_KEYS)
    if problem:
        raise TraceError(f"{where}: {problem}")
    cid = obj["conversation_id"]
    if type(cid) is not str or not cid:
        raise TraceError(f"{where}: conversation_id must be a non-empty string, got {cid!r}")
    source = obj["source"]
    if type(source) is not str or not source:
        raise TraceError(f"{where}: source must be a non-empty string, got {source!r}")
    raw_turns = obj["turns"]
    if type(raw_turns) is not list:
        raise TraceError(f"{where}: turns must be a list, got {type(raw_turns).__name__}")
    if not raw_turns:
        raise TraceError(f"{where}: turns must have at least one turn, got []")

    turns = []
    prev_context = 0  # prompt + output tokens of the previous turn
    any_visible = False
    last = len(raw_turns) - 1
    for k, t in enumerate(raw_turns):
        field = f"turns[{k}]"
        if type(t) is not dict:
            raise TraceError(f"{where}: {field} must be an object, got {type(t).__name__}")
        problem = _keys_problem(t, _TURN_KEYS, field, _TURN_OPT_KEYS)
        if problem:
            raise TraceError(f"{where}: {problem}")
        um, model, send = t.get("user_message", False), t.get("model"), t.get("send_s")
        if type(um) is not bool:
            raise TraceError(f"{where}: {field}.user_message must be a bool, got {um!r}")
        if model is not None and (type(model) is not str or not model):
            raise TraceError(f"{where}: {field}.model must be a non-empty string, got {model!r}")
        if send is not None and not (type(send) in (int, float) and math.isfinite(send) and send >= 0):
            raise TraceError(f"{where}: {field}.send_s must be a finite number >= 0 (s), got {send!r}")
        for name, minimum in _TURN_INT_FIELDS:
            v = t[name]
            if type(v) is not int or v < minimum:
                raise TraceError(
                    f"{where}: {field}.{name} must be an int >= {minimum}, got {v!r}"
                )
            if v > MAX_TOKENS:
                raise TraceError(f"{where}: {field}.{name} must be <= {MAX_TOKENS} (tokens), got {v!r}")
        new = t["new_input_tokens"]
        reused = t["reused_tokens"]
        out = t["output_tokens"]
        out_raw = t["output_tokens_raw"]
        if out_raw < out:
            raise TraceError(
                f"{where}: {field}.output_tokens_raw must be >= output_tokens ({out}), "
                f"got {out_raw}"
            )
        tool = t["tool_time_s"]
        if type(tool) not in (float, int) or not math.isfinite(tool) or tool < 0:
            raise TraceError(
                f"{where}: {field}.tool_time_s must be a finite number >= 0, got {tool!r}"
            )
        if k == last and tool != 0:
            raise TraceError(
                f"{where}: {field}.tool_time_s must be 0.0 on the last turn, got {tool!r}"
            )
        visible = t["visible"]
        if type(visible) is not bool:
            raise TraceError(f"{where}: {field}.visible must be a bool, got {visible!r}")
        if k == 0:
            if reused != 0:
                raise TraceError(
                    f"{where}: {field}.reused_tokens must be 0 on the first turn, got {reused}"
                )
        elif reused > prev_context:
            raise TraceError(
                f"{where}: {field}.reused_tokens must be <= the previous turn's "
                f"prompt_tokens + output_tokens ({prev_context}), got {reused}"
            )
        any_visible = any_visible or visible
        prev_context = reused + new + out
        turns.append(TurnRecord(new, reused, out, float(tool), visible, out_raw, None, um, model,
                                None if send is None else float(send)))
    if not any_visible:
        raise TraceError(f"{where}: turns: no turn has visible = true (need at least one)")
    parent, after, join = obj.get("parent_id"), obj.get("spawn_after_turn", -1), obj.get("join", True)
    if parent is not None and (type(parent) is not str or not parent or parent == cid):
        raise TraceError(f"{where}: parent_id must be a non-empty string other than the conversation's own id, "
                         f"got {parent!r}")
    if type(after) is not int or (parent is None and after != -1) or (parent is not None and after < 0):
        raise TraceError(f"{where}: spawn_after_turn must be an int >= 0 with parent_id (-1 or absent without), "
                         f"got {after!r}")
    if type(join) is not bool:
        raise TraceError(f"{where}: join must be a bool, got {join!r}")
    return ConversationRecord(cid, tuple(turns), source, parent_id=parent, spawn_after_turn=after, join=join)


def check_families(conversations: Sequence[ConversationRecord], name: str = "trace") -> None:
    """Check the parent links of a session trace: every ``parent_id`` names a conversation of the same list
    that comes before the child, and ``spawn_after_turn`` is one of the parent's turns other than its last
    (a joined child must have a parent call to hold back; a background child needs a call to spawn after).

    Raises:
        TraceError: naming the child, the field and the parent.
    """
    index = {c.conversation_id: i for i, c in enumerate(conversations)}
    for i, c in enumerate(conversations):
        if c.parent_id is None:
            continue
        j = index.get(c.parent_id)
        if j is None or j >= i:
            raise TraceError(f"{name}: conversation {c.conversation_id!r}: parent_id {c.parent_id!r} is not a "
                             f"conversation before it in the file")
        n = len(conversations[j].turns)
        if c.spawn_after_turn > n - 2:
            raise TraceError(f"{name}: conversation {c.conversation_id!r}: spawn_after_turn {c.spawn_after_turn} "
                             f"must be < the parent's last turn ({n - 1}): the parent needs a later call to join")


def load_trace(path: str | os.PathLike, hash_block_tokens: int = HASH_BLOCK_TOKENS) -> list[ConversationRecord]:
    """Load and fully validate a trace file.

    Two formats are recognised by their first line: the conversation trace (``conversation_id``,
    ``turns``; module docstring) and the request trace of Mooncake / NVIDIA Dynamo / AIPerf
    (``input_length``, ``output_length``, ``hash_ids``, ...; see :func:`_load_request_trace`).

    Args:
        path: a ``.jsonl`` file, or a gzip-compressed one ending in ``.gz``.
        hash_block_tokens: request traces: tokens per ``hash_ids`` block (512 in Mooncake's traces
            and AIPerf's default).

    Returns:
        The conversations in file order (a new list on every call; the records are frozen). Memoised per
        process by the file's path and content (its bytes are read and hashed on every call, so an edited
        file is always parsed again): a sweep's jobs in one process parse a trace once.

    Raises:
        TraceError: the file does not exist or cannot be read (bad gzip, not
            UTF-8), a line is not JSON, a key is missing or unexpected, a value
            has the wrong type or is out of range, a conversation has no turns
            or no visible turn, turn 0 reuses tokens, a turn reuses more tokens
            than the previous turn's context (prompt + output), the last turn
            has non-zero tool time, a conversation_id repeats, or the file has
            no conversations. The message names the file, the 1-based line and
            the field.
    """
    name = os.fspath(path)
    if not os.path.exists(name):
        raise TraceError(f"{name}: trace file not found")
    if os.path.isdir(name):
        raise TraceError(f"{name}: is a directory, not a trace file")
    try:
        with open(name, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TraceError(f"{name}: cannot read trace file: {e}") from e
    key = (os.path.abspath(name), hash_block_tokens, hashlib.sha256(raw).digest())
    hit = _LOADED.get(key)
    if hit is not None:
        return list(hit)   # a new list of the same (frozen) records: a caller may reorder or filter it
    conversations = _parse_trace(name, raw, hash_block_tokens)
    if len(_LOADED) >= _LOADED_MAX:
        _LOADED.pop(next(iter(_LOADED)))   # the oldest entry
    _LOADED[key] = tuple(conversations)
    return conversations


# In-process memo of parsed traces: ``(absolute path, hash_block_tokens, SHA-256 of the file's bytes) -> the
# records``. Keyed by the file's *content* (read and hashed on every call, ~2 ms for the shipped 0.8 MB trace),
# not its mtime, so a file rewritten in place is parsed again however fast it changed; a sweep's jobs in one
# process (Hydra's basic launcher, joblib with n_jobs=1, one joblib worker) and its pre-launch validation
# (``harness.run.callbacks.ValidateSweepCallback``) parse each trace once instead of once per job.
_LOADED: dict[tuple, tuple] = {}
_LOADED_MAX = 4


def _parse_trace(name: str, raw: bytes, hash_block_tokens: int) -> list[ConversationRecord]:
    """The records of trace file ``name`` from its bytes ``raw`` (gzip-compressed when the name ends in
    ``.gz``), validated as :func:`load_trace` says. Raises TraceError."""
    try:
        if _is_gzip_path(name):
            with gzip.GzipFile(name, "rb", fileobj=io.BytesIO(raw)) as f:  # the same reader as gzip.open
                data = f.read()
        else:
            data = raw
        text = data.decode("utf-8")
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise TraceError(f"{name}: cannot read trace file: {e}") from e
    except UnicodeDecodeError as e:
        raise TraceError(f"{name}: not UTF-8 text: {e}") from e

    if _looks_like_request_trace(text):
        return _load_request_trace(name, text, hash_block_tokens)
    conversations: list[ConversationRecord] = []
    first_line: dict[str, int] = {}
    loads = json.loads
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            obj = loads(line, parse_constant=_reject_constant)
        except (json.JSONDecodeError, ValueError) as e:
            raise TraceError(f"{where}: not valid JSON: {e}") from None
        conv = _parse_conversation(obj, where)
        cid = conv.conversation_id
        if cid in first_line:
            raise TraceError(
                f"{where}: conversation_id {cid!r} is a duplicate (first on line {first_line[cid]})"
            )
        first_line[cid] = lineno
        conversations.append(conv)
    if not conversations:
        raise TraceError(f"{name}: empty trace: no conversations")
    check_families(conversations, name)
    return conversations


_REQ_KEYS = frozenset(("timestamp", "input_length", "output_length", "hash_ids", "session_id", "delay"))


def _looks_like_request_trace(text: str) -> bool:
    for line in text.split("\n"):
        if line.strip():
            try:
                obj = json.loads(line)
            except ValueError:
                return False
            return isinstance(obj, dict) and "input_length" in obj and "turns" not in obj
    return False


def _number(v: object) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def request_row(line: str, where: str, hash_block_tokens: int) -> tuple:
    """One validated row of a request trace (:func:`_load_request_trace`): ``(input_length, output_length,
    hash_ids tuple or None, timestamp ms or None, delay ms or None, session_id or None)``.

    Raises:
        TraceError: naming ``where`` (``file:line``) and the field.
    """
    try:
        obj = json.loads(line, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError) as e:
        raise TraceError(f"{where}: not valid JSON: {e}") from None
    if type(obj) is not dict:
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    extra = sorted(obj.keys() - _REQ_KEYS)
    if extra:
        raise TraceError(f"{where}: request has unsupported key(s) {', '.join(map(repr, extra))} "
                         f"(supported: {', '.join(sorted(_REQ_KEYS))})")
    for key in ("input_length", "output_length"):
        v = obj.get(key)
        if type(v) is not int or v < 1:
            raise TraceError(f"{where}: {key} must be an int >= 1 (tokens), got {v!r}")
        if v > MAX_TOKENS:
            raise TraceError(f"{where}: {key} must be <= {MAX_TOKENS} (tokens), got {v!r}")
    ids = obj.get("hash_ids")
    if ids is not None:
        if type(ids) is not list or any(type(h) is not int for h in ids):
            raise TraceError(f"{where}: hash_ids must be a list of ints, got {ids!r:.80}")
        if obj["input_length"] > hash_block_tokens * len(ids):
            raise TraceError(f"{where}: hash_ids has {len(ids)} blocks of {hash_block_tokens} tokens, "
                             f"fewer than input_length={obj['input_length']}")
        ids = tuple(ids)
    ts = obj.get("timestamp")
    if ts is not None and not (_number(ts) and ts >= 0):
        raise TraceError(f"{where}: timestamp must be a finite number >= 0 (ms), got {ts!r}")
    delay = obj.get("delay")
    if delay is not None and not (_number(delay) and delay >= 0):
        raise TraceError(f"{where}: delay must be a finite number >= 0 (ms), got {delay!r}")
    sid = obj.get("session_id")
    if sid is not None and (type(sid) not in (str, int) or sid == ""):
        raise TraceError(f"{where}: session_id must be a non-empty string or an int, got {sid!r}")
    return obj["input_length"], obj["output_length"], ids, ts, delay, sid


def _load_request_trace(name: str, text: str, hash_block_tokens: int) -> list[ConversationRecord]:
    """Parse a request trace (one JSON object per line, one LLM request each) into conversations.

    Fields (Mooncake FAST'25 traces; NVIDIA Dynamo's and AIPerf's ``mooncake_trace`` replay):
    ``timestamp`` (ms from the trace's start: when the request was sent), ``input_length`` and
    ``output_length`` (tokens, ints >= 1), ``hash_ids`` (ids of the prompt's consecutive
    ``hash_block_tokens``-token blocks, the last possibly partial; equal leading ids = equal prefix,
    across requests), and for multi-turn sessions ``session_id`` and ``delay`` (ms). A row without
    ``session_id`` is a one-turn conversation ``req<row index>`` arriving at its ``timestamp``. Rows
    with the same ``session_id`` are one conversation, turns in file order (AIPerf's semantics): the
    first row's ``timestamp`` is the arrival; a later turn's prompt is the session's history (previous
    prompts and outputs, all reused) followed by its ``input_length`` new tokens (its ``hash_ids``
    describe those), and it is sent ``delay`` ms after the previous turn finished (closed loop: the
    previous turn's ``tool_time_s``). Every turn is user-visible (a chat reply).

    Raises:
        TraceError: naming ``file:line`` and the field: a missing or unknown key, a bad value,
            ``hash_ids`` covering fewer tokens than ``input_length``, timestamps on some first rows
            but not others, ``delay`` on a session's first row, or no rows.
    """
    if not (isinstance(hash_block_tokens, int) and hash_block_tokens >= 1):
        raise TraceError(f"{name}: hash_block_tokens must be an int >= 1, got {hash_block_tokens!r}")
    sessions: dict[str, list] = {}
    order: list[str] = []
    n_rows = 0
    with_ts = without_ts = 0
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        inp, outp, ids, ts, delay, sid = request_row(line, where, hash_block_tokens)
        cid = f"req{n_rows:06d}" if sid is None else str(sid)
        n_rows += 1
        rows = sessions.get(cid)
        if rows is None:
            if delay is not None:
                raise TraceError(f"{where}: delay is only allowed on a session's later rows (this is the first "
                                 f"row of {cid!r}; its arrival is timestamp)")
            if ts is None:
                without_ts += 1
            else:
                with_ts += 1
            if with_ts and without_ts:
                raise TraceError(f"{where}: timestamp: some conversations' first rows have one and others do not")
            rows = sessions[cid] = []
            order.append(cid)
        rows.append((inp, outp, ids, ts, delay))
    if not order:
        raise TraceError(f"{name}: empty trace: no requests")
    out = []
    for cid in order:
        rows = sessions[cid]
        turns = []
        ctx = 0
        for k, (inp, outp, ids, _, _) in enumerate(rows):
            nxt_delay = rows[k + 1][4] if k + 1 < len(rows) else None
            turns.append(TurnRecord(new_input_tokens=inp, reused_tokens=ctx, output_tokens=outp,
                                    tool_time_s=(nxt_delay or 0.0) / 1000.0, visible=True,
                                    output_tokens_raw=outp, hash_ids=ids))
            ctx += inp + outp
        if any(t.hash_ids is None for t in turns) and any(t.hash_ids is not None for t in turns):
            raise TraceError(f"{name}: session {cid!r}: hash_ids on some rows but not on others")
        ts0 = rows[0][3]
        out.append(ConversationRecord(cid, tuple(turns), "request-trace",
                                      arrival_s=None if ts0 is None else ts0 / 1000.0,
                                      hash_block_tokens=hash_block_tokens if turns[0].hash_ids is not None else 0))
    return out


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed (JSON has no NaN/Infinity)")


def _turn_to_dict(t: TurnRecord) -> dict:
    d = {
        "new_input_tokens": t.new_input_tokens,
        "reused_tokens": t.reused_tokens,
        "output_tokens": t.output_tokens,
        "output_tokens_raw": t.output_tokens_raw,
        "tool_time_s": float(t.tool_time_s),
        "visible": t.visible,
    }
    if t.user_message:          # the optional session-trace keys only where set: other traces keep their bytes
        d["user_message"] = True
    if t.model is not None:
        d["model"] = t.model
    if t.send_s is not None:
        d["send_s"] = float(t.send_s)
    return d


def _conversation_to_dict(conv: ConversationRecord) -> dict:
    d = {
        "conversation_id": conv.conversation_id,
        "source": conv.source,
        "turns": [_turn_to_dict(t) for t in conv.turns],
    }
    if conv.parent_id is not None:
        d.update(parent_id=conv.parent_id, spawn_after_turn=conv.spawn_after_turn, join=conv.join)
    return d


def dumps_conversation(conv: ConversationRecord) -> str:
    """One conversation as its canonical JSON line (sorted keys, no spaces, no newline)."""
    return json.dumps(
        _conversation_to_dict(conv), sort_keys=True, separators=(",", ":"), allow_nan=False
    )


def write_trace(path: str | os.PathLike, conversations: Iterable[ConversationRecord]) -> None:
    """Write a trace, byte-deterministically, after validating it.

    Lines are canonical JSON (sorted keys, ``","``/``":"`` separators) in the
    given order; a ``.gz`` path is gzip-compressed (level 9) with mtime 0 and
    no file name in the header, so equal input gives equal bytes. The file is
    written to a temporary name and renamed into place.

    Raises:
        TraceError: the conversations violate the schema (same rules as
            :func:`load_trace`; the line number is the line it would have had).
    """
    name = os.fspath(path)
    lines = []
    first_line: dict[str, int] = {}
    conversations = list(conversations)
    for lineno, conv in enumerate(conversations, start=1):
        if not isinstance(conv, ConversationRecord):
            raise TraceError(
                f"{name}:{lineno}: expected a ConversationRecord, got {type(conv).__name__}"
            )
        if any(t.hash_ids is not None for t in conv.turns):
            raise TraceError(f"{name}:{lineno}: {conv.conversation_id!r} has hash_ids, which the conversation "
                             f"trace format cannot hold (it is a request trace)")
        line = dumps_conversation(conv)
        _parse_conversation(json.loads(line), f"{name}:{lineno}")
        if conv.conversation_id in first_line:
            raise TraceError(
                f"{name}:{lineno}: conversation_id {conv.conversation_id!r} is a duplicate "
                f"(first on line {first_line[conv.conversation_id]})"
            )
        first_line[conv.conversation_id] = lineno
        lines.append(line)
    if not lines:
        raise TraceError(f"{name}: empty trace: no conversations")
    check_families(conversations, name)
    payload = ("\n".join(lines) + "\n").encode("utf-8")
    if _is_gzip_path(name):
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
            gz.write(payload)
        payload = buf.getvalue()
    directory = os.path.dirname(os.path.abspath(name))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=Path(name).name + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        from harness.core.atomic import process_umask
        os.chmod(tmp, 0o666 & ~process_umask())  # as open(name, "w") would, not mkstemp's 0o600
        os.replace(tmp, name)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


if __name__ == "__main__":  # the statistics CLI lives in harness.tools.tracestats (trace must not import it: a cycle)
    import sys as _sys

    print("error: the trace statistics moved: python -m harness.tools.tracestats stats FILE [--cache-tokens N] ...",
          file=_sys.stderr)
    _sys.exit(2)
