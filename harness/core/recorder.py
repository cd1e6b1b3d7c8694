"""The recorder: every output row of a run and its schema, the same on every backend.

A run directory holds ``turns.parquet`` (``TURN_COLUMNS``), ``conversations.parquet``
(``harness.analysis.metrics.CONVERSATION_COLUMNS`` + SLO columns), ``instances.parquet`` (``INSTANCE_COLUMNS``),
``decisions.parquet`` (``DECISION_COLUMNS``: typed hold / place / plan records), ``summary.json``, and with
``logger.steps`` ``tokens.parquet`` (``TOKEN_COLUMNS``: every output token's time).
A column a backend cannot observe is null there (NaN), never dropped; ``docs/metrics.md`` says which.
Files are written atomically (a temporary file renamed into place), so an interrupted write never
leaves a truncated file.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd

from harness.core.atomic import (atomic_write as _atomic, process_umask, strict_json,  # noqa: F401 -- re-exported
                                 write_json, write_text)

TURN_COLUMNS = ["conversation_id", "turn", "submit_s", "admit_s", "start_s", "prefill_done_s", "first_token_s",
                "finish_s", "prompt_tokens", "cached_tokens", "prefill_computed_tokens", "output_tokens",
                "prefill_instance", "decode_instance", "disaggregated", "decode_cached_tokens", "transfer_tokens",
                "transfer_s", "preemptions", "visible", "status", "error", "ttft_s", "tpot_s", "e2e_s", "queue_s",
                 "itl_p50_s", "itl_p99_s", "itl_max_s", "engine_queued_s", "engine_scheduled_s", "parent_id",
                 "message"]
INSTANCE_COLUMNS = ["t_s", "instance", "role", "hardware", "kv_used_tokens", "kv_capacity_tokens", "kv_used_frac",
                    "num_running", "num_waiting", "energy_j", "power_w"]
TOKEN_COLUMNS = ["conversation_id", "turn", "instance", "token", "t_s"]
DECISION_COLUMNS = ["t_s", "kind", "conversation_id", "turn", "prefill_instance", "decode_instance", "reason",
                    "candidates", "view_kv_used_frac", "view_queued_prefill_tokens", "num_held", "misrouted"]


SAMPLE_BATCH = 4096     # instance rows buffered before they are moved into the column store (Recorder.sample)
_drain = deque(maxlen=0).extend     # consume an iterator (for its calls' effects) without keeping anything


def sorted_percentile(a: np.ndarray, q: float) -> float:
    """The ``q``-th percentile (0-100) of an ascending-sorted array, linearly interpolated between the two
    nearest ranks: numpy's default (``method="linear"``) rule, ``a[i] + (a[i+1] - a[i]) * frac`` at rank
    ``(n - 1) * q / 100`` -- computed directly, as ``np.percentile`` costs ~100 us per call."""
    r = (len(a) - 1) * q / 100.0
    i = int(r)
    if i + 1 >= len(a):
        return float(a[-1])
    lo = a.item(i)      # Python floats: the same IEEE double operations as on numpy scalars, without their cost
    return lo + (a.item(i + 1) - lo) * (r - i)


class ColumnStore:
    """Rows kept column by column, typed where the values allow it: a column whose values are all Python
    ``float`` is an ``array('d')`` (8 bytes a value instead of a 24-byte float object plus a row dict's
    slot), all Python ``int`` an ``array('q')``; a column that meets any other type (a ``bool``, a
    ``str``, ``None``, a numpy scalar, an int beyond int64) becomes a plain list of the values from then
    on. :meth:`frame` is the same DataFrame -- dtypes, values, parquet bytes -- as
    ``pd.DataFrame(list_of_row_dicts, columns=columns)`` of the same rows (pandas infers a column of
    Python floats as float64 and of Python ints as int64 either way; ``tests/test_recorder_streams.py``
    checks it on mixed columns).

    Args:
        columns: the column names, in order; :meth:`append` takes one value per column in that order.
    """

    def __init__(self, columns: Sequence[str]):
        self.columns = list(columns)
        self._data: list = [None] * len(self.columns)   # per column: array('d'), array('q') or list
        self._types: list = [None] * len(self.columns)  # per column: the type of its last value
        self._apps: list = []                            # per column: its ``append``
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def append(self, values: Sequence[Any]) -> None:
        """One row: ``values[i]`` for ``columns[i]``. Fast path: every value has its column's last type."""
        if self.n and list(map(type, values)) == self._types:
            try:    # app(v) for each column in order, the loop in C (an exception stops it where a loop would)
                _drain(map(operator.call, self._apps, values))
            except OverflowError:   # an int beyond int64 in an array('q') column
                self._append_slow(values)
        else:
            self._append_slow(values)
        self.n += 1

    def extend(self, rows: Sequence[Sequence[Any]]) -> None:
        """Rows, in order: the same store as :meth:`append` of each row (same columns, types, values). Fast
        path: every row has one value per column and each typed column's values are all of its type (the first
        row decides the types of an empty store, as :meth:`append` does): one C-level ``extend`` per column (a
        list column takes any values, its last type that of its last value). Otherwise, or where an int does
        not fit int64, row by row."""
        if not rows:
            return
        if not self.n:
            self.append(rows[0])
            rows = rows[1:]
            if not rows:
                return
        if set(map(len, rows)) == {len(self.columns)} and self._extend_typed(list(zip(*rows))):
            return
        for r in rows:
            self.append(r)

    def extend_columns(self, cols: Sequence[list]) -> None:
        """:meth:`extend` of the rows ``zip(*cols)`` without building them: ``cols`` holds one list per column, all
        of one length (the rows' values column by column, in order). The same store as :meth:`extend` of those
        rows (same columns, types, values): an empty store takes its first row through :meth:`append` (the first
        row decides the types), then one C-level ``extend`` per column where each typed column's values are all
        of its type; otherwise, or where an int does not fit int64, row by row.

        Raises:
            ValueError: ``cols`` does not hold one list per column, or the lists differ in length."""
        if len(cols) != len(self.columns) or len(set(map(len, cols))) > 1:
            raise ValueError(f"extend_columns: {len(cols)} columns of lengths {sorted(set(map(len, cols)))} "
                             f"for {len(self.columns)} columns")
        if not cols[0]:
            return
        if not self.n:
            self.append([c[0] for c in cols])
            cols = [c[1:] for c in cols]
            if not cols[0]:
                return
        if self._extend_typed(cols):
            return
        for r in zip(*cols):
            self.append(r)

    def _extend_typed(self, cols: Sequence[Sequence[Any]]) -> bool:
        """The fast path of :meth:`extend` and :meth:`extend_columns` on a store holding at least one row:
        ``cols``, one sequence per column, all of one non-zero length, appended by one C-level ``extend`` per
        column where each typed column's values are all of its type (a list column takes any values, its last
        type that of its last value). False, the store unchanged, where a value's type differs or an int does not
        fit int64 (the caller then appends row by row)."""
        data, types = self._data, self._types
        typed = [isinstance(d, array) for d in data]
        if not all(set(map(type, c)) == {t} for c, t, a in zip(cols, types, typed) if a):
            return False
        try:
            new = [array(d.typecode, c) if a else c for d, c, a in zip(data, cols, typed)]
        except OverflowError:   # an int beyond int64 for an array('q') column: row by row
            return False
        for i, (d, c) in enumerate(zip(data, new)):
            d.extend(c)
            types[i] = type(c[-1])
        self.n += len(cols[0])
        return True

    def _append_slow(self, values: Sequence[Any]) -> None:
        """Append the values of this row not appended yet (a column holds ``n + 1`` values once done),
        turning a typed column into a list when a value does not fit it."""
        n, data, types = self.n, self._data, self._types
        if not n:
            self._apps = [None] * len(self.columns)
        for i, v in enumerate(values):
            d, t = data[i], type(v)
            if d is None:   # the first row decides: float -> array('d'), int -> array('q'), else a list
                d = data[i] = array("d") if t is float else array("q") if t is int else []
            elif len(d) > n:
                continue
            if isinstance(d, array):
                ok = t is (float if d.typecode == "d" else int)
                if ok:
                    try:
                        d.append(v)
                    except OverflowError:
                        ok = False
                if not ok:
                    d = data[i] = list(d)
                    d.append(v)
            else:
                d.append(v)
            types[i] = t
            self._apps[i] = d.append

    def column(self, name: str) -> list:
        """The values of column ``name`` as a list of Python objects."""
        c = self._data[self.columns.index(name)]
        return [] if c is None else list(c)

    def rows(self) -> list[dict]:
        """The rows as dicts (``{column: value}``), in order."""
        cols = [[] if c is None else list(c) for c in self._data]
        return [dict(zip(self.columns, vals)) for vals in zip(*cols)] if self.n else []

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame with ``columns`` (see the class docstring)."""
        if not self.n:
            return pd.DataFrame([], columns=self.columns)
        return pd.DataFrame({c: (np.array(d, dtype=np.float64 if d.typecode == "d" else np.int64)
                                 if isinstance(d, array) else d)
                             for c, d in zip(self.columns, self._data)}, columns=self.columns)


class ItlPool:
    """Every completed turn's inter-token gaps, pooled in one growing ``array('d')`` buffer, s (8 bytes a gap,
    no per-turn array kept, no concatenated copy).

    :meth:`stats` gives the pooled mean and percentiles exactly as ``vllm bench serve`` pools them and as
    ``numpy.mean`` / ``numpy.percentile`` (linear) of the concatenated gaps give them: the mean over the
    gaps in arrival order first, then all percentiles from one in-place ``numpy.percentile`` call on the
    buffer (one partition for every requested rank; the buffer's order is not kept afterwards).
    """

    def __init__(self):
        self._buf = array("d")
        self._stats: Optional[tuple] = None

    def __len__(self) -> int:
        return len(self._buf) if self._buf is not None else 0

    def add(self, gaps: Any) -> None:
        """Append one turn's gaps (a sequence of s)."""
        if self._stats is not None:
            raise RuntimeError("ItlPool.add after stats(): the pooled gaps were already reordered")
        a = np.ascontiguousarray(gaps, dtype=np.float64).reshape(-1)
        self._buf.frombytes(memoryview(a).cast("B"))

    def gaps(self) -> np.ndarray:
        """A copy of the pooled gaps, s (in arrival order until :meth:`stats` ran)."""
        if self._buf is None:
            raise RuntimeError("ItlPool.gaps after release()")
        return np.array(self._buf, dtype=np.float64)

    def release(self) -> None:
        """Free the buffer (8 bytes a gap) once :meth:`stats` has read it; :meth:`stats` keeps answering with
        the values it computed, :meth:`add` and :meth:`gaps` raise from then on."""
        if self._stats is None:
            raise RuntimeError("ItlPool.release before stats(): the pooled ITL would be lost")
        self._buf = None

    def stats(self, percentiles: Sequence[float]) -> tuple[float, dict]:
        """``(mean s, {q: percentile s})`` of the pooled gaps: the mean over every gap (NaN when there is
        none; a non-finite gap makes it non-finite, as ``numpy.mean`` does), each percentile over the finite
        gaps (numpy's linear interpolation; NaN without any). Computed once; later calls with the same
        ``percentiles`` return the same values."""
        key = tuple(float(q) for q in percentiles)
        if self._stats is not None and self._stats[0] == key:
            return self._stats[1], dict(self._stats[2])
        if self._stats is not None:
            raise RuntimeError("ItlPool.stats: already computed for other percentiles")
        n = len(self._buf)
        if not n:
            mean, pct = math.nan, {q: math.nan for q in key}
        else:
            a = np.frombuffer(self._buf, dtype=np.float64)
            mean = float(a.mean())
            if not math.isfinite(mean):   # some gap is NaN or infinite: the percentiles skip those
                a = a[np.isfinite(a)]
            if not len(a):
                pct = {q: math.nan for q in key}
            elif key:
                vals = np.percentile(a, list(key), overwrite_input=True)
                pct = {q: float(v) for q, v in zip(key, vals)}
            else:
                pct = {}
            del a
        self._stats = (key, mean, pct)
        return mean, dict(pct)


def _itl_stats(itl_s: Sequence[float]) -> tuple[float, float, float]:
    """p50, p99 and max of a turn's inter-token gaps, s (NaN for fewer than one gap)."""
    if len(itl_s) == 0:
        return math.nan, math.nan, math.nan
    a = np.array(itl_s, dtype=float)    # a copy (the caller's order is kept), sorted in place: np.sort's sort
    a.sort()
    return sorted_percentile(a, 50), sorted_percentile(a, 99), a.item(-1)


def turn_values(job, names: Sequence[str], visible: bool, parent_id: str = "", message: int = 0) -> tuple:
    """One ``turns.parquet`` row from a finished or failed ``TurnJob`` (instance names from ``names``), as a
    tuple in ``TURN_COLUMNS`` order.

    Times in s; TTFT = first token - submit, TPOT = (finish - first token) / (output - 1),
    E2E = finish - submit, queue = admit - submit; ITL p50/p99/max over the turn's token gaps;
    ``engine_queued_s`` / ``engine_scheduled_s``: vLLM's request events on the engine (``TurnJob``; NaN where not
    observed).
    E2E = finish - submit, queue = admit - submit; ITL p50/p99/max over the turn's token gaps.
    ``parent_id``: the spawning conversation of a child (a sub-agent), "" for a root; ``message``: the
    0-based user message whose agent loop the turn belongs to (``ConversationRecord.message_of``).
    """
    ok = not job.error
    first = job.first_token_s if job.first_token_s is not None else math.nan
    fin = job.finish_s if job.finish_s is not None else math.nan
    out = job.output_tokens
    p50, p99, mx = _itl_stats(job.itl_s)
    pl = job.placement
    transfer = job.transfer_tokens >= 0
    return (job.conversation_id, job.turn, job.submit_s, job.admit_s, job.start_s,
            job.prefill_done_s if job.prefill_done_s is not None else math.nan,
            first, fin, job.prompt_tokens, job.cached_tokens, job.prefill_computed_tokens, out if ok else 0,
            names[pl.prefill_instance], names[pl.decode_instance], pl.disaggregated, job.decode_cached_tokens,
            job.transfer_tokens if transfer else math.nan, job.transfer_s if transfer else math.nan,
            job.preemptions, visible, "ok" if ok else "failed", job.error,
            first - job.submit_s, (fin - first) / (out - 1) if out > 1 else math.nan,
            fin - job.submit_s, job.admit_s - job.submit_s, p50, p99, mx,
            math.nan if job.engine_queued_s is None else job.engine_queued_s,
            math.nan if job.engine_scheduled_s is None else job.engine_scheduled_s,
            parent_id, message)


def turn_row(job, names: Sequence[str], visible: bool, parent_id: str = "", message: int = 0) -> dict:
    """:func:`turn_values` as a ``{column: value}`` dict (``TURN_COLUMNS``)."""
    return dict(zip(TURN_COLUMNS, turn_values(job, names, visible, parent_id, message)))


def token_times(job) -> np.ndarray:
    """Every output token's time of a finished ``TurnJob``, s on the run clock: ``job.token_s`` where the
    backend observed it, else the first token's time followed by the cumulative ``itl_s`` gaps."""
    if len(job.token_s):
        return np.asarray(job.token_s, dtype=float)
    return job.first_token_s + np.concatenate(([0.0], np.cumsum(np.asarray(job.itl_s, dtype=float))))


def instance_values(now_s: float, info, state, power_w: float = math.nan) -> tuple:
    """One ``instances.parquet`` row (``INSTANCE_COLUMNS`` order): instance ``info`` (``InstanceInfo``) in
    ``state`` (``InstanceState``) at ``now_s`` (s); KV in tokens and as a fraction of capacity, cumulative
    energy in J, power in W (NaN where the backend does not observe it). The definition :meth:`Recorder.sample`
    and :meth:`Recorder.sample_at` buffer column by column (the same values and division; the tests compare them)."""
    kv = state.kv_used_tokens
    return (now_s, info.name, info.role, info.hardware, kv, info.kv_capacity_tokens, kv / info.kv_capacity_tokens,
            state.num_running, state.num_waiting, state.energy_j, power_w)


def instance_row(now_s: float, info, state, power_w: float = math.nan) -> dict:
    """:func:`instance_values` as a ``{column: value}`` dict (``INSTANCE_COLUMNS``)."""
    return dict(zip(INSTANCE_COLUMNS, instance_values(now_s, info, state, power_w)))


# ---- decisions: typed records ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ViewDigest:
    """What a decision saw: per-instance KV occupancy (fraction) and queued prefill tokens, and the
    number of held turns."""

    kv_used_frac: tuple[float, ...]
    queued_prefill_tokens: tuple[int, ...]
    num_held: int

    @classmethod
    def of(cls, view) -> "ViewDigest":
        """The digest of a ``ClusterView``."""
        ivs = view.instances
        return cls(tuple([i.kv_used_frac for i in ivs]), tuple([i.queued_prefill_tokens for i in ivs]), view.num_held)


@dataclass(frozen=True, slots=True)
class HoldDecision:
    """Admission held ``num_held`` turns back at ``t_s`` (logged when that number changes)."""

    t_s: float
    reason: str
    view: ViewDigest


@dataclass(frozen=True, slots=True)
class PlaceDecision:
    """One turn placed at ``t_s``: prefill and decode instance indices, the reason, and the
    ``(instance, score)`` candidates the policy compared (empty where it compares none)."""

    t_s: float
    conversation_id: str
    turn: int
    prefill_instance: int
    decode_instance: int
    reason: str
    candidates: tuple[tuple[int, float], ...]
    view: ViewDigest
    misrouted: bool = False


@dataclass(frozen=True, slots=True)
class PlanDecision:
    """A policy's plan, once at t = 0 (e.g. WAIT's fluid thresholds)."""

    t_s: float
    reason: str


def decision_row(d, names: Sequence[str]) -> dict:
    """A ``decisions.parquet`` row (``DECISION_COLUMNS``) from a typed decision record."""
    row = {"t_s": d.t_s, "kind": "", "conversation_id": "", "turn": -1, "prefill_instance": -1,
           "decode_instance": -1, "reason": d.reason, "candidates": "", "view_kv_used_frac": "",
           "view_queued_prefill_tokens": "", "num_held": 0, "misrouted": False}
    if isinstance(d, PlanDecision):
        row["kind"] = "plan"
        return row
    v = d.view
    row.update(view_kv_used_frac=",".join(f"{x:.3f}" for x in v.kv_used_frac),
               view_queued_prefill_tokens=",".join(str(x) for x in v.queued_prefill_tokens), num_held=v.num_held)
    if isinstance(d, HoldDecision):
        row["kind"] = "hold"
    else:
        row.update(kind="place", conversation_id=d.conversation_id, turn=d.turn,
                   prefill_instance=d.prefill_instance, decode_instance=d.decode_instance, misrouted=d.misrouted,
                   candidates=";".join(f"{names[i]}={s:.6g}" for i, s in d.candidates))
    return row


def decisions_frame(decisions: Sequence[Any], names: Sequence[str]) -> pd.DataFrame:
    """``decisions.parquet`` (``DECISION_COLUMNS``) from typed decision records, built column by column: the
    same frame as ``pd.DataFrame([decision_row(d, names) for d in decisions], columns=DECISION_COLUMNS)``
    without a dict per row."""
    if not decisions:
        return pd.DataFrame([], columns=DECISION_COLUMNS)
    n = len(decisions)
    t_s = [d.t_s for d in decisions]
    reason = [d.reason for d in decisions]
    kind = [""] * n
    cid = [""] * n
    turn = [-1] * n
    pre = [-1] * n
    dec = [-1] * n
    cand = [""] * n
    kv = [""] * n
    queued = [""] * n
    held = [0] * n
    mis = [False] * n
    # One %-format per tuple length instead of a formatted string per value: ``"%.3f" % x`` and
    # ``f"{x:.3f}"`` (and ``%.6g`` / ``:.6g``) are the same conversion of a float (Python's printf-style
    # formatting docs; both call ``PyOS_double_to_string``), and ``%s`` of an int or float is its ``str``.
    kv_fmt: dict[int, str] = {}
    q_fmt: dict[int, str] = {}
    c_fmt: dict[tuple, str] = {}
    for j, d in enumerate(decisions):
        if isinstance(d, PlanDecision):
            kind[j] = "plan"
            continue
        v = d.view
        x = v.kv_used_frac
        f = kv_fmt.get(len(x))
        if f is None:
            f = kv_fmt[len(x)] = ",".join(["%.3f"] * len(x))
        kv[j] = f % tuple(x)
        x = v.queued_prefill_tokens
        f = q_fmt.get(len(x))
        if f is None:
            f = q_fmt[len(x)] = ",".join(["%s"] * len(x))
        queued[j] = f % tuple(x)
        held[j] = v.num_held
        if isinstance(d, HoldDecision):
            kind[j] = "hold"
        else:
            kind[j], cid[j], turn[j], pre[j], dec[j], mis[j] = ("place", d.conversation_id, d.turn,
                                                                d.prefill_instance, d.decode_instance, d.misrouted)
            x = d.candidates
            if x:
                idx, scores = zip(*x)   # one format per instance sequence, the names in it (``%`` escaped)
                f = c_fmt.get(idx)
                if f is None:
                    f = c_fmt[idx] = ";".join([str(names[i]).replace("%", "%%") + "=%.6g" for i in idx])
                cand[j] = f % scores
    return pd.DataFrame(dict(zip(DECISION_COLUMNS, (t_s, kind, cid, turn, pre, dec, reason, cand, kv, queued, held,
                                                    mis))), columns=DECISION_COLUMNS)


# ---- the recorder ----------------------------------------------------------------------------------

class Recorder:
    """Collects the rows of one run (turns, decisions, instance samples) as they happen.

    Args:
        visible: ``(conversation_id, turn) -> bool``, whether a turn is user-visible (from the trace).
        log_decisions: keep decision records (``decisions.parquet``).
        log_tokens: keep every completed turn's output-token times (``tokens.parquet``, ``logger.steps``).
        info: ``(conversation_id, turn) -> (parent_id, message)`` for the ``parent_id`` / ``message`` columns
            (``harness.workload.workload.Oracle.info``); ``None``: ``("", 0)`` for every turn.
    ``bind(names)`` gives the instance names once the cluster is open. Turn and instance rows are kept column
    by column (:class:`ColumnStore`), the pooled ITL gaps in one buffer (:class:`ItlPool`).
    """

    def __init__(self, visible: Callable[[str, int], bool], log_decisions: bool = True, log_tokens: bool = False,
                 info: Optional[Callable[[str, int], tuple[str, int]]] = None):
        self.visible, self.log_decisions, self.log_tokens = visible, log_decisions, log_tokens
        self.info = info
        self.tokens: list[tuple[str, int, str, np.ndarray]] = []
        self.names: list[str] = []
        self._turns = ColumnStore(TURN_COLUMNS)
        self.decisions: list[Any] = []
        self._samples = ColumnStore(INSTANCE_COLUMNS)
        self._scols: list[list] = [[] for _ in INSTANCE_COLUMNS]  # instance rows not yet in _samples, by column
        self._sn = 0                            # their number (moved in by _flush_samples)
        self._consts_of, self._consts = None, None  # _instance_consts' last infos and their values
        self.itl = ItlPool()   # every completed turn's inter-token gaps, s (pooled ITL mean and percentiles)

    @property
    def turns(self) -> list[dict]:
        """``turns.parquet`` rows as dicts (``TURN_COLUMNS``), built on each access."""
        return self._turns.rows()

    @property
    def samples(self) -> list[dict]:
        """``instances.parquet`` rows as dicts (``INSTANCE_COLUMNS``), built on each access."""
        self._flush_samples()
        return self._samples.rows()

    @property
    def num_turns(self) -> int:
        """Turns recorded so far (finished or failed)."""
        return len(self._turns)

    def bind(self, names: Sequence[str]) -> None:
        """The cluster's instance names, in index order."""
        self.names = list(names)

    def turn(self, job) -> None:
        """Record a finished or failed ``TurnJob``."""
        parent, message = self.info(job.conversation_id, job.turn) if self.info is not None else ("", 0)
        self._turns.append(turn_values(job, self.names, self.visible(job.conversation_id, job.turn), parent, message))
        if not job.error and len(job.itl_s):
            self.itl.add(job.itl_s)
        if self.log_tokens and not job.error and job.first_token_s is not None:
            self.tokens.append((job.conversation_id, job.turn, self.names[job.placement.decode_instance],
                                token_times(job)))

    def itl_gaps(self) -> np.ndarray:
        """Every completed turn's inter-token gaps, pooled, s (a copy; :meth:`ItlPool.stats` needs none)."""
        return self.itl.gaps()

    def decision(self, d) -> None:
        """Record a typed decision (:class:`HoldDecision`, :class:`PlaceDecision`, :class:`PlanDecision`)."""
        if self.log_decisions:
            self.decisions.append(d)

    def sample(self, now_s: float, infos, states, power_w: Sequence[float]) -> None:
        """One ``instances.parquet`` row per instance at ``now_s`` (s): ``infos`` (``InstanceInfo``), ``states``
        (``InstanceState``) and ``power_w`` (W) per instance, in index order (as many rows as the shortest of the
        three). The rows are buffered column by column (no row object: the values :func:`instance_values` gives
        each row, the same division) and moved into the column store ``SAMPLE_BATCH`` rows at a time
        (:meth:`ColumnStore.extend_columns`: the same columns as one :meth:`ColumnStore.append` per row, at a
        fraction of its cost per row)."""
        names, roles, hws, caps = self._instance_consts(infos)
        m = min(len(names), len(states), len(power_w))
        if m < len(names):
            names, roles, hws, caps = names[:m], roles[:m], hws[:m], caps[:m]
            states = states[:m]
        kv = [st.kv_used_tokens for st in states]
        c = self._scols
        c[0].extend([now_s] * m)
        c[1].extend(names)
        c[2].extend(roles)
        c[3].extend(hws)
        c[4].extend(kv)
        c[5].extend(caps)
        c[6].extend([k / cap for k, cap in zip(kv, caps)])
        c[7].extend([st.num_running for st in states])
        c[8].extend([st.num_waiting for st in states])
        c[9].extend([st.energy_j for st in states])
        c[10].extend(power_w[:m] if m < len(power_w) else power_w)
        self._sn += m
        if self._sn >= SAMPLE_BATCH:
            self._flush_samples()

    def sample_at(self, times: Sequence[float], infos, columns, power_w: Sequence[float]) -> None:
        """:meth:`sample` at each of ``times`` (s, in order): ``columns`` holds per instance ``(kv_used_tokens,
        num_running, num_waiting, energy_j)``, ``kv_used_tokens`` and ``energy_j`` one value per time (tokens, J;
        lists), the two counts the same at all of them (requests; ``harness.sim.backend.SimBackend.observe_at``),
        ``power_w`` per instance (W) at every one of them. The same rows as one :meth:`sample` per time with those
        values (:func:`instance_values`' columns and division, in that order: per time, the instances in
        index order), buffered column by column.

        Raises:
            ValueError: a column does not hold one value per time."""
        n = len(times)
        for info, (kv, _, _, energy) in zip(infos, columns):
            if len(kv) != n or len(energy) != n:
                raise ValueError(f"sample_at: {len(kv)} KV and {len(energy)} energy values of instance "
                                 f"{info.name} for {n} times")
        names, roles, hws, caps = self._instance_consts(infos)
        m = min(len(names), len(columns), len(power_w))
        if m < len(names):
            names, roles, hws, caps = names[:m], roles[:m], hws[:m], caps[:m]
        columns = columns[:m] if m < len(columns) else columns
        power = list(power_w[:m])
        kvs = [col[0] for col in columns]
        ens = [col[3] for col in columns]
        rk = range(n)
        c = self._scols
        c[0].extend([t for t in times for _ in names])
        c[1].extend(names * n)
        c[2].extend(roles * n)
        c[3].extend(hws * n)
        c[4].extend([kv[k] for k in rk for kv in kvs])
        c[5].extend(caps * n)
        c[6].extend([kv[k] / cap for k in rk for kv, cap in zip(kvs, caps)])
        c[7].extend([col[1] for col in columns] * n)
        c[8].extend([col[2] for col in columns] * n)
        c[9].extend([e[k] for k in rk for e in ens])
        c[10].extend(power * n)
        self._sn += m * n
        if self._sn >= SAMPLE_BATCH:
            self._flush_samples()

    def _instance_consts(self, infos) -> tuple[list, list, list, list]:
        """Per instance of ``infos`` (``InstanceInfo``, index order): names, roles, hardware names and KV
        capacities (tokens), kept for the last tuple of infos seen (frozen records: the same values)."""
        if infos is not self._consts_of:
            consts = ([i.name for i in infos], [i.role for i in infos], [i.hardware for i in infos],
                      [i.kv_capacity_tokens for i in infos])
            if not isinstance(infos, tuple):
                return consts
            self._consts_of, self._consts = infos, consts
        return self._consts

    def _flush_samples(self) -> None:
        """Move the buffered instance rows into the column store."""
        if self._sn:
            self._samples.extend_columns(self._scols)
            self._scols = [[] for _ in INSTANCE_COLUMNS]
            self._sn = 0

    # ---- frames --------------------------------------------------------------------------------
    def turns_frame(self) -> pd.DataFrame:
        """``turns.parquet`` (``TURN_COLUMNS``)."""
        return self._turns.frame()

    def instances_frame(self) -> pd.DataFrame:
        """``instances.parquet`` (``INSTANCE_COLUMNS``)."""
        self._flush_samples()
        return self._samples.frame()

    def tokens_frame(self) -> pd.DataFrame:
        """``tokens.parquet`` (``TOKEN_COLUMNS``): one row per output token of every completed turn: its
        index in the turn (0 = the first token) and the time it was observed, s on the run clock."""
        if not self.tokens:
            return pd.DataFrame({c: pd.Series(dtype=d) for c, d in zip(
                TOKEN_COLUMNS, ("object", "int64", "object", "int64", "float64"))})
        n = [len(t) for _, _, _, t in self.tokens]
        return pd.DataFrame({
            "conversation_id": np.repeat([c for c, _, _, _ in self.tokens], n),
            "turn": np.repeat([k for _, k, _, _ in self.tokens], n).astype(np.int64),
            "instance": np.repeat([i for _, _, i, _ in self.tokens], n),
            "token": np.concatenate([np.arange(m, dtype=np.int64) for m in n]),
            "t_s": np.concatenate([t for _, _, _, t in self.tokens])})

    def decisions_frame(self) -> pd.DataFrame:
        """``decisions.parquet`` (``DECISION_COLUMNS``), built column by column (:func:`decision_columns`)."""
        return decisions_frame(self.decisions, self.names)


# ---- atomic files (harness.core.atomic: without numpy and pandas, for the command line's early writes) ----

def write_parquet(df: pd.DataFrame, path: Path) -> None:
    """``df`` to ``path`` as parquet (pyarrow), atomically."""
    _atomic(path, lambda tmp: df.to_parquet(tmp, index=False, engine="pyarrow"))


WRITING_RESULTS = "the run stopped while its results files were being written"


def write_run_files(out_dir: Path, turns: pd.DataFrame, conversations: pd.DataFrame, instances: pd.DataFrame,
                    decisions: Optional[pd.DataFrame], summary: dict, tokens: Optional[pd.DataFrame] = None,
                    messages: Optional[pd.DataFrame] = None) -> None:
    """Every results file of a run, ``summary.json`` first: it is small and holds the run's figures, so a disk
    that fills while the bulky parquets are written keeps it. It is first written marked
    ``partial: true`` (``error``: :data:`WRITING_RESULTS`, or the run's own error before it), so that its
    presence alone never claims the rest is there (a resume recomputes the run); then each parquet (every one
    is tried: one that cannot be written does not stop the others); then ``summary.json`` again: ``summary``
    as given when every file was written, else marked partial with an error naming each file that could not
    be written and why. ``messages.parquet`` (per user message TTFET, ``harness.analysis.metrics.message_table``)
    where given.

    Raises:
        OSError: the first results file that could not be written (``filename`` its path), after the rest.
    """
    first = summary.get("error")
    write_json({**summary, "partial": True, "error": f"{first}; {WRITING_RESULTS}" if first else WRITING_RESULTS},
               out_dir / "summary.json")
    frames = [("turns.parquet", turns), ("messages.parquet", messages), ("tokens.parquet", tokens),
              ("conversations.parquet", conversations),
              ("instances.parquet", instances), ("decisions.parquet", decisions)]
    failed: list[OSError] = []
    for name, df in frames:
        if df is None:
            continue
        try:
            write_parquet(df, out_dir / name)
        except OSError as e:   # a full disk, a size limit: the failed file's temporary is gone, the rest goes on
            failed.append(e)
    if failed:
        why = "; ".join(f"cannot write {e.filename}: {e.strerror or e}" for e in failed)
        summary = {**summary, "partial": True, "error": f"{first}; {why}" if first else why}
    write_json(summary, out_dir / "summary.json")
    if failed:
        raise failed[0]
