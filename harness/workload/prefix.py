"""Which KV-cache blocks requests share: the content identity of every token position of a turn.

vLLM's automatic prefix caching identifies a full KV block by a hash of its tokens chained with the
hash of the previous block (``vllm/v1/core/kv_cache_utils.py``: ``hash_block_tokens(parent_hash,
block_tokens)``), so two requests share block ``j`` exactly when their first ``(j + 1) * block_size``
tokens are equal -- whatever conversation they belong to. Traces carry no text, so this module derives
the same equality from what a trace says, as a list of **segments** per turn::

    ((key, start, end), ...)      # tokens [start, end) of the turn's context (prompt + output)

contiguous from token 0 to ``prompt_tokens + output_tokens``. A segment's ``key`` (an int) identifies
the content of tokens ``[0, p)`` for every ``start < p <= end``: two turns whose segments have the same
key agree on all tokens up to the shorter of the two ends. A KV block of ``B`` tokens, ``[jB, (j+1)B)``,
belongs to the segment holding its last token, and its identity is ``(key, j)``
(:func:`block_ranges`). Sources of the segments:

* **Conversation traces** (``harness.core.trace`` turns without ``hash_ids``): turn ``k`` keeps the first
  ``reused_tokens[k]`` tokens of turn ``k - 1``'s context and rewrites the rest of it (the trace's
  definition of ``reused_tokens``). A turn *rewrites* when ``reused_tokens[k]`` is less than turn
  ``k - 1``'s context (prompt + output). Token prefix ``[0, p]`` of turn ``k`` is therefore identified by
  ``(conversation, G)`` with ``G`` = the last rewriting turn ``t <= k`` with ``reused_tokens[t] <= p``
  (0 if none); it equals the same prefix of turn ``m > k`` iff no turn in ``(k, m]`` rewrote at or
  before ``p``. So per-conversation reuse is exact: a turn hits exactly the block-aligned part of its
  ``reused_tokens`` that is still cached, as before. An append-only conversation is one segment.
  Optionally the first ``shared_prefix_tokens`` tokens of every conversation are one common segment (a
  system prompt shared by every conversation of the workload), capped per conversation at its first
  prompt and at its smallest ``reused_tokens``.
* **Request traces with ``hash_ids``** (Mooncake FAST'25 / NVIDIA Dynamo / AIPerf format): the prompt
  of a turn is ``len(hash_ids)`` blocks of ``hash_block_tokens`` tokens (the last may be partial); equal
  leading runs of ids are equal token prefixes, across requests. Segment ``i`` is keyed by the chain
  ``(key_{i-1}, hash_ids[i])``, so an id only matches after the same predecessors (as vLLM's chained
  hashes). The output tokens are private to the request. A later turn of a session (AIPerf's
  multi-turn ``session_id`` rows) appends its ``hash_ids`` blocks after the session's history (previous
  prompts and outputs), so its blocks are private to the session.

Keys are small ints handed out by one :class:`BlockContent` (one per run), so segments of different
workloads must not be mixed.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from harness.core.trace import ConversationRecord

Segment = tuple[int, int, int]   # (key, start token, end token)


class BlockContent:
    """Content identities (segments) of every turn of a workload, for content-addressed prefix caching.

    Args:
        records: the workload's conversations (ids unique).
        shared_prefix_tokens: tokens at the start of every conversation's first prompt that are the same
            in all conversations (a common system prompt; tokens, >= 0). Applies to conversation
            traces; request traces state their sharing through ``hash_ids``.

    ``segments(conversation_id, turn)`` returns the turn's segments (see the module docstring), computed
    once per conversation.

    Raises:
        ValueError: ``shared_prefix_tokens < 0``; a conversation mixing turns with and without
            ``hash_ids``; a later session turn with ``hash_ids`` that does not reuse its whole previous
            context; an unknown conversation id (``segments``).
    """

    def __init__(self, records: Iterable[ConversationRecord] = (), *, shared_prefix_tokens: int = 0):
        if isinstance(shared_prefix_tokens, bool) or not isinstance(shared_prefix_tokens, int) \
                or shared_prefix_tokens < 0:
            raise ValueError(f"shared_prefix_tokens must be an int >= 0 (tokens), got {shared_prefix_tokens!r}")
        self.shared_prefix_tokens = shared_prefix_tokens
        self._intern: dict[tuple, int] = {}
        self._records: dict[str, ConversationRecord] = {r.conversation_id: r for r in records}
        self._segs: dict[str, list[tuple[Segment, ...]]] = {}
        self._learning: dict[str, list] = {}

    def key(self, what: tuple) -> int:
        """The int key of a content identity ``what`` (any hashable tuple); equal tuples, equal keys."""
        k = self._intern.get(what)
        if k is None:
            k = self._intern[what] = len(self._intern) + 1
        return k

    def add(self, record: ConversationRecord) -> None:
        """Register one more conversation (its id must be new)."""
        if record.conversation_id in self._records:
            raise ValueError(f"conversation {record.conversation_id!r} is already registered")
        self._records[record.conversation_id] = record

    def segments(self, conversation_id: str, turn: int) -> tuple[Segment, ...]:
        """Segments of turn ``turn``'s context (prompt + output), tokens [0, prompt + output)."""
        segs = self._segs.get(conversation_id)
        if segs is None:
            rec = self._records.get(conversation_id)
            if rec is None:
                raise ValueError(f"unknown conversation {conversation_id!r} (not in the workload's BlockContent)")
            segs = self._segs[conversation_id] = self._conversation_segments(rec)
        return segs[turn]

    # ---- construction -------------------------------------------------------------------------
    def _conversation_segments(self, rec: ConversationRecord) -> list[tuple[Segment, ...]]:
        has = [t.hash_ids is not None for t in rec.turns]
        if any(has) and not all(has):
            raise ValueError(f"conversation {rec.conversation_id!r}: some turns have hash_ids and some do not")
        if all(has):
            return self._hash_segments(rec)
        return self._reuse_segments(rec)

    def _reuse_segments(self, rec: ConversationRecord) -> list[tuple[Segment, ...]]:
        cid = rec.conversation_id
        turns = rec.turns
        shared = min(self.shared_prefix_tokens, turns[0].prompt_tokens,
                     *(t.reused_tokens for t in turns[1:])) if self.shared_prefix_tokens else 0
        state = self._reuse_state(cid, shared)
        return [self._reuse_step(state, k, t.reused_tokens, t.prompt_tokens + t.output_tokens)
                for k, t in enumerate(turns)]

    def _reuse_state(self, cid: str, shared: int) -> list:
        head = ((self.key(("shared-prefix",)), 0, shared),) if shared else ()
        # [conversation, head segments, stack of (key, start token) with increasing starts, previous context]
        return [cid, head, [(self.key(("conv", cid, 0)), shared)], 0]

    def _reuse_step(self, state: list, k: int, reused: int, ctx: int) -> tuple[Segment, ...]:
        cid, head, stack, prev_ctx = state
        if k and reused < prev_ctx:                 # turn k rewrote its context from reused_tokens on
            while stack and stack[-1][1] >= reused:
                stack.pop()
            stack.append((self.key(("conv", cid, k)), reused))
        segs = list(head)
        for i, (key, start) in enumerate(stack):
            end = stack[i + 1][1] if i + 1 < len(stack) else ctx
            if end > start:
                segs.append((key, start, end))
        state[3] = ctx
        return tuple(segs)

    def learn(self, conversation_id: str, turn: int, reused_tokens: int, prompt_tokens: int,
              output_tokens: int) -> tuple[Segment, ...]:
        """Segments of a turn of a conversation this object was not given, learnt from its turns as they
        come (in order; asking again for the latest turn returns the same segments). Own prefix only:
        no shared system prompt, no ``hash_ids``.

        Raises:
            ValueError: a turn out of order.
        """
        st = self._learning.get(conversation_id)
        if st is None:
            st = self._learning[conversation_id] = [self._reuse_state(conversation_id, 0), []]
        state, done = st
        if turn < len(done):
            return done[turn]
        if turn != len(done):
            raise ValueError(f"{conversation_id}: turn {turn} before turn {len(done)}")
        segs = self._reuse_step(state, turn, reused_tokens, prompt_tokens + output_tokens)
        done.append(segs)
        return segs

    def _hash_segments(self, rec: ConversationRecord) -> list[tuple[Segment, ...]]:
        cid = rec.conversation_id
        size = rec.hash_block_tokens
        if size < 1:
            raise ValueError(f"conversation {cid!r}: hash_ids need hash_block_tokens >= 1, got {size}")
        out = []
        prev: tuple[Segment, ...] = ()
        prev_ctx = 0
        for k, t in enumerate(rec.turns):
            if k and t.reused_tokens != prev_ctx:
                raise ValueError(f"conversation {cid!r} turn {k}: a session turn with hash_ids must reuse its "
                                 f"whole previous context ({prev_ctx} tokens), got reused_tokens={t.reused_tokens}")
            segs = list(prev)
            base = prev_ctx                                 # the new input starts after the history
            parent = self.key(("root",)) if k == 0 else prev[-1][0]
            end_in = base + t.new_input_tokens
            if not t.hash_ids:                              # no ids: the input is private
                segs.append((self.key(("in", cid, k)), base, end_in))
            for i, h in enumerate(t.hash_ids):
                start = base + i * size
                if start >= end_in:
                    break                                   # more ids than the (scaled) input needs
                last = i == len(t.hash_ids) - 1
                end = end_in if last else min(start + size, end_in)
                parent = self.key((parent, h))
                segs.append((parent, start, end))
            if segs[-1][2] < end_in:                        # fewer ids than tokens (token scaling): extend
                key, start, _ = segs[-1]
                segs[-1] = (key, start, end_in)
            ctx = end_in + t.output_tokens
            segs.append((self.key(("out", cid, k)), end_in, ctx))
            out.append(tuple(segs))
            prev, prev_ctx = tuple(segs), ctx
        return out


def block_ranges(segments: Sequence[Segment], block_size: int) -> tuple[tuple[int, int, int], ...]:
    """Full KV blocks of each segment: ``(key, first block, end block)``, block indices from 0.

    Block ``j`` (tokens ``[j*B, (j+1)*B)``, ``B = block_size``) belongs to the segment holding its
    last token ``(j+1)*B - 1``; only full blocks (``(j+1)*B <= end`` of the last segment) are listed.
    Segment ``[s, e)`` holds blocks ``floor(s/B) .. floor(e/B) - 1`` (possibly none). Consecutive ranges
    are contiguous; empty ones are dropped.
    """
    out = []
    for key, s, e in segments:
        lo, hi = s // block_size, e // block_size
        if hi > lo:
            out.append((key, lo, hi))
    return tuple(out)
