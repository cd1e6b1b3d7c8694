"""Execute a run from a validated config: load and check everything, open the backend, run one
session, write its results.

Read top to bottom: ``execute`` loads the trace, builds the workload, builds the run's policies once to
check them (``harness.run.session.check_policies``), writes ``config.yaml`` and ``meta.json``, measures each
conversation's unloaded TTFET when the SLO is relative, opens the configured backend (a plug-in,
``harness.core.backend.get_backend``), runs one session (``harness.run.session.run_session``), and writes
``summary.json``, ``turns.parquet``, ``conversations.parquet``, ``instances.parquet`` and
``decisions.parquet`` (``harness.core.recorder``). If anything fails midway, what was measured is still
written and ``summary.json`` says ``"partial": true`` with the error.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional, Sequence

from harness.core.backend import get_backend
from harness.run.config import PROJECT_ROOT, ConfigError, Resolved
from harness.run.loggers import REDACTED, scrub, scrub_yaml
from harness.core.controller import ConversationState
from harness.analysis.goodput import goodput_summary
from harness.analysis.metrics import apply_slo, conversation_table, pressure_metrics, slo_scale_curve, summarize
from harness.core.recorder import Recorder, write_json, write_run_files, write_text
from harness.run.session import SessionInput, SessionResult, check_policies, run_session, session_input
from harness.run.slo_baseline import unloaded_readings
from harness.core.trace import load_trace
from harness.analysis.validity import failures_by_reason, serving_metrics, verdict
from harness.workload.workload import Oracle, build_workload

log = logging.getLogger(__name__)


def _private_if_redacted(path: Path, text: str) -> None:
    """Mode 0600 (owner only) for a run file whose text ``text`` had a credential redacted
    (``harness.run.loggers.scrub``): the redaction is by rule, so the file that held one stays private too
    (docs/outputs.md, "Secrets, partial runs and the cache")."""
    if REDACTED in text:
        os.chmod(path, 0o600)


class _NotRun(Exception):
    """The session was not started (its message: why); the results path still writes a partial summary."""


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
    """Versions of the packages a run depends on (a new dict on each call). Read once per process (each
    ``importlib.metadata.version`` scans ``sys.path``, ~2 ms): a package upgraded on disk during a sweep
    does not change the one this process has imported, which is the one the runs use."""
    return dict(_package_versions())


@functools.lru_cache(maxsize=1)
def _package_versions() -> tuple:
    from importlib import metadata
    out = {"python": sys.version.split()[0]}
    for p in ("hydra-core", "omegaconf", "numpy", "pandas", "pyarrow", "tqdm"):
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return tuple(out.items())


RESULT_FILES = ("summary.json", "turns.parquet", "conversations.parquet", "instances.parquet", "decisions.parquet",
                "tokens.parquet", "server_metrics.json", "interrupted.json")


def completed_run(out_dir: Path, resolved_yaml: str, fp: Optional[dict] = None,
                  job: Optional[Sequence[str]] = None) -> Optional[dict]:
    """The summary of a run already completed in ``out_dir`` that a re-run may skip (a sweep re-run with the
    same ``hydra.sweep.dir`` resumes), else None (run it: nothing there, a partial run, or results whose
    fingerprint differs; in the last case the log names what changed and the old result files are removed
    first, so the directory never mixes two runs).

    A complete run is skipped only when its ``meta.json`` fingerprint (``harness.analysis.provenance.fingerprint``:
    resolved config, trace content, code, hardware/model profiles) equals ``fp``. ``job``: the job's Hydra
    overrides (its identity in the sweep); with ``fp`` given, a directory of the same job whose config text
    changed (an edited profile, a new default) is recomputed, one of another job is refused.
    Without ``fp`` (callers that do not fingerprint), the config text alone decides, as before.

    Raises:
        ConfigError: ``out_dir`` already holds results of a different job or config (never overwritten).
    """
    from harness.analysis.provenance import changed_components
    summary_p, config_p = out_dir / "summary.json", out_dir / "config.yaml"
    if not summary_p.is_file() and not (out_dir / "turns.parquet").is_file():
        return None
    meta = {}
    try:
        meta = json.loads((out_dir / "meta.json").read_text())
    except (OSError, ValueError):
        pass
    old_job = meta.get("job_overrides") if isinstance(meta, dict) else None
    same_config = config_p.is_file() and config_p.read_text() == resolved_yaml
    same_job = same_config if old_job is None or job is None else list(old_job) == list(job)
    if not same_job:
        raise ConfigError(f"run directory {out_dir} already holds the results of another config; refusing to "
                          f"overwrite them (choose another hydra.run.dir / hydra.sweep.dir)")
    try:
        summary = json.loads(summary_p.read_text()) if summary_p.is_file() else {}
    except ValueError:
        summary = {}
    if fp is None:
        return summary if same_config and summary and not summary.get("partial") else None
    changed = changed_components(meta.get("fingerprint") if isinstance(meta, dict) else None, fp)
    if not summary or summary.get("partial"):
        why = "the previous run there is partial" + (f" ({summary.get('error')})" if summary.get("error") else "") \
            if summary else "the previous run there has no summary.json"
    elif changed:
        why = "its fingerprint changed: " + ", ".join(changed)
    else:
        return summary
    log.warning("%s: recomputing this job: %s", out_dir, why)
    print(f"{out_dir}: recomputing this job: {why}", file=sys.stderr, flush=True)
    for name in RESULT_FILES:  # summary.json first: its presence means the rest is there
        try:
            (out_dir / name).unlink()
        except FileNotFoundError:
            pass
    return None


def prepare(run: Resolved, load: Any = None, inp: Optional[SessionInput] = None) -> tuple[list, Any, Optional[int]]:
    """Everything checked before a run starts: load the trace, build the workload, build the run's policies
    once (``harness.run.session.check_policies``). Returns ``(conversations, stats, context limit tokens)``.
    Used by :func:`execute` and, for every job before a sweep starts, by
    ``harness.run.callbacks.ValidateSweepCallback``. ``load``: the trace loader (default
    ``harness.core.trace.load_trace``, memoised per process by the file's content). ``inp``: the run's session
    input (``harness.run.session.session_input(run)``; built here when None).

    Raises:
        TraceError: the trace is missing or malformed.
        ConfigError: the workload (e.g. emptied by ``workload.context_overflow``) or the scheduler rejects
            the config or the cluster.
    """
    cfg = run.cfg
    records = [] if cfg.workload.kind == "synthetic" else (load or load_trace)(run.trace_path)
    inp = inp or session_input(run)
    max_context = inp.context_limit_tokens
    try:
        conversations, stats = build_workload(records, cfg.workload, max_context)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_policies(inp, conversations, stats)
    return conversations, stats, max_context


def execute(run: Resolved, out_dir: Path, resolved_yaml: str = "", *, open_kwargs: Optional[dict] = None,
            fp: Optional[dict] = None, job: Optional[Sequence[str]] = None) -> dict:
    """Run the configured experiment and write its results into ``out_dir``; returns the summary.

    ``open_kwargs``: extra keyword arguments for the backend's ``open`` (e.g. fault-injection hooks).
    ``fp``: the run's fingerprint (``harness.analysis.provenance.fingerprint``; computed here when None) and ``job``
    its Hydra overrides, both recorded in ``meta.json``.

    Raises:
        TraceError: the trace is missing or malformed (before anything runs).
        ConfigError: the workload or the scheduler rejects the config (before anything runs).
        KeyboardInterrupt: Ctrl-C / SIGTERM, during the SLO baseline or the run; the results measured until
            then are written first (``summary.json`` with ``partial: true`` and the error naming the interrupt).
        RuntimeError: the run failed (a policy raised, a server did not start, a limit was hit); the
            results measured until then are written first, with ``partial: true`` and the error.
    """
    from harness.analysis.provenance import fingerprint
    from harness.run.slo_baseline import BaselineInterrupted
    cfg = run.cfg
    t_start = time.perf_counter()
    synthetic = cfg.workload.kind == "synthetic"
    source = "synthetic prompt types" if synthetic else run.trace_path.name
    inp = session_input(run)  # what the sessions read of the run config, built once
    conversations, stats, max_context = prepare(run, inp=inp)
    if stats.context_dropped or stats.context_truncated:
        log.warning("workload.context_overflow=%s: %d conversations dropped, %d truncated: a turn needs more "
                    "than the model's %s-token context", cfg.workload.context_overflow, stats.context_dropped,
                    stats.context_truncated, max_context)
    out_dir.mkdir(parents=True, exist_ok=True)
    if resolved_yaml:
        resolved_yaml = scrub_yaml(resolved_yaml)   # harness.run.cli passes it redacted; other callers may not
        write_text(resolved_yaml, out_dir / "config.yaml")
        _private_if_redacted(out_dir / "config.yaml", resolved_yaml)
    meta = {"packages": package_versions(), "platform": platform.platform(),
            "instances": [{"name": n, "role": r, "hardware": dataclasses.asdict(h)} for n, r, h in run.instances],
            "model": dataclasses.asdict(cfg.model), "workload_source": "synthetic" if synthetic else str(run.trace_path),
            "fingerprint": fp or fingerprint(run, resolved_yaml), "job_overrides": list(job) if job is not None else None}
    meta = {"code": code_version(), **scrub(meta)}   # (the git sha is 40 hex digits, the shape of a W&B key)
    write_json(meta, out_dir / "meta.json")
    _private_if_redacted(out_dir / "meta.json", json.dumps(meta))
    log.info("workload: %d conversations, %d turns from %s", len(conversations),
             sum(len(r.turns) for _, r in conversations), source)
    def replay_alone(what: str, under: str = "", **kw) -> tuple[Optional[dict], str]:
        """The unloaded readings, or on an interrupt those done so far and the error naming it (the run
        never starts; the summary says so, partial)."""
        try:
            return unloaded_readings(inp, conversations, stats, **kw), ""
        except BaselineInterrupted as e:
            err = (f"KeyboardInterrupt: {e} during the {what} (unloaded-TTFET replays{under}: "
                   f"{len(e.readings)} of {e.total} conversations done); the run did not start")
            log.error("interrupted: %s", err)
            return e.readings, err

    # The start-up heap (modules, config, the trace's records) is kept out of the cyclic collector's walks
    # during the replays and the run: gc.freeze moves it to the permanent generation, which later collections
    # skip (Python docs), as the vLLM backend's drive and vLLM's engine core do; objects made meanwhile are
    # still collected, and the heap is given back to the collector (gc.unfreeze) once the run is over.
    gc.freeze()
    unloaded = None
    baseline_error = ""
    if cfg.slo.needs_unloaded():
        log.info("SLO baseline: replaying each conversation alone under %s", cfg.slo.reference_scheduler)
        unloaded, baseline_error = replay_alone("SLO baseline")
    scale_unloaded = None
    if cfg.slo.needs_scale_unloaded() and not baseline_error:
        ref = cfg.slo.scale_reference_name()
        if unloaded is not None and ref == cfg.slo.reference_scheduler:
            scale_unloaded = unloaded
        else:
            log.info("SLO-scale baseline: replaying each conversation alone under %s", ref)
            scale_unloaded, baseline_error = replay_alone("SLO-scale baseline", f" under {ref}", reference=ref)

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
        if baseline_error:
            raise _NotRun(baseline_error)
        with spec.open(run, out_dir, conversations=conversations, **(open_kwargs or {})) as cluster:
            res = run_session(cluster, inp, conversations, stats, run.scheduler_name, run.scheduler, recorder,
                              oracle=oracle, tick_s=cfg.logger.metrics_interval_s,
                              on_conversation=(lambda c: bar.update(1)) if bar else None,
                              max_active=cfg.workload.max_active(), stop_s=cfg.workload.duration_s)
    except (Exception, KeyboardInterrupt) as e:  # the backend failed to open or to close: still write what we have
        convs = [ConversationState(i, rec, t, ()) for i, (t, rec) in enumerate(conversations)]
        res = SessionResult(recorder, convs, [], 0.0, 0.0, 0, 0, 0.0,
                            str(e) if isinstance(e, _NotRun) else f"{type(e).__name__}: {e}",
                            "" if isinstance(e, _NotRun) else traceback.format_exc())
    finally:
        gc.unfreeze()
        if bar:
            bar.close()
    log.info("%s run: %d events in %.2f s of wall time", run.backend_name, res.events, res.wall_s)
    if res.extra.get("policy_plan"):
        log.info("%s plan: %s", run.scheduler_name, res.extra["policy_plan"])
    # the pooled ITL statistics first (harness.analysis.validity.serving_metrics reads them back), then the gaps' buffer
    # (8 bytes a gap, the run's largest record) is freed before any frame is built
    recorder.itl.stats(cfg.logger.percentiles)
    recorder.itl.release()
    turns = recorder.turns_frame()
    conv = apply_slo(conversation_table(turns, res.convs, cfg.slo.ttfet_definition), cfg.slo, unloaded)
    summary = summarize(turns, conv, res.energy_j, res.window_end_s - res.window_start_s, res.preemptions)
    scale_curve = {} if baseline_error else slo_scale_curve(conv, cfg.slo, scale_unloaded)  # no curve without its baseline
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
    if scale_curve:
        summary.update(scale_curve)
        summary["slo_scale_reference"] = (cfg.slo.reference_label(run.scheduler_name, cfg.slo.scale_reference_name())
                                          if cfg.slo.needs_scale_unloaded() else "absolute")
    if cfg.workload.arrival == "closed":  # an agent starts its next conversation at once: no client-side wait
        summary.pop("client_wait_mean_s", None)
        summary.pop("client_wait_max_s", None)
    summary.update(serving_metrics(turns, res.window_end_s - res.window_start_s, cfg.logger.percentiles,
                                   recorder.itl))
    summary.update(goodput_summary(turns, cfg.slo.goodput_thresholds_ms(), res.window_end_s - res.window_start_s))
    instances = recorder.instances_frame()
    summary.update(pressure_metrics(turns, instances, (res.window_start_s, res.window_end_s)))
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
    summary = scrub(summary)   # an error message may quote a credential (a URL's password); metrics are kept
    write_run_files(out_dir, turns, conv, instances,
                    recorder.decisions_frame() if cfg.logger.log_decisions else None, summary,
                    recorder.tokens_frame() if cfg.logger.steps else None)
    _private_if_redacted(out_dir / "summary.json", json.dumps(summary, default=str))
    if res.error.startswith("KeyboardInterrupt"):
        raise KeyboardInterrupt(res.error)
    if res.error:
        raise RuntimeError(f"run failed ({res.error}); partial results written to {out_dir}")
    return summary
