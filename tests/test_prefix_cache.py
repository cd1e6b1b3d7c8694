"""Content-addressed prefix caching (harness.workload.prefix + harness.sim.kvcache), values derived by hand."""

from __future__ import annotations


from harness.workload.prefix import BlockContent, block_ranges
from harness.sim.kvcache import KVLease, PrefixBlockPool
from harness.core.trace import ConversationRecord, TurnRecord

BS = 4  # tokens per KV block in these tests


def turn(new, out=1, reused=0, hash_ids=None, tool=0.0, visible=True):
    return TurnRecord(new_input_tokens=new, reused_tokens=reused, output_tokens=out, tool_time_s=tool,
                      visible=visible, output_tokens_raw=out, hash_ids=hash_ids)


def req(cid, *turns, block=BS):
    return ConversationRecord(cid, tuple(turns), "test", hash_block_tokens=block if turns[0].hash_ids else 0)


def run_one(pool: PrefixBlockPool, content: BlockContent, cid: str, k: int, prompt: int, out: int) -> int:
    """Serve one request alone, as the engine does: lookup (cap prompt - 1), acquire, allocate the
    whole context, hash it, release. Returns the hit (tokens)."""
    lease = KVLease(block_ranges(content.segments(cid, k), BS))
    hit, ev = pool.lookup(lease, prompt - 1)
    need = -(-(prompt + out) // BS) - hit
    assert need + ev <= pool.available
    pool.acquire(lease, hit)
    pool.grow(lease, need, prompt + out)
    pool.check([lease])
    pool.release(lease)
    pool.check()
    return hit * BS


def test_three_requests_share_0_1_2_leading_blocks():
    # hash blocks of 4 tokens = one KV block each. A = [1, 2, 3]; B shares 2 leading blocks with A,
    # C shares 1, D none. Prompts of 12 tokens: at most (12 - 1) // 4 = 2 blocks can hit.
    recs = [req("A", turn(12, hash_ids=(1, 2, 3))), req("B", turn(12, hash_ids=(1, 2, 9))),
            req("C", turn(12, hash_ids=(1, 7, 8))), req("D", turn(12, hash_ids=(5, 6, 7)))]
    content = BlockContent(recs)
    pool = PrefixBlockPool(100, BS)
    hits = [run_one(pool, content, r.conversation_id, 0, 12, 1) for r in recs]
    assert hits == [0, 8, 4, 0]
    # "7" at position 2 of C and position 3 of D are different blocks (chained: different prefixes)
    # a repeat of A hits 2 blocks (not 3: the last prompt token is recomputed, vLLM's num_tokens - 1)
    assert run_one(pool, content, "A", 0, 12, 1) == 8


def test_running_request_blocks_are_shared_immediately():
    # vLLM hashes blocks when they are scheduled: B arrives while A still runs and hits A's blocks;
    # the shared blocks are counted once in the pool.
    recs = [req("A", turn(12, hash_ids=(1, 2, 3))), req("B", turn(12, hash_ids=(1, 2, 9)))]
    content = BlockContent(recs)
    pool = PrefixBlockPool(10, BS)
    a = KVLease(block_ranges(content.segments("A", 0), BS))
    pool.acquire(a, 0)
    pool.grow(a, 4, 13)                       # 13 tokens -> 4 blocks, 3 full ones hashed
    b = KVLease(block_ranges(content.segments("B", 0), BS))
    assert pool.lookup(b, 11) == (2, 0)       # 2 blocks hit, none of them in the free queue
    pool.acquire(b, 2)
    pool.grow(b, 2, 13)                       # blocks 2 and 3 of B are its own
    assert pool.used == 6 and pool.free == 4  # 4 (A) + 2 (B): the 2 shared blocks once
    pool.check([a, b])
    pool.release(a)                           # A's blocks 2, 3 freed; 0, 1 still held by B
    assert pool.cached == 1 and pool.free == 5  # block 2 of A hashed -> cached; its partial block 3 free
    pool.release(b)
    pool.check()
    assert pool.cached == 4 and pool.free == 6 and pool.used == 0


def test_lru_eviction_order_two_conversations_sharing_a_system_prompt_block():
    # bs = 4, a 4-token system prompt shared by X and Y (one block S). Each first turn: 11-token
    # prompt + 1 output = 12 tokens = 3 full blocks: S, X1, X2 (Y: S, Y1, Y2). Pool of 5 blocks.
    recs = [ConversationRecord("X", (turn(11), turn(3, reused=12)), "t"),
            ConversationRecord("Y", (turn(11), turn(3, reused=12)), "t"),
            ConversationRecord("Z", (turn(7), turn(3, reused=8)), "t")]
    content = BlockContent(recs, shared_prefix_tokens=4)
    assert content.segments("X", 0)[0] == content.segments("Y", 0)[0]          # the system prompt
    pool = PrefixBlockPool(5, BS)
    assert run_one(pool, content, "X", 0, 11, 1) == 0
    # X released tail first: free queue = [free x2][X2, X1, S] (LRU first)
    assert (pool.free, pool.cached) == (2, 3)
    # Y hits S (the shared block leaves the queue), takes the 2 free blocks for Y1, Y2
    assert run_one(pool, content, "Y", 0, 11, 1) == 4
    # queue now: X2, X1 (released first), then Y's release: Y2, Y1, S
    assert (pool.free, pool.cached) == (0, 5)
    # Z (a third conversation, same system prompt) -> hits S, needs 1 more block for its 7 + 1 tokens
    # (2 blocks: S + Z1) -> evicts X2, the least recently used block (X's tail went first)
    assert run_one(pool, content, "Z", 0, 7, 1) == 4
    x = KVLease(block_ranges(content.segments("X", 1), BS))
    y = KVLease(block_ranges(content.segments("Y", 1), BS))
    assert pool.lookup(x, 14)[0] == 2         # X's turn 1: S, X1 left (X2 evicted)
    assert pool.lookup(y, 14)[0] == 3         # Y's turn 1: S, Y1, Y2 all cached
    # the queue is now X1, Y2, Y1, Z1, S: two more evictions take X1 then Y2
    pool.allocate(2)
    assert pool.lookup(x, 14)[0] == 1 and pool.lookup(y, 14)[0] == 2
    pool.allocate(1)                          # Y1
    assert pool.lookup(y, 14)[0] == 1
    pool.allocate(1)                          # Z1 (Z's tail, released after Y)
    assert pool.lookup(y, 14)[0] == 1         # S is the most recently used block: last to go
    pool.allocate(1)
    assert pool.lookup(y, 14)[0] == 0 and pool.available == 0


def test_per_conversation_rewrite_is_exact():
    # A conversation that rewrites its context (SWE-agent's history processors): turn 1 reuses all 20
    # tokens of turn 0's context, turn 2 reuses only 9 of turn 1's 26 -> hits 9 // 4 = 2 blocks, and
    # turn 3 (reusing all of turn 2) hits turn 2's blocks, not turn 1's stale ones beyond token 9.
    rec = ConversationRecord("c", (turn(18, 2), turn(5, 1, reused=20), turn(10, 2, reused=9),
                                   turn(3, 1, reused=21)), "t")
    content = BlockContent([rec])
    pool = PrefixBlockPool(100, BS)
    hits = [run_one(pool, content, "c", k, t.prompt_tokens, t.output_tokens) for k, t in enumerate(rec.turns)]
    # turn 1: 20 reused, prompt 25 -> 20 // 4 = 5 blocks; turn 2: 9 -> 2 blocks;
    # turn 3: prompt 24, its previous context 21 tokens -> 5 full blocks, all of turn 2's content
    assert hits == [0, 20, 8, 20]
    # cached: turn 1's context blocks 0..5 (blocks 2..5 now stale: vLLM keeps them until evicted, no
    # request has them any more) + blocks 2..5 of the rewritten context = 6 + 4 = 10 distinct blocks
    assert pool.cached == 10 and pool.free == 90
