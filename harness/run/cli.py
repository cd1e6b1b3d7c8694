"""The harness's command line: ``agentic-harness [group=option ...] [key=value ...]`` (installed console
script) or ``python run.py ...`` in a checkout (a thin alias of :func:`main`), both Hydra.

Defaults: ConServe on the shipped SWE-bench trace, simulated A40 cluster (1 prefiller + 3 decoders).
Sweep: ``agentic-harness -m scheduler=conserve,ampd workload.rate_per_s=0.1,0.2``.
Results go to ``results/runs/<time>_<scheduler>/`` (or ``results/sweeps/<time>/<n>_<scheduler>/``) under
the working directory. See README.md and conf/README.md.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import sys
from pathlib import Path
from typing import Optional

# No cyclic collection while the command line's modules load (Hydra, OmegaConf, numpy, the registry): an
# import makes thousands of long-lived objects and no garbage, so a collection then only walks them
# (docs/speed.md); the collector's state is restored right after.
_gc_enabled = gc.isenabled()
gc.disable()
try:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig, OmegaConf

    from harness.run.config import ConfigError, register_configs, resolve
    from harness.core.paths import PACKAGE_DIR, PROJECT_ROOT
    from harness.core.trace import TraceError

    register_configs()
finally:
    if _gc_enabled:
        gc.enable()


def config_path() -> str:
    """Where Hydra finds the configs: the checkout's ``conf/`` (beside ``harness/``), else the copy an
    installed wheel ships as package data, found through Hydra's ``pkg://`` search path (``harness.conf``:
    ``setup.py`` maps the top-level ``conf/`` there).

    Raises:
        FileNotFoundError: neither holds ``config.yaml`` (naming both places).
    """
    conf = PROJECT_ROOT / "conf"
    if (conf / "config.yaml").is_file():
        return str(conf)
    if (PACKAGE_DIR / "conf" / "config.yaml").is_file():
        return "pkg://harness.conf"
    raise FileNotFoundError(f"no config.yaml in {conf} (a checkout) or in {PACKAGE_DIR / 'conf'} (an installed "
                            f"wheel); reinstall the package or run from a checkout")


def _drop_if_empty(out: Path) -> None:
    """A config error leaves no run directory behind: remove ``out`` if it holds only what Hydra wrote
    (``.hydra/``, ``run.log``), never measured results."""
    import shutil
    if out.is_dir() and {p.name for p in out.iterdir()} <= {".hydra", "run.log"}:
        shutil.rmtree(out, ignore_errors=True)


def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")


def _mark_interrupted(out: Path, why: str, multirun: bool, phase: Optional[str] = None,
                      complete: bool = False) -> None:
    """Mark an interrupted job's directory: ``interrupted.json`` (what stopped it, when, in which phase of
    ``harness.run.runner.PHASES`` -- null: before the run began -- and whether the run had finished its
    measurement), beside the run's ``summary.json`` when it had started; a re-run recomputes a partial job
    and skips a complete one."""
    import datetime
    import os

    from harness.core.atomic import write_json
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_json({"interrupted": True, "error": why, "phase": phase, "complete": complete, "pid": os.getpid(),
                    "sweep": multirun,
                    "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
                   out / "interrupted.json")
    except OSError:
        pass


def _redact_hydra_files(out: Path, hc, given: bool, multirun: bool) -> Optional[str]:
    """Redact the credentials of the files Hydra wrote before the job started (``<out>/.hydra/config.yaml``,
    ``hydra.yaml``, ``overrides.yaml``, and a multirun's ``<sweep dir>/multirun.yaml``: the config and the
    command line's overrides, as given) with the harness's one scrubbing rule
    (``harness.core.redact.scrub_yaml``; the run's own credentials registered by ``remember_secrets``); a
    file that held one is rewritten, atomically, mode 0600. ``run.log`` gets a filter that scrubs every
    record (``ScrubFilter``), and mode 0600 when the run was ``given`` a credential (or one of those files
    held one). A file that cannot be redacted is named in a warning (the run goes on).

    Returns the redacted text of ``.hydra/config.yaml`` (Hydra wrote it as ``OmegaConf.to_yaml`` of the job's
    config just before the job began, so this is the job's resolved-config text, without dumping the config
    again), or None when that file was not read or could not be redacted."""
    import logging
    import os

    from harness.core.atomic import write_text
    from harness.run.loggers import ScrubFilter, scrub_yaml
    files = [out / hc.output_subdir / n for n in ("config.yaml", "hydra.yaml", "overrides.yaml")] \
        if hc.output_subdir else []
    if multirun:
        files.append(Path(hc.sweep.dir) / "multirun.yaml")
    config_text = None
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except OSError:
            continue   # not written (hydra.output_subdir=null) or already gone
        try:
            clean = scrub_yaml(text)
            if f.name == "config.yaml":
                config_text = clean
            if clean != text:
                given = True
                write_text(clean, f)
                os.chmod(f, 0o600)
        except Exception as e:   # never silent: the file may still hold a credential
            if f.name == "config.yaml":
                config_text = None
            print(f"warning: could not redact the credentials of {f} ({type(e).__name__}: {e}); check it "
                  f"before sharing the run directory", file=sys.stderr)
    for h in logging.getLogger().handlers:
        for flt in [flt for flt in h.filters if isinstance(flt, ScrubFilter)]:   # a previous job's (a multirun's)
            h.removeFilter(flt)
        h.addFilter(ScrubFilter())
        if given and isinstance(h, logging.FileHandler) and Path(h.baseFilename).parent == out.resolve():
            try:
                os.chmod(h.baseFilename, 0o600)
            except OSError:
                pass
    return config_text


_JOBS_ENTERED = [0]   # the jobs whose body (_main) began in this process: before main's first, an exit is Hydra's


def _main(cfg: DictConfig) -> dict:
    from hydra.types import RunMode
    _JOBS_ENTERED[0] += 1

    from harness.analysis.catalog import summary_table
    from harness.run.loggers import logged_run
    from harness.analysis.provenance import RUN_LOCK, DirLock, LockHeld, fingerprint
    from harness.run.config import fingerprint_input
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    signal.signal(signal.SIGTERM, _sigterm)  # like Ctrl-C: what was measured is written, partial
    out = Path(hc.runtime.output_dir)
    from harness.run.loggers import remember_secrets, scrub, scrub_yaml, secret_values
    known = secret_values(OmegaConf.to_container(cfg, resolve=False))   # the credentials the run was given
    remember_secrets(known)   # every later scrub in this process redacts them (run.log, summary.json)
    hydra_yaml = _redact_hydra_files(out, hc, bool(known), multirun)   # the config's text as Hydra dumped it
    job = scrub(list(hc.overrides.task))   # meta.json's job identity: never a credential
    lock = None
    summary = None
    try:
        run = resolve(cfg)
        from harness.run.runner import completed_run, execute  # numpy/pandas/pyarrow: only once the config is valid
        # config.yaml and the fingerprint's text: the text Hydra dumped into .hydra/config.yaml (resolve does not
        # change cfg), else dumped here
        resolved_yaml = hydra_yaml if hydra_yaml is not None else scrub_yaml(OmegaConf.to_yaml(cfg))
        lock = DirLock(out, RUN_LOCK).acquire()  # one writer per run directory
        fp = fingerprint(fingerprint_input(run), resolved_yaml)
        done = completed_run(out, resolved_yaml, fp, job)
        if done is not None:
            print(f"{out}: already complete with this config, trace, code and profiles (fingerprint "
                  f"{fp['digest'][:12]}); skipped (delete it to run again)")
            return done
        # (the resolved container only where a logger records it: resolve has read every value, so it cannot fail
        # here where it did not there)
        with logged_run(run.cfg.logger, out, lambda: OmegaConf.to_container(cfg, resolve=True)):
            summary = execute(run, out, resolved_yaml, fp=fp, job=job)
    except (ConfigError, TraceError, LockHeld) as e:
        print(f"error: {e}", file=sys.stderr)
        if not isinstance(e, LockHeld):
            if lock is not None:
                lock.release()
            _drop_if_empty(out)
        sys.exit(2)
    except KeyboardInterrupt as e:
        if summary is not None:   # after execute returned (the loggers' finish, e.g. a W&B upload)
            _interrupted(out, e, multirun, "finish", True)
        _interrupted(out, e, multirun, getattr(e, "phase", None), getattr(e, "complete", False))  # RunInterrupted
    except OSError as e:  # a results file (or the run's lock) cannot be written: a full disk, a size limit
        print(f"error: cannot write {e.filename or out}: {e.strerror or e}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as e:  # the run failed; partial results are written
        print(f"error: {e}", file=sys.stderr)
        if multirun:  # the sweep goes on; its comparison table marks this job
            return {"partial": True, "error": str(e)}
        sys.exit(1)
    finally:
        if lock is not None:
            lock.release()
    w = run.cfg.workload
    rate = {"fixed": "t=0", "trace": f"the trace's timestamps x{1 / w.time_scale:g}"}.get(w.arrival,
                                                                                       f"{w.rate_per_s} conv/s")
    verdict = "VALID" if summary.get("valid") else "INVALID: " + "; ".join(summary.get("invalid_reasons", []))
    try:
        print(f"\n{run.scheduler_name} on {run.cfg.cluster.name} ({run.backend_name}), {summary['workload']} "
              f"@ {rate} -> {out}\n{summary_table({run.scheduler_name: summary})}\nrun {verdict}")
        if (out / "messages.parquet").is_file():
            print(message_lines(out / "messages.parquet", summary))
    except KeyboardInterrupt as e:   # the run is complete on disk
        _interrupted(out, e, multirun, "finish", True)
    return summary


def message_lines(path: Path, summary: dict, limit: int = 200) -> str:
    """The per-user-message TTFET table of a session-trace run (``messages.parquet``: both readings, s), at
    most ``limit`` rows, and the aggregate keys (``harness.analysis.metrics.message_summary``)."""
    import pandas as pd
    m = pd.read_parquet(path)
    lines = ["", "TTFET per user message (s): first = the message's first call's first token - send; visible = "
                 "the first token of its end_turn response - send",
             "| conversation | message | first | visible |", "|---|---|---|---|"]
    for row in m.head(limit).itertuples():
        lines.append(f"| {row.conversation_id} | {row.message} | {row.ttfet_first_s:.3f} | {row.ttfet_visible_s:.3f} |")
    if len(m) > limit:
        lines.append(f"| ... {len(m) - limit} more in {path} | | | |")
    lines.append(f"messages: {summary.get('num_user_messages')}; first p50 {summary.get('ttfet_message_first_p50_s', float('nan')):.3f} s, "
                 f"p90 {summary.get('ttfet_message_first_p90_s', float('nan')):.3f} s; visible p50 "
                 f"{summary.get('ttfet_message_visible_p50_s', float('nan')):.3f} s, p90 "
                 f"{summary.get('ttfet_message_visible_p90_s', float('nan')):.3f} s; per session (mean of its "
                 f"messages, then mean over sessions): first {summary.get('ttfet_session_first_mean_s', float('nan')):.3f} s, "
                 f"visible {summary.get('ttfet_session_visible_mean_s', float('nan')):.3f} s; messages without a "
                 f"visible reading: {summary.get('num_messages_no_visible')}")
    return "\n".join(lines)


def _interrupted(out: Path, e: KeyboardInterrupt, multirun: bool, phase: Optional[str], complete: bool) -> None:
    """Ctrl-C / SIGTERM: mark ``out`` (:func:`_mark_interrupted`), say what is there, exit 130. ``phase``: one of
    ``harness.run.runner.PHASES``, ``"finish"`` (after every results file was written), or None (before the
    run began); ``complete``: the run's results are complete."""
    why = str(e) or "Ctrl-C"
    why = why if why.startswith("KeyboardInterrupt") else f"KeyboardInterrupt: {why}"
    _mark_interrupted(out, why, multirun, phase, complete)
    has = (out / "summary.json").is_file()
    print(f"interrupted ({why}); " + (f"the run had finished: its results are complete in {out}" if complete
                                       else f"what was measured is in {out} (partial)" if has else
                                       f"nothing was measured yet ({out})")
          + ("; the sweep stops here (re-run the same command to resume it)" if multirun else ""),
          file=sys.stderr)
    sys.exit(130)


def main() -> None:
    """The console script ``agentic-harness`` (and ``python run.py``): Hydra's command line (``group=option``,
    ``key=value``, ``-m`` sweeps, ``--help``) on the configs of :func:`config_path`; exit status 0 done, 1 the
    run failed (partial results written), 2 a config error (the harness's, or Hydra's own before any job
    began: an unknown key such as ``workload.bogus=1``, a missing option) or a file that cannot be written (a
    full disk, an unwritable directory), 130 interrupted (every results file written first; docs/outputs.md)."""
    gc.freeze()  # the modules imported so far stay out of the collections while Hydra composes (docs/speed.md)
    entered = _JOBS_ENTERED[0]   # (a process may call main more than once: the tests run it in theirs)
    try:
        with _compose_cache_from_the_start():
            hydra.main(config_path=config_path(), config_name="config", version_base="1.3")(_main)()
    except SystemExit as e:
        if e.code not in (0, None):
            hint = sweep_key_hint(sys.argv[1:])
            if hint:
                print(hint, file=sys.stderr)
        if e.code == 1 and _JOBS_ENTERED[0] == entered:
            # Hydra rejected the command line or the config (an unknown key, a bad override or option) before
            # any job began: bad input, exit status 2 like the harness's own config errors (its status 1 means
            # a run that failed). Hydra composes only configs here: nothing heavy (pandas) is imported yet.
            raise SystemExit(2) from None
        raise
    finally:
        _exit_without_gc_pass()


@contextlib.contextmanager
def _compose_cache_from_the_start():
    """While it is open, the Hydra instance the command line creates (``Hydra.create_main_hydra2``) has its config
    loader's ``harness.run.executor.ComposeCache`` from the start (``cache_compositions``: where the installed Hydra
    is the code the cache repeats, else nothing changes). Hydra composes the primary config twice before anything
    runs (once only to read ``hydra.mode``, then for the run or the sweep): with the cache the config files are
    read once, and a run's second compose merges nothing again (the same defaults list); a sweep's jobs then
    compose from the same files (docs/speed.md, "The sweep executor"). Its help text lists the config groups only
    where the help template asks for them (``harness.run.executor.help_on_demand``: the same text)."""
    from hydra._internal.hydra import Hydra

    from harness.run.executor import cache_compositions, help_on_demand
    create = Hydra.__dict__["create_main_hydra2"]

    def create_with_cache(cls, task_name, config_search_path):
        made = create.__func__(cls, task_name, config_search_path)
        cache_compositions(made.config_loader)
        help_on_demand(made)
        return made
    Hydra.create_main_hydra2 = classmethod(create_with_cache)
    try:
        yield
    finally:
        Hydra.create_main_hydra2 = create


def sweep_key_hint(argv: list[str]) -> Optional[str]:
    """The hint printed after a failed multirun whose command line sets a key of a swept config group
    (``-m scheduler=wait,nested_wait scheduler.idle_policy=decode_residents``), else None.

    Hydra composes a multirun's primary config *before* the sweep, with each swept group at its default
    (``scheduler=conserve``) and every other override applied, so a key that only the swept options have
    fails there ("Key 'idle_policy' not in 'ConserveConfig'"); ``++key=value`` adds it where it is missing,
    and each job sets it in the option it composes (a job whose option lacks the key is refused by the
    sweep's validation, ``ValidateSweepCallback``; conf/README.md, "hydra"). ``argv``: the command line
    without the program name. The hint is heuristic (it names the keys, not the error's cause), so it
    says "if the error names one of them"."""
    if not any(a in ("-m", "--multirun") for a in argv):
        return None
    swept = set()
    for a in argv:
        key, eq, value = a.partition("=")
        if eq and "," in value and not key.startswith("+") and "." not in key and "/" not in key:
            swept.add(key)
    keys = []
    for a in argv:
        key, eq, _ = a.partition("=")
        if eq and not key.startswith("+") and "." in key and key.split(".")[0] in swept:
            keys.append(key)
    if not keys:
        return None
    return (f"hint: in a sweep Hydra checks {', '.join(keys)} against the default option of the swept group "
            f"before the sweep; if the error names one of them, write " + " ".join(f"++{k}=..." for k in keys)
            + " (every swept option must have the key: the sweep's check refuses a job whose option lacks it; "
            "conf/README.md, \"hydra\")")


def _exit_without_gc_pass() -> None:
    """Let the interpreter exit without the cyclic collector walking the whole heap: ``gc.freeze()`` moves
    every object left (numpy, pandas, pyarrow, Hydra, the run's caches) to the permanent generation, which
    the collections of interpreter shutdown skip (Python docs, ``gc.freeze``). Everything is still freed
    by reference counting as the modules are torn down; only cyclic garbage left at exit stays unfreed,
    which the OS reclaims. Nothing written depends on it: every result file, ``run.log`` (the logging
    module's own shutdown flushes its handlers) and stdout/stderr are flushed explicitly. Saves ~0.3 s CPU
    of a ~8 s ``python run.py`` (docs/speed.md)."""
    gc.freeze()


if __name__ == "__main__":
    main()
