"""WAIT-CP, the WAIT authors' own chunked-prefill variant, and a Sarathi-like control with its budget.

Source: the authors' Vidur fork, ``Luoxiaogan/vidur_or``, commit ``011fe971a7cd``:
``vidur/scheduler/replica_scheduler/general_nested_chunked_replica_scheduler.py`` (class
``GeneralNestedChunkedReplicaScheduler``, "WAIT-CP") and its parent
``general_nested_booking_limit_replica_scheduler.py`` (segments and their limits). Their single-type
figure ran it with ``total_limit`` 21, ``chunk_size`` 256, ``WAIT_CP_GATE=on``, ``wait_gate=false``,
``seg_margin`` 0 (their ``docs/progress/2026_04_26_single_type_reproduction_provenance.md``; docs/wait.md).
It is not Algorithm 1 or 2 of the paper: a work-conserving chunked-prefill rule with an in-system cap
``tl``, a per-request prefill chunk ``cs``, 1-2 new prompts per step and a token budget derived from the
workload; it has no accumulation threshold (unless ``wait_gate``).

Constants (per instance, from the workload's prompt types ``i``: mean prompt ``l0_i``, output tokens
``decode_i``, rate ``lambda_i``; ``w_i = lambda_i / sum lambda``), as the authors' ``__init__``:

* ``K_i = max(1, ceil(l0_i / cs))`` (prefill steps of a prompt), ``D = sum_i w_i (K_i + decode_i)``,
  ``P = tl / D``, ``pi = P sum_i w_i K_i`` (prompts mid-prefill), and the token budget
  ``batch_est = ceil((tl - pi) + pi cs)`` (decodes 1 token each, prefills ``cs``).
* Segments at the distinct decode lengths ``d_1 < ... < d_m``: segment 1 holds stages ``0 .. d_1 - 1``,
  segment ``k`` stages ``d_{k-1} .. d_k - 1`` (``Delta_k`` stages); ``p_k`` = rate of the types longer than
  ``d_k`` over the rate of those longer than ``d_{k-1}``; ``q_k = min(p_k + seg_margin, 0.99)``;
  ``n_1 = tl / sum_k Delta_k prod_{j<k} q_j``; segment total ``B_k = round(n_k Delta_k)`` (Python's round).

One step (the authors' ``_get_next_batch``), with ``t`` = the engine's step index (``StepInput.step_index``;
the authors count calls of ``_get_next_batch``) and the rotating per-stage limit of segment ``k``
``lim_k = floor(B_k / Delta_k) + 1`` when ``t mod Delta_k < B_k mod Delta_k``, else ``floor(B_k / Delta_k)``:

1. decodes, per segment: with ``wait_gate`` the segment runs only if its requests number ``>= B_k`` or its
   entry stage holds ``>= lim_k`` (or, ours, for a finite trace, one of them waited ``max_wait_s``);
   a segment ``k >= 2`` advances ``min(lim_k, B_k - requests inside it past the entry)`` of its entry
   stage (oldest admitted first); every interior stage advances freely (1 token each). Decodes count
   toward ``batch_est`` but are not limited by it (only by the engine's own budget).
2. running prefills, in admission order: each ``min(remaining, cs, batch_est - used)`` (0: paused).
3. new prefills in queue order while admitted ``< min(lim_1, B_1 - segment-1 decoders not run this step,
   tl - requests holding KV)``, used ``< batch_est``, and the 1 % watermark passes: free blocks minus the
   prompt blocks already promised (the whole prompt of each prefilling resident and of each new
   admission, as the authors reserve a prompt's blocks at admission) minus this prompt's blocks
   ``>= watermark_frac x capacity``; each gets ``min(prompt, cs, batch_est - used)``.

Without ``gate`` (``WAIT_CP_GATE=off``) ``batch_est`` bounds nothing. Ours: a request past the last
segment (an output longer than the longest type's mean) advances freely as an interior stage of the last
segment (the authors' types have exact lengths, so none is there); a step whose rotating limits would run
nothing moves the rotation on to the first step index at which something runs (the engine's index
counts executed steps; the authors' counter advances at every call, empty or not).

The control (:class:`BudgetCapRule`, scheduler ``wait_cp_control``): vLLM V1's mixed step (Sarathi-like:
running requests in admission order, then FCFS admissions) with WAIT-CP's ``batch_est`` as the step's
token budget and ``tl`` as the cap on requests holding KV, nothing else, so that a difference between
WAIT-CP and it is the rule, and a difference between it and Sarathi-like is the budget and cap.

Units: tokens, blocks, prompts (requests), s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Optional, Sequence

from baselines.wait.fluid_admission import check_knobs, prompt_types
from harness.core.batching import StepInput, StepPlan, VllmV1Rule
from harness.core.policy import BatchRulePolicy, PolicyContext, register
from harness.core.registry import register_rule

AUTHORS_SOURCE = ("Luoxiaogan/vidur_or@011fe971a7cd vidur/scheduler/replica_scheduler/"
                  "general_nested_chunked_replica_scheduler.py")


@dataclass(frozen=True)
class CpType:
    """One prompt type of WAIT-CP: ``prefill`` (mean prompt tokens), ``decode`` (output tokens, an int
    >= 1: iterations after which it leaves), ``rate`` (arrivals/s, > 0)."""

    prefill: float
    decode: int
    rate: float


@dataclass(frozen=True)
class Segment:
    """A WAIT-CP segment: stages ``start .. end`` (inclusive) and its total limit ``total`` (prompts)."""

    start: int
    end: int
    total: int

    @property
    def stages(self) -> int:
        """``Delta_k``: the segment's number of stages."""
        return self.end - self.start + 1

    def limit(self, step_index: int) -> int:
        """The rotating per-stage limit at step ``step_index``: ``B // Delta + 1`` when ``step_index mod
        Delta < B mod Delta``, else ``B // Delta`` (prompts)."""
        base, rem = divmod(self.total, self.stages)
        return base + 1 if step_index % self.stages < rem else base


@dataclass(frozen=True)
class CpConstants:
    """WAIT-CP's constants (see the module docstring): ``K`` per type (steps), ``D`` (steps), ``P``
    (prompts entering per step), ``pi`` (prompts mid-prefill), ``batch_est`` (tokens), segments."""

    K: tuple
    D: float
    P: float
    pi: float
    batch_est: int
    segments: tuple


def wait_cp_constants(types: Sequence[CpType], tl: float, cs: int, seg_margin: float = 0.0) -> CpConstants:
    """WAIT-CP's constants from the prompt types (the authors' ``__init__`` and
    ``calculate_nested_booking_limits``; formulas in the module docstring).

    Raises:
        ValueError: no types, a type with ``decode < 1`` or ``rate <= 0``, ``tl <= 0`` or ``cs < 1``.
    """
    if not types:
        raise ValueError("WAIT-CP needs at least one prompt type")
    if not (tl > 0 and math.isfinite(tl)):
        raise ValueError(f"scheduler.tl must be a finite number > 0, got {tl!r}")
    if not (isinstance(cs, int) and cs >= 1):
        raise ValueError(f"scheduler.cs must be an int >= 1 (tokens), got {cs!r}")
    for t in types:
        if t.decode < 1 or not t.rate > 0:
            raise ValueError(f"WAIT-CP prompt type needs decode >= 1 and rate > 0, got {t}")
    total = math.fsum(t.rate for t in types)
    K = tuple(max(1, math.ceil(t.prefill / cs)) for t in types)
    D = math.fsum(t.rate / total * (k + t.decode) for t, k in zip(types, K))
    P = tl / D
    pi = P * math.fsum(t.rate / total * k for t, k in zip(types, K))
    batch_est = int(math.ceil((tl - pi) + pi * cs))
    decodes = sorted({t.decode for t in types})
    counts = [decodes[0]] + [b - a for a, b in zip(decodes, decodes[1:])]
    sums = [total] + [math.fsum(t.rate for t in types if t.decode > d) for d in decodes[:-1]]
    cum = [1.0]
    for k in range(len(counts) - 1):
        p = sums[k + 1] / sums[k] if sums[k] > 0 else 0.0
        cum.append(cum[-1] * min(p + seg_margin, 0.99))
    n1 = tl / math.fsum(c * q for c, q in zip(counts, cum))
    segs, start = [], 0
    for c, q in zip(counts, cum):
        segs.append(Segment(start, start + c - 1, int(round(n1 * q * c))))
        start += c
    return CpConstants(K, D, P, pi, batch_est, tuple(segs))


class WaitCpRule:
    """WAIT-CP as an engine batch rule (the authors' ``GeneralNestedChunkedReplicaScheduler``; module
    docstring for the step).

    Args:
        consts: :func:`wait_cp_constants`. tl: in-system cap (prompts holding KV). cs: per-request prefill
            chunk, tokens. gate: ``batch_est`` bounds prefills (``WAIT_CP_GATE=on``). wait_gate: the
            per-segment accumulation gate. watermark_frac: admission watermark, fraction of KV blocks.
        max_wait_s: with ``wait_gate``, a segment whose oldest request waited this long runs (ours, for
            a finite trace), s.
    """

    name = "wait_cp"

    def __init__(self, consts: CpConstants, tl: float, cs: int, gate: bool = True, wait_gate: bool = False,
                 watermark_frac: float = 0.01, max_wait_s: float = 0.5):
        self.c, self.tl, self.cs = consts, tl, int(cs)
        self.gate, self.wait_gate = bool(gate), bool(wait_gate)
        self.watermark_frac, self.max_wait_s = float(watermark_frac), float(max_wait_s)
        self.segs = list(consts.segments)
        self.last_end = self.segs[-1].end

    def to_spec(self) -> dict:
        """The rule's parameters as a JSON-able dict (``rule_from_spec`` rebuilds it)."""
        return {"rule": "wait_cp", "tl": float(self.tl), "cs": self.cs, "gate": self.gate,
                "wait_gate": self.wait_gate, "watermark_frac": self.watermark_frac,
                "max_wait_s": self.max_wait_s, "batch_est": self.c.batch_est,
                "segments": [[s.start, s.end, s.total] for s in self.segs]}

    def _seg_of(self, stage: int) -> int:
        for k, s in enumerate(self.segs):
            if stage <= s.end:
                return k
        return len(self.segs) - 1

    def plan(self, inp: StepInput) -> StepPlan:
        # a step whose rotating limits run nothing (a segment's entry at a limit of 0, nothing else to do)
        # would leave the engine idle with its step index unchanged (it counts executed steps), so the
        # rotation moves on to the first step index at which something runs (ours; the authors' counter
        # advances at every call, empty or not, and their simulator calls again at the next arrival)
        plan = self._plan_at(inp, inp.step_index)
        if plan.run or plan.admit or not (inp.running or inp.waiting):
            return plan
        for off in range(1, max(s.stages for s in self.segs)):
            p = self._plan_at(inp, inp.step_index + off)
            if p.run or p.admit:
                return p
        return plan

    def _plan_at(self, inp: StepInput, t: int) -> StepPlan:
        cs, segs = self.cs, self.segs
        big = self.c.batch_est if self.gate else math.inf
        engine_budget = inp.token_budget
        prefilling, by_stage = [], {}
        for r in inp.running:
            s = r.stage
            if s == 0:
                prefilling.append(r)
            else:
                by_stage.setdefault(s, []).append(r)
        run: list = []
        used = 0
        wake = math.inf
        now = inp.now_s
        # 1. decodes per segment
        for k, seg in enumerate(segs):
            lim = seg.limit(t)
            end = seg.end if k < len(segs) - 1 else math.inf
            entry = (len(prefilling) + len(inp.waiting)) if seg.start == 0 else len(by_stage.get(seg.start, ()))
            inside = [s for s in by_stage if seg.start < s <= end]
            occupied = sum(len(by_stage[s]) for s in inside)
            if self.wait_gate and not (entry + occupied >= seg.total or entry >= lim):
                members = [r for s in inside for r in by_stage[s]]
                if seg.start == 0:
                    members += prefilling + list(islice(inp.waiting, 1))
                else:
                    members += by_stage.get(seg.start, [])
                oldest = min((r.idle_since_s for r in members), default=math.inf)
                if oldest + self.max_wait_s > now:
                    wake = min(wake, oldest + self.max_wait_s)
                    continue
            if seg.start >= 1:
                for r in by_stage.get(seg.start, [])[:min(lim, max(0, seg.total - occupied))]:
                    if used >= engine_budget:
                        break
                    run.append((r, 1))
                    used += 1
            for s in sorted(inside):
                for r in by_stage[s]:
                    if used >= engine_budget:
                        break
                    run.append((r, 1))
                    used += 1
        cap = min(big, engine_budget)
        # 2. running prefills
        for r in prefilling:
            give = min(r.prefill_target - r.computed, cs, max(0, cap - used))
            if give > 0:
                run.append((r, give))
                used += give
        # 3. new prefills
        seg0 = segs[0]
        chosen = {id(r) for r, _ in run}
        left_out0 = sum(1 for s, grp in by_stage.items() if 0 < s <= seg0.end
                        for r in grp if id(r) not in chosen)
        remain = min(seg0.limit(t), max(0, seg0.total - left_out0), max(0, int(self.tl) - len(inp.running)))
        admit: list = []
        adm_used = used
        bs = inp.block_size
        free = inp.free_blocks - sum(max(0, -(-r.prefill_target // bs) - r.blocks) for r in prefilling)
        wm = self.watermark_frac * inp.capacity_blocks
        if remain > 0:
            for r in inp.waiting:
                if len(admit) >= remain or adm_used >= cap:
                    break
                need = -(-r.prefill_target // bs)
                if free - need < wm:
                    break
                give = min(r.prefill_target, cs, cap - adm_used)
                if give <= 0:
                    break
                admit.append(r)
                adm_used += give
                free -= need
        paused = [r for r in inp.running if id(r) not in chosen]
        paused.sort(key=lambda r: r.admit_seq, reverse=True)
        # repeatable (a coalesced decode-only run) only while no admission is possible whatever the step
        # index: a limit of 0 at this rotation step may be 1 at the next (B_1 < Delta_1, e.g. 21 over 1000)
        # (and only while every resident is in the last segment: one crossing into a later segment's entry
        # stage meets that entry's limit, which a coalesced run would not apply)
        room = min(max(0, seg0.total - left_out0), max(0, int(self.tl) - len(inp.running)))
        last_start = segs[-1].start
        repeatable = (not admit and not paused and not self.wait_gate
                      and all(n == 1 for _, n in run) and (not inp.waiting or room == 0)
                      and all(s >= last_start for s in by_stage))
        return StepPlan(tuple(run), tuple(admit), tuple(paused), None if wake == math.inf else wake,
                        repeatable, admit_budget=(int(cap - used) if self.gate else None),
                        admit_chunk_cap=cs)


@register_rule("wait_cp")
@register_rule("wait_cp_control")
def cp_rule_from_spec(spec: dict):
    """Rebuild a :class:`WaitCpRule` or :class:`BudgetCapRule` from its ``to_spec()`` dict (registered as the
    builder of rules ``wait_cp`` and ``wait_cp_control``; the vLLM wrapper, ``harness.vllm.wait_scheduler``,
    rebuilds it through ``harness.core.registry.rule_from_spec``).

    Raises:
        ValueError: a missing or bad field, naming it.
    """
    try:
        if spec["rule"] == "wait_cp_control":
            return BudgetCapRule(int(spec["budget"]), int(spec["seq_cap"]))
        segs = tuple(Segment(int(a), int(b), int(t)) for a, b, t in spec["segments"])
        if not segs or any(s.end < s.start or s.total < 0 for s in segs):
            raise ValueError(f"bad segments {spec['segments']!r}")
        consts = CpConstants((), math.nan, math.nan, math.nan, int(spec["batch_est"]), segs)
        cs = spec["cs"]
        if not (isinstance(cs, int) and cs >= 1):
            raise ValueError(f"cs must be an int >= 1, got {cs!r}")
        return WaitCpRule(consts, float(spec["tl"]), cs, bool(spec["gate"]), bool(spec["wait_gate"]),
                          float(spec["watermark_frac"]), float(spec["max_wait_s"]))
    except KeyError as e:
        raise ValueError(f"batch rule spec ({spec.get('rule')}): missing {e}") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"batch rule spec ({spec.get('rule')}): {e}") from None


class BudgetCapRule:
    """The control: vLLM V1's mixed step (:class:`harness.core.batching.VllmV1Rule`, Sarathi-like) with a
    per-step token budget ``budget`` (WAIT-CP's ``batch_est``, tokens) and at most ``seq_cap`` requests
    holding KV (WAIT-CP's ``tl``); admissions in FCFS order share what the running requests leave of
    ``budget``. Nothing else of WAIT-CP (no per-request chunk beyond the engine's, no rotation)."""

    name = "wait_cp_control"

    def __init__(self, budget: int, seq_cap: int):
        if budget < 1 or seq_cap < 1:
            raise ValueError(f"BudgetCapRule needs budget >= 1 and seq_cap >= 1, got {budget}, {seq_cap}")
        self.budget, self.seq_cap = int(budget), int(seq_cap)
        self._v1 = VllmV1Rule()

    def to_spec(self) -> dict:
        """The rule's parameters as a JSON-able dict."""
        return {"rule": "wait_cp_control", "budget": self.budget, "seq_cap": self.seq_cap}

    def plan(self, inp: StepInput) -> StepPlan:
        b = min(self.budget, inp.token_budget)
        p = self._v1.plan(replace(inp, token_budget=b))
        room = self.seq_cap - len(inp.running)
        used = sum(n for _, n in p.run)
        admit = tuple(islice(inp.waiting, room)) if room > 0 else ()
        return StepPlan(p.run, admit, repeatable=p.repeatable, admit_budget=b - used)


@dataclass
class WaitCpConfig:
    """tl: in-system cap (the authors' ``total_limit``, prompts); cs: per-request prefill chunk (their
    ``chunk_size``, tokens); gate: ``batch_est`` bounds a step's prefills (their ``WAIT_CP_GATE``);
    wait_gate: the per-segment accumulation gate (their ``wait_gate``); seg_margin: ``q_k`` slack; output_bins:
    type boundaries on output tokens (types = the workload's turns per bin); watermark_frac: admission
    watermark, fraction of KV blocks (their ``watermark_blocks_fraction``); max_wait_s: finite-horizon
    escape of ``wait_gate``, s."""

    name: str = "wait_cp"
    tl: float = 21.0
    cs: int = 256
    gate: bool = True
    wait_gate: bool = False
    seg_margin: float = 0.0
    output_bins: list[int] = field(default_factory=lambda: [20, 50, 1000])
    watermark_frac: float = 0.01
    max_wait_s: float = 0.5


@dataclass
class WaitCpControlConfig:
    """The same-budget Sarathi-like control: ``tl``, ``cs``, ``seg_margin``, ``output_bins`` only serve to
    compute WAIT-CP's ``batch_est`` (the step budget) and ``tl`` (the cap on requests holding KV)."""

    name: str = "wait_cp_control"
    tl: float = 21.0
    cs: int = 256
    seg_margin: float = 0.0
    output_bins: list[int] = field(default_factory=lambda: [20, 50, 1000])


class WaitCp(BatchRulePolicy):
    """WAIT-CP batching in every engine + sticky collocated placement, no admission hold."""

    name = "wait_cp"


class WaitCpControl(BatchRulePolicy):
    """Sarathi-like with WAIT-CP's budget and cap in every engine + collocated placement."""

    name = "wait_cp_control"


def _constants(cfg, ctx: PolicyContext) -> tuple[list[CpConstants], int]:
    edges = check_knobs(cfg.output_bins, 0.0, "tl", cfg.tl, "wait")
    if not 0 <= cfg.seg_margin < 1:
        raise ValueError(f"scheduler.seg_margin must be in [0, 1), got {cfg.seg_margin!r}")
    n = len(ctx.cluster_roles)
    types, _ = prompt_types(ctx, edges, n)
    cp = [CpType(t.input_tokens, max(1, round(t.output_tokens)), t.rate_per_s) for t in types]
    return [wait_cp_constants(cp, cfg.tl, cfg.cs, cfg.seg_margin) for _ in range(n)], n


def _note(c: CpConstants, tl: float, cs: int) -> str:
    return (f"tl={tl:g} cs={cs} K={list(c.K)} D={c.D:.3f} P={c.P:.4f} pi={c.pi:.4f} batch_est={c.batch_est} "
            f"segments={[(s.start, s.end, s.total) for s in c.segments]} ({AUTHORS_SOURCE})")


@register("wait_cp", WaitCpConfig, forms_batches=True, reads_workload=True)
def make(cfg: WaitCpConfig, ctx: PolicyContext) -> WaitCp:
    if not 0 <= cfg.watermark_frac < 1:
        raise ValueError(f"scheduler.watermark_frac must be in [0, 1), got {cfg.watermark_frac!r}")
    if not cfg.max_wait_s >= 0:
        raise ValueError(f"scheduler.max_wait_s must be >= 0, got {cfg.max_wait_s!r}")
    consts, _ = _constants(cfg, ctx)
    rules = [WaitCpRule(c, cfg.tl, cfg.cs, cfg.gate, cfg.wait_gate, cfg.watermark_frac, cfg.max_wait_s)
             for c in consts]
    return WaitCp(rules, _note(consts[0], cfg.tl, cfg.cs) + f" gate={cfg.gate} wait_gate={cfg.wait_gate}")


@register("wait_cp_control", WaitCpControlConfig, forms_batches=True, reads_workload=True)
def make_control(cfg: WaitCpControlConfig, ctx: PolicyContext) -> WaitCpControl:
    consts, _ = _constants(cfg, ctx)
    rules = [BudgetCapRule(c.batch_est, int(cfg.tl)) for c in consts]
    return WaitCpControl(rules, "Sarathi-like control, budget=batch_est, seq cap=tl; " + _note(consts[0], cfg.tl, cfg.cs))
