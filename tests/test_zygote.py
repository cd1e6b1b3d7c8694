"""The launcher's guarantees for a server forked from a zygote (harness/vllm/zygote.py), without vLLM: a zygote that
preloads a cheap module instead of vLLM's API server forks the stand-in of tests/fake_server.py (run as ``python -m
tests.fake_server``; its children: one in its group, one that ignores SIGTERM, one that left the group), as
tests/test_launcher_guard.py checks the exec'd guard:

- ``kill -9`` of the harness (the owner, not the zygote's parent): no process of the tree is left after 10 s;
- ``stop()`` leaves nothing and reports the server's own status (143: SIGTERM), as the exec'd guard does;
- a dead run's leftovers (its owner and its guard killed) are found by the guard's process group and the token of
  the exec'd grandchildren and killed by the next launch on the port;
- a server whose import-time environment differs from the zygote's is started the ordinary way, the reason in its log.

The same server forked from a zygote that imported vLLM: tests/test_vllm_real.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.run.config import PROJECT_ROOT
from harness.vllm import launcher as L
from harness.vllm.zygote import ZYGOTE_ENV, Zygote, import_env_mismatch
from tests.conftest import free_port_base, pid_alive
from tests.test_launcher_guard import GRACE_S, healthy, state, tree_pids, wait_gone  # noqa: F401 (state: a fixture)

PYTHONPATH = str(PROJECT_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")


def env_now() -> dict:
    """This process's environment now, ``PYTHONPATH`` led by the checkout (a launch's environment is the launching
    process's at the launch: another test of this worker may have changed it since collection)."""
    return {**os.environ, "PYTHONPATH": PYTHONPATH}

OWNER = """
import sys, time
from pathlib import Path
import harness.vllm.launcher
from harness.vllm.launcher import InstanceSpec, Launcher
harness.vllm.launcher.GUARD_GRACE_S = {grace!r}

class Fake(InstanceSpec):
    def command(self):
        return [sys.executable, "-m", "tests.fake_server", "--port", str(self.port), "--pids", {pids!r}]

launcher = Launcher([Fake("fake0", "collocated", {port}, "none")], Path({logs!r}), 60)
launcher.start()
print("READY", launcher.pids()[0], launcher.started_by["fake0"], flush=True)
time.sleep(600)
"""


class Fake(L.InstanceSpec):
    pids = ""

    def command(self):
        return [sys.executable, "-m", "tests.fake_server", "--port", str(self.port), "--pids", self.pids]


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    """A zygote that imports ``http.server`` (the stand-in's) instead of vLLM: ~0.1 CPU s."""
    z = Zygote.spawn(env_now(), tmp_path_factory.mktemp("zygote"), 60, preload=("http.server",))
    yield z
    z.close()
    assert z.proc.returncode == 0


def start_owner(tmp_path: Path, port: int, zygote: Zygote) -> tuple[subprocess.Popen, int, list[int]]:
    """A harness process (the owner) whose launcher forks one stand-in server on ``port`` from ``zygote`` (named in
    its environment); returns it, its guard's pid and the stand-in's tree."""
    pids = tmp_path / "a.pids"
    code = OWNER.format(pids=str(pids), port=port, logs=str(tmp_path / "logs_a"), grace=GRACE_S)
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True,
                             env={**env_now(), "HARNESS_STATE_DIR": str(tmp_path / "state"), ZYGOTE_ENV: zygote.path})
    line = owner.stdout.readline().split()
    assert line[:1] == ["READY"] and line[2] == "zygote", (line, owner.poll())
    for _ in range(100):
        if pids.exists():
            break
        time.sleep(0.05)
    return owner, int(line[1]), tree_pids(pids)


def ppid(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[1])


def test_kill9_of_the_harness_leaves_no_process_of_a_forked_tree(tmp_path, state, zygote):
    port = free_port_base(1)
    owner, guard, pids = start_owner(tmp_path, port, zygote)
    assert all(pid_alive(p) for p in pids) and healthy(port)
    assert ppid(guard) == zygote.proc.pid and ppid(pids[0]) == guard and os.getpgid(guard) == guard
    rec = json.loads((state / f"{port}.json").read_text())
    assert rec["owner_pid"] == owner.pid and rec["pgid"] == guard and rec["pgid_start"] == L.start_ticks(guard)
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)
    assert wait_gone(pids + [guard], 10.0) == []
    assert L.port_free(port) and pid_alive(zygote.proc.pid)
    assert L.stop_stale(port, "fake0") is False and not (state / f"{port}.json").exists()
    assert "owner pid" in (tmp_path / "logs_a" / "fake0.log").read_text()   # the guard said why it stopped


def test_stop_leaves_no_process_of_a_forked_tree_and_reports_the_servers_status(tmp_path, state, zygote):
    port = free_port_base(1)
    spec = Fake("fake0", "collocated", port, "none", env={"PYTHONPATH": PYTHONPATH})   # the zygote's
    spec.pids = str(tmp_path / "c.pids")
    launcher = L.Launcher([spec], tmp_path / "logs_c", 60, zygote=zygote)
    with launcher:
        for _ in range(100):
            if (tmp_path / "c.pids").exists():
                break
            time.sleep(0.05)
        pids = tree_pids(tmp_path / "c.pids")
        assert launcher.started_by == {"fake0": "zygote"} and launcher.exited() == {}
        assert launcher.api_pids["fake0"][0] == pids[0]
        # a forked process shows the zygote's environment, not its own: its token is not seen there, its group is
        rec = json.loads((state / f"{port}.json").read_text())
        assert pids[0] not in L.token_pids(rec["token"]) and set(pids[1:]) <= set(L.token_pids(rec["token"]))
        assert set(pids) <= set(L.group_pids(rec["pgid"], rec["pgid_start"]))
        title = Path(f"/proc/{pids[0]}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        assert title == " ".join(spec.command())     # what ps and pgrep -f show, as for an exec'd server
        zygote_title = Path(f"/proc/{zygote.proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert f"-m harness.vllm.zygote --socket {zygote.path} " in zygote_title   # pgrep -f finds the zygote
    assert wait_gone(pids + launcher.pids(), 1.0) == []
    assert L.port_free(port) and not (state / f"{port}.json").exists()
    assert launcher.exited() == {"fake0": "exited with code 143 (the server got signal 15)"}


def test_a_dead_runs_forked_leftovers_are_killed_by_the_next_launch(tmp_path, state, zygote):
    """The owner and the guard both killed (nothing watches the tree): the stand-in dies with its guard
    (``PR_SET_PDEATHSIG``), its children are left; the next launch on the port kills them (those in the group by
    the guard's group and their token, the one that left the group by its token: the stand-in exec'd them with the
    environment it was given)."""
    port = free_port_base(1)
    owner, guard, pids = start_owner(tmp_path, port, zygote)
    os.kill(owner.pid, signal.SIGKILL)
    os.kill(guard, signal.SIGKILL)
    owner.wait(timeout=10)
    assert wait_gone([guard, pids[0]], 10.0) == []
    assert all(pid_alive(p) for p in pids[1:])
    assert L.stop_stale(port, "fake0") is True
    assert wait_gone(pids, 10.0) == [] and not (state / f"{port}.json").exists()


def test_a_server_whose_import_time_environment_differs_is_started_as_always(tmp_path, state, zygote):
    assert import_env_mismatch({"HF_HUB_OFFLINE": "1", "PATH": "/a"}, {"PATH": "/b", "PYTEST_CURRENT_TEST": "x"}) \
        == ["HF_HUB_OFFLINE"]
    assert import_env_mismatch({}, {"VLLM_CPU_OMP_THREADS_BIND": "1", "HARNESS_SERVER_TOKEN": "t",
                                    "VLLM_LOGGING_LEVEL": "DEBUG"}) == ["VLLM_LOGGING_LEVEL"]
    # a compile's cache directories, set in a process that imported vLLM and compiled (read when compiling)
    assert import_env_mismatch({"TORCHINDUCTOR_CACHE_DIR": "/a"}, {"TRITON_CACHE_DIR": "/t",
                                                                  "TORCH_HOME": "/h"}) == ["TORCH_HOME"]
    port = free_port_base(1)
    spec = Fake("fake0", "collocated", port, "none",
                env={"PYTHONPATH": PYTHONPATH, "VLLM_LOGGING_LEVEL": "DEBUG"})
    spec.pids = str(tmp_path / "d.pids")
    with L.Launcher([spec], tmp_path / "logs_d", 60, zygote=zygote) as launcher:
        assert launcher.started_by == {"fake0": "exec"} and healthy(port)
    log = (tmp_path / "logs_d" / "fake0.log").read_text()
    assert f"not forked from the vLLM zygote {zygote.path}: its environment differs from the zygote's in " \
           f"VLLM_LOGGING_LEVEL" in log


def test_a_guard_whose_owner_is_already_gone_starts_nothing_and_reports_1(tmp_path, monkeypatch, zygote):
    """A launch whose owner died before the forked guard ran (as ``guard.py`` does: exit 1, nothing started); its
    status reaches the launcher even where it comes with the guard's pid."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    argv = [sys.executable, "-m", "tests.fake_server", "--port", "1", "--pids", str(tmp_path / "e.pids")]
    with open(tmp_path / "e.log", "w") as log:
        monkeypatch.setattr(os, "getpid", lambda: dead.pid)   # the request names the dead process as the owner
        try:
            guard = zygote.launch(argv, env_now(), log.fileno(), GRACE_S)
        finally:
            monkeypatch.undo()
    assert guard.wait(timeout=10) == 1 and guard.poll() == 1
    assert not (tmp_path / "e.pids").exists() and not pid_alive(guard.pid)
