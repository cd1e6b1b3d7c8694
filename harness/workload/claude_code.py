"""Convert Claude Code session traces (the kv-cache-tester corpus) into a harness session trace.

Input: one JSON object per session (``trace_NNNN.json``, optionally ``.gz``), as in
``callanjfox/kv-cache-tester``'s ``traces/`` (format in ``docs/traces.md``): ``block_size`` (64 tokens per
hash block), ``requests`` in time order, each an LLM call (``t`` s from the session's start, ``type``
``s``/``n``, ``model``, ``in``/``out`` tokens, ``hash_ids``, ``input_types``, ``stop``, ``api_time``,
``think_time``) or a ``type: subagent`` entry with its own ``requests``.

Output: one root conversation per session and one child conversation per kept sub-agent
(``ConversationRecord.parent_id``, ``spawn_after_turn``, ``join``). Per call (``TurnRecord``):

* ``reused_tokens`` = 64 x (leading ``hash_ids`` shared with the *previous call of the same conversation*),
  capped at ``in - 1`` and at the previous call's prompt + output; ``new_input_tokens = in - reused``.
  The ideal (any earlier call of the session, infinite cache) is reported beside it (:class:`Report`).
* ``output_tokens = output_tokens_raw = max(1, out)`` (no clipping; a recorded 0 becomes 1, counted).
* ``visible`` = ``stop == "end_turn"`` (the answer the user reads). 4,330 streaming calls of the corpus
  have no recorded ``stop`` (``""``); with ``unrecorded_stop="loop-end"`` (default) such a call that is the
  last of its agent loop (the next root call is a user message, or none follows) counts as the loop's
  ``end_turn`` response (the agent stopped and the user spoke next); with ``"unknown"`` it does not, and the
  loop has no visible response (its visible TTFET is NaN). A conversation with no visible call gets its
  last call visible (counted: the trace format needs one visible call).
* ``user_message`` = a root call whose ``input_types`` hold ``text`` and no ``tool_result`` (a new user
  message: it starts an agent loop), and turn 0 of every root.
* ``tool_time_s`` of call k = the think time before call k+1: its ``think_time`` (s between call k's
  response and call k+1's request), or where that is missing or longer than the recorded gap
  ``t[k+1] - t[k] - api_time[k]`` (>= 0) that gap (``_think``). After
  a join point (sub-agents spawned after call k that the parent waits for) it is the gap after the last
  such sub-agent's recorded end: ``max(0, t[k+1] - max(end))`` (the recorded ``think_time`` there spans
  the sub-agents' run, which the replay produces itself).
* ``send_s`` = the recorded send time, s from the session's start (a child's calls: its recorded start
  ``t - duration`` plus its own ``t``), for ``workload.timing=original``.
* ``model`` = the recorded model.

A sub-agent entry after parent call k becomes a child spawned when call k finishes; ``status:
completed`` ones are joined (the parent's call k+1 waits for all of them), ``async_launched`` ones are
not. Dropped (and counted): sub-agents before the first or after the last parent call (nothing to spawn
after or to join), sub-agents with no calls. Streaming / non-streaming pairs (two consecutive calls of one
conversation with equal ``hash_ids`` and different ``type``) are both replayed by default (both were sent;
``pairs="first"`` keeps only the first).
"""

from __future__ import annotations

import gzip
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from harness.core.trace import ConversationRecord, TurnRecord

__all__ = ["TRACE_BLOCK_TOKENS", "PAIRS", "Report", "read_session", "convert_session", "convert_sessions",
           "discover_sessions", "lcp", "ideal_hit_tokens", "report_text"]

#: Tokens per ``hash_ids`` block in the kv-cache-tester traces (their ``block_size`` field).
TRACE_BLOCK_TOKENS = 64
#: What to replay of a streaming / non-streaming pair (module docstring).
PAIRS = ("both", "first")
#: What a loop-final call with no recorded ``stop`` is (module docstring).
UNRECORDED_STOP = ("loop-end", "unknown")
SOURCE = "claude-code"


@dataclass
class Report:
    """What a conversion kept and dropped (counts; tokens; the hit ratios are fractions of input tokens).

    sessions, calls (root calls), user_messages, end_turn (root calls with ``stop: end_turn``),
    subagents / subagent_calls (kept children and their calls), tokens_in / tokens_out (over kept calls,
    root and children, as recorded), pairs (streaming / non-streaming pairs seen), pairs_dropped,
    out_zero (calls whose recorded ``out`` was 0, replayed as 1 token), think_missing (``think_time``
    absent: derived from ``t`` and ``api_time``), no_end_turn (conversations with no ``end_turn`` call:
    the last call made visible), dropped (reason -> sub-agents dropped), reused_tokens (replayed
    per-conversation reuse), ideal_hit_tokens (infinite cache, any earlier call of the session),
    join_points, join_early (join points whose recorded next parent call was sent before the last joined
    sub-agent's recorded end: the recording does not show a strict join there), unrecorded_end (loop-final
    calls with no recorded ``stop`` counted as ``end_turn`` responses), think_clamped (recorded ``think_time``
    longer than the recorded gap since the previous call's response: the gap used, ``_think``).
    """

    sessions: int = 0
    calls: int = 0
    user_messages: int = 0
    end_turn: int = 0
    subagents: int = 0
    subagent_calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    pairs: int = 0
    pairs_dropped: int = 0
    out_zero: int = 0
    think_missing: int = 0
    no_end_turn: int = 0
    reused_tokens: int = 0
    ideal_hit_tokens: int = 0
    join_points: int = 0
    join_early: int = 0
    unrecorded_end: int = 0
    think_clamped: int = 0
    dropped: dict = field(default_factory=dict)

    def add(self, other: "Report") -> None:
        """Add ``other``'s counts to this one."""
        for k, v in vars(other).items():
            if k == "dropped":
                for r, n in v.items():
                    self.dropped[r] = self.dropped.get(r, 0) + n
            else:
                setattr(self, k, getattr(self, k) + v)

    def drop(self, reason: str, n: int = 1) -> None:
        """Count ``n`` sub-agents dropped for ``reason``."""
        self.dropped[reason] = self.dropped.get(reason, 0) + n


def read_session(path: str | os.PathLike) -> dict:
    """One session file (JSON, gzip when the name ends in ``.gz``).

    Raises:
        ValueError: unreadable, not JSON, or not an object with a ``requests`` list and ``block_size`` 64
            (the message names the file and the field).
    """
    p = os.fspath(path)
    try:
        with (gzip.open if p.endswith(".gz") else open)(p, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{p}: file not found") from None
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: cannot read session: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("requests"), list):
        raise ValueError(f"{p}: a session must be a JSON object with a 'requests' list")
    bs = data.get("block_size")
    if bs != TRACE_BLOCK_TOKENS:
        raise ValueError(f"{p}: block_size must be {TRACE_BLOCK_TOKENS} (tokens per hash block), got {bs!r}")
    return data


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences (blocks)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def ideal_hit_tokens(calls: Iterable[dict], block_tokens: int = TRACE_BLOCK_TOKENS) -> int:
    """Tokens an infinite prefix cache would serve over ``calls`` (in order): per call, ``block_tokens`` x
    the longest leading run of its ``hash_ids`` equal to the leading run of some earlier call's."""
    chain: dict[tuple[int, int], int] = {}     # (key of the leading i blocks, id of block i+1) -> key
    hit = 0
    for c in calls:
        key, n, matching = 0, 0, True
        for h in c["hash_ids"]:
            nxt = chain.get((key, h))
            if nxt is None:
                matching = False
                nxt = chain[(key, h)] = len(chain) + 1
            elif matching:
                n += 1
            key = nxt
        hit += block_tokens * n
    return hit


def _check_call(r: dict, where: str) -> None:
    for k in ("t", "in", "out"):
        v = r.get(k)
        if type(v) not in (int, float) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{where}.{k} must be a finite number >= 0, got {v!r}")
    if r["in"] < 1 or type(r["in"]) is not int or type(r["out"]) is not int:
        raise ValueError(f"{where}: in must be an int >= 1 and out an int >= 0 (tokens), got {r['in']!r}, {r['out']!r}")
    ids = r.get("hash_ids")
    if type(ids) is not list or any(type(h) is not int for h in ids):
        raise ValueError(f"{where}.hash_ids must be a list of ints")
    if len(ids) * TRACE_BLOCK_TOKENS > r["in"]:
        raise ValueError(f"{where}.hash_ids: {len(ids)} blocks of {TRACE_BLOCK_TOKENS} tokens exceed in={r['in']}")


#: Tolerance of the think-time check (s): ``t`` and ``think_time`` are recorded to ~1 s.
THINK_TOLERANCE_S = 1.0


def _think(calls: list[dict], k: int, rep: Report) -> float:
    """Think time before call ``k`` (s): its ``think_time`` when it fits the recorded gap ``g = t[k] - t[k-1]
    - api_time[k-1]`` (``api_time`` 0 where not recorded) within :data:`THINK_TOLERANCE_S`; else ``max(0, g)``.
    The corpus's ``think_time`` after a call with no recorded response (streaming calls without ``stop`` /
    ``api_time``) counts from the last *recorded* response, so it grows along a run of such calls (e.g.
    trace_0557: 795 s before a call sent 10 s after the previous one); ``g`` bounds it (counted in
    ``Report.think_clamped``; a missing ``think_time`` in ``think_missing``)."""
    r, p = calls[k], calls[k - 1]
    gap = float(r["t"]) - float(p["t"]) - float(p.get("api_time") or 0.0)
    v = r.get("think_time")
    if not (type(v) in (int, float) and math.isfinite(v) and v >= 0):
        rep.think_missing += 1
        return max(0.0, gap)
    if v > gap + THINK_TOLERANCE_S:
        rep.think_clamped += 1
        return max(0.0, gap)
    return float(v)


def _is_message(r: dict) -> bool:
    types = r.get("input_types") or []
    return "text" in types and "tool_result" not in types


def _turns(calls: list[dict], t0: float, root: bool, rep: Report, join_end: dict[int, float],
           unrecorded_stop: str = "loop-end") -> tuple[TurnRecord, ...]:
    """The turns of one conversation's calls (module docstring). ``join_end``: call index -> the recorded
    end (session s) of the last joined sub-agent spawned after it."""
    turns = []
    n = len(calls)
    for k, r in enumerate(calls):
        inp, out = int(r["in"]), int(r["out"])
        if out == 0:
            rep.out_zero += 1
        out = max(1, out)
        if k == 0:
            reused = 0
        else:
            p = calls[k - 1]
            reused = min(TRACE_BLOCK_TOKENS * lcp(p["hash_ids"], r["hash_ids"]), inp - 1,
                         int(p["in"]) + max(1, int(p["out"])))
        if k + 1 < n:
            if k in join_end:
                tool = max(0.0, float(calls[k + 1]["t"]) + t0 - join_end[k])
            else:
                tool = _think(calls, k + 1, rep)
        else:
            tool = 0.0
        um = root and (k == 0 or _is_message(r))
        visible = r.get("stop") == "end_turn"
        if (not visible and root and unrecorded_stop == "loop-end" and not r.get("stop")
                and (k + 1 == n or _is_message(calls[k + 1]))):
            visible = True
            rep.unrecorded_end += 1
        turns.append(TurnRecord(new_input_tokens=inp - reused, reused_tokens=reused, output_tokens=out,
                                tool_time_s=round(tool, 3), visible=visible,
                                output_tokens_raw=out, user_message=um, model=r.get("model") or None,
                                send_s=round(t0 + float(r["t"]), 3)))
        rep.reused_tokens += reused
        rep.tokens_in += inp
        rep.tokens_out += int(r["out"])
    if not any(t.visible for t in turns):
        rep.no_end_turn += 1
        turns[-1] = TurnRecord(**{**{f: getattr(turns[-1], f) for f in TurnRecord.__slots__}, "visible": True})
    return tuple(turns)


def convert_session(data: dict, sid: str, *, pairs: str = "both", unrecorded_stop: str = "loop-end",
                    where: str = "") -> tuple[list[ConversationRecord], Report]:
    """One session (a parsed file) -> ``[root, children...]`` and its :class:`Report`.

    Raises:
        ValueError: a malformed call (naming ``where``, the request index and the field), an unknown
            ``pairs``, or a session with no calls.
    """
    if pairs not in PAIRS:
        raise ValueError(f"--pairs must be one of {', '.join(PAIRS)}, got {pairs!r}")
    if unrecorded_stop not in UNRECORDED_STOP:
        raise ValueError(f"--unrecorded-stop must be one of {', '.join(UNRECORDED_STOP)}, got {unrecorded_stop!r}")
    where = where or sid
    rep = Report(sessions=1)
    calls: list[dict] = []
    subs: list[tuple[int, dict]] = []          # (parent calls before it, entry)
    for i, r in enumerate(data["requests"]):
        if not isinstance(r, dict):
            raise ValueError(f"{where}: requests[{i}] must be an object")
        if r.get("type") == "subagent":
            if not isinstance(r.get("requests"), list):
                raise ValueError(f"{where}: requests[{i}].requests must be a list (a sub-agent's calls)")
            subs.append((len(calls), r))
            continue
        _check_call(r, f"{where}: requests[{i}]")
        calls.append(r)
    if not calls:
        raise ValueError(f"{where}: the session has no calls")
    n_raw = len(calls)
    # a pair's second call is dropped with pairs=first: renumber the sub-agents' spawn points
    kept_idx = []
    deduped = []
    for j, r in enumerate(calls):
        before = len(deduped)
        if deduped and r["hash_ids"] == deduped[-1]["hash_ids"] and r.get("type") != deduped[-1].get("type"):
            rep.pairs += 1
            if pairs == "first":
                rep.pairs_dropped += 1
                kept_idx.append(before - 1)
                continue
        deduped.append(r)
        kept_idx.append(before)
    calls = deduped
    all_calls = list(calls)
    children: list[tuple[int, dict, float, float]] = []    # (spawn after, entry, start s, end s)
    for before, e in subs:
        after = kept_idx[before - 1] if before else -1
        sc = [q for q in e["requests"] if isinstance(q, dict) and q.get("type") != "subagent"]
        if len(sc) != len(e["requests"]):
            rep.drop("nested sub-agent or malformed entry inside a sub-agent", len(e["requests"]) - len(sc))
        if not sc:
            rep.drop("sub-agent with no calls")
            continue
        if before == 0:
            rep.drop("sub-agent before the session's first call (nothing spawns it)")
            continue
        if before == n_raw:
            rep.drop("sub-agent after the session's last call (no parent call to join)")
            continue
        for q, qi in zip(sc, range(len(sc))):
            _check_call(q, f"{where}: sub-agent {e.get('agent_id')!r} requests[{qi}]")
        dur = e.get("duration_ms")
        t = float(e.get("t") or 0.0)
        joined = e.get("status") == "completed"
        start = t - dur / 1000.0 if joined and type(dur) in (int, float) else t
        children.append((after, e, start, t if joined else math.nan))
        all_calls.extend(sc)
    join_end: dict[int, float] = {}
    for after, e, start, end in children:
        if not math.isnan(end):
            join_end[after] = max(join_end.get(after, -math.inf), end)
    rep.join_points = len(join_end)
    rep.join_early = sum(1 for k, end in join_end.items() if float(calls[k + 1]["t"]) < end)
    root = ConversationRecord(sid, _turns(calls, 0.0, True, rep, join_end, unrecorded_stop), SOURCE)
    rep.calls = len(calls)
    rep.user_messages = sum(t.user_message for t in root.turns)
    rep.end_turn = sum(r.get("stop") == "end_turn" for r in calls)
    out = [root]
    for j, (after, e, start, end) in enumerate(children):
        sc = [q for q in e["requests"] if q.get("type") != "subagent"]
        sub_rep = Report()
        turns = _turns(sc, start, False, sub_rep, {})
        sub_rep.no_end_turn = 0          # counted for roots only: a child's last call is what the parent reads
        rep.add(sub_rep)
        rep.subagents += 1
        rep.subagent_calls += len(sc)
        cid = f"{sid}/sub{j:02d}-{e.get('agent_id') or 'agent'}"
        out.append(ConversationRecord(cid, turns, SOURCE, parent_id=sid, spawn_after_turn=after,
                                      join=not math.isnan(end)))
    rep.ideal_hit_tokens = ideal_hit_tokens(all_calls)
    return out, rep


def discover_sessions(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """Session files (``*.json``, ``*.json.gz``) under the given files / folders, sorted.

    Raises:
        ValueError: an input does not exist, or nothing was found.
    """
    found: set[Path] = set()
    for inp in inputs:
        p = Path(inp)
        if p.is_dir():
            found.update(f for f in p.rglob("*") if f.is_file() and f.name.endswith((".json", ".json.gz")))
        elif p.is_file():
            found.add(p)
        else:
            raise ValueError(f"{p}: no such file or directory")
    if not found:
        raise ValueError("no session files (*.json, *.json.gz) found in: " + ", ".join(map(str, inputs)))
    return sorted(found)


def _session_id(path: Path, data: dict) -> str:
    sid = data.get("id")
    if isinstance(sid, str) and sid:
        return sid
    name = path.name
    for s in (".json.gz", ".json"):
        if name.endswith(s):
            return name[: -len(s)]
    return name


def convert_sessions(inputs: Iterable[str | os.PathLike], *, pairs: str = "both", unrecorded_stop: str = "loop-end",
                     max_sessions: Optional[int] = None) -> tuple[list[ConversationRecord], Report]:
    """Every session under ``inputs`` (sorted by file name; the first ``max_sessions`` if set) -> the
    conversations (each root followed by its children) and the summed :class:`Report`.

    Raises:
        ValueError: a bad file (naming it), a duplicate session id, ``max_sessions < 1``.
    """
    if max_sessions is not None and max_sessions < 1:
        raise ValueError(f"--max-sessions must be >= 1, got {max_sessions}")
    files = discover_sessions(inputs)
    if max_sessions is not None:
        files = files[:max_sessions]
    rep = Report()
    out: list[ConversationRecord] = []
    seen: dict[str, Path] = {}
    for f in files:
        data = read_session(f)
        sid = _session_id(f, data)
        if sid in seen:
            raise ValueError(f"{f}: session id {sid!r} also in {seen[sid]}")
        seen[sid] = f
        convs, r = convert_session(data, sid, pairs=pairs, unrecorded_stop=unrecorded_stop, where=str(f))
        out.extend(convs)
        rep.add(r)
    return out, rep


def report_text(rep: Report) -> str:
    """The conversion report as Markdown lines (counts, tokens, hit ratios, drops)."""
    tin = max(1, rep.tokens_in)
    lines = [
        f"- sessions: {rep.sessions}; root calls: {rep.calls}; user messages: {rep.user_messages}; "
        f"end_turn responses: {rep.end_turn}",
        f"- sub-agents kept: {rep.subagents} with {rep.subagent_calls} calls; join points: {rep.join_points} "
        f"({rep.join_early} where the recorded next parent call precedes the last joined sub-agent's end)",
        f"- tokens (recorded, all kept calls): in {rep.tokens_in}, out {rep.tokens_out}",
        f"- prefix hit, fraction of input tokens: replayed (previous call of the same conversation) "
        f"{rep.reused_tokens / tin:.4f}; ideal (infinite cache, any earlier call of the session, 64-token "
        f"blocks) {rep.ideal_hit_tokens / tin:.4f}",
        f"- streaming/non-streaming pairs: {rep.pairs} ({rep.pairs_dropped} second calls dropped)",
        f"- calls with out=0 replayed as 1 token: {rep.out_zero}; think_time missing (derived from t, "
        f"api_time): {rep.think_missing}; think_time longer than the recorded gap (the gap used): "
        f"{rep.think_clamped}; loop-final calls with no recorded stop counted as end_turn: "
        f"{rep.unrecorded_end}; sessions with no visible call (last call made visible): {rep.no_end_turn}",
    ]
    if rep.dropped:
        lines.append("- dropped sub-agents: " + "; ".join(f"{r}: {n}" for r, n in sorted(rep.dropped.items())))
    else:
        lines.append("- dropped sub-agents: none")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.workload.convert claude-code INPUT... -o OUT``: returns the exit status (0 written,
    2 bad input)."""
    import argparse
    import sys
    import time

    from harness.core.trace import write_trace

    ap = argparse.ArgumentParser(
        prog="python -m harness.workload.convert claude-code",
        description="Convert Claude Code session traces (kv-cache-tester JSON, one session a file) into a harness "
                    "session trace: a root conversation per session, a child conversation per sub-agent "
                    "(docs/traces.md).",
        epilog="Exit status: 0 written; 2 bad input (a missing or malformed session file, a bad argument).")
    ap.add_argument("inputs", nargs="+", metavar="INPUT", help="session files (*.json, *.json.gz) or folders")
    ap.add_argument("-o", "--output", required=True, help="output trace, e.g. traces/claude_code/x.jsonl.gz")
    ap.add_argument("--pairs", choices=PAIRS, default="both",
                    help="streaming/non-streaming pairs (equal hash_ids, consecutive): replay both calls "
                         "(default) or the first only")
    ap.add_argument("--unrecorded-stop", choices=UNRECORDED_STOP, default="loop-end",
                    help="a loop's last call with no recorded stop: its end_turn response (loop-end, default) or "
                         "not (unknown: the loop has no visible response)")
    ap.add_argument("--max-sessions", type=int, default=None,
                    help="convert only the first N session files (sorted by name)")
    ap.add_argument("--quiet", action="store_true", help="do not print the report")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        convs, rep = convert_sessions(args.inputs, pairs=args.pairs, unrecorded_stop=args.unrecorded_stop,
                                      max_sessions=args.max_sessions)
        write_trace(args.output, convs)
    except ValueError as e:      # ours, TraceError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {rep.sessions} sessions, {len(convs)} conversations "
          f"({rep.subagents} sub-agents), {rep.calls + rep.subagent_calls} calls, "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if not args.quiet:
        print(report_text(rep))
    return 0
