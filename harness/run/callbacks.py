"""Hydra callbacks: before a multirun, lock the sweep directory (``harness.analysis.provenance.DirLock``) and validate
every job (its config, its workload and its scheduler on its cluster: ``harness.run.runner.prepare``); after it,
print and save one comparison table of every job's summary (failed jobs marked, mixed fingerprints flagged)
and release the lock."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


def _overrides(run_dir: Path) -> dict[str, str]:
    """A job's command-line overrides (``.hydra/overrides.yaml``) as ``{key: value}``."""
    f = run_dir / ".hydra" / "overrides.yaml"
    if not f.exists():
        return {}
    out = {}
    for item in yaml.safe_load(f.read_text()) or []:
        k, _, v = str(item).partition("=")
        out[k.lstrip("+~")] = v
    return out


# The swept keys a variant's cost is pooled over in comparison.md (with every ``*seed*`` key): the x axes of
# the sweep report (harness.analysis.report.X_AXES), so a rate sweep's cost table has one row per scheduler.
COST_POOLED = ("workload.rate_per_s", "scheduler.predictor.sigma", "scheduler.predictor.error_rate")


def flag_rows(summaries: dict[str, dict]) -> str:
    """What ``comparison.md`` adds to its metric table for the named validity flags
    (``harness.analysis.validity.FLAGS``) that some job raised: one row per flag, ``| <flag> | yes ⚠ | no |
    ... |`` (``-`` for a job without the key), then, after the table, one line per flagged job with its
    reason (``<flag>_reason``). ``""`` when no job raised one."""
    from harness.analysis.validity import FLAGS
    rows, notes = [], []
    for flag in FLAGS:
        if not any(s.get(flag) for s in summaries.values()):
            continue
        cells = ["yes ⚠" if s.get(flag) else "-" if flag not in s else "no" for s in summaries.values()]
        rows.append(f"| {flag.replace('_', ' ')} | " + " | ".join(cells) + " |")
        notes += [f"- ⚠ {label}: {flag}: {s.get(flag + '_reason', '')}" for label, s in summaries.items()
                  if s.get(flag)]
    if not rows:
        return ""
    return "\n" + "\n".join(rows) + "\n\n" + "\n".join(notes)


class SummaryTableCallback(Callback):
    """Writes ``comparison.md`` in the sweep directory and prints it: one column per job, labelled by
    the overrides that differ between the jobs (the scheduler by its name); under it the jobs a named
    validity flag marks (:func:`flag_rows`: WAIT's infeasible fluid plan) and the cost of each variant
    (``harness.analysis.cost.cost_table``: the jobs pooled over the seeds and the x axis, :data:`COST_POOLED`)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from harness.analysis.catalog import summary_table
        sweep = Path(config.hydra.sweep.dir)
        summaries = {}

        def job(p: Path) -> str:  # the job's own directory (an override holding '/' nests deeper)
            return p.relative_to(sweep).parts[0]

        def num(p: Path) -> int:
            head = job(p).split("_")[0]
            return int(head) if head.isdigit() else 0

        runs = sorted(sweep.rglob("summary.json"), key=num)
        overrides = [_overrides(p.parent) for p in runs]
        varying = [k for k in dict.fromkeys(k for o in overrides for k in o)
                   if len({o.get(k) for o in overrides}) > 1]
        for p, o in zip(runs, overrides):
            label = ",".join(o[k] if k == "scheduler" else f"{k}={o.get(k)}" for k in varying) or job(p)
            summaries[f"{num(p)}:{label}" if label in summaries else label] = json.loads(p.read_text())
        if not summaries:
            return
        table = summary_table(summaries) + flag_rows(summaries)
        from harness.analysis.cost import cost_table
        variants = [",".join(o[k] if k == "scheduler" else f"{k}={o.get(k)}" for k in varying
                             if k not in COST_POOLED and "seed" not in k.split(".")[-1]) or "all runs"
                    for o in overrides]
        cost = cost_table(zip(variants, summaries.values()))
        if cost:
            table += ("\n\n## Cost per variant (the runs of each variant pooled over "
                      + (", ".join(k for k in varying if k in COST_POOLED or "seed" in k.split(".")[-1])
                         or "nothing") + ")\n\n" + cost)
        from harness.analysis.provenance import mixed_components, mixed_warning, read_fingerprint
        warn = mixed_warning(mixed_components([read_fingerprint(p.parent) for p in runs]))
        if warn:
            table = f"**{warn}**\n\n{table}"
            print(warn, file=sys.stderr)
        failed = [label for label, smr in summaries.items() if smr.get("partial")]
        if failed:
            table += (f"\n\n{len(failed)} of {len(summaries)} jobs failed (partial results): "
                      + "; ".join(f"{label}: {summaries[label].get('error', '')}" for label in failed))
        (sweep / "comparison.md").write_text(table + "\n")
        if len(summaries) <= 12:
            print(f"\nSweep {sweep} ({len(summaries)} runs):\n{table}")
        else:
            print(f"\nSweep {sweep}: {len(summaries)} runs; table in {sweep / 'comparison.md'}; "
                  f"figures: python -m harness.analysis.report {sweep}")


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """Every job's overrides of a multirun, expanded as Hydra's basic sweeper expands them: the
    ``hydra.sweeper.params`` of the config (e.g. an experiment preset's) then the command line."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    node = config.hydra.sweeper.get("params")
    params = OmegaConf.to_container(node, resolve=False) if node else {}
    args = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    overrides = OverridesParser.create().parse_overrides(args)
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


class OutputDirCallback(Callback):
    """Before a run or a sweep, its output directory (``hydra.run.dir`` / ``hydra.sweep.dir``) is created and
    a probe file of :attr:`PROBE_BYTES` written there and removed; if that fails (a path under a regular file,
    a read-only file system, no permission, a full disk, a file-size limit such as ``ulimit -f``), one line
    names the directory and why and the command exits with status 2 before anything runs (Hydra would
    otherwise stop on its own ``mkdir`` or config write with a traceback). A disk that fills later, during
    the run, is reported the same way when a results file cannot be written (``harness.run.cli``). Listed
    first in ``conf/config.yaml``."""

    PROBE_BYTES = 1 << 20   # 1 MiB: more than Hydra's own files (~30 kB) and a short run's results files

    @classmethod
    def _check(cls, d: Path, what: str) -> None:
        import os
        made = [p for p in (d, *d.parents) if not p.exists()]   # removed again: Hydra makes them when it runs
        try:
            d.mkdir(parents=True, exist_ok=True)
            if not os.access(d, os.W_OK | os.X_OK):
                raise PermissionError(13, "not writable")
            probe = d / f".write-probe.{os.getpid()}"
            try:
                with open(probe, "wb") as f:
                    f.write(bytes(cls.PROBE_BYTES))
            finally:
                probe.unlink(missing_ok=True)
                for p in made:   # deepest first; a directory something else wrote into meanwhile stays
                    try:
                        p.rmdir()
                    except OSError:
                        break
        except OSError as e:
            print(f"error: cannot write the {what} directory {d}: {e.strerror or e}; nothing was run",
                  file=sys.stderr)
            sys.exit(2)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(Path(str(config.hydra.run.dir)), "run")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(Path(str(config.hydra.sweep.dir)), "sweep")


class SweepLockCallback(Callback):
    """Takes the sweep directory's lock (``harness.analysis.provenance.DirLock``, ``.sweep.lock``) before any job runs
    and releases it when the sweep ends (or the process exits, however). A second sweep into a locked
    ``hydra.sweep.dir`` prints the holder (pid, host, since, command) and exits with status 2 before anything
    runs; a lock left by a dead holder is taken over with a warning naming it."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from harness.analysis.provenance import SWEEP_LOCK, DirLock, LockHeld
        try:
            self.lock = DirLock(Path(config.hydra.sweep.dir), SWEEP_LOCK).acquire()
        except LockHeld as e:
            print(f"error: another sweep is writing this sweep directory; nothing was run: {e}", file=sys.stderr)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        lock = getattr(self, "lock", None)
        if lock is not None:
            lock.release()


class ValidateSweepCallback(Callback):
    """Before the first job of a multirun runs, compose and validate (``harness.run.config.resolve``) every
    job's config and check what a job would check before running (``harness.run.runner.prepare``: its trace, its
    workload after ``workload.context_overflow``, its scheduler on its cluster); if any is invalid, print every
    invalid job with its error and exit (status 2) before anything runs. (Hydra turns an exception raised by a
    callback into a warning, so this exits.) Under the pool launcher each job's config is composed once for the whole
    sweep (``harness.run.executor.ComposedConfigs``: this validation, Hydra's own and the launch share it). A trace
    is parsed once per distinct file (``harness.core.trace.load_trace``
    memoises by content), and the jobs run in this process reuse that parse. Then it prints the sweep's expected
    CPU-hours (``harness.analysis.cost.expected_cost_line``: the costs of prior runs in the sweep directory's
    parent folder and its sibling ``runs/``, else the per-variant model of docs/speed.md)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra import compose

        from harness.run.config import ConfigError, resolve
        from harness.run.runner import prepare
        from harness.core.trace import TraceError
        from harness.analysis.cost import JobShape, expected_cost_line
        from harness.run.executor import job_config
        jobs = sweep_jobs(config)
        bad = []
        shapes = []
        for i, job in enumerate(jobs):
            try:
                cfg = job_config(config, job)   # the pool launcher's memo: composed once for the sweep
                run = resolve(cfg if cfg is not None else compose(config_name=config.hydra.job.config_name,
                                                                   overrides=job))
                conversations, _, _ = prepare(run)  # load_trace memoises by content: each trace is parsed once
                w = run.cfg.workload
                shapes.append(JobShape(run.scheduler_name, run.cfg.cluster.name, run.cfg.model.name,
                                       w.name if w.kind == "synthetic" else run.trace_path.name,
                                       float(w.rate_per_s) if w.arrival not in ("trace", "fixed", "closed")
                                       else float("nan"), len(conversations)))
            except (ConfigError, TraceError) as e:
                bad.append(f"  job {i} ({' '.join(job)}): {e}")
            except Exception as e:  # noqa: BLE001 -- composition errors are reported the same way
                bad.append(f"  job {i} ({' '.join(job)}): {type(e).__name__}: {str(e).splitlines()[0]}")
        if bad:
            print(f"error: {len(bad)} of {len(jobs)} sweep jobs are invalid; nothing was run:\n" + "\n".join(bad),
                  file=sys.stderr)
            sys.exit(2)
        # the expected CPU-hours (harness.analysis.cost): prior runs beside this sweep, else the stated model
        sweep = Path(str(config.hydra.sweep.dir))
        from harness.run.executor import workers_for
        launcher = config.hydra.get("launcher") or {}
        try:   # a launcher with n_jobs (pool, joblib): null or <= 0 = every core this process may use
            parallel = workers_for(launcher.get("n_jobs"), len(jobs)) if "n_jobs" in launcher else 1
            if launcher.get("array_parallelism"):   # Slurm: its tasks at once (pool_slurm: a chunk of jobs each)
                from harness.run.cluster_sweep import plan_chunks
                slots = int(launcher.get("array_parallelism"))
                parallel = max(1, min(slots, len(plan_chunks(len(jobs), launcher.get("jobs_per_task", 1), slots))))
        except ValueError:
            parallel = 1
        print(expected_cost_line(shapes, [sweep.parent, sweep.parent.parent / "runs"], parallel), flush=True)
