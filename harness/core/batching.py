"""Batch formation: which requests an engine step advances (the batch-rule interface).

One engine step (one forward pass) advances some of the engine's requests: a prefilling request by a
chunk of its prompt, a decoding one by one token. A *batch rule* chooses them. It is a pure function of a
snapshot of the engine (:class:`StepInput`) and returns a :class:`StepPlan`; the engine executes the plan
(KV-block allocation, preemption on overflow, prefix-cache lookups, the step's time). A resident
(admitted) request that the plan leaves out is **paused**: it keeps its KV blocks and its progress and
waits for a later step. This module imports nothing from the simulator (``harness.sim``), so the same rule
objects can be wrapped for another engine (docs/wait.md says what a vLLM V1 scheduler subclass needs).

Rules shipped here:

* :class:`VllmV1Rule` (engine default, ``engine.step_mode=v1_mixed``): vLLM V1's step
  (``vllm/v1/core/sched/scheduler.py``): every running request in admission order (a prefilling one
  takes a chunk ``min(remaining prompt, budget left, chunk cap)``, a decoding one 1 token) while the
  token budget lasts, then waiting requests in FCFS order (prefill and decode mixed in one step).
* :class:`VllmV0Rule` (``engine.step_mode=v0_prefill_first``): vLLM V0's default scheduler without
  chunked prefill (``vllm/core/scheduler.py`` ``_schedule_default``): a step is prefill-only whenever a
  prompt is mid-prefill or the waiting head fits (blocks above the watermark, budget, ``max_num_seqs``),
  else decode-only over every running request.
* WAIT and Nested WAIT (``baselines.wait.wait``, ``baselines.wait.nested_wait``), WAIT-CP and its control
  (``baselines.wait.wait_cp``) build on the same interface.

The engine's own limits are applied by the engine, whatever the rule says: a request is only admitted
while the token budget lasts, ``max_num_seqs`` is not reached and its blocks fit above the KV watermark
(admissions stop at the first candidate that does not fit, as in vLLM); a step that had to preempt admits
nothing (vLLM V1 and V0 both skip the waiting queue after a preemption); on KV overflow the engine evicts
the rule's ``evict_first`` candidates in order, then residents in ``engine.preemption_order``.

Units: tokens, blocks (``block_size`` tokens each), seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Callable, Optional, Protocol, runtime_checkable

from harness.core.registry import register_rule, rule_from_spec


@runtime_checkable
class RequestState(Protocol):
    """What a batch rule may read of one engine request (the simulator's ``Request`` satisfies it).

    Attributes (read-only for rules):
        conv, turn: the conversation id and turn index (for a classifier or predictor).
        prompt: prompt tokens; prefill_target: tokens to prefill (prompt, or prompt + tokens already
            generated after a preemption); computed: tokens whose KV is computed; blocks: KV blocks held.
        out_done: output tokens generated so far. (The true output length is deliberately not part of
            the protocol: a rule that needs it goes through a predictor.)
        stage: the paper's stage: 0 while waiting or prefilling, else the number of iterations served
            (= output tokens produced, counting the prefiller's first token for a P/D decode request).
        remote_kv: a P/D decode request whose prompt KV arrives by transfer (no local prefill).
        admit_seq: order of admission into the running set (larger = later; -1 while waiting).
        submit_s: when the request reached this engine, s. idle_since_s: when it last advanced (or
            its submission), s.
    """

    conv: str
    turn: int
    prompt: int
    prefill_target: int
    computed: int
    blocks: int
    out_done: int
    remote_kv: bool
    admit_seq: int
    submit_s: float
    idle_since_s: float

    @property
    def stage(self) -> int: ...


@dataclass(slots=True)
class StepInput:
    """A snapshot of one engine at the start of a step.

    The simulator keeps one ``StepInput`` per engine and updates ``now_s``, ``free_blocks`` and
    ``step_index`` in place before each step (no object built per step): a rule reads it during
    ``plan`` and must not keep it or modify it (``dataclasses.replace`` gives a modified copy).

    Fields:
        now_s: simulated time, s.
        running: resident requests (admitted, KV held), in admission order.
        waiting: the waiting queue (not admitted, no KV), FCFS order, head first.
        token_budget: tokens one step may process (``max_num_batched_tokens``).
        free_blocks: KV blocks allocatable now (free + evictable prefix-cache blocks).
        watermark_blocks: blocks an admission must leave free (``engine.kv_watermark_frac`` x capacity).
        capacity_blocks, block_size: KV capacity (blocks) and tokens per block.
        max_num_seqs: cap on the running set. chunk_cap: per-request prefill chunk cap, tokens
            (``engine.max_prefill_chunk_tokens``; 0 = none).
        hit_blocks: prefix-cache hit of a waiting request now, blocks (read-only engine query; 0 when
            prefix caching is off).
        step_index: engine steps executed before this one (0 at the first; a coalesced run of k identical
            decode steps counts k), for a rule that rotates from step to step (WAIT-CP) without hidden
            state.
    """

    now_s: float
    running: Sequence[RequestState]
    waiting: Sequence[RequestState]
    token_budget: int
    free_blocks: int
    watermark_blocks: int
    capacity_blocks: int
    block_size: int
    max_num_seqs: int
    chunk_cap: int
    hit_blocks: Callable[[RequestState], int]
    step_index: int = 0


@dataclass(slots=True)
class StepPlan:
    """A rule's decision for one step. Read-only by convention (nobody modifies a plan after ``plan``
    returns it; ``dataclasses.replace`` gives a modified copy): not a frozen dataclass, whose
    ``__init__`` sets each field through ``object.__setattr__`` (about 4 us per plan, one plan per
    engine step).

    Fields:
        run: residents to advance, ``(request, tokens)`` in execution order: a prefill chunk size, or 1
            for a decode. The sum must not exceed the token budget. Residents not listed are paused.
        admit: waiting requests to admit, in order (``StepInput.waiting`` itself = the whole queue, head
            first, without a copy); the engine gives each a prefill chunk of
            ``min(prompt tokens not cached, budget left, chunk_cap)`` and stops at the first that does
            not fit (see the module docstring).
        evict_first: preferred preemption victims on KV overflow, in order (then the engine's order).
        wake_at_s: ask for a step at this time even if nothing happens (a rule's timeout), s.
        repeatable: a decode-only plan that the rule would return unchanged at the next step as long as
            nothing arrives, finishes or is transferred (lets the engine simulate identical decode-only
            steps as one event). Only the selected requests advance in such a run.
        admit_budget: the most prefill tokens this step's admissions may take together, tokens (``None``:
            whatever the token budget leaves; the engine takes the smaller).
        admit_chunk_cap: per-admission prefill chunk cap, tokens (``None`` or 0: the engine's
            ``chunk_cap`` alone; else the smaller of the two).
        repeat_steps: with ``repeatable``, the rule's horizon: the plan (the same requests, in the same
            order) is what the rule would return at each of the next ``repeat_steps - 1`` steps too, as
            long as nothing arrives, finishes or is transferred and no requested ``wake_at_s`` passes
            (which cut a run at its next step boundary), steps. ``None``: no limit of the rule's own.
            The engine simulates up to that many identical steps as one run; exact, not an estimate
            (``tests/test_speed.py`` checks merged runs against step-by-step simulation).
        idle_after: ``(w, d)``, the rule's statement of its *next* plan (``None``: no statement): if this
            step runs as one step exactly as planned, ending at ``T`` (s), the rule's plan at ``T`` would
            run nothing and admit nothing, with ``wake_at_s = W = min(w, T + d)`` (``d`` None: ``W = w``;
            ``inf``: no wake), whenever ``W > T`` (the float ``T + d`` as the rule's plan would compute it,
            ``d`` added to ``T``); and leaving that plan out does not change any later plan of the rule.
            "Exactly as planned" is what the engine checks before it uses the statement: the step was
            not preempted into, every ``run`` pair ran, every ``admit`` candidate was admitted and is
            running (none loading a remote KV), every prefill chunk of the step completes its prompt
            (samples the first token), no request finishes in the step, nothing called the engine's
            ``wake`` while the step was in flight (no arrival, transfer, release or timer), and the next
            step would run inline at ``T`` (nothing else due then: ``SimClock.nothing_due_now``). The
            engine then does only the empty plan's side effect (``wake_at_s``'s timer) and idles, one
            plan and one event fewer. WAIT states it for a step whose served types are all eligible by
            their timeout only (``baselines.wait.fluid_admission.WaitRule``), Nested WAIT (fixed caps) for
            a step after which segment 1's gate holds fewer than its cap (``NestedWaitRule._idle_after``).
        idle_repeat_steps: with ``idle_after = (inf, d)`` and a decode-only plan (every ``run`` pair a decode
            of 1 token, nothing admitted) that runs every resident, the rule's statement that the plan it
            would return at the timer ``T + d`` after this step (run exactly as planned, ending at ``T``) is
            this plan again -- the same requests, one token each, the same ``idle_after`` and statement --,
            for each of the next ``idle_repeat_steps - 1`` such timeout-paced steps, as long as nothing
            arrives, finishes, is transferred or wakes the engine (0 or 1: no statement). The engine then
            simulates those steps, with their idle gaps, as one run (``harness.sim.engine``, "Timeout-paced
            runs"); exact: every time is the float sum one event per step computes. WAIT states it when
            its served types hold every resident and nothing waits (no horizon of its own), Nested WAIT
            (fixed caps) up to the step at which a stage group would exceed the cap of the stage it reaches.
        timer_groups: with ``idle_after = (w, d)`` (``d`` not None) and a decode-only plan (every ``run`` pair a
            decode of 1 token, nothing admitted, nothing waiting), the rule's statement of every plan it would
            return until anything arrives, finishes, is transferred or wakes the engine: the residents fall
            into timer groups ``((requests, ready_s), ...)`` (every resident in exactly one; each group's
            requests in the order a plan runs them; ``ready_s``: when its timeout passes, s), and the plan at
            any time ``t`` runs every group with ``ready_s <= t`` whole, one token each, in this order of
            groups (this plan: the groups ready now), or is empty with ``wake_at_s`` the smallest ``ready_s``;
            a group that runs in a step ending at ``T`` is ready again at the float ``T + d``. The engine then
            simulates those steps -- several timers with different phases interleaved -- as one run
            (``harness.sim.engine``, "Timeout-paced runs"). WAIT states it in its timeout-driven regime: every
            type's residents past stage 0, each stage group within the type's cap, nothing waiting
            (``WaitRule``). ``None``: no statement.
    """

    run: Sequence = ()
    admit: Sequence = ()
    evict_first: Sequence = ()
    wake_at_s: Optional[float] = None
    repeatable: bool = False
    admit_budget: Optional[int] = None
    admit_chunk_cap: Optional[int] = None
    repeat_steps: Optional[int] = None
    idle_after: Optional[tuple] = None
    idle_repeat_steps: int = 0
    timer_groups: Optional[tuple] = None


class UnselectedResidents(Sequence):
    """``evict_first`` built only when read: the residents a plan leaves out, most recently admitted
    first (``admit_seq`` descending; a stable sort, so equal ones keep their running order).

    The engine reads a plan's ``evict_first`` only on KV overflow, so the list (a set of the selected
    requests, a scan of the residents and a sort) is not built at every step. ``running``: the residents
    at plan time (copied to a tuple: later changes to the engine's list do not alter it); ``run``: the
    plan's ``(request, tokens)`` pairs.
    """

    __slots__ = ("_running", "_run", "_list")

    def __init__(self, running: Sequence, run: Sequence):
        self._running, self._run, self._list = tuple(running), run, None

    def _get(self) -> list:
        if self._list is None:
            chosen = {id(r) for r, _ in self._run}
            paused = [r for r in self._running if id(r) not in chosen]
            paused.sort(key=_admit_seq, reverse=True)
            self._list, self._running, self._run = paused, (), ()
        return self._list

    def __len__(self) -> int:
        return len(self._get())

    def __getitem__(self, i):
        return self._get()[i]

    def __iter__(self):
        return iter(self._get())

    def __reversed__(self):
        return reversed(self._get())

    def __eq__(self, other) -> bool:
        return list(self._get()) == list(other) if isinstance(other, (list, tuple, UnselectedResidents)) \
            else NotImplemented

    def __repr__(self) -> str:
        return f"UnselectedResidents({self._get()!r})"


def _admit_seq(r) -> int:
    return r.admit_seq


class BatchRule(Protocol):
    """A batch-formation rule: ``plan(StepInput) -> StepPlan``, pure (no engine mutation)."""

    name: str

    def plan(self, inp: StepInput) -> StepPlan: ...


def prefill_chunk(req: RequestState, budget: int, chunk_cap: int) -> int:
    """Tokens of ``req``'s prompt to prefill this step: ``min(remaining, budget, chunk_cap or inf)``;
    1 for a request whose prefill is complete (a decode). Tokens."""
    n = req.prefill_target - req.computed
    if n <= 0:
        return 1
    n = min(n, budget)
    return min(n, chunk_cap) if chunk_cap > 0 else n


class VllmV1Rule:
    """vLLM V1's mixed prefill/decode step (the engine default).

    Running requests in admission order while the budget lasts (chunked prefill for a prompt that does
    not fit the budget or exceeds ``chunk_cap``), then every waiting request as an admission candidate.
    Source: vLLM V1 ``Scheduler.schedule`` (running loop, then waiting loop, in
    ``vllm/v1/core/sched/scheduler.py``; read in vLLM 0.32). Decode-only plans are repeatable: the next
    step selects the same running set unless something arrives, finishes or is transferred.
    """

    name = "vllm_v1"

    def to_spec(self) -> dict:
        """The rule as a JSON-able dict (no parameters): ``{"rule": "v1_mixed"}``."""
        return {"rule": "v1_mixed"}

    def plan(self, inp: StepInput) -> StepPlan:
        budget = inp.token_budget
        cap = inp.chunk_cap
        run = []
        prefill = False
        for req in inp.running:          # prefill_chunk() inlined: this is the simulator's hot loop
            if budget <= 0:
                break
            n = req.prefill_target - req.computed
            if n <= 0:
                n = 1
            else:
                prefill = True
                if n > budget:
                    n = budget
                if 0 < cap < n:
                    n = cap
            run.append((req, n))
            budget -= n
        return StepPlan(run, inp.waiting, repeatable=not prefill)


class VllmV0Rule:
    """vLLM V0's prefill-first step (``_schedule_default`` without chunked prefill).

    If a resident is mid-prefill (its prompt exceeded the budget or ``chunk_cap``) or the waiting head
    fits (its blocks, after prefix hits, leave ``watermark_blocks`` free; budget; ``max_num_seqs``), the
    step is prefill-only: those prefills continue, then waiting requests are admitted FCFS. Otherwise the
    step is decode-only over every running request (nobody is paused). Source: vLLM V0
    ``Scheduler._schedule_default`` (prefills first; running decodes only when no prefill was scheduled;
    ``BlockSpaceManager.can_allocate`` with the watermark).
    """

    name = "vllm_v0"

    def to_spec(self) -> dict:
        """The rule as a JSON-able dict (no parameters): ``{"rule": "v0_prefill_first"}``."""
        return {"rule": "v0_prefill_first"}

    def plan(self, inp: StepInput) -> StepPlan:
        budget = inp.token_budget
        cap = inp.chunk_cap
        bs = inp.block_size
        mid = [r for r in inp.running if r.computed < r.prefill_target]
        head_fits = False
        if inp.waiting and len(inp.running) < inp.max_num_seqs and budget > 0:
            head = inp.waiting[0]
            hit = inp.hit_blocks(head)
            if head.remote_kv:
                need = -(-head.prompt // bs) - hit
            else:
                n = min(head.prefill_target - hit * bs, budget)
                if cap > 0:
                    n = min(n, cap)
                need = -(-(hit * bs + n) // bs) - hit
            head_fits = need <= inp.free_blocks - hit - inp.watermark_blocks
        if mid or head_fits:
            run = []
            for req in mid:
                if budget <= 0:
                    break
                n = prefill_chunk(req, budget, cap)
                run.append((req, n))
                budget -= n
            return StepPlan(tuple(run), inp.waiting)
        run = tuple((r, 1) for r in inp.running[:budget])
        return StepPlan(run, (), repeatable=True)


@register_rule("v1_mixed")
@register_rule("v0_prefill_first")
def engine_rule_from_spec(spec: dict) -> BatchRule:
    """Rebuild an engine-default rule from its ``to_spec()`` dict (no parameters): the builder registered
    under both names of :data:`ENGINE_DEFAULT_RULES`, as every batch rule has one."""
    return ENGINE_DEFAULT_RULES[spec["rule"]]()


# the engine-default rules (``engine.step_mode``): registered by name like every other batch rule
ENGINE_DEFAULT_RULES: dict[str, type] = {"v1_mixed": VllmV1Rule, "v0_prefill_first": VllmV0Rule}


def default_rule(step_mode: str) -> BatchRule:
    """The engine's rule for ``engine.step_mode`` (a name of :data:`ENGINE_DEFAULT_RULES`), built through
    the rule registry (``harness.core.registry.rule_from_spec``) as every batch rule is.

    Raises:
        ValueError: naming ``engine.step_mode`` for another value.
    """
    if step_mode not in ENGINE_DEFAULT_RULES:
        raise ValueError(f"engine.step_mode must be one of {', '.join(map(repr, ENGINE_DEFAULT_RULES))}, "
                         f"got {step_mode!r}")
    return rule_from_spec({"rule": step_mode})
