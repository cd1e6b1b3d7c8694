"""Workloads: conversations sampled from a trace (or generated) with a seed, and their arrival times.

Kinds (``kind``):
  * ``trace``: conversations sampled from the trace file ``trace`` (below);
  * ``synthetic``: ``num_conversations`` single-turn conversations, each of one of the ``prompt_types``
    (``input_tokens`` in, ``output_tokens`` out, drawn with probability proportional to ``weight``) --
    the WAIT paper's setting. The one turn is the visible one (TTFET = its TTFT), there is no tool time
    and no prefix reuse; ids are ``syn<index>-t<type>``. The trace file is not read.

Arrival processes (``arrival``):
  * ``trace``: open loop, from the trace's own timestamps (request traces: ``ConversationRecord
    .arrival_s``), divided by ``time_scale`` (a speed-up factor) after keeping the conversations that
    arrive in the window ``[window_start_s, window_start_s + window_duration_s)`` of trace time and
    shifting that window to start at t = 0; conversations keep the trace's order (``sample`` must be
    ``first``) and ``num_conversations`` keeps the first n of the window. Later turns of a session
    still follow closed loop (previous turn's finish + its ``tool_time_s``, the trace's ``delay``);
  * ``poisson``: exponential inter-arrival gaps with mean ``1 / rate_per_s``;
  * ``gamma``: Gamma gaps with mean ``1 / rate_per_s`` and coefficient of variation ``burstiness``
    (shape ``k = 1 / burstiness**2``, scale ``1 / (rate_per_s * k)``; burstiness 1 is Poisson, > 1
    burstier);
  * ``normalize_span`` (``poisson``, ``gamma``; no ramp): the drawn arrival times are scaled by one factor
    so the last of the n arrivals is at exactly ``(n - 1) / rate_per_s`` (the first stays at t = 0): the
    offered rate is then exactly ``rate_per_s`` whatever the seed, as ``vllm bench serve`` scales its
    delays so its last request is sent at ``n / request_rate`` (``vllm/benchmarks/serve.py``,
    ``normalize_factor``; its first request is itself delayed by one gap); the gaps' shape is kept;
  * ``fixed``: every conversation arrives at t = 0 (a closed batch);
  * ``constant``: gaps of exactly ``1 / rate_per_s`` (AIPerf's constant request rate; vLLM's
    ``--burstiness inf``);
  * ``closed``: a closed population of ``concurrency`` agents: ``concurrency`` conversations start at
    t = 0 and each starts the next one (in sampling order) when one of its own ends, until the sampled
    conversations run out (AIPerf's concurrency mode; the harness's natural "N agents at work").
Load shapes on top (run-time, in ``harness.core.controller``; the same on every backend):
  * ``max_concurrency``: at most this many conversations active at once; one that arrives while the cap
    is reached waits (client-side, FIFO) and starts when one ends -- its ``arrival_s`` is when it starts,
    and the wait is reported (``client_wait_mean_s``), as ``vllm bench serve --max-concurrency`` reports
    its client queue apart from TTFT;
  * ``ramp`` (``linear`` | ``exponential``; ``poisson``, ``gamma``, ``constant``): conversation i of n
    arrives at rate ``r_i = start + (end - start) * i / (n - 1)`` or ``start * (end / start) ** (i / (n -
    1))`` with ``start = ramp_start_rate_per_s``, ``end = rate_per_s`` (vLLM's ``--ramp-up-strategy``
    rule, ``vllm/benchmarks/serve.py`` ``_get_current_request_rate``); gap i is drawn at ``r_i``;
  * ``duration_s``: the run stops at this time: no conversation starts and no turn is submitted after
    it; turns already on the backend finish; conversations still running are *stopped* (kept, counted
    in ``num_conversations_stopped``, never completed) and those not started are counted in
    ``num_conversations_not_started`` (and left out of the conversation table).
Timing (``timing``, session traces with ``send_s``; ``harness.core.controller``): ``think`` (default: a
conversation's call k+1 is sent ``tool_time_s`` after call k's response ended, the closed loop) or
``original`` (each call at its recorded send time from the session's start, or when the previous call
ended if later). ``max_idle_gap_s`` caps every recorded gap between a response and the next call (AgentX
caps at 10 s): ``tool_time_s = min(tool_time_s, cap)``, and under ``original`` every later recorded send
time of the conversation (and of the children spawned after that point) moves earlier by the excess.
Session traces with sub-agents (``ConversationRecord.parent_id``): sampling, ``num_conversations`` and the
arrivals count *root* sessions; each sampled root brings its children (placed after it, at its arrival:
the controller spawns them), and a family is kept, truncated or dropped as one by ``context_overflow``.
Sampling (``sample``): ``shuffle`` (a seeded permutation of the trace, then the first
``num_conversations``), ``first`` (the trace's order), ``with_replacement`` (ids get ``#k`` suffixes).
Randomness comes from ``numpy.random.default_rng([seed, stream])`` with a fixed stream per purpose,
so the same seed gives the same workload whatever else changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Dict, Optional, Sequence

from harness import LazyModule

from harness.core.policy import TurnTruth
from harness.core.trace import TIMINGS, ConversationRecord, TurnRecord

np = LazyModule("numpy", globals(), "np")   # imported on first use (a config error, --help: never), then bound here

_STREAM_SAMPLE, _STREAM_ARRIVAL, _STREAM_SYNTHETIC = 1, 2, 3
KINDS = ("trace", "synthetic")
ARRIVALS = ("poisson", "gamma", "fixed", "trace", "constant", "closed")
RAMPS = ("linear", "exponential")


@dataclass
class PromptTypeConfig:
    """One prompt type of a synthetic workload: ``input_tokens`` and ``output_tokens`` per call (ints >= 1) and a
    relative ``weight`` (> 0).

    turns: LLM calls per conversation (int >= 1; 1: single-turn). With more, every call has a prompt of
    ``input_tokens``, and each call after the first reuses ``round(cached_fraction * input_tokens)`` tokens
    of the previous call's context (prompt + output) as its prefix (a prefix-caching engine can serve
    them from the KV cache; cached_fraction in [0, 0.95], only with ``turns > 1``) and appends the rest as
    new input; ``tool_time_s`` (s, >= 0) passes between a call's last token and the next call.
    """

    input_tokens: int = 512
    output_tokens: int = 20
    weight: float = 1.0
    turns: int = 1
    cached_fraction: float = 0.0
    tool_time_s: float = 0.0


@dataclass
class WorkloadConfig:
    """Hydra schema of the ``workload`` group.

    name: the workload's name (informational: the option of the ``workload`` group it came from).
    kind: ``trace`` | ``synthetic`` (module docstring).
    prompt_types: the synthetic workload's prompt types (``kind=synthetic`` only), a list of
        ``{input_tokens, output_tokens, weight}``.
    trace: path of a trace file (relative paths are relative to the project root).
    num_conversations: how many conversations (``None``: the whole trace).
    sample: ``shuffle`` | ``first`` | ``with_replacement``.
    arrival: ``poisson`` | ``gamma`` | ``fixed`` | ``trace`` (module docstring). rate_per_s: conversations/s
        (> 0 unless fixed or trace).
    burstiness: coefficient of variation of Gamma gaps (> 0). seed: workload seed.
    max_turns: keep at most this many turns per conversation (``None``: all; the last kept turn
        becomes the visible one).
    token_scale: multiply every turn's new-input and output tokens by this factor (> 0; 1 = as
        recorded), e.g. to fit long agent contexts into a small test model (``scale_tokens``).
    shared_prefix_tokens: tokens at the start of every conversation's first prompt that all
        conversations share (a common system prompt), cached once and hit across conversations
        (``harness.workload.prefix``; tokens, >= 0; 0 = only each conversation's own prefix is reused).
        Request traces state their sharing through ``hash_ids`` instead.
    time_scale: ``arrival=trace`` only: speed-up of the trace's timestamps (> 0; 2 = twice the
        request rate). window_start_s, window_duration_s: ``arrival=trace`` only: the slice of trace
        time replayed (s, before scaling; duration ``None``: to the end).
    context_overflow: what happens to a conversation with a turn whose prompt + output exceed the served
        model's context (``model.max_model_len``, and a real server's ``--max-model-len``): ``drop`` it
        before the run (the default), ``truncate`` it before that turn (the last kept turn becomes the
        visible one; dropped if no turn fits), or ``fail`` that turn at run time, as a server rejects it
        (its conversation fails). The counts are in ``summary.json`` and the printed table.
    concurrency: ``arrival=closed`` only: the agents (int >= 1). max_concurrency: a cap on the active
        conversations over any arrival (int >= 1 or None). ramp: None | ``linear`` | ``exponential``;
        ramp_start_rate_per_s: its first rate (conversations/s, > 0). duration_s: stop time (s, > 0, or
        None: run to the end). normalize_span: scale poisson/gamma arrival times so the last is at
        ``(n - 1) / rate_per_s`` (vLLM bench's practice; bool). All in the module docstring.
    arrivals_from_run: a run directory (None: off): every turn arrives when the same turn arrived in that
        run (its ``turns.parquet`` ``submit_s``, s), the arrival process above and the concurrency gate
        replaced (``harness.workload.replay``): a simulated replay of a real run, like for like.
    timing: ``think`` | ``original``; max_idle_gap_s: cap on recorded gaps (s, > 0, or None). Module docstring.
    model_map: ``{pattern: instance group name}``; empty (the default): one served model, every call on every
        instance: a session trace's call whose recorded model matches the glob ``pattern`` (first match in
        order) is served by the ``cluster.instances`` groups of that ``name``; unmatched calls by the unnamed
        groups (``harness.core.routing``; checked against the cluster in ``harness.run.config.resolve``).
    """

    name: str = "swebench"
    kind: str = "trace"
    prompt_types: list[PromptTypeConfig] = field(default_factory=list)
    trace: str = "traces/swebench_verified_mini_gemini3pro.jsonl.gz"
    num_conversations: Optional[int] = None
    sample: str = "shuffle"
    arrival: str = "poisson"
    rate_per_s: float = 0.05
    burstiness: float = 1.0
    seed: int = 0
    max_turns: Optional[int] = None
    token_scale: float = 1.0
    shared_prefix_tokens: int = 0
    time_scale: float = 1.0
    window_start_s: float = 0.0
    window_duration_s: Optional[float] = None
    context_overflow: str = "drop"
    concurrency: Optional[int] = None
    max_concurrency: Optional[int] = None
    ramp: Optional[str] = None
    ramp_start_rate_per_s: Optional[float] = None
    duration_s: Optional[float] = None
    normalize_span: bool = False
    arrivals_from_run: Optional[str] = None
    timing: str = "think"
    max_idle_gap_s: Optional[float] = None
    model_map: Dict[str, str] = field(default_factory=dict)

    def max_active(self) -> Optional[int]:
        """The run-time cap on active conversations: ``concurrency`` (closed) or ``max_concurrency``; None with
        ``arrivals_from_run`` (the recorded arrival times already carry the recorded run's cap)."""
        if self.arrivals_from_run:
            return None
        return self.concurrency if self.arrival == "closed" else self.max_concurrency

    def effective_shared_prefix_tokens(self) -> int:
        """``shared_prefix_tokens`` x ``token_scale``, rounded (tokens): the common system prompt of the
        (scaled) conversations the run replays."""
        return round(self.shared_prefix_tokens * self.token_scale)

    def validate(self, where: str = "workload") -> None:
        """Raise ``ValueError`` naming ``workload.<field>`` for the first invalid value."""
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"{where}.seed must be an integer >= 0 (numpy's seed sequences take no negative "
                             f"entropy; it defaults to the run's `seed`), got {self.seed!r}")
        if self.kind not in KINDS:
            raise ValueError(f"{where}.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "synthetic":
            if self.num_conversations is None:
                raise ValueError(f"{where}.num_conversations must be set (an int >= 1) when {where}.kind=synthetic")
            if not self.prompt_types:
                raise ValueError(f"{where}.prompt_types must list at least one "
                                 f"{{input_tokens, output_tokens, weight}} when {where}.kind=synthetic")
            for i, pt in enumerate(self.prompt_types):
                for key in ("input_tokens", "output_tokens"):
                    v = getattr(pt, key)
                    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                        raise ValueError(f"{where}.prompt_types[{i}].{key} must be an int >= 1 (tokens), got {v!r}")
                w = pt.weight
                if isinstance(w, bool) or not isinstance(w, (int, float)) or not (math.isfinite(w) and w > 0):
                    raise ValueError(f"{where}.prompt_types[{i}].weight must be a finite number > 0, got {w!r}")
                t = pt.turns
                if isinstance(t, bool) or not isinstance(t, int) or t < 1:
                    raise ValueError(f"{where}.prompt_types[{i}].turns must be an int >= 1, got {t!r}")
                f = pt.cached_fraction
                if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 0.95:
                    raise ValueError(f"{where}.prompt_types[{i}].cached_fraction must be in [0, 0.95], got {f!r}")
                if f > 0 and t == 1:
                    raise ValueError(f"{where}.prompt_types[{i}].cached_fraction={f} needs turns > 1 (a single call "
                                     f"has no previous context to reuse)")
                tt = pt.tool_time_s
                if isinstance(tt, bool) or not isinstance(tt, (int, float)) or not (math.isfinite(tt) and tt >= 0):
                    raise ValueError(f"{where}.prompt_types[{i}].tool_time_s must be a finite number >= 0 (s), "
                                     f"got {tt!r}")
        elif self.prompt_types:
            raise ValueError(f"{where}.prompt_types is only used with {where}.kind=synthetic (kind is {self.kind!r})")
        if self.timing not in TIMINGS:
            raise ValueError(f"{where}.timing must be one of {', '.join(TIMINGS)}, got {self.timing!r}")
        g = self.max_idle_gap_s
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not (math.isfinite(g) and g > 0)):
            raise ValueError(f"{where}.max_idle_gap_s must be a finite number > 0 (s) or null, got {g!r}")
        if self.model_map:
            for pat, group in dict(self.model_map).items():
                if not isinstance(group, str) or not group:
                    raise ValueError(f"{where}.model_map[{pat!r}] must name an instance group (a non-empty string), "
                                     f"got {group!r}")
        if self.context_overflow not in CONTEXT_OVERFLOW:
            raise ValueError(f"{where}.context_overflow must be one of {', '.join(CONTEXT_OVERFLOW)}, "
                             f"got {self.context_overflow!r}")
        if self.sample not in ("shuffle", "first", "with_replacement"):
            raise ValueError(f"{where}.sample must be one of shuffle, first, with_replacement, got {self.sample!r}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"{where}.arrival must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}")
        if self.arrival == "trace":
            if self.kind != "trace":
                raise ValueError(f"{where}.arrival=trace needs {where}.kind=trace (timestamps come from the trace)")
            if self.sample != "first":
                raise ValueError(f"{where}.sample must be 'first' with {where}.arrival=trace (the trace's "
                                 f"timestamps fix the order), got {self.sample!r}")
        for key in ("time_scale",):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"{where}.{key} must be a finite number > 0, got {v!r}")
        v = self.window_start_s
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{where}.window_start_s must be a finite number >= 0 (s), got {v!r}")
        v = self.window_duration_s
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0)):
            raise ValueError(f"{where}.window_duration_s must be a finite number > 0 (s) or null, got {v!r}")
        if self.arrival != "trace" and (self.time_scale != 1.0 or self.window_start_s != 0.0
                                        or self.window_duration_s is not None):
            raise ValueError(f"{where}.time_scale, window_start_s and window_duration_s apply only to "
                             f"{where}.arrival=trace (arrival is {self.arrival!r})")
        v = self.shared_prefix_tokens
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{where}.shared_prefix_tokens must be an int >= 0 (tokens), got {v!r}")
        self._validate_load_shape(where)
        if self.arrival not in ("fixed", "trace", "closed") and not (isinstance(self.rate_per_s, (int, float))
                                            and math.isfinite(self.rate_per_s) and self.rate_per_s > 0):
            raise ValueError(f"{where}.rate_per_s must be a finite number > 0 (conversations/s), "
                             f"got {self.rate_per_s!r}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError(f"{where}.burstiness must be a finite number > 0, got {self.burstiness!r}")
        if self.num_conversations is not None and self.num_conversations < 1:
            raise ValueError(f"{where}.num_conversations must be >= 1 or null, got {self.num_conversations!r}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"{where}.max_turns must be >= 1 or null, got {self.max_turns!r}")
        if not (isinstance(self.token_scale, (int, float)) and 0 < self.token_scale and math.isfinite(self.token_scale)):
            raise ValueError(f"{where}.token_scale must be a finite number > 0, got {self.token_scale!r}")


    def _validate_load_shape(self, where: str) -> None:
        """The load-shape keys (module docstring); raises ``ValueError`` naming the key."""
        def count(key):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{where}.{key} must be an int >= 1 or null, got {v!r}")
            return v
        conc, cap = count("concurrency"), count("max_concurrency")
        if self.arrival == "closed":
            if conc is None:
                raise ValueError(f"{where}.arrival=closed needs {where}.concurrency (the number of agents, >= 1)")
            if cap is not None:
                raise ValueError(f"{where}.max_concurrency does not apply to {where}.arrival=closed "
                                 f"({where}.concurrency is the population)")
        elif conc is not None:
            raise ValueError(f"{where}.concurrency applies only to {where}.arrival=closed (arrival is "
                             f"{self.arrival!r}; a cap on another arrival is {where}.max_concurrency)")
        if self.ramp is not None:
            if self.ramp not in RAMPS:
                raise ValueError(f"{where}.ramp must be null, linear or exponential, got {self.ramp!r}")
            if self.arrival not in ("poisson", "gamma", "constant"):
                raise ValueError(f"{where}.ramp needs {where}.arrival poisson, gamma or constant "
                                 f"(arrival is {self.arrival!r})")
            r0 = self.ramp_start_rate_per_s
            if isinstance(r0, bool) or not isinstance(r0, (int, float)) or not (math.isfinite(r0) and r0 > 0):
                raise ValueError(f"{where}.ramp_start_rate_per_s must be a finite number > 0 (conversations/s) "
                                 f"with {where}.ramp, got {r0!r}")
        elif self.ramp_start_rate_per_s is not None:
            raise ValueError(f"{where}.ramp_start_rate_per_s needs {where}.ramp (linear or exponential)")
        if self.normalize_span and (self.arrival not in ("poisson", "gamma") or self.ramp is not None):
            raise ValueError(f"{where}.normalize_span applies to {where}.arrival poisson or gamma without a ramp "
                             f"(arrival is {self.arrival!r}, ramp {self.ramp!r})")
        d = self.duration_s
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, float)) or not (math.isfinite(d) and d > 0)):
            raise ValueError(f"{where}.duration_s must be a finite number > 0 (s) or null, got {d!r}")


def arrival_rates(cfg: "WorkloadConfig", n: int) -> np.ndarray:
    """Per-conversation arrival rate, conversations/s, shape ``(n,)``: ``rate_per_s``, or under ``ramp``
    vLLM's ramp rule (module docstring)."""
    if cfg.ramp is None:
        return np.full(n, float(cfg.rate_per_s))
    progress = np.arange(n) / max(n - 1, 1)
    r0, r1 = float(cfg.ramp_start_rate_per_s), float(cfg.rate_per_s)
    return r0 + (r1 - r0) * progress if cfg.ramp == "linear" else r0 * (r1 / r0) ** progress


@dataclass(frozen=True)
class WorkloadStats:
    """Aggregate statistics of a workload, for planners (fluid model, admission).

    rate_per_s: conversation arrival rate (conversations/s; ``inf`` for fixed arrivals);
    mean_turns: turns per conversation; turn_prompt_tokens, turn_new_tokens, turn_output_tokens,
    tool_time_s: per-turn arrays (tokens, s), one entry per turn of the workload.
    """

    rate_per_s: float
    mean_turns: float
    turn_prompt_tokens: np.ndarray = field(repr=False)
    turn_new_tokens: np.ndarray = field(repr=False)
    turn_output_tokens: np.ndarray = field(repr=False)
    tool_time_s: np.ndarray = field(repr=False)
    context_dropped: int = 0
    context_truncated: int = 0


class Oracle:
    """The workload's ground truth per turn, for a policy's :class:`harness.core.policy.Predictor` (which
    injects the configured error) and for the recorder (which turns are user-visible).

    Callable as ``oracle(conversation_id, turn) -> TurnTruth``: the turn's true output tokens, the tool
    time after it (s), the turns after it, and the KV growth still to come after it (new input +
    output tokens of the later turns).
    """

    def __init__(self, conversations: Sequence[tuple[float, ConversationRecord]]):
        self._by_id: dict[str, tuple[ConversationRecord, tuple[int, ...]]] = {}
        self._messages: dict[str, tuple[int, ...]] = {}
        for _, rec in conversations:
            growth, acc = [], 0
            for tr in reversed(rec.turns):
                growth.append(acc)
                acc += tr.new_input_tokens + tr.output_tokens
            self._by_id[rec.conversation_id] = (rec, tuple(reversed(growth)))

    def __call__(self, conversation_id: str, turn: int) -> TurnTruth:
        rec, growth = self._by_id[conversation_id]
        tr = rec.turns[turn]
        return TurnTruth(tr.output_tokens, tr.tool_time_s, len(rec.turns) - 1 - turn, growth[turn])

    def visible(self, conversation_id: str, turn: int) -> bool:
        """Whether the turn's output is user-visible (from the trace)."""
        return self._by_id[conversation_id][0].turns[turn].visible

    def info(self, conversation_id: str, turn: int) -> tuple[str, int]:
        """``(parent_id or "", user-message index)`` of a turn (``turns.parquet``'s ``parent_id``, ``message``)."""
        rec = self._by_id[conversation_id][0]
        msgs = self._messages.get(conversation_id)
        if msgs is None:
            msgs = self._messages[conversation_id] = rec.message_of()
        return rec.parent_id or "", msgs[turn]


CONTEXT_OVERFLOW = ("drop", "truncate", "fail")


def fits_context(rec: ConversationRecord, max_context_tokens: int) -> int:
    """How many leading turns of ``rec`` fit a context of ``max_context_tokens`` tokens (prompt + output of
    each turn; its KV must hold both)."""
    for k, t in enumerate(rec.turns):
        if t.prompt_tokens + t.output_tokens > max_context_tokens:
            return k
    return len(rec.turns)


def truncate_turns(rec: ConversationRecord, max_turns: int) -> ConversationRecord:
    """Keep the first ``max_turns`` turns; the last kept turn becomes the (only) visible one, with no
    tool time after it. A session trace (turns with ``user_message``) keeps the visible turns of its
    earlier messages (each message has its own TTFET); the last kept turn is visible too."""
    if len(rec.turns) <= max_turns:
        return rec
    turns = list(rec.turns[:max_turns])
    if any(t.user_message for t in rec.turns[1:]):
        turns = turns[:-1] + [replace(turns[-1], visible=True, tool_time_s=0.0)]
    else:
        turns = [replace(t, visible=False) for t in turns[:-1]] + [replace(turns[-1], visible=True, tool_time_s=0.0)]
    return replace(rec, turns=tuple(turns))


def cap_idle_gaps(records: Sequence[ConversationRecord], cap_s: float) -> list[ConversationRecord]:
    """``workload.max_idle_gap_s``: every ``tool_time_s`` capped at ``cap_s`` (s), and the recorded send
    times (``send_s``) of each conversation moved earlier by the excess removed before them; a child also by
    its parent's excess up to its spawn point. ``records``: parents before their children (a trace's order)."""
    shift_at: dict[str, list[float]] = {}     # conversation -> cumulative excess removed before each turn, s
    out = []
    for rec in records:
        base = 0.0
        if rec.parent_id is not None and rec.parent_id in shift_at:
            base = shift_at[rec.parent_id][min(rec.spawn_after_turn + 1, len(shift_at[rec.parent_id]) - 1)]
        cum, shifts, turns = base, [], []
        for k, t in enumerate(rec.turns):
            if k:
                cum += max(0.0, rec.turns[k - 1].tool_time_s - cap_s)
            shifts.append(cum)
            turns.append(replace(t, tool_time_s=min(t.tool_time_s, cap_s),
                                 send_s=None if t.send_s is None else max(0.0, t.send_s - cum)))
        shift_at[rec.conversation_id] = shifts
        out.append(replace(rec, turns=tuple(turns)))
    return out


def _families(records: Sequence[ConversationRecord]) -> tuple[list[ConversationRecord], dict[str, list]]:
    """Roots in order, and per conversation id its children in order (session traces)."""
    kids: dict[str, list] = {}
    roots = []
    for r in records:
        if r.parent_id is None:
            roots.append(r)
        else:
            kids.setdefault(r.parent_id, []).append(r)
    return roots, kids


def _family(root: ConversationRecord, kids: dict[str, list]) -> list[ConversationRecord]:
    out, stack = [], [root]
    while stack:
        r = stack.pop(0)
        out.append(r)
        stack[:0] = kids.get(r.conversation_id, [])
    return out


def _fit_family(fam: list[ConversationRecord], max_context_tokens: int, truncate: bool) -> Optional[list]:
    """A family under the context limit: unchanged when every call fits; else with ``truncate`` the root cut
    before its first call that does not fit (children spawned at or after the cut, or that do not fit
    themselves, dropped with their own children); None when dropped."""
    if all(fits_context(r, max_context_tokens) == len(r.turns) for r in fam):
        return fam
    if not truncate:
        return None
    root = fam[0]
    k = fits_context(root, max_context_tokens)
    if k == 0:
        return None
    kept = [truncate_turns(root, k)]
    alive = {root.conversation_id: k}
    for r in fam[1:]:
        n = alive.get(r.parent_id)
        if n is None or r.spawn_after_turn > n - 2 or fits_context(r, max_context_tokens) < len(r.turns):
            continue
        kept.append(r)
        alive[r.conversation_id] = len(r.turns)
    return kept


def scale_tokens(rec: ConversationRecord, factor: float) -> ConversationRecord:
    """Scale new-input and output tokens by ``factor`` (each >= 1 token), keeping the prefix structure:
    a turn that reused its whole previous context still does; a partial reuse is scaled and capped at
    the (scaled) previous context; a request trace's ``hash_block_tokens`` is scaled too (>= 1), so
    equal ``hash_ids`` still mean equal (scaled) blocks. Tool times are unchanged."""
    if factor == 1.0:
        return rec
    turns = []
    prev_ctx = prev_ctx_scaled = 0
    for k, t in enumerate(rec.turns):
        new = max(1, round(t.new_input_tokens * factor))
        out = max(1, round(t.output_tokens * factor))
        if k == 0:
            reused = 0
        elif t.reused_tokens == prev_ctx:
            reused = prev_ctx_scaled
        else:
            reused = min(round(t.reused_tokens * factor), prev_ctx_scaled)
        prev_ctx, prev_ctx_scaled = t.prompt_tokens + t.output_tokens, reused + new + out
        turns.append(replace(t, new_input_tokens=new, reused_tokens=reused, output_tokens=out,
                             output_tokens_raw=max(out, round(t.output_tokens_raw * factor))))
    block = max(1, round(rec.hash_block_tokens * factor)) if rec.hash_block_tokens else 0
    return replace(rec, turns=tuple(turns), hash_block_tokens=block)


def synthetic_conversations(cfg: WorkloadConfig) -> list[ConversationRecord]:
    """``cfg.num_conversations`` conversations whose types are drawn with ``cfg.seed`` (stream
    ``_STREAM_SYNTHETIC``) in proportion to the prompt types' weights; single-turn, or ``turns`` calls of
    ``input_tokens`` each with ``cached_fraction`` of every later prompt reused (``PromptTypeConfig``)."""
    w = np.array([float(pt.weight) for pt in cfg.prompt_types])
    kinds = np.random.default_rng([cfg.seed, _STREAM_SYNTHETIC]).choice(len(w), size=cfg.num_conversations,
                                                                         p=w / w.sum())
    width = max(5, len(str(cfg.num_conversations - 1)))
    out = []
    for i, j in enumerate(kinds):
        pt = cfg.prompt_types[int(j)]
        n_in, n_out, k = int(pt.input_tokens), int(pt.output_tokens), int(getattr(pt, "turns", 1))
        reuse = min(round(float(getattr(pt, "cached_fraction", 0.0)) * n_in), n_in - 1)   # >= 1 new token a call
        turns = []
        for t in range(k):
            r = 0 if t == 0 else reuse          # <= input_tokens - 1 < the previous context (prompt + output)
            turns.append(TurnRecord(new_input_tokens=n_in - r, reused_tokens=r, output_tokens=n_out,
                                    tool_time_s=float(getattr(pt, "tool_time_s", 0.0)) if t < k - 1 else 0.0,
                                    visible=t == k - 1, output_tokens_raw=n_out))
        out.append(ConversationRecord(f"syn{i:0{width}d}-t{int(j)}", tuple(turns), "synthetic"))
    return out


def _trace_window(records: Sequence[ConversationRecord], cfg: WorkloadConfig
                  ) -> tuple[list[ConversationRecord], np.ndarray]:
    """The conversations arriving in the configured window of trace time, by arrival time (ties: file
    order), and their arrival times (s) shifted to the window's start and divided by ``time_scale``.

    Raises:
        ValueError: a conversation has no timestamp, or none arrives in the window.
    """
    missing = [r.conversation_id for r in records if r.arrival_s is None]
    if missing:
        raise ValueError(f"workload.arrival=trace needs timestamps, but conversation {missing[0]!r} (and "
                         f"{len(missing) - 1} more) has none (a conversation trace has no timestamps: use "
                         f"poisson, gamma or fixed)")
    start = cfg.window_start_s
    end = math.inf if cfg.window_duration_s is None else start + cfg.window_duration_s
    order = sorted(range(len(records)), key=lambda i: records[i].arrival_s)
    chosen = [records[i] for i in order if start <= records[i].arrival_s < end]
    if not chosen:
        raise ValueError(f"workload.window_start_s={start}, window_duration_s={cfg.window_duration_s}: no "
                         f"conversation arrives in that window (trace time "
                         f"{records[order[0]].arrival_s:.3f}-{records[order[-1]].arrival_s:.3f} s)")
    times = (np.array([r.arrival_s for r in chosen]) - start) / cfg.time_scale
    return chosen, times


def build_workload(records: Sequence[ConversationRecord], cfg: WorkloadConfig,
                   max_context_tokens: Optional[int] = None
                   ) -> tuple[list[tuple[float, ConversationRecord]], WorkloadStats]:
    """Sample conversations (``kind=trace``: from ``records``; ``kind=synthetic``: generated, ``records``
    unused), apply the served model's context limit (``max_context_tokens``, tokens; ``None``: none) by
    ``cfg.context_overflow``, and draw arrival times.

    Returns:
        ``[(arrival_s, record), ...]`` sorted by arrival time (ties keep sampling order), and stats.
    Raises:
        ValueError: invalid config, ``num_conversations`` > trace size without replacement, or
            ``context_overflow=drop``/``truncate`` left no conversation (the message names
            ``workload.token_scale`` and ``workload.context_overflow``).
    """
    cfg.validate()
    kids: dict[str, list] = {}
    if any(r.parent_id is not None for r in records):
        records, kids = _families(records)
    trace_times = None
    if cfg.arrival == "trace":
        records, trace_times = _trace_window(records, cfg)
    n = len(records) if cfg.num_conversations is None else cfg.num_conversations
    rng_s = np.random.default_rng([cfg.seed, _STREAM_SAMPLE])
    if cfg.kind == "synthetic":
        chosen = synthetic_conversations(cfg)
    elif cfg.sample == "with_replacement":
        idx = rng_s.integers(0, len(records), size=n)
        seen: dict[str, int] = {}
        chosen = []
        for i in idx:
            r = records[int(i)]
            k = seen.get(r.conversation_id, 0)
            seen[r.conversation_id] = k + 1
            chosen.append(r if k == 0 else replace(r, conversation_id=f"{r.conversation_id}#{k}"))
    else:
        if n > len(records):
            raise ValueError(f"workload.num_conversations={n} exceeds the trace's {len(records)} "
                             f"conversations (use workload.sample=with_replacement)")
        order = rng_s.permutation(len(records)) if cfg.sample == "shuffle" else np.arange(len(records))
        chosen = [records[int(i)] for i in order[:n]]
    if kids:
        chosen = _with_children(chosen, kids, cfg)
    if cfg.max_turns is not None:
        chosen = [truncate_turns(r, cfg.max_turns) for r in chosen]
        if kids:   # a child spawned at or after a parent's (new) last turn has nothing to join
            chosen = _drop_orphans(chosen)
    if cfg.token_scale != 1.0:
        chosen = [scale_tokens(r, cfg.token_scale) for r in chosen]
    if cfg.max_idle_gap_s is not None:
        chosen = cap_idle_gaps(chosen, float(cfg.max_idle_gap_s))
    dropped = truncated = 0
    keep = list(range(len(chosen)))
    if max_context_tokens and cfg.context_overflow != "fail" and kids:
        fams: list[list] = []
        for r in chosen:
            if r.parent_id is None:
                fams.append([r])
            else:
                fams[-1].append(r)
        kept_f = []
        for i, fam in enumerate(fams):
            f = _fit_family(fam, max_context_tokens, cfg.context_overflow == "truncate")
            if f is None:
                dropped += 1
            else:
                truncated += f is not fam
                kept_f.append((i, f))
        keep = [i for i, _ in kept_f]
        chosen = [r for _, f in kept_f for r in f]
        n = len(keep)
        if n == 0:
            raise ValueError(
                f"workload.context_overflow={cfg.context_overflow} dropped all {dropped} sessions: each "
                f"needs more than the model's {max_context_tokens}-token context (workload.token_scale="
                f"{cfg.token_scale:g}); lower workload.token_scale, set workload.context_overflow=truncate, "
                f"or choose a model with a longer context")
    elif max_context_tokens and cfg.context_overflow != "fail":
        kept = []
        for i, r in enumerate(chosen):
            k = fits_context(r, max_context_tokens)
            if k == len(r.turns):
                kept.append((i, r))
            elif k > 0 and cfg.context_overflow == "truncate":
                kept.append((i, truncate_turns(r, k)))
                truncated += 1
            else:
                dropped += 1
        keep, chosen = [i for i, _ in kept], [r for _, r in kept]
        n = len(chosen)
        if n == 0:
            raise ValueError(
                f"workload.context_overflow={cfg.context_overflow} dropped all {dropped} conversations: each "
                f"needs more than the model's {max_context_tokens}-token context (workload.token_scale="
                f"{cfg.token_scale:g}); lower workload.token_scale, set workload.context_overflow=truncate, "
                f"or choose a model with a longer context")
    rng_a = np.random.default_rng([cfg.seed, _STREAM_ARRIVAL])
    if trace_times is not None:
        times = np.asarray(trace_times)[keep]
        span = float(times[-1] - times[0]) if n > 1 else 0.0
        rate = (n - 1) / span if span > 0 else math.inf
    elif cfg.arrival in ("fixed", "closed"):  # closed: every agent's first conversation at 0, the rest at run time
        times = np.zeros(n)
        rate = math.inf
    elif cfg.arrival == "constant" or cfg.ramp is not None:
        rates = arrival_rates(cfg, n)
        if cfg.arrival == "constant":
            gaps = 1.0 / rates
        elif cfg.arrival == "poisson":
            gaps = rng_a.standard_exponential(size=n) / rates
        else:
            k = 1.0 / cfg.burstiness ** 2
            gaps = rng_a.gamma(k, 1.0, size=n) / (rates * k)
        gaps[0] = 0.0
        times = np.cumsum(gaps)
        rate = cfg.rate_per_s
    else:
        if cfg.arrival == "poisson":
            gaps = rng_a.exponential(1.0 / cfg.rate_per_s, size=n)
        else:
            k = 1.0 / cfg.burstiness ** 2
            gaps = rng_a.gamma(k, 1.0 / (cfg.rate_per_s * k), size=n)
        gaps[0] = 0.0  # the first conversation arrives at t = 0
        times = np.cumsum(gaps)
        if cfg.normalize_span and n > 1 and times[-1] > 0:  # the last at exactly (n - 1) / rate (module doc)
            times = times * ((n - 1) / cfg.rate_per_s / times[-1])
        rate = cfg.rate_per_s
    if kids:   # the roots' arrival times; each child placed after its root, at the root's arrival (a placeholder:
        #        the controller spawns it when its parent's spawn turn ends)
        pairs, it = [], iter(times)
        for r in chosen:
            if r.parent_id is None:
                t_root = float(next(it))
            pairs.append((t_root, r))
        out = sorted(pairs, key=lambda p: p[0])   # stable: a family stays together, root first
    turns = [t for r in chosen for t in r.turns]
    stats = WorkloadStats(
        rate_per_s=rate, mean_turns=len(turns) / max(1, n),
        turn_prompt_tokens=np.array([t.prompt_tokens for t in turns], dtype=np.int64),
        turn_new_tokens=np.array([t.new_input_tokens for t in turns], dtype=np.int64),
        turn_output_tokens=np.array([t.output_tokens for t in turns], dtype=np.int64),
        tool_time_s=np.array([t.tool_time_s for t in turns], dtype=np.float64),
        context_dropped=dropped, context_truncated=truncated)
    if kids:
        out = list(out)
    else:
        out = [(float(t), r) for t, r in zip(times, chosen)]
    if cfg.arrivals_from_run:   # each conversation arrives when the recorded run started it (harness.workload.replay)
        from harness.workload.replay import pin_conversations
        out = pin_conversations(out, cfg.arrivals_from_run)
    return out, stats


def _with_children(roots: Sequence[ConversationRecord], kids: dict[str, list], cfg: WorkloadConfig
                   ) -> list[ConversationRecord]:
    """Each sampled root followed by its family; ids renamed with the root's ``#k`` suffix (sampling with
    replacement) so every copy's children name their own parent."""
    out = []
    for r in roots:
        base, _, suffix = r.conversation_id.partition("#")
        fam = _family(replace(r, conversation_id=base), kids)
        if suffix:
            ren = {x.conversation_id: f"{x.conversation_id}#{suffix}" for x in fam}
            fam = [replace(x, conversation_id=ren[x.conversation_id],
                           parent_id=None if x.parent_id is None else ren[x.parent_id]) for x in fam]
        out.extend(fam)
    return out


def _drop_orphans(records: Sequence[ConversationRecord]) -> list[ConversationRecord]:
    """Children whose parent is gone or has no turn after the spawn point are dropped (with their own)."""
    n_turns: dict[str, int] = {}
    out = []
    for r in records:
        if r.parent_id is not None:
            n = n_turns.get(r.parent_id)
            if n is None or r.spawn_after_turn > n - 2:
                continue
        n_turns[r.conversation_id] = len(r.turns)
        out.append(r)
    return out
