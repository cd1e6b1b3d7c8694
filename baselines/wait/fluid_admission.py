"""WAIT and Nested WAIT as engine batch rules (Ao, Luo, Simchi-Levi, Wang, arXiv 2504.11320,
Algorithms 1 and 2; docs/wait.md), and what the two policies share.

Both policies admit every turn at once (no controller-side hold) and place it collocated-style (sticky;
least-loaded at turn 0). The algorithm runs inside each engine: the policy hands every instance a batch
rule (``batch_rule(i)``, ``harness.core.batching``) that decides, at every engine step, which of the engine's
requests advance; a resident request left out is paused with its KV kept. On KV overflow the engine evicts
the rule's unselected residents first, most recently admitted first, then selected ones in
``engine.preemption_order`` (the paper: LIFO, restart from prefill).

Stages (docs/wait.md): a request that will generate ``o`` output tokens passes through ``o`` engine
iterations, stage ``s = 0`` (prefill; it samples the first token) to ``o - 1``; the paper's output length
is ``l' = o - 1`` (stages ``0..l'``), and at stage ``s`` it holds ``l + s`` KV tokens. So a WAIT batch with
one prompt of each stage of a type holds ``sum_{s=0}^{o-1} (l + s) = o (l + (o - 1)/2)`` tokens:
``(l' + 1)(l + l'/2)``, the paper's per-type term of ``M^pi``.

The fluid coefficients of an instance are its hardware hints (``PolicyContext.hints``, from the hardware
and model profiles): the memory-bound decode step ``d0 + d1 * KV tokens`` of the profile's step model, and
``d2`` (compute-bound prefill, s per prompt token, ``harness.core.profiles.prefill_iteration_coefficient``).
Arrival rates per instance: turns/s of the workload (conversation rate x mean turns) split evenly over
the instances.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from itertools import compress, islice, repeat as _repeat
from operator import attrgetter, ne
from dataclasses import replace
from types import SimpleNamespace
from typing import Callable, Optional, Sequence

from harness import LazyModule

from harness.core.batching import RequestState, StepInput, StepPlan, UnselectedResidents, prefill_chunk
from baselines.wait.fluid import PromptType
from harness.core.policy import PolicyContext, Predictor
from harness.core.registry import register_rule

np = LazyModule("numpy", globals(), "np")   # imported on first use (a config error, --help: never), then bound here

THRESHOLD_SOURCES = ("fluid", "tl")
IDLE_POLICIES = ("wait", "decode_residents")


def instance_coefficients(ctx: PolicyContext, i: int) -> tuple[float, float]:
    """``(d0_s, d1_s_per_token)`` of instance ``i``: its hardware hints (from the hardware and model
    profiles)."""
    h = ctx.hints[i]
    return h.fluid_d0_s, h.fluid_d1_s_per_token


def prefill_coefficient(ctx: PolicyContext, i: int) -> float:
    """``d2`` of instance ``i``, s per prompt token: its hardware hint
    (``harness.core.profiles.prefill_iteration_coefficient`` of the profile)."""
    return ctx.hints[i].fluid_d2_s_per_token


def prompt_types(ctx: PolicyContext, edges: Sequence[int], num_instances: int
                 ) -> tuple[list[PromptType], np.ndarray]:
    """Prompt types from the workload: one per output-length bin (``edges``, tokens).

    Returns the types (rate per instance, mean prompt tokens, **mean output tokens** ``o`` = engine
    iterations, not yet the paper's ``l' = o - 1``; empty bins are dropped) and the bin index of each kept
    type. Raises ValueError for an open (fixed-arrival) workload, which has no rate.
    """
    w = ctx.workload
    if not np.isfinite(w.rate_per_s):
        raise ValueError("WAIT thresholds need an arrival rate (workload.arrival=poisson or gamma)")
    turn_rate = w.rate_per_s * w.mean_turns / num_instances
    bins = np.searchsorted(np.asarray(edges), w.turn_output_tokens, side="left")
    types, kept = [], []
    for b in range(len(edges) + 1):
        m = bins == b
        if m.any():
            types.append(PromptType(turn_rate * m.mean(), float(w.turn_prompt_tokens[m].mean()),
                                    float(w.turn_output_tokens[m].mean())))
            kept.append(b)
    return types, np.asarray(kept)


def paper_types(types: Sequence[PromptType]) -> list[PromptType]:
    """The same types with the paper's output length ``l' = o - 1`` (``o`` iterations, stages 0..l')."""
    return [PromptType(t.rate_per_s, t.input_tokens, max(0.0, t.output_tokens - 1.0)) for t in types]


def fluid_flag(reasons: Sequence[str]) -> dict:
    """The run's named validity flag for the fluid model (``summary.json``, docs/metrics.md "Validity"):
    ``fluid_plan_infeasible`` (bool) and ``fluid_plan_infeasible_reason`` (``""`` when feasible).
    ``reasons``: per instance, ``""`` where the fluid plan of docs/wait.md ("Thresholds") is feasible, else
    why not (the message of ``baselines.wait.fluid.wait_thresholds`` / ``prefill_aware_cycle_s``); the
    reason names the instances (by index) that are infeasible and the first one's message. A flag, not a
    verdict: the run measures the policy as configured (with its fallback thresholds), it is not INVALID."""
    bad = [i for i, r in enumerate(reasons) if r]
    why = ""
    if bad:
        why = (f"instance{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} of {len(reasons)}: "
               f"{reasons[bad[0]]}")
    return {"fluid_plan_infeasible": bool(bad), "fluid_plan_infeasible_reason": why}


def fluid_reason(plan: Callable[[], object]) -> str:
    """``""`` when ``plan()`` (a fluid plan: ``wait_thresholds`` or ``prefill_aware_cycle_s`` with their
    arguments bound) returns, else its ``ValueError``'s message (the fluid model is infeasible)."""
    try:
        plan()
    except ValueError as e:
        return str(e)
    return ""


def check_knobs(output_bins: Sequence[int], max_wait_s: float, thresholds: str, total_cap_tl: float,
                idle_policy: str) -> list[int]:
    """Validate the knobs WAIT and Nested WAIT share; returns the bins as a list.

    Raises:
        ValueError: naming the ``scheduler.<key>``.
    """
    edges = list(output_bins)
    if sorted(edges) != edges or len(set(edges)) != len(edges) or any(e < 1 for e in edges):
        raise ValueError(f"scheduler.output_bins must be increasing positive token counts, got {edges}")
    if not max_wait_s >= 0:
        raise ValueError(f"scheduler.max_wait_s must be >= 0, got {max_wait_s!r}")
    if thresholds not in THRESHOLD_SOURCES:
        raise ValueError(f"scheduler.thresholds must be one of {THRESHOLD_SOURCES}, got {thresholds!r}")
    if not (total_cap_tl > 0 and math.isfinite(total_cap_tl)):
        raise ValueError(f"scheduler.total_cap_tl must be a finite number > 0, got {total_cap_tl!r}")
    if idle_policy not in IDLE_POLICIES:
        raise ValueError(f"scheduler.idle_policy must be one of {IDLE_POLICIES}, got {idle_policy!r}")
    return edges


def output_bin(edges: Sequence[int], output_tokens: float) -> int:
    """The output-length bin of ``output_tokens`` (tokens) among the sorted bin ``edges`` (tokens): bin ``b``
    holds ``edges[b-1] < o <= edges[b]``, ``len(edges)`` for outputs above the last edge."""
    return bisect_left(edges, output_tokens)


class OutputBinClassifier:
    """``request -> output-length bin`` (:func:`output_bin`) by the request's *predicted* output tokens
    (cached per turn).

    ``edges`` (tokens) and ``exact`` (the predictor injects no error, ``Predictor.exact``) are kept so that
    the same rule can be rebuilt where the output length is known another way (a vLLM server: the
    request's ``max_tokens``, ``harness.vllm.wait_scheduler``)."""

    def __init__(self, pred: Predictor, edges: Sequence[int]):
        self.pred, self.edges = pred, [int(e) for e in edges]
        self._cache: dict[tuple[str, int], int] = {}
        self.exact = pred.exact

    def __call__(self, req: RequestState) -> int:
        key = (req.conv, req.turn)
        b = self._cache.get(key)
        if b is None:
            out = self.pred.output_tokens(SimpleNamespace(conversation_id=req.conv, turn=req.turn))
            b = self._cache[key] = output_bin(self.edges, out)
        return b


class KnownOutputClassifier:
    """``request -> output-length bin`` (:func:`output_bin`) from an output length the request itself
    carries (attribute ``attr``, tokens). Used by the vLLM wrapper, where the harness sends ``max_tokens`` =
    the turn's true output with ``ignore_eos`` (the paper's known lengths)."""

    def __init__(self, edges: Sequence[int], attr: str = "known_output_tokens"):
        self.edges, self.attr = [int(e) for e in edges], attr

    def __call__(self, req) -> int:
        return output_bin(self.edges, getattr(req, self.attr))


def kv_reservation_tokens(caps: Sequence[int], input_tokens: float) -> float:
    """KV tokens of a batch that fills every stage ``s`` to ``caps[s]`` prompts of ``input_tokens``:
    ``sum_s caps[s] (l + s)`` (the paper's ``M^pi`` term of one type, with ``caps[s] = n_j``)."""
    return math.fsum(c * (input_tokens + s) for s, c in enumerate(caps))


_ONES = _repeat(1)     # (request, 1) pairs of a whole decode group: zip(group, _ONES), at C level


def _take_decode(grp: list, cap: int, budget: int, run: list) -> tuple[int, bool]:
    """One decode stage's group of a WAIT / Nested WAIT plan: append up to ``cap`` of ``grp``'s requests to
    ``run`` as ``(request, 1)`` (one token each) while ``budget`` (tokens) lasts. Returns the budget left and
    whether the whole group ran (``False``: the cap or the budget cut it, so the plan cannot repeat). A group
    that fits both is taken at C level (``zip(grp, _ONES)``: the same pairs as the loop)."""
    g = len(grp)
    if g <= cap and g <= budget:
        run.extend(zip(grp, _ONES))
        return budget - g, True
    whole = g <= cap
    for r in grp[:cap]:
        if budget <= 0:
            return budget, False
        run.append((r, 1))
        budget -= 1
    return budget, whole


def _take_stage0(res: list, wait: list, cap: int, budget: int, chunk_cap: int, run: list, admit: list
                 ) -> int:
    """Select up to ``cap`` stage-0 requests: prefilling residents first, then waiting ones (FCFS).
    Appends to ``run`` / ``admit``; returns the budget left (tokens)."""
    k = 0
    for r in res:
        if k >= cap or budget <= 0:
            break
        n = prefill_chunk(r, budget, chunk_cap)
        run.append((r, n))
        budget -= n
        k += 1
    if k < cap:
        admit.extend(wait[:cap - k])
    return budget


_ADMIT_SEQ, _SUBMIT_S = attrgetter("admit_seq"), attrgetter("submit_s")


def _plan(run: list, admit: list, running: Sequence, wake: float, repeat_steps: Optional[int] = 1,
          idle_after: Optional[tuple] = None, idle_repeat_steps: int = 0) -> StepPlan:
    """A plan whose preferred victims are the unselected residents, most recently admitted first (built
    only if the engine reads them: :class:`harness.core.batching.UnselectedResidents`). ``repeat_steps``: the
    rule's horizon (``StepPlan.repeat_steps``; ``None``: unlimited; 1: the plan holds for this step only);
    ``idle_after``, ``idle_repeat_steps``: ``StepPlan``'s."""
    admit.sort(key=_SUBMIT_S)
    return StepPlan(tuple(run), tuple(admit), UnselectedResidents(running, run), None if wake == math.inf else wake,
                    repeatable=repeat_steps != 1, repeat_steps=_UNTIL_EVENT if repeat_steps is None else repeat_steps,
                    idle_after=idle_after, idle_repeat_steps=idle_repeat_steps)


def _paces(idle: Optional[tuple], run: list, n_dec: int, admit: list) -> bool:
    """Whether a WAIT / Nested WAIT plan may state ``StepPlan.idle_repeat_steps``: it states ``idle_after``
    with no wake time of its own (``w = inf``: no resident left out, no other type or segment holding
    anything, nothing waiting; the rules compute ``w`` that way) and only the ``T + max_wait_s`` term, and
    it is decode-only (``n_dec``: its decodes; nothing at stage 0 run or admitted) and runs something. Then
    at ``T + max_wait_s`` every resident has waited exactly ``max_wait_s`` since ``T`` and is at the next
    stage: the rule serves the same groups again (see the callers for the caps)."""
    return (idle is not None and idle[0] == math.inf and idle[1] is not None and n_dec == len(run) > 0
            and not admit)


_UNTIL_EVENT = 1 << 30      # no horizon of the rule's own: the plan holds until something arrives or finishes



_IDLE = attrgetter("idle_since_s")


def _oldest_left_out(grp: list, taken: int, left: float) -> float:
    """``min(left, oldest idle_since_s of grp[taken:])`` (s): the residents of a stage group that a plan's
    first ``taken`` picks leave out (WAIT's and Nested WAIT's ``StepPlan.idle_after``)."""
    o = min(map(_IDLE, grp[taken:]))
    return o if o < left else left


class KeyedResidents:
    """An engine's residents split by a key (WAIT: the request's type; Nested WAIT: the segment of its
    stage) and, per key, grouped by stage, kept up to date from what changed since the last step instead
    of being rebuilt at every step (WAIT's per-step classification of every resident was 46 %
    of its profile, and most residents are paused, so unchanged).

    ``groups[k]`` is ``[stage-0 residents, {stage >= 1: residents}, oldest idle_since_s (s)]`` of key
    ``k``; every list is in the engine's running (admission) order. The dict is in order of first
    appearance in running order for a key rebuilt or regrouped at this step, and for a key that only
    gained new residents (appended, so still that order); with ``static=False`` (keys that change with
    the stage) a key that received a resident from another key may have its stages in another order
    (Nested WAIT sorts them). ``key_of(request, stage) -> int`` in ``range(nkeys)``; ``static``: it never
    changes for a request (WAIT's type).

    ``sync(running, touched)``: ``touched`` are the keys of every resident the rule's previous plan let
    advance (prefill chunks and decodes). It is incremental when ``running`` is the same list object as
    at the last call, its old members still first and in the same order, and new members only appended
    (admissions, arrived KV transfers): then only the touched keys' residents are re-read (stage, key)
    and regrouped, the ones whose key changed move (in running order), and the new members are added.
    This rests on the simulator's contract (``harness.sim.engine.Engine``; ``harness.core.batching.StepInput``):
    between two plans of one engine a resident's progress changes only if the previous plan ran it
    (``_step_end`` advances the plan's requests), a preempted or finished one leaves the list, and
    admissions and arrived transfers append. Anything else (the first call, another list object, such as
    a vLLM step's fresh snapshot, a member removed, ``incremental=False``) rebuilds from scratch,
    O(residents). ``tests/test_batching.py`` checks the plans against ``incremental=False`` at every step
    of simulations.

    Attributes:
        members: ``members[k]``: the residents of key ``k`` (a list, running order). Read-only, as
            ``groups``, for callers.
        rebuilds: syncs that rebuilt (a count, for tests and profiles).

    Raises:
        TypeError: only from ``key_of``. Requests that do not hash by identity make every call a rebuild.
    """

    __slots__ = ("key_of", "nkeys", "incremental", "static", "lst", "snap", "pos", "next_pos", "members",
                 "groups", "rebuilds")

    def __init__(self, key_of: Callable, nkeys: int, incremental: bool = True, static: bool = False):
        self.key_of, self.nkeys, self.incremental, self.static = key_of, nkeys, incremental, static
        self.lst = None
        self.snap: list = []
        self.pos: dict = {}
        self.next_pos = 0
        self.members: list[list] = [[] for _ in range(nkeys)]
        self.groups: list[list] = [[[], {}, math.inf] for _ in range(nkeys)]
        self.rebuilds = 0

    def rebuild(self, running: Sequence) -> None:
        """Key and group every resident of ``running`` from scratch (O(residents))."""
        running = running if isinstance(running, list) else list(running)
        members: list[list] = [[] for _ in range(self.nkeys)]
        groups: list[list] = [[[], {}, math.inf] for _ in range(self.nkeys)]
        key_of = self.key_of
        for r in running:
            s = r.stage
            k = key_of(r, s)
            members[k].append(r)
            _group_add(groups[k], r, s)
        try:
            self.pos = {r: i for i, r in enumerate(running)}
            self.lst = running
        except TypeError:               # not hashable by identity: rebuild at every call
            self.pos, self.lst = {}, None
        self.members, self.groups, self.next_pos, self.snap = members, groups, len(running), list(running)
        self.rebuilds += 1

    def sync(self, running: Sequence, touched) -> None:
        """Bring ``members`` and ``groups`` to ``running``; ``touched``: the keys the previous plan
        advanced residents of (see the class)."""
        snap = self.snap
        n = len(snap)
        if (running is not self.lst or not self.incremental or len(running) < n
                or (running[:n] != snap if len(running) > n else running != snap)):
            self.rebuild(running)
            return
        members, groups, key_of, static = self.members, self.groups, self.key_of, self.static
        moved = []
        for k in touched:                       # regroup: one pass over the key's residents
            g = [[], {}, math.inf]
            res0, stages = g[0], g[1]
            oldest = math.inf
            mk = members[k]
            stay = mk if static else []
            for r in mk:
                st = r.stage
                if not static:
                    k2 = key_of(r, st)
                    if k2 != k:                 # moved to another key (Nested WAIT: crossed a boundary)
                        moved.append((r, st, k2))
                        continue
                    stay.append(r)
                if st == 0:
                    res0.append(r)
                else:
                    sl = stages.get(st)
                    if sl is None:
                        stages[st] = [r]
                    else:
                        sl.append(r)
                if r.idle_since_s < oldest:
                    oldest = r.idle_since_s
            g[2] = oldest
            members[k], groups[k] = stay, g
        if moved:
            key = self.pos.__getitem__
            for r, st, k2 in moved:
                mk = members[k2]
                if mk and key(mk[-1]) > key(r):
                    insort(mk, r, key=key)
                    _group_add(groups[k2], r, st, key)
                else:
                    mk.append(r)
                    _group_add(groups[k2], r, st)
        if len(running) > n:
            pos = self.pos
            p = self.next_pos
            for r in running[n:]:
                st = r.stage
                k = key_of(r, st)
                members[k].append(r)            # its position is the largest: the lists stay in order
                _group_add(groups[k], r, st)
                pos[r] = p
                p += 1
                snap.append(r)
            self.next_pos = p


def _group_add(g: list, r, st: int, key: Optional[Callable] = None) -> None:
    """Add resident ``r`` at stage ``st`` to a key's groups ``g`` (see :class:`KeyedResidents`): appended
    (``key`` None: it comes after every resident there in running order), else inserted by ``key``."""
    if st == 0:
        lst = g[0]
    else:
        lst = g[1].get(st)
        if lst is None:
            g[1][st] = lst = []
    if key is None:
        lst.append(r)
    else:
        insort(lst, r, key=key)
    if r.idle_since_s < g[2]:
        g[2] = r.idle_since_s


NESTED_HORIZON_STEPS = 64   # the longest horizon Nested WAIT states (steps; checking costs O(groups) per step)
PACED_HORIZON_STEPS = 256   # the longest StepPlan.idle_repeat_steps Nested WAIT states (steps; O(groups x steps))


class WaitRule:
    """WAIT (Algorithm 1 of arXiv 2504.11320) as an engine batch rule.

    Per type ``j`` (``classify``) a threshold ``n_j`` (prompts). Stage 0 holds the type's waiting requests
    and any resident still prefilling. Type ``j`` is *eligible* when at least ``n_j`` of its requests are
    at stage 0. A step takes, for every eligible type and every stage ``s``, ``min(n_j, count)`` requests
    (oldest admitted first; at stage 0 prefilling residents, then waiting ones FCFS); every other resident
    is paused with its KV kept. If no type is eligible the engine idles until an arrival (the paper:
    "the server waits for more arrivals").

    Finite horizons (not in the paper, whose arrivals never stop; the authors' simulator instead drops the
    queue once the last request arrived): a type whose oldest request (waiting since its submission, or
    resident since it last advanced) has waited ``max_wait_s`` is eligible too, and the rule asks the
    engine for a step at that time. ``idle_policy='decode_residents'`` (a deviation, off by default)
    serves the residents' stages >= 1 with the same caps when no type is eligible, instead of idling.

    Args:
        thresholds: ``n_j`` per type index (ints >= 1). classify: request -> type index.
        max_wait_s: timeout, s. idle_policy: ``wait`` or ``decode_residents``.
        incremental: keep each type's residents (:class:`KeyedResidents`) and their stage groups from step
            to step, re-reading only the types the previous plan ran and the new residents (default);
            ``False`` rebuilds them at every step (the same plans; for checks).
    """

    name = "wait"

    def __init__(self, thresholds: Sequence[int], classify: Callable[[RequestState], int],
                 max_wait_s: float, idle_policy: str = "wait", incremental: bool = True):
        self.n = [int(x) for x in thresholds]
        if any(x < 1 for x in self.n):
            raise ValueError(f"WAIT thresholds must be >= 1, got {self.n}")
        self.classify, self.max_wait_s, self.idle_policy = classify, max_wait_s, idle_policy
        self._memo: dict = {}
        self._index = KeyedResidents(self._type, len(self.n), incremental, static=True)
        self._touched: Sequence = ()                # the types whose residents the last plan ran

    def _type(self, r, stage: int = 0) -> int:
        """The type of request ``r`` (memo by identity, then the classifier; ``stage`` unused)."""
        memo = self._memo
        try:
            j = memo.get(r)
        except TypeError:                   # a request that does not hash by identity
            return self.classify(r)
        if j is None:
            j = memo[r] = self.classify(r)
        return j

    def _types(self, reqs) -> list:
        """The type of each of ``reqs`` (a list), in order: from the rule's memo (request -> type, one
        C-level ``map`` over the list), classifying only requests not seen before (the classifier's own
        result, so nothing changes but the cost). The memo is keyed by request identity and dropped when
        it grows past four times the live requests, so it stays O(live requests)."""
        memo = self._memo
        try:
            types = list(map(memo.get, reqs))
        except TypeError:                   # requests that do not hash by identity: classify each
            return [self.classify(r) for r in reqs]
        if None in types:
            cls = self.classify
            for i, t in enumerate(types):
                if t is None:
                    r = reqs[i]
                    types[i] = memo[r] = cls(r)
        return types

    def to_spec(self) -> dict:
        """The rule's parameters as a JSON-able dict (``rule_from_spec`` rebuilds it with another
        classifier of the same bins): ``{"rule": "wait", "thresholds", "output_bins", "max_wait_s",
        "idle_policy"}``.

        Raises:
            ValueError: the classifier has no output bins, or classifies by predictions with injected
                error (``scheduler.predictor.*``), which a rebuilt rule classifying by the known output
                length would not reproduce.
        """
        edges = getattr(self.classify, "edges", None)
        if edges is None:
            raise ValueError("this WAIT rule's classifier has no output bins; it cannot be rebuilt elsewhere")
        if not getattr(self.classify, "exact", True):
            raise ValueError("scheduler.predictor injects error into the output lengths WAIT classifies by; the "
                             "rebuilt rule knows only the true length (set scheduler.predictor.sigma=0 and "
                             "scheduler.predictor.error_rate=0)")
        return {"rule": "wait", "thresholds": list(self.n), "output_bins": list(edges),
                "max_wait_s": float(self.max_wait_s), "idle_policy": self.idle_policy}

    def plan(self, inp: StepInput) -> StepPlan:
        m = len(self.n)
        running, waiting = inp.running, inp.waiting
        if len(self._memo) > 4 * (len(running) + len(waiting)) + 4096:
            self._memo = {}
        self._index.sync(running, self._touched)
        tg = self._index.groups
        res0 = [g[0] for g in tg]
        wait0: list[list] = [[] for _ in range(m)]
        oldest = [g[2] for g in tg]
        # the waiting queue is FCFS: a type's first requests are its oldest, and no type needs more than
        # n_j of them: per type short of n_j prefilling residents, its first n_j - those requests in queue
        # order, found by C-level searches of the queue's types (the queue can be long in overload)
        short = [j for j in range(m) if len(res0[j]) < self.n[j]]
        if short and waiting:
            if not isinstance(waiting, list):
                waiting = list(waiting)
            types = self._types(waiting)
            for j in short:
                w = wait0[j]
                need = self.n[j] - len(res0[j])
                i = -1
                while len(w) < need:
                    try:
                        i = types.index(j, i + 1)
                    except ValueError:
                        break
                    r = waiting[i]
                    w.append(r)
                    if r.idle_since_s < oldest[j]:
                        oldest[j] = r.idle_since_s
        now, mw = inp.now_s, self.max_wait_s
        eligible = []
        wake = math.inf
        by_count = False
        for j in range(m):
            if len(res0[j]) + len(wait0[j]) >= self.n[j]:
                eligible.append(j)
                by_count = True
                continue
            o = oldest[j]
            if o < math.inf:
                if o + mw <= now:
                    eligible.append(j)
                elif o + mw < wake:
                    wake = o + mw
        run: list = []
        admit: list = []
        budget = inp.token_budget
        serve = eligible
        admit_ok = True
        if not eligible and self.idle_policy == "decode_residents":
            serve, admit_ok = list(range(m)), False
        # horizon: the plan repeats until something arrives, finishes or a wake time passes when it is
        # decode-only and every served type is eligible by its stage-0 count (which decode steps do not
        # change) and has each of its stages served whole (every group moves up one stage together, so
        # the groups, their order and the paused residents stay the same; types are fixed per request)
        repeat = admit_ok and bool(eligible)
        # StepPlan.idle_after, stated when every served type is eligible by its timeout alone (fewer than n_j
        # at stage 0, its oldest waited max_wait_s; idle_policy='wait'). After such a step, run as planned
        # (the engine checks it: every prefill completes, every admission runs, nothing finishes, nothing
        # arrives), a served type has nothing at stage 0 (fewer than n_j there means the queue held no more
        # of its type and they were all taken), so it stays below its count, and its oldest is that of its
        # residents the step left out (their idle_since_s is before now), else T (the served ones advanced at
        # T); every other type is as it is now (its residents paused, its first waiting requests the same:
        # the admitted ones are of served types). So the plan at T is empty when every such oldest +
        # max_wait_s exceeds T, with wake_at_s their minimum, min(w, T + max_wait_s): w over the fixed ones
        # (wake here, the unserved types', and the left-out residents'), the T term only if some served type
        # had every request served. Not stated when a served type's stage-0 requests do not all fit. Skipping
        # that plan leaves _touched as this plan sets it, so the next plan regroups the same types, unchanged
        # since (no step ran): the same groups as regrouping at T would give.
        timeout_only = idle = bool(eligible) and not by_count and self.idle_policy == "wait"
        w = wake
        all_served = False
        for j in serve:                                  # decode stages: 1 token each
            cap = self.n[j]
            if repeat and len(res0[j]) + len(wait0[j]) < cap:
                repeat = False                           # eligible by timeout: serving it may end that
            left = math.inf                              # the oldest idle_since_s of the type's left-out residents
            for grp in tg[j][1].values():
                k = len(run)
                budget, whole = _take_decode(grp, cap, budget, run)
                if not whole:
                    repeat = False
                    if timeout_only:
                        left = _oldest_left_out(grp, len(run) - k, left)
            if timeout_only:
                if left < math.inf:
                    if left + mw < w:
                        w = left + mw
                else:
                    all_served = True
        n_dec = len(run)
        if admit_ok:
            for j in serve:                              # stage 0: prefill chunks and admissions
                k = len(run)
                budget = _take_stage0(res0[j], wait0[j], self.n[j], budget, inp.chunk_cap, run, admit)
                if timeout_only and len(run) - k != len(res0[j]):
                    idle = False                         # a stage-0 resident left out: stays at stage 0
        self._touched = serve if run else ()
        idle_after = (w, mw if all_served else None) if idle else None
        # StepPlan.timer_groups: in the same regime with other types' timers pending (see _timer_groups)
        groups = None
        if idle and run and len(run) == n_dec and not admit and not waiting and all_served:
            groups = self._timer_groups(tg, inp.token_budget)
            if groups is not None:
                # the engine may run the groups' steps without asking: the next plan regroups every type
                self._touched = range(m)
        # StepPlan.idle_repeat_steps: after such a plan (every resident served, each stage group whole, nothing
        # at stage 0 or waiting: _paces), at T + max_wait_s every type's residents have the oldest T and nothing
        # at stage 0, so the same types are eligible by their timeout alone, each group whole again (a type's
        # cap is the same at every stage; the same tokens of budget): the same plan, with no horizon
        plan = _plan(run, admit, inp.running, wake, None if repeat and len(run) == n_dec and run else 1,
                     idle_after, _UNTIL_EVENT if _paces(idle_after, run, n_dec, admit) else 0)
        return plan if groups is None else replace(plan, timer_groups=groups)

    def _timer_groups(self, tg: list, budget: int) -> Optional[tuple]:
        """``StepPlan.timer_groups`` of a plan that serves types by their timeout alone (``idle_policy='wait'``,
        every served type's residents all run, nothing waiting): one group per type holding residents, its
        residents in the order a plan runs them (its stage groups in order), ready at its oldest
        ``idle_since_s + max_wait_s`` (s), the float the plan compares with ``now``; ``None`` when the regime
        does not hold: a resident at stage 0, a stage group above the type's cap ``n_j``, or more residents than
        the step's token budget (tokens).

        Why every later plan is the groups ready then (until anything arrives, finishes or is transferred):
        nothing waits and nothing is at stage 0, so no type is eligible by its count (0 < n_j) and a type is
        eligible exactly when its oldest resident has waited ``max_wait_s``; it then runs all its residents
        (each stage group fits its cap, every group fits the budget together), one token each, so they all
        have ``idle_since_s`` = the step's end ``T`` after it (ready at ``T + max_wait_s``) and move up one
        stage together: its stage groups stay the same sets in the same order (a type's cap is the same at
        every stage), nothing reaches stage 0. An empty plan's wake is the smallest ready time."""
        mw = self.max_wait_s
        out = []
        total = 0
        for j, g in enumerate(tg):
            if g[0]:
                return None
            stages = g[1]
            if not stages:
                continue
            cap = self.n[j]
            reqs: list = []
            for grp in stages.values():
                if len(grp) > cap:
                    return None
                reqs.extend(grp)
            total += len(reqs)
            out.append((tuple(reqs), g[2] + mw))
        if total > budget or not out:
            return None
        return tuple(out)

STAGE_CAP_RULES = ("raised", "rotate")


def segment_stage_caps(segment_lengths: Sequence[int], thresholds: Sequence[float], raise_zero: bool = True
                       ) -> list[list[int]]:
    """Per-stage caps of each Nested WAIT segment (prompts), as in the paper's experiments.

    Segment ``k``'s cap ``B_k = Delta_k n_k`` is rounded half up to an integer and spread as evenly as
    possible over its ``Delta_k`` stages: ``B_k // Delta_k`` each, one more on the **last**
    ``B_k % Delta_k`` stages (arXiv 2504.11320, Sec. "Numerical experiments", real-data threshold
    construction: "rounded to an integer and spread as evenly as possible"; which stages get the extra
    one is ours: caps that never decrease along a segment keep its entry the bottleneck, so no backlog
    builds up inside the segment; the authors' code rotates the extra ones from batch to batch, which
    :class:`NestedWaitRule` does with ``rotate=True``). ``raise_zero`` (``stage_caps=raised``): a stage
    cap of 0 is raised to 1 (ours: with fixed caps a stage with cap 0 would never advance; it makes a
    segment with ``B_k < Delta_k`` take up to ``Delta_k`` per step, e.g. 30 instead of 9); ``False`` keeps
    the zeros (``stage_caps=rotate``, where they rotate).
    """
    caps = []
    for d, n in zip(segment_lengths, thresholds):
        b = math.floor(d * n + 0.5)
        base, extra = divmod(b, d)
        lo = 1 if raise_zero else 0
        caps.append([max(lo, base + (1 if i >= d - extra else 0)) for i in range(d)])
    return caps


class NestedWaitRule:
    """Nested WAIT (Algorithm 2 of arXiv 2504.11320) as an engine batch rule.

    Segment boundaries ``b_1 < ... < b_m`` in iterations (output tokens): segment ``k`` holds stages
    ``b_{k-1} .. b_k - 1`` (``b_0 = 0``; stages past ``b_m`` count in segment ``m``). Its entry queue is
    its first stage: for segment 1 the waiting and prefilling requests (stage 0), for ``k >= 2`` the
    residents that produced exactly ``b_{k-1}`` tokens and continue (the paper's resident boundary queue).
    A step serves the longest prefix of segments ``1..k`` whose entry queues all hold at least their
    entry-stage cap ``n_k``; at every stage of those segments it takes ``min(cap, count)`` requests;
    later segments pause (KV kept). Output lengths are never used.

    Finite horizons, ``max_wait_s`` and ``idle_policy``: as in :class:`WaitRule`; a segment also passes
    its gate when some request in it or in a later segment has waited ``max_wait_s`` (so the tail of a
    finite trace drains).

    ``rotate`` (``stage_caps=rotate``; after the authors' ``general_nested_booking_limit`` scheduler, which
    rotates each segment's per-stage limit from batch to batch): segment ``k`` keeps only its total ``B_k``
    (the sum of its ``stage_caps``, zeros allowed); at step ``t`` (``StepInput.step_index``) the stage at
    offset ``i`` of the segment has cap ``B_k // Delta_k + 1`` when ``(i + t) mod Delta_k < B_k mod
    Delta_k``, else ``B_k // Delta_k``: every step's caps sum to ``B_k`` and over ``Delta_k`` steps each
    stage gets the extra one ``B_k mod Delta_k`` times (no stage is blocked for good).

    Args:
        boundaries: ``b_1..b_m`` (ints, increasing). stage_caps: per segment, the cap of each of its
            stages (``segment_stage_caps``; >= 1 unless ``rotate``). max_wait_s: s. idle_policy: ``wait`` or
            ``decode_residents``. rotate: see above. incremental: keep each segment's residents and stage
            groups from step to step (default); ``False`` rebuilds them at every step (the same plans; for
            checks). reserve_tokens: the memory safety buffer held free (``scheduler.safety_buffer=reserve``;
            ``baselines.wait.fluid.nested_wait_safety_buffer``), tokens, >= 0: a step admits a waiting prompt
            only while the free KV blocks left after the admissions so far (each needing its prompt's blocks)
            stay at or above ``ceil(reserve_tokens / block_size)``; 0 (default) admits as Algorithm 2 does.
            The residents' decode growth is not charged to the check (at most one block per resident a step).
    """

    name = "nested_wait"

    def __init__(self, boundaries: Sequence[int], stage_caps: Sequence[Sequence[int]], max_wait_s: float,
                 idle_policy: str = "wait", rotate: bool = False, incremental: bool = True,
                 reserve_tokens: float = 0.0):
        if not (math.isfinite(reserve_tokens) and reserve_tokens >= 0):
            raise ValueError(f"Nested WAIT reserve_tokens must be finite and >= 0, got {reserve_tokens!r}")
        self.reserve_tokens = float(reserve_tokens)
        self.bounds = [int(b) for b in boundaries]
        self.caps = [list(c) for c in stage_caps]
        self.rotate = bool(rotate)
        if len(self.caps) != len(self.bounds) or any(
                len(c) != b - a for c, a, b in zip(self.caps, [0] + self.bounds[:-1], self.bounds)):
            raise ValueError("stage_caps must give one cap per stage of every segment")
        if not self.rotate and any(x < 1 for c in self.caps for x in c):
            raise ValueError("Nested WAIT stage caps must be >= 1 with fixed caps (0 is allowed only with rotate)")
        self.totals = [sum(c) for c in self.caps]
        self.starts = [0] + self.bounds[:-1]
        self.max_wait_s, self.idle_policy = max_wait_s, idle_policy
        # segment and cap of every stage below the last boundary, looked up per request at every step
        # (stages from the last boundary on: the last segment, its last stage's cap)
        self._seg_tab = [self.segment(st) for st in range(self.bounds[-1])] if self.bounds else []
        self._cap_tab = [self.cap(k, st) for st, k in enumerate(self._seg_tab)]
        self._entry_caps = [self.cap(k, a) for k, a in enumerate(self.starts)]   # (fixed caps; segment 1's: stage 0)
        self._rot = [(len(c), *divmod(tot, len(c)), a) for c, tot, a in zip(self.caps, self.totals, self.starts)]
        # each segment's residents from step to step (KeyedResidents: only the segments the last plan ran
        # and new residents are re-read), and per segment (stage-0 residents, {stage: residents}, oldest)
        self._index = KeyedResidents(self._segment_of, len(self.bounds), incremental)
        self._touched: Sequence = ()
        # rotate: the offsets a plan may move the rotation on by (the longest segment's length), for the
        # direct search of the first one at which something runs (direct_search=False: try each in turn)
        self._offsets = max((len(c) for c in self.caps), default=1)
        self._offset_range = np.arange(self._offsets, dtype=np.int64)
        self.direct_search = True
        self._good_memo: dict = {}      # (segment, frozenset of its groups' offsets) -> runnable residues

    def _segment_of(self, r, s: int) -> int:
        """0-based segment of stage ``s`` (request ``r``'s; from the table, the last segment past it)."""
        return self._seg_tab[s] if s < len(self._seg_tab) else len(self.bounds) - 1

    def to_spec(self) -> dict:
        """The rule's parameters as a JSON-able dict (``rule_from_spec`` rebuilds it):
        ``{"rule": "nested_wait", "boundaries", "stage_caps", "max_wait_s", "idle_policy"}``."""
        spec = {"rule": "nested_wait", "boundaries": list(self.bounds), "stage_caps": [list(c) for c in self.caps],
                "max_wait_s": float(self.max_wait_s), "idle_policy": self.idle_policy}
        if self.rotate:
            spec["rotate"] = True
        if self.reserve_tokens:
            spec["reserve_tokens"] = self.reserve_tokens
        return spec

    def segment(self, stage: int) -> int:
        """0-based segment index of ``stage``."""
        return min(bisect_right(self.bounds, stage), len(self.bounds) - 1)

    def cap(self, k: int, stage: int) -> int:
        """The cap of ``stage`` in segment ``k`` (prompts per step)."""
        c = self.caps[k]
        return c[min(stage - self.starts[k], len(c) - 1)]

    def rotated_cap(self, k: int, stage: int, step_index: int) -> int:
        """``rotate``: the cap of ``stage`` in segment ``k`` at step ``step_index`` (prompts)."""
        d, base, rem, start = self._rot[k]
        i = stage - start
        if i >= d:
            i = d - 1
        return base + 1 if (i + step_index) % d < rem else base

    def plan(self, inp: StepInput) -> StepPlan:
        self._index.sync(inp.running, self._touched)
        sg = self._index.groups
        if not self.rotate:
            plan, served = self._plan_at(inp, 0, sg)
            self._touched = range(served) if plan.run else ()
            return plan
        # rotate: a step whose rotated caps give nothing to run would leave the engine idle with the step
        # index unchanged (it counts executed steps), so the rotation moves on to the first offset at
        # which something runs (at most the longest segment's length; the authors' counter advances on
        # every call, empty or not): found from the rotation formula (_first_opening), then planned once
        offsets = self._offsets
        off = self._first_opening(inp, sg) if self.direct_search else self._first_opening_linear(inp, sg)
        if off is None:
            plan, _ = self._plan_at(inp, inp.step_index + offsets - 1, sg)
            self._touched = ()
            return plan
        plan, served = self._plan_at(inp, inp.step_index + off, sg)
        self._touched = range(served) if plan.run else ()
        # moved on (off > 0): the next step's index is one more, not off more: no horizon
        return plan if off == 0 or not plan.repeatable else replace(plan, repeatable=False, repeat_steps=1)

    def _first_opening_linear(self, inp: StepInput, sg: list) -> Optional[int]:
        """The smallest offset ``off`` in ``range(offsets)`` (``offsets``: the longest segment's length) at
        which ``_plan_at`` at step index ``step_index + off`` runs or admits something (``None``: none),
        by trying each offset in turn (O(offsets x stages); the reference :meth:`_first_opening` is
        checked against, ``direct_search=False``)."""
        for off in range(self._offsets):
            plan, _ = self._plan_at(inp, inp.step_index + off, sg, final=False)
            if plan is not None:
                return off
        return None

    def _first_opening(self, inp: StepInput, sg: list) -> Optional[int]:
        """:meth:`_first_opening_linear` from the rotation formula, for all offsets at once (numpy arrays
        over the offsets; O(offsets x segments + stage groups)).

        At step index ``t' = t + off`` a plan runs or admits something exactly when its served segments
        (the leading ones whose gates pass) have a non-empty stage group whose rotated cap is >= 1, or it
        admits (``idle_policy='wait'`` or a segment served) and stage 0 has a cap >= 1 and a prefilling
        resident or a waiting request in its window; with ``decode_residents`` and no gate passing,
        every segment is served, without admissions. Per segment ``k`` (``(Delta_k, base, rem, start)``):
        the cap at offset ``i`` is ``base + [(i + t') mod Delta_k < rem]``; its gate passes by its entry
        count ``E_k`` when ``E_k >= base + [t' mod Delta_k < rem]``, or by its timeout (its suffix's
        oldest ``idle_since_s + max_wait_s <= now``, as ``_plan_at`` computes it); segment 1's entry and
        oldest depend on its cap ``cap0`` (the waiting window is ``cap0 - prefilling residents``), two
        values. A group at offset ``i`` can run at ``t'`` iff ``base >= 1`` or ``(i + t') mod Delta_k`` is in
        ``[0, rem)``, i.e. ``t' mod Delta_k`` in the cyclic interval ``[-i, -i + rem)``: the residues where a
        segment has a runnable group are a union of such intervals (a difference array and its cumulative
        sum). Assumes a positive token budget (a step then takes its first candidate); otherwise linear."""
        if inp.token_budget <= 0:
            return self._first_opening_linear(inp, sg)
        m, rot = len(self.bounds), self._rot
        t = inp.step_index
        now, mw = inp.now_s, self.max_wait_s
        res0 = sg[0][0]
        R, W = len(res0), len(inp.waiting)
        suffix = [g[2] for g in sg]
        for k in range(m - 2, 0, -1):
            suffix[k] = min(suffix[k], suffix[k + 1])
        suf1 = suffix[1] if m > 1 else math.inf
        d0, base0, rem0, _ = rot[0]
        seg0 = []                               # (gate passes, stage 0 takes something) for cap0 = base0, base0 + 1
        for cap0 in (base0, base0 + 1):
            n = max(0, cap0 - R)
            o = suffix[0]                       # (segment 1's own oldest here: suffix[0] not yet folded)
            for r in islice(inp.waiting, n):
                if r.idle_since_s < o:
                    o = r.idle_since_s
            e0 = R + min(W, n)
            seg0.append((e0 >= cap0 or min(o, suf1) + mw <= now, cap0 >= 1 and e0 > 0))
        ar = self._offset_range
        hi0 = ((ar + t % d0) % d0) < rem0 if 0 < rem0 else None     # cap0 = base0 + 1 at these offsets
        (p_lo, s_lo), (p_hi, s_hi) = seg0
        if hi0 is None or p_lo == p_hi:
            pass0 = p_lo if hi0 is None else p_hi
        else:
            pass0 = hi0 if p_hi else ~hi0
        if hi0 is None or s_lo == s_hi:
            stage0 = s_lo if hi0 is None else s_hi
        else:
            stage0 = hi0 if s_hi else ~hi0
        served = pass0                          # segments 1..k+1 served (bool or array over the offsets)
        opened = served & stage0                # (admissions whenever a segment is served, either policy)
        any_good = False                        # some segment has a runnable group (decode_residents)
        for k in range(m):
            if k:
                dk, base, rem, start = rot[k]
                e = len(sg[k][1].get(start, ()))
                if suffix[k] + mw <= now or e >= base + 1 or (e >= base and rem <= 0):
                    pk = True
                elif e < base:
                    pk = False
                else:                           # e == base: passes where the entry cap is base
                    pk = ((ar + t % dk) % dk) >= rem
                served = served & pk
                if served is False or (not isinstance(served, bool) and not served.any()):
                    if self.idle_policy == "wait":
                        break               # no later segment is served at any offset
                    served = False
            good = self._runnable(k, sg[k][1], t)
            if good is not False:
                any_good = any_good | good
                opened = opened | (served & good)
        if self.idle_policy == "decode_residents":     # no gate passes: every segment, no admissions
            if isinstance(pass0, bool):
                opened = opened | (False if pass0 else any_good)
            else:
                opened = opened | (~pass0 & any_good)
        if isinstance(opened, (bool, np.bool_)):
            return 0 if opened else None
        i = int(np.argmax(opened))
        return i if opened[i] else None

    def _runnable(self, k: int, stages: dict, t: int):
        """Whether segment ``k`` has a stage group (``stages``: ``{stage: residents}``) with a rotated cap
        >= 1, at each offset's step index ``t + off``: a bool (the same at every offset) or a bool array."""
        d, base, rem, start = self._rot[k]
        if not stages:
            return False
        if base >= 1:
            return any(len(g) for g in stages.values())
        if rem <= 0:
            return False
        last = d - 1
        offs = frozenset([min(s - start, last) for s, g in stages.items() if g])
        if not offs:
            return False
        memo = self._good_memo
        good_res = memo.get((k, offs))
        if good_res is None:
            # residues [st, st + rem) of each offset, cyclic: counted over two periods, then folded
            st = (-np.fromiter(offs, dtype=np.int64, count=len(offs))) % d
            c = np.cumsum(np.bincount(st, minlength=2 * d + 1) - np.bincount(st + rem, minlength=2 * d + 1))
            good_res = (c[:d] + c[d:2 * d]) > 0
            if len(memo) >= 4096:           # (a bounded memo: the stage sets recur while residents pause)
                memo.clear()
            memo[(k, offs)] = good_res
        return good_res[(self._offset_range + t % d) % d]

    def _plan_at(self, inp: StepInput, t: int, sg: list, final: bool = True) -> tuple[Optional[StepPlan], int]:
        """The plan at step index ``t`` from the segments' stage groups ``sg`` (per segment: stage-0
        residents, ``{stage: residents}`` in running order, oldest ``idle_since_s``); also the number of
        segments it serves (``1..served`` may have residents in its run). ``final=False``: ``None``
        instead of a plan that runs and admits nothing (a rotation offset that ``plan`` moves past)."""
        m = len(self.bounds)
        res0 = sg[0][0]
        oldest = [g[2] for g in sg]
        n_tab, last = len(self._seg_tab), m - 1
        cap_tab, cap_of = self._cap_tab, self.cap
        last_cap = self.caps[last][-1]
        rot = self.rotate
        ecaps = self._entry_caps        # each segment's entry-stage cap (fixed caps)
        if rot:     # the caps of step index t, computed for the stages looked at only (not a table per call:
            #         a plan may try up to a segment's length of offsets, over up to bounds[-1] stages)
            cap_of = lambda k, st: self.rotated_cap(k, st, t)  # noqa: E731
            ecaps = None
        cap0 = cap_of(0, 0) if rot else ecaps[0]
        waiting = list(islice(inp.waiting, max(0, cap0 - len(res0))))  # FCFS: head is oldest
        for r in waiting:
            if r.idle_since_s < oldest[0]:
                oldest[0] = r.idle_since_s
        suffix = oldest[:]
        for k in range(m - 2, -1, -1):
            suffix[k] = min(suffix[k], suffix[k + 1])
        now, mw = inp.now_s, self.max_wait_s
        kstar = 0
        wake = math.inf
        for k in range(m):
            entry = len(res0) + len(waiting) if k == 0 else len(sg[k][1].get(self.starts[k], ()))
            if entry >= (ecaps[k] if ecaps is not None else cap_of(k, self.starts[k])) or suffix[k] + mw <= now:
                kstar = k + 1
                continue
            wake = suffix[k] + mw
            break
        run: list = []
        admit: list = []
        budget = inp.token_budget
        serve_upto, admit_ok = kstar, True
        if kstar == 0 and self.idle_policy == "decode_residents":
            serve_upto, admit_ok = m, False
        repeat = admit_ok and serve_upto > 0
        groups: list = []
        limit = math.inf
        idle = None
        if serve_upto:
            limit = self.bounds[serve_upto - 1] if serve_upto < m else math.inf
            state = self.idle_policy == "wait" and not rot     # StepPlan.idle_after is stated (below)
            left = math.inf                     # the oldest idle_since_s of the residents the step leaves out
            for k in range(serve_upto):         # the served segments' stages, in stage order
                stages = sg[k][1]
                for s in (sorted(stages) if len(stages) > 1 else stages):
                    cap = cap_of(k, s) if rot else cap_tab[s] if s < n_tab else last_cap
                    grp = stages[s]
                    groups.append((s, len(grp)))
                    n0 = len(run)
                    budget, whole = _take_decode(grp, cap, budget, run)
                    if not whole:
                        repeat = False
                        if state:
                            left = _oldest_left_out(grp, len(run) - n0, left)
            n_dec = len(run)
            if admit_ok:
                _take_stage0(res0, waiting, cap0, budget, inp.chunk_cap, run, admit)
            if self.reserve_tokens and admit:
                # the safety buffer: admissions stop where the free blocks would fall below the reserve; a plan
                # whose admissions the reserve cut neither repeats (the free blocks change as residents decode)
                # nor states an idle step
                free = inp.free_blocks - math.ceil(self.reserve_tokens / inp.block_size)
                keep = 0
                for r in admit:
                    need = -(-r.prefill_target // inp.block_size)
                    if need > free:
                        break
                    free -= need
                    keep += 1
                if keep < len(admit):
                    del admit[keep:]
                    repeat = state = False
            if repeat and (len(run) != n_dec or not run or len(res0) + len(waiting) < cap0):
                repeat = False      # a prefill, nothing to run, or segment 1 open by a timeout only
            if state and len(run) - n_dec == len(res0) and (run or admit):
                idle = self._idle_after(inp, sg, serve_upto, len(admit), cap0, left)
        if not final and not run and not admit:
            return None, serve_upto
        horizon = self._horizon(groups, kstar, limit, t, len(res0), len(inp.waiting)) if repeat else 1
        paced = self._paced_horizon(groups) if _paces(idle, run, n_dec if serve_upto else 0, admit) else 0
        return _plan(run, admit, inp.running, wake, horizon, idle, paced), serve_upto

    def _paced_horizon(self, groups: list) -> int:
        """``StepPlan.idle_repeat_steps`` of a plan (fixed caps) that serves every resident, each stage group
        ``(stage s, size c)`` of ``groups`` whole, nothing at stage 0 or waiting (:func:`_paces`): after it,
        at ``T + max_wait_s``, every segment up to the last holding residents passes its gate by its timeout
        (its suffix's oldest is ``T``) and the segments past it hold nothing, so the plan serves the same
        groups, each one stage on, as long as each fits the cap of the stage it reaches. Returns the first
        step ``i`` (this one is 0) at which some group's stage ``s + i`` has a cap below ``c`` (stages past
        the last boundary: the last segment's last cap), at most ``PACED_HORIZON_STEPS``."""
        n_tab, cap_tab, last_cap = len(self._cap_tab), self._cap_tab, self.caps[-1][-1]
        h = PACED_HORIZON_STEPS
        for s, c in groups:
            for st in range(s + 1, min(n_tab, s + h)):
                if cap_tab[st] < c:
                    h = st - s
                    break
            else:
                if c > last_cap and s < n_tab < s + h:
                    h = n_tab - s
        return h

    def _idle_after(self, inp: StepInput, sg: list, served: int, admitted: int, cap0: int, left: float
                    ) -> Optional[tuple]:
        """``StepPlan.idle_after`` of a plan with fixed caps (``idle_policy='wait'``) that serves segments
        ``1..served``, runs every prefilling resident and admits the first ``admitted`` waiting requests;
        ``left``: the oldest ``idle_since_s`` of the served segments' residents it leaves out (s).

        After the step run as planned (the engine checks it: every prefill completes, every admission runs,
        nothing finishes, nothing arrives), stage 0 holds nothing but the rest of the waiting queue, so
        segment 1's entry is ``min(rest, cap0)``: below ``cap0`` only when fewer than ``cap0`` requests are
        left (else ``None``: no statement). Then segment 1's gate fails, and the plan is empty, iff its
        suffix's oldest plus ``max_wait_s`` exceeds ``T``: that oldest is the minimum of ``T`` (every request
        the step ran or admitted advanced at ``T`` and stays resident), ``left``, the unserved segments'
        oldest (their residents paused) and the rest of the queue's (its window); its wake time is that
        minimum plus ``max_wait_s`` (``min(w, T + max_wait_s)``, float addition being monotone). Skipping it
        leaves ``_touched`` as this plan sets it: the next plan regroups the same segments, unchanged since."""
        rest = len(inp.waiting) - admitted
        if rest >= cap0:
            return None
        o = left
        for g in sg[served:]:
            if g[2] < o:
                o = g[2]
        for r in islice(inp.waiting, admitted, None):
            if r.idle_since_s < o:
                o = r.idle_since_s
        return (o + self.max_wait_s if o < math.inf else math.inf, self.max_wait_s)

    def _horizon(self, groups: list, kstar: int, limit: float, t: int, n_res0: int, n_waiting: int) -> int:
        """Steps (this one included, at most ``NESTED_HORIZON_STEPS``) for which a decode-only plan that
        serves every stage group of segments ``1..kstar`` whole stays the same: at step ``i`` each group
        ``(stage s, size c)`` is at stage ``s + i``, which must stay below ``limit`` (the first paused
        segment) with a cap ``>= c``; every served segment ``k >= 2`` must pass its gate by the size of the
        group then at its entry stage (a timeout does not count: the served requests' idle times are
        renewed at each step); with ``rotate``, the caps are those of step index ``t + i`` and segment 1's
        entry cap must not change (it sets the admissions). Segment 1's gate (its stage-0 count) and the
        paused segments do not change in a decode-only run; a wake time that passes cuts the run."""
        sizes = dict(groups)
        entries = self.starts[1:kstar]
        rot = self.rotate
        seg_tab, n_tab, last = self._seg_tab, len(self._seg_tab), len(self.bounds) - 1
        cap_tab, last_cap = self._cap_tab, self.caps[last][-1]
        cap0 = self.rotated_cap(0, 0, t) if rot else 0
        for i in range(1, NESTED_HORIZON_STEPS):
            tt = t + i
            for s, c in groups:
                st = s + i
                if st >= limit:
                    return i
                if rot:
                    cap = self.rotated_cap(seg_tab[st] if st < n_tab else last, st, tt)
                else:
                    cap = cap_tab[st] if st < n_tab else last_cap
                if c > cap:
                    return i
            for k, e in enumerate(entries, 1):
                cap = self.rotated_cap(k, e, tt) if rot else cap_tab[e]
                if sizes.get(e - i, 0) < cap:
                    return i
            if rot and self.rotated_cap(0, 0, tt) != cap0:
                return i
        return NESTED_HORIZON_STEPS


@register_rule("wait")
@register_rule("nested_wait")
def rule_from_spec(spec: dict, classify: Optional[Callable] = None):
    """Rebuild a :class:`WaitRule` or :class:`NestedWaitRule` from its ``to_spec()`` dict (registered as the
    builder of rules ``wait`` and ``nested_wait``: ``harness.core.registry.rule_from_spec`` rebuilds any engine rule).

    ``classify``: WAIT's ``request -> bin`` (default: :class:`KnownOutputClassifier` of the spec's bins,
    reading the request's ``known_output_tokens``). The knobs are checked as the policies check them.

    Raises:
        ValueError: an unknown ``rule`` or a bad parameter (naming it).
    """
    kind = spec.get("rule")
    if spec.get("idle_policy") not in IDLE_POLICIES:
        raise ValueError(f"batch rule spec: idle_policy must be one of {IDLE_POLICIES}, got {spec.get('idle_policy')!r}")
    if not float(spec.get("max_wait_s", -1)) >= 0:
        raise ValueError(f"batch rule spec: max_wait_s must be >= 0, got {spec.get('max_wait_s')!r}")
    if kind == "wait":
        edges = check_knobs(spec["output_bins"], spec["max_wait_s"], "tl", 1.0, spec["idle_policy"])
        if len(spec["thresholds"]) != len(edges) + 1:
            raise ValueError(f"batch rule spec: {len(spec['thresholds'])} thresholds for {len(edges) + 1} output bins")
        return WaitRule(spec["thresholds"], classify or KnownOutputClassifier(edges), float(spec["max_wait_s"]),
                        spec["idle_policy"])
    if kind == "nested_wait":
        return NestedWaitRule(spec["boundaries"], spec["stage_caps"], float(spec["max_wait_s"]), spec["idle_policy"],
                              rotate=bool(spec.get("rotate", False)),
                              reserve_tokens=float(spec.get("reserve_tokens", 0.0)))
    raise ValueError(f"batch rule spec: unknown rule {kind!r} (wait or nested_wait)")
