"""``backend.launcher=slurm``: each vLLM instance a Slurm job step started with ``srun`` on a node.

Inside an allocation (``SLURM_JOB_ID`` set: ``salloc``/``sbatch``, or a sweep job of ``hydra/launcher=slurm``)
the instances become steps of that job, placed on its nodes (``backend.nodes``, default: every node of
``SLURM_JOB_NODELIST``) by ``backend.placement`` (``harness.vllm.placement``): ``srun --nodes=1 --ntasks=1
--exact -w <node> --cpus-per-task=<backend.cpus_per_instance> [--gres=gpu:<tensor_parallel_size>]``.
Outside an allocation each instance is a job of its own (the same ``srun``; Slurm picks the node unless
``backend.nodes`` names them); ``backend.srun_args`` adds e.g. ``--partition``, ``--account``, ``--time``.

GPU binding is Slurm's: ``--gres=gpu:N`` makes Slurm set the step's ``CUDA_VISIBLE_DEVICES``, which the
harness never overwrites (``harness.vllm.nodes``). On the node, ``python -m harness.vllm.nodes`` (the node
agent) binds the server to the node's address (``backend.host=node``) or loopback, writes where it runs
into ``<run_dir>/nodes/<name>.json``, and serves the GPUs' NVML energy (by UUID) on
``port_base + 250 + k``. The run directory must be on a filesystem every node sees (it is where the
placement, logs and KV store of ExampleConnector meet).

Teardown (the local launcher's guarantees): ``stop()`` sends SIGTERM to each step (``scancel --signal=TERM``:
the agent stops its server's process group), waits, then cancels the step (``scancel``) and kills ``srun``.
``srun`` runs in its own process group with a parent-death signal; the agent stops its server when the
harness stops renewing ``<run_dir>/nodes/lease`` (``lease_s``), so a harness killed with SIGKILL leaves no
server running for longer than that; and a step recorded by a harness process that is gone is cancelled
at the next launch from the same machine.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Sequence

from harness.core.paths import PROJECT_ROOT
from harness.vllm.launcher import (STATE_DIR, InstanceSpec, StartStop, _die_with_parent, _tail, wait_all,
                                   wait_http_healthy, write_private)
from harness.vllm.placement import AGENT_PORT_OFFSET, assign, localize

SLURM_STATE = STATE_DIR / "slurm"


def allocation_nodes() -> list[str]:
    """The node names of the current Slurm allocation (``scontrol show hostnames $SLURM_JOB_NODELIST``),
    or ``[]`` outside one."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not os.environ.get("SLURM_JOB_ID") or not nodelist:
        return []
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def cancel_stale() -> list[str]:
    """Cancel the steps recorded by harness processes of this machine that are gone (killed with SIGKILL
    before their ``stop()``). Returns the cancelled ``job.step`` ids."""
    done = []
    if not SLURM_STATE.is_dir():
        return done
    for rec in SLURM_STATE.glob("*.json"):
        try:
            r = json.loads(rec.read_text())
        except (OSError, ValueError):
            rec.unlink(missing_ok=True)
            continue
        if r.get("host") == socket.gethostname() and not _pid_alive(int(r.get("driver_pid", 0))):
            subprocess.run(["scancel", r["step"]], capture_output=True)
            done.append(r["step"])
            rec.unlink(missing_ok=True)
    return done


class SlurmLauncher(StartStop):
    """Launch and own vLLM servers as Slurm job steps (see the module). Same contract as
    :class:`harness.vllm.launcher.ServerLauncher`.

    Args:
        specs: the instances; run_dir: the run directory (shared by the nodes); startup_timeout_s: for all
        servers (Slurm's scheduling included), s; nodes: node names (default: the allocation's); gpus: GPUs
        per instance (``tensor_parallel_size``; 0 on ``device=cpu``); gpus_per_node: capacity of a node for
        ``pack``; cpus: CPUs per instance; host_mode, placement, port_base, cpu_bind_offset: as for Ray;
        srun_args: extra ``srun`` arguments; lease_s: see the module.
    """

    def __init__(self, specs: Sequence[InstanceSpec], run_dir: Path, startup_timeout_s: float, *,
                 nodes: Sequence[str] = (), gpus: int = 0, gpus_per_node: int = 8, cpus: int = 1,
                 host_mode: str = "node", placement: str = "pack", port_base: int = 8100, cpu_bind_offset: int = 0,
                 srun_args: Sequence[str] = (), lease_s: float = 60.0):
        self.specs = list(specs)
        self.run_dir = Path(run_dir)
        self.log_dir = self.run_dir / "logs"
        self.node_dir = self.run_dir / "nodes"
        self.startup_timeout_s = startup_timeout_s
        self.nodes, self.gpus, self.gpus_per_node, self.cpus = list(nodes), gpus, gpus_per_node, cpus
        self.host_mode, self.placement_mode = host_mode, placement
        self.port_base, self.cpu_bind_offset = port_base, cpu_bind_offset
        self.srun_args, self.lease_s = list(srun_args), lease_s
        self.in_allocation = bool(os.environ.get("SLURM_JOB_ID"))
        self.procs: dict[str, subprocess.Popen] = {}
        self.info: dict[str, dict] = {}
        self.startup_s: dict[str, float] = {}
        self._stop_lease = threading.Event()
        self._lease_thread: Optional[threading.Thread] = None

    # ---- placement --------------------------------------------------------------------------------
    def place(self) -> list[InstanceSpec]:
        """Assign nodes, ports and cores (``harness.vllm.placement``). Without node names (outside an
        allocation, ``backend.nodes`` empty) Slurm picks each node, so ports are unique per instance."""
        nodes = self.nodes or allocation_nodes()
        n = len(self.specs)
        if nodes:
            cap = self.gpus_per_node // self.gpus if self.gpus else None
            where = assign(n, nodes, cap, self.placement_mode)
            addrs = where
        else:
            where, addrs = [""] * n, [f"#{i}" for i in range(n)]  # unknown nodes: one port per instance
        return localize(self.specs, where, addrs, self.port_base, self.cpu_bind_offset, os.cpu_count() or 1)

    def srun_command(self, s: InstanceSpec) -> list[str]:
        """The ``srun`` command line of the placed instance ``s`` (its agent on ``s.port + 250``)."""
        cmd = ["srun", "--nodes=1", "--ntasks=1", f"--cpus-per-task={self.cpus}", f"--job-name=vllm-{s.name}",
               "--kill-on-bad-exit=1", f"--chdir={PROJECT_ROOT}", "--export=ALL"]
        if self.in_allocation:
            cmd.append("--exact")
        if s.node:
            cmd.append(f"--nodelist={s.node}")
        if self.gpus:
            cmd.append(f"--gres=gpu:{self.gpus}")
        cmd += self.srun_args
        cmd += [sys.executable, "-m", "harness.vllm.nodes", "--spec", str(self.node_dir / f"{s.name}.spec.json"),
                "--out", str(self.node_dir / f"{s.name}.json"), "--log", str(self.log_dir / f"{s.name}.log"),
                "--host-mode", self.host_mode, "--agent-port", str(s.port + AGENT_PORT_OFFSET),
                "--lease", str(self.node_dir / "lease"), "--lease-s", str(self.lease_s)]
        return cmd

    # ---- lifecycle --------------------------------------------------------------------------------
    def _renew_lease(self) -> None:
        lease = self.node_dir / "lease"
        while not self._stop_lease.is_set():
            lease.touch()
            self._stop_lease.wait(min(5.0, self.lease_s / 4))

    def start(self) -> None:
        """Start every server (one at a time) and wait until each is healthy.

        Raises:
            RuntimeError: ``srun`` failed, the agent did not report, or a server died or timed out (every
                step started is stopped first).
        """
        atexit.register(self.stop)
        try:
            cancel_stale()
            self.specs = self.place()
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self.node_dir.mkdir(parents=True, exist_ok=True)
            SLURM_STATE.mkdir(parents=True, exist_ok=True)
            (self.node_dir / "lease").touch()
            self._lease_thread = threading.Thread(target=self._renew_lease, daemon=True)
            self._lease_thread.start()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
            t0 = time.monotonic()
            for s in self.specs:
                out = self.node_dir / f"{s.name}.json"
                out.unlink(missing_ok=True)
                write_private(self.node_dir / f"{s.name}.spec.json", json.dumps(asdict(s)))   # env may hold an API key
                srun_log = open(self.log_dir / f"{s.name}.srun.log", "w")
                proc = subprocess.Popen(self.srun_command(s), stdout=srun_log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent)
                srun_log.close()
                self.procs[s.name] = proc
                deadline = t0 + self.startup_timeout_s
                while not out.exists():  # the agent reports where the server runs
                    if proc.poll() is not None:
                        raise RuntimeError(f"srun for instance {s.name} exited with code {proc.returncode} before its "
                                           f"server started{_tail(self.log_dir / f'{s.name}.srun.log')}"
                                           f"{_tail(self.log_dir / f'{s.name}.log')}")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"instance {s.name}: no placement from Slurm within backend.startup_timeout_s="
                                           f"{self.startup_timeout_s} s{_tail(self.log_dir / f'{s.name}.srun.log')}")
                    time.sleep(0.2)
                info = json.loads(out.read_text())
                self.info[s.name] = info
                s.host, s.node = info["host"], info["node"]
                step = f"{info['slurm_job_id']}.{info['slurm_step_id']}"
                (SLURM_STATE / f"{step}.json").write_text(json.dumps(
                    {"step": step, "driver_pid": os.getpid(), "host": socket.gethostname(), "name": s.name}))

                def exited(p=proc):
                    return "" if p.poll() is None else f"(srun) exited with code {p.returncode}"
                wait_http_healthy(s.url, max(1.0, deadline - time.monotonic()), exited, self.log_dir / f"{s.name}.log")
                self.startup_s[s.name] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise

    def _step(self, name: str) -> Optional[str]:
        i = self.info.get(name)
        return f"{i['slurm_job_id']}.{i['slurm_step_id']}" if i and i.get("slurm_job_id") else None

    def kill(self, name: str) -> None:
        """Kill one server at once: SIGKILL to its agent (the server gets its parent-death signal)."""
        step = self._step(name)
        if step:
            subprocess.run(["scancel", "--signal=KILL", step], capture_output=True)
        p = self.procs.get(name)
        if p is not None:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM every step, wait up to ``grace_s``, cancel what is left, kill ``srun``. Idempotent."""
        steps = {n: self._step(n) for n in self.procs}
        for n, step in steps.items():
            if self.procs[n].poll() is None:
                if step:
                    subprocess.run(["scancel", "--signal=TERM", step], capture_output=True)
                else:  # not reported yet: srun ends its step on SIGTERM
                    self.procs[n].send_signal(signal.SIGTERM)
        wait_all(self.procs.values(), grace_s)
        for n, p in self.procs.items():
            if steps[n] and p.poll() is None:
                subprocess.run(["scancel", steps[n]], capture_output=True)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                p.wait(timeout=10)
            if steps[n]:
                (SLURM_STATE / f"{steps[n]}.json").unlink(missing_ok=True)
        self._stop_lease.set()
        try:
            atexit.unregister(self.stop)
        except Exception:
            pass

    def energy_readers(self) -> list:
        """Per instance: its GPUs' NVML counters, read on its node by its agent (``GET /energy``)."""
        def reader(url):
            def read():
                with urllib.request.urlopen(url + "/energy", timeout=10) as r:
                    return json.loads(r.read())
            return read
        return [reader(self.info[s.name]["agent_url"]) for s in self.specs]

    def placement(self) -> list[dict]:
        """Where each instance runs: name, node, url, CUDA_VISIBLE_DEVICES as Slurm set it, GPU UUIDs, step."""
        return [{"name": s.name, "node": s.node, "url": s.url,
                 "devices": self.info.get(s.name, {}).get("cuda_visible_devices"),
                 "gpu_uuids": self.info.get(s.name, {}).get("gpu_uuids"), "slurm_step": self._step(s.name)}
                for s in self.specs]

    def pids(self) -> list[int]:
        """Server pids as the agents reported them (on their nodes)."""
        return [i["pid"] for i in self.info.values()]

    def exited(self) -> dict[str, str]:
        """``{name: why}`` for each started server whose ``srun`` (which lives as long as its job step and
        its server) ended."""
        return {n: f"(srun) exited with code {p.returncode}" for n, p in self.procs.items()
                if n in self.startup_s and p.poll() is not None}
