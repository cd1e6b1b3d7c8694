"""Statistics of a trace before a run: ``python -m harness.trace stats FILE``.

Prints the number of requests (LLM calls) and sessions (conversations), the duration and request rate
(request traces with timestamps), percentiles of the input (prompt) and output lengths, and the *ideal*
prefix-cache hit ratio: requests served one at a time in arrival order by one engine whose KV cache is
``harness.sim.kvcache.PrefixBlockPool`` (vLLM's content-addressed blocks, LRU), with an infinite cache
and with ``--cache-tokens``. Hit ratio = sum of hit tokens / sum of prompt tokens, a hit being the
longest run of cached leading blocks, at most ``prompt - 1`` tokens (as the simulator's
``prefix hit frac``). A request keeps its whole context (prompt + output) cached after it finishes.

Order of the ideal replay: request traces by arrival time (a session's later turns at the previous
turn's arrival + its ``delay``, ignoring service time); conversation traces (no timestamps) one
conversation after another, turns in order -- the best case for an LRU cache.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Optional, Sequence

import numpy as np

from harness.prefix import BlockContent, block_ranges
from harness.sim.kvcache import KVLease, PrefixBlockPool
from harness.trace import HASH_BLOCK_TOKENS, ConversationRecord, TraceError, load_trace

__all__ = ["request_order", "ideal_hit_ratio", "trace_stats", "main"]


def request_order(records: Sequence[ConversationRecord]) -> list[tuple[float, str, int]]:
    """``(time s, conversation id, turn)`` of every request in the ideal replay's order (module docstring).
    Conversations without ``arrival_s`` come one after another, at time ``nan``."""
    out = []
    for rec in records:
        if rec.arrival_s is None:
            out.extend((math.nan, rec.conversation_id, k) for k in range(len(rec.turns)))
            continue
        t = rec.arrival_s
        for k, tr in enumerate(rec.turns):
            out.append((t, rec.conversation_id, k))
            t += tr.tool_time_s
    if all(not math.isnan(t) for t, _, _ in out):
        out.sort(key=lambda x: x[0])      # stable: ties keep file order
    return out


def ideal_hit_ratio(records: Sequence[ConversationRecord], block_size: int, cache_tokens: Optional[int] = None,
                    shared_prefix_tokens: int = 0) -> tuple[float, int]:
    """Ideal prefix-hit ratio of ``records`` on one engine (module docstring).

    Args:
        block_size: KV block size (tokens). cache_tokens: KV cache size (tokens; ``None``: infinite).
        shared_prefix_tokens: common system prompt of conversation traces (``harness.prefix``).

    Returns:
        ``(hit tokens / prompt tokens, requests that did not fit in the cache)``; a request whose
        context needs more blocks than the cache has is counted with no hit and not cached.
    """
    by_id = {r.conversation_id: r for r in records}
    content = BlockContent(records, shared_prefix_tokens=shared_prefix_tokens)
    total_blocks = sum(-(-(t.prompt_tokens + t.output_tokens) // block_size) for r in records for t in r.turns)
    cap = total_blocks if cache_tokens is None else cache_tokens // block_size
    pool = PrefixBlockPool(cap, block_size)
    hit_tokens = prompt_tokens = 0
    too_big = 0
    for _, cid, k in request_order(records):
        tr = by_id[cid].turns[k]
        prompt, ctx = tr.prompt_tokens, tr.prompt_tokens + tr.output_tokens
        prompt_tokens += prompt
        lease = KVLease(block_ranges(content.segments(cid, k), block_size))
        hit, ev = pool.lookup(lease, prompt - 1)
        need = -(-ctx // block_size) - hit
        if need + ev > pool.available:
            too_big += 1
            continue
        pool.acquire(lease, hit)
        pool.grow(lease, need, ctx)
        pool.release(lease)
        hit_tokens += hit * block_size
    return (hit_tokens / prompt_tokens if prompt_tokens else math.nan), too_big


def _pct(a: np.ndarray) -> str:
    q = np.percentile(a, [50, 90, 99])
    return (f"mean {a.mean():,.0f}  p50 {q[0]:,.0f}  p90 {q[1]:,.0f}  p99 {q[2]:,.0f}  "
            f"min {a.min():,}  max {a.max():,}")


def trace_stats(records: Sequence[ConversationRecord], block_size: int = 16, cache_tokens: Optional[int] = None,
                shared_prefix_tokens: int = 0) -> str:
    """The statistics text printed by ``python -m harness.trace stats`` (module docstring)."""
    turns = [t for r in records for t in r.turns]
    inp = np.array([t.prompt_tokens for t in turns], dtype=np.int64)
    out = np.array([t.output_tokens for t in turns], dtype=np.int64)
    lines = [f"requests: {len(turns):,}", f"sessions: {len(records):,} "
             f"(turns per session: mean {len(turns) / len(records):.2f}, max {max(len(r.turns) for r in records)})"]
    order = request_order(records)
    times = [t for t, _, _ in order]
    if times and not any(math.isnan(t) for t in times):
        dur = times[-1] - times[0]
        lines.append(f"duration: {dur:,.1f} s (first to last request)")
        lines.append(f"rate: {len(turns) / dur:.3f} requests/s" if dur > 0 else "rate: n/a (one instant)")
    else:
        lines.append("duration, rate: n/a (no timestamps: closed-loop conversations)")
    lines.append(f"input tokens per request: {_pct(inp)}  (total {inp.sum():,})")
    lines.append(f"output tokens per request: {_pct(out)}  (total {out.sum():,})")
    hr, _ = ideal_hit_ratio(records, block_size, None, shared_prefix_tokens)
    lines.append(f"ideal prefix-hit ratio, infinite cache (block {block_size}): {hr:.4f}")
    if cache_tokens is not None:
        hr, big = ideal_hit_ratio(records, block_size, cache_tokens, shared_prefix_tokens)
        note = f"; {big} request(s) larger than the cache, counted as misses" if big else ""
        lines.append(f"ideal prefix-hit ratio, LRU cache of {cache_tokens:,} tokens "
                     f"({cache_tokens // block_size:,} blocks): {hr:.4f}{note}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI: ``python -m harness.trace stats FILE [--cache-tokens N] [--block-size B]
    [--shared-prefix-tokens N] [--hash-block-tokens H]``. Returns the exit status (2 on a bad trace)."""
    ap = argparse.ArgumentParser(prog="python -m harness.trace", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stats", help="print a trace's statistics and its ideal prefix-hit ratio")
    st.add_argument("file", help="conversation trace or request trace (.jsonl or .jsonl.gz)")
    st.add_argument("--cache-tokens", type=int, default=None, help="KV cache size for the LRU hit ratio (tokens)")
    st.add_argument("--block-size", type=int, default=16, help="KV block size (tokens; vLLM's default 16)")
    st.add_argument("--shared-prefix-tokens", type=int, default=0,
                    help="conversation traces: tokens of a system prompt common to every conversation")
    st.add_argument("--hash-block-tokens", type=int, default=HASH_BLOCK_TOKENS,
                    help="request traces: tokens per hash_ids block (Mooncake: 512)")
    a = ap.parse_args(argv)
    for name in ("cache_tokens", "block_size", "hash_block_tokens"):
        v = getattr(a, name)
        if v is not None and v < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if a.shared_prefix_tokens < 0:
        ap.error(f"--shared-prefix-tokens must be >= 0, got {a.shared_prefix_tokens}")
    try:
        records = load_trace(a.file, hash_block_tokens=a.hash_block_tokens)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{a.file}")
    print(trace_stats(records, a.block_size, a.cache_tokens, a.shared_prefix_tokens))
    return 0
