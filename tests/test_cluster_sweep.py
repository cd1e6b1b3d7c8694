"""Chunked sweeps on a cluster (``harness.run.cluster_sweep``, ``hydra/launcher=pool_slurm`` / ``pool_ray``): how a
sweep is cut into chunks, what a chunk reports when a job completes, fails or exits, and what the submitting
process makes of the reports (failed jobs raised at the end, a lost task's jobs failed with its reason, exit 130
after every chunk reported, ``tasks.json``). No cluster here: a fake backend runs each chunk in this process
(``run_chunk`` itself, with the executor's job body replaced by a scripted one). The real local Slurm and Ray runs
are in tests/test_clusters.py."""

from __future__ import annotations

import json
import pickle

import pytest
from omegaconf import OmegaConf

from harness.run import cluster_sweep as cs
from harness.run.cluster_sweep import JobFailed, plan_chunks


def test_chunks_are_contiguous_runs_of_jobs_per_task_or_fill_the_slots():
    # by hand: 5 jobs, 2 a task -> [0 1] [2 3] [4]
    assert [list(r) for r in plan_chunks(5, 2, 64)] == [[0, 1], [2, 3], [4]]
    # null: ceil(10 / 4) = 3 a task -> 4 chunks, the last of one job
    assert [list(r) for r in plan_chunks(10, None, 4)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    # more slots than jobs: one job a task; one slot (or a nonsense 0): one chunk of everything
    assert [len(r) for r in plan_chunks(3, None, 64)] == [1, 1, 1]
    assert [len(r) for r in plan_chunks(3, None, 0)] == [3]
    assert [len(r) for r in plan_chunks(4, 100, 2)] == [4]
    assert plan_chunks(0, 2, 4) == []
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="hydra.launcher.jobs_per_task"):
            plan_chunks(4, bad, 2)
    # the launchers refuse it when Hydra makes them, before anything is submitted (run.py: exit 2, the key named)
    from hydra_plugins.harness_launcher.pool_launcher import RayPoolLauncher, SlurmPoolLauncher
    for make in (lambda: RayPoolLauncher(ray={"init": {"address": None}}, jobs_per_task=0),
                 lambda: SlurmPoolLauncher(jobs_per_task=-2, partition="debug")):
        with pytest.raises(ValueError, match="hydra.launcher.jobs_per_task"):
            make()
    assert RayPoolLauncher(ray={"init": {"address": "auto"}, "remote": {"num_cpus": 2}}, jobs_per_task=3).ray_remote == {
        "num_cpus": 2}


def _Ret(num, status, value):
    """What ``executor._run_job`` returns: Hydra's JobReturn, completed or failed (Hydra's run_job caught ``value``)."""
    from hydra.core.utils import JobReturn, JobStatus
    return JobReturn(overrides=[f"workload.seed={num}"], hydra_cfg="the job's hydra config", _return_value=value,
                     status=JobStatus.COMPLETED if status == "ok" else JobStatus.FAILED)


def _script(monkeypatch, behaviour: dict, ran: list):
    """Replace the executor's worker set-up and job body: job ``n`` does ``behaviour[n]``: ``ok`` (returns its
    summary), ``raise`` (Hydra's run_job caught an exception: a failed JobReturn), ``exit<code>`` (sys.exit),
    ``crash`` (run_job itself raised)."""
    from harness.run import executor
    monkeypatch.setattr(executor, "_init", lambda *a, **k: None)

    def run_job(num, overrides, sweep_config):
        ran.append(num)
        b = behaviour.get(num, "ok")
        if b == "ok":
            return _Ret(num, "ok", {"job": num})
        if b == "raise":
            try:
                raise ValueError(f"bad thing in job {num}")
            except ValueError as e:
                return _Ret(num, "failed", e)
        if b == "crash":
            raise OSError(f"cannot write job {num}'s directory")
        raise SystemExit(int(b[4:]))
    monkeypatch.setattr(executor, "_run_job", run_job)


PAYLOAD = (None, None, None, None, None)


def test_a_chunk_goes_on_after_a_failed_job_and_stops_at_an_exit(monkeypatch):
    ran = []
    _script(monkeypatch, {1: "raise", 2: "crash", 3: "exit130"}, ran)
    r = cs.run_chunk(PAYLOAD, [(n, None) for n in range(5)])
    assert ran == [0, 1, 2, 3]                       # job 4 not started after job 3's exit
    assert [o.status for o in r.jobs] == ["completed", "failed", "failed", "exit", "not run"]
    assert r.jobs[3].code == 130 and "job 3 exited with status 130" in r.jobs[4].error
    assert r.jobs[0].ret.hydra_cfg is None and r.jobs[0].ret._return_value == {"job": 0}
    # the failure travels as text with its traceback (the exception object may not unpickle elsewhere)
    assert isinstance(r.jobs[1].ret._return_value, JobFailed)
    assert "ValueError: bad thing in job 1" in str(r.jobs[1].ret._return_value)
    assert r.jobs[2].ret is None and "OSError: cannot write job 2" in r.jobs[2].error
    assert r.cpu_end_s >= r.cpu_start_s > 0 and all(o.cpu_s >= 0 for o in r.jobs)
    back = pickle.loads(pickle.dumps(r))             # what submitit / Ray send back
    assert [o.status for o in back.jobs] == [o.status for o in r.jobs]


class _FakeBackend(cs.Backend):
    """Runs every chunk in this process at submit time; chunks in ``lose`` are reported lost."""

    name = "Fake"

    def __init__(self, lose=()):
        self.lose = set(lose)
        self.chunks = []

    def slots(self):
        return 2

    def submit(self, payload, chunks):
        self.chunks = chunks
        return [f"task{k}" for k in range(len(chunks))]

    def poll(self, handles, pending):
        return {i: ("the node went away" if i in self.lose else cs.run_chunk(PAYLOAD, self.chunks[i]))
                for i in pending}

    def cancel(self, handles, pending):
        pass


def _launch(monkeypatch, tmp_path, backend, n, jobs_per_task):
    """``launch_chunks`` over ``n`` jobs (``composed_jobs`` replaced: no Hydra composition), into ``tmp_path``."""
    config = OmegaConf.create({"hydra": {"hydra_logging": None, "verbose": False, "sweep": {"dir": str(tmp_path)},
                                         "job": {"name": "run"}}})
    jobs = [(i, [f"workload.seed={i}"], OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path), "subdir": f"{i}_x"}}}))
            for i in range(n)]
    monkeypatch.setattr(cs, "composed_jobs", lambda *a: jobs)
    monkeypatch.setattr("hydra.core.utils.configure_log", lambda *a, **k: None)   # this process's logging stays

    class Ctx:
        config_loader = None
        callbacks = None
    manifest = []
    return cs.launch_chunks(backend, Ctx(), config, None, [o for _, o, _ in jobs], 0, jobs_per_task, manifest), manifest


def test_the_submitter_returns_every_job_and_fails_the_failed_and_the_lost(monkeypatch, tmp_path, capsys):
    """6 jobs in chunks of 2; job 1 raises, chunk 2 (jobs 4, 5) is lost: every job gets a JobReturn in order, the
    completed ones their summary, the others a failure naming the job and the reason (Hydra raises the first
    once the sweep is done); stderr lists them; tasks.json has the three tasks with pids and per-job status."""
    from hydra.core.utils import JobStatus
    ran = []
    _script(monkeypatch, {1: "raise"}, ran)
    rets, manifest = _launch(monkeypatch, tmp_path, _FakeBackend(lose={2}), 6, 2)
    assert [r.status for r in rets] == [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.COMPLETED,
                                        JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.FAILED]
    assert [rets[i].return_value for i in (0, 2, 3)] == [{"job": 0}, {"job": 2}, {"job": 3}]
    with pytest.raises(JobFailed, match="ValueError: bad thing in job 1"):
        rets[1].return_value
    with pytest.raises(JobFailed, match="Fake task task2 ended without reporting: the node went away"):
        rets[5].return_value
    err = capsys.readouterr()
    assert "3 of 6 jobs did not complete" in err.err and "job 4 (workload.seed=4" in err.err
    assert "sweep executor on Fake: 6 jobs in 3 Fake tasks of up to 2 jobs" in err.out
    m = json.loads((tmp_path / "tasks.json").read_text())["tasks"]
    assert m == manifest and [t["task"] for t in m] == ["task0", "task1", "task2"]
    assert [[j["num"] for j in t["jobs"]] for t in m] == [[0, 1], [2, 3], [4, 5]]
    assert m[0]["pid"] > 0 and m[2]["pid"] is None and m[2]["status"].startswith("lost: the node went away")
    assert [j["status"] for j in m[0]["jobs"]] == ["completed", "failed"]
    assert m[1]["jobs"][0]["dir"] == str(tmp_path / "2_x")


def test_an_exit_in_one_chunk_lets_the_others_finish_then_the_sweep_exits_with_it(monkeypatch, tmp_path, capsys):
    """Job 0 exits 130 (interrupted): its chunk stops (job 1 not run), chunks 1 and 2 still run all their jobs,
    then the sweep exits 130 saying how to resume; a job's exit 2 alone gives exit 2."""
    ran = []
    _script(monkeypatch, {0: "exit130"}, ran)
    with pytest.raises(SystemExit) as e:
        _launch(monkeypatch, tmp_path, _FakeBackend(), 6, 2)
    assert e.value.code == 130 and ran == [0, 2, 3, 4, 5]
    assert "re-run the same command to resume" in capsys.readouterr().err
    m = json.loads((tmp_path / "tasks.json").read_text())["tasks"]
    assert [j["status"] for j in m[0]["jobs"]] == ["exit", "not run"] and m[0]["jobs"][0]["code"] == 130
    ran.clear()
    _script(monkeypatch, {3: "exit2"}, ran)
    with pytest.raises(SystemExit) as e:
        _launch(monkeypatch, tmp_path, _FakeBackend(), 6, 3)
    assert e.value.code == 2 and ran == [0, 1, 2, 3]   # chunk [3 4 5] stops at 3


def test_a_ctrl_c_in_the_submitter_cancels_the_tasks_and_exits_130(monkeypatch, tmp_path, capsys):
    class Interrupted(_FakeBackend):
        calls = 0
        cancelled = None

        def poll(self, handles, pending):
            self.calls += 1
            if self.calls == 1:
                raise KeyboardInterrupt
            return {i: "cancelled" for i in pending}

        def cancel(self, handles, pending):
            self.cancelled = list(pending)
    b = Interrupted()
    _script(monkeypatch, {}, [])
    with pytest.raises(SystemExit) as e:
        _launch(monkeypatch, tmp_path, b, 4, 2)
    assert e.value.code == 130 and b.cancelled == [0, 1]
    err = capsys.readouterr().err
    assert "cancelling 2 Fake tasks" in err and "Ctrl-C in the submitting process" in err
    assert all(t["status"] == "lost: cancelled" for t in json.loads((tmp_path / "tasks.json").read_text())["tasks"])


def test_a_sweeps_jobs_share_the_default_sweep_directory_whichever_process_runs_them(tmp_path):
    """The default ``hydra.sweep.dir`` ends in ``${pid:}``: resolved in each worker process it named a directory of
    its own (two jobs on two pool workers left three sweep directories, the submitting process's holding only
    ``multirun.yaml``, and no ``comparison.md``). The resolver is cached per config like Hydra's ``${now:}``, so
    every job resolves the submitting process's value: one directory with both jobs and the comparison. A Slurm or
    Ray task gets the job's config, cache included, the same way (tests/test_clusters.py)."""
    import os
    import subprocess
    import sys

    from harness.run.config import PROJECT_ROOT
    r = subprocess.run([sys.executable, str(PROJECT_ROOT / "run.py"), "-m", "scheduler=conserve,collocated",
                        "workload.num_conversations=2", "workload.max_turns=1", "slo=absolute", "logger.progress=false",
                        "hydra.launcher.n_jobs=2"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "HARNESS_CACHE_DIR": "off"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "sweep executor: 2 jobs on 2 worker processes" in r.stdout
    (sweep,) = (tmp_path / "results" / "sweeps").iterdir()
    assert sorted(p.name for p in sweep.iterdir()) == ["0_conserve", "1_collocated", "comparison.md", "multirun.yaml"]
    assert all((sweep / j / "summary.json").is_file() for j in ("0_conserve", "1_collocated"))

