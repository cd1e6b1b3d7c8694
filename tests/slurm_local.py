"""A single-node Slurm cluster on this machine for tests: slurmctld + slurmd from Debian's ``slurm-wlm``,
bound to 127.0.0.1, in a temporary directory (its own ``slurm.conf``, state, spool, logs; clients find it
through ``SLURM_CONF``).

Choices, for a container without systemd, munge or cgroups: ``AuthType=auth/none`` (no munge daemon; only
acceptable on a private test machine), ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``
(no cgroup v1/v2 delegation needed), no accounting. The node declares ``CPUs`` = this machine's cores
and two fake GPUs (``Gres=gpu:2`` backed by character devices made here), so ``--gres=gpu:N`` makes Slurm
set ``CUDA_VISIBLE_DEVICES`` as on a GPU cluster. Needs root (slurmd launches tasks as the submitting user).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from tests.conftest import pid_alive


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available() -> str:
    """'' when a local Slurm can be started here, else why not."""
    for tool in ("slurmctld", "slurmd", "srun", "sbatch", "scontrol"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (scripts/install-cluster-tools.sh installs slurm-wlm)"
    if os.geteuid() != 0:
        return "slurmd needs root"
    return ""


class LocalSlurm:
    """Start with :meth:`start`, stop with :meth:`stop` (kills both daemons and every job left)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.pids: list[int] = []

    def write_conf(self) -> None:
        r = self.root
        for d in ("state", "spool"):
            (r / d).mkdir(parents=True, exist_ok=True)
        host = socket.gethostname()
        for k in range(2):
            dev = r / f"fakegpu{k}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # a character device (like /dev/null)
        (r / "gres.conf").write_text(f"Name=gpu File={r}/fakegpu[0-1]\n")
        ncpu = os.cpu_count() or 1
        self.conf.write_text(f"""ClusterName=harnesstest
SlurmctldHost={host}(127.0.0.1)
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=5
GresTypes=gpu
NodeName={host} NodeAddr=127.0.0.1 CPUs={ncpu} RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")

    def start(self, timeout_s: float = 60.0) -> float:
        """Start both daemons and wait until the node is idle. Returns seconds taken.

        Raises:
            RuntimeError: the node did not come up (with the daemons' log tails).
        """
        t0 = time.monotonic()
        self.write_conf()
        subprocess.run(["slurmctld", "-i"], env=self.env, check=True)
        subprocess.run(["slurmd"], env=self.env, check=True)
        for f in ("slurmctld.pid", "slurmd.pid"):
            for _ in range(50):
                if (self.root / f).exists() and (self.root / f).read_text().strip():
                    break
                time.sleep(0.1)
            self.pids.append(int((self.root / f).read_text()))
        while time.monotonic() - t0 < timeout_s:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True).stdout
            if out.strip() in ("idle", "mixed"):
                return time.monotonic() - t0
            time.sleep(0.5)
        logs = "".join((self.root / f).read_text()[-1500:] for f in ("slurmctld.log", "slurmd.log")
                       if (self.root / f).exists())
        self.stop()
        raise RuntimeError(f"local Slurm did not come up in {timeout_s} s:\n{logs}")

    def stop(self) -> None:
        """Cancel every job, stop both daemons (SIGTERM, then SIGKILL), wait until they are gone."""
        subprocess.run(["scancel", "--full", "--user=root"], env=self.env, capture_output=True)
        time.sleep(1.0)
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for pid in self.pids:
            for _ in range(100):
                if not pid_alive(pid):
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass



