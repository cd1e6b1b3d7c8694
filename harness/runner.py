"""The composition root: build a run from a validated config, simulate it, write its results.

Read top to bottom: ``execute`` loads the trace, builds the workload, measures each conversation's
unloaded TTFET (the SLO denominator), builds the backend + policy + controller, runs, and writes
``summary.json``, ``turns.parquet``, ``conversations.parquet``, ``instances.parquet``,
``decisions.parquet``, ``config.yaml`` and ``meta.json`` into the run directory. If anything fails
mid-run, what was measured is still written and ``summary.json`` says ``"partial": true``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pandas as pd

from harness.config import PROJECT_ROOT, ConfigError, Resolved, scheduler_config
from harness.controller import ConversationState, Controller
from harness.metrics import TURN_COLUMNS, apply_slo, conversation_table, instance_row, summarize, ttfet_turn_index, turn_row
from harness.policy import PolicyContext, get_spec
from harness.prefix import BlockContent
from harness.sim.backend import SimBackend
from harness.trace import ConversationRecord, load_trace
from harness.workload import WorkloadStats, build_workload


log = logging.getLogger(__name__)


@dataclass
class SimResult:
    """Raw outcome of one simulation: turn rows, conversation states, instance samples, decisions,
    per-instance energy (J) over ``[0, window_end_s]``, preemptions, event count and wall time (s)."""

    turns: list[dict]
    convs: list[ConversationState]
    samples: list[dict]
    decisions: list[dict]
    energy_j: list[float]
    window_start_s: float
    window_end_s: float
    preemptions: int
    events: int
    wall_s: float
    error: str = ""
    extra: dict = dataclasses.field(default_factory=dict)


def make_policy(run: Resolved, name: str, sched_cfg: Any, controller: Controller, perf: Sequence,
                kv_capacity_tokens: Sequence[int], stats: WorkloadStats):
    """Instantiate the registered policy ``name`` for this cluster (``perf``: a ``PerfModel`` per
    instance, its hardware knowledge; capacities in tokens) and workload."""
    ctx = PolicyContext(truth=controller.truth, seed=run.cfg.seed,
                        cluster_roles=tuple(r for _, r, _ in run.instances), workload=stats,
                        perf=tuple(perf), kv_capacity_tokens=tuple(kv_capacity_tokens))
    return get_spec(name).factory(sched_cfg, ctx)


def simulate(run: Resolved, conversations: Sequence[tuple[float, ConversationRecord]], stats: WorkloadStats,
             scheduler_name: str, sched_cfg: Any, *, sample_interval_s: Optional[float] = None,
             log_decisions: bool = False, max_coalesce_s: Optional[float] = None,
             on_conversation: Optional[Callable[[ConversationState], None]] = None) -> SimResult:
    """Simulate ``conversations`` on the configured cluster under one scheduler.

    Exceptions inside the run are caught: the result then carries ``error`` and what finished.
    """
    cfg = run.cfg
    engine_cfg = cfg.engine if max_coalesce_s is None else dataclasses.replace(cfg.engine, max_coalesce_s=max_coalesce_s)
    backend = SimBackend(run.instances, cfg.model, engine_cfg, cfg.cluster.link,
                         content=BlockContent([r for _, r in conversations],
                                              shared_prefix_tokens=cfg.workload.effective_shared_prefix_tokens()))
    names = [i.name for i in backend.infos]
    rows: list[dict] = []
    convs_by_id = {r.conversation_id: r for _, r in conversations}

    def on_turn(job):
        rows.append(turn_row(job, names, convs_by_id[job.conversation_id].turns[job.turn].visible))

    controller = Controller(backend.clock, backend, None, conversations,  # policy set below
                            link_bandwidth_bytes_per_s=cfg.cluster.link.bandwidth_bytes_per_s,
                            link_latency_s=cfg.cluster.link.latency_s,
                            kv_bytes_per_token=cfg.model.kv_bytes_per_token, on_turn=on_turn,
                            on_conversation=on_conversation or (lambda c: None), log_decisions=log_decisions)
    controller.policy = make_policy(run, scheduler_name, sched_cfg, controller, backend.perf,
                                    [i.kv_capacity_tokens for i in backend.infos], stats)
    samples: list[dict] = []
    clock = backend.clock
    plan = getattr(controller.policy, "plan_note", "")
    if plan and log_decisions:  # a policy's plan (e.g. WAIT's fluid thresholds), once, at t = 0
        controller.decisions.append({"t_s": 0.0, "kind": "plan", "conversation_id": "", "turn": -1,
                                     "prefill_instance": -1, "decode_instance": -1, "reason": plan,
                                     "view_kv_used_frac": "", "view_queued_prefill_tokens": "", "num_held": 0})

    def sample():
        now = clock.now()
        for info, st in zip(backend.infos, backend.observe()):
            samples.append(instance_row(now, info, st))
        if not controller.finished and clock.pending():  # nothing else queued: a stall, not a wait
            clock.call_at(now + sample_interval_s, sample, priority=2)

    controller.start()
    if sample_interval_s:
        clock.call_at(0.0, sample, priority=2)
    t0 = time.perf_counter()
    error = ""
    try:
        backend.run()
        if not controller.finished:
            error = f"simulation stalled: {len(conversations) - controller.num_done} conversations unfinished"
    except Exception as e:  # keep what was measured; the caller marks the run partial
        error = f"{type(e).__name__}: {e}"
    wall = time.perf_counter() - t0
    end = max([c.finish_s for c in controller.convs if c.done] or [clock.now()])
    start = min((t for t, _ in conversations), default=0.0)
    energy = [backend.energy_j(i, end) for i in range(len(backend.engines))]
    return SimResult(rows, controller.convs, samples, controller.decisions, energy, start, end,
                     sum(e.preemptions for e in backend.engines), clock.events, wall, error,
                     {"policy_plan": plan} if plan else {})


def check_policies(run: Resolved, conversations, stats: WorkloadStats) -> None:
    """Build the run's policy (and the SLO reference policy) once on an idle simulated cluster, so a
    policy that rejects its config or the cluster (e.g. no prefiller) fails before anything runs.

    Raises:
        ConfigError: naming the scheduler and the factory's message.
    """
    names = [(run.scheduler_name, run.scheduler)]
    if run.cfg.slo.ttfet_mode == "relative":
        ref = run.cfg.slo.reference_scheduler
        names.append((ref, scheduler_config(ref, {"name": ref})))
    for name, sched_cfg in names:
        try:
            backend = SimBackend(run.instances, run.cfg.model, run.cfg.engine, run.cfg.cluster.link)
            controller = Controller(backend.clock, backend, None, conversations[:1], link_bandwidth_bytes_per_s=1.0,
                                    link_latency_s=0.0, kv_bytes_per_token=1, on_turn=lambda j: None,
                                    on_conversation=lambda c: None)
            make_policy(run, name, sched_cfg, controller, backend.perf,
                        [i.kv_capacity_tokens for i in backend.infos], stats)
        except ValueError as e:
            what = "scheduler" if name == run.scheduler_name else "slo.reference_scheduler"
            raise ConfigError(f"{what} ({name}): {e}") from None


def unloaded_ttfet(run: Resolved, conversations: Sequence[tuple[float, ConversationRecord]],
                   stats: WorkloadStats) -> dict[str, float]:
    """Each conversation's TTFET when replayed alone (arrival at 0) on the idle cluster under the SLO's
    reference scheduler, s. This is the denominator of the relative TTFET SLO."""
    slo = run.cfg.slo
    ref = scheduler_config(slo.reference_scheduler, {"name": slo.reference_scheduler})
    key = _unloaded_cache_key(run, stats)
    out = {}
    for _, rec in conversations:
        hit = _UNLOADED_CACHE.get((key, rec.turns))
        if hit is not None:
            out[rec.conversation_id] = hit
            continue
        res = simulate(run, [(0.0, rec)], stats, slo.reference_scheduler, ref, max_coalesce_s=math.inf)
        k = ttfet_turn_index([t.visible for t in rec.turns], slo.ttfet_definition)
        first = [r["first_token_s"] for r in res.turns if r["turn"] == k and r["status"] == "ok"]
        out[rec.conversation_id] = first[0] if first else math.nan
        if len(_UNLOADED_CACHE) >= _UNLOADED_CACHE_MAX:
            _UNLOADED_CACHE.clear()
        _UNLOADED_CACHE[(key, rec.turns)] = out[rec.conversation_id]
    return out


# In-process memo of unloaded TTFETs, s: ``(setup key, a conversation's turns) -> TTFET``. An unloaded replay
# depends only on the conversation's turns and the setup below, so a sweep over rates, variants or seeds
# in one process (Hydra's basic launcher, or one joblib worker) replays each distinct conversation once.
_UNLOADED_CACHE: dict[tuple, float] = {}
_UNLOADED_CACHE_MAX = 200_000
# Reference schedulers whose placement reads neither the workload statistics nor the seed.
_STATS_FREE_REFERENCES = ("collocated",)


def _unloaded_cache_key(run: Resolved, stats: WorkloadStats) -> str:
    """What an unloaded replay depends on besides the conversation: instances (hardware), model, engine,
    link, backend, reference scheduler, TTFET definition (and the workload stats when the reference
    scheduler may read them)."""
    cfg, slo = run.cfg, run.cfg.slo
    parts = [run.instances, cfg.model, cfg.engine, cfg.cluster.link, cfg.backend.name, slo.reference_scheduler,
             slo.ttfet_definition]
    if slo.reference_scheduler not in _STATS_FREE_REFERENCES:
        parts += [cfg.seed, stats.rate_per_s, stats.mean_turns,
                  *(a.tobytes() for a in (stats.turn_prompt_tokens, stats.turn_new_tokens,
                                          stats.turn_output_tokens, stats.tool_time_s))]
    return repr(parts)


def code_version() -> dict:
    """Git sha and dirty flag of the project (``unknown`` outside a git checkout)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    try:
        return {"git_sha": git("rev-parse", "HEAD") or "unknown", "git_dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": "unknown", "git_dirty": None}


def package_versions() -> dict:
    """Versions of the packages a run depends on."""
    from importlib import metadata
    out = {"python": sys.version.split()[0]}
    for p in ("hydra-core", "omegaconf", "numpy", "pandas", "pyarrow", "tqdm"):
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def _write_parquet(df: pd.DataFrame, path: Path) -> None:
    df.to_parquet(path, index=False, engine="pyarrow")


def execute(run: Resolved, out_dir: Path, resolved_yaml: str = "") -> dict:
    """Run the configured experiment and write its results into ``out_dir``; returns the summary.

    Raises:
        TraceError: the trace is missing or malformed (before anything runs).
        ConfigError: the workload or the scheduler rejects the config (before anything runs).
        RuntimeError: the simulation failed; results up to the failure are written first.
    """
    cfg = run.cfg
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    synthetic = cfg.workload.kind == "synthetic"
    records = [] if synthetic else load_trace(run.trace_path)
    source = "synthetic prompt types" if synthetic else run.trace_path.name
    try:
        conversations, stats = build_workload(records, cfg.workload)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_policies(run, conversations, stats)
    if resolved_yaml:
        (out_dir / "config.yaml").write_text(resolved_yaml)
    meta = {"code": code_version(), "packages": package_versions(), "platform": platform.platform(),
            "instances": [{"name": n, "role": r, "hardware": dataclasses.asdict(h)} for n, r, h in run.instances],
            "model": dataclasses.asdict(cfg.model), "workload_source": "synthetic" if synthetic else str(run.trace_path)}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    log.info("workload: %d conversations, %d turns from %s", len(conversations),
             sum(len(r.turns) for _, r in conversations), source)
    unloaded = None
    if cfg.slo.ttfet_mode == "relative":
        log.info("SLO baseline: replaying each conversation alone under %s", cfg.slo.reference_scheduler)
        unloaded = unloaded_ttfet(run, conversations, stats)

    bar = None
    if cfg.logger.progress:
        from tqdm import tqdm
        bar = tqdm(total=len(conversations), unit="conv", desc=f"{run.scheduler_name}", mininterval=0.5,
                   leave=False)
    on_conv = (lambda c: bar.update(1)) if bar else None
    if cfg.backend.name == "vllm":
        from harness.vllm.replay import replay
        res = replay(run, conversations, stats, out_dir, on_conversation=on_conv)
    else:
        res = simulate(run, conversations, stats, run.scheduler_name, run.scheduler,
                       sample_interval_s=cfg.logger.metrics_interval_s, log_decisions=cfg.logger.log_decisions,
                       on_conversation=on_conv)
    if bar:
        bar.close()
    log.info("%s run: %d events in %.2f s of wall time", cfg.backend.name, res.events, res.wall_s)
    if res.extra.get("policy_plan"):
        log.info("%s plan: %s", run.scheduler_name, res.extra["policy_plan"])
    turns = pd.DataFrame(res.turns, columns=TURN_COLUMNS)
    conv = apply_slo(conversation_table(turns, res.convs, cfg.slo.ttfet_definition), cfg.slo, unloaded)
    summary = summarize(turns, conv, res.energy_j, res.window_end_s - res.window_start_s, res.preemptions)
    summary.update({
        "scheduler": run.scheduler_name, "cluster": cfg.cluster.name, "model": cfg.model.name,
        "workload": cfg.workload.name if synthetic else run.trace_path.name,
        "workload_rate_per_s": cfg.workload.rate_per_s, "seed": cfg.workload.seed,
        "partial": bool(res.error), "error": res.error,
        "sim_events": res.events, "sim_wall_s": res.wall_s, "total_wall_s": time.perf_counter() - t_start,
        "sim_turns_per_wall_s": len(turns) / res.wall_s if res.wall_s > 0 else math.nan,
        "backend": cfg.backend.name, **res.extra,
    })
    _write_parquet(turns, out_dir / "turns.parquet")
    _write_parquet(conv, out_dir / "conversations.parquet")
    _write_parquet(pd.DataFrame(res.samples), out_dir / "instances.parquet")
    if cfg.logger.log_decisions:
        _write_parquet(pd.DataFrame(res.decisions), out_dir / "decisions.parquet")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=True))
    if res.error:
        raise RuntimeError(f"run failed ({res.error}); partial results written to {out_dir}")
    return summary


SUMMARY_ROWS = [("conversations", "num_conversations", "{:.0f}"), ("turns", "num_turns", "{:.0f}"),
                ("TTFET p50 (s)", "ttfet_p50_s", "{:.2f}"), ("TTFET p95 (s)", "ttfet_p95_s", "{:.2f}"),
                ("TTFT p95 (s)", "ttft_p95_s", "{:.3f}"), ("TPOT p50 (ms)", "tpot_p50_s", "ms"),
                ("SLO attainment", "slo_attainment", "{:.3f}"), ("goodput (conv/s)", "goodput_conv_per_s", "{:.4f}"),
                ("preemptions", "preemptions", "{:.0f}"), ("prefix hit frac", "prefix_hit_frac", "{:.3f}"),
                ("energy (kJ)", "energy_j", "kJ"), ("tokens served / J", "tokens_per_joule", "{:.1f}"),
                ("output tokens / J", "output_tokens_per_joule", "{:.3f}"), ("run wall (s)", "sim_wall_s", "{:.1f}")]


def fmt(key_fmt: str, v: Any) -> str:
    """Format one summary value for the printed tables."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "nan"
    if key_fmt == "ms":
        return f"{v * 1e3:.2f}"
    if key_fmt == "kJ":
        return f"{v / 1e3:.1f}"
    return key_fmt.format(v)


def summary_table(summaries: dict[str, dict]) -> str:
    """A markdown table: one column per run (label -> summary), one row per headline metric."""
    labels = list(summaries)
    lines = ["| metric | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for title, key, f in SUMMARY_ROWS:
        lines.append(f"| {title} | " + " | ".join(fmt(f, summaries[l].get(key)) for l in labels) + " |")
    return "\n".join(lines)
