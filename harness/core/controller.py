"""The closed-loop controller: one state machine of conversations and turns for every backend.

arrival -> (held) admission -> placement -> backend (prefill, KV transfer, decode) -> tool time ->
next turn. Turn k+1 becomes ready when turn k finished plus the trace's tool time (closed loop; ``timing=
"think"``), or with ``timing="original"`` at its recorded send time (``TurnRecord.send_s`` after the root
session's start) or when turn k finished, whichever is later. Fan-out and join (session traces with
sub-agents, ``ConversationRecord.parent_id``): a child conversation starts when its parent's turn
``spawn_after_turn`` finishes (its first call ready at once under ``think``, at its recorded send time under
``original``); the parent's next turn becomes ready only when every joined child spawned there has ended,
plus the parent's tool time (``think``) or at its recorded send time (``original``), whichever is later.
Children are conversations of their own (their own KV and prefix blocks, turns, placements), never gated by
``max_active`` (a session's sub-agents are part of the session) and never started by arrivals. Every admission hold and placement goes to the recorder as a typed decision with a
digest of the view it was made on.

The controller only needs a cluster (``harness.core.backend.Cluster``) whose clock has ``now()`` and
``call_at(t, fn, *args)``: the simulator's event heap or a wall-clock loop. It is built in one place,
``harness.run.session.run_session``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional, Sequence

from harness.core.backend import Cluster, TurnJob
from harness.core.clock import SimClock
from harness.core.policy import Admission, ClusterView, InstanceHints, InstanceView, Placement, Policy, TurnView
from harness.core.recorder import HoldDecision, PlaceDecision, Recorder, ViewDigest
from harness.core.routing import ModelRoutes
from harness.core.trace import TIMINGS, ConversationRecord


@dataclass(slots=True, eq=False)
class ConversationState:
    """Run-time state of one conversation (times in s)."""

    index: int
    record: ConversationRecord
    arrival_s: float
    reused: tuple
    next_turn: int = 0
    prev_prefill: int = -1
    prev_decode: int = -1
    prev_output: int = 0
    counted_on: int = -1
    context_tokens: int = 0
    done: bool = False
    failed: bool = False
    finish_s: float = math.nan
    # load shapes (``Controller(max_active=..., stop_s=...)``): begun = started (past the concurrency gate);
    # stopped = cut by the duration stop with turns left; not_started = never started before the stop;
    # client_wait_s = start - scheduled arrival (the gate's wait)
    begun: bool = False
    stopped: bool = False
    not_started: bool = False
    client_wait_s: float = 0.0
    # fan-out / join (session traces): the parent's state, the children spawned after each of its turns, how
    # many joined children it still waits for, the turn whose successor waits (-1: none), and the root
    # session's start (``timing="original"``: recorded send times count from it)
    parent: Optional["ConversationState"] = None
    children_after: Optional[dict] = None
    pending_join: int = 0
    join_turn: int = -1
    origin_s: float = 0.0


class Controller:
    """Replays conversations through a policy on a cluster.

    Args:
        cluster: executes turns and has the clock (``now()`` / ``call_at``). policy: admission +
            placement. conversations: ``(arrival_s, ConversationRecord)`` pairs.
        recorder: receives every finished or failed turn and every decision (typed records: a
            placement each, and an admission hold whenever the number of held turns changes).
        hints: per-instance hardware hints shown to policies in the view.
        link_bandwidth_bytes_per_s, link_latency_s, kv_bytes_per_token: shown to policies in the view.
        on_conversation: called with each finished ``ConversationState``.
        max_context_tokens: the served model's context limit, tokens; a turn whose prompt + output
            exceed it fails at once, as a server rejects it (``workload.context_overflow=fail``; the other
            policies removed such turns before the run). ``None``: no limit.
        max_active: at most this many conversations active at once (``workload.concurrency`` of a closed
            population, or ``workload.max_concurrency``); an arrival beyond it waits (FIFO) until one ends
            and starts then (its ``arrival_s`` becomes the start, ``client_wait_s`` the wait). ``None``: no cap.
        stop_s: the duration stop (``workload.duration_s``, s of the run clock): after it no conversation
            starts and no turn is submitted; turns on the backend finish; a conversation with turns left is
            ended as ``stopped``; one not started as ``not_started``. ``None``: run to the end.
        pinned: ``{(conversation_id, turn): s}``, the recorded arrival of each turn (``harness.workload.replay``):
            turn k >= 1 is ready then instead of after its tool time, or at its previous turn's finish when
            that is later (counted in ``pinned_late`` with the largest lateness ``pinned_late_max_s``, s); a turn
            without a time keeps its tool time (``pinned_missing``). ``None``: tool times.
        timing: ``think`` (turn k+1 ready ``tool_time_s`` after turn k ended) or ``original`` (at its recorded
            ``send_s`` from the root session's start, or when turn k ended if later); module docstring.
        routes: ``workload.model_map`` resolved on the cluster (``harness.core.routing``): each call is placed
            by the policy on the pool its recorded model maps to, shown as a sub-cluster renumbered ``0 .. m-1``
            (the placement mapped back). ``None``: every call may go to every instance.

    Raises:
        ValueError: duplicate conversation ids, a child whose parent is not in ``conversations``,
            ``timing`` unknown, ``timing="original"`` with a turn lacking ``send_s``, or a call whose model maps
            to an empty pool (``workload.model_map``: no pattern matches it and the cluster has no unnamed
            group); at decision time:
            a policy returned an invalid admission index or placement instance.
    """

    def __init__(self, cluster: Cluster, policy: Policy, conversations: Sequence[tuple[float, ConversationRecord]],
                 recorder: Recorder, hints: Sequence[InstanceHints], *, link_bandwidth_bytes_per_s: float,
                 link_latency_s: float, kv_bytes_per_token: int,
                 on_conversation: Callable[[ConversationState], None] = lambda c: None,
                 max_context_tokens: Optional[int] = None, max_active: Optional[int] = None,
                 stop_s: Optional[float] = None, pinned: Optional[Mapping[tuple[str, int], float]] = None,
                 timing: str = "think", routes: Optional[ModelRoutes] = None):
        self.clock, self.backend, self.policy, self.recorder = cluster.clock, cluster, policy, recorder
        self._hints = tuple(hints)
        self.convs = [ConversationState(i, rec, t, tuple(tr.reused_tokens for tr in rec.turns))
                      for i, (t, rec) in enumerate(conversations)]
        self._by_id = {c.record.conversation_id: c for c in self.convs}
        if len(self._by_id) != len(self.convs):
            raise ValueError("conversation ids in a workload must be unique")
        if timing not in TIMINGS:
            raise ValueError(f"workload.timing must be one of {', '.join(TIMINGS)}, got {timing!r}")
        self.timing = timing
        for c in self.convs:
            rec = c.record
            if timing == "original" and any(t.send_s is None for t in rec.turns):
                raise ValueError(f"workload.timing=original needs recorded send times (send_s) on every turn; "
                                 f"conversation {rec.conversation_id!r} has none (use timing=think)")
            if rec.parent_id is None:
                continue
            parent = self._by_id.get(rec.parent_id)
            if parent is None:
                raise ValueError(f"conversation {rec.conversation_id!r}: its parent {rec.parent_id!r} is not in "
                                 f"the workload (a child needs its parent)")
            c.parent = parent
            if parent.children_after is None:
                parent.children_after = {}
            parent.children_after.setdefault(rec.spawn_after_turn, []).append(c)
        self.routes = routes
        if routes is not None:
            for c in self.convs:
                for k, t in enumerate(c.record.turns):
                    if not routes.pool_of(t.model):
                        raise ValueError(f"workload.model_map: call {k} of conversation {c.record.conversation_id!r} "
                                         f"(model {t.model!r}) matches no pattern, and the cluster has no unnamed "
                                         f"instance group to serve it (add a catch-all pattern '*')")
        self._link = (link_bandwidth_bytes_per_s, link_latency_s)
        self._kvb = kv_bytes_per_token
        self.on_conversation = on_conversation
        self.max_context_tokens = max_context_tokens
        self.log_decisions = recorder.log_decisions
        # the held turns, FIFO: their states and their views (the queue a policy sees), kept in step
        self.held: list[ConversationState] = []
        self._queue: list[TurnView] = []
        n = len(cluster.infos)
        self._queued_prefill = [0] * n
        self._queued_uncached = [0] * n
        self._uncached_of: dict[tuple[str, int], int] = {}
        self._conversations_on = [0] * n
        self._context_on = [0] * n
        # per instance, three dicts in one insertion order (placement order): conversation id -> latest turn
        # placed / context tokens / turn in flight; and the tuples a view shows of them, rebuilt (C-level,
        # ``tuple(d.items())``) only after the instance's book changed
        self._turn_on: list[dict[str, int]] = [{} for _ in range(n)]
        self._ctx_on: list[dict[str, int]] = [{} for _ in range(n)]
        self._busy_on: list[dict[str, bool]] = [{} for _ in range(n)]
        self._book: list = [None] * n
        # the last InstanceView of each instance and what it was built from: reused while nothing changed
        self._iv: list = [None] * n
        self._iv_key: list = [None] * n
        self._observe_load = cluster.observe_load   # observe without energy (harness.core.backend.ClusterBase)
        # on the simulator's clock nothing changes the cluster between two calls inside one event, so the first
        # turn an admission releases is placed on the admission's view (its held count updated); a wall-clock
        # backend is observed afresh
        self._same_instant_views = isinstance(cluster.clock, SimClock)
        # per conversation: instance -> tokens of its context that instance holds (where its turns ran)
        self._holds: dict[str, dict[int, int]] = {}
        self._recheck_at = math.inf
        self._last_logged_hold = 0
        self.num_done = 0
        # load shapes (off by default: the plain path schedules arrivals straight to _ready)
        self.max_active, self.stop_s = max_active, stop_s
        self._shaped = max_active is not None or stop_s is not None
        self.active = self.max_active_seen = 0
        self._gate: list[ConversationState] = []
        self._in_flight: set[str] = set()
        self.stopping = False
        self.pinned = pinned
        self.pinned_late = self.pinned_missing = 0
        self.pinned_late_max_s = 0.0

    # ---- run ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Schedule every conversation's arrival (and the duration stop)."""
        if self._shaped:
            for c in self.convs:
                if c.parent is None:       # children are spawned by their parents
                    self.clock.call_at(c.arrival_s, self._arrive, c)
            if self.stop_s is not None:
                self.clock.call_at(self.stop_s, self._stop)
            return
        for c in self.convs:
            if c.parent is None:
                c.origin_s = c.arrival_s
                self.clock.call_at(self._first_ready_s(c), self._ready, c)

    def _first_ready_s(self, c: ConversationState) -> float:
        """When a started conversation's turn 0 is ready (s): now (``think``), else its recorded send time."""
        if self.timing == "original":
            return max(c.arrival_s, c.origin_s + c.record.turns[0].send_s)
        return c.arrival_s

    def _next_ready_s(self, c: ConversationState, k: int, now: float) -> float:
        """When turn ``k + 1`` of ``c`` is ready, turn ``k`` having ended (and its join done) at ``now``, s: with
        ``pinned``, its recorded arrival, not before now (a turn without one keeps the ``timing`` rule);
        else ``now`` + the tool time (``think``) or its recorded send time (``original``), not before now."""
        if self.pinned is not None:
            t = self.pinned.get((c.record.conversation_id, k + 1))
            if t is None:
                self.pinned_missing += 1
            elif t < now:
                self.pinned_late += 1
                self.pinned_late_max_s = max(self.pinned_late_max_s, now - t)
                return now
            else:
                return t
        if self.timing == "original":
            return max(now, c.origin_s + c.record.turns[k + 1].send_s)
        return now + c.record.turns[k].tool_time_s

    # ---- fan-out and join (session traces) ----------------------------------------------------
    def _spawn(self, parent: ConversationState, k: int) -> None:
        """Start the children spawned after turn ``k`` of ``parent``; count the joined ones."""
        now = self.clock.now()
        for ch in parent.children_after.get(k, ()):
            if ch.done:
                continue
            ch.begun = True
            ch.arrival_s = now
            ch.origin_s = parent.origin_s
            if ch.record.join:
                parent.pending_join += 1
            self.clock.call_at(self._first_ready_s(ch), self._ready, ch)

    def _joined(self, child: ConversationState) -> None:
        """A joined child ended: release its parent's next turn when it was the last one awaited."""
        p = child.parent
        p.pending_join -= 1
        if p.pending_join or p.join_turn < 0 or p.done:
            return
        k, p.join_turn = p.join_turn, -1
        if self.stopping:
            p.stopped = True
            self._end(p, self.clock.now())
        else:
            self.clock.call_at(self._next_ready_s(p, k, self.clock.now()), self._ready, p)

    # ---- load shapes: the concurrency gate and the duration stop ----------------------------------
    def _arrive(self, c: ConversationState) -> None:
        if c.done:
            return
        if self.max_active is not None and self.active >= self.max_active:
            self._gate.append(c)
            return
        self._begin(c)

    def _begin(self, c: ConversationState) -> None:
        now = self.clock.now()
        c.begun = True
        c.client_wait_s = now - c.arrival_s
        c.arrival_s = c.origin_s = now
        self.active += 1
        self.max_active_seen = max(self.max_active_seen, self.active)
        if self.timing == "original" and c.record.turns[0].send_s > 0:
            self.clock.call_at(self._first_ready_s(c), self._ready, c)
        else:
            self._ready(c)

    def _stop(self) -> None:
        """The duration stop (``stop_s``): see the class docstring."""
        self.stopping = True
        now = self.clock.now()
        for c in self.convs:
            if c.done:
                continue
            if not c.begun:                      # not arrived yet, or waiting at the gate
                c.not_started = c.done = True
                self.num_done += 1
                self.on_conversation(c)
            elif c.record.conversation_id not in self._in_flight:   # in tool time or held for admission
                c.stopped = True
                self._end(c, now)
        self._gate.clear()
        keep = [i for i, c in enumerate(self.held) if not c.done]
        self.held[:] = [self.held[i] for i in keep]
        self._queue[:] = [self._queue[i] for i in keep]
        self.backend.progress()  # a wall-clock loop: let it see the run may be done (ClusterBase: a no-op by default)

    @property
    def finished(self) -> bool:
        """True when every conversation is done or failed."""
        return self.num_done == len(self.convs)

    def view(self) -> ClusterView:
        """The snapshot a policy sees now: backend observations + the controller's bookkeeping.

        Cost O(instances) while no instance's conversations changed; an instance whose conversations
        changed since the last view rebuilds its three tuples (C-level copies of its book)."""
        loads = self._observe_load()
        ivs, keys, infos = self._iv, self._iv_key, self.backend.infos
        for i, (kv_used, running, waiting) in enumerate(loads):
            book = self._book[i]
            if book is None:
                book = self._book[i] = (tuple(self._turn_on[i].items()), tuple(self._ctx_on[i].values()),
                                        tuple(self._busy_on[i].values()))
            key = (kv_used, running, waiting, self._queued_prefill[i], self._conversations_on[i],
                   self._context_on[i], self._queued_uncached[i], book)
            if keys[i] != key:              # (the book compares by identity first: the same tuple object)
                info = infos[i]
                ivs[i] = InstanceView(info.index, info.name, info.role, info.hardware, info.kv_capacity_tokens,
                                      kv_used, running, waiting, self._queued_prefill[i],
                                      self._conversations_on[i], self._context_on[i], book[0],
                                      self._hints[i].prefill_tokens_per_s, self._queued_uncached[i], book[1],
                                      book[2])
                keys[i] = key
        return ClusterView(self.clock.now(), tuple(ivs), self._kvb, self._link[0], self._link[1], len(self.held))

    def _ready(self, c: ConversationState) -> None:
        if c.done:   # ended by the duration stop while in tool time
            return
        k = c.next_turn
        tr = c.record.turns[k]
        holds = self._holds.get(c.record.conversation_id, {})
        cached = tuple((i, min(n, tr.reused_tokens)) for i, n in sorted(holds.items()) if min(n, tr.reused_tokens) > 0)
        tv = TurnView(c.record.conversation_id, k, tr.prompt_tokens, tr.reused_tokens, tr.new_input_tokens,
                      c.arrival_s, self.clock.now(), c.prev_prefill, c.prev_decode, c.prev_output, cached)
        self.held.append(c)
        self._queue.append(tv)
        self._poll()

    def _poll(self) -> None:
        if not self.held:
            return
        now = self.clock.now()
        view = self.view()
        queue, held = self._queue, self.held
        adm: Admission = self.policy.admit(queue, view, now)
        n = len(queue)
        admit = adm.admit
        if admit == tuple(range(len(admit))):   # a FIFO head (admit-all, or the gates open): no sort needed
            chosen = admit
        else:
            chosen = sorted(set(admit))
        if chosen and (chosen[0] < 0 or chosen[-1] >= n):
            raise ValueError(f"policy {self.policy.name}: admission index out of range: {adm.admit}")
        n_held = n - len(chosen)
        if self.log_decisions and n_held and n_held != self._last_logged_hold:
            self.recorder.decision(HoldDecision(view.now_s, f"{n_held} held: {adm.reason}", ViewDigest.of(view)))
        self._last_logged_hold = n_held
        if chosen:
            released = [(held[i], queue[i]) for i in chosen]
            if chosen[-1] == len(chosen) - 1:   # the head of the queue (all of it, with admit-all)
                del held[:len(chosen)]
                del queue[:len(chosen)]
            else:
                for i in reversed(chosen):
                    del held[i]
                    del queue[i]
            for j, (c, tv) in enumerate(released):
                if j or not self._same_instant_views:
                    v = self.view()
                else:   # nothing has run since `view` (same instant, no event): only the held count changed
                    v = ClusterView(view.now_s, view.instances, view.kv_bytes_per_token,
                                    view.link_bandwidth_bytes_per_s, view.link_latency_s, len(self.held))
                self._launch(c, tv, v)
        recheck = adm.recheck_at
        if recheck is not None and self.held and recheck < self._recheck_at:
            # never "again right now": a policy that keeps asking for that would loop at one instant
            self._recheck_at = max(recheck, now + 1e-6)
            self.clock.call_at(self._recheck_at, self._recheck)

    def _recheck(self) -> None:
        if self.clock.now() >= self._recheck_at:
            self._recheck_at = math.inf
            self._poll()

    def _place_in_pool(self, c: ConversationState, tv: TurnView, view: ClusterView, now: float) -> Placement:
        """``workload.model_map``: the policy places the turn on its model's pool, shown as a sub-cluster of the
        pool's instances renumbered ``0 .. m-1`` (the turn's previous instances and cached prefixes kept where
        they lie in the pool, dropped elsewhere); the placement is mapped back to the cluster's indices."""
        pool = self.routes.pool_of(c.record.turns[tv.turn].model)
        local = {g: j for j, g in enumerate(pool)}
        sub = ClusterView(view.now_s, tuple(replace(view.instances[g], index=j) for j, g in enumerate(pool)),
                          view.kv_bytes_per_token, view.link_bandwidth_bytes_per_s, view.link_latency_s,
                          view.num_held)
        stv = replace(tv, prev_prefill_instance=local.get(tv.prev_prefill_instance, -1),
                      prev_decode_instance=local.get(tv.prev_decode_instance, -1),
                      cached_prefix=tuple((local[i], n) for i, n in tv.cached_prefix if i in local))
        p: Placement = self.policy.place(stv, sub, now)
        m = len(pool)
        if not (0 <= p.prefill_instance < m and 0 <= p.decode_instance < m):
            raise ValueError(f"policy {self.policy.name}: placement {p} names an instance outside 0..{m - 1} of its "
                             f"model's pool (workload.model_map)")
        return replace(p, prefill_instance=pool[p.prefill_instance], decode_instance=pool[p.decode_instance],
                       candidates=tuple((pool[i], x) if 0 <= i < m else (i, x) for i, x in p.candidates))

    def _launch(self, c: ConversationState, tv: TurnView, view: ClusterView) -> None:
        now = self.clock.now()
        if self.routes is None:
            p: Placement = self.policy.place(tv, view, now)
        else:
            p = self._place_in_pool(c, tv, view, now)
        n = len(view.instances)
        if not (0 <= p.prefill_instance < n and 0 <= p.decode_instance < n):
            raise ValueError(f"policy {self.policy.name}: placement {p} names an instance outside 0..{n - 1}")
        if self.log_decisions:
            self.recorder.decision(PlaceDecision(view.now_s, tv.conversation_id, tv.turn, p.prefill_instance,
                                                 p.decode_instance, p.reason, p.candidates, ViewDigest.of(view),
                                                 p.misrouted))
        tr = c.record.turns[tv.turn]
        self._count(c, p.decode_instance, tr.prompt_tokens, in_flight=True)
        uncached = tr.prompt_tokens - tv.cached_on(p.prefill_instance)
        self._uncached_of[(tv.conversation_id, tv.turn)] = uncached
        self._queued_uncached[p.prefill_instance] += uncached
        job = TurnJob(tv.conversation_id, tv.turn, tr.prompt_tokens, tr.output_tokens, c.reused, p,
                      self._prefill_done, self._finish, self._fail,
                      submit_s=tv.submit_s, admit_s=now)
        self._queued_prefill[p.prefill_instance] += tr.prompt_tokens
        if self.max_context_tokens and tr.prompt_tokens + tr.output_tokens > self.max_context_tokens:
            job.start_s = now
            job.error = (f"context_length: prompt {tr.prompt_tokens} + output {tr.output_tokens} tokens exceed the "
                         f"model's context of {self.max_context_tokens}")
            self._fail(job, job.error)
            return
        if self._shaped:
            self._in_flight.add(tv.conversation_id)
        self.backend.start_turn(job)

    def _count(self, c: ConversationState, instance: int, context_tokens: int, in_flight: bool = False) -> None:
        """Book conversation ``c`` (its context, tokens; whether a turn of it is being served) on
        ``instance`` (-1: on none)."""
        cid = c.record.conversation_id
        j = c.counted_on
        if j >= 0:
            self._conversations_on[j] -= 1
            self._context_on[j] -= c.context_tokens
            del self._turn_on[j][cid], self._ctx_on[j][cid], self._busy_on[j][cid]
            self._book[j] = None
        c.counted_on, c.context_tokens = instance, context_tokens
        if instance >= 0:
            self._conversations_on[instance] += 1
            self._context_on[instance] += context_tokens
            self._turn_on[instance][cid] = c.next_turn
            self._ctx_on[instance][cid] = context_tokens
            self._busy_on[instance][cid] = in_flight
            self._book[instance] = None

    def _unqueue(self, job: TurnJob) -> None:
        """The job's prompt left its prefill instance's queue (prefilled, or failed before that)."""
        self._queued_prefill[job.placement.prefill_instance] -= job.prompt_tokens
        self._queued_uncached[job.placement.prefill_instance] -= self._uncached_of.pop((job.conversation_id, job.turn), 0)

    def _prefill_done(self, job: TurnJob) -> None:
        self._unqueue(job)

    def _finish(self, job: TurnJob) -> None:
        c = self._by_id[job.conversation_id]
        self.recorder.turn(job)
        c.prev_prefill, c.prev_decode = job.placement.prefill_instance, job.placement.decode_instance
        c.prev_output = job.output_tokens
        self._count(c, c.counted_on, job.prompt_tokens + job.output_tokens)
        holds = self._holds.setdefault(job.conversation_id, {})
        reused = c.record.turns[job.turn].reused_tokens
        for i in holds:  # what no longer matches the conversation's context is not a prefix of it any more
            holds[i] = min(holds[i], reused)
        pl = job.placement
        if pl.disaggregated:
            holds[pl.prefill_instance] = max(holds.get(pl.prefill_instance, 0), job.prompt_tokens)
        holds[pl.decode_instance] = job.prompt_tokens + job.output_tokens
        c.next_turn = job.turn + 1
        self._in_flight.discard(job.conversation_id)
        if c.children_after is not None and job.turn in c.children_after and not self.stopping:
            self._spawn(c, job.turn)
        if c.next_turn < len(c.record.turns):
            if self.stopping:
                c.stopped = True
                self._end(c, self.clock.now())
            elif c.pending_join:
                c.join_turn = job.turn         # the next turn waits for the children (``_joined``)
            else:
                self.clock.call_at(self._next_ready_s(c, job.turn, self.clock.now()), self._ready, c)
        else:
            self._end(c, self.clock.now())
        self._poll()

    def _fail(self, job: TurnJob, reason: str) -> None:
        if job.prefill_done_s is None:
            self._unqueue(job)
        c = self._by_id[job.conversation_id]
        self.recorder.turn(job)
        self._in_flight.discard(job.conversation_id)
        c.failed = True
        self._end(c, self.clock.now())
        self._poll()

    def _end(self, c: ConversationState, t: float) -> None:
        c.done = True
        c.finish_s = t
        self._count(c, -1, 0)
        self._holds.pop(c.record.conversation_id, None)
        self.num_done += 1
        self.on_conversation(c)
        if c.children_after is not None:     # children it never reached are never started
            for k, kids in c.children_after.items():
                for ch in kids:
                    if not ch.begun and not ch.done:
                        ch.not_started = ch.done = True
                        self.num_done += 1
                        self.on_conversation(ch)
        if c.parent is not None:
            if c.record.join and c.begun:
                self._joined(c)
            return                           # a child: not counted against max_active
        if self._shaped:
            self.active -= 1
            if self._gate and not self.stopping:
                self._begin(self._gate.pop(0))
