"""What a run costs the machine: CPU seconds, clock events per LLM call and peak memory (``summary.json``'s
``cost_*`` keys), the cost per variant of a sweep (``comparison.md``, ``report.md``), and a sweep's expected
CPU-hours before it starts (docs/speed.md, "Cost accounting").

Every figure is read from the kernel's accounting, which a shared machine does not distort the way it
distorts wall time (``getrusage(2)``; Python's ``resource`` and ``time.process_time``):

* ``cost_loop_cpu_s``: CPU (user + system, every thread of this process; ``time.process_time``) while the
  session's loop ran (``harness.run.session.run_session``'s drive: the simulation loop, or on
  ``backend=vllm`` the client's side of the real run), s;
* ``cost_run_cpu_s``: this process's CPU from the start of ``harness.run.runner.execute`` (the start-up
  checks, the SLO baseline's replays, the loop, the frames and metrics) to the summary, s; the result files'
  writing comes after it and is not counted;
* ``cost_process_cpu_s``: this process's CPU since it started (imports and Hydra's composes included), at
  the summary, s. In a sweep whose jobs share a process (Hydra's basic launcher, a joblib worker) it
  includes the earlier jobs of that process: compare ``cost_run_cpu_s`` across jobs;
* ``cost_children_cpu_s``: CPU of the child processes that ended and were waited for during the run
  (``RUSAGE_CHILDREN``: launched ``vllm serve`` instances once stopped, the ``git`` calls of ``meta.json``), s;
* ``cost_peak_rss_bytes``: the process's peak resident set size so far, bytes (``ru_maxrss``, which Linux
  reports in kilobytes -- getrusage(2): "ru_maxrss (since Linux 2.6.32) This is the maximum resident set
  size used (in kilobytes)" -- and macOS in bytes). The children's peak is not reported: a child forked
  from this process counts the parent's pages as its own until it execs, so ``RUSAGE_CHILDREN``'s
  ``ru_maxrss`` after a ``git`` call is this process's size, not git's;
* ``cost_events_per_call``: the run's clock events (``sim_events``) per LLM call (turns completed + failed).
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

# ru_maxrss's unit: kilobytes (KiB) on Linux (getrusage(2)), bytes on macOS (getrusage(2) of Darwin)
RSS_UNIT_BYTES = 1 if sys.platform == "darwin" else 1024

COST_KEYS = ("cost_loop_cpu_s", "cost_run_cpu_s", "cost_process_cpu_s", "cost_children_cpu_s",
             "cost_peak_rss_bytes", "cost_events_per_call")
# The summary.json keys that differ between two executions of one run (same config, trace, code): the wall
# clock's and the cost's. Everything else is a function of the run (tests/test_executor.py).
VOLATILE_KEYS = ("sim_wall_s", "total_wall_s", "sim_turns_per_wall_s", *COST_KEYS)


@dataclass(frozen=True)
class CpuMark:
    """CPU counters at one instant: this process's (``self_s``) and its waited-for children's
    (``children_s``), user + system, s."""

    self_s: float
    children_s: float


def cpu_mark() -> CpuMark:
    """The CPU counters now (``resource.getrusage``: ``RUSAGE_SELF`` and ``RUSAGE_CHILDREN``, user + system)."""
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return CpuMark(me.ru_utime + me.ru_stime, ch.ru_utime + ch.ru_stime)


def run_cost(start: CpuMark, loop_cpu_s: float, events: int, calls: int) -> dict:
    """The ``cost_*`` keys of a run's summary (module docstring): ``start`` the mark taken when the run
    began, ``loop_cpu_s`` the loop's CPU (s), ``events`` its clock events, ``calls`` its LLM calls (turns
    completed + failed); ``cost_events_per_call`` is NaN without a call."""
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    self_s, children_s = me.ru_utime + me.ru_stime, ch.ru_utime + ch.ru_stime
    return {"cost_loop_cpu_s": float(loop_cpu_s), "cost_run_cpu_s": self_s - start.self_s,
            "cost_process_cpu_s": self_s, "cost_children_cpu_s": children_s - start.children_s,
            "cost_peak_rss_bytes": int(me.ru_maxrss) * RSS_UNIT_BYTES,
            "cost_events_per_call": events / calls if calls else math.nan}


# ---- the cost of a sweep, per variant --------------------------------------------------------------------


def _num(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x if math.isfinite(x) else math.nan


def cost_table(rows: Iterable[tuple[str, Mapping[str, Any]]]) -> str:
    """A markdown table of what each variant cost: ``rows`` are ``(variant, summary)`` pairs, one per run
    (a summary without ``cost_run_cpu_s``, an older run's, is counted under "runs" only). Columns: runs;
    CPU s of the runs summed (``cost_run_cpu_s``) and its share of the sweep's; the mean per run of run CPU
    and loop CPU (s); the mean events per LLM call; the largest peak RSS (MiB). ``""`` when no run has a
    cost."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for variant, s in rows:
        groups.setdefault(str(variant), []).append(s)
    total = sum(_num(s.get("cost_run_cpu_s")) for g in groups.values() for s in g
                if math.isfinite(_num(s.get("cost_run_cpu_s"))))
    if not total > 0:
        return ""
    lines = ["| variant | runs | CPU s, runs summed | share of the sweep's CPU | CPU s per run | loop CPU s per run "
             "| events per call | peak RSS (MiB) |", "|---|---|---|---|---|---|---|---|"]

    def mean(xs: list[float]) -> str:
        xs = [x for x in xs if math.isfinite(x)]
        return f"{statistics.fmean(xs):.3g}" if xs else "nan"
    for variant, g in groups.items():
        run = [_num(s.get("cost_run_cpu_s")) for s in g]
        costed = [x for x in run if math.isfinite(x)]
        rss = [x for x in (_num(s.get("cost_peak_rss_bytes")) for s in g) if math.isfinite(x)]
        rss_mib = f"{max(rss) / 2 ** 20:.0f}" if rss else "nan"
        lines.append(f"| {variant} | {len(g)}{'' if len(costed) == len(g) else f' ({len(costed)} with a cost)'} "
                     f"| {sum(costed):.1f} | {sum(costed) / total:.1%} | {mean(run)} "
                     f"| {mean([_num(s.get('cost_loop_cpu_s')) for s in g])} "
                     f"| {mean([_num(s.get('cost_events_per_call')) for s in g])} | {rss_mib} |")
    lines.append(f"\nCPU s: `summary.json`'s `cost_run_cpu_s` (the run's own CPU, without the process's imports and "
                 f"Hydra); {total:.1f} s in all, {total / 3600:.3g} CPU-hours (docs/speed.md, \"Cost accounting\").")
    return "\n".join(lines)


# ---- a sweep's expected cost, before it starts -----------------------------------------------------------

# The stated per-variant model (docs/speed.md, "Cost accounting"): ``cost_run_cpu_s`` per conversation run, by
# scheduler, measured on the shipped SWE-bench trace (a40_1p3d, Qwen3-0.6B, ``+experiment=conserve_rate_sweep``:
# ``benchmarks/sweep_slice.py``, 95 conversations a run after the context limit, 0.02 and 0.1 conv/s, seed 0,
# 2026-12-06, the 2-core machine at a load average of 5-11, which inflates CPU seconds), as
# ``(mean cost_run_cpu_s - MODEL_FIXED_CPU_S) / 95``; MODEL_FIXED_CPU_S is the ``cost_run_cpu_s`` of a
# 6-conversation run (0.14 s collocated, 0.19 s WAIT). A scheduler not listed takes DEFAULT_CPU_S_PER_CONVERSATION.
MODEL_CPU_S_PER_CONVERSATION: Mapping[str, float] = {
    "conserve": 0.027, "ampd": 0.034, "collocated": 0.025, "disaggregated": 0.032,
    "wait": 0.17, "nested_wait": 0.13,
}
DEFAULT_CPU_S_PER_CONVERSATION = 0.17   # the costliest measured variant: never an optimistic guess
MODEL_FIXED_CPU_S = 0.15


@dataclass(frozen=True)
class JobShape:
    """What the cost of a sweep job is keyed on: the summary's ``scheduler``, ``cluster``, ``model``,
    ``workload`` (the trace file's name or the synthetic workload's), ``workload_rate_per_s`` (conv/s;
    NaN for trace-timed arrivals) and ``num_conversations``."""

    scheduler: str
    cluster: str
    model: str
    workload: str
    rate_per_s: float
    num_conversations: int

    @classmethod
    def of_summary(cls, s: Mapping[str, Any]) -> "JobShape":
        return cls(str(s.get("scheduler")), str(s.get("cluster")), str(s.get("model")), str(s.get("workload")),
                   _num(s.get("workload_rate_per_s")), int(_num(s.get("num_conversations")) or 0)
                   if math.isfinite(_num(s.get("num_conversations"))) else 0)

    def key(self, with_rate: bool) -> tuple:
        base = (self.scheduler, self.cluster, self.model, self.workload, self.num_conversations)
        return (*base, round(self.rate_per_s, 9) if with_rate and math.isfinite(self.rate_per_s) else None)


def prior_costs(roots: Sequence[Path], limit: int = 5000) -> list[Mapping[str, Any]]:
    """The summaries of complete earlier runs with a ``cost_run_cpu_s`` under ``roots`` (each root's
    ``*/summary.json`` and ``*/*/summary.json``: a runs folder, a sweeps folder), at most ``limit`` files
    read (the newest first); unreadable files are skipped."""
    files: list[Path] = []
    for root in roots:
        if Path(root).is_dir():
            files += list(Path(root).glob("*/summary.json")) + list(Path(root).glob("*/*/summary.json"))
    try:
        files.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        pass
    out = []
    for f in files[:limit]:
        try:
            s = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(s, dict) and not s.get("partial") and math.isfinite(_num(s.get("cost_run_cpu_s"))):
            out.append(s)
    return out


def expected_cpu_s(jobs: Sequence[JobShape], prior: Sequence[Mapping[str, Any]]) -> tuple[float, int, int]:
    """The expected CPU s of ``jobs`` and how many were estimated from prior runs and from the model:
    ``(cpu_s, from_prior, from_model)``. A job takes the median ``cost_run_cpu_s`` of the prior runs of the
    same :class:`JobShape` (the same rate if there is one, else any rate), otherwise the stated model,
    ``MODEL_FIXED_CPU_S + c(scheduler) x num_conversations`` (:data:`MODEL_CPU_S_PER_CONVERSATION`)."""
    by_key: dict[tuple, list[float]] = {}
    for s in prior:
        shape = JobShape.of_summary(s)
        for with_rate in (True, False):
            by_key.setdefault(shape.key(with_rate), []).append(_num(s["cost_run_cpu_s"]))
    total, n_prior, n_model = 0.0, 0, 0
    for j in jobs:
        xs = by_key.get(j.key(True)) or by_key.get(j.key(False))
        if xs:
            total += statistics.median(xs)
            n_prior += 1
        else:
            total += MODEL_FIXED_CPU_S + MODEL_CPU_S_PER_CONVERSATION.get(
                j.scheduler, DEFAULT_CPU_S_PER_CONVERSATION) * j.num_conversations
            n_model += 1
    return total, n_prior, n_model


def expected_cost_line(jobs: Sequence[JobShape], roots: Sequence[Path], parallel: int = 1) -> str:
    """The line a multirun prints before it starts: the expected CPU-hours of ``jobs`` (:func:`expected_cpu_s`
    over the prior runs under ``roots``) and the wall time that is at least on ``parallel`` jobs at once."""
    prior = prior_costs(roots)
    cpu, n_prior, n_model = expected_cpu_s(jobs, prior)
    parallel = max(1, int(parallel))
    where = ", ".join(str(r) for r in roots if Path(r).is_dir()) or "none found"
    return (f"expected cost: {cpu / 3600:.3g} CPU-hours for {len(jobs)} jobs ({n_prior} from {len(prior)} prior "
            f"runs' cost_run_cpu_s in {where}, {n_model} from the per-variant model of docs/speed.md \"Cost "
            f"accounting\"; imports and Hydra's composes not counted, ~1-2 CPU s a process); at least "
            f"{cpu / 3600 / parallel:.3g} h of wall on {parallel} parallel job{'s' if parallel > 1 else ''}"
            f" ({os.cpu_count() or 1} cores here)")
