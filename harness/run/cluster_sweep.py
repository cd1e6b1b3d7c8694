"""The sweep executor on a cluster: a multirun's jobs in CHUNKS, each chunk one Slurm task
(``hydra/launcher=pool_slurm``: one Slurm job array submitted with submitit, the library Hydra's submitit
launcher uses) or one Ray task (``hydra/launcher=pool_ray``), that runs its jobs one after another in one
process through the sweep executor's job body (``harness.run.executor._run_job``: Hydra's ``run_job``).

Why: Hydra's submitit launcher (``hydra/launcher=slurm``) runs each job in a process of its own, which pays the
imports (Hydra, numpy, pandas, pyarrow, the policies), the trace's parse and the SLO baseline's replays again; Hydra's
Ray launcher (``ray``) runs each job as a Ray task (Ray keeps its worker processes, so their imports stay, but every
task is sent the sweep's context anew); and both compose each job's config two or three times in the submitting
process. Here a task keeps, across the jobs of its chunk, what the process-wide caches hold (the imports, the parsed
traces, the SLO baselines; see ``harness.run.executor``), a Ray worker process keeps them across the chunks it runs
after each other (Ray reuses a worker process for the tasks of one function), and each job is composed once.
Measured: ``benchmarks/cluster_sweep.py`` (docs/guide.md, section 3). Nothing a run computes depends on which process
ran it (the executor's argument; tests/test_clusters.py checks a Slurm and a Ray sweep against the local pool, file
for file).

The submitting process (``python run.py -m``) composes each job's config once (``executor.ComposedConfigs``: the
memo the sweep's validation filled), sets the job's number (the sweep directory's ``${now:}`` and ``${pid:}``
resolve in a task as here: both are cached per config), and ships the composed configs with the sweep's
context (Hydra's context, the sweep's config, the task function, Hydra's singletons) and its working directory (a
task runs there, so relative paths resolve as in a local sweep). Each job writes its own run directory, so the
sweep's files are the same whichever launcher ran it; resume works as everywhere (re-run the command: a job whose
``summary.json`` is complete with the same fingerprint is skipped, ``harness.run.cli``).

Chunks (:func:`plan_chunks`): contiguous runs of the sweep's job order (neighbours share a trace and a seed's
SLO baseline), ``hydra.launcher.jobs_per_task`` jobs each; null: the fewest that fill the parallel slots,
``ceil(jobs / slots)`` with slots = Slurm's ``array_parallelism`` or the Ray cluster's CPUs divided by
``ray.remote.num_cpus``. A job that costs several times another (WAIT in the infeasible regime: docs/speed.md)
makes equal chunks finish at different times: a smaller ``jobs_per_task`` balances them.

Failures, never silent, never losing the others' results:

* a job that fails (an exception in it) is reported with its traceback, on the task's stderr when it happens and
  in the submitting process at the end (a failed ``JobReturn``: Hydra raises it once the sweep's jobs are done,
  exit 1); the other jobs of its chunk still run. A run that fails inside (``RuntimeError``) writes its partial
  results and is marked in ``comparison.md``, as in every launcher;
* a job that exits (status 2: bad input; 130: a Ctrl-C / SIGTERM / ``scancel`` reached it, its partial results
  written) ends its chunk there; the jobs after it in that chunk are not run; other chunks go on. The sweep then
  exits with that status once every chunk has reported (130 first, then 2);
* a task that ends without reporting (killed: out of memory, a time limit, a node lost) fails its jobs with
  what Slurm / Ray said (the task's log tail, Ray's error); the jobs it completed are complete on disk;
* Ctrl-C in the submitting process cancels the tasks (``scancel``: SIGTERM to each running job, which writes
  what it measured; ``ray.cancel``: a ``KeyboardInterrupt`` in each running job), waits for them to report
  (:data:`CANCEL_WAIT_S` at most; a second Ctrl-C stops waiting) and exits 130: re-run the same command to resume.

Every launch writes ``tasks.json`` into the sweep directory (:func:`write_manifest`): per task its id (Slurm's
``<array job>_<task>``, Ray's task id), host, process id, jobs, status, the process's CPU at the chunk's start and
end, and per job its status and the process CPU it took, s.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

log = logging.getLogger(__name__)

CANCEL_WAIT_S = 60.0   # after a Ctrl-C: how long the submitting process waits for the cancelled tasks, s
LOST_GRACE_S = 30.0    # a Slurm task gone from the queue without a result file: how long to wait for it, s
MANIFEST = "tasks.json"
# Slurm job states after which a task runs no more (squeue(1), "JOB STATE CODES")
ENDED_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                          "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT"})


# ---- chunks -------------------------------------------------------------------------------------------


def plan_chunks(jobs: int, jobs_per_task: Optional[int], slots: int) -> list[range]:
    """The chunks of a sweep of ``jobs`` jobs: contiguous ranges of job positions (0-based) of ``jobs_per_task``
    jobs each, the last one shorter when it does not divide; ``jobs_per_task`` None: ``ceil(jobs / slots)`` (the
    fewest chunks that fill ``slots`` parallel tasks; ``slots`` < 1 counts as 1).

    Raises:
        ValueError: ``jobs_per_task`` is not a positive integer or null (naming ``hydra.launcher.jobs_per_task``).
    """
    if jobs_per_task is not None and (isinstance(jobs_per_task, bool) or not isinstance(jobs_per_task, int)
                                      or jobs_per_task < 1):
        raise ValueError(f"hydra.launcher.jobs_per_task must be a positive integer or null, got {jobs_per_task!r}")
    if jobs < 1:
        return []
    size = jobs_per_task if jobs_per_task is not None else math.ceil(jobs / max(1, int(slots)))
    return [range(a, min(a + size, jobs)) for a in range(0, jobs, size)]


# ---- one chunk, in the task ---------------------------------------------------------------------------


class JobFailed(RuntimeError):
    """A job of a chunk raised; the message names the job, the host and process, and carries the job's traceback
    (the exception itself may not survive the trip back to the submitting process)."""


@dataclass
class JobOutcome:
    """One job of a chunk: ``status`` ``completed`` | ``failed`` (an exception: ``error`` its traceback) |
    ``exit`` (the job exited with status ``code``) | ``not run`` (an earlier job of the chunk exited: ``error``
    says which) | ``lost`` (the task ended without reporting: ``error`` says how); ``cpu_s`` the process CPU
    (user + system) the job took, s; ``ret`` Hydra's ``JobReturn`` (without its Hydra config), None unless
    completed or failed."""

    num: int
    status: str
    code: Optional[int] = None
    cpu_s: float = 0.0
    error: str = ""
    ret: Any = None


@dataclass
class ChunkResult:
    """What a task reports: its host and process id, the process CPU (user + system since the process started,
    s) at the chunk's start and end, and one :class:`JobOutcome` per job of the chunk, in order."""

    host: str
    pid: int
    cpu_start_s: float
    cpu_end_s: float
    jobs: list = field(default_factory=list)


def _stop(signum: int, frame: Any) -> None:
    """A chunk's SIGTERM / SIGUSR2: a ``KeyboardInterrupt`` (a running job writes what it measured, exits 130)."""
    import signal
    raise KeyboardInterrupt(f"signal {signum} ({signal.Signals(signum).name})")


def _cpu_s() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_chunk(payload: tuple, jobs: Sequence[tuple]) -> ChunkResult:
    """Run a chunk in this process (the body of a Slurm task / Ray task): ``payload`` = (Hydra's context, the
    sweep's config, the task function, Hydra's singleton state, the submitting process's working directory),
    ``jobs`` = ``(job number, composed job config)`` pairs. The jobs run one after another through
    ``harness.run.executor._run_job``, in the submitting process's working directory where this host has it,
    with SIGTERM raising ``KeyboardInterrupt`` (``scancel`` and Slurm's time limit send it; a running job then
    writes what it measured and exits 130), and in a submitit task SIGUSR2 too (submitit's "the time limit is
    near" signal, ``signal_delay_s`` before it: the chunk stops cleanly there, where submitit's own handler would
    raise inside the running job and let the chunk go on into the limit). Never raises for a job (see the module
    docstring); the working directory and the signal handlers are restored at the end (a Ray worker runs further
    tasks)."""
    import pickle
    import signal
    import socket
    import traceback

    from hydra.core.utils import JobStatus

    from harness.run import executor
    host, pid = socket.gethostname(), os.getpid()
    result = ChunkResult(host, pid, _cpu_s(), float("nan"))
    hydra_context, config, task_function, state, cwd = payload
    old_cwd = os.getcwd()
    stops = [signal.SIGTERM] + ([signal.SIGUSR2] if os.environ.get("SUBMITIT_FOLDER") else [])
    old = {s: signal.getsignal(s) for s in (*stops, signal.SIGINT)}
    stop = ""
    try:
        for s in stops:
            signal.signal(s, _stop)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)
        executor._init(hydra_context, config, task_function, state, pooled=False)
        for num, sweep_config in jobs:
            if stop:
                result.jobs.append(JobOutcome(num, "not run", error=stop))
                continue
            c0 = _cpu_s()
            try:
                ret = executor._run_job(num, (), sweep_config)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                result.jobs.append(JobOutcome(num, "exit" if code else "completed", code or None, _cpu_s() - c0))
                if code:
                    stop = f"job {num} exited with status {code} on {host} (pid {pid})"
            except KeyboardInterrupt as e:   # between Hydra's start of the job and the harness's body
                result.jobs.append(JobOutcome(num, "exit", 130, _cpu_s() - c0, f"interrupted: {e}"))
                stop = f"job {num} was interrupted on {host} (pid {pid})"
            except Exception as e:  # noqa: BLE001 -- Hydra's run_job outside the task function (its files, callbacks)
                text = "".join(traceback.format_exception(e))
                print(f"job {num} failed on {host} (pid {pid}):\n{text}", file=sys.stderr, flush=True)
                result.jobs.append(JobOutcome(num, "failed", None, _cpu_s() - c0, text))
            else:
                ret.hydra_cfg = None   # the job's Hydra config stays in its .hydra/ files
                out = JobOutcome(num, "completed", None, _cpu_s() - c0, "", ret)
                if ret.status == JobStatus.FAILED:
                    e = ret._return_value
                    text = "".join(traceback.format_exception(e)) if isinstance(e, BaseException) else repr(e)
                    print(f"job {num} failed on {host} (pid {pid}):\n{text}", file=sys.stderr, flush=True)
                    out.status, out.error = "failed", text
                    ret._return_value = JobFailed(f"job {num} on {host} (pid {pid}) raised:\n{text}")
                try:
                    pickle.dumps(ret)
                except Exception as e:  # noqa: BLE001 -- the summary (or an error) would not survive the trip back
                    ret._return_value = (JobFailed(f"job {num} on {host} (pid {pid}): its result cannot be sent back "
                                                   f"({type(e).__name__}: {e}); its files are in its run directory")
                                         if out.status == "failed" else None)
                result.jobs.append(out)
            sys.stdout.flush()
            sys.stderr.flush()
    except KeyboardInterrupt as e:   # between two jobs: the jobs not started are not started
        stop = f"interrupted on {host} (pid {pid}) between jobs: {e or 'Ctrl-C'}"
        done = {o.num for o in result.jobs}
        result.jobs += [JobOutcome(num, "not run", error=stop) for num, _ in jobs if num not in done]
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        os.chdir(old_cwd)
    result.cpu_end_s = _cpu_s()
    return result


# ---- the submitting process ---------------------------------------------------------------------------


class Backend:
    """Where chunks run: :class:`SlurmBackend` or :class:`RayBackend`. ``name``: for messages; ``slots``: how many
    tasks can run at once; ``submit`` returns one handle per chunk; ``poll`` waits up to about a second and returns
    ``{chunk index: ChunkResult or the reason it was lost (str)}`` for chunks that ended; ``cancel`` stops them;
    ``task_id`` names a chunk's task; ``describe`` is the start line's tail."""

    name = "?"

    def slots(self) -> int:
        raise NotImplementedError

    def submit(self, payload: tuple, chunks: list[list[tuple]]) -> list:
        raise NotImplementedError

    def poll(self, handles: list, pending: Sequence[int]) -> dict:
        raise NotImplementedError

    def cancel(self, handles: list, pending: Sequence[int]) -> None:
        raise NotImplementedError

    def task_id(self, handle: Any) -> str:
        return str(handle)

    def describe(self) -> str:
        return ""


def composed_jobs(hydra_context: Any, config: Any, job_overrides: Sequence[Sequence[str]],
                  initial_job_idx: int) -> list[tuple]:
    """``(job number, overrides, composed config)`` per job, composed through the sweep's memo
    (``executor.composed``: once per sweep), with ``hydra.job.id`` / ``num`` the job's number (as the local pool
    sets them). Its ``${now:}`` and ``${pid:}`` resolve in a task as here (both resolvers cached per config, the
    sweep's cache copied into each job's by Hydra's ``load_sweep_config``)."""
    from omegaconf import open_dict

    from harness.run.executor import composed
    memo = composed(hydra_context.config_loader)
    out = []
    for i, o in enumerate(job_overrides):
        idx = initial_job_idx + i
        c = memo.load_sweep_config(config, list(o))
        with open_dict(c):
            c.hydra.job.id = idx
            c.hydra.job.num = idx
        out.append((idx, list(o), c))
    return out


def _job_dir(c: Any) -> str:
    from omegaconf import OmegaConf
    try:
        return os.path.join(str(c.hydra.sweep.dir), str(OmegaConf.select(c, "hydra.sweep.subdir")))
    except Exception:  # noqa: BLE001 -- only for messages
        return str(c.hydra.sweep.dir)


def launch_chunks(backend: Backend, hydra_context: Any, config: Any, task_function: Any,
                  job_overrides: Sequence[Sequence[str]], initial_job_idx: int, jobs_per_task: Optional[int],
                  manifest: Optional[list] = None) -> list:
    """Run a sweep's jobs in chunks on ``backend`` (module docstring) and return their ``JobReturn`` in job
    order (a job that failed or was lost: a failed one, which Hydra raises once the sweep is done).
    ``manifest``: the launcher's list of this command's tasks (every launch appends its own and rewrites
    ``tasks.json``).

    Raises:
        ValueError: ``jobs_per_task`` is invalid (naming the key).
        SystemExit: 130 interrupted (a Ctrl-C here, or a job of a task exited 130), else the exit status of a job
            that exited (2: bad input); raised after every chunk reported.
    """
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
    from hydra.types import HydraContext

    from harness.run.executor import ComposedConfigs

    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    jobs = composed_jobs(hydra_context, config, job_overrides, initial_job_idx)
    chunks = [[jobs[i] for i in r] for r in plan_chunks(len(jobs), jobs_per_task, backend.slots())]
    size = max((len(c) for c in chunks), default=0)
    print(f"sweep executor on {backend.name}: {len(jobs)} jobs in {len(chunks)} {backend.name} tasks of up to {size} "
          f"job{'s' if size > 1 else ''} (hydra.launcher.jobs_per_task="
          f"{jobs_per_task if jobs_per_task is not None else f'null: {len(jobs)} jobs / {backend.slots()} slots'}), "
          f"each task one process that keeps its imports, parsed traces and SLO baselines across its jobs"
          f"{backend.describe()}", flush=True)
    for idx, o, _ in jobs:
        log.info(f"\t#{idx} : {' '.join(filter_overrides(o))}")
    loader = hydra_context.config_loader
    ctx = HydraContext(config_loader=loader._loader if isinstance(loader, ComposedConfigs) else loader,
                       callbacks=hydra_context.callbacks)   # the tasks compose nothing: no memo shipped
    payload = (ctx, config, task_function, Singleton.get_state(), os.getcwd())
    handles = backend.submit(payload, [[(idx, c) for idx, _, c in chunk] for chunk in chunks])
    results: dict[int, Any] = {}
    interrupted = ""
    try:
        while len(results) < len(chunks):
            results.update(backend.poll(handles, [i for i in range(len(chunks)) if i not in results]))
    except KeyboardInterrupt:
        interrupted = "Ctrl-C in the submitting process"
        pending = [i for i in range(len(chunks)) if i not in results]
        print(f"interrupted: cancelling {len(pending)} {backend.name} tasks and waiting up to {CANCEL_WAIT_S:.0f} s for "
              f"their running jobs to write what they measured (Ctrl-C again to stop waiting)", file=sys.stderr,
              flush=True)
        backend.cancel(handles, pending)
        deadline = time.monotonic() + CANCEL_WAIT_S
        try:
            while len(results) < len(chunks) and time.monotonic() < deadline:
                results.update(backend.poll(handles, [i for i in range(len(chunks)) if i not in results]))
        except KeyboardInterrupt:
            pass
    finally:
        if isinstance(hydra_context.config_loader, ComposedConfigs):
            hydra_context.config_loader.clear()

    returns, entries, problems, codes = [], [], [], []
    for k, chunk in enumerate(chunks):
        res = results.get(k, "cancelled; no report from the task" if interrupted else "no report from the task")
        task = backend.task_id(handles[k])
        if isinstance(res, ChunkResult):
            outcomes = {o.num: o for o in res.jobs}
            entry = {"task": task, "host": res.host, "pid": res.pid, "status": "reported",
                     "cpu_start_s": res.cpu_start_s, "cpu_end_s": res.cpu_end_s}
        else:
            outcomes = {idx: JobOutcome(idx, "lost", error=f"{backend.name} task {task} ended without reporting: {res}")
                        for idx, _, _ in chunk}
            entry = {"task": task, "host": None, "pid": None, "status": f"lost: {str(res)[:2000]}",
                     "cpu_start_s": None, "cpu_end_s": None}
        entry["jobs"] = []
        for idx, o, c in chunk:
            out = outcomes.get(idx) or JobOutcome(idx, "lost", error=f"task {task} did not report job {idx}")
            entry["jobs"].append({"num": idx, "dir": _job_dir(c), "status": out.status, "code": out.code,
                                  "cpu_s": out.cpu_s})
            where = f"job {idx} ({' '.join(filter_overrides(o))}; {_job_dir(c)})"
            if out.status == "completed" and out.ret is None:   # the job called sys.exit(0)
                out.ret = JobReturn(overrides=list(o), working_dir=os.getcwd(), status=JobStatus.COMPLETED)
            if out.status in ("completed", "failed") and out.ret is not None:
                returns.append(out.ret)
                if out.status == "failed":
                    problems.append(f"{where} failed in {backend.name} task {task} (traceback above and in the "
                                    f"task's log)")
                continue
            if out.status == "exit":
                codes.append(out.code)
                problems.append(f"{where} exited with status {out.code} in {backend.name} task {task}")
            elif out.status == "lost":
                problems.append(f"{where}: {out.error.splitlines()[0] if out.error else out.status}")
            elif out.status == "failed":   # Hydra's run_job itself raised: the exception's line, the traceback above
                problems.append(f"{where} failed in {backend.name} task {task}: "
                                f"{out.error.strip().splitlines()[-1] if out.error.strip() else '?'}")
            elif out.status == "not run":
                problems.append(f"{where} not run: {out.error}")
            err = JobFailed(f"{where}: {out.status}: {out.error}" if out.error else f"{where}: {out.status}")
            returns.append(JobReturn(overrides=list(o), cfg=None, hydra_cfg=None, working_dir=os.getcwd(),
                                     task_name=str(config.hydra.job.name), status=JobStatus.FAILED,
                                     _return_value=err))
        entries.append(entry)
    if manifest is not None:
        manifest += [{"backend": backend.name, "jobs_per_task": jobs_per_task, **e} for e in entries]
        write_manifest(sweep_dir, manifest)
    if problems:
        print(f"sweep executor on {backend.name}: {len(problems)} of {len(jobs)} jobs did not complete:\n  "
              + "\n  ".join(problems), file=sys.stderr, flush=True)
    if interrupted or 130 in codes:
        print(f"interrupted ({interrupted or 'a job of a task was interrupted'}); the sweep stops here (jobs that "
              f"were running wrote what they measured; re-run the same command to resume it: complete jobs are "
              f"skipped)", file=sys.stderr, flush=True)
        sys.exit(130)
    if codes:
        sys.exit(2 if 2 in codes else codes[0])
    return returns


def write_manifest(sweep_dir: Path, entries: list) -> None:
    """``<sweep dir>/tasks.json``: the tasks of this command (module docstring), written atomically."""
    from harness.core.recorder import write_json
    write_json({"tasks": entries}, sweep_dir / MANIFEST)


# ---- Slurm (submitit) ---------------------------------------------------------------------------------


class SlurmBackend(Backend):
    """One Slurm job array (submitit's ``AutoExecutor(cluster="slurm")``, ``map_array``), one array task per
    chunk, with the Slurm keys of Hydra's submitit launcher (``params``: ``submitit_folder``, ``timeout_min``,
    ``cpus_per_task``, ``mem_gb``, ``partition``, ``array_parallelism``, ``additional_parameters``, ...; the
    keys of ``hydra_plugins.hydra_submitit_launcher.config.SlurmQueueConf``). A task's report is submitit's result
    file; a task that left the queue (``squeue``) without one for :data:`LOST_GRACE_S` is lost (a cluster
    without accounting, where ``sacct`` cannot say, included)."""

    name = "Slurm"

    def __init__(self, params: dict):
        self.params = dict(params)
        self._gone: dict[int, float] = {}
        self._squeue_at = 0.0
        self._queued: Optional[set] = None

    def slots(self) -> int:
        return max(1, int(self.params.get("array_parallelism") or 1))

    def _executor(self) -> Any:
        import submitit
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
        from omegaconf import OmegaConf
        params = dict(self.params)
        init = {"folder": params.pop("submitit_folder")}
        if "max_num_timeout" in params:
            init["slurm_max_num_timeout"] = params.pop("max_num_timeout")
        ex = submitit.AutoExecutor(cluster="slurm", **init)
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        ex.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
        return ex

    def submit(self, payload: tuple, chunks: list[list[tuple]]) -> list:
        import functools
        return self._executor().map_array(functools.partial(run_chunk, payload), chunks)

    def task_id(self, handle: Any) -> str:
        return str(handle.job_id)

    def describe(self) -> str:
        return f" (one Slurm job array, at most {self.slots()} tasks at once)"

    def _in_queue(self, handles: list) -> Optional[set]:
        """The array tasks ``squeue`` lists (pending or running), refreshed every 5 s; None when it cannot say."""
        import subprocess
        if time.monotonic() - self._squeue_at < 5.0:
            return self._queued
        self._squeue_at = time.monotonic()
        arrays = sorted({str(h.job_id).split("_")[0] for h in handles})
        try:
            r = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(arrays)], capture_output=True,
                               text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self._queued = None
            return None
        # squeue exits 1 with "Invalid job id" once every task of the array has left the controller's memory; a task
        # that ended may still be listed for a while, in a final state
        if r.returncode and "Invalid job id" not in r.stderr:
            self._queued = None
        else:
            rows = [ln.split() for ln in r.stdout.splitlines() if ln.strip()]
            self._queued = {row[0] for row in rows if len(row) > 1 and row[1] not in ENDED_STATES}
        return self._queued

    def poll(self, handles: list, pending: Sequence[int]) -> dict:
        out = {}
        queued = self._in_queue([handles[i] for i in pending])
        for i in pending:
            h = handles[i]
            if h.paths.result_pickle.exists():
                try:
                    out[i] = h.results()[0]
                except Exception as e:  # noqa: BLE001 -- submitit's FailedJobError: the task's traceback
                    out[i] = f"{type(e).__name__}: {e}"
                continue
            if queued is None or str(h.job_id) in queued:
                self._gone.pop(i, None)
                continue
            first = self._gone.setdefault(i, time.monotonic())
            started = h.paths.stdout.exists()
            if not started or time.monotonic() - first > LOST_GRACE_S:
                tail = ""
                if h.paths.stderr.exists():
                    tail = "; its log ends: " + " | ".join(h.paths.stderr.read_text(errors="replace").splitlines()[-8:])
                out[i] = (f"it left the Slurm queue without a result ({'never started' if not started else 'killed?'}"
                          f"; log {h.paths.stderr}){tail}")
        if len(out) < len(pending):
            time.sleep(1.0)
        return out

    def cancel(self, handles: list, pending: Sequence[int]) -> None:
        for i in pending:
            handles[i].cancel(check=False)


# ---- Ray ------------------------------------------------------------------------------------------------


class RayBackend(Backend):
    """Ray tasks (``ray.remote(**remote)(run_chunk)``), one per chunk, on the Ray cluster ``ray.init(**init)``
    joins or starts (``init`` / ``remote``: the ``ray.init`` and ``ray.remote`` keyword arguments, as in Hydra's
    Ray launcher's ``hydra.launcher.ray``); the sweep's context goes to the object store once (``ray.put``). Ray
    runs the tasks of one function on worker processes it keeps, so a worker keeps its caches across the chunks
    it runs."""

    name = "Ray"

    def __init__(self, init: dict, remote: dict):
        self.init = dict(init or {})
        self.remote = dict(remote or {})
        self._ray: Any = None

    def _start(self) -> Any:
        if self._ray is None:
            import ray
            if not ray.is_initialized():
                log.info(f"Initializing ray with config: {self.init}")
                ray.init(**self.init)
            self._ray = ray
        return self._ray

    def slots(self) -> int:
        ray = self._start()
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        per = float(self.remote.get("num_cpus", 1) or 1)
        return max(1, int(cpus // per))

    def describe(self) -> str:
        ray = self._start()
        return (f" (a Ray cluster of {ray.cluster_resources().get('CPU', 0):g} CPUs; Ray keeps its worker processes "
                f"across tasks)")

    def submit(self, payload: tuple, chunks: list[list[tuple]]) -> list:
        ray = self._start()
        fn = ray.remote(**self.remote)(run_chunk) if self.remote else ray.remote(run_chunk)
        ref = ray.put(payload)
        return [fn.remote(ref, chunk) for chunk in chunks]

    def task_id(self, handle: Any) -> str:
        try:
            return handle.task_id().hex()
        except Exception:  # noqa: BLE001
            return str(handle)

    def poll(self, handles: list, pending: Sequence[int]) -> dict:
        ray = self._ray
        refs = {handles[i]: i for i in pending}
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
        out = {}
        for r in ready:
            try:
                out[refs[r]] = ray.get(r)
            except ray.exceptions.TaskCancelledError as e:
                out[refs[r]] = f"cancelled ({type(e).__name__})"
            except ray.exceptions.RayError as e:
                out[refs[r]] = f"{type(e).__name__}: {e}"
        return out

    def cancel(self, handles: list, pending: Sequence[int]) -> None:
        for i in pending:
            try:
                self._ray.cancel(handles[i])
            except Exception as e:  # noqa: BLE001 -- finished meanwhile
                log.info(f"ray.cancel: {e}")
