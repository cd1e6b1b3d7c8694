"""The closed-loop controller: one state machine of conversations and turns for every backend.

arrival -> (held) admission -> placement -> backend (prefill, KV transfer, decode) -> tool time ->
next turn. Turn k+1 becomes ready when turn k finished plus the trace's tool time (closed loop), never at
a recorded timestamp. Every admission hold and placement goes to the recorder as a typed decision with a
digest of the view it was made on.

The controller only needs a cluster (``harness.backend.Cluster``) whose clock has ``now()`` and
``call_at(t, fn, *args)``: the simulator's event heap or a wall-clock loop. It is built in one place,
``harness.session.run_session``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from harness.backend import Cluster, TurnJob
from harness.policy import Admission, ClusterView, InstanceHints, InstanceView, Placement, Policy, TurnView
from harness.recorder import HoldDecision, PlaceDecision, Recorder, ViewDigest
from harness.trace import ConversationRecord


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

    Raises (at decision time):
        ValueError: a policy returned an invalid admission index or placement instance.
    """

    def __init__(self, cluster: Cluster, policy: Policy, conversations: Sequence[tuple[float, ConversationRecord]],
                 recorder: Recorder, hints: Sequence[InstanceHints], *, link_bandwidth_bytes_per_s: float,
                 link_latency_s: float, kv_bytes_per_token: int,
                 on_conversation: Callable[[ConversationState], None] = lambda c: None):
        self.clock, self.backend, self.policy, self.recorder = cluster.clock, cluster, policy, recorder
        self._hints = tuple(hints)
        self.convs = [ConversationState(i, rec, t, tuple(tr.reused_tokens for tr in rec.turns))
                      for i, (t, rec) in enumerate(conversations)]
        self._by_id = {c.record.conversation_id: c for c in self.convs}
        if len(self._by_id) != len(self.convs):
            raise ValueError("conversation ids in a workload must be unique")
        self._link = (link_bandwidth_bytes_per_s, link_latency_s)
        self._kvb = kv_bytes_per_token
        self.on_conversation = on_conversation
        self.log_decisions = recorder.log_decisions
        self.held: list[tuple[ConversationState, TurnView]] = []
        self._held_views: list[TurnView] = []   # the turns of ``held``, kept in step (the policy's queue)
        n = len(cluster.infos)
        self._queued_prefill = [0] * n
        self._conversations_on = [0] * n
        self._context_on = [0] * n
        self._convs_on: list[dict[str, int]] = [{} for _ in range(n)]
        self._convs_tuple: list = [None] * n    # tuple(self._convs_on[i].items()), rebuilt only after a change
        self._recheck_at = math.inf
        self._last_logged_hold = 0
        self.num_done = 0

    # ---- run ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Schedule every conversation's arrival."""
        for c in self.convs:
            self.clock.call_at(c.arrival_s, self._ready, c)

    @property
    def finished(self) -> bool:
        """True when every conversation is done or failed."""
        return self.num_done == len(self.convs)

    def view(self) -> ClusterView:
        """The snapshot a policy sees now: backend observations + the controller's bookkeeping."""
        states = self.backend.observe()
        convs = self._convs_tuple
        for i, t in enumerate(convs):
            if t is None:
                convs[i] = tuple(self._convs_on[i].items())
        inst = tuple(
            InstanceView(info.index, info.name, info.role, info.hardware, info.kv_capacity_tokens,
                         s.kv_used_tokens, s.num_running, s.num_waiting, self._queued_prefill[i],
                         self._conversations_on[i], self._context_on[i],
                         convs[i], self._hints[i].prefill_tokens_per_s)
            for i, (info, s) in enumerate(zip(self.backend.infos, states)))
        return ClusterView(self.clock.now(), inst, self._kvb, self._link[0], self._link[1], len(self.held))

    def _ready(self, c: ConversationState) -> None:
        k = c.next_turn
        tr = c.record.turns[k]
        tv = TurnView(c.record.conversation_id, k, tr.prompt_tokens, tr.reused_tokens, tr.new_input_tokens,
                      c.arrival_s, self.clock.now(), c.prev_prefill, c.prev_decode, c.prev_output)
        self.held.append((c, tv))
        self._held_views.append(tv)
        self._poll()

    def _poll(self) -> None:
        if not self.held:
            return
        now = self.clock.now()
        view = self.view()
        queue = self._held_views
        n_queue = len(queue)
        adm: Admission = self.policy.admit(queue, view, now)
        chosen = sorted(set(adm.admit))
        if chosen and (chosen[0] < 0 or chosen[-1] >= n_queue):
            raise ValueError(f"policy {self.policy.name}: admission index out of range: {adm.admit}")
        n_held = n_queue - len(chosen)
        if self.log_decisions and n_held and n_held != self._last_logged_hold:
            self.recorder.decision(HoldDecision(view.now_s, f"{n_held} held: {adm.reason}", ViewDigest.of(view)))
        self._last_logged_hold = n_held
        held = self.held
        released = [held[i] for i in chosen]
        if len(chosen) == n_queue:
            held.clear()
            queue.clear()
        else:   # remove the released ones in place (the rest keep their FIFO order)
            for i in reversed(chosen):
                del held[i]
                del queue[i]
        for j, (c, tv) in enumerate(released):
            # the first placement sees the admission's view (nothing in the cluster has changed since: admit
            # is pure) with the new number of held turns; each later one a fresh view that includes the
            # launches before it
            if j == 0:
                self._launch(c, tv, view if view.num_held == len(held) else replace(view, num_held=len(held)))
            else:
                self._launch(c, tv, self.view())
        recheck = adm.recheck_at
        if recheck is not None and self.held and recheck < self._recheck_at:
            # never "again right now": a policy that keeps asking for that would loop at one instant
            self._recheck_at = max(recheck, now + 1e-6)
            self.clock.call_at(self._recheck_at, self._recheck)

    def _recheck(self) -> None:
        if self.clock.now() >= self._recheck_at:
            self._recheck_at = math.inf
            self._poll()

    def _launch(self, c: ConversationState, tv: TurnView, view: ClusterView) -> None:
        now = self.clock.now()
        p: Placement = self.policy.place(tv, view, now)
        n = len(view.instances)
        if not (0 <= p.prefill_instance < n and 0 <= p.decode_instance < n):
            raise ValueError(f"policy {self.policy.name}: placement {p} names an instance outside 0..{n - 1}")
        if self.log_decisions:
            self.recorder.decision(PlaceDecision(view.now_s, tv.conversation_id, tv.turn, p.prefill_instance,
                                                 p.decode_instance, p.reason, p.candidates, ViewDigest.of(view)))
        tr = c.record.turns[tv.turn]
        self._count(c, p.decode_instance, tr.prompt_tokens)
        job = TurnJob(tv.conversation_id, tv.turn, tr.prompt_tokens, tr.output_tokens, c.reused, p,
                      self._prefill_done, self._finish, self._fail,
                      submit_s=tv.submit_s, admit_s=now)
        self._queued_prefill[p.prefill_instance] += tr.prompt_tokens
        self.backend.start_turn(job)

    def _count(self, c: ConversationState, instance: int, context_tokens: int) -> None:
        """Book conversation ``c`` (its context, tokens) on ``instance`` (-1: on none)."""
        cid = c.record.conversation_id
        if c.counted_on >= 0:
            self._conversations_on[c.counted_on] -= 1
            self._context_on[c.counted_on] -= c.context_tokens
            del self._convs_on[c.counted_on][cid]
            self._convs_tuple[c.counted_on] = None
        c.counted_on, c.context_tokens = instance, context_tokens
        if instance >= 0:
            self._conversations_on[instance] += 1
            self._context_on[instance] += context_tokens
            self._convs_on[instance][cid] = c.next_turn
            self._convs_tuple[instance] = None

    def _prefill_done(self, job: TurnJob) -> None:
        self._queued_prefill[job.placement.prefill_instance] -= job.prompt_tokens

    def _finish(self, job: TurnJob) -> None:
        c = self._by_id[job.conversation_id]
        self.recorder.turn(job)
        c.prev_prefill, c.prev_decode = job.placement.prefill_instance, job.placement.decode_instance
        c.prev_output = job.output_tokens
        self._count(c, c.counted_on, job.prompt_tokens + job.output_tokens)
        tr = c.record.turns[job.turn]
        c.next_turn = job.turn + 1
        if c.next_turn < len(c.record.turns):
            self.clock.call_at(self.clock.now() + tr.tool_time_s, self._ready, c)
        else:
            self._end(c, self.clock.now())
        self._poll()

    def _fail(self, job: TurnJob, reason: str) -> None:
        if job.prefill_done_s is None:
            self._queued_prefill[job.placement.prefill_instance] -= job.prompt_tokens
        c = self._by_id[job.conversation_id]
        self.recorder.turn(job)
        c.failed = True
        self._end(c, self.clock.now())
        self._poll()

    def _end(self, c: ConversationState, t: float) -> None:
        c.done = True
        c.finish_s = t
        self._count(c, -1, 0)
        self.num_done += 1
        self.on_conversation(c)
