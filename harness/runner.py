"""Execute a run from a validated config: load and check everything, open the backend, run one
session, write its results.

Read top to bottom: ``execute`` loads the trace, builds the workload, builds the run's policies once to
check them (``harness.session.check_policies``), writes ``config.yaml`` and ``meta.json``, measures each
conversation's unloaded TTFET when the SLO is relative, opens the configured backend (a plug-in,
``harness.backend.get_backend``), runs one session (``harness.session.run_session``), and writes
``summary.json``, ``turns.parquet``, ``conversations.parquet``, ``instances.parquet`` and
``decisions.parquet`` (``harness.recorder``). If anything fails midway, what was measured is still
written and ``summary.json`` says ``"partial": true`` with the error.
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
import traceback
from pathlib import Path
from typing import Optional

from harness.backend import get_backend
from harness.config import PROJECT_ROOT, ConfigError, Resolved
from harness.controller import ConversationState
from harness.goodput import goodput_summary
from harness.metrics import apply_slo, conversation_table, summarize
from harness.recorder import Recorder, write_json, write_run_files, write_text
from harness.session import SessionResult, check_policies, context_limit, run_session, unloaded_readings
from harness.trace import load_trace
from harness.validity import failures_by_reason, serving_metrics, verdict
from harness.workload import Oracle, build_workload

log = logging.getLogger(__name__)


def code_version() -> dict:
    """Git sha and dirty flag of the project, read only when the project root is itself the top of a git
    checkout (outside one, or inside another repository, both are ``unknown``/``None``, never another
    repository's)."""
    def git(*args):
        r = subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else ""
    try:
        top = git("rev-parse", "--show-toplevel")
        if not top or Path(top).resolve() != PROJECT_ROOT.resolve():
            return {"git_sha": "unknown", "git_dirty": None, "git_note": "the project is not a git checkout"}
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


def completed_run(out_dir: Path, resolved_yaml: str) -> Optional[dict]:
    """The summary of a run already completed in ``out_dir`` with the same resolved config (a sweep
    re-run with the same ``hydra.sweep.dir`` resumes by skipping it), else None.

    Raises:
        ConfigError: ``out_dir`` already holds results of a different config (never overwritten).
    """
    summary_p, config_p = out_dir / "summary.json", out_dir / "config.yaml"
    if not summary_p.is_file() and not (out_dir / "turns.parquet").is_file():
        return None
    same = config_p.is_file() and config_p.read_text() == resolved_yaml
    if not same:
        raise ConfigError(f"run directory {out_dir} already holds the results of another config; refusing to "
                          f"overwrite them (choose another hydra.run.dir / hydra.sweep.dir)")
    try:
        summary = json.loads(summary_p.read_text()) if summary_p.is_file() else {}
    except ValueError:
        return None
    return summary if summary and not summary.get("partial") else None


def execute(run: Resolved, out_dir: Path, resolved_yaml: str = "", *, open_kwargs: Optional[dict] = None) -> dict:
    """Run the configured experiment and write its results into ``out_dir``; returns the summary.

    ``open_kwargs``: extra keyword arguments for the backend's ``open`` (e.g. fault-injection hooks).

    Raises:
        TraceError: the trace is missing or malformed (before anything runs).
        ConfigError: the workload or the scheduler rejects the config (before anything runs).
        RuntimeError: the run failed (a policy raised, a server did not start, a limit was hit); the
            results measured until then are written first, with ``partial: true`` and the error.
    """
    cfg = run.cfg
    t_start = time.perf_counter()
    synthetic = cfg.workload.kind == "synthetic"
    records = [] if synthetic else load_trace(run.trace_path)
    source = "synthetic prompt types" if synthetic else run.trace_path.name
    max_context = context_limit(run)
    try:
        conversations, stats = build_workload(records, cfg.workload, max_context)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if stats.context_dropped or stats.context_truncated:
        log.warning("workload.context_overflow=%s: %d conversations dropped, %d truncated: a turn needs more "
                    "than the model's %s-token context", cfg.workload.context_overflow, stats.context_dropped,
                    stats.context_truncated, max_context)
    check_policies(run, conversations, stats)
    out_dir.mkdir(parents=True, exist_ok=True)
    if resolved_yaml:
        write_text(resolved_yaml, out_dir / "config.yaml")
    meta = {"code": code_version(), "packages": package_versions(), "platform": platform.platform(),
            "instances": [{"name": n, "role": r, "hardware": dataclasses.asdict(h)} for n, r, h in run.instances],
            "model": dataclasses.asdict(cfg.model), "workload_source": "synthetic" if synthetic else str(run.trace_path)}
    write_json(meta, out_dir / "meta.json")
    log.info("workload: %d conversations, %d turns from %s", len(conversations),
             sum(len(r.turns) for _, r in conversations), source)
    unloaded = None
    if cfg.slo.needs_unloaded():
        log.info("SLO baseline: replaying each conversation alone under %s", cfg.slo.reference_scheduler)
        unloaded = unloaded_readings(run, conversations, stats)

    bar = None
    if cfg.logger.progress:
        from tqdm import tqdm
        tqdm.monitor_interval = 0  # no monitor thread (it wakes every 10 s to check for a stalled bar)
        bar = tqdm(total=len(conversations), unit="conv", desc=f"{run.scheduler_name}", mininterval=0.5,
                   leave=False)
    oracle = Oracle(conversations)
    recorder = Recorder(oracle.visible, cfg.logger.log_decisions, cfg.logger.steps)
    spec = get_backend(run.backend_name)
    try:
        with spec.open(run, out_dir, conversations=conversations, **(open_kwargs or {})) as cluster:
            res = run_session(cluster, run, conversations, stats, run.scheduler_name, run.scheduler, recorder,
                              oracle=oracle, tick_s=cfg.logger.metrics_interval_s,
                              on_conversation=(lambda c: bar.update(1)) if bar else None,
                              max_active=cfg.workload.max_active(), stop_s=cfg.workload.duration_s)
    except (Exception, KeyboardInterrupt) as e:  # the backend failed to open or to close: still write what we have
        convs = [ConversationState(i, rec, t, ()) for i, (t, rec) in enumerate(conversations)]
        res = SessionResult(recorder, convs, [], 0.0, 0.0, 0, 0, 0.0, f"{type(e).__name__}: {e}",
                            traceback.format_exc())
    finally:
        if bar:
            bar.close()
    log.info("%s run: %d events in %.2f s of wall time", run.backend_name, res.events, res.wall_s)
    if res.extra.get("policy_plan"):
        log.info("%s plan: %s", run.scheduler_name, res.extra["policy_plan"])
    turns = recorder.turns_frame()
    conv = apply_slo(conversation_table(turns, res.convs, cfg.slo.ttfet_definition), cfg.slo, unloaded)
    summary = summarize(turns, conv, res.energy_j, res.window_end_s - res.window_start_s, res.preemptions)
    summary.update({
        "scheduler": run.scheduler_name, "cluster": cfg.cluster.name, "model": cfg.model.name,
        "workload": cfg.workload.name if synthetic else run.trace_path.name,
        "workload_rate_per_s": stats.rate_per_s if cfg.workload.arrival == "trace" else cfg.workload.rate_per_s,
        "workload_arrival": cfg.workload.arrival, "seed": cfg.workload.seed,
        "slo_reference": cfg.slo.reference_label(run.scheduler_name) if cfg.slo.needs_unloaded() else "absolute",
        "partial": bool(res.error), "error": res.error,
        "sim_events": res.events, "sim_wall_s": res.wall_s, "total_wall_s": time.perf_counter() - t_start,
        "sim_turns_per_wall_s": len(turns) / res.wall_s if res.wall_s > 0 else math.nan,
        "backend": run.backend_name, **res.extra,
        "context_limit_tokens": max_context, "context_overflow": cfg.workload.context_overflow,
        "num_conversations_context_dropped": stats.context_dropped,
        "num_conversations_context_truncated": stats.context_truncated,
    })
    if cfg.workload.arrival == "closed":  # an agent starts its next conversation at once: no client-side wait
        summary.pop("client_wait_mean_s", None)
        summary.pop("client_wait_max_s", None)
    summary.update(serving_metrics(turns, res.window_end_s - res.window_start_s, cfg.logger.percentiles,
                                   recorder.itl_gaps()))
    summary.update(goodput_summary(turns, cfg.slo.goodput_thresholds_ms(), res.window_end_s - res.window_start_s))
    summary["failed_turns_by_reason"] = failures_by_reason(turns)
    summary.update(verdict(summary, conv, cfg.validity))
    if summary["num_conversations_failed"]:
        log.warning("%d of %d conversations failed (%s)", summary["num_conversations_failed"],
                    summary["num_conversations"], ", ".join(f"{k}: {v} turns" for k, v in
                                                           summary["failed_turns_by_reason"].items()))
    if not summary["valid"]:
        log.warning("run INVALID: %s", "; ".join(summary["invalid_reasons"]))
    if res.error_traceback:
        summary["error_traceback"] = res.error_traceback
    write_run_files(out_dir, turns, conv, recorder.instances_frame(),
                    recorder.decisions_frame() if cfg.logger.log_decisions else None, summary,
                    recorder.tokens_frame() if cfg.logger.steps else None)
    if res.error.startswith("KeyboardInterrupt"):
        raise KeyboardInterrupt(res.error)
    if res.error:
        raise RuntimeError(f"run failed ({res.error}); partial results written to {out_dir}")
    return summary
