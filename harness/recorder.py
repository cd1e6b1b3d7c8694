"""The recorder: every output row of a run and its schema, the same on every backend.

A run directory holds ``turns.parquet`` (``TURN_COLUMNS``), ``conversations.parquet``
(``harness.metrics.CONVERSATION_COLUMNS`` + SLO columns), ``instances.parquet`` (``INSTANCE_COLUMNS``),
``decisions.parquet`` (``DECISION_COLUMNS``: typed hold / place / plan records), ``summary.json``, and with
``logger.steps`` ``tokens.parquet`` (``TOKEN_COLUMNS``: every output token's time).
A column a backend cannot observe is null there (NaN), never dropped; ``docs/metrics.md`` says which.
Files are written atomically (a temporary file renamed into place), so an interrupted write never
leaves a truncated file.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd

TURN_COLUMNS = ["conversation_id", "turn", "submit_s", "admit_s", "start_s", "prefill_done_s", "first_token_s",
                "finish_s", "prompt_tokens", "cached_tokens", "prefill_computed_tokens", "output_tokens",
                "prefill_instance", "decode_instance", "disaggregated", "decode_cached_tokens", "transfer_tokens",
                "transfer_s", "preemptions", "visible", "status", "error", "ttft_s", "tpot_s", "e2e_s", "queue_s",
                "itl_p50_s", "itl_p99_s", "itl_max_s"]
INSTANCE_COLUMNS = ["t_s", "instance", "role", "hardware", "kv_used_tokens", "kv_capacity_tokens", "kv_used_frac",
                    "num_running", "num_waiting", "energy_j", "power_w"]
TOKEN_COLUMNS = ["conversation_id", "turn", "instance", "token", "t_s"]
DECISION_COLUMNS = ["t_s", "kind", "conversation_id", "turn", "prefill_instance", "decode_instance", "reason",
                    "candidates", "view_kv_used_frac", "view_queued_prefill_tokens", "num_held", "misrouted"]


def sorted_percentile(a: np.ndarray, q: float) -> float:
    """The ``q``-th percentile (0-100) of an ascending-sorted array, linearly interpolated between the two
    nearest ranks: numpy's default (``method="linear"``) rule, ``a[i] + (a[i+1] - a[i]) * frac`` at rank
    ``(n - 1) * q / 100`` -- computed directly, as ``np.percentile`` costs ~100 us per call."""
    r = (len(a) - 1) * q / 100.0
    i = int(r)
    if i + 1 >= len(a):
        return float(a[-1])
    return float(a[i] + (a[i + 1] - a[i]) * (r - i))


def _itl_stats(itl_s: Sequence[float]) -> tuple[float, float, float]:
    """p50, p99 and max of a turn's inter-token gaps, s (NaN for fewer than one gap)."""
    if len(itl_s) == 0:
        return math.nan, math.nan, math.nan
    a = np.sort(np.asarray(itl_s, dtype=float))
    return sorted_percentile(a, 50), sorted_percentile(a, 99), float(a[-1])


def turn_row(job, names: Sequence[str], visible: bool) -> dict:
    """One ``turns.parquet`` row from a finished or failed ``TurnJob`` (instance names from ``names``).

    Times in s; TTFT = first token - submit, TPOT = (finish - first token) / (output - 1),
    E2E = finish - submit, queue = admit - submit; ITL p50/p99/max over the turn's token gaps.
    """
    ok = not job.error
    first = job.first_token_s if job.first_token_s is not None else math.nan
    fin = job.finish_s if job.finish_s is not None else math.nan
    out = job.output_tokens
    p50, p99, mx = _itl_stats(job.itl_s)
    return {
        "conversation_id": job.conversation_id, "turn": job.turn, "submit_s": job.submit_s,
        "admit_s": job.admit_s, "start_s": job.start_s,
        "prefill_done_s": job.prefill_done_s if job.prefill_done_s is not None else math.nan,
        "first_token_s": first, "finish_s": fin, "prompt_tokens": job.prompt_tokens,
        "cached_tokens": job.cached_tokens, "prefill_computed_tokens": job.prefill_computed_tokens,
        "output_tokens": out if ok else 0,
        "prefill_instance": names[job.placement.prefill_instance],
        "decode_instance": names[job.placement.decode_instance],
        "disaggregated": job.placement.disaggregated, "decode_cached_tokens": job.decode_cached_tokens,
        "transfer_tokens": job.transfer_tokens if job.transfer_tokens >= 0 else math.nan,
        "transfer_s": job.transfer_s if job.transfer_tokens >= 0 else math.nan, "preemptions": job.preemptions,
        "visible": visible, "status": "ok" if ok else "failed", "error": job.error,
        "ttft_s": first - job.submit_s, "tpot_s": (fin - first) / (out - 1) if out > 1 else math.nan,
        "e2e_s": fin - job.submit_s, "queue_s": job.admit_s - job.submit_s,
        "itl_p50_s": p50, "itl_p99_s": p99, "itl_max_s": mx,
    }


def token_times(job) -> np.ndarray:
    """Every output token's time of a finished ``TurnJob``, s on the run clock: ``job.token_s`` where the
    backend observed it, else the first token's time followed by the cumulative ``itl_s`` gaps."""
    if len(job.token_s):
        return np.asarray(job.token_s, dtype=float)
    return job.first_token_s + np.concatenate(([0.0], np.cumsum(np.asarray(job.itl_s, dtype=float))))


def instance_row(now_s: float, info, state, power_w: float = math.nan) -> dict:
    """One ``instances.parquet`` row: instance ``info`` (``InstanceInfo``) in ``state``
    (``InstanceState``) at ``now_s`` (s); KV in tokens and as a fraction of capacity, cumulative energy
    in J, power in W (NaN where the backend does not observe it)."""
    return {"t_s": now_s, "instance": info.name, "role": info.role, "hardware": info.hardware,
            "kv_used_tokens": state.kv_used_tokens, "kv_capacity_tokens": info.kv_capacity_tokens,
            "kv_used_frac": state.kv_used_tokens / info.kv_capacity_tokens,
            "num_running": state.num_running, "num_waiting": state.num_waiting, "energy_j": state.energy_j,
            "power_w": power_w}


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
        return cls(tuple(i.kv_used_frac for i in view.instances),
                   tuple(i.queued_prefill_tokens for i in view.instances), view.num_held)


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


# ---- the recorder ----------------------------------------------------------------------------------

class Recorder:
    """Collects the rows of one run (turns, decisions, instance samples) as they happen.

    Args:
        visible: ``(conversation_id, turn) -> bool``, whether a turn is user-visible (from the trace).
        log_decisions: keep decision records (``decisions.parquet``).
        log_tokens: keep every completed turn's output-token times (``tokens.parquet``, ``logger.steps``).
    ``bind(names)`` gives the instance names once the cluster is open.
    """

    def __init__(self, visible: Callable[[str, int], bool], log_decisions: bool = True, log_tokens: bool = False):
        self.visible, self.log_decisions, self.log_tokens = visible, log_decisions, log_tokens
        self.tokens: list[tuple[str, int, str, np.ndarray]] = []
        self.names: list[str] = []
        self.turns: list[dict] = []
        self.decisions: list[Any] = []
        self.samples: list[dict] = []
        self.itl: list[np.ndarray] = []   # every completed turn's inter-token gaps, s (pooled ITL percentiles)

    def bind(self, names: Sequence[str]) -> None:
        """The cluster's instance names, in index order."""
        self.names = list(names)

    def turn(self, job) -> None:
        """Record a finished or failed ``TurnJob``."""
        self.turns.append(turn_row(job, self.names, self.visible(job.conversation_id, job.turn)))
        if not job.error and len(job.itl_s):
            self.itl.append(np.asarray(job.itl_s, dtype=float))
        if self.log_tokens and not job.error and job.first_token_s is not None:
            self.tokens.append((job.conversation_id, job.turn, self.names[job.placement.decode_instance],
                                token_times(job)))

    def itl_gaps(self) -> np.ndarray:
        """Every completed turn's inter-token gaps, pooled, s."""
        return np.concatenate(self.itl) if self.itl else np.empty(0)

    def decision(self, d) -> None:
        """Record a typed decision (:class:`HoldDecision`, :class:`PlaceDecision`, :class:`PlanDecision`)."""
        if self.log_decisions:
            self.decisions.append(d)

    def sample(self, now_s: float, infos, states, power_w: Sequence[float]) -> None:
        """One ``instances.parquet`` row per instance at ``now_s`` (s)."""
        for info, st, p in zip(infos, states, power_w):
            self.samples.append(instance_row(now_s, info, st, p))

    # ---- frames --------------------------------------------------------------------------------
    def turns_frame(self) -> pd.DataFrame:
        """``turns.parquet`` (``TURN_COLUMNS``)."""
        return pd.DataFrame(self.turns, columns=TURN_COLUMNS)

    def instances_frame(self) -> pd.DataFrame:
        """``instances.parquet`` (``INSTANCE_COLUMNS``)."""
        return pd.DataFrame(self.samples, columns=INSTANCE_COLUMNS)

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
        """``decisions.parquet`` (``DECISION_COLUMNS``)."""
        return pd.DataFrame([decision_row(d, self.names) for d in self.decisions], columns=DECISION_COLUMNS)


# ---- atomic files ----------------------------------------------------------------------------------

def process_umask() -> int:
    """The process's file-mode creation mask, read without changing it where Linux shows it
    (``/proc/self/status``, ``Umask:``), else by setting and restoring it (``os.umask``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _atomic(path: Path, write: Callable[[str], None]) -> None:
    """Write through a temporary file in the same directory, then rename it into place. The file gets the
    mode a plain ``open(path, "w")`` would give it (``0o666`` less the process umask), not ``mkstemp``'s
    private ``0o600``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~process_umask())
    finally:
        os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    """``df`` to ``path`` as parquet (pyarrow), atomically."""
    _atomic(path, lambda tmp: df.to_parquet(tmp, index=False, engine="pyarrow"))


def strict_json(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, inf) replaced by ``None``, so the JSON is strict (RFC 8259
    has no NaN; strict parsers reject it): a missing value stays missing, never 0."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if isinstance(obj, np.generic):
        return strict_json(obj.item())
    return obj


def write_json(obj: Any, path: Path) -> None:
    """``obj`` to ``path`` as indented strict JSON (non-finite numbers as ``null``), atomically."""
    def w(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(json.dumps(strict_json(obj), indent=2, allow_nan=False))
    _atomic(path, w)


def write_text(text: str, path: Path) -> None:
    """``text`` to ``path``, atomically."""
    def w(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)
    _atomic(path, w)


def write_run_files(out_dir: Path, turns: pd.DataFrame, conversations: pd.DataFrame, instances: pd.DataFrame,
                    decisions: Optional[pd.DataFrame], summary: dict, tokens: Optional[pd.DataFrame] = None) -> None:
    """Every results file of a run (``summary.json`` last, so its presence means the rest is there)."""
    write_parquet(turns, out_dir / "turns.parquet")
    if tokens is not None:
        write_parquet(tokens, out_dir / "tokens.parquet")
    write_parquet(conversations, out_dir / "conversations.parquet")
    write_parquet(instances, out_dir / "instances.parquet")
    if decisions is not None:
        write_parquet(decisions, out_dir / "decisions.parquet")
    write_json(summary, out_dir / "summary.json")
