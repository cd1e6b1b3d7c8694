"""Execute a run from a validated config: load and check everything, open the backend, run one
session, write its results.

Read top to bottom: ``execute`` loads the trace, builds the workload, builds the run's policies once to
check them (``harness.run.session.check_policies``), writes ``config.yaml`` and ``meta.json``, measures each
conversation's unloaded TTFET when the SLO is relative, opens the configured backend (a plug-in,
``harness.core.backend.get_backend``), runs one session (``harness.run.session.run_session``), and writes
``summary.json`` (first, marked partial until the rest is written: ``harness.core.recorder.write_run_files``),
``turns.parquet``, ``conversations.parquet``, ``instances.parquet`` and ``decisions.parquet``, then
``summary.json`` final. If anything fails midway, what was measured is still
written and ``summary.json`` says ``"partial": true`` with the error; a Ctrl-C / SIGTERM in any phase
(:data:`PHASES`) ends with every results file written too (:class:`_Interrupts`, docs/outputs.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import gc
import json
import logging
import math
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Optional, Sequence

from harness.core.backend import get_backend
from harness.run.config import PROJECT_ROOT, ConfigError, Resolved, fingerprint_input
from harness.run.loggers import REDACTED, scrub, scrub_yaml
from harness.core.controller import ConversationState
from harness.analysis.goodput import goodput_summary
from harness.analysis.metrics import (admission_readings, apply_slo, conversation_table, message_summary, message_table,
                                      pressure_metrics, slo_scale_curve, summarize)
from harness.core.recorder import Recorder, write_json, write_run_files, write_text
from harness.run.session import SessionInput, SessionResult, check_policies, run_session, session_input
from harness.run.slo_baseline import _interrupt_hook, unloaded_readings
from harness.core.trace import load_trace
from harness.analysis.validity import failures_by_reason, serving_metrics, verdict
from harness.workload.replay import pinned_turns
from harness.workload.workload import Oracle, build_workload

log = logging.getLogger(__name__)


def _private_if_redacted(path: Path, text: str) -> None:
    """Mode 0600 (owner only) for a run file whose text ``text`` had a credential redacted
    (``harness.core.redact.scrub``): the redaction is by rule, so the file that held one stays private too
    (docs/outputs.md, "Secrets, partial runs and the cache")."""
    if REDACTED in text:
        os.chmod(path, 0o600)


class _NotRun(Exception):
    """The session was not started (its message: why); the results path still writes a partial summary."""


# A file the harness writes cannot be written: a full disk, a file-size limit (ulimit -f), a quota, a
# read-only file system (harness.run.cli: one line naming the file, exit 2).
_DISK_ERRNOS = frozenset((errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS))

PHASES = ("start-up", "SLO baseline", "run", "results", "writing")   # where an interrupt can land, in order


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C / SIGTERM during :func:`execute`, raised once every results file is written. ``phase``: where
    the signal arrived (one of :data:`PHASES`); ``complete``: the run had finished its measurement (the
    signal came in the ``results`` or ``writing`` phase), so its files are those of a complete run
    (``"partial": false``), else they are a partial run's (``"partial": true``)."""

    def __init__(self, message: str, phase: str, complete: bool):
        super().__init__(message)
        self.phase, self.complete = phase, complete


class _Interrupts:
    """SIGINT and SIGTERM while :func:`execute` runs (installed in the main thread only; a signal the process
    ignores stays ignored; the previous handlers come back on exit).

    Inside :meth:`live` (the SLO baseline's replays, the backend's start and the session) a signal raises
    ``KeyboardInterrupt`` at once: the measurement stops and what it measured is kept. Anywhere else (the
    start-up checks, computing and writing the results, closing the backend) the signal is held:
    ``pending`` names it, ``phase_at`` says where it arrived, and the run goes on to write every file
    before :func:`execute` raises :class:`RunInterrupted` (no result is lost to an interrupt that lands
    after the measurement, and no file is left half written). SIGKILL still stops everything at once."""

    def __init__(self):
        self.phase = PHASES[0]
        self.pending = ""       # "signal 15 (SIGTERM)" once one arrived
        self.phase_at = ""      # the phase it arrived in
        self._live = False
        self._old: dict = {}

    def __enter__(self) -> "_Interrupts":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old = signal.getsignal(sig)
                if old not in (signal.SIG_IGN, None):
                    self._old[sig] = old
                    signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handler(self, signum, frame) -> None:
        what = f"signal {signum} ({signal.Signals(signum).name}{', Ctrl-C' if signum == signal.SIGINT else ''})"
        if not self.pending:
            self.pending, self.phase_at = what, self.phase
        if self._live:
            raise KeyboardInterrupt(what)
        log.warning("%s during the %s phase: held until every results file is written", what, self.phase)

    def enter(self, phase: str) -> None:
        """The run reached ``phase``; the test-only hook ``HARNESS_TEST_INTERRUPT=<phase>:0[:<signal>]``
        (``startup``, ``results``, ``writing``; ``harness.run.slo_baseline._interrupt_hook``) signals the
        process here."""
        self.phase = phase
        _test_interrupt(phase.replace("-", ""))

    @contextlib.contextmanager
    def live(self, phase: str):
        """A stretch in which a signal stops the work at once (a ``KeyboardInterrupt``)."""
        self.phase, self._live = phase, True
        try:
            yield
        finally:
            self._live = False

    def not_started(self) -> str:
        """The error of a run a held signal stopped before it started, else ``""``."""
        return (f"KeyboardInterrupt: {self.pending} during the {self.phase_at}; the run did not start"
                if self.pending else "")


def _test_interrupt(phase: str, k: int = 0) -> None:
    """Test-only fault injection: the process sends itself the signal of ``HARNESS_TEST_INTERRUPT`` when it
    names ``phase`` and ``k`` (once per process; ``harness.run.slo_baseline._interrupt_hook``)."""
    hook = _interrupt_hook(phase)
    if hook is not None and k >= hook[0] and os.environ.pop("HARNESS_TEST_INTERRUPT", None) is not None:
        os.kill(os.getpid(), hook[1])


def code_version() -> dict:
    """Git sha and dirty flag of the project, read only when the project root is itself the top of a git
    checkout (outside one, or inside another repository, both are ``unknown``/``None``, never another
    repository's). Read once per process (three ``git`` processes; a new dict on each call), like
    :func:`package_versions`: the code a process runs is the code it imported, whatever a later edit on disk
    says (a sweep's workers run many jobs each, ``harness.run.executor``)."""
    return dict(_code_version(PROJECT_ROOT))


@functools.lru_cache(maxsize=4)
def _code_version(root: Path) -> tuple:
    def git(*args):
        r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else ""
    try:
        top = git("rev-parse", "--show-toplevel")
        if not top or Path(top).resolve() != root.resolve():
            return (("git_sha", "unknown"), ("git_dirty", None), ("git_note", "the project is not a git checkout"))
        return (("git_sha", git("rev-parse", "HEAD") or "unknown"), ("git_dirty", bool(git("status", "--porcelain"))))
    except (OSError, subprocess.SubprocessError):
        return (("git_sha", "unknown"), ("git_dirty", None))


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
            the config or the cluster; a call ``workload.model_map`` sends to no instance.
    """
    cfg = run.cfg
    records = [] if cfg.workload.kind == "synthetic" else (load or load_trace)(run.trace_path)
    inp = inp or session_input(run)
    max_context = inp.context_limit_tokens
    try:
        conversations, stats = build_workload(records, cfg.workload, max_context)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if (cfg.slo.needs_unloaded() or cfg.slo.needs_scale_unloaded()) and any(
            rec.parent_id is not None for _, rec in conversations):
        raise ConfigError("slo: a relative SLO replays each conversation alone, which cannot replay a session's "
                          "sub-agents (conversations with parent_id in the trace): use slo=absolute (slo.ttfet_s)")
    if cfg.workload.timing == "original" and any(t.send_s is None for _, rec in conversations for t in rec.turns):
        raise ConfigError("workload.timing=original needs recorded send times (send_s) on every turn; this trace "
                          "has none (a session trace from `python -m harness.workload.convert claude-code` has "
                          "them): use workload.timing=think")
    if inp.routes is not None:
        for _, rec in conversations:
            for k, t in enumerate(rec.turns):
                if not inp.routes.pool_of(t.model):
                    raise ConfigError(f"workload.model_map: call {k} of conversation {rec.conversation_id!r} (model "
                                      f"{t.model!r}) matches no pattern, and cluster {cfg.cluster.name} has no "
                                      f"unnamed instance group to serve it (add a catch-all pattern '*')")
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
        RunInterrupted: Ctrl-C / SIGTERM in any phase (:data:`PHASES`, :class:`_Interrupts`), raised once every
            results file is written: the files of a partial run (``summary.json`` with ``partial: true``, the
            error naming the signal and ``interrupted_phase``), or, for a signal after the measurement, of
            the complete run (``partial: false``, ``interrupted_phase`` ``results`` or ``writing``).
        RuntimeError: the run failed (a policy raised, a server did not start, a limit was hit); the
            results measured until then are written first, with ``partial: true`` and the error.
    """
    with _Interrupts() as intr:
        return _execute(run, out_dir, resolved_yaml, open_kwargs=open_kwargs, fp=fp, job=job, intr=intr)


def _execute(run: Resolved, out_dir: Path, resolved_yaml: str, *, open_kwargs: Optional[dict], fp: Optional[dict],
             job: Optional[Sequence[str]], intr: _Interrupts) -> dict:
    """:func:`execute`'s body, its signals handled by ``intr``."""
    from harness.analysis.provenance import fingerprint
    from harness.run.slo_baseline import BaselineInterrupted
    from harness.analysis.cost import cpu_mark, run_cost
    cfg = run.cfg
    t_start, cpu_start = time.perf_counter(), cpu_mark()
    intr.enter("start-up")
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
            "fingerprint": fp or fingerprint(fingerprint_input(run), resolved_yaml), "job_overrides": list(job) if job is not None else None}
    meta = {"code": code_version(), **scrub(meta)}   # (the git sha is 40 hex digits, the shape of a W&B key)
    write_json(meta, out_dir / "meta.json")
    _private_if_redacted(out_dir / "meta.json", json.dumps(meta))
    log.info("workload: %d conversations, %d turns from %s", len(conversations),
             sum(len(r.turns) for _, r in conversations), source)
    def replay_alone(what: str, under: str = "", **kw) -> tuple[Optional[dict], str]:
        """The unloaded readings, or on an interrupt those done so far and the error naming it (the run
        never starts; the summary says so, partial)."""
        try:
            with intr.live("SLO baseline"):
                return unloaded_readings(inp, conversations, stats, **kw), ""
        except KeyboardInterrupt as e:
            done = e.readings if isinstance(e, BaselineInterrupted) else {}
            err = (f"KeyboardInterrupt: {e} during the {what} (unloaded-TTFET replays{under}: "
                   f"{len(done)} of {len(conversations)} conversations done); the run did not start")
            log.error("interrupted: %s", err)
            return done, err

    # The start-up heap (modules, config, the trace's records) is kept out of the cyclic collector's walks
    # during the replays and the run: gc.freeze moves it to the permanent generation, which later collections
    # skip (Python docs), as the vLLM backend's drive and vLLM's engine core do; objects made meanwhile are
    # still collected, and the heap is given back to the collector (gc.unfreeze) once the run is over. A job of
    # the sweep executor leaves this to the executor (it froze the process's heap before the job and collects the
    # job's own objects after it: harness.run.executor.job_heap).
    from harness.run.executor import JOB_HEAP_FROZEN
    own_freeze = not JOB_HEAP_FROZEN[0]
    if own_freeze:
        gc.freeze()
    baseline_error = intr.not_started()   # a signal held during the start-up: nothing is measured
    unloaded = {} if baseline_error and cfg.slo.needs_unloaded() else None
    if cfg.slo.needs_unloaded() and not baseline_error:
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
    recorder = Recorder(oracle.visible, cfg.logger.log_decisions, cfg.logger.steps, info=oracle.info)
    spec = get_backend(run.backend_name)
    on_conversation = (lambda c: bar.update(1)) if bar else None
    if _interrupt_hook("run") is not None:   # test-only: a signal as the k-th conversation finishes
        finished = [0]

        def on_conversation(c, bar_update=on_conversation):
            if bar_update:
                bar_update(c)
            finished[0] += 1
            _test_interrupt("run", finished[0] - 1)
    res = None
    disk_error: Optional[OSError] = None   # the backend's close could not write its file (steps.parquet)
    try:
        baseline_error = baseline_error or intr.not_started()   # a signal held between the baseline and the run
        if baseline_error:
            raise _NotRun(baseline_error)
        with contextlib.ExitStack() as backend:   # its close (servers' shutdown) outside `live`: a signal waits
            with intr.live("run"):
                cluster = backend.enter_context(spec.open(inp, run.backend, out_dir, conversations=conversations,
                                                          **(open_kwargs or {})))
                res = run_session(cluster, inp, conversations, stats, run.scheduler_name, run.scheduler,
                                  recorder, oracle=oracle, tick_s=cfg.logger.metrics_interval_s,
                                  on_conversation=on_conversation, max_active=cfg.workload.max_active(),
                                  stop_s=cfg.workload.duration_s, pinned=pinned_turns(cfg.workload.arrivals_from_run)
                                  if cfg.workload.arrivals_from_run else None,
                                  timing=cfg.workload.timing)
    except (Exception, KeyboardInterrupt) as e:  # the backend failed to open or to close: still write what we have
        err = str(e) if isinstance(e, _NotRun) else f"{type(e).__name__}: {e}"
        tb = "" if isinstance(e, _NotRun) else traceback.format_exc()
        if res is None:
            convs = [ConversationState(i, rec, t, ()) for i, (t, rec) in enumerate(conversations)]
            res = SessionResult(recorder, convs, [], 0.0, 0.0, 0, 0, 0.0, err, tb)
        elif not res.error:   # the session ran; closing the backend failed: its results are kept, marked
            res = dataclasses.replace(res, error=f"{err} (closing the backend)", error_traceback=tb)
            if isinstance(e, OSError) and e.errno in _DISK_ERRNOS:
                disk_error = e
    finally:
        if own_freeze:
            gc.unfreeze()
        if bar:
            bar.close()
    intr.enter("results")
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
    messages = None
    if any(rec.parent_id is not None or any(t.user_message for t in rec.turns[1:]) for _, rec in conversations):
        messages = message_table(turns, res.convs)     # a session trace: TTFET per user message, both readings
        summary.update(message_summary(messages))
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
    summary.update(admission_readings(turns, conv))
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
    if intr.pending:
        summary["interrupted_phase"] = intr.phase_at
    # what the run cost the machine (harness.analysis.cost), measured last, before the files are written
    summary.update(run_cost(cpu_start, res.extra.get("cost_loop_cpu_s", 0.0), res.events,
                            int(summary.get("num_turns") or 0) + int(summary.get("num_turns_failed") or 0)))
    summary = scrub(summary)   # an error message may quote a credential (a URL's password); metrics are kept
    intr.enter("writing")
    try:   # summary.json first, then the parquets (a full disk keeps the summary), then summary.json final
        write_run_files(out_dir, turns, conv, instances,
                        recorder.decisions_frame() if cfg.logger.log_decisions else None, summary,
                        recorder.tokens_frame() if cfg.logger.steps else None, messages)
    finally:
        if (out_dir / "summary.json").is_file():
            _private_if_redacted(out_dir / "summary.json", json.dumps(summary, default=str))
    if intr.pending:
        if "interrupted_phase" not in summary:   # it arrived while the files were written: say so too
            summary["interrupted_phase"] = intr.phase_at
            write_json(summary, out_dir / "summary.json")
        raise RunInterrupted(res.error or f"KeyboardInterrupt: {intr.pending} during the {intr.phase_at} phase, "
                             f"after the run had finished", intr.phase_at, complete=not res.error)
    if disk_error is not None:   # a full disk / size limit: the same error as a results file's (cli: exit 2)
        raise disk_error
    if res.error.startswith("KeyboardInterrupt"):
        raise KeyboardInterrupt(res.error)
    if res.error:
        raise RuntimeError(f"run failed ({res.error}); partial results written to {out_dir}")
    return summary
