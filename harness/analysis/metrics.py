"""Metrics: per-turn and per-conversation tables, SLO attainment, goodput, energy, the summary.

Definitions (docs/metrics.md):
  * TTFT = first output token - submission (turn ready); TPOT = (last - first token) / (output - 1)
    (NaN for 1-token outputs); E2E = last token - submission; queue = admission - submission; ITL =
    the gaps between a turn's successive tokens (per turn: p50, p99, max in ``turns.parquet``).
  * TTFET = first token of one turn - conversation arrival. Two readings are always reported
    (the ConServe abstract, arXiv 2606.01839, calls TTFET "the latency of a conversation's first
    user-visible output"; which reading its figure uses is not public): ``first`` = turn 0's first
    token (what queueing on the prefiller delays), ``visible`` = the first user-visible turn's first
    token (SWE-bench: the final submission turn, so it includes every tool call before it). The
    headline keys (``ttfet_p50_s``, ``slo_attainment``, ...) use ``ttfet_definition`` (``visible``,
    the default, ``first`` or ``last`` turn), as before. A third reading, ``serving``, is the visible one
    with the conversation's replayed tool and think time taken out: the time the serving system added
    before the first user-visible token (:func:`serving_ttfet`; docs/metrics.md "Serving-only TTFET").
  * Conversation latency = last token of the last turn - arrival; last-turn TBT = TPOT of the final
    turn.
  * SLO: TTFET <= threshold, where the threshold is ``ttfet_s`` (absolute) or ``ttfet_multiple`` x the
    conversation's *unloaded* TTFET (the conversation replayed alone on the idle cluster under
    ``reference_scheduler``: a scheduler name, the same for every variant, or ``same`` = the run's own
    scheduler with its own config, so each variant is judged against itself); optionally last-turn
    TPOT <= ``tbt_s``. Denominator: every conversation of the workload; failed conversations count as
    violations. Each reading has its own SLO (``ttfet_first_*``, ``ttfet_visible_*``, ``ttfet_serving_*``: mode, multiple,
    seconds; ``inherit`` = the headline's mode and multiple, and for an absolute headline its seconds
    only on the headline's own reading) and its own attainment (``slo_attainment_first``,
    ``slo_attainment_visible``, ``slo_attainment_serving``; NaN for a reading without an SLO). A relative SLO
    on the serving reading multiplies the conversation's unloaded serving-only TTFET.
  * Goodput = conversations meeting the SLO / measured window (first arrival to last finish), conv/s.
  * Energy: sum over GPUs of energy over the measured window, J (idle power included);
    tokens_per_joule = tokens served / J, where tokens served = prompt tokens + generated tokens of the
    completed turns (a prefix-cache hit serves its tokens without recomputing them, so reuse raises
    tokens/J; recomputation after preemption or eviction does not add to the numerator);
    output_tokens_per_joule = generated tokens / J; ``prefill_tokens_computed`` reports the prefill work
    actually done (recompute included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Optional

from harness import LazyModule

pd = LazyModule("pandas")   # imported on first use: harness.run.config imports this module for SloConfig
np = LazyModule("numpy", globals(), "np")   # imported on first use, then bound here (harness.LazyModule)


READINGS = ("first", "visible", "serving")
READING_MODES = ("inherit", "relative", "absolute", "none")


@dataclass
class SloConfig:
    """Hydra schema of the ``slo`` group (see module docstring).

    Headline: ``ttfet_mode`` (``relative`` | ``absolute``), ``ttfet_multiple`` (>= 1), ``ttfet_s`` (s),
    ``ttfet_definition`` (``visible`` | ``first`` | ``last``), ``tbt_s`` (s or None),
    ``reference_scheduler`` (a registered scheduler name, or ``same``: the run's own scheduler).
    Per reading r in (``first``, ``visible``, ``serving``): ``ttfet_<r>_mode`` (``inherit`` | ``relative`` |
    ``absolute`` | ``none``), ``ttfet_<r>_multiple`` (None = ``ttfet_multiple``), ``ttfet_<r>_s`` (s;
    required when that mode is ``absolute``).
    Per-request goodput (``harness.analysis.goodput``): ``goodput``, None or thresholds in ms as vLLM's and AIPerf's
    ``--goodput`` take them, a string ``"ttft:200 tpot:50 e2el:2000"`` or a mapping ``{ttft: 200, ...}``.
    SLO scale curve (``slo_scale_curve``): ``scales``, None or the multiples of each reading's base threshold to
    report attainment at; ``scale_reference``, the scheduler whose unloaded TTFET is the base (``inherit``:
    ``reference_scheduler``; ``same``: each variant's own).
    """

    name: str = "relative"
    ttfet_mode: str = "relative"
    ttfet_multiple: float = 1.5
    ttfet_s: Optional[float] = None
    tbt_s: Optional[float] = None
    ttfet_definition: str = "visible"
    reference_scheduler: str = "collocated"
    ttfet_first_mode: str = "inherit"
    ttfet_first_multiple: Optional[float] = None
    ttfet_first_s: Optional[float] = None
    ttfet_visible_mode: str = "inherit"
    ttfet_visible_multiple: Optional[float] = None
    ttfet_visible_s: Optional[float] = None
    ttfet_serving_mode: str = "inherit"
    ttfet_serving_multiple: Optional[float] = None
    ttfet_serving_s: Optional[float] = None
    scales: Optional[List[float]] = None
    scale_reference: str = "inherit"
    goodput: Any = None

    def validate(self, where: str = "slo") -> None:
        """Raise ``ValueError`` naming ``slo.<field>`` for the first invalid value."""
        if self.ttfet_mode not in ("relative", "absolute"):
            raise ValueError(f"{where}.ttfet_mode must be 'relative' or 'absolute', got {self.ttfet_mode!r}")
        if self.ttfet_mode == "relative" and not (self.ttfet_multiple and self.ttfet_multiple >= 1):
            raise ValueError(f"{where}.ttfet_multiple must be >= 1, got {self.ttfet_multiple!r}")
        if self.ttfet_mode == "absolute" and not (self.ttfet_s and self.ttfet_s > 0):
            raise ValueError(f"{where}.ttfet_s must be > 0 (s) when ttfet_mode=absolute, got {self.ttfet_s!r}")
        if self.tbt_s is not None and not self.tbt_s > 0:
            raise ValueError(f"{where}.tbt_s must be > 0 (s) or null, got {self.tbt_s!r}")
        if self.ttfet_definition not in ("visible", "first", "last"):
            raise ValueError(f"{where}.ttfet_definition must be visible, first or last, got {self.ttfet_definition!r}")
        if not (isinstance(self.reference_scheduler, str) and self.reference_scheduler):
            raise ValueError(f"{where}.reference_scheduler must be a scheduler name or 'same', "
                             f"got {self.reference_scheduler!r}")
        if self.scales is not None:
            sc = list(self.scales)
            if not sc or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
                                 for x in sc):
                raise ValueError(f"{where}.scales must be a non-empty list of finite numbers > 0 (SLO scales) or "
                                 f"null, got {self.scales!r}")
            if len(set(float(x) for x in sc)) != len(sc):
                raise ValueError(f"{where}.scales has a repeated scale: {self.scales!r}")
        if not (isinstance(self.scale_reference, str) and self.scale_reference):
            raise ValueError(f"{where}.scale_reference must be 'inherit', 'same' or a scheduler name, "
                             f"got {self.scale_reference!r}")
        for r in READINGS:
            mode, mult, s = (getattr(self, f"ttfet_{r}_{k}") for k in ("mode", "multiple", "s"))
            if mode not in READING_MODES:
                raise ValueError(f"{where}.ttfet_{r}_mode must be one of {', '.join(READING_MODES)}, got {mode!r}")
            if mult is not None and not mult >= 1:
                raise ValueError(f"{where}.ttfet_{r}_multiple must be >= 1 or null, got {mult!r}")
            if s is not None and not s > 0:
                raise ValueError(f"{where}.ttfet_{r}_s must be > 0 (s) or null, got {s!r}")
            if mode == "absolute" and s is None:
                raise ValueError(f"{where}.ttfet_{r}_s must be set (s) when {where}.ttfet_{r}_mode=absolute")
        self.goodput_thresholds_ms(where)

    def goodput_thresholds_ms(self, where: str = "slo") -> dict[str, float]:
        """The per-request goodput thresholds, ``{ttft|tpot|e2el: ms}`` (``harness.analysis.goodput.parse_goodput``;
        empty when ``goodput`` is unset). Raises ``ValueError`` naming ``<where>.goodput``."""
        from harness.analysis.goodput import parse_goodput
        return parse_goodput(self.goodput, f"{where}.goodput")

    def reading(self, r: str) -> Optional[tuple[str, float]]:
        """The SLO of reading ``r`` (``first`` | ``visible`` | ``serving``): ``("relative", multiple)``,
        ``("absolute", seconds)``, or None (no SLO for that reading)."""
        mode = getattr(self, f"ttfet_{r}_mode")
        mult = getattr(self, f"ttfet_{r}_multiple")
        s = getattr(self, f"ttfet_{r}_s")
        if mode == "inherit":
            mode = self.ttfet_mode
            if mode == "absolute" and s is None:
                s = self.ttfet_s if r == self.ttfet_definition else None
                if s is None:
                    return None
        if mode == "none":
            return None
        if mode == "relative":
            return "relative", float(mult if mult is not None else self.ttfet_multiple)
        return "absolute", float(s)

    def needs_unloaded(self) -> bool:
        """True when a threshold (headline or per reading) is a multiple of the unloaded TTFET."""
        return self.ttfet_mode == "relative" or any((self.reading(r) or ("",))[0] == "relative" for r in READINGS)

    def scale_base(self, r: str) -> tuple[str, float]:
        """The SLO-scale curve's base of reading ``r``: ``("absolute", seconds)`` when that reading's SLO is
        absolute (the threshold at scale x is x times those seconds), else ``("relative", 1.0)`` (x times
        the conversation's unloaded TTFET under :meth:`scale_reference_name`)."""
        rs = self.reading(r)
        return rs if rs is not None and rs[0] == "absolute" else ("relative", 1.0)

    def scale_reference_name(self) -> str:
        """The scheduler whose unloaded TTFETs the SLO-scale curve multiplies (``scale_reference``;
        ``inherit`` = ``reference_scheduler``; ``same`` = each run's own scheduler)."""
        return self.reference_scheduler if self.scale_reference == "inherit" else self.scale_reference

    def needs_scale_unloaded(self) -> bool:
        """True when the SLO-scale curve (``scales`` set) multiplies an unloaded TTFET on some reading."""
        return bool(self.scales) and any(self.scale_base(r)[0] == "relative" for r in READINGS)

    def reference_label(self, scheduler_name: str, reference: Optional[str] = None) -> str:
        """The relative SLO's denominator in words, for ``summary.json`` (``reference``: another reference
        than ``reference_scheduler``, e.g. :meth:`scale_reference_name`)."""
        reference = self.reference_scheduler if reference is None else reference
        ref = scheduler_name if reference == "same" else reference
        same = " (the same variant)" if ref == scheduler_name else ""
        return f"unloaded TTFET under {ref}{same}"


def ttfet_turn_index(visible: list[bool], definition: str) -> int:
    """Index of the turn whose first token defines TTFET (first visible, first, or last turn)."""
    if definition == "first":
        return 0
    if definition == "last":
        return len(visible) - 1
    return visible.index(True) if True in visible else len(visible) - 1


def table_readings(conv: pd.DataFrame) -> tuple[str, ...]:
    """The readings of :data:`READINGS` whose column ``ttfet_<r>_s`` ``conv`` has: every one for a table of
    :func:`conversation_table`; a table written before the ``serving`` reading existed (a stored run's
    ``conversations.parquet`` read back) lacks it, and its SLO columns and attainment are then absent / NaN."""
    return tuple(r for r in READINGS if f"ttfet_{r}_s" in conv.columns)


def serving_ttfet(spans: dict, kv: int) -> float:
    """The serving-only TTFET of one conversation (s): the time its turns up to the first user-visible one
    spent in the serving system, ``sum_{k < kv} (finish_k - submit_k) + (first_token_kv - submit_kv)``
    (each earlier turn's E2E, admission hold and queueing included, plus the visible turn's TTFT).

    Under the closed loop (``workload.timing=think``, no sub-agents) turn k+1 is submitted ``tool_time_s``
    after turn k finished and turn 0 at the arrival, so this equals the visible TTFET minus the replayed tool
    and think time before the visible turn: the time the serving system added (docs/metrics.md "Serving-only
    TTFET"; the ConServe abstract's TTFET, arXiv 2606.01839, with the client's own time taken out). Under other
    timings it is still the time spent in the serving system; a joined sub-agent's turns are not counted.

    ``spans``: ``{turn: (submit_s, first_token_s, finish_s)}`` of the conversation's completed turns (s);
    ``kv``: the visible turn's index (:func:`ttfet_turn_index`). NaN when a turn ``0..kv`` is missing."""
    total = 0.0
    for k in range(kv + 1):
        sp = spans.get(k)
        if sp is None:
            return math.nan
        total += float(sp[1] if k == kv else sp[2]) - float(sp[0])
    return total


CONVERSATION_COLUMNS = ["conversation_id", "arrival_s", "num_turns", "turns_done", "ttfet_s", "ttfet_first_s",
                        "ttfet_visible_s", "ttfet_serving_s", "latency_s", "finish_s", "last_turn_tpot_s", "failed", "completed"]


def conversation_table(turns: pd.DataFrame, convs: list, definition: str) -> pd.DataFrame:
    """Per-conversation metrics (``conversations.parquet`` without SLO columns).

    ``convs``: the controller's ``ConversationState`` objects. Columns (``CONVERSATION_COLUMNS``):
    conversation_id, arrival_s, num_turns, turns_done, ttfet_s (the ``definition`` reading, s),
    ttfet_first_s (turn 0's first token - arrival, s), ttfet_visible_s (first user-visible turn's first
    token - arrival, s), ttfet_serving_s (the visible reading's time in the serving system, s:
    :func:`serving_ttfet`), latency_s, finish_s, last_turn_tpot_s (the final turn's TPOT, s), failed,
    completed. A reading whose turn did not complete is NaN. Child conversations (sub-agents of a session
    trace, ``ConversationRecord.parent_id``) are not rows: they are part of their root's session.
    """
    # one pass over the turn columns (no per-conversation frames): per conversation, whether it has rows,
    # its completed turns' count, first-token time by turn (the last row of a turn wins, as a dict of
    # the rows would) and (finish, TPOT) of each turn's first completed row
    seen: set = set()
    done_of: dict = {}
    first_of: dict = {}
    end_of: dict = {}
    span_of: dict = {}
    if len(turns):
        for cid, turn, status, sub, ft, fin, tpot in zip(turns.conversation_id.tolist(), turns.turn.tolist(),
                                                         turns.status.tolist(), turns.submit_s.to_numpy(),
                                                         turns.first_token_s.to_numpy(), turns.finish_s.to_numpy(),
                                                         turns.tpot_s.to_numpy()):
            seen.add(cid)
            if status != "ok":
                continue
            done_of[cid] = done_of.get(cid, 0) + 1
            first_of.setdefault(cid, {})[turn] = ft
            span_of.setdefault(cid, {})[turn] = (sub, ft, fin)
            end_of.setdefault((cid, turn), (fin, tpot))
    cols: dict = {c: [] for c in CONVERSATION_COLUMNS}   # built column by column, no dict per conversation
    (c_id, c_arr, c_nt, c_done, c_ttfet, c_first, c_vis, c_serv, c_lat, c_fin, c_tpot, c_failed,
     c_completed) = (cols[c] for c in CONVERSATION_COLUMNS)
    for c in convs:
        rec = c.record
        if rec.parent_id is not None:   # a sub-agent: its turns are in turns.parquet, not a user conversation
            continue
        cid = rec.conversation_id
        visible = [t.visible for t in rec.turns]
        k = ttfet_turn_index(visible, definition)
        kv = ttfet_turn_index(visible, "visible")
        ttfet = first = vis = serv = latency = last_tpot = math.nan
        done = 0
        if cid in seen:
            done = done_of.get(cid, 0)
            first_token = first_of.get(cid, {})
            ttfet = float(first_token.get(k, math.nan)) - c.arrival_s
            first = float(first_token.get(0, math.nan)) - c.arrival_s
            vis = float(first_token.get(kv, math.nan)) - c.arrival_s
            serv = serving_ttfet(span_of.get(cid, {}), kv)
            last = end_of.get((cid, len(rec.turns) - 1))
            if last is not None:
                latency = float(last[0]) - c.arrival_s
                last_tpot = float(last[1])
        c_id.append(rec.conversation_id)
        c_arr.append(c.arrival_s)
        c_nt.append(len(rec.turns))
        c_done.append(done)
        c_ttfet.append(ttfet)
        c_first.append(first)
        c_vis.append(vis)
        c_serv.append(serv)
        c_lat.append(latency)
        c_fin.append(c.finish_s)
        c_tpot.append(last_tpot)
        c_failed.append(bool(c.failed))
        # a conversation cut by the duration stop (workload.duration_s) is not completed
        c_completed.append(bool(c.done and not c.failed and not getattr(c, "stopped", False)))
    if not c_id:
        return pd.DataFrame([], columns=CONVERSATION_COLUMNS)
    return pd.DataFrame(cols, columns=CONVERSATION_COLUMNS)


MESSAGE_COLUMNS = ["conversation_id", "message", "first_turn", "visible_turn", "send_s", "ttfet_first_s",
                   "ttfet_visible_s"]


def message_table(turns: pd.DataFrame, convs: list) -> pd.DataFrame:
    """TTFET per user message of session traces (``messages.parquet``), both readings.

    A root conversation's message m is the agent loop its ``user_message`` turn starts (turn 0 starts
    message 0; ``ConversationRecord.message_of``). Its send time ``send_s`` is the ``submit_s`` of its first
    turn (when the message's first call became ready: the user's send); ``ttfet_first_s`` = that turn's first
    token - send_s (= its TTFT); ``ttfet_visible_s`` = the first token of the loop's first visible turn (the
    ``end_turn`` response of a converted Claude Code session) - send_s: the first output the user reads,
    queueing, prefill and every tool call and sub-agent of the loop included. NaN where the turn did not
    complete or the loop has no visible turn (``visible_turn`` -1). Definition: the ConServe abstract's TTFET
    ("the latency of a conversation's first user-visible output", docs/metrics.md) applied per user message.
    Columns ``MESSAGE_COLUMNS``; children (sub-agents) have no rows.
    """
    submit: dict = {}
    first: dict = {}
    if len(turns):
        for cid, turn, status, sub, ft in zip(turns.conversation_id.tolist(), turns.turn.tolist(),
                                              turns.status.tolist(), turns.submit_s.to_numpy(),
                                              turns.first_token_s.to_numpy()):
            submit[(cid, turn)] = float(sub)
            if status == "ok":
                first[(cid, turn)] = float(ft)
    rows: dict = {c: [] for c in MESSAGE_COLUMNS}
    for c in convs:
        rec = c.record
        if rec.parent_id is not None:
            continue
        cid = rec.conversation_id
        msgs = rec.message_of()
        starts = [k for k in range(len(rec.turns)) if k == 0 or msgs[k] != msgs[k - 1]]
        for m, k0 in enumerate(starts):
            k1 = starts[m + 1] if m + 1 < len(starts) else len(rec.turns)
            kv = next((k for k in range(k0, k1) if rec.turns[k].visible), -1)
            send = submit.get((cid, k0), math.nan)
            rows["conversation_id"].append(cid)
            rows["message"].append(m)
            rows["first_turn"].append(k0)
            rows["visible_turn"].append(kv)
            rows["send_s"].append(send)
            rows["ttfet_first_s"].append(first.get((cid, k0), math.nan) - send)
            rows["ttfet_visible_s"].append(first.get((cid, kv), math.nan) - send if kv >= 0 else math.nan)
    return pd.DataFrame(rows, columns=MESSAGE_COLUMNS)


def message_summary(messages: pd.DataFrame) -> dict:
    """Summary keys of :func:`message_table` (s): ``num_user_messages``; per reading r (first, visible):
    ``ttfet_message_<r>_p50_s`` / ``_p90_s`` over every message with the reading, and the conversation-level
    ``ttfet_session_<r>_mean_s``: per session the mean over its messages, then the mean over sessions (each
    session weighs the same however many messages it has); ``num_messages_no_visible``: messages whose
    loop has no visible response or whose visible response did not complete."""
    out = {"num_user_messages": int(len(messages))}
    for r in ("first", "visible"):
        col = messages[f"ttfet_{r}_s"].dropna() if len(messages) else pd.Series(dtype=float)
        out[f"ttfet_message_{r}_p50_s"] = float(col.quantile(0.5)) if len(col) else math.nan
        out[f"ttfet_message_{r}_p90_s"] = float(col.quantile(0.9)) if len(col) else math.nan
        per = messages.groupby("conversation_id")[f"ttfet_{r}_s"].mean().dropna() if len(messages) else col
        out[f"ttfet_session_{r}_mean_s"] = float(per.mean()) if len(per) else math.nan
    out["num_messages_no_visible"] = int(messages.ttfet_visible_s.isna().sum()) if len(messages) else 0
    return out


def _threshold(conv: pd.DataFrame, slo: Optional[tuple[str, float]], unloaded: Optional[dict], reading: str
               ) -> tuple[pd.Series, pd.Series]:
    """``(unloaded TTFET, threshold)`` per conversation for one reading's SLO, s (NaN where none)."""
    nan = pd.Series(math.nan, index=conv.index, dtype=float)
    if slo is None:
        return nan, nan
    mode, v = slo
    if mode == "absolute":
        return nan, pd.Series(v, index=conv.index, dtype=float)
    if unloaded is None:
        raise ValueError(f"a relative SLO on the {reading!r} reading needs the unloaded TTFETs")
    base = conv.conversation_id.map(lambda cid: unloaded.get(cid, {}).get(reading, math.nan)).astype(float)
    return base, base * v


def apply_slo(conv: pd.DataFrame, slo: SloConfig, unloaded: Optional[dict]) -> pd.DataFrame:
    """Add the SLO columns (in place) and return ``conv``.

    ``unloaded``: ``{conversation_id: {"first": s, "visible": s, "last": s}}``, each conversation's
    first-token time of that reading's turn when replayed alone (``harness.run.slo_baseline.unloaded_readings``);
    needed when any threshold is relative (``SloConfig.needs_unloaded``).
    Headline (``ttfet_definition``, ``ttfet_mode``): ``unloaded_ttfet_s``, ``slo_ttfet_s`` (threshold, s),
    ``slo_met`` (bool). Per reading r in (first, visible, serving; those the table has, :func:`table_readings`):
    ``unloaded_ttfet_<r>_s``, ``slo_ttfet_<r>_s``
    and ``slo_met_<r>`` (True / False, or None when the reading has no SLO). A failed or unfinished
    conversation meets no SLO; ``tbt_s`` (last-turn TPOT) applies to every reading.
    """
    head = ("relative", slo.ttfet_multiple) if slo.ttfet_mode == "relative" else ("absolute", slo.ttfet_s)
    tbt_ok = (conv.last_turn_tpot_s.fillna(0.0) <= slo.tbt_s) if slo.tbt_s is not None else True
    conv["unloaded_ttfet_s"], conv["slo_ttfet_s"] = _threshold(conv, head, unloaded, slo.ttfet_definition)
    conv["slo_met"] = (conv.completed & (conv.ttfet_s <= conv.slo_ttfet_s) & tbt_ok).astype(bool)
    for r in table_readings(conv):
        rs = slo.reading(r)
        conv[f"unloaded_ttfet_{r}_s"], conv[f"slo_ttfet_{r}_s"] = _threshold(conv, rs, unloaded, r)
        met = (conv.completed & (conv[f"ttfet_{r}_s"] <= conv[f"slo_ttfet_{r}_s"]) & tbt_ok).astype(bool)
        # object dtype (True / False / None): a null stays a null in parquet and in a wandb.Table
        conv[f"slo_met_{r}"] = met.astype(object) if rs is not None else pd.Series([None] * len(conv), index=conv.index,
                                                                                    dtype=object)
    return conv


def scale_key(r: str, scale: float) -> str:
    """The ``summary.json`` key of reading ``r``'s attainment at SLO scale ``scale``:
    ``slo_attainment_<r>_x<scale>`` (``%g``: 0.5 -> ``x0.5``, 1 -> ``x1``, 1.5 -> ``x1.5``)."""
    return f"slo_attainment_{r}_x{float(scale):g}"


def slo_scale_curve(conv: pd.DataFrame, slo: SloConfig, unloaded: Optional[dict]) -> dict:
    """SLO attainment of each TTFET reading at each SLO scale of ``slo.scales``, from the run's own
    per-conversation TTFETs (no extra simulation; docs/metrics.md "SLO scale").

    One threshold per conversation and reading, common to every variant when the base is common: at
    scale x, reading r's threshold is x * base_r, where base_r is the reading's absolute SLO in seconds
    when that reading is absolute, else the conversation's unloaded TTFET of that reading under
    ``slo.scale_reference_name()`` (``unloaded``: ``{conversation_id: {"first": s, "visible": s}}``, as
    for :func:`apply_slo`). A conversation meets it when it completed, its ``ttfet_<r>_s`` <= the
    threshold (a NaN base or TTFET never meets it) and, with ``tbt_s``, its last-turn TPOT <= ``tbt_s``.
    Denominator: all conversations (as ``slo_attainment``). Returns ``{}`` when ``slo.scales`` is unset,
    else ``{"slo_scales": [...], scale_key(r, x): fraction, ...}``.

    Raises:
        ValueError: a relative base without ``unloaded``.
    """
    if not slo.scales:
        return {}
    scales = [float(x) for x in slo.scales]
    out: dict = {"slo_scales": scales}
    tbt_ok = (conv.last_turn_tpot_s.fillna(0.0) <= slo.tbt_s) if slo.tbt_s is not None else True
    n = len(conv)
    for r in table_readings(conv):
        mode, v = slo.scale_base(r)
        if mode == "absolute":
            base = pd.Series(v, index=conv.index, dtype=float)
        else:
            if unloaded is None:
                raise ValueError(f"the SLO-scale curve of the {r!r} reading needs the unloaded TTFETs")
            base = conv.conversation_id.map(lambda cid: unloaded.get(cid, {}).get(r, math.nan)).astype(float)
        if not n:
            out.update({scale_key(r, x): math.nan for x in scales})
            continue
        # on the arrays (~20x less CPU than the Series): a missing completed flag or TTFET never meets it
        ok = (conv.completed & tbt_ok).to_numpy(dtype=bool, na_value=False)
        ttfet = conv[f"ttfet_{r}_s"].to_numpy(dtype=np.float64, na_value=np.nan)
        base_s = base.to_numpy(dtype=np.float64, na_value=np.nan)
        for x in scales:
            out[scale_key(r, x)] = np.count_nonzero(ok & (ttfet <= x * base_s)) / n
    return out


def _pct(x: pd.Series, q: float) -> float:
    x = x.dropna()
    return float(np.percentile(x, q)) if len(x) else math.nan


def _central_mean(turns: pd.DataFrame, col: str) -> float:
    """Mean of ``col`` over the completed turns of ``turns``, a :func:`central_window`, s; NaN without any."""
    c = turns[turns.status == "ok"] if len(turns) else turns
    return float(c[col].mean()) if len(c) else math.nan


def _attainment(conv: pd.DataFrame, col: str) -> float:
    """Share of all conversations with ``col`` true; NaN when the column is absent or all NA (no SLO)."""
    if col not in conv.columns or not len(conv) or conv[col].isna().all():
        return math.nan
    return float(conv[col].fillna(False).astype(bool).sum() / len(conv))


def central_window(turns: pd.DataFrame) -> pd.DataFrame:
    """The turns submitted in the central half of the run: sorted by ``submit_s``, positions
    ``[n // 4, 3n // 4)`` of the ``n`` turns (every status). The WAIT paper's experiments report the mean
    latency over such a window so that the warm-up (empty system) and the drain after the last arrival
    do not dilute a steady-state figure (Ao et al., arXiv 2504.11320, numerical section; the authors'
    scripts use the middle 50 % of requests, docs/wait.md). Shape: a row subset of ``turns``."""
    n = len(turns)
    if not n:
        return turns
    return turns.sort_values("submit_s", kind="stable").iloc[n // 4: 3 * n // 4]


def pressure_metrics(turns: pd.DataFrame, instances: pd.DataFrame, window: tuple[float, float]) -> dict:
    """How hard admission and KV capacity bind (``summary.json``; docs/metrics.md "KV pressure").

    Admission: the hold of a conversation is its turn 0's ``admit_s - submit_s`` (s; 0 under admit-all
    policies; ConServe holds new conversations while the decoder pool's KV or the prefiller queue is over
    its gate). ``admission_held_conversations``: conversations with a hold > 0; ``admission_hold_s_total``
    (s, summed over all conversations), ``admission_hold_p95_s`` and ``admission_hold_max_s`` (s, over the
    held ones; NaN when none was held).
    KV: ``decoder_kv_peak_frac`` = the highest sampled ``kv_used_frac`` of any instance that decodes
    (role != prefiller: the decoders, or every instance of a collocated cluster) in ``window`` (s, first
    arrival to last finish); ``decoder_kv_mean_frac`` = their time-weighted mean occupancy in the window,
    each sample held until that instance's next sample (``instances.parquet``, every
    ``logger.metrics_interval_s``; NaN without samples).
    """
    nan = math.nan
    t0 = turns[(turns.turn == 0) & turns.admit_s.notna()] if len(turns) else turns
    hold = (t0.admit_s - t0.submit_s).clip(lower=0.0).to_numpy(dtype=float) if len(t0) else np.zeros(0)
    held = hold[hold > 0]
    out = {"admission_held_conversations": int(len(held)),
           "admission_hold_s_total": float(hold.sum()),
           "admission_hold_p95_s": float(np.percentile(held, 95)) if len(held) else nan,
           "admission_hold_max_s": float(held.max()) if len(held) else nan,
           "decoder_kv_peak_frac": nan, "decoder_kv_mean_frac": nan}
    if instances is None or not len(instances):
        return out
    lo, hi = window
    dec = instances[(instances.role != "prefiller") & (instances.t_s >= lo) & (instances.t_s <= hi)]
    if not len(dec):
        return out
    out["decoder_kv_peak_frac"] = float(dec.kv_used_frac.max())
    num = den = 0.0
    for _, g in dec.sort_values("t_s", kind="stable").groupby("instance", sort=True):
        t = g.t_s.to_numpy(dtype=float)
        w = np.diff(np.append(t, hi))
        num += float((g.kv_used_frac.to_numpy(dtype=float) * w).sum())
        den += float(w.sum())
    out["decoder_kv_mean_frac"] = num / den if den > 0 else float(dec.kv_used_frac.mean())
    return out


def admission_readings(turns: pd.DataFrame, conv: pd.DataFrame) -> dict:
    """TTFET from admission instead of arrival (``summary.json``; docs/metrics.md "KV and admission pressure"):
    per reading r of the table (:func:`table_readings`), ``ttfet_<r>_from_admission_p95_s`` = the 95th percentile
    over conversations of ``ttfet_<r>_s`` minus the conversation's admission hold (its turn 0's ``admit_s -
    submit_s``, s, clipped at 0; 0 under admit-all policies, and for a conversation never admitted the reading is
    NaN anyway). With an admission gate (ConServe holds new conversations while the decoders' KV or the
    prefiller queue is over its gate) the two differ by the hold: from arrival is what the user sees, from
    admission what the admitted conversations got. NaN without conversations."""
    hold: dict = {}
    if len(turns):
        t0 = turns[(turns.turn == 0) & turns.admit_s.notna()]
        hold = dict(zip(t0.conversation_id, (t0.admit_s - t0.submit_s).clip(lower=0.0)))
    h = conv.conversation_id.map(lambda c: hold.get(c, 0.0)).astype(float) if len(conv) else pd.Series(dtype=float)
    return {f"ttfet_{r}_from_admission_p95_s": _pct(conv[f"ttfet_{r}_s"] - h, 95) if len(conv) else math.nan
            for r in table_readings(conv)}


def summarize(turns: pd.DataFrame, conv: pd.DataFrame, energy_j_per_instance: list[float],
              window_s: float, preemptions: int) -> dict:
    """The headline metrics (``summary.json``); NaN where there is no data, never 0 for missing."""
    ok = turns[turns.status == "ok"] if len(turns) else turns
    central = central_window(turns)
    n_conv = len(conv)
    have = table_readings(conv)
    met = int(conv.slo_met.sum()) if n_conv else 0
    energy = float(sum(energy_j_per_instance))
    gen = int(ok.output_tokens.sum()) if len(ok) else 0
    pre = int(turns.prefill_computed_tokens.sum()) if len(turns) else 0
    served = int(ok.prompt_tokens.sum()) + gen if len(ok) else 0
    return {
        "num_conversations": n_conv,
        "num_conversations_completed": int(conv.completed.sum()) if n_conv else 0,
        "num_conversations_failed": int(conv.failed.sum()) if n_conv else 0,
        "num_turns": int(len(ok)),
        "num_turns_failed": int((turns.status == "failed").sum()) if len(turns) else 0,
        "ttfet_p50_s": _pct(conv.ttfet_s, 50), "ttfet_p95_s": _pct(conv.ttfet_s, 95),
        "ttfet_p99_s": _pct(conv.ttfet_s, 99),
        "ttfet_mean_s": float(conv.ttfet_s.mean()) if n_conv else math.nan,
        **{f"ttfet_{r}_p{q}_s": _pct(conv[f"ttfet_{r}_s"], q) if r in have else math.nan
           for r in READINGS for q in (50, 95, 99)},
        "latency_p50_s": _pct(conv.latency_s, 50), "latency_p95_s": _pct(conv.latency_s, 95),
        "latency_p99_s": _pct(conv.latency_s, 99),
        "last_turn_tpot_p50_s": _pct(conv.last_turn_tpot_s, 50),
        "last_turn_tpot_p95_s": _pct(conv.last_turn_tpot_s, 95),
        "ttft_p50_s": _pct(ok.ttft_s, 50), "ttft_p95_s": _pct(ok.ttft_s, 95), "ttft_p99_s": _pct(ok.ttft_s, 99),
        "tpot_p50_s": _pct(ok.tpot_s, 50), "tpot_p95_s": _pct(ok.tpot_s, 95),
        "e2e_p50_s": _pct(ok.e2e_s, 50), "queue_p95_s": _pct(ok.queue_s, 95),
        "e2e_central_mean_s": _central_mean(central, "e2e_s"),
        "ttft_central_mean_s": _central_mean(central, "ttft_s"),
        "slo_attainment": met / n_conv if n_conv else math.nan,
        **{f"slo_attainment_{r}": _attainment(conv, f"slo_met_{r}") for r in READINGS},
        "slo_denominator": "all conversations of the workload (failed count as violations)",
        "goodput_conv_per_s": met / window_s if window_s > 0 else math.nan,
        "window_s": window_s,
        "preemptions": int(preemptions),
        "preemptions_per_turn": int(preemptions) / len(turns) if len(turns) else math.nan,
        "prefix_hit_frac": float(ok.cached_tokens.sum() / ok.prompt_tokens.sum()) if len(ok) else math.nan,
        "kv_transfer_tokens": float(turns.transfer_tokens.sum(min_count=1)) if len(turns) else math.nan,
        "disaggregated_turn_frac": float(ok.disaggregated.mean()) if len(ok) else math.nan,
        "energy_j": energy,
        "energy_j_per_instance": [float(e) for e in energy_j_per_instance],
        "prefill_tokens_computed": pre, "output_tokens": gen, "tokens_served": served,
        "tokens_per_joule": served / energy if energy > 0 else math.nan,
        "tokens_per_joule_counts": "prompt + generated tokens of completed turns (tokens served)",
        "output_tokens_per_joule": gen / energy if energy > 0 else math.nan,
    }
