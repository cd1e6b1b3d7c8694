"""Content-addressed paged KV cache with prefix caching, as vLLM V1's ``BlockPool`` keeps it.

What is modelled, from vLLM 0.32 (``vllm/v1/core/block_pool.py``, ``kv_cache_manager.py``,
``single_type_kv_cache_manager.py``, ``kv_cache_utils.py``):

* A full block is identified by the hash of its tokens chained with its parent block's hash
  (``hash_block_tokens``); here by ``(segment key, block index)`` from ``harness.workload.prefix`` -- the same
  equality, derived from the trace. Identical blocks are shared by every request that has them,
  whatever its conversation (``BlockPool.get_cached_block`` / ``touch``: a hit raises the block's
  reference count and takes it out of the free queue).
* A request's lookup returns the longest run of leading cached blocks, at most ``num_tokens - 1``
  tokens (``KVCacheManager.get_computed_blocks``: the last prompt token is always recomputed to get
  logits); the engine passes that cap (a P/D decode request with remote KV passes the prompt length).
* Admission needs ``new blocks + hit blocks that sit in the free queue`` free blocks
  (``get_num_blocks_to_allocate`` counts evictable hit blocks, ``allocate_slots`` compares with
  ``get_num_free_blocks``).
* Blocks are hashed when they are allocated for tokens scheduled in a step (``allocate_slots`` ->
  ``cache_blocks`` for ``num_computed_tokens + num_new_tokens``), so a request admitted later in the
  same step already hits them.
* Freeing (``SingleTypeKVCacheManager.free``) passes the request's blocks in *reverse* order to
  ``BlockPool.free_blocks``; blocks whose reference count drops to 0 go to the free queue: blocks
  without a hash are *prepended* (reused first), hashed blocks are *appended* (LRU: "the least recent
  used block is at the front"; same release -> the tail of the chain is evicted first).
* Allocation pops from the front of the free queue (``get_new_blocks``: ``popleft_n``), evicting the
  hash of a cached block it takes (``_maybe_evict_cached_block``).

Blocks are counted, not materialised: a ``_Node`` is the run of blocks ``[lo, hi)`` of one segment key
that is cached, and the free queue holds ranges ``(node, lo, hi)`` in LRU order. This is exact because
a request always holds a prefix of a chain, so within a node the referenced blocks are a prefix
``[lo, ref_hi)`` and the free ones ``[ref_hi, hi)`` were freed no later than any block before them:
eviction always takes a node's last block, and a node's oldest queue range is its highest.

Not modelled: a block computed twice concurrently (vLLM keeps both copies hashed; here the request
that finds its next block already cached by another request keeps the rest of its blocks private,
unhashed, so they are reused first once freed); the KV-connector's delayed caching of blocks loaded
from a remote prefiller (``delay_cache_blocks``: here they are hashed when allocated).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Sequence

__all__ = ["PrefixBlockPool", "KVLease"]


class _Node:
    """Cached blocks ``[lo, hi)`` of one segment key; ``holders``: extent -> number of requests holding
    blocks ``[lo, extent)``; ``ref_hi``: the largest extent held (``lo`` if none); ``entries``: its free
    queue ranges, oldest (highest blocks) first."""

    __slots__ = ("key", "lo", "hi", "ref_hi", "holders", "entries")

    def __init__(self, key: int, lo: int):
        self.key, self.lo, self.hi, self.ref_hi = key, lo, lo, lo
        self.holders: dict[int, int] = {}
        self.entries: deque[int] = deque()

    def hold(self, extent: int) -> None:
        self.holders[extent] = self.holders.get(extent, 0) + 1
        if extent > self.ref_hi:
            self.ref_hi = extent

    def unhold(self, extent: int) -> int:
        """Drop one holder of ``extent``; returns the new ``ref_hi``."""
        c = self.holders[extent] - 1
        if c:
            self.holders[extent] = c
        else:
            del self.holders[extent]
            if extent == self.ref_hi:
                self.ref_hi = max(self.holders) if self.holders else self.lo
        return self.ref_hi


class KVLease:
    """One request's KV blocks: ``blocks`` allocated (blocks), of which the first ``hashed`` are cached
    blocks held through ``held`` (``[node, extent]`` per segment, in order); the rest are private
    (unhashed). ``ranges``: the request's full-block ranges ``(key, lo, hi)`` (``harness.workload.prefix
    .block_ranges``)."""

    __slots__ = ("ranges", "blocks", "hashed", "held", "seg", "stop")

    def __init__(self, ranges: Sequence[tuple[int, int, int]] = ()):
        self.ranges = ranges
        self.blocks = 0
        self.hashed = 0
        self.held: list[list] = []
        self.seg = 0
        self.stop = False


class PrefixBlockPool:
    """The KV blocks of one engine: free, cached (hashed, unreferenced, evictable) and in use.

    Args:
        capacity_blocks: total blocks (>= 0). block_size: tokens per block (>= 1).
        enable_caching: ``False``: nothing is hashed, every freed block is plain free.

    Counters (blocks): ``free`` (never used or unhashed, reused first), ``cached`` (hashed with no
    reference, in LRU order), ``used = capacity - free - cached``.
    """

    def __init__(self, capacity_blocks: int, block_size: int, enable_caching: bool = True):
        self.capacity_blocks, self.bs, self.enable = capacity_blocks, block_size, enable_caching
        self.free = capacity_blocks
        self.cached = 0
        self.nodes: dict[int, _Node] = {}
        self._queue: OrderedDict[int, list] = OrderedDict()   # id -> [node, lo, hi], LRU first
        self._next_id = 0
        self.evicted = 0                                        # blocks evicted from the cache so far

    @property
    def available(self) -> int:
        """Blocks an allocation can get: free + cached (blocks)."""
        return self.free + self.cached

    @property
    def used(self) -> int:
        """Blocks referenced by requests (blocks)."""
        return self.capacity_blocks - self.free - self.cached

    # ---- lookup / admission -------------------------------------------------------------------
    def lookup(self, lease: KVLease, max_tokens: int) -> tuple[int, int]:
        """``(hit blocks, evictable hit blocks)``: the leading cached blocks of ``lease.ranges``, at most
        ``max_tokens // block_size``, and how many of them are in the free queue. No state change."""
        if not self.enable:
            return 0, 0
        limit = max_tokens // self.bs
        hit = ev = 0
        nodes = self.nodes
        for key, lo, hi in lease.ranges:
            if lo >= limit:
                break
            node = nodes.get(key)
            if node is None:
                break
            end = node.hi
            if hi < end:
                end = hi
            if limit < end:
                end = limit
            if end > node.ref_hi:
                ev += end - node.ref_hi
            hit = end
            if end < hi:
                break
        return hit, ev

    def acquire(self, lease: KVLease, hit: int) -> None:
        """Give ``lease`` (holding nothing) the first ``hit`` blocks found by :meth:`lookup` (touch: out
        of the free queue, referenced)."""
        lease.blocks = lease.hashed = hit
        lease.held = []
        lease.stop = False
        seg = 0
        if hit:
            for key, lo, hi in lease.ranges:
                if lo >= hit:
                    break
                node = self.nodes[key]
                end = hi if hi < hit else hit
                if end > node.ref_hi:
                    self._unqueue(node, end)
                node.hold(end)
                lease.held.append([node, end])
                if end == hi:
                    seg += 1
        lease.seg = seg

    def _unqueue(self, node: _Node, end: int) -> None:
        """Take the node's queued blocks below ``end`` out of the free queue (newest ranges are lowest)."""
        q = self._queue
        entries = node.entries
        while entries:
            ent = q[entries[-1]]
            if ent[1] >= end:
                break
            if ent[2] <= end:
                self.cached -= ent[2] - ent[1]
                del q[entries.pop()]
            else:
                self.cached -= end - ent[1]
                ent[1] = end
                break

    # ---- allocation -----------------------------------------------------------------------------
    def allocate(self, n: int) -> None:
        """Take ``n`` blocks from the front of the free queue: free ones first, then the least recently
        used cached ones (evicted, each range tail first). The caller checked ``n <= available``."""
        if n <= 0:
            return
        if n <= self.free:
            self.free -= n
            return
        n -= self.free
        self.free = 0
        self.cached -= n
        self.evicted += n
        q = self._queue
        while n:
            eid = next(iter(q))
            ent = q[eid]
            node = ent[0]
            take = ent[2] - ent[1]
            if take > n:
                take = n
            ent[2] -= take
            node.hi -= take
            n -= take
            if ent[2] == ent[1]:
                del q[eid]
                node.entries.popleft()
                if node.hi == node.lo:
                    del self.nodes[node.key]

    def grow(self, lease: KVLease, n: int, tokens: int) -> None:
        """Allocate ``n`` more blocks to ``lease`` and hash its full blocks up to token ``tokens`` (the
        tokens scheduled so far)."""
        if n > 0:
            if n <= self.free:      # allocate()'s first case, inline: free blocks only, no eviction
                self.free -= n
            else:
                self.allocate(n)
            lease.blocks += n
        if self.enable and not lease.stop:
            upto = tokens // self.bs
            if upto > lease.blocks:
                upto = lease.blocks
            if upto > lease.hashed:
                self._register(lease, upto)

    def _register(self, lease: KVLease, upto: int) -> None:
        h = lease.hashed
        ranges, held, nodes = lease.ranges, lease.held, self.nodes
        i = lease.seg
        while h < upto and i < len(ranges):
            key, lo, hi = ranges[i]
            target = hi if hi < upto else upto
            if held and held[-1][0].key == key:
                node, cur = held[-1]
            else:
                node = nodes.get(key)
                if node is None:
                    node = nodes[key] = _Node(key, lo)
                cur = -1
            if node.hi != h:         # another request cached these blocks meanwhile: ours stay private
                lease.stop = True
                break
            node.hi = target
            if cur < 0:
                node.hold(target)
                held.append([node, target])
            else:                    # node.unhold(cur); node.hold(target), inline (the hot case)
                hd = node.holders
                c = hd[cur] - 1
                if c:
                    hd[cur] = c
                else:
                    del hd[cur]
                    if cur == node.ref_hi:
                        node.ref_hi = max(hd) if hd else node.lo
                hd[target] = hd.get(target, 0) + 1
                if target > node.ref_hi:
                    node.ref_hi = target
                held[-1][1] = target
            h = target
            if target == hi:
                i += 1
        lease.hashed, lease.seg = h, i

    # ---- release --------------------------------------------------------------------------------
    def release(self, lease: KVLease) -> None:
        """Free all of ``lease``'s blocks in reverse order: unhashed ones to the front of the free queue,
        hashed ones no longer referenced to its back (tail of the chain first)."""
        self.free += lease.blocks - lease.hashed
        q = self._queue
        for node, extent in reversed(lease.held):
            ref = node.unhold(extent)
            if extent > ref:
                eid = self._next_id
                self._next_id += 1
                q[eid] = [node, ref, extent]
                node.entries.append(eid)
                self.cached += extent - ref
        lease.blocks = lease.hashed = lease.seg = 0
        lease.held = []
        lease.stop = False

    # ---- checks ---------------------------------------------------------------------------------
    def check(self, leases: Sequence[KVLease] = ()) -> None:
        """Assert the bookkeeping invariants (tests): counts add up, each node's queue ranges are its
        highest blocks, oldest highest; with ``leases`` (all live ones), references match."""
        assert 0 <= self.free <= self.capacity_blocks and self.cached >= 0
        assert self.cached == sum(e[2] - e[1] for e in self._queue.values())
        for key, node in self.nodes.items():
            assert node.key == key and node.lo <= node.ref_hi <= node.hi and node.hi > node.lo
            ents = [self._queue[e] for e in node.entries]
            top = node.hi
            for e in ents:
                assert e[0] is node and e[2] == top and e[1] < e[2], (key, ents, node.hi)
                top = e[1]
            assert top == node.ref_hi, (key, top, node.ref_hi)
        if leases:
            in_use = sum(le.blocks - le.hashed for le in leases)
            in_use += sum(n.ref_hi - n.lo for n in self.nodes.values())
            assert in_use == self.used, (in_use, self.used)
