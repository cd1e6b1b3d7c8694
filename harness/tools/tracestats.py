"""Statistics of a trace before a run: ``python -m harness.tools.tracestats stats FILE``.

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

import math
import os
import sys
from typing import Optional, Sequence

import numpy as np

from harness.workload.prefix import BlockContent, block_ranges
from harness.sim.kvcache import KVLease, PrefixBlockPool
from harness.core import cmdline
from harness.core.trace import HASH_BLOCK_TOKENS, ConversationRecord, TraceError, load_trace

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
        shared_prefix_tokens: common system prompt of conversation traces (``harness.workload.prefix``).

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


# ---- streaming statistics of request traces (bounded memory) ------------------------------------------

_CHUNK_REQUESTS = 50_000   # first-turn requests whose blocks are matched against the cache at once


class _Unsorted(Exception):
    """The first rows' timestamps are not in file order: the streaming pass cannot replay as it reads."""


class _SeenBlocks:
    """The infinite cache of the ideal replay as two sorted numpy arrays: chain keys (int64) and, per key, the
    end of its cached blocks (int32, block index). A chain key (``hash((parent, hash_id))``, 64 bits, from
    ``hash(("root",))``) names a prompt prefix as ``harness.workload.prefix.BlockContent`` keys its ``hash_ids``
    segments; with nothing evicted, the cached blocks of a key are ``[lo, max hi)`` (every occurrence of a
    key starts at the same token ``i * hash_block_tokens``), so 12 bytes per distinct prefix block suffice."""

    def __init__(self):
        self.keys = np.empty(0, dtype=np.int64)
        self.hi = np.empty(0, dtype=np.int32)

    def _prev(self, keys: np.ndarray, hi: np.ndarray, contrib: np.ndarray) -> np.ndarray:
        """Per segment, the end of its key's cached blocks before its request (-1: none): from earlier chunks,
        and from the earlier requests of this chunk whose segments are cached (``contrib``, per segment)."""
        n = len(keys)
        prev = np.full(n, -1, np.int64)
        if len(self.keys):
            pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
            found = self.keys[pos] == keys
            prev[found] = self.hi[pos[found]]
        order = np.argsort(keys, kind="stable")            # stable: request order within a key
        ks = keys[order]
        hs = np.where(contrib[order], hi[order].astype(np.int64), -1)
        start = np.ones(n, bool)
        start[1:] = ks[1:] != ks[:-1]
        gid = np.cumsum(start) - 1
        run = np.maximum.accumulate(gid * (1 << 32) + (hs + 1))   # +1: -1 (no contribution) stays >= 0
        excl = np.empty(n, np.int64)
        excl[0] = -1
        excl[1:] = run[:-1] - gid[1:] * (1 << 32) - 1
        excl[start] = -1
        within = np.empty(n, np.int64)
        within[order] = excl
        return np.maximum(prev, within)

    def hit_blocks(self, keys: np.ndarray, lo: np.ndarray, hi: np.ndarray, req: np.ndarray, nreq: int,
                   cap: np.ndarray, ctx_blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Serve ``nreq`` first turns in order on the infinite cache (their prompt segments: ``keys``/``lo``/
        ``hi``, non-empty block ranges in prompt order, ``req`` = request index 0..nreq-1 ascending; each hit
        capped at ``cap`` blocks; ``ctx_blocks``: full blocks of prompt + output), then cache them.

        As ``harness.sim.kvcache.PrefixBlockPool`` does: a request hits the longest leading run of cached
        blocks; it then caches the rest of its context unless the range where hashing resumes (the first with
        ``hi > hit``) belongs to a key already cached to another extent (the pool's ``lease.stop``: "another
        request cached these blocks meanwhile: ours stay private"); such a request caches nothing new. Which
        requests stop depends on which earlier ones did, so the chunk is iterated to a fixed point.

        Returns ``(hit blocks, cached blocks of the context afterwards)`` per request."""
        n = len(keys)
        size = (hi - lo).astype(np.int64)
        first = np.searchsorted(req, np.arange(nreq))
        end = np.append(first[1:], n).astype(np.int64)
        cs = np.concatenate([[0], np.cumsum(size)])
        stopped = np.zeros(nreq, bool)
        for _ in range(64):
            prev = self._prev(keys, hi, ~stopped[req]) if n else np.empty(0, np.int64)
            full = prev >= hi
            stop_at = end.copy()
            notfull = np.flatnonzero(~full)
            u, idx = np.unique(req[notfull], return_index=True)
            stop_at[u] = notfull[idx]
            hitb = cs[stop_at] - cs[first]
            has = stop_at < end
            hitb[has] += np.clip(prev[stop_at[has]] - lo[stop_at[has]], 0, size[stop_at[has]])
            hitb = np.minimum(hitb, cap)
            # where hashing resumes: the first range with hi > hit
            covered = np.bincount(req, weights=(hi <= hitb[req]), minlength=nreq).astype(np.int64) if n else \
                np.zeros(nreq, np.int64)
            resume = first + covered
            inside = resume < end
            r = np.minimum(resume, max(n - 1, 0))
            new_stop = np.zeros(nreq, bool)
            if n:
                new_stop = inside & (prev[r] >= 0) & (prev[r] != hitb)
            if (new_stop == stopped).all():
                break
            stopped = new_stop
        else:
            raise RuntimeError("ideal replay: the chunk's stop pattern did not converge")
        cached = ctx_blocks.copy()
        if stopped.any():  # the resume range keeps what was cached before: min(hi, that extent)
            rr = r[stopped]
            cached[stopped] = np.minimum(hi[rr], prev[rr])
        # cache the chunk's contributing segments: new keys inserted, known keys' ends raised
        m = ~stopped[req]
        ck, ch = keys[m], hi[m].astype(np.int64)
        if len(ck):
            o = np.argsort(ck, kind="stable")
            ks, hs = ck[o], ch[o]
            st = np.ones(len(ks), bool)
            st[1:] = ks[1:] != ks[:-1]
            ustart = np.flatnonzero(st)
            uk, umax = ks[ustart], np.maximum.reduceat(hs, ustart)
            p = np.searchsorted(self.keys, uk)
            pc = np.minimum(p, max(len(self.keys) - 1, 0))
            known = (self.keys[pc] == uk) if len(self.keys) else np.zeros(len(uk), bool)
            if known.any():
                self.hi[pc[known]] = np.maximum(self.hi[pc[known]], umax[known]).astype(np.int32)
            new = ~known
            self.keys = np.insert(self.keys, p[new], uk[new])
            self.hi = np.insert(self.hi, p[new], umax[new].astype(np.int32))
        return hitb, cached


def _open_lines(path: str):
    import gzip
    import io
    if str(path).endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def is_request_trace(path: str) -> bool:
    """Whether the file's first non-empty line is a request-trace row (``input_length``, no ``turns``).

    Raises:
        TraceError: the file cannot be read."""
    from harness.core.trace import _looks_like_request_trace  # the loader's own rule, on the first non-empty line
    try:
        with _open_lines(path) as f:
            for line in f:
                if line.strip():
                    return _looks_like_request_trace(line)
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read trace file: {e}") from e
    return False


def stream_request_stats(path: str, block_size: int = 16, hash_block_tokens: int = HASH_BLOCK_TOKENS,
                         sort: Optional[bool] = None) -> dict:
    """See :func:`_stream_request_stats`; ``sort=None``: replay as read, and if the first rows' timestamps
    turn out not to be in file order, read the file again keeping the first turns' blocks, replayed sorted."""
    if sort is None:
        try:
            return _stream_request_stats(path, block_size, hash_block_tokens, False)
        except _Unsorted:
            return _stream_request_stats(path, block_size, hash_block_tokens, True)
    return _stream_request_stats(path, block_size, hash_block_tokens, sort)


def _stream_request_stats(path: str, block_size: int, hash_block_tokens: int, sort: bool) -> dict:
    """The statistics of a request trace in one streaming pass over its lines, in bounded memory: 16 bytes
    per request (prompt and output lengths, for the percentiles), a few per session, 12 per distinct prefix
    block of the infinite cache (:class:`_SeenBlocks`), and one chunk of requests' blocks at a time. Every
    row is validated as ``harness.core.trace.load_trace`` validates it (the same function).

    The ideal replay order (module docstring) is by arrival time; a session's later turns, whose history is
    private to the session, hit exactly their whole previous context's full blocks (the previous turn was
    served and cached before them) and add nothing another request can hit, so only first turns are matched
    against the cache, in arrival order. A file whose first rows' timestamps are in file order (or have none)
    is replayed as it is read; otherwise (``_Unsorted``) the first turns' blocks are kept (16 bytes per
    block) and replayed sorted, stable. ``sort``: force that (True) or forbid it (False, raises _Unsorted).

    Returns: ``{"requests", "sessions", "max_turns", "prompt" (int64 array), "output" (int64 array),
    "t_min", "t_max" (s, NaN without timestamps), "hit_tokens", "prompt_tokens"}``.

    Raises:
        TraceError: as ``load_trace`` (naming file:line and the field).
    """
    from array import array

    from harness.core.trace import request_row
    B = int(block_size)
    H = int(hash_block_tokens)
    prompt_a, out_a = array("q"), array("q")
    sessions: dict = {}            # sid -> [turns, context tokens, time s, has hash_ids]
    n_rows = n_conv = 0
    with_ts = without_ts = 0
    t_min, t_max = math.inf, -math.inf
    hit_tokens = 0
    root = hash(("root",))
    seen = _SeenBlocks()
    ck, clo, chi, creq = array("q"), array("i"), array("i"), array("i")
    ccap, cctx, ctime = array("q"), array("q"), array("d")
    c0_all = array("q")               # per first turn: its context's cached blocks after it was served
    t1_first, t1_prompt = array("q"), array("q")   # session turns 1: resolved once their first turn is
    n_first = 0
    nreq_chunk = 0
    last_ts = -math.inf
    keep_all = bool(sort)

    def flush():
        nonlocal hit_tokens, nreq_chunk, ck, clo, chi, creq, ccap, cctx
        if nreq_chunk:
            hb, c0 = seen.hit_blocks(np.frombuffer(ck, np.int64), np.frombuffer(clo, np.int32),
                                     np.frombuffer(chi, np.int32), np.frombuffer(creq, np.int32), nreq_chunk,
                                     np.frombuffer(ccap, np.int64), np.frombuffer(cctx, np.int64))
            hit_tokens += int(hb.sum()) * B
            c0_all.extend(c0.tolist())
        ck, clo, chi, creq, ccap, cctx = array("q"), array("i"), array("i"), array("i"), array("q"), array("q")
        nreq_chunk = 0

    name = str(path)
    with _open_lines(path) as f:
        try:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{name}:{lineno}"
                inp, outp, ids, ts, delay, sid = request_row(line, where, H)
                n_rows += 1
                st = None if sid is None else sessions.get(str(sid))
                if st is None:     # a conversation's first row
                    if delay is not None:
                        cid = f"req{n_rows - 1:06d}" if sid is None else str(sid)
                        raise TraceError(f"{where}: delay is only allowed on a session's later rows (this is the "
                                         f"first row of {cid!r}; its arrival is timestamp)")
                    if ts is None:
                        without_ts += 1
                    else:
                        with_ts += 1
                    if with_ts and without_ts:
                        raise TraceError(f"{where}: timestamp: some conversations' first rows have one and others "
                                         f"do not")
                    n_conv += 1
                    t = math.nan if ts is None else ts / 1000.0
                    if ts is not None:
                        if ts < last_ts and not keep_all:
                            raise _Unsorted()
                        last_ts = max(last_ts, ts)
                        t_min, t_max = min(t_min, t), max(t_max, t)
                    prompt_a.append(inp)
                    out_a.append(outp)
                    cap = (inp - 1) // B
                    if ids:
                        key = root
                        k = len(ids)
                        for i, h in enumerate(ids):
                            s0 = i * H
                            if s0 >= inp:
                                break
                            key = hash((key, h))
                            e0 = inp if i == k - 1 else min(s0 + H, inp)
                            lo, hi = s0 // B, e0 // B
                            if hi > lo:
                                ck.append(key)
                                clo.append(lo)
                                chi.append(hi)
                                creq.append(nreq_chunk)
                    ccap.append(cap)
                    cctx.append((inp + outp) // B)
                    if keep_all:
                        ctime.append(t)
                    nreq_chunk += 1
                    if sid is not None:
                        sessions[str(sid)] = [1, inp + outp, t, ids is not None, n_first]
                    n_first += 1
                    if nreq_chunk >= _CHUNK_REQUESTS and not keep_all:
                        flush()
                else:              # a session's later turn: its history is cached whole
                    if (ids is not None) != st[3]:
                        raise TraceError(f"{name}: session {str(sid)!r}: hash_ids on some rows but not on others")
                    prompt = st[1] + inp
                    prompt_a.append(prompt)
                    out_a.append(outp)
                    if st[0] == 1:   # hits what its first turn left cached (known once that one is served)
                        t1_first.append(st[4])
                        t1_prompt.append(prompt)
                    else:            # turn 1 cached the whole history (see stream_request_stats)
                        hit_tokens += min(st[1] // B, (prompt - 1) // B) * B
                    st[0] += 1
                    st[1] = prompt + outp
                    st[2] += (delay or 0.0) / 1000.0
                    if not math.isnan(st[2]):
                        t_max = max(t_max, st[2])
        except UnicodeDecodeError as e:
            raise TraceError(f"{name}: not UTF-8 text: {e}") from e
        except (OSError, EOFError) as e:
            raise TraceError(f"{name}: cannot read trace file: {e}") from e
    if not n_rows:
        raise TraceError(f"{name}: empty trace: no requests")
    if keep_all and nreq_chunk:  # replay the first turns sorted by arrival (stable), chunk by chunk
        times = np.frombuffer(ctime, np.float64)
        order = np.argsort(times, kind="stable") if not np.isnan(times).all() else np.arange(len(times))
        keys = np.frombuffer(ck, np.int64)
        lo, hi = np.frombuffer(clo, np.int32), np.frombuffer(chi, np.int32)
        req = np.frombuffer(creq, np.int32)
        caps, ctxb = np.frombuffer(ccap, np.int64), np.frombuffer(cctx, np.int64)
        c0_sorted = np.zeros(nreq_chunk, np.int64)
        first = np.searchsorted(req, np.arange(nreq_chunk))
        end = np.append(first[1:], len(req))
        for c in range(0, len(order), _CHUNK_REQUESTS):
            sel = order[c:c + _CHUNK_REQUESTS]
            lens = end[sel] - first[sel]
            idx = np.concatenate([np.arange(a, b) for a, b in zip(first[sel], end[sel])]) if lens.sum() else \
                np.empty(0, np.int64)
            rq = np.repeat(np.arange(len(sel)), lens)
            hb, c0 = seen.hit_blocks(keys[idx], lo[idx], hi[idx], rq, len(sel), caps[sel], ctxb[sel])
            hit_tokens += int(hb.sum()) * B
            c0_sorted[sel] = c0
        c0_all.extend(c0_sorted.tolist())
        nreq_chunk = 0
    else:
        flush()
    if len(t1_first):
        c0 = np.frombuffer(c0_all, np.int64)[np.frombuffer(t1_first, np.int64)]
        cap1 = (np.frombuffer(t1_prompt, np.int64) - 1) // B
        hit_tokens += int(np.minimum(c0, cap1).sum()) * B
    turns = [st[0] for st in sessions.values()]
    prompt = np.frombuffer(prompt_a, np.int64)
    return {"requests": n_rows, "sessions": n_conv, "max_turns": max(turns, default=1),
            "prompt": prompt, "output": np.frombuffer(out_a, np.int64),
            "t_min": t_min if with_ts else math.nan, "t_max": t_max if with_ts else math.nan,
            "hit_tokens": hit_tokens, "prompt_tokens": int(prompt.sum())}


def request_stats_text(path: str, block_size: int = 16, hash_block_tokens: int = HASH_BLOCK_TOKENS) -> str:
    """:func:`trace_stats`'s text for a request trace without ``--cache-tokens``, computed by
    :func:`stream_request_stats` (bounded memory) -- the same lines and numbers."""
    r = stream_request_stats(path, block_size, hash_block_tokens)
    lines = _size_lines(r["requests"], r["sessions"], r["max_turns"], r["t_min"], r["t_max"], r["prompt"], r["output"])
    hr = r["hit_tokens"] / r["prompt_tokens"] if r["prompt_tokens"] else math.nan
    lines.append(f"ideal prefix-hit ratio, infinite cache (block {block_size}): {hr:.4f}")
    return "\n".join(lines)


def _size_lines(n: int, sessions: int, max_turns: int, t_first: float, t_last: float, prompt: np.ndarray,
                output: np.ndarray) -> list[str]:
    """The first lines of the statistics text: requests, sessions, duration and rate (``t_first`` /
    ``t_last`` in s, NaN without timestamps), input and output tokens per request (``prompt`` / ``output``:
    one entry per request, tokens)."""
    lines = [f"requests: {n:,}", f"sessions: {sessions:,} (turns per session: mean {n / sessions:.2f}, max {max_turns})"]
    if not math.isnan(t_first):
        dur = t_last - t_first
        lines.append(f"duration: {dur:,.1f} s (first to last request)")
        lines.append(f"rate: {n / dur:.3f} requests/s" if dur > 0 else "rate: n/a (one instant)")
    else:
        lines.append("duration, rate: n/a (no timestamps: closed-loop conversations)")
    lines.append(f"input tokens per request: {_pct(prompt)}  (total {prompt.sum():,})")
    lines.append(f"output tokens per request: {_pct(output)}  (total {output.sum():,})")
    return lines


def _pct(a: np.ndarray) -> str:
    q = np.percentile(a, [50, 90, 99])
    return (f"mean {a.mean():,.0f}  p50 {q[0]:,.0f}  p90 {q[1]:,.0f}  p99 {q[2]:,.0f}  "
            f"min {a.min():,}  max {a.max():,}")


def trace_stats(records: Sequence[ConversationRecord], block_size: int = 16, cache_tokens: Optional[int] = None,
                shared_prefix_tokens: int = 0) -> str:
    """The statistics text printed by ``python -m harness.tools.tracestats stats`` (module docstring)."""
    turns = [t for r in records for t in r.turns]
    inp = np.array([t.prompt_tokens for t in turns], dtype=np.int64)
    out = np.array([t.output_tokens for t in turns], dtype=np.int64)
    times = [t for t, _, _ in request_order(records)]
    timed = bool(times) and not any(math.isnan(t) for t in times)
    lines = _size_lines(len(turns), len(records), max(len(r.turns) for r in records),
                        times[0] if timed else math.nan, times[-1] if timed else math.nan, inp, out)
    hr, _ = ideal_hit_ratio(records, block_size, None, shared_prefix_tokens)
    lines.append(f"ideal prefix-hit ratio, infinite cache (block {block_size}): {hr:.4f}")
    if cache_tokens is not None:
        hr, big = ideal_hit_ratio(records, block_size, cache_tokens, shared_prefix_tokens)
        note = f"; {big} request(s) larger than the cache, counted as misses" if big else ""
        lines.append(f"ideal prefix-hit ratio, LRU cache of {cache_tokens:,} tokens "
                     f"({cache_tokens // block_size:,} blocks): {hr:.4f}{note}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI: ``python -m harness.tools.tracestats stats FILE [--cache-tokens N] [--block-size B]
    [--shared-prefix-tokens N] [--hash-block-tokens H]``. Returns the exit status (2 on a bad trace)."""
    ap = cmdline.ArgumentParser(prog="python -m harness.tools.tracestats", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 printed; 2 a missing, unreadable or malformed trace "
                                       "(the message names file:line and the field) or a bad argument; 130 "
                                       "interrupted.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stats", help="print a trace's statistics and its ideal prefix-hit ratio")
    st.add_argument("file", help="conversation trace or request trace (.jsonl or .jsonl.gz)")
    st.add_argument("--cache-tokens", type=cmdline.number(1, integer=True), default=None,
                    help="KV cache size for the LRU hit ratio (tokens, >= 1)")
    st.add_argument("--block-size", type=cmdline.number(1, integer=True), default=16,
                    help="KV block size (tokens, >= 1; vLLM's default 16)")
    st.add_argument("--shared-prefix-tokens", type=cmdline.number(0, integer=True), default=0,
                    help="conversation traces: tokens of a system prompt common to every conversation")
    st.add_argument("--hash-block-tokens", type=cmdline.number(1, integer=True), default=HASH_BLOCK_TOKENS,
                    help="request traces: tokens per hash_ids block (Mooncake: 512)")
    a = ap.parse_args(argv)
    try:
        if a.cache_tokens is None and os.path.isfile(a.file) and is_request_trace(a.file):
            text = request_stats_text(a.file, a.block_size, a.hash_block_tokens)   # streaming, bounded memory
        else:
            records = load_trace(a.file, hash_block_tokens=a.hash_block_tokens)
            text = trace_stats(records, a.block_size, a.cache_tokens, a.shared_prefix_tokens)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{a.file}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
